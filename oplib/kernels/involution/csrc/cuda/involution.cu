// Involution kernels: forward, gradient of the input, gradient of the weight.
//
//   out[n, c, i, j] = sum_{a, b} weight[n, g(c), a, b, i, j] * input[n, c, i*sh - ph + a*dh, j*sw - pw + b*dw]
//
// input/grad_input: (N, C, H, W), weight/grad_weight: (N, G, KH, KW, Ho, Wo), output/grad_output:
// (N, C, Ho, Wo), all contiguous. One thread per element of the tensor being written, so no
// atomics and deterministic results. Shapes and parameters are arguments (one compiled module
// serves every shape); every index is 64-bit so tensors past 2^31 elements do not overflow.
// Grid-stride loops: any grid size covers any tensor.
//
// Compiled by CuPy (NVRTC) on a GPU and by the host C++ compiler, against
// oplib/testing/cuda_host_shim.h, in the tests.

#include "element.cuh"

// One thread per output element out[n, c, i, j].
template <typename scalar_t>
__global__ void involution_forward(
    const scalar_t* __restrict__ input, const scalar_t* __restrict__ weight, scalar_t* __restrict__ output,
    index_t total, index_t channels, index_t height, index_t width, index_t groups, index_t kernel_h,
    index_t kernel_w, index_t out_h, index_t out_w, index_t stride_h, index_t stride_w, index_t pad_h,
    index_t pad_w, index_t dilation_h, index_t dilation_w) {
    typedef typename Element<scalar_t>::acc_t acc_t;
    const index_t channels_per_group = channels / groups;
    const index_t out_plane = out_h * out_w;
    for (index_t index = oplib_first_index(); index < total; index += oplib_grid_step()) {
        const index_t j = index % out_w;
        const index_t i = (index / out_w) % out_h;
        const index_t c = (index / out_plane) % channels;
        const index_t n = index / (out_plane * channels);
        const scalar_t* image = input + (n * channels + c) * height * width;
        const scalar_t* kernel =
            weight + (n * groups + c / channels_per_group) * kernel_h * kernel_w * out_plane + i * out_w + j;
        acc_t sum = 0;
        for (index_t a = 0; a < kernel_h; ++a) {
            const index_t y = i * stride_h - pad_h + a * dilation_h;
            if (y < 0 || y >= height) continue;
            for (index_t b = 0; b < kernel_w; ++b) {
                const index_t x = j * stride_w - pad_w + b * dilation_w;
                if (x < 0 || x >= width) continue;
                sum = oplib_fma(Element<scalar_t>::load(kernel + (a * kernel_w + b) * out_plane),
                                Element<scalar_t>::load(image + y * width + x), sum);
            }
        }
        output[index] = Element<scalar_t>::store(sum);
    }
}

// One thread per input element: grad_input[n, c, y, x] gathers every (tap, output pixel) that
// read input[n, c, y, x], i.e. y = i*sh - ph + a*dh for an integer 0 <= i < Ho.
template <typename scalar_t>
__global__ void involution_backward_input(
    const scalar_t* __restrict__ grad_output, const scalar_t* __restrict__ weight,
    scalar_t* __restrict__ grad_input, index_t total, index_t channels, index_t height, index_t width,
    index_t groups, index_t kernel_h, index_t kernel_w, index_t out_h, index_t out_w, index_t stride_h,
    index_t stride_w, index_t pad_h, index_t pad_w, index_t dilation_h, index_t dilation_w) {
    typedef typename Element<scalar_t>::acc_t acc_t;
    const index_t channels_per_group = channels / groups;
    const index_t out_plane = out_h * out_w;
    for (index_t index = oplib_first_index(); index < total; index += oplib_grid_step()) {
        const index_t x = index % width;
        const index_t y = (index / width) % height;
        const index_t c = (index / (height * width)) % channels;
        const index_t n = index / (height * width * channels);
        const scalar_t* grad = grad_output + (n * channels + c) * out_plane;
        const scalar_t* kernel = weight + (n * groups + c / channels_per_group) * kernel_h * kernel_w * out_plane;
        acc_t sum = 0;
        for (index_t a = 0; a < kernel_h; ++a) {
            const index_t row = y + pad_h - a * dilation_h;  // = i * stride_h
            if (row < 0 || row % stride_h != 0) continue;
            const index_t i = row / stride_h;
            if (i >= out_h) continue;
            for (index_t b = 0; b < kernel_w; ++b) {
                const index_t col = x + pad_w - b * dilation_w;  // = j * stride_w
                if (col < 0 || col % stride_w != 0) continue;
                const index_t j = col / stride_w;
                if (j >= out_w) continue;
                sum = oplib_fma(Element<scalar_t>::load(kernel + (a * kernel_w + b) * out_plane + i * out_w + j),
                                Element<scalar_t>::load(grad + i * out_w + j), sum);
            }
        }
        grad_input[index] = Element<scalar_t>::store(sum);
    }
}

// One thread per weight element: grad_weight[n, g, a, b, i, j] sums, over the channels of group
// g, grad_output[n, c, i, j] times the input value that tap (a, b) read for pixel (i, j).
template <typename scalar_t>
__global__ void involution_backward_weight(
    const scalar_t* __restrict__ grad_output, const scalar_t* __restrict__ input,
    scalar_t* __restrict__ grad_weight, index_t total, index_t channels, index_t height, index_t width,
    index_t groups, index_t kernel_h, index_t kernel_w, index_t out_h, index_t out_w, index_t stride_h,
    index_t stride_w, index_t pad_h, index_t pad_w, index_t dilation_h, index_t dilation_w) {
    typedef typename Element<scalar_t>::acc_t acc_t;
    const index_t channels_per_group = channels / groups;
    const index_t out_plane = out_h * out_w;
    const index_t image_plane = height * width;
    for (index_t index = oplib_first_index(); index < total; index += oplib_grid_step()) {
        const index_t j = index % out_w;
        const index_t i = (index / out_w) % out_h;
        const index_t b = (index / out_plane) % kernel_w;
        const index_t a = (index / (out_plane * kernel_w)) % kernel_h;
        const index_t g = (index / (out_plane * kernel_w * kernel_h)) % groups;
        const index_t n = index / (out_plane * kernel_w * kernel_h * groups);
        const index_t y = i * stride_h - pad_h + a * dilation_h;
        const index_t x = j * stride_w - pad_w + b * dilation_w;
        acc_t sum = 0;
        if (y >= 0 && y < height && x >= 0 && x < width) {
            const index_t first_channel = n * channels + g * channels_per_group;
            const scalar_t* grad = grad_output + first_channel * out_plane + i * out_w + j;
            const scalar_t* image = input + first_channel * image_plane + y * width + x;
            for (index_t k = 0; k < channels_per_group; ++k) {
                sum = oplib_fma(Element<scalar_t>::load(grad + k * out_plane),
                                Element<scalar_t>::load(image + k * image_plane), sum);
            }
        }
        grad_weight[index] = Element<scalar_t>::store(sum);
    }
}

// ---------------------------------------------------------------------------------------------
// Specialised kernels: square kernels of KERNEL taps a side, equal strides STRIDE, dilation 1
// (RedNet's 7x7 and stride 1 or 2; the host picks them, and the generic kernels above serve
// every other geometry). Compile-time kernel size and stride unroll the tap loops and turn
// every division by the stride into a shift; the taps inside the image are computed once per
// thread, before the loops. offset_t is int when every tensor has fewer elements than the
// host's 32-bit limit, long long otherwise.
//
// Layouts: CHANNELS_LAST false: input, output and their gradients (N, C, H, W) contiguous,
// weight (N, G, K, K, Ho, Wo) contiguous. CHANNELS_LAST true: the activations (N, H, W, C)
// in memory (torch.channels_last) and the weight pixel-major, (N, Ho, Wo, G, K, K) in memory,
// as a channels_last convolution's output viewed as the weight is; the channels a thread owns
// are then adjacent and move in 16-byte vectors (the host checks channel counts and pointer
// alignment, or takes the other layout).
//
// Forward and grad_input: one thread owns one pixel and `chunk` channels of one group (at most
// Chunk::max_channels), so each weight value is loaded once and used from a register for all of
// them. grad_weight: one thread owns one pixel and one kernel row a, and sums over the group's
// channels. Every sum adds its terms in the order of the generic kernels, so both give the same
// bits. No atomics: deterministic.
//
// The instantiations a host may ask for (oplib.kernels reads these lines):
// oplib-instantiate: involution_forward_chunked, involution_backward_input_chunked, involution_backward_weight_chunked
// oplib-template: offset_t = int | long long
// oplib-template: KERNEL = 3 | 5 | 7
// oplib-template: STRIDE = 1 | 2
// oplib-template: CHANNELS_LAST = false | true

// Accumulators per thread of the chunked kernels: 16, and 8 for 8-byte values (two registers
// each). The host's launch policy reads these two lines (oplib.kernels.involution.cuda).
constexpr int CHUNK_MAX_CHANNELS = 16;
constexpr int CHUNK_MAX_CHANNELS_8_BYTE = 8;

template <typename scalar_t>
struct Chunk {
    static constexpr int max_channels = sizeof(scalar_t) == 8 ? CHUNK_MAX_CHANNELS_8_BYTE : CHUNK_MAX_CHANNELS;
    static constexpr int lanes = Vector16<scalar_t>::lanes;
};

// Taps t of one axis that land in [0, size) from first = (output position) * stride - pad:
// [*begin, *end), within [0, KERNEL].
template <int KERNEL, typename offset_t>
__device__ __forceinline__ void taps_inside(offset_t first, offset_t size, int* begin, int* end) {
    *begin = first >= 0 ? 0 : (-first < KERNEL ? (int)(-first) : KERNEL);
    const offset_t room = size - first;
    *end = room >= KERNEL ? KERNEL : (room > 0 ? (int)room : 0);
}

// sum[c] += w * values[c] for the c < per_thread channels at `pixel`, adjacent in memory,
// read as 16-byte vectors.
template <typename scalar_t, typename acc_t, typename offset_t>
__device__ __forceinline__ void accumulate_vectors(acc_t* sum, acc_t w, const scalar_t* pixel, offset_t per_thread) {
    constexpr int LANES = Chunk<scalar_t>::lanes;
#pragma unroll
    for (int v = 0; v < Chunk<scalar_t>::max_channels / LANES; ++v) {
        if (v * LANES >= per_thread) break;
        const Vector16<scalar_t> values = *reinterpret_cast<const Vector16<scalar_t>*>(pixel + v * LANES);
#pragma unroll
        for (int e = 0; e < LANES; ++e)
            sum[v * LANES + e] = oplib_fma(w, Element<scalar_t>::value(values.lane[e]), sum[v * LANES + e]);
    }
}

// out[c] = sum[c] for the c < per_thread channels, adjacent in memory (16-byte vectors) when
// CHANNELS_LAST, `plane` elements apart otherwise.
template <bool CHANNELS_LAST, typename scalar_t, typename acc_t, typename offset_t>
__device__ __forceinline__ void store_channels(scalar_t* out, const acc_t* sum, offset_t per_thread, offset_t plane) {
    constexpr int LANES = Chunk<scalar_t>::lanes;
    if (CHANNELS_LAST) {
#pragma unroll
        for (int v = 0; v < Chunk<scalar_t>::max_channels / LANES; ++v) {
            if (v * LANES >= per_thread) break;
            Vector16<scalar_t> values;
#pragma unroll
            for (int e = 0; e < LANES; ++e) values.lane[e] = Element<scalar_t>::store(sum[v * LANES + e]);
            *reinterpret_cast<Vector16<scalar_t>*>(out + v * LANES) = values;
        }
    } else {
#pragma unroll
        for (int c = 0; c < Chunk<scalar_t>::max_channels; ++c) {
            if (c >= per_thread) break;
            out[c * plane] = Element<scalar_t>::store(sum[c]);
        }
    }
}

// A thread's work item -> (sample n, group g, part k of the group's channels or kernel row,
// pixel row y and column x): the pixel varies fastest in NCHW (adjacent threads read adjacent
// pixels of a plane), the part in channels_last (adjacent threads read adjacent channels).
template <bool CHANNELS_LAST, typename offset_t>
__device__ __forceinline__ void decode_item(offset_t index, offset_t parts, offset_t groups, offset_t rows,
                                            offset_t columns, offset_t* n, offset_t* g, offset_t* k, offset_t* y,
                                            offset_t* x) {
    if (CHANNELS_LAST) {
        *k = index % parts; index /= parts;
        *g = index % groups; index /= groups;
        *x = index % columns; index /= columns;
        *y = index % rows; *n = index / rows;
    } else {
        *x = index % columns; index /= columns;
        *y = index % rows; index /= rows;
        *k = index % parts; index /= parts;
        *g = index % groups; *n = index / groups;
    }
}

template <typename scalar_t, typename offset_t, int KERNEL, int STRIDE, bool CHANNELS_LAST>
__global__ void involution_forward_chunked(
    const scalar_t* __restrict__ input, const scalar_t* __restrict__ weight, scalar_t* __restrict__ output,
    index_t total, index_t channels, index_t height, index_t width, index_t groups, index_t out_h, index_t out_w,
    index_t pad_h, index_t pad_w, index_t chunk) {
    typedef typename Element<scalar_t>::acc_t acc_t;
    constexpr int MAX_CHANNELS = Chunk<scalar_t>::max_channels;
    constexpr int TAPS = KERNEL * KERNEL;
    const offset_t C = channels, H = height, W = width, G = groups, OH = out_h, OW = out_w;
    const offset_t per_group = C / G, per_thread = chunk, chunks = per_group / per_thread;
    const offset_t plane = OH * OW;
    for (offset_t index = oplib_first_index(); index < (offset_t)total; index += oplib_grid_step()) {
        offset_t n, g, k, i, j;
        decode_item<CHANNELS_LAST>(index, chunks, G, OH, OW, &n, &g, &k, &i, &j);
        const offset_t c0 = g * per_group + k * per_thread;
        const offset_t y0 = i * STRIDE - (offset_t)pad_h, x0 = j * STRIDE - (offset_t)pad_w;
        int a_begin, a_end, b_begin, b_end;
        taps_inside<KERNEL>(y0, H, &a_begin, &a_end);
        taps_inside<KERNEL>(x0, W, &b_begin, &b_end);
        const scalar_t* kernel = CHANNELS_LAST ? weight + ((n * OH + i) * OW + j) * G * TAPS + g * TAPS
                                               : weight + (n * G + g) * TAPS * plane + i * OW + j;
        const offset_t tap_step = CHANNELS_LAST ? 1 : plane;
        acc_t sum[MAX_CHANNELS];
#pragma unroll
        for (int c = 0; c < MAX_CHANNELS; ++c) sum[c] = 0;
        for (int a = a_begin; a < a_end; ++a) {
            acc_t w[KERNEL];
#pragma unroll
            for (int b = 0; b < KERNEL; ++b) w[b] = Element<scalar_t>::load(kernel + (a * KERNEL + b) * tap_step);
            const offset_t y = y0 + a;
            if (CHANNELS_LAST) {
                const scalar_t* row = input + (n * H + y) * W * C + c0;
#pragma unroll
                for (int b = 0; b < KERNEL; ++b) {
                    if (b < b_begin || b >= b_end) continue;
                    accumulate_vectors(sum, w[b], row + (x0 + b) * C, per_thread);
                }
            } else {
                const scalar_t* row = input + ((n * C + c0) * H + y) * W;
#pragma unroll
                for (int c = 0; c < MAX_CHANNELS; ++c) {
                    if (c >= per_thread) break;
                    const scalar_t* image_row = row + c * H * W;
#pragma unroll
                    for (int b = 0; b < KERNEL; ++b) {
                        if (b < b_begin || b >= b_end) continue;
                        sum[c] = oplib_fma(w[b], Element<scalar_t>::load(image_row + x0 + b), sum[c]);
                    }
                }
            }
        }
        store_channels<CHANNELS_LAST>(CHANNELS_LAST ? output + ((n * OH + i) * OW + j) * C + c0
                                                    : output + (n * C + c0) * plane + i * OW + j,
                                      sum, per_thread, plane);
    }
}

// grad_input[n, c, y, x] sums weight[n, g, a, b, i, j] * grad_output[n, c, i, j] over the taps
// with y + pad_h = i * STRIDE + a (and likewise x): a runs over one residue class mod STRIDE.
template <typename scalar_t, typename offset_t, int KERNEL, int STRIDE, bool CHANNELS_LAST>
__global__ void involution_backward_input_chunked(
    const scalar_t* __restrict__ grad_output, const scalar_t* __restrict__ weight,
    scalar_t* __restrict__ grad_input, index_t total, index_t channels, index_t height, index_t width,
    index_t groups, index_t out_h, index_t out_w, index_t pad_h, index_t pad_w, index_t chunk) {
    typedef typename Element<scalar_t>::acc_t acc_t;
    constexpr int MAX_CHANNELS = Chunk<scalar_t>::max_channels;
    constexpr int TAPS = KERNEL * KERNEL;
    const offset_t C = channels, H = height, W = width, G = groups, OH = out_h, OW = out_w;
    const offset_t per_group = C / G, per_thread = chunk, chunks = per_group / per_thread;
    const offset_t plane = OH * OW;
    for (offset_t index = oplib_first_index(); index < (offset_t)total; index += oplib_grid_step()) {
        offset_t n, g, k, y, x;
        decode_item<CHANNELS_LAST>(index, chunks, G, H, W, &n, &g, &k, &y, &x);
        const offset_t c0 = g * per_group + k * per_thread;
        // Tap a reaches this row from output row i = (ry - a) / STRIDE, when that is an integer
        // in [0, OH): a <= ry, a >= ry - STRIDE * (OH - 1), and a = ry mod STRIDE.
        const offset_t ry = y + (offset_t)pad_h, rx = x + (offset_t)pad_w;
        int a_begin, a_end, b_begin, b_end;
        taps_inside<KERNEL>(STRIDE * (OH - 1) - ry, STRIDE * (OH - 1) + 1, &a_begin, &a_end);
        taps_inside<KERNEL>(STRIDE * (OW - 1) - rx, STRIDE * (OW - 1) + 1, &b_begin, &b_end);
        a_begin += (int)((ry - a_begin) % STRIDE);  // first a of ry's residue class (ry - a_begin >= 0 when any)
        // The columns likewise: only the taps b = b_phase + STRIDE t reach x, tap t from output
        // column j_first - t. Looping over t alone (not over every b with the others predicated
        // off, which still issue) halves a stride-2 row's instructions; same taps, same order.
        constexpr int PHASE_TAPS = (KERNEL + STRIDE - 1) / STRIDE;
        const int b_phase = (int)(rx % STRIDE);
        const offset_t j_first = (rx - b_phase) / STRIDE;
        acc_t sum[MAX_CHANNELS];
#pragma unroll
        for (int c = 0; c < MAX_CHANNELS; ++c) sum[c] = 0;
        for (int a = a_begin; a < a_end; a += STRIDE) {
            const offset_t i = (ry - a) / STRIDE;
            acc_t w[PHASE_TAPS];
#pragma unroll
            for (int t = 0; t < PHASE_TAPS; ++t) {
                const int b = b_phase + STRIDE * t;
                w[t] = 0;
                if (b < b_begin || b >= b_end) continue;
                const offset_t j = j_first - t;
                w[t] = Element<scalar_t>::load(
                    CHANNELS_LAST ? weight + ((n * OH + i) * OW + j) * G * TAPS + g * TAPS + a * KERNEL + b
                                  : weight + ((n * G + g) * TAPS + a * KERNEL + b) * plane + i * OW + j);
            }
            if (CHANNELS_LAST) {
#pragma unroll
                for (int t = 0; t < PHASE_TAPS; ++t) {
                    const int b = b_phase + STRIDE * t;
                    if (b < b_begin || b >= b_end) continue;
                    accumulate_vectors(sum, w[t], grad_output + ((n * OH + i) * OW + j_first - t) * C + c0, per_thread);
                }
            } else {
                const scalar_t* row = grad_output + ((n * C + c0) * OH + i) * OW + j_first;
#pragma unroll
                for (int c = 0; c < MAX_CHANNELS; ++c) {
                    if (c >= per_thread) break;
                    const scalar_t* grad_row = row + c * plane;
#pragma unroll
                    for (int t = 0; t < PHASE_TAPS; ++t) {
                        const int b = b_phase + STRIDE * t;
                        if (b < b_begin || b >= b_end) continue;
                        sum[c] = oplib_fma(w[t], Element<scalar_t>::load(grad_row - t), sum[c]);
                    }
                }
            }
        }
        store_channels<CHANNELS_LAST>(CHANNELS_LAST ? grad_input + ((n * H + y) * W + x) * C + c0
                                                    : grad_input + (n * C + c0) * H * W + y * W + x,
                                      sum, per_thread, H * W);
    }
}

// grad_weight[n, g, a, b, i, j]: one thread per (pixel, kernel row a) sums the group's channels
// for the row's KERNEL taps, so grad_output is read once per row instead of once per tap.
template <typename scalar_t, typename offset_t, int KERNEL, int STRIDE, bool CHANNELS_LAST>
__global__ void involution_backward_weight_chunked(
    const scalar_t* __restrict__ grad_output, const scalar_t* __restrict__ input,
    scalar_t* __restrict__ grad_weight, index_t total, index_t channels, index_t height, index_t width,
    index_t groups, index_t out_h, index_t out_w, index_t pad_h, index_t pad_w) {
    typedef typename Element<scalar_t>::acc_t acc_t;
    constexpr int LANES = Chunk<scalar_t>::lanes;
    constexpr int TAPS = KERNEL * KERNEL;
    const offset_t C = channels, H = height, W = width, G = groups, OH = out_h, OW = out_w;
    const offset_t per_group = C / G, plane = OH * OW;
    for (offset_t index = oplib_first_index(); index < (offset_t)total; index += oplib_grid_step()) {
        offset_t n, g, row, i, j;
        decode_item<CHANNELS_LAST>(index, (offset_t)KERNEL, G, OH, OW, &n, &g, &row, &i, &j);
        const int a = (int)row;
        const offset_t y = i * STRIDE - (offset_t)pad_h + a, x0 = j * STRIDE - (offset_t)pad_w;
        int b_begin, b_end;
        taps_inside<KERNEL>(x0, W, &b_begin, &b_end);
        if (y < 0 || y >= H) b_end = b_begin;  // the whole row reads padding
        acc_t sum[KERNEL];
#pragma unroll
        for (int b = 0; b < KERNEL; ++b) sum[b] = 0;
        if (b_begin < b_end) {
            if (CHANNELS_LAST) {
                const scalar_t* grad = grad_output + ((n * OH + i) * OW + j) * C + g * per_group;
                const scalar_t* row = input + (n * H + y) * W * C + g * per_group;
                for (offset_t c = 0; c < per_group; c += LANES) {
                    const Vector16<scalar_t> grads = *reinterpret_cast<const Vector16<scalar_t>*>(grad + c);
#pragma unroll
                    for (int b = 0; b < KERNEL; ++b) {
                        if (b < b_begin || b >= b_end) continue;
                        const Vector16<scalar_t> values =
                            *reinterpret_cast<const Vector16<scalar_t>*>(row + (x0 + b) * C + c);
#pragma unroll
                        for (int e = 0; e < LANES; ++e)
                            sum[b] = oplib_fma(Element<scalar_t>::value(grads.lane[e]),
                                               Element<scalar_t>::value(values.lane[e]), sum[b]);
                    }
                }
            } else {
                const scalar_t* grad = grad_output + (n * C + g * per_group) * plane + i * OW + j;
                const scalar_t* row = input + ((n * C + g * per_group) * H + y) * W + x0;
                for (offset_t c = 0; c < per_group; ++c) {
                    const acc_t value = Element<scalar_t>::load(grad + c * plane);
                    const scalar_t* image_row = row + c * H * W;
#pragma unroll
                    for (int b = 0; b < KERNEL; ++b) {
                        if (b < b_begin || b >= b_end) continue;
                        sum[b] = oplib_fma(value, Element<scalar_t>::load(image_row + b), sum[b]);
                    }
                }
            }
        }
        scalar_t* out = CHANNELS_LAST ? grad_weight + ((n * OH + i) * OW + j) * G * TAPS + g * TAPS + a * KERNEL
                                      : grad_weight + ((n * G + g) * TAPS + a * KERNEL) * plane + i * OW + j;
        const offset_t tap_step = CHANNELS_LAST ? 1 : plane;
#pragma unroll
        for (int b = 0; b < KERNEL; ++b) out[b * tap_step] = Element<scalar_t>::store(sum[b]);
    }
}
