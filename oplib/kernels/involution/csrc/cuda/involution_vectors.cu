// involution's forward for NCHW tensors, a vector of adjacent output pixels a lane:
//
//   out[n, c, i, j] = sum_{a, b} weight[n, g(c), a, b, i, j] * input[n, c, i*S - ph + a, j*S - pw + b]
//
// input: (N, C, H, W), weight: (N, G, K, K, Ho, Wo), output: (N, C, Ho, Wo), all contiguous;
// square kernels of KERNEL taps a side, equal strides STRIDE, dilation 1, horizontal padding
// KERNEL / 2 (RedNet's, and any "same" involution's); W and Wo multiples of the pixel vector and
// the three pointers aligned to it. The host declines every other call, and involution.cu's
// kernels serve it.
//
// Why: involution.cu's chunked kernel gives a thread one pixel, so in NCHW every tap is a
// 2-byte (bfloat16) or 4-byte load per channel: the fifth H200 draw measured its bfloat16
// forward at the device time of its float32 one, bound by load instructions, not bytes. A run
// of pixels a thread (involution_rows.cu, reverted in f605bba) cut the instructions but the
// offline model predicted it slower: its lanes strode by a run, so each scalar load touched
// four lines. Here the lanes of a warp stay on adjacent vectors of pixels, every global access
// is one aligned vector per lane (the warp's accesses contiguous), and a thread owns Vectors::
// channels channels of a group, so the weights of a kernel row are loaded and converted once for
// all of them.
//
// The window: for a kernel row, the (PIXELS - 1) * STRIDE + KERNEL input values a vector of
// pixels reads, loaded as whole aligned vectors. W is a multiple of PIXELS, so each such vector
// is inside the row or wholly outside it; its first value sits at a compile-time offset in the
// window because the horizontal padding is compile-time.
//
// One path for every lane, border or not: a warp whose lanes took an interior and a border path
// would issue both (at a 56-pixel row, 2 of every 14 vectors touch a border, so nearly every
// warp). Instead a window vector outside the row holds -0, and each weight whose tap falls
// outside is +0 (set once per kernel row, for all the thread's channels): such a tap adds
// fma(+0, -0, sum) = sum + (-0), which is sum itself for every sum (-0 and NaN included). So each
// sum gets the bits of involution.cu's kernels, which skip those taps and add the others in the
// same order (kernel row, then column), whatever the weights hold (an infinite weight at a
// skipped tap must not make a NaN). One thread per (vector, channel chunk) item: no atomics,
// deterministic. Grid-stride loop over 32-bit work items; 64-bit offsets into the tensors.

#include "element.cuh"

// Adjacent output pixels a lane owns (one vector: 8 bytes of bfloat16/float16, 16 of float32
// and float64), and channels a thread owns, by the bytes of a value (the host takes this kernel
// only where a group's channels are a multiple), or in the forward's WIDE instantiations
// VECTORS_WIDE_FACTOR times as many. More channels load and convert a kernel row's weights
// fewer times: the offline model puts 8 of bfloat16 and 4 of float32 at 0.82x and 0.77x of
// these ones' sm_90 time at RedNet-50's first stage (bench/results/cuda-model.md). But their
// sums and weights fill the 128 registers two blocks an SM leave: ptxas spilled them at stride 2
// (7 x 7, every 16-bit dtype and float32, sm_80 to sm_90) and from sm_100 on at stride 1 too,
// and at a 3 x 3 window, whose three weights a row leave little to save, they cost sm_90 one of
// three resident blocks. So the host takes WIDE where the GPU's build of it uses no local memory
// (no spill; the driver's CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES) and leaves as many blocks resident
// as these channels' (its occupancy calculator; oplib.kernels.involution.cuda.vectors_wide),
// these channels elsewhere. The host reads these lines.
constexpr int VECTORS_PIXELS = 4;
constexpr int VECTORS_PIXELS_8_BYTE = 2;
constexpr int VECTORS_CHANNELS_2_BYTE = 4;
constexpr int VECTORS_CHANNELS_4_BYTE = 2;
constexpr int VECTORS_CHANNELS_8_BYTE = 2;
constexpr int VECTORS_WIDE_FACTOR = 2;
// grad_input's: its weights are not aligned to the pixel vector (tap b reads columns x + pw - b),
// so a kernel row costs it twice the weight loads and a selection, which more channels share;
// float32 at 4 stays within the budget on every target there (8 of bfloat16 spilled on sm_90).
constexpr int VECTORS_GRAD_INPUT_CHANNELS_2_BYTE = 4;
constexpr int VECTORS_GRAD_INPUT_CHANNELS_4_BYTE = 4;
constexpr int VECTORS_GRAD_INPUT_CHANNELS_8_BYTE = 2;
// The block size of every grid-stride launch (oplib.kernels.cuda_launch.BLOCK_SIZE), and the
// blocks that must fit on an SM at once, so that ptxas keeps within 128 registers.
constexpr int VECTORS_THREADS = 256;
constexpr int VECTORS_MIN_BLOCKS = 2;

template <typename scalar_t>
struct Vectors {
    static constexpr int pixels = sizeof(scalar_t) == 8 ? VECTORS_PIXELS_8_BYTE : VECTORS_PIXELS;
    static constexpr int channels = sizeof(scalar_t) == 8   ? VECTORS_CHANNELS_8_BYTE
                                    : sizeof(scalar_t) == 4 ? VECTORS_CHANNELS_4_BYTE
                                                            : VECTORS_CHANNELS_2_BYTE;
    static constexpr int grad_input_channels = sizeof(scalar_t) == 8   ? VECTORS_GRAD_INPUT_CHANNELS_8_BYTE
                                               : sizeof(scalar_t) == 4 ? VECTORS_GRAD_INPUT_CHANNELS_4_BYTE
                                                                       : VECTORS_GRAD_INPUT_CHANNELS_2_BYTE;
};

// `pixels` values of one storage type moved by one load or store instruction.
template <typename scalar_t, int PIXELS>
struct alignas(sizeof(scalar_t) * PIXELS) PixelVector {
    scalar_t lane[PIXELS];
};

// values[0..PIXELS) = the vector at `at` (aligned), widened to the accumulator type; -0 where
// not `inside`, and then nothing is read.
template <typename scalar_t, typename acc_t, int PIXELS>
__device__ __forceinline__ void load_pixels(acc_t* values, const scalar_t* at, bool inside) {
    PixelVector<scalar_t, PIXELS> vector;
    if (inside) {
        vector = *reinterpret_cast<const PixelVector<scalar_t, PIXELS>*>(at);
    } else {
#pragma unroll
        for (int e = 0; e < PIXELS; ++e) vector.lane[e] = Element<scalar_t>::store(-(acc_t)0);
    }
#pragma unroll
    for (int e = 0; e < PIXELS; ++e) values[e] = Element<scalar_t>::value(vector.lane[e]);
}

// bfloat16: each 32-bit word holds two values, the first in its low half; a value's float is
// its 16 bits in the high half of a word (one shift or one mask each, where the generic
// conversion extracts the half first).
template <>
__device__ __forceinline__ void load_pixels<oplib_bfloat16, float, 4>(float* values, const oplib_bfloat16* at,
                                                                      bool inside) {
    unsigned int words[2] = {0x80008000u, 0x80008000u};  // -0, -0
    if (inside) {
        struct alignas(8) Pair {
            unsigned int word[2];
        };
        const Pair pair = *reinterpret_cast<const Pair*>(at);
        words[0] = pair.word[0];
        words[1] = pair.word[1];
    }
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        values[2 * h] = __uint_as_float(words[h] << 16);
        values[2 * h + 1] = __uint_as_float(words[h] & 0xffff0000u);
    }
}

// inside[v]: whether the window vector v, columns first + v * PIXELS onwards, is in the row
// [0, width) (wholly, as width is a multiple of PIXELS), for v < LOADS.
template <int LOADS, int PIXELS>
__device__ __forceinline__ void vectors_inside(bool* inside, index_t first, index_t width) {
#pragma unroll
    for (int v = 0; v < LOADS; ++v) inside[v] = first + v * PIXELS >= 0 && first + v * PIXELS < width;
}

// A work item (32-bit) -> (sample n, group g, part k: a chunk of the group's channels or a
// kernel row, row of pixels, vector s of the row): the vector varies fastest.
__device__ __forceinline__ void decode_vector_item(int index, int vectors, int rows, int parts, int groups, int* s,
                                                   int* row, int* k, index_t* g, index_t* n) {
    *s = index % vectors;
    index /= vectors;
    *row = index % rows;
    index /= rows;
    *k = index % parts;
    index /= parts;
    *g = index % groups;
    *n = index / groups;
}

// window[0 .. LOADS * PIXELS) = the LOADS vectors from `row` onwards, widened; -0 for those
// outside the row (not read).
template <typename scalar_t, typename acc_t, int LOADS>
__device__ __forceinline__ void load_window(acc_t* window, const scalar_t* row, const bool* vector_inside) {
    constexpr int PIXELS = Vectors<scalar_t>::pixels;
#pragma unroll
    for (int v = 0; v < LOADS; ++v)
        load_pixels<scalar_t, acc_t, PIXELS>(window + v * PIXELS, row + v * PIXELS, vector_inside[v]);
}

// The multiply-adds of one kernel row for the thread's CHANNELS channels: per channel, the
// window's LOADS vectors from `row` (channels `channel_step` apart; -0 for those outside the
// row), then for each tap b and pixel p, sum[c][p] += w[b][p] * window[BASE + b * TAP_STEP + p *
// PIXEL_STEP], taps in ascending order.
template <typename scalar_t, typename acc_t, int CHANNELS, int KERNEL, int LOADS, int BASE, int TAP_STEP,
          int PIXEL_STEP>
__device__ __forceinline__ void accumulate_channels(acc_t (*sum)[Vectors<scalar_t>::pixels],
                                                    const acc_t (*w)[Vectors<scalar_t>::pixels], const scalar_t* row,
                                                    index_t channel_step, const bool* vector_inside) {
    constexpr int PIXELS = Vectors<scalar_t>::pixels;
#pragma unroll
    for (int c = 0; c < CHANNELS; ++c) {
        acc_t window[LOADS * PIXELS];
        load_window<scalar_t, acc_t, LOADS>(window, row + c * channel_step, vector_inside);
#pragma unroll
        for (int b = 0; b < KERNEL; ++b)
#pragma unroll
            for (int p = 0; p < PIXELS; ++p)
                sum[c][p] = oplib_fma(w[b][p], window[BASE + b * TAP_STEP + p * PIXEL_STEP], sum[c][p]);
    }
}

// out[c * plane + p] = sum[c][p] for c < PLANES (channels, or grad_weight's taps), one vector
// store each.
template <typename scalar_t, typename acc_t, int PLANES>
__device__ __forceinline__ void store_planes(scalar_t* out, const acc_t (*sum)[Vectors<scalar_t>::pixels],
                                             index_t plane) {
    constexpr int PIXELS = Vectors<scalar_t>::pixels;
#pragma unroll
    for (int c = 0; c < PLANES; ++c) {
        PixelVector<scalar_t, PIXELS> vector;
#pragma unroll
        for (int p = 0; p < PIXELS; ++p) vector.lane[p] = Element<scalar_t>::store(sum[c][p]);
        *reinterpret_cast<PixelVector<scalar_t, PIXELS>*>(out + c * plane) = vector;
    }
}

// The forward's and grad_weight's window for a vector of output pixels: the input columns
// x0 - PAD_W .. x0 + (PIXELS - 1) * STRIDE + KERNEL - 1 - PAD_W for the vector's first column
// x0 * STRIDE, loaded as LOADS aligned vectors from x_aligned = x0 * STRIDE - PAD_W - OFFSET.
template <typename scalar_t, int KERNEL, int STRIDE>
struct OutputWindow {
    static constexpr int PIXELS = Vectors<scalar_t>::pixels;
    static constexpr int PAD_W = KERNEL / 2;
    static constexpr int OFFSET = ((PIXELS - PAD_W) % PIXELS + PIXELS) % PIXELS;
    static constexpr int SPAN = (PIXELS - 1) * STRIDE + KERNEL;
    static constexpr int LOADS = (OFFSET + SPAN + PIXELS - 1) / PIXELS;
};

// The instantiations a host may ask for (oplib.kernels reads these lines):
// oplib-instantiate: involution_forward_vectors, involution_backward_input_vectors, involution_backward_weight_vectors
// oplib-template: KERNEL = 3 | 5 | 7
// oplib-template: STRIDE = 1 | 2
// oplib-template: WIDE = false | true
//
// One work item per (sample n, group g, chunk k of the group's channels, output row i, vector
// s of the row's pixels): the vector varies fastest, so adjacent lanes read adjacent vectors.
// A chunk: Vectors::channels channels, VECTORS_WIDE_FACTOR times as many where WIDE.
template <typename scalar_t, int KERNEL, int STRIDE, bool WIDE>
__global__ void __launch_bounds__(VECTORS_THREADS, VECTORS_MIN_BLOCKS) involution_forward_vectors(
    const scalar_t* __restrict__ input, const scalar_t* __restrict__ weight, scalar_t* __restrict__ output,
    index_t total, index_t channels, index_t height, index_t width, index_t groups, index_t out_h, index_t out_w,
    index_t pad_h) {
    typedef typename Element<scalar_t>::acc_t acc_t;
    typedef OutputWindow<scalar_t, KERNEL, STRIDE> Window;
    constexpr int PIXELS = Window::PIXELS, PAD_W = Window::PAD_W, OFFSET = Window::OFFSET, LOADS = Window::LOADS;
    constexpr int CHANNELS = Vectors<scalar_t>::channels * (WIDE ? VECTORS_WIDE_FACTOR : 1);
    constexpr int TAPS = KERNEL * KERNEL;
    const index_t C = channels, H = height, W = width, G = groups, OH = out_h, OW = out_w;
    const index_t per_group = C / G, chunks = per_group / CHANNELS, vectors = OW / PIXELS, plane = OH * OW;
    const index_t image_plane = H * W;
    // Work items in 32-bit arithmetic (the host launches this kernel only where they, and one
    // grid past them, fit in an int): 64-bit divisions are calls whose registers made ptxas spill.
    for (int index = (int)oplib_first_index(); index < (int)total; index += (int)oplib_grid_step()) {
        int s, i, k;
        index_t g, n;
        decode_vector_item(index, (int)vectors, (int)OH, (int)chunks, (int)G, &s, &i, &k, &g, &n);
        const index_t c0 = g * per_group + k * CHANNELS;
        const index_t j0 = (index_t)s * PIXELS, y0 = (index_t)i * STRIDE - pad_h;
        const index_t x_aligned = j0 * STRIDE - PAD_W - OFFSET;
        bool vector_inside[LOADS];
        vectors_inside<LOADS, PIXELS>(vector_inside, x_aligned, W);
        const scalar_t* kernel = weight + (n * G + g) * TAPS * plane + i * OW + j0;
        acc_t sum[CHANNELS][PIXELS];
#pragma unroll
        for (int c = 0; c < CHANNELS; ++c)
#pragma unroll
            for (int p = 0; p < PIXELS; ++p) sum[c][p] = 0;
        for (int a = 0; a < KERNEL; ++a) {
            const index_t y = y0 + a;
            if (y < 0 || y >= H) continue;
            acc_t w[KERNEL][PIXELS];
#pragma unroll
            for (int b = 0; b < KERNEL; ++b) {
                load_pixels<scalar_t, acc_t, PIXELS>(w[b], kernel + (a * KERNEL + b) * plane, true);
#pragma unroll
                for (int p = 0; p < PIXELS; ++p)  // the tap's column is inside iff its window vector is
                    if (!vector_inside[(OFFSET + p * STRIDE + b) / PIXELS]) w[b][p] = 0;
            }
            accumulate_channels<scalar_t, acc_t, CHANNELS, KERNEL, LOADS, OFFSET, 1, STRIDE>(
                sum, w, input + ((n * C + c0) * H + y) * W + x_aligned, image_plane, vector_inside);
        }
        store_planes<scalar_t, acc_t, CHANNELS>(output + (n * C + c0) * plane + i * OW + j0, sum, plane);
    }
}

// involution's grad_input for NCHW tensors at stride 1, a vector of adjacent input pixels a lane:
//
//   grad_input[n, c, y, x] = sum_{a, b} weight[n, g(c), a, b, i, j] * grad_output[n, c, i, j],
//                            i = y + ph - a, j = x + pw - b, over the (i, j) inside the output
//
// grad_output: (N, C, Ho, Wo), weight: (N, G, K, K, Ho, Wo), grad_input: (N, C, H, W), all
// contiguous; at stride 1 with horizontal padding KERNEL / 2, Wo = W. A lane owns 4 adjacent
// columns x0 + p of one input row (2 in float64), a thread Vectors::grad_input_channels. Tap b
// reads, for those pixels, grad_output and the weight at the same columns j = x0 + p + pw - b:
// both come from the row's window of grad_output columns, loaded as whole aligned vectors, and
// from the tap's weight plane at the same aligned vectors (one or two a tap, the 4 columns picked
// from them). As in the forward, a vector outside the row holds -0 (grad_output) and +0 (weight),
// so a tap outside adds exactly nothing and each sum has the bits of involution.cu's chunked
// grad_input, which adds the taps in the same order (kernel row, then column).
template <typename scalar_t, int KERNEL>
__global__ void __launch_bounds__(VECTORS_THREADS, VECTORS_MIN_BLOCKS) involution_backward_input_vectors(
    const scalar_t* __restrict__ grad_output, const scalar_t* __restrict__ weight, scalar_t* __restrict__ grad_input,
    index_t total, index_t channels, index_t height, index_t width, index_t groups, index_t out_h, index_t pad_h) {
    typedef typename Element<scalar_t>::acc_t acc_t;
    constexpr int PIXELS = Vectors<scalar_t>::pixels;
    constexpr int CHANNELS = Vectors<scalar_t>::grad_input_channels;
    constexpr int TAPS = KERNEL * KERNEL;
    constexpr int PAD_W = KERNEL / 2;
    // The window: grad_output columns x0 + PAD_W - (KERNEL - 1) .. x0 + PAD_W + PIXELS - 1, its
    // first at OFFSET in the aligned vectors from j_aligned; tap b, pixel p reads window index
    // OFFSET + KERNEL - 1 - b + p.
    constexpr int OFFSET = ((PAD_W - (KERNEL - 1)) % PIXELS + PIXELS) % PIXELS;
    constexpr int SPAN = KERNEL + PIXELS - 1;
    constexpr int LOADS = (OFFSET + SPAN + PIXELS - 1) / PIXELS;
    const index_t C = channels, H = height, W = width, G = groups, OH = out_h, OW = width;
    const index_t per_group = C / G, chunks = per_group / CHANNELS, vectors = W / PIXELS, plane = OH * OW;
    for (int index = (int)oplib_first_index(); index < (int)total; index += (int)oplib_grid_step()) {
        int s, y, k;
        index_t g, n;
        decode_vector_item(index, (int)vectors, (int)H, (int)chunks, (int)G, &s, &y, &k, &g, &n);
        const index_t c0 = g * per_group + k * CHANNELS;
        const index_t x0 = (index_t)s * PIXELS, ry = y + pad_h;
        const index_t j_aligned = x0 + PAD_W - (KERNEL - 1) - OFFSET;
        bool vector_inside[LOADS];
        vectors_inside<LOADS, PIXELS>(vector_inside, j_aligned, OW);
        acc_t sum[CHANNELS][PIXELS];
#pragma unroll
        for (int c = 0; c < CHANNELS; ++c)
#pragma unroll
            for (int p = 0; p < PIXELS; ++p) sum[c][p] = 0;
        for (int a = 0; a < KERNEL; ++a) {
            const index_t i = ry - a;
            if (i < 0 || i >= OH) continue;
            acc_t w[KERNEL][PIXELS];
#pragma unroll
            for (int b = 0; b < KERNEL; ++b) {
                const scalar_t* taps = weight + ((n * G + g) * TAPS + a * KERNEL + b) * plane + i * OW + j_aligned;
                const int first = OFFSET + KERNEL - 1 - b;  // the window index of pixel 0
                acc_t loaded[2 * PIXELS];
#pragma unroll
                for (int h = 0; h < 2; ++h) {
                    const int v = first / PIXELS + h;
                    if (h == 0 || first % PIXELS != 0)
                        load_pixels<scalar_t, acc_t, PIXELS>(loaded + h * PIXELS, taps + v * PIXELS,
                                                             vector_inside[v]);
                }
#pragma unroll
                for (int p = 0; p < PIXELS; ++p) {
                    const int at = first % PIXELS + p;
                    w[b][p] = vector_inside[(first + p) / PIXELS] ? loaded[at] : (acc_t)0;
                }
            }
            accumulate_channels<scalar_t, acc_t, CHANNELS, KERNEL, LOADS, OFFSET + KERNEL - 1, -1, 1>(
                sum, w, grad_output + ((n * C + c0) * OH + i) * OW + j_aligned, plane, vector_inside);
        }
        store_planes<scalar_t, acc_t, CHANNELS>(grad_input + (n * C + c0) * H * W + (index_t)y * W + x0, sum, H * W);
    }
}

// involution's grad_weight for NCHW tensors, a vector of adjacent output pixels a lane:
//
//   grad_weight[n, g, a, b, i, j] = sum over the group's channels c of
//                                   grad_output[n, c, i, j] * input[n, c, i*S - ph + a, j*S - pw + b]
//
// grad_output: (N, C, Ho, Wo), input: (N, C, H, W), grad_weight: (N, G, K, K, Ho, Wo), all
// contiguous; the geometry the forward serves. A lane owns 4 adjacent output pixels of a row (2
// in float64) and a thread one kernel row a, all KERNEL taps of it, so that each channel's
// grad_output vector and input window (the forward's, aligned vectors) are loaded once for the
// row's taps. Every tap is accumulated in every channel, and the sums of taps outside the image
// (which read the window's -0, or NaN from an infinite grad_output) are set to +0 at the end,
// what involution.cu's chunked grad_weight writes for them: a predicate on each multiply-add
// instead made the compiler convert the 16-bit values again for each one. The channels are
// added in the chunked kernel's order: the same bits. A row outside the image writes zeros.
template <typename scalar_t, int KERNEL, int STRIDE>
__global__ void __launch_bounds__(VECTORS_THREADS, VECTORS_MIN_BLOCKS) involution_backward_weight_vectors(
    const scalar_t* __restrict__ grad_output, const scalar_t* __restrict__ input, scalar_t* __restrict__ grad_weight,
    index_t total, index_t channels, index_t height, index_t width, index_t groups, index_t out_h, index_t out_w,
    index_t pad_h) {
    typedef typename Element<scalar_t>::acc_t acc_t;
    typedef OutputWindow<scalar_t, KERNEL, STRIDE> Window;
    constexpr int PIXELS = Window::PIXELS, PAD_W = Window::PAD_W, OFFSET = Window::OFFSET, LOADS = Window::LOADS;
    constexpr int TAPS = KERNEL * KERNEL;
    const index_t C = channels, H = height, W = width, G = groups, OH = out_h, OW = out_w;
    const index_t per_group = C / G, vectors = OW / PIXELS, plane = OH * OW, image_plane = H * W;
    for (int index = (int)oplib_first_index(); index < (int)total; index += (int)oplib_grid_step()) {
        int s, i, a;
        index_t g, n;
        decode_vector_item(index, (int)vectors, (int)OH, KERNEL, (int)G, &s, &i, &a, &g, &n);
        const index_t j0 = (index_t)s * PIXELS, y = (index_t)i * STRIDE - pad_h + a;
        const index_t x_aligned = j0 * STRIDE - PAD_W - OFFSET;
        bool vector_inside[LOADS];
        vectors_inside<LOADS, PIXELS>(vector_inside, x_aligned, W);
        acc_t sum[KERNEL][PIXELS];
#pragma unroll
        for (int b = 0; b < KERNEL; ++b)
#pragma unroll
            for (int p = 0; p < PIXELS; ++p) sum[b][p] = 0;
        if (y >= 0 && y < H) {
            const index_t c0 = n * C + g * per_group;
            const scalar_t* grad = grad_output + c0 * plane + (index_t)i * OW + j0;
            const scalar_t* row = input + (c0 * H + y) * W + x_aligned;
            for (index_t c = 0; c < per_group; ++c) {
                acc_t value[PIXELS], window[LOADS * PIXELS];
                load_pixels<scalar_t, acc_t, PIXELS>(value, grad + c * plane, true);
                load_window<scalar_t, acc_t, LOADS>(window, row + c * image_plane, vector_inside);
#pragma unroll
                for (int b = 0; b < KERNEL; ++b)
#pragma unroll
                    for (int p = 0; p < PIXELS; ++p)
                        sum[b][p] = oplib_fma(value[p], window[OFFSET + p * STRIDE + b], sum[b][p]);
            }
        }
#pragma unroll
        for (int b = 0; b < KERNEL; ++b)
#pragma unroll
            for (int p = 0; p < PIXELS; ++p)  // a tap outside the image: what the chunked kernel writes
                if (!vector_inside[(OFFSET + p * STRIDE + b) / PIXELS]) sum[b][p] = 0;
        store_planes<scalar_t, acc_t, KERNEL>(grad_weight + ((n * G + g) * TAPS + a * KERNEL) * plane + (index_t)i * OW + j0,
                                              sum, plane);
    }
}
