// involution's grad_weight for channels_last tensors, a vector of a group's channels a lane:
//
//   grad_weight[n, i, j, g, a, b] = sum over the group's channels c of
//                                   grad_output[n, i, j, c] * input[n, i*S - ph + a, j*S - pw + b, c]
//
// grad_output: (N, Ho, Wo, C) and input: (N, H, W, C) in memory (channels_last), grad_weight
// pixel-major, (N, Ho, Wo, G, K, K) in memory (the layout involution.cu's channels_last
// kernels read and write); square kernels of KERNEL taps a side, equal strides STRIDE, dilation
// 1, any padding. The host takes this kernel where a group's channels, at least
// LAST_MIN_GROUP_CHANNELS, are PARTS vectors of 16 bytes, PARTS a power of two up to a warp (at
// 16 channels a group: 2 lanes in bfloat16, 4 in float32, 8 in float64), and the operands are
// aligned to a vector; involution.cu's chunked kernel serves the rest.
//
// Why: involution.cu's chunked grad_weight gives a thread one pixel, group and kernel row and
// the group's channels whole, so a warp's lanes read 7 rows of input at once, a few pixels each
// (the sixth H200 draw measured it at 5.6x its DRAM floor in bfloat16, the worst of
// involution's kernels RedNet training runs). Here, as in DCNv4's backward, the lanes of a warp
// lie along the channels of adjacent pixels: each tap is one 16-byte load a lane, the warp's
// loads whole 128-byte lines of adjacent pixels, each lane's grad_output vector loaded once for
// all taps. A tap's partial sums over a lane's channels are added across the group's PARTS
// lanes by shuffles (a butterfly: every lane of the group gets the same bits), and the warp's
// results, consecutive in grad_weight's layout, are staged in shared memory and written as
// whole vectors instead of one 2-byte store a lane per tap.
//
// A tap outside the image is not loaded, and its sum is +0, what the chunked kernel writes. The
// group's sum is split across lanes, so its bits are not the chunked kernel's (each is checked
// against the float64 reference); it is deterministic. Grid-stride loop over warps, 64-bit
// offsets into the tensors, and every lane of a warp takes every shuffle (lanes past the end
// add zeros and store nothing).

#include "warp.cuh"

// The block size of every grid-stride launch (oplib.kernels.cuda_launch.BLOCK_SIZE), whose
// warps each stage one warp's results: 32 / PARTS records of KERNEL^2 values, which at
// LAST_MIN_GROUP_CHANNELS channels a group or more is at most 32 bytes a tap in every dtype
// (16 records of bfloat16, 8 of float32, 4 of float64). The host reads these lines.
constexpr int LAST_THREADS = 256;
constexpr int LAST_WARPS = LAST_THREADS / 32;
constexpr int LAST_MIN_BLOCKS = 3;
constexpr int LAST_MIN_GROUP_CHANNELS = 16;
constexpr int LAST_MAX_PARTS = 32;
constexpr int LAST_STAGED_BYTES_PER_TAP = 32 * VECTOR_BYTES / LAST_MIN_GROUP_CHANNELS;

// A storage value as its accumulator: Element's conversion, but float16 by the GPU's own exact
// conversion (cvt.f32.f16, no .ftz: subnormals kept), where element.cuh's integer one, exact too
// and what the host emulation runs, spilled registers on sm_120 at three blocks an SM.
template <typename scalar_t>
__device__ __forceinline__ typename Element<scalar_t>::acc_t widen(scalar_t v) {
    return Element<scalar_t>::value(v);
}

template <>
__device__ __forceinline__ float widen<oplib_half>(oplib_half v) {
#ifdef __CUDA_ARCH__
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(v.bits));
    return f;
#else
    return oplib_half_to_float(v.bits);
#endif
}

// values[e] = vector.lane[e] as the accumulator type. bfloat16: each 32-bit word holds two
// values, the first in its low half, and a value's float is its 16 bits in a word's high half:
// one shift or one mask each (the generic conversion takes the half out first, two).
template <typename scalar_t>
__device__ __forceinline__ void widen_vector(typename Element<scalar_t>::acc_t* values, const Vector16<scalar_t>& vector) {
#pragma unroll
    for (int e = 0; e < Vector16<scalar_t>::lanes; ++e) values[e] = widen(vector.lane[e]);
}

template <>
__device__ __forceinline__ void widen_vector<oplib_bfloat16>(float* values, const Vector16<oplib_bfloat16>& vector) {
    const unsigned int* words = reinterpret_cast<const unsigned int*>(vector.lane);
#pragma unroll
    for (int h = 0; h < 4; ++h) {
        values[2 * h] = __uint_as_float(words[h] << 16);
        values[2 * h + 1] = __uint_as_float(words[h] & 0xffff0000u);
    }
}

// Bit b set where column x0 + b lies in [0, width): which of a kernel row's taps read the image.
template <int KERNEL>
__device__ __forceinline__ unsigned int columns_inside(int x0, index_t width) {
    unsigned int mask = 0;
#pragma unroll
    for (int b = 0; b < KERNEL; ++b) mask |= (x0 + b >= 0 && x0 + b < width) ? 1u << b : 0u;
    return mask;
}

// A kernel row's KERNEL input vectors, from `row` on (`step` values apart), with no branch
// between the loads: a tap whose bit of `inside` is clear reads `elsewhere` instead (a pixel
// of the image, the same line for every lane), and its sum is reset to +0 after.
template <typename scalar_t, int KERNEL>
__device__ __forceinline__ void load_row(Vector16<scalar_t>* values, const scalar_t* row, index_t step,
                                         unsigned int inside, const scalar_t* elsewhere) {
#pragma unroll
    for (int b = 0; b < KERNEL; ++b)
        values[b] = *reinterpret_cast<const Vector16<scalar_t>*>((inside >> b) & 1u ? row + b * step : elsewhere);
}

// oplib-instantiate: involution_backward_weight_last
// oplib-template: KERNEL = 3 | 5 | 7
// oplib-template: STRIDE = 1 | 2
template <typename scalar_t, int KERNEL, int STRIDE>
__global__ void __launch_bounds__(LAST_THREADS, LAST_MIN_BLOCKS) involution_backward_weight_last(
    const scalar_t* __restrict__ grad_output, const scalar_t* __restrict__ input, scalar_t* __restrict__ grad_weight,
    index_t total, index_t channels, index_t height, index_t width, index_t groups, index_t out_h, index_t out_w,
    index_t pad_h, index_t pad_w) {
    typedef typename Element<scalar_t>::acc_t acc_t;
    constexpr int LANES = Vector16<scalar_t>::lanes;
    constexpr int TAPS = KERNEL * KERNEL;
    __shared__ Vector16<scalar_t> staged_vectors[LAST_WARPS][LAST_STAGED_BYTES_PER_TAP * TAPS / VECTOR_BYTES];
    // Work items (a lane each) are counted in 32 bits (the host keeps them below 2^31 with a
    // grid to spare), offsets into the tensors in 64.
    const int G = (int)groups, OH = (int)out_h, OW = (int)out_w, items = (int)total;
    const index_t C = channels, H = height, W = width;
    const int parts = (int)(C / G / LANES);
    const int lane = oplib_lane(), warp_in_block = (int)(threadIdx.x / 32u);
    scalar_t* staged = reinterpret_cast<scalar_t*>(staged_vectors[warp_in_block]);
    const int step = (int)gridDim.x * LAST_THREADS;
    for (int base = ((int)blockIdx.x * LAST_WARPS + warp_in_block) * 32; base < items; base += step) {
        const int item = base + lane;
        const bool active = item < items;
        const int record = item / parts;  // (n, i, j, g), g fastest: grad_weight's order
        const int part = item - record * parts;
        const int g = record % G, pixel = record / G;
        const int j = pixel % OW, i = (pixel / OW) % OH, n = pixel / (OW * OH);
        const index_t c0 = (index_t)g * (C / G) + part * LANES;
        acc_t grad[LANES];
        {
            Vector16<scalar_t> values;
            if (active) values = *reinterpret_cast<const Vector16<scalar_t>*>(grad_output + (index_t)pixel * C + c0);
            widen_vector<scalar_t>(grad, values);
#pragma unroll
            for (int e = 0; e < LANES; ++e) grad[e] = active ? grad[e] : (acc_t)0;
        }
        const int y0 = i * STRIDE - (int)pad_h, x0 = j * STRIDE - (int)pad_w;
        const int first_record = base / parts, slot = record - first_record;
        // Bits by tap column, once per item: the columns inside the image, and the taps this
        // part stages (b mod parts == part; parts is a power of two).
        const unsigned int columns = active ? columns_inside<KERNEL>(x0, W) : 0u;
        unsigned int staged_taps = 0;
#pragma unroll
        for (int b = 0; b < KERNEL; ++b) staged_taps |= (b & (parts - 1)) == part ? 1u << b : 0u;
        const scalar_t* row = input + (((index_t)n * H + y0) * W + x0) * C + c0;
        for (int a = 0; a < KERNEL; ++a, row += W * C) {
            const unsigned int inside = y0 + a >= 0 && y0 + a < H ? columns : 0u;
            Vector16<scalar_t> values[KERNEL];
            load_row<scalar_t, KERNEL>(values, row, C, inside, input + c0);
            acc_t sum[KERNEL];
#pragma unroll
            for (int b = 0; b < KERNEL; ++b) {
                acc_t x[LANES];
                widen_vector<scalar_t>(x, values[b]);
                sum[b] = 0;
#pragma unroll
                for (int e = 0; e < LANES; ++e) sum[b] = oplib_fma(grad[e], x[e], sum[b]);
                if (!((inside >> b) & 1u)) sum[b] = 0;
            }
            // The group's parts are adjacent lanes from a multiple of `parts` on: sum over them.
#pragma unroll
            for (int offset = LAST_MAX_PARTS / 2; offset >= 1; offset >>= 1) {
                if (offset >= parts) continue;
#pragma unroll
                for (int b = 0; b < KERNEL; ++b)
                    sum[b] = oplib_add(sum[b], __shfl_xor_sync(OPLIB_FULL_WARP, sum[b], offset));
            }
#pragma unroll
            for (int b = 0; b < KERNEL; ++b)  // each part stages its share of the row's taps
                if (active && (staged_taps >> b) & 1u) staged[slot * TAPS + a * KERNEL + b] = Element<scalar_t>::store(sum[b]);
        }
        __syncwarp();
        // The warp's records are consecutive in grad_weight: copy them out, 16 bytes a lane
        // where the destination is aligned to them, else a value a lane.
        const int values = ((items - base < 32 ? items - base : 32) / parts) * TAPS;
        scalar_t* out = grad_weight + (index_t)first_record * TAPS;
        int copied = 0;
        if (reinterpret_cast<unsigned long long>(out) % VECTOR_BYTES == 0) {
            const int vectors = values / LANES;
            for (int v = lane; v < vectors; v += 32)
                reinterpret_cast<Vector16<scalar_t>*>(out)[v] = staged_vectors[warp_in_block][v];
            copied = vectors * LANES;
        }
        for (int v = copied + lane; v < values; v += 32) out[v] = staged[v];
        __syncwarp();  // the staging is free for the next round
    }
}
