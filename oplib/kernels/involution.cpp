// Involution's CPU kernels: the forward and its two backward ops, built on first use by
// oplib.kernels.native (torch.utils.cpp_extension) and called from the ops' CPU kernels.
//
//   out[n, c, i, j] = sum_{a, b} weight[n, g, a, b, i, j] * input[n, c, i*sh - ph + a*dh, j*sw - pw + b*dw]
//
// with g = c / (C / G). Work is split over (sample, group) pairs with at::parallel_for. The
// C/G channels of a group share every weight value, so each pair's planes are copied, in the
// accumulation type (float for 16-bit operands, else the dtype itself), into "channel rows":
// pixel by pixel, the group's channels side by side, with the zero border the windows reach.
// The vector lanes then hold channels: one broadcast weight value multiplies a whole vector,
// no lane idles on a narrow map, and every window reads the buffer with no bounds test (a tap
// that reads the border multiplies a real zero, so inf and nan give what the padded (unfold)
// reference gives). grad_weight, which sums over the channels instead, puts pixels in the
// lanes where the window allows (see "grad_weight with the pixels in the vector lanes").
// Each output is computed by one thread in an order that depends on the geometry alone:
// results are the same for any thread count.
//
// Operands may have any strides (channels_last included); results are contiguous tensors of
// the operands' dtype.

#include <torch/extension.h>

#include <ATen/OpMathType.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <utility>
#include <vector>

#if defined(__AVX512F__)
#include <immintrin.h>
#endif

namespace {

// dst[j] = src[j * stride] for j < count, converted; the contiguous case vectorises.
template <typename scalar_t, typename acc_t>
inline void convert(const scalar_t* src, int64_t stride, int64_t count, acc_t* dst) {
  if (stride == 1) {
    for (int64_t j = 0; j < count; ++j) dst[j] = static_cast<acc_t>(src[j]);
  } else {
    for (int64_t j = 0; j < count; ++j) dst[j] = static_cast<acc_t>(src[j * stride]);
  }
}

struct Geometry {
  int64_t batch, channels, height, width, groups, kernel_h, kernel_w, out_h, out_w;
  int64_t stride_h, stride_w, pad_h, pad_w, dilation_h, dilation_w;

  int64_t group_channels() const { return channels / groups; }
  int64_t taps() const { return kernel_h * kernel_w; }
  // The rows the windows reach, from -pad_h on: scratch row r is input row r - pad_h.
  int64_t scratch_rows() const { return (out_h - 1) * stride_h + (kernel_h - 1) * dilation_h + 1; }
};

Geometry make_geometry(at::IntArrayRef input_shape, at::IntArrayRef weight_shape, at::IntArrayRef stride,
                       at::IntArrayRef padding, at::IntArrayRef dilation) {
  return Geometry{input_shape[0], input_shape[1], input_shape[2], input_shape[3], weight_shape[1],
                  weight_shape[2], weight_shape[3], weight_shape[4], weight_shape[5], stride[0], stride[1],
                  padding[0], padding[1], dilation[0], dilation[1]};
}

// A 4-D operand (N, C, H, W) of any strides.
template <typename scalar_t>
struct Planes {
  const scalar_t* data;
  int64_t stride_n, stride_c, stride_h, stride_w;

  explicit Planes(const at::Tensor& t)
      : data(t.data_ptr<scalar_t>()), stride_n(t.stride(0)), stride_c(t.stride(1)), stride_h(t.stride(2)),
        stride_w(t.stride(3)) {}

  const scalar_t* at(int64_t n, int64_t c, int64_t h) const { return data + n * stride_n + c * stride_c + h * stride_h; }
};

// The weight (N, G, KH, KW, Ho, Wo) of any strides.
template <typename scalar_t>
struct Weight {
  const scalar_t* data;
  int64_t stride[6];

  explicit Weight(const at::Tensor& t) : data(t.data_ptr<scalar_t>()) {
    for (int d = 0; d < 6; ++d) stride[d] = t.stride(d);
  }

  const scalar_t* row(int64_t n, int64_t g, int64_t a, int64_t b, int64_t i) const {
    return data + n * stride[0] + g * stride[1] + a * stride[2] + b * stride[3] + i * stride[4];
  }

  // Whether each (n, g)'s taps, rows and columns lie as in a contiguous tensor.
  bool standard(const Geometry& geo) const {
    return stride[5] == 1 && stride[4] == geo.out_w && stride[3] == geo.out_h * geo.out_w &&
           stride[2] == geo.kernel_w * geo.out_h * geo.out_w;
  }

  // The weight of (n, g) as acc_t values [tap][i][j] (tap stride Ho * Wo, row stride Wo): the
  // tensor's own memory where it already is that and `direct` allows it, else a copy in
  // buffer, which holds `slack` zeros after the values for reads past the last row.
  template <typename acc_t>
  const acc_t* planes(const Geometry& geo, int64_t n, int64_t g, bool direct, int64_t slack, std::vector<acc_t>& buffer) const {
    const int64_t plane = geo.out_h * geo.out_w, count = geo.taps() * plane;
    if constexpr (std::is_same_v<scalar_t, acc_t>) {
      if (direct && standard(geo)) return row(n, g, 0, 0, 0);
    }
    if (static_cast<int64_t>(buffer.size()) != count + slack) buffer.assign(count + slack, acc_t(0));
    if (standard(geo)) {
      convert(row(n, g, 0, 0, 0), 1, count, buffer.data());
    } else {
      for (int64_t t = 0; t < geo.taps(); ++t) {
        for (int64_t i = 0; i < geo.out_h; ++i) {
          convert(row(n, g, t / geo.kernel_w, t % geo.kernel_w, i), stride[5], geo.out_w, buffer.data() + t * plane + i * geo.out_w);
        }
      }
    }
    return buffer.data();
  }
};

// ---- The forward and grad_input: channels in the vector lanes --------------------------
//
// The group's channels share every weight value, so these two kernels hold a (sample, group)
// pair's planes pixel by pixel, the group's channels side by side ("channel rows": value
// (row, column, k) at (row * columns + column) * cpg + k), and put the channels in the vector
// lanes: one weight value, broadcast, multiplies a whole vector of channels, and no lane is
// wasted on a narrow map (RedNet's 7- and 14-wide maps). A block of kPixelBlock outputs of
// one row keeps its sums in registers across all the taps.

// Vectors of LANES values (LANES a power of two up to the widest vector the target has).
template <typename T, int LANES>
struct Lanes {
  typedef T type __attribute__((vector_size(sizeof(T) * LANES)));
};
#if defined(__AVX512F__)
constexpr int kWideBytes = 64;
#else
constexpr int kWideBytes = 32;
#endif
template <typename T>
constexpr int kMaxLanes = kWideBytes / static_cast<int>(sizeof(T));

template <typename V, typename T>
inline V load_lanes(const T* p) {
  V v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

template <typename T, typename V>
inline void store_lanes(T* p, const V& v) {
  std::memcpy(p, &v, sizeof v);
}

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

inline int64_t round_up(int64_t value, int64_t multiple) { return (value + multiple - 1) / multiple * multiple; }

// Tap t's offset from an output's window start in channel rows `columns` pixels long.
inline std::vector<int64_t> window_offsets(const Geometry& geo, int64_t columns) {
  std::vector<int64_t> window(geo.taps());
  for (int64_t t = 0; t < geo.taps(); ++t) {
    window[t] = ((t / geo.kernel_w) * geo.dilation_h * columns + (t % geo.kernel_w) * geo.dilation_w) * geo.group_channels();
  }
  return window;
}

// LANES x LANES blocks are transposed in registers, between a plane's rows (one channel,
// LANES columns per vector) and channel rows (one column, LANES channels per vector): each
// round of two-input shuffles swaps one bit of the row index with that bit of the lane index.
template <typename T>
using IndexOf = std::conditional_t<sizeof(T) == 8, int64_t, int32_t>;

template <typename M, int LANES, int BIT, bool UPPER, size_t... I>
constexpr M butterfly(std::index_sequence<I...>) {
  // Row r (bit clear) takes lane i from row r + BIT's lane i - BIT where i has the bit, row
  // r + BIT takes lane i from row r's lane i + BIT where i lacks it; index LANES + i is b[i].
  return M{static_cast<typename std::remove_reference_t<decltype(M{}[0])>>(
      UPPER ? ((I & BIT) ? LANES + I : I + BIT) : ((I & BIT) ? LANES + I - BIT : I))...};
}

template <typename T, int LANES, int BIT = 1>
inline void transpose(typename Lanes<T, LANES>::type* rows) {
  if constexpr (BIT < LANES) {
    using M = typename Lanes<IndexOf<T>, LANES>::type;
    constexpr M lower = butterfly<M, LANES, BIT, false>(std::make_index_sequence<LANES>{});
    constexpr M upper = butterfly<M, LANES, BIT, true>(std::make_index_sequence<LANES>{});
    for (int r = 0; r < LANES; ++r) {
      if (r & BIT) continue;
      const auto a = rows[r], b = rows[r + BIT];
      rows[r] = __builtin_shuffle(a, b, lower);
      rows[r + BIT] = __builtin_shuffle(a, b, upper);
    }
    transpose<T, LANES, BIT * 2>(rows);
  }
}

// LANES values from src, stride apart, converted.
template <typename V, typename acc_t, int LANES, typename scalar_t>
inline V load_converted(const scalar_t* src, int64_t stride) {
  if constexpr (std::is_same_v<scalar_t, acc_t>) {
    if (stride == 1) return load_lanes<V>(src);
  }
  V v;
  for (int l = 0; l < LANES; ++l) v[l] = static_cast<acc_t>(src[l * stride]);
  return v;
}

// LANES values from src, stride apart, converted; only the first `count` are read, the
// other lanes are zero.
template <typename V, typename acc_t, int LANES, typename scalar_t>
inline V load_first(const scalar_t* src, int64_t stride, int64_t count) {
  if (count == LANES) return load_converted<V, acc_t, LANES>(src, stride);
  if constexpr (std::is_same_v<scalar_t, acc_t>) {
#if defined(__AVX512F__) && defined(__AVX512VL__)
    if (stride == 1) {
      const __mmask16 mask = static_cast<__mmask16>((1u << count) - 1);
      if constexpr (std::is_same_v<acc_t, float> && LANES == 16) return reinterpret_cast<V>(_mm512_maskz_loadu_ps(mask, src));
      if constexpr (std::is_same_v<acc_t, float> && LANES == 8) return reinterpret_cast<V>(_mm256_maskz_loadu_ps(mask, src));
      if constexpr (std::is_same_v<acc_t, double> && LANES == 8) return reinterpret_cast<V>(_mm512_maskz_loadu_pd(mask, src));
      if constexpr (std::is_same_v<acc_t, double> && LANES == 4) return reinterpret_cast<V>(_mm256_maskz_loadu_pd(mask, src));
    }
#endif
  }
  V v = {};
  for (int64_t l = 0; l < count; ++l) v[l] = static_cast<acc_t>(src[l * stride]);
  return v;
}

// The first `count` lanes of v to `to`, converted (a partial block ends every row of a map
// whose width is no multiple of LANES: RedNet's 7-, 14-, 28- and 56-wide maps all have one,
// and the 7- and 14-wide ones have nothing else).
template <int LANES, typename scalar_t, typename V>
inline void store_first(scalar_t* to, const V& v, int64_t count) {
  using T = std::remove_reference_t<decltype(v[0])>;
  if constexpr (std::is_same_v<scalar_t, T>) {
    if (count == LANES) return store_lanes(to, v);
#if defined(__AVX512F__) && defined(__AVX512VL__)
    const __mmask16 mask = static_cast<__mmask16>((1u << count) - 1);
    if constexpr (std::is_same_v<T, float> && LANES == 16) return _mm512_mask_storeu_ps(to, mask, reinterpret_cast<__m512>(v));
    if constexpr (std::is_same_v<T, float> && LANES == 8) return _mm256_mask_storeu_ps(to, mask, reinterpret_cast<__m256>(v));
    if constexpr (std::is_same_v<T, double> && LANES == 8) return _mm512_mask_storeu_pd(to, mask, reinterpret_cast<__m512d>(v));
    if constexpr (std::is_same_v<T, double> && LANES == 4) return _mm256_mask_storeu_pd(to, mask, reinterpret_cast<__m256d>(v));
#endif
  }
  for (int64_t l = 0; l < count; ++l) to[l] = static_cast<scalar_t>(v[l]);
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
    if (src.stride_c == 1) {  // channels_last: each pixel's channels are consecutive
      for (int64_t x = begin; x < end; ++x) convert(src.at(n, first_channel, y) + (x - column_shift) * src.stride_w, 1, cpg, row + x * cpg);
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

// count pixels of channel rows (sums, pixel stride cpg) into the contiguous planes of a result:
// channel k's values at dst + k * channel_stride.
template <int LANES, typename scalar_t, typename acc_t>
void store_channel_row(const acc_t* sums, int64_t cpg, int64_t count, scalar_t* dst, int64_t channel_stride) {
  using V = typename Lanes<acc_t, LANES>::type;
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

// The next output row's weights: one row per tap, a (Ho, Wo) plane apart, more streams than
// the hardware prefetcher follows. They go to L2 (prefetcht1), not L1: a whole row's worth
// (49 taps for K = 7) sent to L1 at once saved less than half as much (interleaved, 64@56
// forward, batch 8, 2 threads: 2.48 ms to L1, 1.93 ms to L2).
template <typename T>
inline void prefetch_rows(const T* first, int64_t rows, int64_t row_stride, int64_t count) {
  constexpr int64_t kLine = 64 / sizeof(T);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t j = 0; j < count; j += kLine) __builtin_prefetch(first + r * row_stride + j, 0, 2);
  }
}

// ---- Weight sources: the stored weight tensor, or weights generated from a feature map ----
//
// involution_generated computes each pixel's weights from the kernel-generation branch's
// feature map instead of reading them:
//
//   weight[n, g, t, i, j] = bias[g * taps + t] + sum_r span[g * taps + t, r] * feature[n, r, i, j]
//
// (t = a * KW + b). The forward generates a block of output rows' taps at a time (about
// kGenPixels pixels) into a buffer that stays in cache, used at once by the same loops that
// read a stored weight; grad_input generates a (sample, group) pair's whole plane into the
// thread's buffer. The (N, G, KH, KW, Ho, Wo) map is never written to memory.

// Generated sums per block: kGenVectors vectors of columns for kGenTaps taps stay in
// registers while the reduced channels stream past (12 of the 16 AVX2 registers; measured on
// AVX2 at R = 16-128: 6 x 2 ran at 21-29 GMAC/s per core, 4 x 2 at 18-27). Columns come in
// whole vectors; an odd vector at the end is a block of its own.
constexpr int kGenVectors = 2, kGenTaps = 6;
template <typename T>
constexpr int64_t kGenColumns = kMaxLanes<T>;
// The forward generates whole output rows, as many as make about this many pixels, so that a
// narrow map (RedNet's 7- and 14-wide) does not pad each row to whole blocks.
constexpr int64_t kGenPixels = 64;

// Taps rounded up to whole blocks of kGenTaps (the generated buffers hold the extra rows).
inline int64_t generated_taps(int64_t taps) { return round_up(taps, kGenTaps); }

// dst[t * dst_stride + j] = bias[t] + sum_{r < reduced} span[t, r] * f[r * f_stride + j] for
// t < generated_taps(taps) and j < columns, a multiple of kGenColumns<T>. span is packed by
// tap block, the block's kGenTaps values of one r side by side (tap t0 + u of channel r at
// packed[(t0 * reduced) + r * kGenTaps + u]): the broadcasts of one r share a cache line
// (at R = 128 on AVX2, 40 GMAC/s per core packed, 26 unpacked).
template <int VB, typename T>
inline void generate_block(const T* packed, const T* bias, int64_t taps, int64_t reduced, const T* f, int64_t f_stride,
                           T* dst, int64_t dst_stride) {
  constexpr int L = kMaxLanes<T>, TB = kGenTaps;
  using V = typename Lanes<T, L>::type;
  for (int64_t t = 0; t < taps; t += TB) {
    V acc[TB][VB];
    for (int u = 0; u < TB; ++u) {
      for (int v = 0; v < VB; ++v) acc[u][v] = V{} + bias[t + u];
    }
    const T* s = packed + t * reduced;
    for (int64_t r = 0; r < reduced; ++r) {
      V fv[VB];
      for (int v = 0; v < VB; ++v) fv[v] = load_lanes<V>(f + r * f_stride + v * L);
      for (int u = 0; u < TB; ++u) {
        for (int v = 0; v < VB; ++v) acc[u][v] += s[r * TB + u] * fv[v];
      }
    }
    for (int u = 0; u < TB; ++u) {
      for (int v = 0; v < VB; ++v) store_lanes(dst + (t + u) * dst_stride + v * L, acc[u][v]);
    }
  }
}

template <typename T>
void generate_weights(const T* packed, const T* bias, int64_t taps, int64_t reduced, const T* f, int64_t f_stride,
                      int64_t columns, T* dst, int64_t dst_stride) {
  constexpr int64_t L = kMaxLanes<T>;
  int64_t j0 = 0;
  for (; j0 + kGenVectors * L <= columns; j0 += kGenVectors * L) {
    generate_block<kGenVectors>(packed, bias, taps, reduced, f + j0, f_stride, dst + j0, dst_stride);
  }
  for (; j0 < columns; j0 += L) generate_block<1>(packed, bias, taps, reduced, f + j0, f_stride, dst + j0, dst_stride);
}

// The generator of involution_generated: the feature map (N, R, Ho, Wo) of any strides, and
// per group its packed span rows and bias (generate_weights' layouts, zero past the taps).
template <typename scalar_t>
struct Generator {
  using acc_t = at::opmath_type<scalar_t>;
  Planes<scalar_t> feature;
  int64_t reduced, taps;
  std::vector<acc_t> packed, bias;

  Generator(const at::Tensor& feature_map, const at::Tensor& span, const at::Tensor& span_bias, int64_t kernel_taps)
      : feature(feature_map), reduced(span.size(1)), taps(kernel_taps) {
    const int64_t groups = span.size(0) / taps, padded = generated_taps(taps);
    const acc_t* s = span.data_ptr<acc_t>();
    const acc_t* b = span_bias.data_ptr<acc_t>();
    packed.assign(groups * padded * reduced, acc_t(0));
    bias.assign(groups * padded, acc_t(0));
    for (int64_t g = 0; g < groups; ++g) {
      for (int64_t t = 0; t < taps; ++t) {
        const int64_t block = g * padded + t / kGenTaps * kGenTaps;
        for (int64_t r = 0; r < reduced; ++r) packed[block * reduced + r * kGenTaps + t % kGenTaps] = s[(g * taps + t) * reduced + r];
        bias[g * padded + t] = b[g * taps + t];
      }
    }
  }

  // Output rows [first, first + rows) of sample n's feature map into f, flattened over the
  // rows, channel r at f + r * stride, zero past the pixels.
  void fill(int64_t n, int64_t first, int64_t rows, int64_t out_w, int64_t stride, acc_t* f) const {
    for (int64_t r = 0; r < reduced; ++r) {
      acc_t* row = f + r * stride;
      for (int64_t i = 0; i < rows; ++i) convert(feature.at(n, r, first + i), feature.stride_w, out_w, row + i * out_w);
      std::fill(row + rows * out_w, row + stride, acc_t(0));
    }
  }

  // Group g's weights from features f (fill's layout): tap t at dst + t * stride.
  void generate(int64_t g, const acc_t* f, int64_t stride, acc_t* dst) const {
    const int64_t padded = generated_taps(taps);
    generate_weights(packed.data() + g * padded * reduced, bias.data() + g * padded, padded, reduced, f, stride, stride, dst,
                     stride);
  }
};

// The features a thread filled last: refilled only when the sample or the rows change (the
// groups of a sample, taken in turn, share them).
template <typename acc_t>
struct FeatureCache {
  std::vector<acc_t> values;
  int64_t n = -1, first = -1;

  template <typename Gen>
  const acc_t* get(const Gen& gen, int64_t sample, int64_t first_row, int64_t rows, int64_t out_w, int64_t stride) {
    if (sample != n || first_row != first || static_cast<int64_t>(values.size()) != gen.reduced * stride) {
      values.resize(gen.reduced * stride);
      gen.fill(sample, first_row, rows, out_w, stride, values.data());
      n = sample, first = first_row;
    }
    return values.data();
  }
};

// Forward weight rows from the stored tensor: per thread, rows(geo) gives an object whose
// start(n, g) selects a pair and row(i) returns output row i's weights, tap t at
// row(i) + t * tap_stride(), readable kPixelBlock - 1 values past Wo.
template <typename scalar_t>
struct StoredWeight {
  using acc_t = at::opmath_type<scalar_t>;
  Weight<scalar_t> weight;

  struct Rows {
    const Weight<scalar_t>& w;
    const Geometry& geo;
    std::vector<acc_t> copy;
    const acc_t* planes = nullptr;

    void start(int64_t n, int64_t g) {
      // The last block of a row reads weights past Wo (its extra sums are dropped): the
      // tensor itself only where no row has such a block.
      planes = w.planes(geo, n, g, geo.out_w % kPixelBlock == 0, kPixelBlock, copy);
    }
    int64_t tap_stride() const { return geo.out_h * geo.out_w; }
    const acc_t* row(int64_t i) const {
      if (i + 1 < geo.out_h) prefetch_rows(planes + (i + 1) * geo.out_w, geo.taps(), tap_stride(), geo.out_w);
      return planes + i * geo.out_w;
    }
  };
  Rows rows(const Geometry& geo) const { return Rows{weight, geo}; }

  // grad_input's weights of (n, g): [tap][i][j], tap stride tap_stride.
  const acc_t* planes(const Geometry& geo, int64_t n, int64_t g, std::vector<acc_t>& buffer, FeatureCache<acc_t>&,
                      int64_t& tap_stride) const {
    tap_stride = geo.out_h * geo.out_w;
    return weight.planes(geo, n, g, true, 0, buffer);
  }
};

// Forward weight rows generated a block of output rows at a time (see Generator).
template <typename scalar_t>
struct GeneratedWeight {
  using acc_t = at::opmath_type<scalar_t>;
  Generator<scalar_t> generator;

  struct Rows {
    const Generator<scalar_t>& gen;
    const Geometry& geo;
    int64_t block_rows = std::max<int64_t>(1, kGenPixels / geo.out_w);
    // The last row of a block is read kPixelBlock - 1 weights past Wo (sums dropped).
    int64_t columns = round_up(block_rows * geo.out_w + kPixelBlock - 1, kGenColumns<acc_t>);
    FeatureCache<acc_t> features{};
    std::vector<acc_t> weights = std::vector<acc_t>(generated_taps(geo.taps()) * columns);
    int64_t n = 0, g = 0, first = -1;

    void start(int64_t sample, int64_t group) { n = sample, g = group, first = -1; }
    int64_t tap_stride() const { return columns; }
    const acc_t* row(int64_t i) {
      if (first < 0 || i >= first + block_rows) {
        first = i;
        const acc_t* f = features.get(gen, n, first, std::min(block_rows, geo.out_h - first), geo.out_w, columns);
        gen.generate(g, f, columns, weights.data());
      }
      return weights.data() + (i - first) * geo.out_w;
    }
  };
  Rows rows(const Geometry& geo) const { return Rows{generator, geo}; }

  // grad_input's weights of (n, g), generated over the whole plane into `buffer` (tap stride:
  // the plane rounded up to whole generated blocks).
  const acc_t* planes(const Geometry& geo, int64_t n, int64_t g, std::vector<acc_t>& buffer, FeatureCache<acc_t>& features,
                      int64_t& tap_stride) const {
    tap_stride = round_up(geo.out_h * geo.out_w, kGenColumns<acc_t>);
    buffer.resize(generated_taps(geo.taps()) * tap_stride);
    generator.generate(g, features.get(generator, n, 0, geo.out_h, geo.out_w, tap_stride), tap_stride, buffer.data());
    return buffer.data();
  }
};

// Forward sums of kPixelBlock outputs of one row, LANES channels: window values from x (the
// block's first window, kernel row 0; kernel row a at x + a * row_step), weights from w
// (tap t of output p at w[t * w_stride + p]). Input column c of the block's span serves
// output p through tap c - p * SW: each loaded vector is used by every output that reads it.
template <int KW, int SW, typename V, typename T>
inline void forward_fixed(const T* x, int64_t row_step, int64_t cpg, int64_t kernel_h, const T* w, int64_t w_stride,
                          T* sums) {
  constexpr int P = kPixelBlock;
  V acc[P] = {};
  for (int64_t a = 0; a < kernel_h; ++a) {
    const T* xa = x + a * row_step;
    const T* wa = w + a * KW * w_stride;
#pragma GCC unroll 64
    for (int c = 0; c < (P - 1) * SW + KW; ++c) {
      const V v = load_lanes<V>(xa + c * cpg);
#pragma GCC unroll 16
      for (int p = 0; p < P; ++p) {
        const int b = c - p * SW;
        if (b >= 0 && b < KW) acc[p] += wa[b * w_stride + p] * v;
      }
    }
  }
  for (int p = 0; p < P; ++p) store_lanes(sums + p * cpg, acc[p]);
}

// The same for any geometry: tap t's window value of output p at x + window[t] + p * pixel_step.
template <typename V, typename T>
inline void forward_general(const T* x, const int64_t* window, int64_t taps, int64_t pixel_step, const T* w,
                            int64_t w_stride, int64_t cpg, T* sums) {
  constexpr int P = kPixelBlock;
  V acc[P] = {};
  for (int64_t t = 0; t < taps; ++t) {
    const T* xt = x + window[t];
    const T* wt = w + t * w_stride;
    for (int p = 0; p < P; ++p) acc[p] += wt[p] * load_lanes<V>(xt + p * pixel_step);
  }
  for (int p = 0; p < P; ++p) store_lanes(sums + p * cpg, acc[p]);
}

// Source: StoredWeight or GeneratedWeight.
template <typename scalar_t, typename Source>
void forward_kernel(const Geometry& geo, const at::Tensor& input, const Source& source, at::Tensor& out) {
  using acc_t = at::opmath_type<scalar_t>;
  const Planes<scalar_t> x(input);
  scalar_t* out_data = out.data_ptr<scalar_t>();
  const int64_t cpg = geo.group_channels(), taps = geo.taps(), plane = geo.out_h * geo.out_w;
  const int64_t width = round_up(geo.out_w, kPixelBlock);  // outputs computed per row
  const int64_t rows = geo.scratch_rows(), columns = (width - 1) * geo.stride_w + (geo.kernel_w - 1) * geo.dilation_w + 1;
  const int64_t row_step = geo.dilation_h * columns * cpg, pixel_step = geo.stride_w * cpg;
  const std::vector<int64_t> window = window_offsets(geo, columns);
  with_lanes<acc_t>(cpg, [&](auto lanes) {
    using V = typename Lanes<acc_t, decltype(lanes)::value>::type;
    at::parallel_for(0, geo.batch * geo.groups, 1, [&](int64_t begin, int64_t end) {
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
          const bool fixed = with_fixed_row_window(geo, [&](auto kernel_w, auto stride_w) {
            for (int64_t j0 = 0; j0 < width; j0 += kPixelBlock) {
              for (int64_t k = 0; k < cpg; k += lanes) {
                forward_fixed<decltype(kernel_w)::value, decltype(stride_w)::value, V>(
                    row + j0 * pixel_step + k, row_step, cpg, geo.kernel_h, weight_row + j0, w_stride, sums.data() + j0 * cpg + k);
              }
            }
          });
          if (!fixed) {
            for (int64_t j0 = 0; j0 < width; j0 += kPixelBlock) {
              for (int64_t k = 0; k < cpg; k += lanes) {
                forward_general<V>(row + j0 * pixel_step + k, window.data(), taps, pixel_step, weight_row + j0, w_stride, cpg,
                                   sums.data() + j0 * cpg + k);
              }
            }
          }
          store_channel_row<decltype(lanes)::value>(sums.data(), cpg, geo.out_w, out_data + ((n * geo.channels + g * cpg) * geo.out_h + i) * geo.out_w,
                            plane);
        }
      }
    });
  });
}

// grad_input gathers: grad_input at padded position (Y, X) (input (Y - pad_h, X - pad_w)) is
// the sum, over the taps (a, b) and outputs (i, j) with i * sh + a * dh = Y and
// j * sw + b * dw = X, of weight[a, b, i, j] times grad_output[i, j]. For each padded row Y
// the kernel rows that reach it are listed once ("reaching").
struct Reaching {
  int64_t kernel_row, out_row;
};

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

// Source: StoredWeight or GeneratedWeight.
template <typename scalar_t, typename Source>
void backward_input_kernel(const Geometry& geo, const at::Tensor& grad_output, const Source& source,
                           at::Tensor& grad_input) {
  using acc_t = at::opmath_type<scalar_t>;
  const Planes<scalar_t> grad(grad_output);
  scalar_t* result = grad_input.data_ptr<scalar_t>();
  const int64_t cpg = geo.group_channels(), taps = geo.taps(), sw = geo.stride_w, dw = geo.dilation_w;
  const int64_t plane = geo.out_h * geo.out_w;
  // Padded columns computed: from the first real one rounded down to a stride phase, in whole blocks.
  const int64_t x_begin = geo.pad_w / sw * sw, x_end = x_begin + round_up(geo.width + geo.pad_w - x_begin, kGatherBlock);
  with_lanes<acc_t>(cpg, [&](auto lanes) {
    using V = typename Lanes<acc_t, decltype(lanes)::value>::type;
    at::parallel_for(0, geo.batch * geo.groups, 1, [&](int64_t begin, int64_t end) {
      std::vector<acc_t> grads(plane * cpg), weight_copy, sums((x_end - x_begin) * cpg);
      FeatureCache<acc_t> feature_copy;
      std::vector<const acc_t*> grad_rows, weight_rows;
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
          const bool fixed = with_fixed_row_window(geo, [&](auto kernel_w, auto stride_w) {
            constexpr int KW = decltype(kernel_w)::value, SW = decltype(stride_w)::value;
            for (int64_t x0 = x_begin; x0 < x_end; x0 += kGatherBlock) {
              const int64_t j0 = x0 / SW;
              grad_rows.clear();
              weight_rows.clear();
              for (const Reaching& e : reaching) {
                grad_rows.push_back(grads.data() + (e.out_row * geo.out_w + j0) * cpg);
                weight_rows.push_back(weights + e.kernel_row * KW * w_stride + e.out_row * geo.out_w + j0);
              }
              for (int64_t k = 0; k < cpg; k += lanes) {
                gather_fixed<KW, SW, V>(grad_rows.data(), weight_rows.data(), static_cast<int64_t>(reaching.size()), w_stride, cpg, k,
                                        -j0, geo.out_w - 1 - j0, sums.data() + (x0 - x_begin) * cpg + k);
              }
            }
          });
          if (!fixed) {
            // Any geometry: each padded column X sums over the taps b whose j = (X - b dw) / sw is whole.
            for (int64_t x = 0; x < geo.width; ++x) {
              const int64_t X = x + geo.pad_w;
              for (int64_t k = 0; k < cpg; k += lanes) {
                V acc = {};
                for (const Reaching& e : reaching) {
                  for (int64_t b = 0; b < geo.kernel_w; ++b) {
                    const int64_t from = X - b * dw;
                    if (from < 0 || from % sw != 0 || from / sw >= geo.out_w) continue;
                    const int64_t j = from / sw, at = e.out_row * geo.out_w + j;
                    acc += weights[(e.kernel_row * geo.kernel_w + b) * w_stride + at] * load_lanes<V>(grads.data() + at * cpg + k);
                  }
                }
                store_lanes(sums.data() + (X - x_begin) * cpg + k, acc);
              }
            }
          }
          store_channel_row<decltype(lanes)::value>(sums.data() + (geo.pad_w - x_begin) * cpg, cpg, geo.width,
                            result + ((n * geo.channels + g * cpg) * geo.height + y) * geo.width, geo.height * geo.width);
        }
      }
    });
  });
}

// grad_weight of any geometry (the pixel-lane kernel below takes the common windows) sums
// over the group's channels, which lie in the vector lanes: the products of
// LANES outputs (pixels of the flattened (Ho, Wo) plane, across rows, so a narrow map wastes
// no lane) are summed across the lanes together, pairs of vectors shuffled and added as in
// transpose, halves first (few vectors live at once): lane c ends with output c's sum.
template <typename M, int LANES, int BIT, bool FROM_A, size_t... I>
constexpr M blend_mask(std::index_sequence<I...>) {
  // Lanes that have BIT from one input, the others from the second (index LANES + i is b[i]).
  return M{static_cast<typename std::remove_reference_t<decltype(M{}[0])>>(((I & BIT) != 0) == FROM_A ? I : LANES + I)...};
}

template <typename M, int BIT, size_t... I>
constexpr M swap_mask(std::index_sequence<I...>) {
  return M{static_cast<typename std::remove_reference_t<decltype(M{}[0])>>(I ^ BIT)...};
}

template <typename T, int LANES, int FIRST, int SPAN, typename Product>
inline typename Lanes<T, LANES>::type sum_lanes(Product&& product) {
  if constexpr (SPAN == 1) {
    return product(FIRST);
  } else {
    // Pairing a (outputs FIRST...) with b (outputs FIRST + BIT...): lane i keeps a's lane
    // where i lacks BIT, b's where it has it, and adds the partner lane i ^ BIT of the same input.
    using M = typename Lanes<IndexOf<T>, LANES>::type;
    constexpr int BIT = SPAN / 2;
    constexpr M keep = blend_mask<M, LANES, BIT, false>(std::make_index_sequence<LANES>{});
    constexpr M partner = blend_mask<M, LANES, BIT, true>(std::make_index_sequence<LANES>{});
    constexpr M swap = swap_mask<M, BIT>(std::make_index_sequence<LANES>{});
    const auto a = sum_lanes<T, LANES, FIRST, BIT>(product), b = sum_lanes<T, LANES, FIRST + BIT, BIT>(product);
    return __builtin_shuffle(a, b, keep) + __builtin_shuffle(__builtin_shuffle(a, b, partner), swap);
  }
}

// grad_weight of LANES outputs for every tap: output c's grad_output at grads + c * cpg, its
// window at windows[c] (tap t at + window[t]); tap t's LANES sums to out + t * plane.
// VECTORS: cpg / LANES where it is 1 or 2, else 0 (a loop).
template <int LANES, int VECTORS, typename T>
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
    T* to = out + t * plane;
#if defined(__AVX512F__)
    // Whole cache lines of the result stream past the cache: the result is 49/cpg times the
    // input's size and is not read again here, and a streaming store skips reading each line
    // before it is written (6-8% of grad_weight at RedNet's 56-, 28- and 56/2-wide maps).
    if constexpr (std::is_same_v<T, float> && LANES == 16) {
      if (reinterpret_cast<uintptr_t>(to) % 64 == 0) {
        _mm512_stream_ps(to, reinterpret_cast<__m512>(sums));
        continue;
      }
    }
#endif
    store_lanes(to, sums);
  }
}

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

// Registers for sums: the vector registers less those holding grad_output and the load.
constexpr int kVectorRegisters = kWideBytes == 64 ? 32 : 16;

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

// count values from `from` (in the cache) to `to`, whole aligned lines past the cache.
template <typename T>
inline void stream_out(const T* from, int64_t count, T* to) {
  int64_t j = 0;
#if defined(__AVX512F__)
  constexpr int64_t kLine = 64 / sizeof(T);
  while (j < count && reinterpret_cast<uintptr_t>(to + j) % 64 != 0) {
    to[j] = from[j];
    ++j;
  }
  for (; j + kLine <= count; j += kLine) {
    if constexpr (std::is_same_v<T, float>) _mm512_stream_ps(to + j, _mm512_loadu_ps(from + j));
    else _mm512_stream_pd(to + j, _mm512_loadu_pd(from + j));
  }
#endif
  std::memcpy(to + j, from + j, (count - j) * sizeof(T));
}

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
  at::parallel_for(0, geo.batch * geo.groups, 1, [&](int64_t begin, int64_t end) {
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
#if defined(__AVX512F__)
    _mm_sfence();  // the streamed lines are visible before the thread's work counts as done
#endif
  });
}

// The pixel-lane grad_weight where the geometry has one (returns false otherwise).
template <typename scalar_t>
bool backward_weight_by_pixels(const Geometry& geo, const Planes<scalar_t>& grad, const Planes<scalar_t>& x, scalar_t* result) {
  using T = at::opmath_type<scalar_t>;
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

template <typename scalar_t>
void backward_weight_kernel(const Geometry& geo, const at::Tensor& grad_output, const at::Tensor& input,
                            at::Tensor& grad_weight) {
  using acc_t = at::opmath_type<scalar_t>;
  const Planes<scalar_t> grad(grad_output), x(input);
  scalar_t* result = grad_weight.data_ptr<scalar_t>();
  if (backward_weight_by_pixels(geo, grad, x, result)) return;
  const int64_t cpg = geo.group_channels(), taps = geo.taps(), plane = geo.out_h * geo.out_w;
  const int64_t rows = geo.scratch_rows(), columns = (geo.out_w - 1) * geo.stride_w + (geo.kernel_w - 1) * geo.dilation_w + 1;
  const std::vector<int64_t> window = window_offsets(geo, columns);
  with_lanes<acc_t>(cpg, [&](auto lanes) {
    constexpr int LANES = decltype(lanes)::value;
    // Output p's window start; past the plane's end, the last one's again (sums dropped).
    std::vector<int64_t> window_start(plane + LANES);
    for (int64_t p = 0; p < plane + LANES; ++p) {
      const int64_t at = std::min(p, plane - 1);
      window_start[p] = ((at / geo.out_w) * geo.stride_h * columns + (at % geo.out_w) * geo.stride_w) * cpg;
    }
    at::parallel_for(0, geo.batch * geo.groups, 1, [&](int64_t begin, int64_t end) {
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
          if (cpg == LANES) weight_grad_block<LANES, 1>(block, windows, window.data(), taps, cpg, sums, stride);
          else if (cpg == 2 * LANES) weight_grad_block<LANES, 2>(block, windows, window.data(), taps, cpg, sums, stride);
          else weight_grad_block<LANES, 0>(block, windows, window.data(), taps, cpg, sums, stride);
          if (!direct) {
            for (int64_t t = 0; t < taps; ++t) {
              for (int64_t c = 0; c < count; ++c) out[t * plane + p0 + c] = static_cast<scalar_t>(last[t * LANES + c]);
            }
          }
        }
      }
#if defined(__AVX512F__)
      _mm_sfence();  // the streamed lines are visible before the thread's work counts as done
#endif
    });
  });
}

}  // namespace

at::Tensor involution_forward(const at::Tensor& input, const at::Tensor& weight, at::IntArrayRef stride,
                              at::IntArrayRef padding, at::IntArrayRef dilation) {
  const Geometry geo = make_geometry(input.sizes(), weight.sizes(), stride, padding, dilation);
  at::Tensor out = at::empty({geo.batch, geo.channels, geo.out_h, geo.out_w}, input.options());
  if (out.numel() == 0) return out;
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, input.scalar_type(), "involution_forward",
                                  [&] { forward_kernel<scalar_t>(geo, input, StoredWeight<scalar_t>{Weight<scalar_t>(weight)}, out); });
  return out;
}

at::Tensor involution_backward_input(const at::Tensor& grad_output, const at::Tensor& weight,
                                     at::IntArrayRef input_size, at::IntArrayRef stride, at::IntArrayRef padding,
                                     at::IntArrayRef dilation) {
  const std::vector<int64_t> input_shape{grad_output.size(0), grad_output.size(1), input_size[0], input_size[1]};
  const Geometry geo = make_geometry(input_shape, weight.sizes(), stride, padding, dilation);
  at::Tensor grad_input = at::empty(input_shape, grad_output.options());
  if (grad_input.numel() == 0) return grad_input;
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, grad_output.scalar_type(), "involution_backward_input",
                                  [&] { backward_input_kernel<scalar_t>(geo, grad_output, StoredWeight<scalar_t>{Weight<scalar_t>(weight)}, grad_input); });
  return grad_input;
}

at::Tensor involution_backward_weight(const at::Tensor& grad_output, const at::Tensor& input,
                                      at::IntArrayRef kernel_size, at::IntArrayRef stride, at::IntArrayRef padding,
                                      at::IntArrayRef dilation, int64_t groups) {
  const std::vector<int64_t> weight_shape{input.size(0), groups, kernel_size[0], kernel_size[1], grad_output.size(2),
                                          grad_output.size(3)};
  const Geometry geo = make_geometry(input.sizes(), weight_shape, stride, padding, dilation);
  at::Tensor grad_weight = at::empty(weight_shape, input.options());
  if (grad_weight.numel() == 0) return grad_weight;
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, input.scalar_type(), "involution_backward_weight",
                                  [&] { backward_weight_kernel<scalar_t>(geo, grad_output, input, grad_weight); });
  return grad_weight;
}

namespace {

// The (N, G, KH, KW, Ho, Wo) weight shape of involution_generated's operands.
std::vector<int64_t> generated_weight_shape(const at::Tensor& feature, const at::Tensor& span_weight, at::IntArrayRef kernel_size) {
  const int64_t taps = kernel_size[0] * kernel_size[1];
  return {feature.size(0), span_weight.size(0) / taps, kernel_size[0], kernel_size[1], feature.size(2), feature.size(3)};
}

// The span matrix and bias in the accumulation type, contiguous, packed into the Generator
// that `run` computes with.
template <typename scalar_t, typename Run>
void with_generator(const at::Tensor& feature, const at::Tensor& span_weight, const std::optional<at::Tensor>& span_bias,
                    int64_t taps, Run&& run) {
  const auto acc_type = c10::CppTypeToScalarType<at::opmath_type<scalar_t>>::value;
  const at::Tensor span = span_weight.to(acc_type).contiguous();
  const at::Tensor bias = span_bias.has_value() ? span_bias->to(acc_type).contiguous() : at::zeros({span_weight.size(0)}, span.options());
  run(GeneratedWeight<scalar_t>{Generator<scalar_t>(feature, span, bias, taps)});
}

}  // namespace

at::Tensor involution_generated_forward(const at::Tensor& input, const at::Tensor& feature, const at::Tensor& span_weight,
                                        const std::optional<at::Tensor>& span_bias, at::IntArrayRef kernel_size,
                                        at::IntArrayRef stride, at::IntArrayRef padding, at::IntArrayRef dilation) {
  const Geometry geo = make_geometry(input.sizes(), generated_weight_shape(feature, span_weight, kernel_size), stride, padding, dilation);
  at::Tensor out = at::empty({geo.batch, geo.channels, geo.out_h, geo.out_w}, input.options());
  if (out.numel() == 0) return out;
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, input.scalar_type(), "involution_generated_forward", [&] {
    with_generator<scalar_t>(feature, span_weight, span_bias, geo.taps(), [&](const auto& source) { forward_kernel<scalar_t>(geo, input, source, out); });
  });
  return out;
}

at::Tensor involution_generated_backward_input(const at::Tensor& grad_output, const at::Tensor& feature,
                                               const at::Tensor& span_weight, const std::optional<at::Tensor>& span_bias,
                                               at::IntArrayRef input_size, at::IntArrayRef kernel_size, at::IntArrayRef stride,
                                               at::IntArrayRef padding, at::IntArrayRef dilation) {
  const std::vector<int64_t> input_shape{grad_output.size(0), grad_output.size(1), input_size[0], input_size[1]};
  const Geometry geo = make_geometry(input_shape, generated_weight_shape(feature, span_weight, kernel_size), stride, padding, dilation);
  at::Tensor grad_input = at::empty(input_shape, grad_output.options());
  if (grad_input.numel() == 0) return grad_input;
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, grad_output.scalar_type(), "involution_generated_backward_input", [&] {
    with_generator<scalar_t>(feature, span_weight, span_bias, geo.taps(),
                             [&](const auto& source) { backward_input_kernel<scalar_t>(geo, grad_output, source, grad_input); });
  });
  return grad_input;
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("involution_generated_forward", &involution_generated_forward);
  m.def("involution_generated_backward_input", &involution_generated_backward_input);
  m.def("involution_forward", &involution_forward);
  m.def("involution_backward_input", &involution_backward_input);
  m.def("involution_backward_weight", &involution_backward_weight);
}
