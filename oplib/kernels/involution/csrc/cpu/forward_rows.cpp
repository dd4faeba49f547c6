// The forward's inner loops: one output row's sums, for the fixed windows (unrolled over the
// taps) and any other geometry.

#include "forward.h"
#include "kernels.h"

namespace oplib_cpu {
namespace {

// Tap t of output p at w[weight_offset<PIXEL_MAJOR>(t, p, w_stride)]: taps w_stride apart
// and outputs adjacent (a plane per tap), or, PIXEL_MAJOR, each output's taps adjacent and
// outputs w_stride apart (the weight a channels_last span convolution writes, read in place).
template <bool PIXEL_MAJOR>
inline int64_t weight_offset(int64_t tap, int64_t pixel, int64_t w_stride) {
  return PIXEL_MAJOR ? tap + pixel * w_stride : tap * w_stride + pixel;
}

// Forward sums of kPixelBlock outputs of one row, LANES channels: window values from x (the
// block's first window, kernel row 0; kernel row a at x + a * row_step), weights from w (see
// weight_offset). Input column c of the block's span serves output p through tap c - p * SW:
// each loaded vector is used by every output that reads it.
template <int KW, int SW, bool PIXEL_MAJOR, typename V, typename T>
inline void forward_fixed(const T* x, int64_t row_step, int64_t cpg, int64_t kernel_h, const T* w, int64_t w_stride,
                          T* sums) {
  constexpr int P = kPixelBlock;
  V acc[P] = {};
  for (int64_t a = 0; a < kernel_h; ++a) {
    const T* xa = x + a * row_step;
    const T* wa = w + weight_offset<PIXEL_MAJOR>(a * KW, 0, w_stride);
#pragma GCC unroll 64
    for (int c = 0; c < (P - 1) * SW + KW; ++c) {
      const V v = load_lanes<V>(xa + c * cpg);
#pragma GCC unroll 16
      for (int p = 0; p < P; ++p) {
        const int b = c - p * SW;
        if (b >= 0 && b < KW) acc[p] += wa[weight_offset<PIXEL_MAJOR>(b, p, w_stride)] * v;
      }
    }
  }
  for (int p = 0; p < P; ++p) store_lanes(sums + p * cpg, acc[p]);
}

// The same for any geometry: tap t's window value of output p at x + window[t] + p * pixel_step.
template <bool PIXEL_MAJOR, typename V, typename T>
inline void forward_general(const T* x, const int64_t* window, int64_t taps, int64_t pixel_step, const T* w,
                            int64_t w_stride, int64_t cpg, T* sums) {
  constexpr int P = kPixelBlock;
  V acc[P] = {};
  for (int64_t t = 0; t < taps; ++t) {
    const T* xt = x + window[t];
    for (int p = 0; p < P; ++p) acc[p] += w[weight_offset<PIXEL_MAJOR>(t, p, w_stride)] * load_lanes<V>(xt + p * pixel_step);
  }
  for (int p = 0; p < P; ++p) store_lanes(sums + p * cpg, acc[p]);
}

}  // namespace

template <typename acc_t, int LANES, bool PIXEL_MAJOR>
void forward_row(const Geometry& geo, const acc_t* row, int64_t columns, const int64_t* window, const acc_t* weight_row,
                 int64_t w_stride, acc_t* sums) {
  if constexpr (LANES <= kMaxLanes<acc_t>) {  // with_lanes picks no wider vector
    using V = typename Lanes<acc_t, LANES>::type;
    const int64_t cpg = geo.group_channels(), width = forward_width(geo);
    const int64_t row_step = geo.dilation_h * columns * cpg, pixel_step = geo.stride_w * cpg;
    const bool fixed = with_fixed_row_window(geo, [&](auto kernel_w, auto stride_w) {
      for (int64_t j0 = 0; j0 < width; j0 += kPixelBlock) {
        for (int64_t k = 0; k < cpg; k += LANES) {
          forward_fixed<decltype(kernel_w)::value, decltype(stride_w)::value, PIXEL_MAJOR, V>(
              row + j0 * pixel_step + k, row_step, cpg, geo.kernel_h, weight_row + weight_offset<PIXEL_MAJOR>(0, j0, w_stride),
              w_stride, sums + j0 * cpg + k);
        }
      }
    });
    if (!fixed) {
      for (int64_t j0 = 0; j0 < width; j0 += kPixelBlock) {
        for (int64_t k = 0; k < cpg; k += LANES) {
          forward_general<PIXEL_MAJOR, V>(row + j0 * pixel_step + k, window, geo.taps(), pixel_step,
                                          weight_row + weight_offset<PIXEL_MAJOR>(0, j0, w_stride), w_stride, cpg, sums + j0 * cpg + k);
        }
      }
    }
  }
}

#define OPLIB_INSTANTIATE(T, LANES)                                                                             \
  template void forward_row<T, LANES, false>(const Geometry&, const T*, int64_t, const int64_t*, const T*, int64_t, T*); \
  template void forward_row<T, LANES, true>(const Geometry&, const T*, int64_t, const int64_t*, const T*, int64_t, T*);
OPLIB_FOR_EACH_ACCUMULATE_LANES(OPLIB_INSTANTIATE)

}  // namespace oplib_cpu
