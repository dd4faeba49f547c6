// grad_input's inner loops: one padded row's gathered sums, for the fixed windows (unrolled
// over the taps) and any other geometry.

#include "backward_input.h"
#include "kernels.h"

namespace oplib_cpu {
namespace {

// Sums of kGatherBlock padded columns X0 + q (X0 = SW * J0) of one padded row, LANES
// channels: grad_output column J0 + j of each reaching output row serves X0 + j * SW + b for
// every tap b, so each loaded vector is used by every column it reaches. Only j in
// [first, last] exist (the block's columns near the image's edges reach past the output).
// grads[e] + channel is column J0 of reaching row e (pixel stride cpg), weights[e] points
// at its weight of tap (a, 0), column J0 (tap b at + b * w_stride).
template <int KW, int SW, typename V, typename T>
inline void gather_fixed(const T* const* grads, const T* const* weights, int64_t reaching, int64_t w_stride, int64_t cpg,
                         int64_t channel, int64_t first, int64_t last, T* sums) {
  constexpr int P = kGatherBlock, FIRST = -((KW - 1) / SW), LAST = (P - 1) / SW;
  static_assert(P % SW == 0, "a block spans whole stride phases");
  V acc[P] = {};
  for (int64_t e = 0; e < reaching; ++e) {
    const T* g = grads[e] + channel;
    const T* w = weights[e];
#pragma GCC unroll 16
    for (int j = FIRST; j <= LAST; ++j) {
      if (j < first || j > last) continue;
      const V v = load_lanes<V>(g + j * cpg);
#pragma GCC unroll 16
      for (int q = 0; q < P; ++q) {
        const int b = q - j * SW;
        if (b >= 0 && b < KW) acc[q] += w[b * w_stride + j] * v;
      }
    }
  }
  for (int q = 0; q < P; ++q) store_lanes(sums + q * cpg, acc[q]);
}

}  // namespace

template <typename acc_t, int LANES>
void gather_row(const Geometry& geo, const acc_t* grads, const acc_t* weights, int64_t w_stride,
                const std::vector<Reaching>& reaching, int64_t x_begin, int64_t x_end, acc_t* sums, GatherScratch<acc_t>& scratch) {
  if constexpr (LANES <= kMaxLanes<acc_t>) {  // with_lanes picks no wider vector
    using V = typename Lanes<acc_t, LANES>::type;
    const int64_t cpg = geo.group_channels(), sw = geo.stride_w, dw = geo.dilation_w;
    const bool fixed = with_fixed_row_window(geo, [&](auto kernel_w, auto stride_w) {
      constexpr int KW = decltype(kernel_w)::value, SW = decltype(stride_w)::value;
      for (int64_t x0 = x_begin; x0 < x_end; x0 += kGatherBlock) {
        const int64_t j0 = x0 / SW;
        scratch.grad_rows.clear();
        scratch.weight_rows.clear();
        for (const Reaching& e : reaching) {
          scratch.grad_rows.push_back(grads + (e.out_row * geo.out_w + j0) * cpg);
          scratch.weight_rows.push_back(weights + e.kernel_row * KW * w_stride + e.out_row * geo.out_w + j0);
        }
        for (int64_t k = 0; k < cpg; k += LANES) {
          gather_fixed<KW, SW, V>(scratch.grad_rows.data(), scratch.weight_rows.data(), static_cast<int64_t>(reaching.size()),
                                  w_stride, cpg, k, -j0, geo.out_w - 1 - j0, sums + (x0 - x_begin) * cpg + k);
        }
      }
    });
    if (!fixed) {
      // Any geometry: each padded column X sums over the taps b whose j = (X - b dw) / sw is whole.
      for (int64_t x = 0; x < geo.width; ++x) {
        const int64_t X = x + geo.pad_w;
        for (int64_t k = 0; k < cpg; k += LANES) {
          V acc = {};
          for (const Reaching& e : reaching) {
            for (int64_t b = 0; b < geo.kernel_w; ++b) {
              const int64_t from = X - b * dw;
              if (from < 0 || from % sw != 0 || from / sw >= geo.out_w) continue;
              const int64_t j = from / sw, at = e.out_row * geo.out_w + j;
              acc += weights[(e.kernel_row * geo.kernel_w + b) * w_stride + at] * load_lanes<V>(grads + at * cpg + k);
            }
          }
          store_lanes(sums + (X - x_begin) * cpg + k, acc);
        }
      }
    }
  }
}

#define OPLIB_INSTANTIATE(T, LANES)                                                                              \
  template void gather_row<T, LANES>(const Geometry&, const T*, const T*, int64_t, const std::vector<Reaching>&, int64_t, \
                                     int64_t, T*, GatherScratch<T>&);
OPLIB_FOR_EACH_ACCUMULATE_LANES(OPLIB_INSTANTIATE)

}  // namespace oplib_cpu
