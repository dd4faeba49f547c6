// The gradients of involution_generated's generator: grad_feature, grad_span_weight and
// grad_span_bias from the generated weight's gradient gw (N, G * KH * KW, Ho * Wo), which is
// never written to memory. A tile of output rows of one sample is the unit of work: for each
// group its gw block (taps x the tile's pixels, about kTilePixels) is formed in the thread's
// buffer, which stays in cache, and contracted at once:
//
//   grad_feature[n, :, tile]  += S_g^T gw_block          (the tile's own pixels: no other tile writes them)
//   grad_span_weight[g]       += gw_block feature_tile^T (summed per worker)
//   grad_span_bias[g]         += the rows of gw_block     (summed per worker)
//
// The two contractions are register-blocked products (generate_weights, accumulating). Each
// worker sums its tiles in order into its own grad_span_weight and grad_span_bias; the
// workers' sums are then added in the order of their tiles: the same result on every run with
// the same thread count (a different thread count rounds differently, as torch's own parallel
// reductions do).

#include <mutex>
#include <utility>

#include "channel_rows.h"
#include "kernels.h"
#include "weight_sources.h"

namespace oplib_cpu {
namespace {

// Pixels a tile holds: gw's block (49 taps x 128 float) is 25 KB, within a 32 KB L1 beside
// the grad_output rows; whole output rows, so a narrow map takes several.
constexpr int64_t kTilePixels = 128;

template <typename acc_t>
struct GeneratorSums {
  int64_t first_tile;
  std::vector<acc_t> span, bias;
};

}  // namespace

template <typename scalar_t>
void backward_generator(const Geometry& geo, const Planes<scalar_t>& grad, const Planes<scalar_t>& x,
                        const Planes<scalar_t>& feature, const Acc<scalar_t>* span, int64_t reduced,
                        const OutputPlanes<scalar_t>& grad_feature, scalar_t* grad_span, scalar_t* grad_bias) {
  using acc_t = Acc<scalar_t>;
  constexpr int64_t L = kMaxLanes<acc_t>, TB = kGenTaps;
  const int64_t cpg = geo.group_channels(), taps = geo.taps(), groups = geo.groups;
  const int64_t padded_taps = generated_taps(taps), padded_reduced = round_up(reduced, TB);
  const int64_t reduced_columns = round_up(reduced, L);
  const int64_t tile_rows = std::max<int64_t>(1, std::min(kTilePixels / std::max<int64_t>(geo.out_w, 1), geo.out_h));
  const int64_t tiles_per_sample = (geo.out_h + tile_rows - 1) / tile_rows, tiles = geo.batch * tiles_per_sample;
  // gw's block: taps rows of `columns` pixels (whole vectors; zeros past the tile's pixels).
  const int64_t most_pixels = tile_rows * geo.out_w, columns = round_up(most_pixels, L);
  const int64_t in_rows = (tile_rows - 1) * geo.stride_h + (geo.kernel_h - 1) * geo.dilation_h + 1;
  const int64_t in_columns = (geo.out_w - 1) * geo.stride_w + (geo.kernel_w - 1) * geo.dilation_w + 1;
  const std::vector<int64_t> window = window_offsets(geo, in_columns);
  if (tiles == 0 || cpg == 0) {  // no gw: zero gradients
    for (int64_t n = 0; n < geo.batch; ++n) {
      for (int64_t r = 0; r < reduced; ++r) {
        for (int64_t i = 0; i < geo.out_h; ++i) {
          for (int64_t j = 0; j < geo.out_w; ++j) grad_feature.at(n, r, i)[j * grad_feature.stride_w] = scalar_t(0);
        }
      }
    }
    std::fill(grad_span, grad_span + groups * taps * reduced, scalar_t(0));
    std::fill(grad_bias, grad_bias + groups * taps, scalar_t(0));
    return;
  }

  // Per group, S_g^T packed for generate_weights: row r (reduced channel) by tap t, channel
  // r0 + u of tap t at (r0 * taps) + t * TB + u, zero past R.
  std::vector<acc_t> span_t(groups * padded_reduced * taps, acc_t(0));
  for (int64_t g = 0; g < groups; ++g) {
    for (int64_t t = 0; t < taps; ++t) {
      for (int64_t r = 0; r < reduced; ++r) {
        span_t[(g * padded_reduced + r / TB * TB) * taps + t * TB + r % TB] = span[(g * taps + t) * reduced + r];
      }
    }
  }

  std::mutex sums_lock;
  std::vector<GeneratorSums<acc_t>> worker_sums;
  with_lanes<acc_t>(cpg, [&](auto lanes) {
    constexpr int LANES = decltype(lanes)::value;
    parallel_items(tiles, geo.threads, [&](int64_t begin, int64_t end) {
      std::vector<acc_t> xs(in_rows * in_columns * cpg), gs((columns + LANES) * cpg, acc_t(0));
      std::vector<acc_t> gw(padded_taps * columns, acc_t(0)), packed(padded_taps * most_pixels);
      std::vector<acc_t> features(most_pixels * reduced_columns, acc_t(0)), sums(padded_reduced * columns);
      GeneratorSums<acc_t> mine{begin, std::vector<acc_t>(groups * padded_taps * reduced_columns, acc_t(0)),
                                std::vector<acc_t>(groups * taps, acc_t(0))};
      std::vector<int64_t> window_start(columns + LANES);
      const acc_t* windows[LANES];
      for (int64_t tile = begin; tile < end; ++tile) {
        const int64_t n = tile / tiles_per_sample, first = tile % tiles_per_sample * tile_rows;
        const int64_t rows = std::min(tile_rows, geo.out_h - first), pixels = rows * geo.out_w;
        // Windows in the tile's input rows; past the pixels, the last one's again (their
        // grad_output is zero, so are their sums).
        window_starts(geo, pixels, in_columns, window_start);
        // The tile's feature, transposed: pixel p's R channels side by side (zeros past R).
        for (int64_t r = 0; r < reduced; ++r) {
          for (int64_t i = 0; i < rows; ++i) {
            const scalar_t* from = feature.at(n, r, first + i);
            for (int64_t j = 0; j < geo.out_w; ++j) {
              features[(i * geo.out_w + j) * reduced_columns + r] = static_cast<acc_t>(from[j * feature.stride_w]);
            }
          }
        }
        std::fill(sums.begin(), sums.end(), acc_t(0));
        for (int64_t g = 0; g < groups; ++g) {
          fill_channel_rows<LANES>(x, n, g * cpg, cpg, geo.height, geo.width, in_rows, in_columns,
                                   geo.pad_h - first * geo.stride_h, geo.pad_w, true, xs.data());
          fill_channel_rows<LANES>(grad, n, g * cpg, cpg, geo.out_h, geo.out_w, rows, geo.out_w, -first, 0, true, gs.data());
          std::fill(gs.begin() + pixels * cpg, gs.end(), acc_t(0));
          // gw's block, LANES pixels at a time, every tap.
          for (int64_t p0 = 0; p0 < columns; p0 += LANES) {
            for (int c = 0; c < LANES; ++c) windows[c] = xs.data() + window_start[p0 + c];
            const acc_t* block = gs.data() + p0 * cpg;
            weight_grad_lanes<LANES, false>(block, windows, window.data(), taps, cpg, gw.data() + p0, columns);
          }
          // grad_span_bias: the rows of the block.
          acc_t* bias_sums = mine.bias.data() + g * taps;
          for (int64_t t = 0; t < taps; ++t) {
            acc_t total = 0;
            for (int64_t p = 0; p < pixels; ++p) total += gw[t * columns + p];
            bias_sums[t] += total;
          }
          // grad_feature: sums (R x columns) += S_g^T gw.
          generate_weights<true>(span_t.data() + g * padded_reduced * taps, static_cast<const acc_t*>(nullptr), padded_reduced,
                                 taps, gw.data(), columns, columns, sums.data(), columns);
          // grad_span_weight: (padded taps x R) += gw features^T, gw packed by blocks of TB taps
          // (rows past the taps are zero in gw).
          for (int64_t t0 = 0; t0 < padded_taps; t0 += TB) {
            acc_t* to = packed.data() + t0 * pixels;
            for (int64_t p = 0; p < pixels; ++p) {
              for (int64_t u = 0; u < TB; ++u) to[p * TB + u] = gw[(t0 + u) * columns + p];
            }
          }
          generate_weights<true>(packed.data(), static_cast<const acc_t*>(nullptr), padded_taps, pixels, features.data(),
                                 reduced_columns, reduced_columns, mine.span.data() + g * padded_taps * reduced_columns,
                                 reduced_columns);
        }
        for (int64_t r = 0; r < reduced; ++r) {
          for (int64_t i = 0; i < rows; ++i) {
            scalar_t* to = grad_feature.at(n, r, first + i);
            const acc_t* from = sums.data() + r * columns + i * geo.out_w;
            for (int64_t j = 0; j < geo.out_w; ++j) to[j * grad_feature.stride_w] = static_cast<scalar_t>(from[j]);
          }
        }
      }
      const std::lock_guard<std::mutex> hold(sums_lock);
      worker_sums.push_back(std::move(mine));
    });
  });
  // The workers' sums in the order of their tiles.
  std::sort(worker_sums.begin(), worker_sums.end(), [](const auto& a, const auto& b) { return a.first_tile < b.first_tile; });
  std::vector<acc_t> span_total(groups * padded_taps * reduced_columns, acc_t(0)), bias_total(groups * taps, acc_t(0));
  for (const auto& sums : worker_sums) {
    for (size_t k = 0; k < span_total.size(); ++k) span_total[k] += sums.span[k];
    for (size_t k = 0; k < bias_total.size(); ++k) bias_total[k] += sums.bias[k];
  }
  for (int64_t g = 0; g < groups; ++g) {
    for (int64_t t = 0; t < taps; ++t) {
      for (int64_t r = 0; r < reduced; ++r) {
        grad_span[(g * taps + t) * reduced + r] = static_cast<scalar_t>(span_total[(g * padded_taps + t) * reduced_columns + r]);
      }
      grad_bias[g * taps + t] = static_cast<scalar_t>(bias_total[g * taps + t]);
    }
  }
}

#define OPLIB_INSTANTIATE(T)                                                                                            \
  template void backward_generator<T>(const Geometry&, const Planes<T>&, const Planes<T>&, const Planes<T>&, const Acc<T>*, \
                                      int64_t, const OutputPlanes<T>&, T*, T*);
OPLIB_FOR_EACH_DTYPE(OPLIB_INSTANTIATE)

}  // namespace oplib_cpu
