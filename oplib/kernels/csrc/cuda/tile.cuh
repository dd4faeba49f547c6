// What the tiled kernels (span_tile.cu, generated_mma.cu) share beyond warp.cuh: a window fixed
// by template arguments or read from the launch's, and 16-bit values read in pairs, as the
// tensor-core fragments hold them.
#pragma once

#include "warp.cuh"

// A tile's window: KERNEL x KERNEL taps at stride STRIDE and no dilation, constants that the
// compiler folds into every size, index and loop bound; or, KERNEL = STRIDE = 0, the launch's
// arguments.
template <int KERNEL, int STRIDE>
struct TileGeometry {
    static_assert((KERNEL > 0) == (STRIDE > 0), "a window is fixed whole or read whole from the arguments");
    static constexpr bool fixed = KERNEL > 0;
    const int kernel_h, kernel_w, stride_h, stride_w, dilation_h, dilation_w;

    __device__ __forceinline__ TileGeometry(int kh, int kw, int sh, int sw, int dh, int dw)
        : kernel_h(fixed ? KERNEL : kh), kernel_w(fixed ? KERNEL : kw), stride_h(fixed ? STRIDE : sh),
          stride_w(fixed ? STRIDE : sw), dilation_h(fixed ? 1 : dh), dilation_w(fixed ? 1 : dw) {}
};

// values[0] and values[step] as a word (values[0] in its lower half), each if it lies inside
// its tensor (count > 0, > 1), else zero.
__device__ __forceinline__ unsigned int oplib_load_pair(const unsigned short* values, index_t step, int count) {
    const unsigned int low = count > 0 ? __ldg(values) : 0u;
    const unsigned int high = count > 1 ? __ldg(values + step) : 0u;
    return low | high << 16;
}
