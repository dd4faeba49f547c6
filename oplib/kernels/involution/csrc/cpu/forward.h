// The forward: kPixelBlock outputs of one row keep their sums in registers across all the
// taps, channels in the vector lanes, for either weight source (forward.cpp: the stored
// weight; forward_generated.cpp: the generated one).

#pragma once

#include "weight_sources.h"

namespace oplib_cpu {

// Outputs computed per row: whole blocks of kPixelBlock (the sums past Wo are dropped).
inline int64_t forward_width(const Geometry& geo) { return round_up(geo.out_w, kPixelBlock); }
// Columns of the channel rows the forward_width outputs' windows reach.
inline int64_t forward_columns(const Geometry& geo) {
  return (forward_width(geo) - 1) * geo.stride_w + (geo.kernel_w - 1) * geo.dilation_w + 1;
}

// The sums of one output row, LANES channels at a time, into sums (forward_width(geo)
// pixels, pixel stride cpg): the row's windows start at `row` in channel rows `columns`
// pixels long (tap t's offset window[t]); tap t of output j weighs weight_row[t * w_stride + j],
// or, PIXEL_MAJOR, weight_row[t + j * w_stride].
// In forward_rows.cpp, instantiated once per accumulation type (float serves the 16-bit
// dtypes too) and shared by both weight sources.
template <typename acc_t, int LANES, bool PIXEL_MAJOR>
void forward_row(const Geometry& geo, const acc_t* row, int64_t columns, const int64_t* window, const acc_t* weight_row,
                 int64_t w_stride, acc_t* sums);

// Source: StoredWeight or GeneratedWeight.
template <typename scalar_t, typename Source>
void forward_kernel(const Geometry& geo, const Planes<scalar_t>& x, const Source& source, const OutputPlanes<scalar_t>& out) {
  using acc_t = Acc<scalar_t>;
  const int64_t cpg = geo.group_channels();
  const int64_t width = forward_width(geo), rows = geo.scratch_rows(), columns = forward_columns(geo);
  const std::vector<int64_t> window = window_offsets(geo, columns);
  with_lanes<acc_t>(cpg, [&](auto lanes) {
    parallel_items(geo.batch * geo.groups, geo.threads, [&](int64_t begin, int64_t end) {
      std::vector<acc_t> planes(rows * columns * cpg), sums(width * cpg);
      auto weight_rows = source.rows(geo);
      const int64_t w_stride = weight_rows.tap_stride();
      for (int64_t item = begin; item < end; ++item) {
        const int64_t n = item / geo.groups, g = item % geo.groups;
        fill_channel_rows<decltype(lanes)::value>(x, n, g * cpg, cpg, geo.height, geo.width, rows, columns, geo.pad_h, geo.pad_w, item == begin,
                                                  planes.data());
        weight_rows.start(n, g);
        for (int64_t i = 0; i < geo.out_h; ++i) {
          const acc_t* weight_row = weight_rows.row(i);
          const acc_t* row = planes.data() + i * geo.stride_h * columns * cpg;
          if (weight_rows.pixel_major()) {
            forward_row<acc_t, decltype(lanes)::value, true>(geo, row, columns, window.data(), weight_row, w_stride, sums.data());
          } else {
            forward_row<acc_t, decltype(lanes)::value, false>(geo, row, columns, window.data(), weight_row, w_stride, sums.data());
          }
          store_channel_row<decltype(lanes)::value>(sums.data(), cpg, geo.out_w, out.at(n, g * cpg, i), out.stride_c, out.stride_w);
        }
      }
    });
  });
}

}  // namespace oplib_cpu
