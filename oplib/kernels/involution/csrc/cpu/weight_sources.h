// Weight sources of the forward and grad_input kernels: the stored weight tensor, or weights
// generated from the kernel-generation branch's feature map (involution_generated).

#pragma once

#include "channel_rows.h"

namespace oplib_cpu {

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
// ACCUMULATE: dst += the sums (bias unused), the same register-blocked product for the
// generator's gradients (backward_generator.cpp).
template <int VB, bool ACCUMULATE, typename T>
inline void generate_block(const T* packed, const T* bias, int64_t taps, int64_t reduced, const T* f, int64_t f_stride,
                           T* dst, int64_t dst_stride) {
  constexpr int L = kMaxLanes<T>, TB = kGenTaps;
  using V = typename Lanes<T, L>::type;
  for (int64_t t = 0; t < taps; t += TB) {
    V acc[TB][VB];
    for (int u = 0; u < TB; ++u) {
      for (int v = 0; v < VB; ++v) {
        if constexpr (ACCUMULATE) {
          acc[u][v] = load_lanes<V>(dst + (t + u) * dst_stride + v * L);
        } else {
          acc[u][v] = V{} + bias[t + u];
        }
      }
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

template <bool ACCUMULATE = false, typename T>
void generate_weights(const T* packed, const T* bias, int64_t taps, int64_t reduced, const T* f, int64_t f_stride,
                      int64_t columns, T* dst, int64_t dst_stride) {
  constexpr int64_t L = kMaxLanes<T>;
  int64_t j0 = 0;
  for (; j0 + kGenVectors * L <= columns; j0 += kGenVectors * L) {
    generate_block<kGenVectors, ACCUMULATE>(packed, bias, taps, reduced, f + j0, f_stride, dst + j0, dst_stride);
  }
  for (; j0 < columns; j0 += L) generate_block<1, ACCUMULATE>(packed, bias, taps, reduced, f + j0, f_stride, dst + j0, dst_stride);
}

// The generator of involution_generated: the feature map (N, R, Ho, Wo) of any strides, and
// per group its packed span rows and bias (generate_weights' layouts, zero past the taps).
template <typename scalar_t>
struct Generator {
  using acc_t = Acc<scalar_t>;
  Planes<scalar_t> feature;
  int64_t reduced, taps;
  std::vector<acc_t> packed, bias;

  Generator(const GeneratorOperands<scalar_t>& operands, int64_t groups, int64_t kernel_taps)
      : feature(operands.feature), reduced(operands.reduced), taps(kernel_taps) {
    const int64_t padded = generated_taps(taps);
    packed.assign(groups * padded * reduced, acc_t(0));
    bias.assign(groups * padded, acc_t(0));
    for (int64_t g = 0; g < groups; ++g) {
      for (int64_t t = 0; t < taps; ++t) {
        const int64_t block = g * padded + t / kGenTaps * kGenTaps;
        for (int64_t r = 0; r < reduced; ++r) {
          packed[block * reduced + r * kGenTaps + t % kGenTaps] = operands.span[(g * taps + t) * reduced + r];
        }
        bias[g * padded + t] = operands.bias[g * taps + t];
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
// start(n, g) selects a pair and row(i) returns output row i's weights, tap t of output j at
// row(i) + t * tap_stride() + j (readable kPixelBlock - 1 outputs past Wo), or, where
// pixel_major(), at row(i) + t + j * tap_stride().
template <typename scalar_t>
struct StoredWeight {
  using acc_t = Acc<scalar_t>;
  Weight<scalar_t> weight;

  struct Rows {
    const Weight<scalar_t>& w;
    const Geometry& geo;
    std::vector<acc_t> copy;
    const acc_t* planes = nullptr;
    // The weight a channels_last model's span convolution writes, (N, Ho, Wo, G, KH, KW) in
    // memory, is read in place, each output's taps adjacent, where no row ends in a partial
    // block (whose reads past Wo would leave the tensor at the last row); else a copy.
    const bool in_place_pixel_major = std::is_same_v<scalar_t, acc_t> && geo.out_w % kPixelBlock == 0 &&
                                      w.stride[3] == 1 && w.stride[2] == geo.kernel_w && w.stride[5] >= geo.taps();

    void start(int64_t n, int64_t g) {
      if (in_place_pixel_major) {
        if constexpr (std::is_same_v<scalar_t, acc_t>) planes = w.row(n, g, 0, 0, 0);
        return;
      }
      // The last block of a row reads weights past Wo (its extra sums are dropped): the
      // tensor itself only where no row has such a block.
      planes = w.planes(geo, n, g, geo.out_w % kPixelBlock == 0, kPixelBlock, copy);
    }
    bool pixel_major() const { return in_place_pixel_major; }
    // Pixel-major: the stride between outputs; else between taps.
    int64_t tap_stride() const { return in_place_pixel_major ? w.stride[5] : geo.out_h * geo.out_w; }
    const acc_t* row(int64_t i) const {
      if (in_place_pixel_major) {
        if (i + 1 < geo.out_h) prefetch_rows(planes + (i + 1) * w.stride[4], geo.out_w, w.stride[5], geo.taps());
        return planes + i * w.stride[4];
      }
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
  using acc_t = Acc<scalar_t>;
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
    bool pixel_major() const { return false; }
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

}  // namespace oplib_cpu
