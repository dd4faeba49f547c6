// involution_generated's kernels: involution whose weight is formed inside the kernel from the
// kernel generator, forward and grad_input.
//
//   weight(n, g, t, i, j) = span_bias[g*T + t] + sum_r span_weight[g*T + t, r] * feature[n, r, i, j]   (T = KH*KW)
//   out[n, c, i, j] = sum_{a, b} weight(n, g(c), a*KW + b, i, j) * input[n, c, i*sh - ph + a*dh, j*sw - pw + b*dw]
//
// input/grad_input: (N, C, H, W), feature: (N, R, Ho, Wo), output/grad_output: (N, C, Ho, Wo),
// span_weight: (G*T, R), span_bias: (G*T), all contiguous (the host passes zeros for no bias).
// The (N, G, KH, KW, Ho, Wo) weight is never written: each thread forms the weights it needs
// in a register, R multiply-adds each, and uses each one for the channels it owns.
//
// One thread per (sample, group, pixel): the pixel of the tensor being written, its group's
// channels taken kChunk at a time (a weight is formed once per chunk), their sums in registers.
// No atomics: deterministic. Every index is 64-bit; grid-stride loops cover any tensor.
//
// Compiled by CuPy (NVRTC) on a GPU and by the host C++ compiler, against
// oplib/testing/cuda_host_shim.h, in the tests.

#include "element.cuh"

// Channels whose sums one thread holds at once.
#define OPLIB_GENERATED_CHUNK 8

// The weight of tap t (span row t of the group's) at one pixel: `feature` points at the
// sample's channel 0 at that pixel, channels `plane` apart.
template <typename scalar_t>
__device__ __forceinline__ typename Element<scalar_t>::acc_t oplib_generated_weight(
    const scalar_t* __restrict__ span_row, const scalar_t* __restrict__ bias, const scalar_t* __restrict__ feature,
    index_t reduced, index_t plane) {
    typedef typename Element<scalar_t>::acc_t acc_t;
    acc_t weight = Element<scalar_t>::load(bias);
    for (index_t r = 0; r < reduced; ++r) {
        weight = oplib_fma(Element<scalar_t>::load(span_row + r), Element<scalar_t>::load(feature + r * plane), weight);
    }
    return weight;
}

// The sums of one chunk of a group's channels (the first `count` of OPLIB_GENERATED_CHUNK), held
// in registers: `add` adds weight * values[k * plane] to channel k's, `store` writes channel k's
// to out[k * plane], rounded to the storage type.
template <typename scalar_t>
struct OplibChannelChunk {
    typedef typename Element<scalar_t>::acc_t acc_t;
    acc_t sums[OPLIB_GENERATED_CHUNK];
    index_t count;

    __device__ __forceinline__ explicit OplibChannelChunk(index_t remaining)
        : count(remaining < OPLIB_GENERATED_CHUNK ? remaining : OPLIB_GENERATED_CHUNK) {
        for (int k = 0; k < OPLIB_GENERATED_CHUNK; ++k) sums[k] = 0;
    }

    __device__ __forceinline__ void add(acc_t weight, const scalar_t* __restrict__ values, index_t plane) {
        for (int k = 0; k < OPLIB_GENERATED_CHUNK; ++k) {
            if (k < count) sums[k] = oplib_fma(weight, Element<scalar_t>::load(values + k * plane), sums[k]);
        }
    }

    __device__ __forceinline__ void store(scalar_t* __restrict__ out, index_t plane) const {
        for (int k = 0; k < OPLIB_GENERATED_CHUNK; ++k) {
            if (k < count) out[k * plane] = Element<scalar_t>::store(sums[k]);
        }
    }
};

// One thread per (n, g, i, j) of the output.
template <typename scalar_t>
__global__ void involution_generated_forward(
    const scalar_t* __restrict__ input, const scalar_t* __restrict__ feature, const scalar_t* __restrict__ span_weight,
    const scalar_t* __restrict__ span_bias, scalar_t* __restrict__ output, index_t total, index_t channels,
    index_t height, index_t width, index_t groups, index_t kernel_h, index_t kernel_w, index_t out_h, index_t out_w,
    index_t stride_h, index_t stride_w, index_t pad_h, index_t pad_w, index_t dilation_h, index_t dilation_w,
    index_t reduced) {
    typedef typename Element<scalar_t>::acc_t acc_t;
    const index_t per_group = channels / groups;
    const index_t out_plane = out_h * out_w;
    const index_t taps = kernel_h * kernel_w;
    for (index_t index = oplib_first_index(); index < total; index += oplib_grid_step()) {
        const index_t p = index % out_plane;
        const index_t g = (index / out_plane) % groups;
        const index_t n = index / (out_plane * groups);
        const index_t i = p / out_w, j = p % out_w;
        const scalar_t* pixel_feature = feature + n * reduced * out_plane + p;
        for (index_t first = 0; first < per_group; first += OPLIB_GENERATED_CHUNK) {
            const index_t first_channel = n * channels + g * per_group + first;
            OplibChannelChunk<scalar_t> chunk(per_group - first);
            for (index_t a = 0; a < kernel_h; ++a) {
                const index_t y = i * stride_h - pad_h + a * dilation_h;
                if (y < 0 || y >= height) continue;
                for (index_t b = 0; b < kernel_w; ++b) {
                    const index_t x = j * stride_w - pad_w + b * dilation_w;
                    if (x < 0 || x >= width) continue;
                    const index_t t = g * taps + a * kernel_w + b;
                    const acc_t weight =
                        oplib_generated_weight(span_weight + t * reduced, span_bias + t, pixel_feature, reduced, out_plane);
                    chunk.add(weight, input + first_channel * height * width + y * width + x, height * width);
                }
            }
            chunk.store(output + first_channel * out_plane + p, out_plane);
        }
    }
}

// One thread per (n, g, y, x) of grad_input: it gathers every (tap, output pixel) that read
// input[n, c, y, x], i.e. y = i*sh - ph + a*dh for an integer 0 <= i < Ho (likewise x), forming
// that pixel's weight of that tap.
template <typename scalar_t>
__global__ void involution_generated_backward_input(
    const scalar_t* __restrict__ grad_output, const scalar_t* __restrict__ feature,
    const scalar_t* __restrict__ span_weight, const scalar_t* __restrict__ span_bias, scalar_t* __restrict__ grad_input,
    index_t total, index_t channels, index_t height, index_t width, index_t groups, index_t kernel_h, index_t kernel_w,
    index_t out_h, index_t out_w, index_t stride_h, index_t stride_w, index_t pad_h, index_t pad_w, index_t dilation_h,
    index_t dilation_w, index_t reduced) {
    typedef typename Element<scalar_t>::acc_t acc_t;
    const index_t per_group = channels / groups;
    const index_t out_plane = out_h * out_w;
    const index_t image_plane = height * width;
    const index_t taps = kernel_h * kernel_w;
    for (index_t index = oplib_first_index(); index < total; index += oplib_grid_step()) {
        const index_t x = index % width;
        const index_t y = (index / width) % height;
        const index_t g = (index / image_plane) % groups;
        const index_t n = index / (image_plane * groups);
        const scalar_t* sample_feature = feature + n * reduced * out_plane;
        for (index_t first = 0; first < per_group; first += OPLIB_GENERATED_CHUNK) {
            const index_t first_channel = n * channels + g * per_group + first;
            OplibChannelChunk<scalar_t> chunk(per_group - first);
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
                    const index_t p = i * out_w + j;
                    const index_t t = g * taps + a * kernel_w + b;
                    const acc_t weight = oplib_generated_weight(span_weight + t * reduced, span_bias + t,
                                                                sample_feature + p, reduced, out_plane);
                    chunk.add(weight, grad_output + first_channel * out_plane + p, out_plane);
                }
            }
            chunk.store(grad_input + first_channel * image_plane + y * width + x, image_plane);
        }
    }
}
