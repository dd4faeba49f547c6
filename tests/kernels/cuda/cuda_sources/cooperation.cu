// Kernels that exercise the host emulation's cooperating threads (cuda_host_shim.h): the warp
// shuffles against CUDA's rules, a barrier over static shared memory, fresh dynamic shared
// memory in every block, and blocks that can never finish, which the emulation must report.

#include "warp.cuh"

// Each thread offers its index in the grid; out[4 t + k] is what thread t got from the k-th
// shuffle: __shfl_sync of a float, __shfl_up_sync of an int, __shfl_down_sync of an unsigned
// int, __shfl_xor_sync of a double.
template <typename scalar_t>
__global__ void shuffles(scalar_t* __restrict__ out, int source, unsigned int delta, int lane_mask, int width) {
    typedef typename Element<scalar_t>::acc_t acc_t;
    const index_t t = (index_t)blockIdx.x * blockDim.x + threadIdx.x;
    out[4 * t] = Element<scalar_t>::store((acc_t)__shfl_sync(OPLIB_FULL_WARP, (float)t, source, width));
    out[4 * t + 1] = Element<scalar_t>::store((acc_t)__shfl_up_sync(OPLIB_FULL_WARP, (int)t, delta, width));
    out[4 * t + 2] = Element<scalar_t>::store((acc_t)__shfl_down_sync(OPLIB_FULL_WARP, (unsigned int)t, delta, width));
    out[4 * t + 3] = Element<scalar_t>::store((acc_t)__shfl_xor_sync(OPLIB_FULL_WARP, (double)t, lane_mask, width));
}

// output[t] = input[(t + shift) mod threads] within each block's slice, through static shared
// memory; the block may have any shape (t is the linear index).
template <typename scalar_t>
__global__ void rotate(const scalar_t* __restrict__ input, scalar_t* __restrict__ output, int shift) {
    __shared__ scalar_t slice[1024];
    const int threads = blockDim.x * blockDim.y * blockDim.z;
    const int t = threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
    const index_t base = (index_t)blockIdx.x * threads;
    slice[t] = input[base + t];
    __syncthreads();  // the slice is written
    output[base + t] = slice[((t + shift) % threads + threads) % threads];
}

// out[t] = what thread t reads back from static shared memory after its warp wrote its own
// index into `count` slots from the start of its share of 32, a warp barrier between: the
// warp's last 32 slots, lane by lane. Past 32, a warp writes into the next warp's share, which
// that warp writes too.
template <typename scalar_t>
__global__ void overrun(scalar_t* __restrict__ out, int count) {
    typedef typename Element<scalar_t>::acc_t acc_t;
    __shared__ float shares[1024 + 32];
    const int t = threadIdx.x, warp = t / 32, lane = t % 32;
    for (int v = lane; v < count; v += 32) shares[warp * 32 + v] = (float)warp;
    __syncwarp();
    out[(index_t)blockIdx.x * blockDim.x + t] = Element<scalar_t>::store((acc_t)shares[warp * 32 + count - 32 + lane]);
}

// out[b, t] = byte t of block b's dynamic shared memory as the block finds it; then the block
// overwrites it.
template <typename scalar_t>
__global__ void first_bytes(scalar_t* __restrict__ out) {
    typedef typename Element<scalar_t>::acc_t acc_t;
    OPLIB_DYNAMIC_SHARED(unsigned char, bytes);
    out[(index_t)blockIdx.x * blockDim.x + threadIdx.x] = Element<scalar_t>::store((acc_t)bytes[threadIdx.x]);
    __syncthreads();
    bytes[threadIdx.x] = 0;
}

// out[t] = t, after cooperation that, by `mode`, every thread completes (0) or that can never
// complete: 1 the upper half of the block skips a barrier, 2 the upper half returns before
// it, 3 the halves wait at two different barriers, 4 lanes 16-31 skip a shuffle, 5 lanes
// 16-31 call a shuffle whose mask leaves them out, 6 lanes 0-15 read lanes 16-31 that their
// mask leaves out, 7 a shuffle of width 3, 8 lanes read past the end of a partial warp.
template <typename scalar_t>
__global__ void stuck(scalar_t* __restrict__ out, int mode) {
    typedef typename Element<scalar_t>::acc_t acc_t;
    const int t = threadIdx.x, lane = t % 32;
    const bool upper = t >= (int)blockDim.x / 2;
    float value = (float)t;
    if (mode == 1 && !upper) __syncthreads();
    if (mode == 2 && upper) return;
    if (mode == 2) __syncthreads();
    if (mode == 3 && upper) __syncthreads();
    if (mode == 3 && !upper) __syncthreads();
    if (mode == 4 && lane < 16) value = __shfl_sync(OPLIB_FULL_WARP, value, lane);
    if (mode == 5) value = __shfl_sync(0x0000ffffu, value, lane % 16);
    if (mode == 6 && lane < 16) value = __shfl_sync(0x0000ffffu, value, lane + 16);
    if (mode == 7) value = __shfl_sync(OPLIB_FULL_WARP, value, lane, 3);
    if (mode == 8) value = __shfl_down_sync(OPLIB_FULL_WARP, value, 4) - 4.0f * (lane < 28);
    __syncthreads();
    out[(index_t)blockIdx.x * blockDim.x + t] = Element<scalar_t>::store((acc_t)value);
}

// warp.cuh's fragment loads (ldmatrix on a GPU) in a block of one warp: the warp stages a tile
// of 16 rows x 8 words (word w of row m is input[8 m + w], rows `stride` words apart) in dynamic
// shared memory, then loads fragment A from it, fragment B (its rows as B's columns), and the
// two B tiles 8 rows apart, and A transposed (its rows as A's columns); out[14 lane + k]: A's 4
// registers, B's 2, the pair's 4, the transposed A's 4. By `mode`,
// what the hardware faults on or races: 1 rows 4 bytes past their 16-byte alignment, 2 rows in
// global memory (`input`), 3 no __syncwarp between the staging and the loads.
template <typename scalar_t>
__global__ void fragments(const scalar_t* __restrict__ input, scalar_t* __restrict__ out, int stride, int mode) {
    typedef typename Element<scalar_t>::acc_t acc_t;
    OPLIB_DYNAMIC_SHARED(unsigned int, words);
    const int lane = threadIdx.x;
    unsigned int* tile = words + (mode == 1 ? 1 : 0);
    for (int i = lane; i < 16 * 8; i += 32) tile[i / 8 * stride + i % 8] = (unsigned int)input[i];
    if (mode != 3) __syncwarp();
    const unsigned int* from = mode == 2 ? reinterpret_cast<const unsigned int*>(input) : tile;
    const OplibFragmentA a = oplib_load_fragment_a(from, stride);
    const OplibFragmentB b = oplib_load_fragment_b(from, stride);
    OplibFragmentB first, second;
    oplib_load_fragments_b(from, stride, 8 * stride, first, second);
    const OplibFragmentA transposed = oplib_load_fragment_a_transposed(from, stride);
    const unsigned int got[14] = {a.reg[0], a.reg[1], a.reg[2], a.reg[3], b.reg[0], b.reg[1],
                                  first.reg[0], first.reg[1], second.reg[0], second.reg[1],
                                  transposed.reg[0], transposed.reg[1], transposed.reg[2], transposed.reg[3]};
    for (int k = 0; k < 14; ++k) out[14 * lane + k] = Element<scalar_t>::store((acc_t)got[k]);
}

// warp.cuh's TF32 product in a block of one warp: A (16 x 8, a[8 m + k]) and B (8 x 8, b[8 k + n])
// taken into fragments as the PTX ISA lays them out, then D = A B (out[8 m + n]) by one TF32
// product of the operands rounded (`three` 0) or by 3xTF32 from their splits (1); out[128 + i]
// is a[i] rounded to TF32.
template <typename scalar_t>
__global__ void tf32_product(const scalar_t* __restrict__ a, const scalar_t* __restrict__ b,
                             scalar_t* __restrict__ out, int three) {
    typedef typename Element<scalar_t>::acc_t acc_t;
    const int lane = threadIdx.x, group = lane >> 2, quad = lane & 3;
    const float a_values[4] = {(float)a[8 * group + quad], (float)a[8 * (group + 8) + quad],
                               (float)a[8 * group + quad + 4], (float)a[8 * (group + 8) + quad + 4]};
    const float b_values[2] = {(float)b[8 * quad + group], (float)b[8 * (quad + 4) + group]};
    OplibFragmentTf32A a_hi, a_lo;
    OplibFragmentTf32B b_hi, b_lo;
    for (int i = 0; i < 4; ++i) oplib_split_tf32_into(a_hi, a_lo, i, a_values[i]);
    for (int i = 0; i < 2; ++i) oplib_split_tf32_into(b_hi, b_lo, i, b_values[i]);
    OplibFragmentC d = {{0.0f, 0.0f, 0.0f, 0.0f}};
    if (three) {
        oplib_mma_3xtf32(d, a_hi, a_lo, b_hi, b_lo);
    } else {
        oplib_mma_tf32(d, a_hi, b_hi);
    }
    for (int h = 0; h < 2; ++h)
        for (int e = 0; e < 2; ++e) out[8 * (group + 8 * h) + 2 * quad + e] = Element<scalar_t>::store((acc_t)d.value[2 * h + e]);
    for (int i = lane; i < 128; i += 32) out[128 + i] = Element<scalar_t>::store((acc_t)oplib_round_tf32((float)a[i]));
}
