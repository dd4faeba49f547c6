// grad_weight with the pixels in the vector lanes, for the common windows.

#include "channel_rows.h"
#include "kernels.h"

namespace oplib_cpu {
namespace {

// ---- grad_weight with the pixels in the vector lanes -------------------------------------
//
// Where the window is square, 3, 5 or 7 wide, with stride 1 or 2 and no dilation (RedNet
// and most involution models), grad_weight puts LANES pixels of one output row in the vector
// lanes and sums over the channels with one multiply-add per channel: no lane crosses
// another, which the channel-lane kernel above pays in shuffles. The group's planes are
// copied channel by channel, the input with its zero border and split into `S` column phases
// (phase q holds padded columns q, q + S, ...: tap b of LANES consecutive outputs is then one
// vector at phase b % S, offset b / S). One padded input row r serves kernel row a of output
// row (r - a) / S for every a = r (mod S): each loaded input vector is used by all of them,
// and the outputs of a block of taps stay in registers across all the channels.

template <int K, int S>
struct PixelLaneWindow {
  static constexpr int kRowSlots = (K + S - 1) / S;  // kernel rows a padded row can serve
  static constexpr int kMaxColumns = std::max(1, (kVectorRegisters - 2 - kRowSlots) / kRowSlots);
  static constexpr int kChunks = (K + kMaxColumns - 1) / kMaxColumns;
};

// Sums of taps (a, b) for b in [B0, B0 + NB) of one padded row's kernel-row slots over the
// channels, stored to their outputs: slot i is kernel row a0 + i * S of output row
// top - i, valid where slot_valid has bit i.
template <typename T, int LANES, int K, int S, int B0, int NB, typename scalar_t>
inline void weight_grad_taps(const T* x, int64_t x_channel, const T* g, int64_t g_channel, int64_t g_row, int64_t cpg,
                             unsigned slot_valid, int64_t a0, int64_t top, int64_t phase_stride, scalar_t* out,
                             int64_t plane, int64_t out_w, int64_t count) {
  using V = typename Lanes<T, LANES>::type;
  constexpr int R = PixelLaneWindow<K, S>::kRowSlots;
  V acc[R][NB] = {};
  for (int64_t c = 0; c < cpg; ++c) {
    const T* xc = x + c * x_channel;
    const T* gc = g + c * g_channel;
    V grads[R];
#pragma GCC unroll 8
    for (int i = 0; i < R; ++i) grads[i] = load_lanes<V>(gc - i * g_row);
#pragma GCC unroll 8
    for (int b = 0; b < NB; ++b) {
      const V v = load_lanes<V>(xc + ((B0 + b) % S) * phase_stride + (B0 + b) / S);
#pragma GCC unroll 8
      for (int i = 0; i < R; ++i) {
        if (slot_valid >> i & 1) acc[i][b] += grads[i] * v;
      }
    }
  }
#pragma GCC unroll 8
  for (int i = 0; i < R; ++i) {
    if (!(slot_valid >> i & 1)) continue;
    const int64_t a = a0 + i * S, row = top - i;
#pragma GCC unroll 8
    for (int b = 0; b < NB; ++b) {
      scalar_t* to = out + (a * K + B0 + b) * plane + row * out_w;
      store_first<LANES>(to, acc[i][b], count);
    }
  }
}

template <typename T, int LANES, int K, int S, int CHUNK, typename scalar_t>
inline void weight_grad_chunks(const T* x, int64_t x_channel, const T* g, int64_t g_channel, int64_t g_row, int64_t cpg,
                               unsigned slot_valid, int64_t a0, int64_t top, int64_t phase_stride, scalar_t* out,
                               int64_t plane, int64_t out_w, int64_t count) {
  using W = PixelLaneWindow<K, S>;
  if constexpr (CHUNK < W::kChunks) {
    constexpr int B0 = CHUNK * K / W::kChunks, B1 = (CHUNK + 1) * K / W::kChunks;
    weight_grad_taps<T, LANES, K, S, B0, B1 - B0>(x, x_channel, g, g_channel, g_row, cpg, slot_valid, a0, top, phase_stride, out,
                                                 plane, out_w, count);
    weight_grad_chunks<T, LANES, K, S, CHUNK + 1>(x, x_channel, g, g_channel, g_row, cpg, slot_valid, a0, top, phase_stride, out,
                                                 plane, out_w, count);
  }
}

// An input row into S column phases of `phase` values: input column u is padded column
// u + pad (pad < S * phase), phase (u + pad) % S, value (u + pad) / S; columns past the
// phases are not read by any window.
template <int S, typename scalar_t, typename T>
inline void split_phases(const scalar_t* from, int64_t stride, int64_t width, int64_t pad, int64_t phase, T* to) {
  const int64_t end = std::min(width, S * phase - pad);
  if constexpr (S == 1) {
    convert(from, stride, end, to + pad);
  } else {
    static_assert(S == 2, "strides 1 and 2");
    int64_t u = 0;
    if (pad % 2 == 1 && u < end) {  // input column 0 opens phase 1
      to[phase + pad / 2] = static_cast<T>(from[0]);
      u = 1;
    }
    // Pairs (u, u + 1) to (phase 0, phase 1) at value (u + pad) / 2, one loop the compiler
    // vectorises for contiguous rows.
    T* even = to + (u + pad) / 2;
    T* odd = to + phase + (u + pad) / 2;
    const int64_t pairs = (end - u) / 2;
    const scalar_t* src = from + u * stride;
    if (stride == 1) {
      for (int64_t k = 0; k < pairs; ++k) {
        even[k] = static_cast<T>(src[2 * k]);
        odd[k] = static_cast<T>(src[2 * k + 1]);
      }
    } else {
      for (int64_t k = 0; k < pairs; ++k) {
        even[k] = static_cast<T>(src[2 * k * stride]);
        odd[k] = static_cast<T>(src[(2 * k + 1) * stride]);
      }
    }
    if (u + 2 * pairs < end) even[pairs] = static_cast<T>(src[2 * pairs * stride]);
  }
}

// The largest result staged: beside the scratch, it stays in a 1 MB L2 (RedNet's 56-wide
// maps, 614 KB an item, measured faster stored in place).
constexpr size_t kStagedBytes = 256 << 10;

// Narrow maps (one half-width vector a row: RedNet's 7-wide ones): a padded row serves few
// valid kernel rows near the map's edges, so each output row sums its taps itself, chunk by
// chunk of kernel rows: per channel one grad_output vector and one input vector a tap.
template <typename T, int LANES, int K, int S, int CHUNK, typename scalar_t>
inline void weight_grad_row(const T* x, int64_t x_channel, int64_t x_row, const T* g, int64_t g_channel, int64_t cpg,
                            int64_t phase_stride, scalar_t* out, int64_t plane, int64_t count) {
  constexpr int kMaxRows = std::max(1, std::min(K, (kVectorRegisters - 2) / K)), kChunks = (K + kMaxRows - 1) / kMaxRows;
  if constexpr (CHUNK < kChunks) {
    constexpr int A0 = CHUNK * K / kChunks, NA = (CHUNK + 1) * K / kChunks - A0;
    using V = typename Lanes<T, LANES>::type;
    V acc[NA][K] = {};
    for (int64_t c = 0; c < cpg; ++c) {
      const V grads = load_lanes<V>(g + c * g_channel);
      const T* xc = x + c * x_channel + A0 * x_row;
#pragma GCC unroll 8
      for (int i = 0; i < NA; ++i) {
#pragma GCC unroll 8
        for (int b = 0; b < K; ++b) acc[i][b] += grads * load_lanes<V>(xc + i * x_row + (b % S) * phase_stride + b / S);
      }
    }
#pragma GCC unroll 8
    for (int i = 0; i < NA; ++i) {
#pragma GCC unroll 8
      for (int b = 0; b < K; ++b) store_first<LANES>(out + ((A0 + i) * K + b) * plane, acc[i][b], count);
    }
    weight_grad_row<T, LANES, K, S, CHUNK + 1>(x, x_channel, x_row, g, g_channel, cpg, phase_stride, out, plane, count);
  }
}

template <typename scalar_t, typename T, int LANES, int K, int S>
void backward_weight_pixel_lanes(const Geometry& geo, const Planes<scalar_t>& grad, const Planes<scalar_t>& x,
                                 scalar_t* result) {
  constexpr int R = PixelLaneWindow<K, S>::kRowSlots;
  const int64_t cpg = geo.group_channels(), plane = geo.out_h * geo.out_w;
  const int64_t blocks = (geo.out_w + LANES - 1) / LANES;
  // Input: per channel, padded rows [0, rows), each S phases of `phase` values.
  const int64_t rows = geo.scratch_rows(), phase = round_up(blocks * LANES + (K - 1) / S, 16);
  const int64_t x_row = S * phase, x_channel = rows * x_row;
  // grad_output: per channel, R zero rows, the Ho rows (zeros past Wo), R + K zero rows.
  const int64_t g_row = blocks * LANES, g_rows = geo.out_h + 2 * R + K, g_channel = g_rows * g_row;
  const bool narrow = blocks == 1 && LANES * sizeof(T) <= 32;
  parallel_items(geo.batch * geo.groups, geo.threads, [&](int64_t begin, int64_t end) {
    // The zeros (border, tails, spare rows) are written once: every item fills the same places.
    std::vector<T> xs(cpg * x_channel + LANES, T(0)), gs(cpg * g_channel, T(0));
    // float and double results are summed into a staged copy of the item's (taps, Ho, Wo)
    // result, which stays in the cache, then streamed out: stored in place, the rows of 49
    // planes interleave and each line is read from memory before it is written.
    const bool staged_here = std::is_same_v<scalar_t, T> && geo.taps() * plane * sizeof(T) <= kStagedBytes;
    std::vector<T> staged(staged_here ? geo.taps() * plane : 0);
    for (int64_t item = begin; item < end; ++item) {
      const int64_t n = item / geo.groups, g = item % geo.groups;
      for (int64_t c = 0; c < cpg; ++c) {
        const int64_t channel = g * cpg + c;
        // Rows below the last window (stride 2 at some sizes) are not read.
        for (int64_t y = 0; y < std::min(geo.height, rows - geo.pad_h); ++y) {
          const scalar_t* from = x.at(n, channel, y);
          T* to = xs.data() + c * x_channel + (y + geo.pad_h) * x_row;
          split_phases<S>(from, x.stride_w, geo.width, geo.pad_w, phase, to);
        }
        for (int64_t i = 0; i < geo.out_h; ++i) {
          convert(grad.at(n, channel, i), grad.stride_w, geo.out_w, gs.data() + c * g_channel + (i + R) * g_row);
        }
      }
      scalar_t* const destination = result + item * geo.taps() * plane;
      scalar_t* out = staged_here ? reinterpret_cast<scalar_t*>(staged.data()) : destination;
      if (narrow) {
        for (int64_t h = 0; h < geo.out_h; ++h) {
          weight_grad_row<T, LANES, K, S, 0>(xs.data() + h * S * x_row, x_channel, x_row, gs.data() + (h + R) * g_row, g_channel,
                                             cpg, phase, out + h * geo.out_w, plane, geo.out_w);
        }
      }
      for (int64_t r = 0; r < (narrow ? 0 : rows); ++r) {
        // Padded row r serves kernel rows a = a0 + i S of output rows top - i.
        const int64_t a0 = r % S, top = (r - a0) / S;
        unsigned slot_valid = 0;
        for (int i = 0; i < R; ++i) {
          if (a0 + i * S < K && top - i >= 0 && top - i < geo.out_h) slot_valid |= 1u << i;
        }
        if (!slot_valid) continue;
        for (int64_t block = 0; block < blocks; ++block) {
          const int64_t w0 = block * LANES, count = std::min<int64_t>(LANES, geo.out_w - w0);
          weight_grad_chunks<T, LANES, K, S, 0>(xs.data() + r * x_row + w0, x_channel, gs.data() + (top + R) * g_row + w0,
                                                g_channel, g_row, cpg, slot_valid, a0, top, phase, out + w0, plane, geo.out_w, count);
        }
      }
      if constexpr (std::is_same_v<scalar_t, T>) {
        if (staged_here) stream_out(staged.data(), geo.taps() * plane, destination);
      }
    }
    stream_fence();  // the streamed lines are visible before the thread's work counts as done
  });
}

}  // namespace

// The pixel-lane grad_weight where the geometry has one (returns false otherwise).
template <typename scalar_t>
bool backward_weight_by_pixels(const Geometry& geo, const Planes<scalar_t>& grad, const Planes<scalar_t>& x, scalar_t* result) {
  using T = Acc<scalar_t>;
  // With 16 vector registers (AVX2) the sums of a padded row's taps do not fit: measured
  // slower than the channel-lane kernel there, at every RedNet shape but the 7-wide ones.
  if (kVectorRegisters < 32) return false;
  if (geo.kernel_h != geo.kernel_w || geo.stride_h != geo.stride_w || geo.dilation_h != 1) return false;
  return with_fixed_row_window(geo, [&](auto kernel, auto stride) {
    constexpr int K = decltype(kernel)::value, S = decltype(stride)::value, WIDE = kMaxLanes<T>, HALF = WIDE >= 8 ? WIDE / 2 : WIDE;
    // Half-width vectors where they waste fewer lanes (a 7-wide map in 8 lanes, not 16).
    if (round_up(geo.out_w, HALF) < round_up(geo.out_w, WIDE)) {
      backward_weight_pixel_lanes<scalar_t, T, HALF, K, S>(geo, grad, x, result);
    } else {
      backward_weight_pixel_lanes<scalar_t, T, WIDE, K, S>(geo, grad, x, result);
    }
  });
}

#define OPLIB_INSTANTIATE(T) template bool backward_weight_by_pixels<T>(const Geometry&, const Planes<T>&, const Planes<T>&, T*);
OPLIB_FOR_EACH_DTYPE(OPLIB_INSTANTIATE)

}  // namespace oplib_cpu
