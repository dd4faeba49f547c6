// Involution's CPU kernels: the forward and its two backward ops, built on first use by
// oplib.kernels.native (torch.utils.cpp_extension) and called from the ops' CPU kernels.
//
//   out[n, c, i, j] = sum_{a, b} weight[n, g, a, b, i, j] * input[n, c, i*sh - ph + a*dh, j*sw - pw + b*dw]
//
// with g = c / (C / G). Work is split over (sample, group) pairs with at::parallel_for. Each
// pair first copies its C/G input planes (or, for grad_input, accumulates into them) in a
// scratch holding the zero border the windows reach, converted to the accumulation type
// (float for 16-bit operands, else the dtype itself). Every window then reads the scratch
// with no bounds test, and a tap that reads the border multiplies a real zero, so inf and nan
// give what the padded (unfold) reference gives. One thread computes each output element,
// in an order that depends on the geometry alone: results are the same for any thread count.
//
// Operands may have any strides (channels_last included): they are read element by element
// into the scratch buffers. Results are contiguous tensors of the operands' dtype.

#include <torch/extension.h>

#include <ATen/OpMathType.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

namespace {

// GCC/Clang vector extensions: one AVX2 register (two halves of an AVX-512 one), portable to
// any target the compiler knows; -march=native picks the instructions.
// (GCC ignores the attribute on an alias template, hence one typedef per type.)
constexpr int64_t kVectorBytes = 32;
template <typename T>
struct VectorOf;
template <>
struct VectorOf<float> {
  typedef float type __attribute__((vector_size(kVectorBytes)));
};
template <>
struct VectorOf<double> {
  typedef double type __attribute__((vector_size(kVectorBytes)));
};
template <typename T>
using Vec = typename VectorOf<T>::type;
template <typename T>
constexpr int64_t kLanes = kVectorBytes / sizeof(T);

static_assert(sizeof(Vec<float>) == kVectorBytes && sizeof(Vec<double>) == kVectorBytes, "vector types");

template <typename T>
inline Vec<T> load(const T* p) {
  Vec<T> v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

template <typename T>
inline void store(T* p, const Vec<T>& v) {
  std::memcpy(p, &v, sizeof v);
}

// dst[j] = src[j * stride] for j < count, converted; the contiguous case vectorises.
template <typename scalar_t, typename acc_t>
inline void convert(const scalar_t* src, int64_t stride, int64_t count, acc_t* dst) {
  if (stride == 1) {
    for (int64_t j = 0; j < count; ++j) dst[j] = static_cast<acc_t>(src[j]);
  } else {
    for (int64_t j = 0; j < count; ++j) dst[j] = static_cast<acc_t>(src[j * stride]);
  }
}

// Register blocks: CHANNELS x VECTORS accumulators in the forward (the group's channels share
// each weight vector), TAPS x VECTORS in grad_weight (each grad_output vector serves every
// tap), enough independent sums to keep both FMA units busy.
constexpr int kChannelBlock = 4;
constexpr int kTapBlock = 4;
constexpr int kVectorBlock = 2;

// body(std::integral_constant<int, BLOCK>{}, at) for at = begin, begin + BLOCK * unit, ... while
// a whole block fits before end, then body(std::integral_constant<int, 1>{}, at) for the rest:
// the register blocks above, with a block size known at compile time.
template <int BLOCK, typename Body>
inline void in_blocks(int64_t begin, int64_t end, int64_t unit, Body&& body) {
  int64_t at = begin;
  for (; at + BLOCK * unit <= end; at += BLOCK * unit) body(std::integral_constant<int, BLOCK>{}, at);
  for (; at < end; at += unit) body(std::integral_constant<int, 1>{}, at);
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

// How a (sample, group) pair's planes sit in its scratch buffer. Rows are split by column
// phase: padded column x (input column x - pad_w) is stored at phase x % stride_w, index
// x / stride_w, so output column j of tap b reads index j + (b * dw) / sw of phase
// (b * dw) % sw: consecutive outputs read consecutive values for any stride. Output rows are
// computed out_w_padded wide (a whole number of vectors); the extra columns read zeros or
// values whose products are dropped.
template <typename T>
struct ScratchLayout {
  int64_t out_w_padded, phase_width, row_length, plane;
  std::vector<int64_t> tap_offset;  // tap t = a * KW + b -> offset of its window's first value

  explicit ScratchLayout(const Geometry& geo) {
    out_w_padded = (geo.out_w + kLanes<T> - 1) / kLanes<T> * kLanes<T>;
    phase_width = out_w_padded + (geo.kernel_w - 1) * geo.dilation_w / geo.stride_w + 1;
    row_length = geo.stride_w * phase_width;
    plane = geo.scratch_rows() * row_length;
    for (int64_t a = 0; a < geo.kernel_h; ++a) {
      for (int64_t b = 0; b < geo.kernel_w; ++b) {
        const int64_t column = b * geo.dilation_w;
        tap_offset.push_back(a * geo.dilation_h * row_length + (column % geo.stride_w) * phase_width + column / geo.stride_w);
      }
    }
  }

  // Where padded column x of a row lives.
  int64_t column(const Geometry& geo, int64_t x) const { return (x % geo.stride_w) * phase_width + x / geo.stride_w; }
  // The start of output row i's windows in a plane.
  int64_t row(const Geometry& geo, int64_t i) const { return i * geo.stride_h * row_length; }
};

// A 4-D operand (N, C, H, W) of any strides.
template <typename scalar_t>
struct Planes {
  const scalar_t* data;
  int64_t stride_n, stride_c, stride_h, stride_w;

  explicit Planes(const at::Tensor& t)
      : data(t.data_ptr<scalar_t>()), stride_n(t.stride(0)), stride_c(t.stride(1)), stride_h(t.stride(2)),
        stride_w(t.stride(3)) {}

  const scalar_t* at(int64_t n, int64_t c, int64_t h) const { return data + n * stride_n + c * stride_c + h * stride_h; }

  // Row (n, c, h) as acc_t, zero from out_w on up to padded_width.
  template <typename acc_t>
  void copy_row(int64_t n, int64_t c, int64_t h, int64_t width, int64_t padded_width, acc_t* dst) const {
    convert(at(n, c, h), stride_w, width, dst);
    std::fill(dst + width, dst + padded_width, acc_t(0));
  }
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

  // Row i of tap (a, b) of (n, g) as acc_t: padded_width values, zero from Wo on.
  template <typename acc_t>
  void copy_row(const Geometry& geo, int64_t n, int64_t g, int64_t a, int64_t b, int64_t i, int64_t padded_width,
                acc_t* dst) const {
    convert(row(n, g, a, b, i), stride[5], geo.out_w, dst);
    std::fill(dst + geo.out_w, dst + padded_width, acc_t(0));
  }

  // Row i of every tap of (n, g): taps rows of padded_width values (tap t = a * KW + b).
  // The taps' rows lie a whole (Ho, Wo) plane apart, more streams than the hardware
  // prefetcher follows, so the next output row's are prefetched while this one is copied.
  template <typename acc_t>
  void copy_rows(const Geometry& geo, int64_t n, int64_t g, int64_t i, int64_t padded_width, acc_t* rows) const {
    constexpr int64_t kLine = 64 / sizeof(scalar_t);
    for (int64_t a = 0; a < geo.kernel_h; ++a) {
      for (int64_t b = 0; b < geo.kernel_w; ++b) {
        if (i + 1 < geo.out_h) {
          const scalar_t* next = row(n, g, a, b, i + 1);
          for (int64_t j = 0; j < geo.out_w; j += kLine) __builtin_prefetch(next + j * stride[5]);
        }
        copy_row(geo, n, g, a, b, i, padded_width, rows + (a * geo.kernel_w + b) * padded_width);
      }
    }
  }
};

// The group's input planes in the scratch layout, as acc_t, with zeros where the windows
// reach past the image.
template <typename scalar_t, typename acc_t>
void fill_scratch(const Geometry& geo, const ScratchLayout<acc_t>& layout, const Planes<scalar_t>& input, int64_t n,
                  int64_t g, acc_t* scratch) {
  const int64_t cpg = geo.group_channels();
  std::fill(scratch, scratch + cpg * layout.plane, acc_t(0));
  const int64_t rows = std::min(geo.height + geo.pad_h, geo.scratch_rows());
  const int64_t sw = geo.stride_w, padded_columns = std::min(geo.width + geo.pad_w, sw * layout.phase_width);
  for (int64_t k = 0; k < cpg; ++k) {
    for (int64_t r = geo.pad_h; r < rows; ++r) {
      const scalar_t* src = input.at(n, g * cpg + k, r - geo.pad_h);
      acc_t* dst = scratch + k * layout.plane + r * layout.row_length;
      // Phase p holds padded columns p, p + sw, ...: from the first at or past pad_w on.
      for (int64_t p = 0; p < sw; ++p) {
        const int64_t first = p >= geo.pad_w ? p : p + (geo.pad_w - p + sw - 1) / sw * sw;
        if (first >= padded_columns) continue;
        const int64_t count = (padded_columns - first + sw - 1) / sw;
        convert(src + (first - geo.pad_w) * input.stride_w, sw * input.stride_w, count, dst + p * layout.phase_width + first / sw);
      }
    }
  }
}

// A vector of outputs: its window values start at plane + window, its weights at
// weight_rows + weight (+ tap * padded_width), its sums at sum_row + sum.
struct Slot {
  int64_t window, weight, sum;
};

// The sums of VECTORS slots for CHANNELS planes: weight values times window values over the
// taps, in registers across the taps (each weight vector serves every channel).
template <int CHANNELS, int VECTORS, typename T>
inline void forward_block(const T* weight_rows, int64_t padded_width, const std::vector<int64_t>& tap_offset,
                          const T* const* planes, const Slot* slots, T* const* sums) {
  Vec<T> acc[CHANNELS][VECTORS] = {};
  for (size_t t = 0; t < tap_offset.size(); ++t) {
    Vec<T> w[VECTORS];
    for (int v = 0; v < VECTORS; ++v) w[v] = load(weight_rows + slots[v].weight + t * padded_width);
    for (int c = 0; c < CHANNELS; ++c) {
      const T* x = planes[c] + tap_offset[t];
      for (int v = 0; v < VECTORS; ++v) acc[c][v] += w[v] * load(x + slots[v].window);
    }
  }
  for (int c = 0; c < CHANNELS; ++c) {
    for (int v = 0; v < VECTORS; ++v) store(sums[c] + slots[v].sum, acc[c][v]);
  }
}

// Output rows are computed kRowBlock at a time: on small maps one row is a vector or two,
// too few independent sums for the FMA units, and each row's bookkeeping would dominate.
constexpr int64_t kRowBlock = 2;

template <typename scalar_t>
void forward_kernel(const Geometry& geo, const at::Tensor& input, const at::Tensor& weight, at::Tensor& out) {
  using acc_t = at::opmath_type<scalar_t>;
  constexpr int64_t L = kLanes<acc_t>;
  const ScratchLayout<acc_t> layout(geo);
  const Planes<scalar_t> x(input);
  const Weight<scalar_t> w(weight);
  scalar_t* out_data = out.data_ptr<scalar_t>();
  const int64_t cpg = geo.group_channels(), width = layout.out_w_padded, taps = geo.taps();
  at::parallel_for(0, geo.batch * geo.groups, 1, [&](int64_t begin, int64_t end) {
    std::vector<acc_t> scratch(cpg * layout.plane), weight_rows(kRowBlock * taps * width), sums(cpg * kRowBlock * width);
    std::vector<const acc_t*> planes(cpg);
    std::vector<acc_t*> sum_rows(cpg);
    std::vector<Slot> slots;
    for (int64_t k = 0; k < cpg; ++k) sum_rows[k] = sums.data() + k * kRowBlock * width;
    for (int64_t item = begin; item < end; ++item) {
      const int64_t n = item / geo.groups, g = item % geo.groups;
      fill_scratch(geo, layout, x, n, g, scratch.data());
      for (int64_t k = 0; k < cpg; ++k) planes[k] = scratch.data() + k * layout.plane;
      for (int64_t i0 = 0; i0 < geo.out_h; i0 += kRowBlock) {
        const int64_t rows = std::min(kRowBlock, geo.out_h - i0);
        slots.clear();
        for (int64_t r = 0; r < rows; ++r) {
          w.copy_rows(geo, n, g, i0 + r, width, weight_rows.data() + r * taps * width);
          for (int64_t j0 = 0; j0 < width; j0 += L) {
            slots.push_back(Slot{layout.row(geo, i0 + r) + j0, r * taps * width + j0, r * width + j0});
          }
        }
        in_blocks<kChannelBlock>(0, cpg, 1, [&](auto channels, int64_t k) {
          in_blocks<kVectorBlock>(0, static_cast<int64_t>(slots.size()), 1, [&](auto vectors, int64_t s) {
            forward_block<decltype(channels)::value, decltype(vectors)::value>(
                weight_rows.data(), width, layout.tap_offset, &planes[k], &slots[s], &sum_rows[k]);
          });
        });
        for (int64_t k = 0; k < cpg; ++k) {
          for (int64_t r = 0; r < rows; ++r) {
            scalar_t* dst = out_data + ((n * geo.channels + g * cpg + k) * geo.out_h + i0 + r) * geo.out_w;
            for (int64_t j = 0; j < geo.out_w; ++j) dst[j] = static_cast<scalar_t>(sum_rows[k][r * width + j]);
          }
        }
      }
    }
  });
}

// grad_input gathers: each of its values is the sum, over the (tap, output) pairs whose window
// reads it, of weight times grad_output. For padded column X = x + pad_w of phase q = X % sw
// at index m = X / sw, tap b contributes when (b * dw) % sw == q, from output column
// j = m - (b * dw) / sw; consecutive m read consecutive j. grad_output and weight rows are
// held with zero margins, so j outside [0, Wo) reads zeros, and a vector of m needs no test.
struct GatherLayout {
  int64_t margin, row;  // zeros before column 0; values per held row
  explicit GatherLayout(const Geometry& geo, int64_t lanes) {
    margin = (geo.kernel_w - 1) * geo.dilation_w / geo.stride_w;
    const int64_t m_end = (geo.width + geo.pad_w - 1) / geo.stride_w + 1;
    row = margin + std::max(geo.out_w, m_end) + kVectorBlock * lanes;
  }
};

// grad_input values m0 .. m0 + VECTORS * lanes of CHANNELS channels in one row and phase:
// the sum over the contributing (row, tap) pairs, in registers across them.
template <int CHANNELS, int VECTORS, typename T>
inline void gather_block(const std::vector<const T*>& weight_rows, const std::vector<int64_t>& grad_rows,
                         const std::vector<int64_t>& shifts, const T* const* grads, int64_t m0, T* const* sums) {
  constexpr int64_t L = kLanes<T>;
  Vec<T> acc[CHANNELS][VECTORS] = {};
  for (size_t p = 0; p < shifts.size(); ++p) {
    const int64_t at = m0 - shifts[p];
    Vec<T> w[VECTORS];
    for (int v = 0; v < VECTORS; ++v) w[v] = load(weight_rows[p] + at + v * L);
    for (int c = 0; c < CHANNELS; ++c) {
      const T* g = grads[c] + grad_rows[p] + at;
      for (int v = 0; v < VECTORS; ++v) acc[c][v] += w[v] * load(g + v * L);
    }
  }
  for (int c = 0; c < CHANNELS; ++c) {
    for (int v = 0; v < VECTORS; ++v) store(sums[c] + m0 + v * L, acc[c][v]);
  }
}

template <typename scalar_t>
void backward_input_kernel(const Geometry& geo, const at::Tensor& grad_output, const at::Tensor& weight,
                           at::Tensor& grad_input) {
  using acc_t = at::opmath_type<scalar_t>;
  constexpr int64_t L = kLanes<acc_t>;
  const GatherLayout layout(geo, L);
  const Planes<scalar_t> grad(grad_output);
  const Weight<scalar_t> w(weight);
  scalar_t* result = grad_input.data_ptr<scalar_t>();
  const int64_t cpg = geo.group_channels(), sw = geo.stride_w, taps = geo.taps();
  const int64_t plane = geo.out_h * layout.row;
  at::parallel_for(0, geo.batch * geo.groups, 1, [&](int64_t begin, int64_t end) {
    // The group's grad_output rows, then per grad_input row the weight rows of the taps that
    // reach it, each with its margins; the sums of one grad_input row per channel.
    std::vector<acc_t> grads(cpg * plane), weights(taps * layout.row), sums(cpg * layout.row);
    std::vector<const acc_t*> grad_planes(cpg), weight_rows;
    std::vector<acc_t*> sum_rows(cpg);
    std::vector<int64_t> grad_rows, shifts;
    for (int64_t k = 0; k < cpg; ++k) sum_rows[k] = sums.data() + k * layout.row;
    for (int64_t item = begin; item < end; ++item) {
      const int64_t n = item / geo.groups, g = item % geo.groups;
      for (int64_t k = 0; k < cpg; ++k) {
        grad_planes[k] = grads.data() + k * plane + layout.margin;
        for (int64_t i = 0; i < geo.out_h; ++i) {
          acc_t* row = grads.data() + k * plane + i * layout.row;
          std::fill(row, row + layout.margin, acc_t(0));
          grad.copy_row(n, g * cpg + k, i, geo.out_w, layout.row - layout.margin, row + layout.margin);
        }
      }
      for (int64_t y = 0; y < geo.height; ++y) {
        const int64_t r = y + geo.pad_h;
        // The kernel rows a whose windows read padded row r, from output row i = (r - a dh) / sh.
        std::vector<std::pair<int64_t, int64_t>> reaching;
        for (int64_t a = 0; a < geo.kernel_h; ++a) {
          const int64_t from = r - a * geo.dilation_h;
          if (from >= 0 && from % geo.stride_h == 0 && from / geo.stride_h < geo.out_h) reaching.emplace_back(a, from / geo.stride_h);
        }
        for (size_t e = 0; e < reaching.size(); ++e) {
          const auto [a, i] = reaching[e];
          for (int64_t b = 0; b < geo.kernel_w; ++b) {
            acc_t* row = weights.data() + (e * geo.kernel_w + b) * layout.row;
            std::fill(row, row + layout.margin, acc_t(0));
            w.copy_row(geo, n, g, a, b, i, layout.row - layout.margin, row + layout.margin);
          }
        }
        for (int64_t q = 0; q < sw; ++q) {
          // This phase's grad_input columns x = m * sw + q - pad_w in [0, W).
          const int64_t m_begin = (geo.pad_w - q + sw - 1) / sw, m_end = (geo.width + geo.pad_w - q + sw - 1) / sw;
          if (m_begin >= m_end) continue;
          weight_rows.clear();
          grad_rows.clear();
          shifts.clear();
          for (size_t e = 0; e < reaching.size(); ++e) {
            for (int64_t b = 0; b < geo.kernel_w; ++b) {
              if ((b * geo.dilation_w) % sw != q) continue;
              weight_rows.push_back(weights.data() + (e * geo.kernel_w + b) * layout.row + layout.margin);
              grad_rows.push_back(reaching[e].second * layout.row);
              shifts.push_back(b * geo.dilation_w / sw);
            }
          }
          in_blocks<kChannelBlock>(0, cpg, 1, [&](auto channels, int64_t k) {
            in_blocks<kVectorBlock>(m_begin, m_end, L, [&](auto vectors, int64_t m0) {
              gather_block<decltype(channels)::value, decltype(vectors)::value>(
                  weight_rows, grad_rows, shifts, &grad_planes[k], m0, &sum_rows[k]);
            });
          });
          for (int64_t k = 0; k < cpg; ++k) {
            scalar_t* dst = result + ((n * geo.channels + g * cpg + k) * geo.height + y) * geo.width;
            for (int64_t m = m_begin; m < m_end; ++m) dst[m * sw + q - geo.pad_w] = static_cast<scalar_t>(sum_rows[k][m]);
          }
        }
      }
    }
  });
}

// grad_weight[t][j0 .. j0 + VECTORS * lanes) for TAPS taps from t0: the sum over the group's
// channels of grad_output values times window values, in registers across the channels.
template <int TAPS, int VECTORS, typename T>
inline void backward_weight_block(const T* grad_rows, int64_t padded_width, int64_t channels, int64_t plane,
                                  const T* windows, const int64_t* tap_offset, int64_t j0, T* const* sums) {
  constexpr int64_t L = kLanes<T>;
  Vec<T> acc[TAPS][VECTORS] = {};
  for (int64_t k = 0; k < channels; ++k) {
    Vec<T> g[VECTORS];
    for (int v = 0; v < VECTORS; ++v) g[v] = load(grad_rows + k * padded_width + j0 + v * L);
    const T* x = windows + k * plane + j0;
    for (int t = 0; t < TAPS; ++t) {
      for (int v = 0; v < VECTORS; ++v) acc[t][v] += g[v] * load(x + tap_offset[t] + v * L);
    }
  }
  for (int t = 0; t < TAPS; ++t) {
    for (int v = 0; v < VECTORS; ++v) store(sums[t] + j0 + v * L, acc[t][v]);
  }
}

template <typename scalar_t>
void backward_weight_kernel(const Geometry& geo, const at::Tensor& grad_output, const at::Tensor& input,
                            at::Tensor& grad_weight) {
  using acc_t = at::opmath_type<scalar_t>;
  constexpr int64_t L = kLanes<acc_t>;
  const ScratchLayout<acc_t> layout(geo);
  const Planes<scalar_t> grad(grad_output), x(input);
  scalar_t* result = grad_weight.data_ptr<scalar_t>();
  const int64_t cpg = geo.group_channels(), width = layout.out_w_padded, taps = geo.taps();
  at::parallel_for(0, geo.batch * geo.groups, 1, [&](int64_t begin, int64_t end) {
    std::vector<acc_t> scratch(cpg * layout.plane), grad_rows(cpg * width), sums(taps * width);
    std::vector<acc_t*> sum_rows(taps);
    for (int64_t t = 0; t < taps; ++t) sum_rows[t] = sums.data() + t * width;
    for (int64_t item = begin; item < end; ++item) {
      const int64_t n = item / geo.groups, g = item % geo.groups;
      fill_scratch(geo, layout, x, n, g, scratch.data());
      for (int64_t i = 0; i < geo.out_h; ++i) {
        for (int64_t k = 0; k < cpg; ++k) grad.copy_row(n, g * cpg + k, i, geo.out_w, width, grad_rows.data() + k * width);
        const acc_t* windows = scratch.data() + layout.row(geo, i);
        in_blocks<kTapBlock>(0, taps, 1, [&](auto tap_block, int64_t t) {
          in_blocks<kVectorBlock>(0, width, L, [&](auto vectors, int64_t j0) {
            backward_weight_block<decltype(tap_block)::value, decltype(vectors)::value>(
                grad_rows.data(), width, cpg, layout.plane, windows, &layout.tap_offset[t], j0, &sum_rows[t]);
          });
        });
        for (int64_t t = 0; t < taps; ++t) {
          scalar_t* dst = result + (((n * geo.groups + g) * taps + t) * geo.out_h + i) * geo.out_w;
          for (int64_t j = 0; j < geo.out_w; ++j) dst[j] = static_cast<scalar_t>(sum_rows[t][j]);
        }
      }
    }
  });
}

}  // namespace

at::Tensor involution_forward(const at::Tensor& input, const at::Tensor& weight, at::IntArrayRef stride,
                              at::IntArrayRef padding, at::IntArrayRef dilation) {
  const Geometry geo = make_geometry(input.sizes(), weight.sizes(), stride, padding, dilation);
  at::Tensor out = at::empty({geo.batch, geo.channels, geo.out_h, geo.out_w}, input.options());
  if (out.numel() == 0) return out;
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, input.scalar_type(), "involution_forward",
                                  [&] { forward_kernel<scalar_t>(geo, input, weight, out); });
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
                                  [&] { backward_input_kernel<scalar_t>(geo, grad_output, weight, grad_input); });
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

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("involution_forward", &involution_forward);
  m.def("involution_backward_input", &involution_backward_input);
  m.def("involution_backward_weight", &involution_backward_weight);
}
