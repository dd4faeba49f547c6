// Channel rows: the layout of the forward, grad_input and the channel-lane grad_weight.
//
// The group's channels share every weight value, so these kernels hold a (sample, group)
// pair's planes pixel by pixel, the group's channels side by side ("channel rows": value
// (row, column, k) at (row * columns + column) * cpg + k), and put the channels in the vector
// lanes: one weight value, broadcast, multiplies a whole vector of channels, and no lane is
// wasted on a narrow map (RedNet's 7- and 14-wide maps).

#pragma once

#include "operands.h"
#include "vector.h"

namespace oplib_cpu {

// body(std::integral_constant<int, LANES>{}) with LANES the widest power of two up to
// kMaxLanes<T> that divides the group's channels (1 for an odd count).
template <typename T, typename Body>
inline void with_lanes(int64_t group_channels, Body&& body) {
  static_assert(kMaxLanes<T> <= 16, "lane choices");
  if (kMaxLanes<T> >= 16 && group_channels % 16 == 0) return body(std::integral_constant<int, kMaxLanes<T> >= 16 ? 16 : 1>{});
  if (kMaxLanes<T> >= 8 && group_channels % 8 == 0) return body(std::integral_constant<int, kMaxLanes<T> >= 8 ? 8 : 1>{});
  if (group_channels % 4 == 0) return body(std::integral_constant<int, 4>{});
  if (group_channels % 2 == 0) return body(std::integral_constant<int, 2>{});
  body(std::integral_constant<int, 1>{});
}

// body(kernel_w, stride_w) as compile-time constants for the kernel widths and strides that
// RedNet and most involution models use (3, 5, 7; 1, 2; no dilation along the row), where
// the taps' loops unroll and each loaded vector serves every tap that reads it. Returns false
// (body not called) for any other geometry, which the kernels' general loops compute.
template <typename Body>
inline bool with_fixed_row_window(const Geometry& geo, Body&& body) {
  if (geo.dilation_w != 1 || (geo.stride_w != 1 && geo.stride_w != 2)) return false;
  const auto strides = [&](auto kernel_w) {
    if (geo.stride_w == 1) body(kernel_w, std::integral_constant<int, 1>{});
    else body(kernel_w, std::integral_constant<int, 2>{});
    return true;
  };
  switch (geo.kernel_w) {
    case 3: return strides(std::integral_constant<int, 3>{});
    case 5: return strides(std::integral_constant<int, 5>{});
    case 7: return strides(std::integral_constant<int, 7>{});
    default: return false;
  }
}

// Output blocks of the forward: 7 divides RedNet's map widths (7, 14, 28, 56), and 7 sums
// of one vector each leave room in the registers for the loads.
constexpr int kPixelBlock = 7;
// grad_input blocks: a whole number of stride phases (2 for stride 2).
constexpr int kGatherBlock = 8;

// starts[p], for p < starts.size(): the window start of output p of the flattened (Ho, Wo) map in
// channel rows `columns` pixels long, the first output's at 0; past `pixels` outputs, the last
// one's again (their grad_output is zero or their sums are dropped).
inline void window_starts(const Geometry& geo, int64_t pixels, int64_t columns, std::vector<int64_t>& starts) {
  for (int64_t p = 0; p < static_cast<int64_t>(starts.size()); ++p) {
    const int64_t at = std::min(p, pixels - 1);
    starts[p] = ((at / geo.out_w) * geo.stride_h * columns + (at % geo.out_w) * geo.stride_w) * geo.group_channels();
  }
}

// Tap t's offset from an output's window start in channel rows `columns` pixels long.
inline std::vector<int64_t> window_offsets(const Geometry& geo, int64_t columns) {
  std::vector<int64_t> window(geo.taps());
  for (int64_t t = 0; t < geo.taps(); ++t) {
    window[t] = ((t / geo.kernel_w) * geo.dilation_h * columns + (t % geo.kernel_w) * geo.dilation_w) * geo.group_channels();
  }
  return window;
}

// The group's planes of a 4-D operand (N, C, H, W) of any strides as channel rows of acc_t:
// rows [0, rows) and columns [0, columns) of the operand shifted by (row_shift, column_shift)
// (operand row y at row y + row_shift), zero where the operand has no value. Those zeros are
// the same for every (sample, group) pair: with zero_border false they are taken to be in dst
// already, from an earlier call on the same buffer.
template <int LANES, typename scalar_t, typename acc_t>
void fill_channel_rows(const Planes<scalar_t>& src, int64_t n, int64_t first_channel, int64_t cpg, int64_t height,
                       int64_t width, int64_t rows, int64_t columns, int64_t row_shift, int64_t column_shift, bool zero_border,
                       acc_t* dst) {
  using V = typename Lanes<acc_t, LANES>::type;
  const int64_t begin = std::clamp<int64_t>(column_shift, 0, columns), end = std::clamp<int64_t>(width + column_shift, begin, columns);
  for (int64_t r = 0; r < rows; ++r) {
    acc_t* row = dst + r * columns * cpg;
    const int64_t y = r - row_shift;
    if (y < 0 || y >= height || begin == end) {
      if (zero_border) std::fill(row, row + columns * cpg, acc_t(0));
      continue;
    }
    if (zero_border) {
      std::fill(row, row + begin * cpg, acc_t(0));
      std::fill(row + end * cpg, row + columns * cpg, acc_t(0));
    }
    if (src.stride_c == 1) {  // channels_last: each pixel's channels are consecutive, LANES at a time
      const scalar_t* pixels = src.at(n, first_channel, y) - column_shift * src.stride_w;
      for (int64_t x = begin; x < end; ++x) {
        __builtin_prefetch(pixels + std::min(x + 8, end - 1) * src.stride_w);
        for (int64_t k = 0; k < cpg; k += LANES) {
          store_lanes(row + x * cpg + k, load_converted<V, acc_t, LANES>(pixels + x * src.stride_w + k, 1));
        }
      }
      continue;
    }
    // LANES x LANES blocks through the registers, the last one of a row partial.
    for (int64_t k = 0; k < cpg; k += LANES) {
      for (int64_t x = begin; x < end; x += LANES) {
        const int64_t count = std::min<int64_t>(LANES, end - x);
        V block[LANES];
        for (int c = 0; c < LANES; ++c) {
          block[c] = load_first<V, acc_t, LANES>(src.at(n, first_channel + k + c, y) + (x - column_shift) * src.stride_w, src.stride_w, count);
        }
        transpose<acc_t, LANES>(block);
        for (int c = 0; c < count; ++c) store_lanes(row + (x + c) * cpg + k, block[c]);
      }
    }
  }
}

// count pixels of channel rows (sums, pixel stride cpg) into one row of a result: channel k
// of pixel j at dst + k * channel_stride + j * pixel_stride. A channels_last result takes
// each pixel's channels as they are; a row-major one transposes blocks through the registers.
template <int LANES, typename scalar_t, typename acc_t>
void store_channel_row(const acc_t* sums, int64_t cpg, int64_t count, scalar_t* dst, int64_t channel_stride,
                       int64_t pixel_stride) {
  using V = typename Lanes<acc_t, LANES>::type;
  if (channel_stride == 1) {  // channels_last: each pixel's channels are consecutive, LANES at a time
    for (int64_t j = 0; j < count; ++j) {
      for (int64_t k = 0; k < cpg; k += LANES) store_first<LANES>(dst + j * pixel_stride + k, load_lanes<V>(sums + j * cpg + k), LANES);
    }
    return;
  }
  if (pixel_stride != 1) {  // any other strides
    for (int64_t k = 0; k < cpg; ++k) {
      for (int64_t j = 0; j < count; ++j) dst[k * channel_stride + j * pixel_stride] = static_cast<scalar_t>(sums[j * cpg + k]);
    }
    return;
  }
  for (int64_t k = 0; k < cpg; k += LANES) {
    for (int64_t j = 0; j < count; j += LANES) {
      const int64_t pixels = std::min<int64_t>(LANES, count - j);
      V block[LANES];
      for (int c = 0; c < LANES; ++c) block[c] = c < pixels ? load_lanes<V>(sums + (j + c) * cpg + k) : V{};
      transpose<acc_t, LANES>(block);
      for (int c = 0; c < LANES; ++c) store_first<LANES>(dst + (k + c) * channel_stride + j, block[c], pixels);
    }
  }
}

// grad_weight of any geometry (backward_weight.cpp; the pixel-lane kernel takes the common windows) sums
// over the group's channels, which lie in the vector lanes: the products of
// LANES outputs (pixels of the flattened (Ho, Wo) plane, across rows, so a narrow map wastes
// no lane) are summed across the lanes together, pairs of vectors shuffled and added as in
// transpose, halves first (few vectors live at once): lane c ends with output c's sum.
// grad_weight of LANES outputs for every tap: output c's grad_output at grads + c * cpg, its
// window at windows[c] (tap t at + window[t]); tap t's LANES sums to out + t * plane.
// VECTORS: cpg / LANES where it is 1 or 2, else 0 (a loop).
template <int LANES, int VECTORS, typename T, bool STREAM = true>
inline void weight_grad_block(const T* grads, const T* const* windows, const int64_t* window, int64_t taps, int64_t cpg,
                              T* out, int64_t plane) {
  using V = typename Lanes<T, LANES>::type;
  const int64_t vectors = VECTORS > 0 ? VECTORS : cpg / LANES;
  V held[LANES];  // with one vector of channels, each output's grad_output stays in a register
  if constexpr (VECTORS == 1) {
    for (int c = 0; c < LANES; ++c) held[c] = load_lanes<V>(grads + c * cpg);
  }
  for (int64_t t = 0; t < taps; ++t) {
    const int64_t offset = window[t];
    const V sums = sum_lanes<T, LANES, 0, LANES>([&](int c) {
      const T* x = windows[c] + offset;
      if constexpr (VECTORS == 1) return held[c] * load_lanes<V>(x);
      const T* g = grads + c * cpg;
      V sum = load_lanes<V>(g) * load_lanes<V>(x);
      for (int64_t v = 1; v < vectors; ++v) sum += load_lanes<V>(g + v * LANES) * load_lanes<V>(x + v * LANES);
      return sum;
    });
    // Whole cache lines of grad_weight's result stream past the cache where the target can: the
    // result is 49/cpg times the input's size and is not read again there, and a streaming store
    // skips reading each line before it is written (6-8% of grad_weight on AVX-512 at RedNet's
    // 56-, 28- and 56/2-wide maps). A block that is contracted at once (STREAM false) stays.
    if constexpr (STREAM) {
      store_streaming<T, LANES>(out + t * plane, sums);
    } else {
      store_lanes(out + t * plane, sums);
    }
  }
}

// weight_grad_block with VECTORS chosen from the group's channels.
template <int LANES, bool STREAM, typename T>
inline void weight_grad_lanes(const T* grads, const T* const* windows, const int64_t* window, int64_t taps, int64_t cpg,
                              T* out, int64_t plane) {
  if (cpg == LANES) weight_grad_block<LANES, 1, T, STREAM>(grads, windows, window, taps, cpg, out, plane);
  else if (cpg == 2 * LANES) weight_grad_block<LANES, 2, T, STREAM>(grads, windows, window, taps, cpg, out, plane);
  else weight_grad_block<LANES, 0, T, STREAM>(grads, windows, window, taps, cpg, out, plane);
}

}  // namespace oplib_cpu
