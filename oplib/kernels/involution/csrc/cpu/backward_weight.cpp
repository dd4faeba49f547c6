// grad_weight with the channels in the vector lanes, for any geometry; the pixel-lane kernel
// (backward_weight_pixels.cpp) takes the common windows where the target has the registers.

#include "channel_rows.h"
#include "kernels.h"

namespace oplib_cpu {

template <typename scalar_t>
void backward_weight(const Geometry& geo, const Planes<scalar_t>& grad, const Planes<scalar_t>& x, scalar_t* result) {
  using acc_t = Acc<scalar_t>;
  if (backward_weight_by_pixels(geo, grad, x, result)) return;
  const int64_t cpg = geo.group_channels(), taps = geo.taps(), plane = geo.out_h * geo.out_w;
  const int64_t rows = geo.scratch_rows(), columns = (geo.out_w - 1) * geo.stride_w + (geo.kernel_w - 1) * geo.dilation_w + 1;
  const std::vector<int64_t> window = window_offsets(geo, columns);
  with_lanes<acc_t>(cpg, [&](auto lanes) {
    constexpr int LANES = decltype(lanes)::value;
    // Past the plane's end, the last output's window again (sums dropped).
    std::vector<int64_t> window_start(plane + LANES);
    window_starts(geo, plane, columns, window_start);
    parallel_items(geo.batch * geo.groups, geo.threads, [&](int64_t begin, int64_t end) {
      // grads: LANES pixels of zeros past the plane, read by its last block.
      std::vector<acc_t> planes(rows * columns * cpg), grads((plane + LANES) * cpg), last(taps * LANES);
      const acc_t* windows[LANES];
      for (int64_t item = begin; item < end; ++item) {
        const int64_t n = item / geo.groups, g = item % geo.groups;
        fill_channel_rows<LANES>(x, n, g * cpg, cpg, geo.height, geo.width, rows, columns, geo.pad_h, geo.pad_w, item == begin, planes.data());
        fill_channel_rows<LANES>(grad, n, g * cpg, cpg, geo.out_h, geo.out_w, geo.out_h, geo.out_w, 0, 0, true, grads.data());
        scalar_t* out = result + item * taps * plane;
        for (int64_t p0 = 0; p0 < plane; p0 += LANES) {
          const int64_t count = std::min<int64_t>(LANES, plane - p0);
          for (int c = 0; c < LANES; ++c) windows[c] = planes.data() + window_start[p0 + c];
          // Whole vectors of sums straight into the result; a partial last block, or 16-bit
          // results, through `last`, a plane of LANES outputs per tap.
          const bool direct = std::is_same_v<scalar_t, acc_t> && count == LANES;
          acc_t* sums = direct ? reinterpret_cast<acc_t*>(out + p0) : last.data();
          const int64_t stride = direct ? plane : LANES;
          const acc_t* block = grads.data() + p0 * cpg;
          weight_grad_lanes<LANES, true>(block, windows, window.data(), taps, cpg, sums, stride);
          if (!direct) {
            for (int64_t t = 0; t < taps; ++t) {
              for (int64_t c = 0; c < count; ++c) out[t * plane + p0 + c] = static_cast<scalar_t>(last[t * LANES + c]);
            }
          }
        }
      }
      stream_fence();  // the streamed lines are visible before the thread's work counts as done
    });
  });
}

#define OPLIB_INSTANTIATE(T) template void backward_weight<T>(const Geometry&, const Planes<T>&, const Planes<T>&, T*);
OPLIB_FOR_EACH_DTYPE(OPLIB_INSTANTIATE)

}  // namespace oplib_cpu
