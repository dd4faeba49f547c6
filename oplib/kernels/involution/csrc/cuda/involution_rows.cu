// involution's forward for NCHW tensors, a run of output pixels a thread:
//
//   out[n, c, i, j] = sum_{a, b} weight[n, g(c), a, b, i, j] * input[n, c, i*S - ph + a, j*S - pw + b]
//
// input: (N, C, H, W), weight: (N, G, K, K, Ho, Wo), output: (N, C, Ho, Wo), all contiguous;
// square kernels of KERNEL taps a side, equal strides STRIDE, dilation 1 (the host declines
// every other geometry, and involution.cu's kernels serve it).
//
// Why: involution.cu's chunked kernel gives a thread one pixel, so in NCHW every tap is a
// 2-byte (bfloat16) or 4-byte load per channel, and the input value under a tap is loaded again
// by each of the KERNEL pixels of a row that reads it. The fifth H200 draw measured it at the
// same device time in bfloat16 as in float32 (bound by load instructions, not bytes). Here a
// thread owns Rows::pixels adjacent output pixels of one row of one channel: for each kernel
// row it loads the (pixels - 1) * STRIDE + KERNEL input values the run reads, once each, into
// registers, and the run's weights of a tap together (16-byte vectors where the host says they
// are aligned).
//
// Each sum adds its taps in the order of involution.cu's kernels (kernel row, then column),
// skipping the taps outside the image as they do, so all give the same bits. One thread per
// (run, channel) item: no atomics, deterministic. Grid-stride loop; 64-bit indices.

#include "element.cuh"

// Output pixels a thread owns along a row, a multiple of its type's vector lanes: 8, and 4 for
// 8-byte values (two registers a value). A thread owns one channel: with two, ptxas kept the
// 7x7 window within the 128 registers below only by spilling.
constexpr int ROWS_PIXELS = 8;
constexpr int ROWS_PIXELS_8_BYTE = 4;
// The block size of every grid-stride launch (oplib.kernels.cuda_launch.BLOCK_SIZE), and the
// blocks that must fit on an SM at once: ptxas keeps the kernel within 128 registers (the
// compile checks' budget), where unbounded it took up to 136 for some windows; with 3 blocks
// (80 registers) it spilled.
constexpr int ROWS_THREADS = 256;
constexpr int ROWS_MIN_BLOCKS = 2;

template <typename scalar_t>
struct Rows {
    static constexpr int pixels = sizeof(scalar_t) == 8 ? ROWS_PIXELS_8_BYTE : ROWS_PIXELS;
    static constexpr int lanes = Vector16<scalar_t>::lanes;
    static_assert(pixels % lanes == 0, "a run's weights are whole vectors");
};

// The run's weights of one tap: PIXELS values `taps[0..]`, as 16-byte vectors where `vectors`
// (the host checked the alignment) and the whole run is inside the row, else one at a time up
// to `valid` (zero past it).
template <typename scalar_t, typename acc_t>
__device__ __forceinline__ void load_run(acc_t* w, const scalar_t* taps, bool vectors, int valid) {
    constexpr int PIXELS = Rows<scalar_t>::pixels, LANES = Rows<scalar_t>::lanes;
    if (vectors && valid == PIXELS) {
#pragma unroll
        for (int v = 0; v < PIXELS / LANES; ++v) {
            const Vector16<scalar_t> values = *reinterpret_cast<const Vector16<scalar_t>*>(taps + v * LANES);
#pragma unroll
            for (int e = 0; e < LANES; ++e) w[v * LANES + e] = Element<scalar_t>::value(values.lane[e]);
        }
    } else {
#pragma unroll
        for (int p = 0; p < PIXELS; ++p) w[p] = p < valid ? Element<scalar_t>::load(taps + p) : (acc_t)0;
    }
}

// One kernel row's taps for the run: INTERIOR when every pixel of the run is in the row and
// every input column it reads is in the image (no test per tap), else each tap tested.
template <typename scalar_t, typename acc_t, int KERNEL, int STRIDE, bool INTERIOR>
__device__ __forceinline__ void accumulate_row(acc_t* sum, const scalar_t* image_row, const scalar_t* kernel_row,
                                               index_t tap_step, index_t x0, index_t width, bool vectors, int valid) {
    constexpr int PIXELS = Rows<scalar_t>::pixels;
    constexpr int SPAN = (PIXELS - 1) * STRIDE + KERNEL;
    acc_t window[SPAN];
#pragma unroll
    for (int t = 0; t < SPAN; ++t) {
        const index_t x = x0 + t;
        window[t] = INTERIOR || (x >= 0 && x < width) ? Element<scalar_t>::load(image_row + x) : (acc_t)0;
    }
#pragma unroll
    for (int b = 0; b < KERNEL; ++b) {
        acc_t w[PIXELS];
        load_run<scalar_t>(w, kernel_row + b * tap_step, vectors, valid);
#pragma unroll
        for (int p = 0; p < PIXELS; ++p) {
            const index_t x = x0 + p * STRIDE + b;
            if (!INTERIOR && (p >= valid || x < 0 || x >= width)) continue;
            sum[p] = oplib_fma(w[p], window[p * STRIDE + b], sum[p]);
        }
    }
}

// The instantiations a host may ask for (oplib.kernels reads these lines):
// oplib-instantiate: involution_forward_rows
// oplib-template: KERNEL = 3 | 5 | 7
// oplib-template: STRIDE = 1 | 2
//
// One work item per (sample n, channel c, output row i, run s of Rows::pixels columns): the
// run varies fastest, so adjacent threads read adjacent runs of a row.
template <typename scalar_t, int KERNEL, int STRIDE>
__global__ void __launch_bounds__(ROWS_THREADS, ROWS_MIN_BLOCKS) involution_forward_rows(
    const scalar_t* __restrict__ input, const scalar_t* __restrict__ weight, scalar_t* __restrict__ output,
    index_t total, index_t channels, index_t height, index_t width, index_t groups, index_t out_h, index_t out_w,
    index_t pad_h, index_t pad_w, bool vectors) {
    typedef typename Element<scalar_t>::acc_t acc_t;
    constexpr int PIXELS = Rows<scalar_t>::pixels;
    constexpr int TAPS = KERNEL * KERNEL;
    constexpr int SPAN = (PIXELS - 1) * STRIDE + KERNEL;
    const index_t C = channels, H = height, W = width, G = groups, OH = out_h, OW = out_w;
    const index_t per_group = C / G, runs = (OW + PIXELS - 1) / PIXELS, plane = OH * OW;
    for (index_t index = oplib_first_index(); index < total; index += oplib_grid_step()) {
        index_t rest = index;
        const index_t s = rest % runs;
        rest /= runs;
        const index_t i = rest % OH;
        rest /= OH;
        const index_t c = rest % C, n = rest / C;
        const index_t j0 = s * PIXELS, g = c / per_group;
        const index_t y0 = i * STRIDE - pad_h, x0 = j0 * STRIDE - pad_w;
        const int valid = OW - j0 < PIXELS ? (int)(OW - j0) : PIXELS;
        const bool interior = valid == PIXELS && x0 >= 0 && x0 + SPAN <= W;
        const scalar_t* kernel = weight + (n * G + g) * TAPS * plane + i * OW + j0;
        acc_t sum[PIXELS];
#pragma unroll
        for (int p = 0; p < PIXELS; ++p) sum[p] = 0;
        for (int a = 0; a < KERNEL; ++a) {
            const index_t y = y0 + a;
            if (y < 0 || y >= H) continue;
            const scalar_t* image_row = input + ((n * C + c) * H + y) * W;
            const scalar_t* kernel_row = kernel + a * KERNEL * plane;
            if (interior)
                accumulate_row<scalar_t, acc_t, KERNEL, STRIDE, true>(sum, image_row, kernel_row, plane, x0, W, vectors,
                                                                      valid);
            else
                accumulate_row<scalar_t, acc_t, KERNEL, STRIDE, false>(sum, image_row, kernel_row, plane, x0, W,
                                                                       vectors, valid);
        }
        scalar_t* out_row = output + (n * C + c) * plane + i * OW + j0;
#pragma unroll
        for (int p = 0; p < PIXELS; ++p)
            if (p < valid) out_row[p] = Element<scalar_t>::store(sum[p]);
    }
}
