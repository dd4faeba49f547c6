// grad_input: each padded input row gathers the grad_output rows that reach it, channels in
// the vector lanes, for either weight source (backward_input.cpp: the stored weight;
// backward_input_generated.cpp: the generated one).

#pragma once

#include "weight_sources.h"

namespace oplib_cpu {

// grad_input gathers: grad_input at padded position (Y, X) (input (Y - pad_h, X - pad_w)) is
// the sum, over the taps (a, b) and outputs (i, j) with i * sh + a * dh = Y and
// j * sw + b * dw = X, of weight[a, b, i, j] times grad_output[i, j]. For each padded row Y
// the kernel rows that reach it are listed once ("reaching").
struct Reaching {
  int64_t kernel_row, out_row;
};

// The rows that reach one padded row, and the pointers gather_row builds from them: kept by
// each thread across rows.
template <typename acc_t>
struct GatherScratch {
  std::vector<const acc_t*> grad_rows, weight_rows;
};

// The sums of one padded row Y's columns [x_begin, x_end) (sums: pixel stride cpg, from
// x_begin), LANES channels at a time: grads holds the pair's grad_output as channel rows,
// weights its weights [tap][i][j] (tap stride w_stride), `reaching` the kernel rows that
// reach Y. In backward_input_rows.cpp, instantiated once per accumulation type and shared by
// both weight sources.
template <typename acc_t, int LANES>
void gather_row(const Geometry& geo, const acc_t* grads, const acc_t* weights, int64_t w_stride,
                const std::vector<Reaching>& reaching, int64_t x_begin, int64_t x_end, acc_t* sums, GatherScratch<acc_t>& scratch);

// Source: StoredWeight or GeneratedWeight.
template <typename scalar_t, typename Source>
void backward_input_kernel(const Geometry& geo, const Planes<scalar_t>& grad, const Source& source,
                           const OutputPlanes<scalar_t>& result) {
  using acc_t = Acc<scalar_t>;
  const int64_t cpg = geo.group_channels(), taps = geo.taps(), sw = geo.stride_w;
  const int64_t plane = geo.out_h * geo.out_w;
  // Padded columns computed: from the first real one rounded down to a stride phase, in whole blocks.
  const int64_t x_begin = geo.pad_w / sw * sw, x_end = x_begin + round_up(geo.width + geo.pad_w - x_begin, kGatherBlock);
  with_lanes<acc_t>(cpg, [&](auto lanes) {
    parallel_items(geo.batch * geo.groups, geo.threads, [&](int64_t begin, int64_t end) {
      std::vector<acc_t> grads(plane * cpg), weight_copy, sums((x_end - x_begin) * cpg);
      FeatureCache<acc_t> feature_copy;
      GatherScratch<acc_t> scratch;
      std::vector<Reaching> reaching;
      for (int64_t item = begin; item < end; ++item) {
        const int64_t n = item / geo.groups, g = item % geo.groups;
        fill_channel_rows<decltype(lanes)::value>(grad, n, g * cpg, cpg, geo.out_h, geo.out_w, geo.out_h, geo.out_w, 0, 0, true, grads.data());
        int64_t w_stride = plane;
        const acc_t* weights = source.planes(geo, n, g, weight_copy, feature_copy, w_stride);
        int64_t prefetched = -1;  // the last output row whose weights were prefetched
        for (int64_t y = 0; y < geo.height; ++y) {
          const int64_t r = y + geo.pad_h;
          // The next padded row first reaches output row (r + 1) / sh, through kernel row 0.
          const int64_t upcoming = std::min((r + 1) / geo.stride_h, geo.out_h - 1);
          if (upcoming > prefetched) {
            prefetch_rows(weights + upcoming * geo.out_w, taps, w_stride, geo.out_w);
            prefetched = upcoming;
          }
          reaching.clear();
          for (int64_t a = 0; a < geo.kernel_h; ++a) {
            const int64_t from = r - a * geo.dilation_h;
            if (from >= 0 && from % geo.stride_h == 0 && from / geo.stride_h < geo.out_h) reaching.push_back({a, from / geo.stride_h});
          }
          gather_row<acc_t, decltype(lanes)::value>(geo, grads.data(), weights, w_stride, reaching, x_begin, x_end, sums.data(), scratch);
          store_channel_row<decltype(lanes)::value>(sums.data() + (geo.pad_w - x_begin) * cpg, cpg, geo.width, result.at(n, g * cpg, y),
                                                    result.stride_c, result.stride_w);
        }
      }
    });
  });
}

}  // namespace oplib_cpu
