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
