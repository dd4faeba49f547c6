// The span 1x1 convolution of Involution2d as a tiled kernel: the weights the kernel generator
// forms for a tile of pixels, written out. The first stage of the tiled involution kernels
// (which will keep these weights in shared memory instead), and the kernel that proves the host
// emulation runs what they need: dynamic shared memory, barriers, shuffles, tensor cores.
//
//   weight[n, k, p] = bias[k] + sum_r span_weight[k, r] * feature[n, r, p]
//
// feature: (N, R, Ho, Wo), span_weight: (rows, R) with rows = G*KH*KW, bias: (rows),
// weight: (N, rows, Ho, Wo), all contiguous; p runs over the plane of Ho*Wo pixels.
//
// A block of SPAN_TILE_WARPS warps (32 x SPAN_TILE_WARPS threads) computes SPAN_TILE_PIXELS
// pixels x SPAN_TILE_ROWS rows of one sample (grid: pixel tiles x row tiles x samples), the
// product (pixels x R) (R x rows) with the bias as its start, taking R SPAN_TILE_REDUCED at a
// time: the block stages a chunk of the feature and of span_weight in shared memory, then
//   - float16, bfloat16: warp w multiplies the 16 x 16 corner of pixels 16 (w % 4) and rows
//     16 (w / 4) on tensor cores (two m16n8k16, float accumulators);
//   - float32, float64: a thread owns 4 rows x 4 pixels, summed with FMAs over the chunk's
//     even r in lanes 0-15 and its odd r in lanes 16-31; a shuffle adds the two halves.
// The sums pass through shared memory, so that the stores run along pixels.
//
// Dynamic shared memory (the host's span_tile_shared_bytes is its size):
//   feature chunk  SPAN_TILE_PIXELS x Tile::stride words             [pixel][r]
//   span chunk     SPAN_TILE_ROWS x Tile::stride words               [row][r]
//   sums           SPAN_TILE_ROWS x SPAN_TILE_SUMS_STRIDE accumulators  [row][pixel]
// where float16/bfloat16 values sit in pairs of consecutive r, a 32-bit word each, as the
// tensor-core fragments take them. Past R, the plane or the rows, the chunks hold zeros.

#include "tile.cuh"

constexpr int SPAN_TILE_WARPS = 8;
constexpr int SPAN_TILE_THREADS = 256;
constexpr int SPAN_TILE_PIXELS = 64;
constexpr int SPAN_TILE_ROWS = 32;
constexpr int SPAN_TILE_REDUCED = 16;
// Row lengths of the staged chunks in shared memory, in values. 16-bit values: with 24, the 32
// words of a fragment load (8 rows x 4 words) fall in 32 different banks. float and double
// (SPAN_TILE_FMA_STRIDE): with 34, the 16 pixels x 2 r a warp's FMA lanes read do; double
// takes the smallest odd length (its rows are twice as long in shared memory).
constexpr int SPAN_TILE_STRIDE = 24;
constexpr int SPAN_TILE_FMA_STRIDE = 34;
constexpr int SPAN_TILE_FMA64_STRIDE = 17;
constexpr int SPAN_TILE_SUMS_STRIDE = 68;

static_assert(SPAN_TILE_THREADS == 32 * SPAN_TILE_WARPS, "a block is SPAN_TILE_WARPS whole warps");
static_assert(SPAN_TILE_PIXELS == 4 * 16 && SPAN_TILE_ROWS == 2 * 16 && SPAN_TILE_WARPS == 4 * 2,
              "the warps cover the tile in 4 x 2 corners of 16 x 16, or 8 x 4 rows");

// float and double: values staged as they are, multiplied with FMAs.
template <typename scalar_t>
struct SpanTile {
    typedef typename Element<scalar_t>::acc_t acc_t;
    typedef scalar_t word_t;
    static constexpr int values_per_word = 1;
    static constexpr int stride = sizeof(scalar_t) == 8 ? SPAN_TILE_FMA64_STRIDE : SPAN_TILE_FMA_STRIDE;  // values a staged row

    // values[0] if it lies inside the tensor (count > 0), else zero.
    static __device__ __forceinline__ scalar_t read(const scalar_t* values, index_t step, int count) {
        (void)step;
        return count > 0 ? Element<scalar_t>::load(values) : (scalar_t)0;
    }

    // sums[i][j]: row 4 warp + i, pixel (lane % 16) + 16 j of the tile, over this half-warp's r.
    acc_t sums[4][4];

    __device__ __forceinline__ SpanTile(const scalar_t* bias, int row0, int rows) {
        const int row = row0 + 4 * threadIdx.y;
        const bool first_half = threadIdx.x < 16;  // the bias is added once, by the even-r half
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const acc_t start = first_half && row + i < rows ? Element<scalar_t>::load(bias + row + i) : (acc_t)0;
#pragma unroll
            for (int j = 0; j < 4; ++j) sums[i][j] = start;
        }
    }

    __device__ __forceinline__ void add(const scalar_t* feature, const scalar_t* span) {
        const int column = threadIdx.x % 16, row = 4 * threadIdx.y;
#pragma unroll
        for (int r = threadIdx.x / 16; r < SPAN_TILE_REDUCED; r += 2) {
            acc_t f[4], s[4];
#pragma unroll
            for (int j = 0; j < 4; ++j) f[j] = feature[(column + 16 * j) * stride + r];
#pragma unroll
            for (int i = 0; i < 4; ++i) s[i] = span[(row + i) * stride + r];
#pragma unroll
            for (int i = 0; i < 4; ++i) {
#pragma unroll
                for (int j = 0; j < 4; ++j) sums[i][j] = oplib_fma(s[i], f[j], sums[i][j]);
            }
        }
    }

    // The two halves' sums added (lane l and l + 16 hold the same pixels), written by the first.
    __device__ __forceinline__ void store(acc_t* tile) {
        const int column = threadIdx.x % 16, row = 4 * threadIdx.y;
#pragma unroll
        for (int i = 0; i < 4; ++i) {
#pragma unroll
            for (int j = 0; j < 4; ++j) {
                const acc_t sum = oplib_warp_sum<16, 16>(sums[i][j]);
                if (threadIdx.x < 16) tile[(row + i) * SPAN_TILE_SUMS_STRIDE + column + 16 * j] = sum;
            }
        }
    }
};

// float16 and bfloat16: values staged in pairs, multiplied on tensor cores.
template <typename half_t>
struct SpanTileMma {
    typedef float acc_t;
    typedef unsigned int word_t;
    static constexpr int values_per_word = 2;
    static constexpr int stride = SPAN_TILE_STRIDE / 2;  // words

    // values[0] and values[step], each if it lies inside the tensor (count > 0, > 1), else zero.
    static __device__ __forceinline__ unsigned int read(const half_t* values, index_t step, int count) {
        return oplib_load_pair(reinterpret_cast<const unsigned short*>(values), step, count);
    }

    // sums[h]: pixels 16 (warp % 4) + m x rows 16 (warp / 4) + 8 h + n, as a C fragment.
    OplibFragmentC sums[2];

    __device__ __forceinline__ SpanTileMma(const half_t* bias, int row0, int rows) {
        const int quad = oplib_lane() % 4;
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            // This lane's columns n are the rows 2 quad and 2 quad + 1 of the corner's half h.
            const int row = row0 + 16 * (threadIdx.y / 4) + 8 * h + 2 * quad;
            const float even = row < rows ? Element<half_t>::load(bias + row) : 0.0f;
            const float odd = row + 1 < rows ? Element<half_t>::load(bias + row + 1) : 0.0f;
            sums[h].value[0] = sums[h].value[2] = even;
            sums[h].value[1] = sums[h].value[3] = odd;
        }
    }

    __device__ __forceinline__ void add(const unsigned int* feature, const unsigned int* span) {
        const OplibFragmentA a = oplib_load_fragment_a(feature + 16 * (threadIdx.y % 4) * stride, stride);
        OplibFragmentB b[2];
        oplib_load_fragments_b(span + 16 * (threadIdx.y / 4) * stride, stride, 8 * stride, b[0], b[1]);
#pragma unroll
        for (int h = 0; h < 2; ++h) oplib_mma<half_t>(sums[h], a, b[h]);
    }

    __device__ __forceinline__ void store(float* tile) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            float* corner = tile + (16 * (threadIdx.y / 4) + 8 * h) * SPAN_TILE_SUMS_STRIDE + 16 * (threadIdx.y % 4);
            oplib_store_fragment_c(sums[h], corner, 1, SPAN_TILE_SUMS_STRIDE);  // D (pixel m, row n)
        }
    }
};

template <>
struct SpanTile<oplib_half> : SpanTileMma<oplib_half> {
    using SpanTileMma<oplib_half>::SpanTileMma;
};

template <>
struct SpanTile<oplib_bfloat16> : SpanTileMma<oplib_bfloat16> {
    using SpanTileMma<oplib_bfloat16>::SpanTileMma;
};

// Rows [0, ROWS) of a span chunk staged from span_weight's rows at `rows_from` (R values apart),
// values r0 ... r0 + SPAN_TILE_REDUCED - 1 of each: zeros past `valid` rows and past R.
// Consecutive threads read consecutive r: a thread keeps one word of the chunk's rows and moves
// down them, a pass of the block's threads at a time.
template <int ROWS, typename Tile, typename scalar_t>
__device__ __forceinline__ void stage_span_rows(typename Tile::word_t* chunk, const scalar_t* rows_from, int valid,
                                                int reduced, int r0, int thread) {
    constexpr int per_word = Tile::values_per_word, chunk_words = SPAN_TILE_REDUCED / per_word;
    constexpr int pass_rows = SPAN_TILE_THREADS / chunk_words;
    static_assert(SPAN_TILE_THREADS % chunk_words == 0 && ROWS % pass_rows == 0, "whole passes of the block");
    const int word = thread % chunk_words, first_row = thread / chunk_words;
    const int r = r0 + word * per_word;
    const scalar_t* first = rows_from + (index_t)first_row * reduced + r;
#pragma unroll
    for (int pass = 0; pass < ROWS / pass_rows; ++pass) {
        const int row = first_row + pass * pass_rows;
        chunk[row * Tile::stride + word] =
            Tile::read(first + (index_t)(pass * pass_rows) * reduced, 1, row < valid ? reduced - r : 0);
    }
}

// Block (32, SPAN_TILE_WARPS); grid (pixel tiles, row tiles, N).
template <typename scalar_t>
__global__ void __launch_bounds__(SPAN_TILE_THREADS, 2) involution_span_tile(
    const scalar_t* __restrict__ feature, const scalar_t* __restrict__ span_weight, const scalar_t* __restrict__ bias,
    scalar_t* __restrict__ weight, index_t plane, int reduced, int rows) {
    typedef SpanTile<scalar_t> Tile;
    typedef typename Tile::word_t word_t;
    typedef typename Tile::acc_t acc_t;
    constexpr int per_word = Tile::values_per_word;
    constexpr int stride = Tile::stride;  // words per row of a staged chunk
    constexpr int chunk_words = SPAN_TILE_REDUCED / per_word;
    OPLIB_DYNAMIC_SHARED(unsigned char, shared);
    word_t* feature_chunk = reinterpret_cast<word_t*>(shared);
    word_t* span_chunk = feature_chunk + SPAN_TILE_PIXELS * stride;
    acc_t* sums = reinterpret_cast<acc_t*>(span_chunk + SPAN_TILE_ROWS * stride);

    const int thread = threadIdx.x + 32 * threadIdx.y;
    const index_t pixel0 = (index_t)blockIdx.x * SPAN_TILE_PIXELS;
    const int row0 = blockIdx.y * SPAN_TILE_ROWS;
    const scalar_t* sample = feature + (index_t)blockIdx.z * reduced * plane;
    Tile tile(bias, row0, rows);
    for (int r0 = 0; r0 < reduced; r0 += SPAN_TILE_REDUCED) {
        // Consecutive threads read consecutive pixels of the feature, consecutive r of span_weight.
        for (int i = thread; i < SPAN_TILE_PIXELS * chunk_words; i += SPAN_TILE_THREADS) {
            const int pixel = i % SPAN_TILE_PIXELS, word = i / SPAN_TILE_PIXELS;
            const int r = r0 + word * per_word;
            const index_t p = pixel0 + pixel;
            feature_chunk[pixel * stride + word] = Tile::read(sample + r * plane + p, plane, p < plane ? reduced - r : 0);
        }
        stage_span_rows<SPAN_TILE_ROWS, Tile>(span_chunk, span_weight + (index_t)row0 * reduced, rows - row0, reduced, r0,
                                              thread);
        __syncthreads();  // the chunk is staged
        tile.add(feature_chunk, span_chunk);
        __syncthreads();  // every warp is done with the chunk
    }
    tile.store(sums);
    __syncthreads();  // every warp's sums are in place
    scalar_t* out = weight + (index_t)blockIdx.z * rows * plane;
    for (int i = thread; i < SPAN_TILE_ROWS * SPAN_TILE_PIXELS; i += SPAN_TILE_THREADS) {
        const int row = i / SPAN_TILE_PIXELS, pixel = i % SPAN_TILE_PIXELS;
        const int k = row0 + row;
        const index_t p = pixel0 + pixel;
        if (k < rows && p < plane) out[(index_t)k * plane + p] = Element<scalar_t>::store(sums[row * SPAN_TILE_SUMS_STRIDE + pixel]);
    }
}

// ---------------------------------------------------------------------------------------
// involution_generated's forward as a tiled kernel: the weights of a tile formed as above, kept
// in shared memory and used at once
// ---------------------------------------------------------------------------------------
//
//   out[n, c, i, j] = sum_{a, b} weight(n, g(c), a*KW + b, i, j) * input[n, c, i*sh - ph + a*dh, j*sw - pw + b*dw]
//
// with weight as in involution_span_tile (span rows g*T ... g*T + T - 1 of group g, T = KH*KW
// taps, at most GEN_TILE_TAPS). input: (N, C, H, W), out: (N, C, Ho, Wo) and feature (N, R, Ho,
// Wo) of any strides (NCHW or channels_last); span_weight (G*T, R) and bias (G*T) contiguous.
//
// A block of SPAN_TILE_WARPS warps takes GEN_TILE_H x GEN_TILE_W output pixels (SPAN_TILE_PIXELS)
// of one (sample, group) (grid: pixel tiles x groups x samples):
//   1. the tile's T weights per pixel, two SpanTiles of SPAN_TILE_ROWS taps each, into shared
//      memory (`weights`, [tap][pixel]): each weight is formed once, and never leaves the chip;
//   2. per chunk of GEN_TILE_CHANNELS of the group's channels, the input rows the tile's windows
//      read, halo and all, staged in shared memory ([pixel][channel], zeros outside the image),
//      then four sets of threads each sum a share of the kernel rows, a thread 4 pixels x 4
//      channels in registers (acc_t: a weight read once for 4 channels, at stride 1 an input
//      column once for the 4 pixels); the sets' partial sums are added in set order through
//      shared memory and written.
// No atomics, every sum in a fixed order: deterministic.
//
// Specialised instantiations: a square window of KERNEL taps a side at equal strides STRIDE and
// no dilation (RedNet's 7x7 at stride 1 or 2, and 3x3 and 5x5), whose sizes are then constants:
// the input window's rows and columns, the staging loops' steps, the tap loops (unrolled).
// KERNEL = STRIDE = 0 reads the window from the arguments and serves every other geometry (the
// host picks). Both add every sum's terms in the same order, so they give the same bits.
//
// The instantiations a host may ask for (oplib.kernels reads these lines):
// oplib-instantiate: involution_generated_tile
// oplib-template: KERNEL, STRIDE = 0, 0 | 3, 1 | 3, 2 | 5, 1 | 5, 2 | 7, 1 | 7, 2
//
// Dynamic shared memory (the host's generated_tile_shared_bytes is its size), two regions:
//   staging  the span product's chunks (as involution_span_tile), then, once the weights are
//            formed, the input chunk: in_h rows of (in_w | 1) pixels x GEN_TILE_IN_STRIDE accumulators
//   weights  GEN_TILE_TAPS x SPAN_TILE_SUMS_STRIDE accumulators (float for 16-bit values)
//   partials GEN_TILE_SETS x GEN_TILE_CHANNELS x GEN_TILE_PARTIAL_STRIDE accumulators

constexpr int GEN_TILE_H = 8;
constexpr int GEN_TILE_W = 8;
constexpr int GEN_TILE_TAPS = 64;  // two SpanTiles
constexpr int GEN_TILE_CHANNELS = 16;
// The aggregation's threads: GEN_TILE_SETS sets of GEN_TILE_SET_THREADS, each set a share of
// the kernel rows; a thread sums GEN_TILE_RUN consecutive pixels of a tile row x
// GEN_TILE_THREAD_CHANNELS channels of the chunk.
constexpr int GEN_TILE_SETS = 4;
constexpr int GEN_TILE_SET_THREADS = 64;
constexpr int GEN_TILE_RUN = 4;
constexpr int GEN_TILE_THREAD_CHANNELS = 4;
// A thread's channels lie this far apart in the chunk (first, first + step, ...).
constexpr int GEN_TILE_CHANNEL_STEP = GEN_TILE_CHANNELS / GEN_TILE_THREAD_CHANNELS;
// A channel's partial sums (the tile's pixels), one more: the sets' stores fall in more banks.
constexpr int GEN_TILE_PARTIAL_STRIDE = 65;
// A staged pixel's values (the chunk's channels and 4 unused), and a staged row's pixels (the
// window's, rounded up to an odd count): with a thread's channels 4 apart, the 32 lanes of an
// aggregation load fall in 32 different banks.
constexpr int GEN_TILE_IN_STRIDE = 20;

static_assert(GEN_TILE_TAPS == 2 * SPAN_TILE_ROWS && GEN_TILE_IN_STRIDE >= GEN_TILE_CHANNELS, "as said");
static_assert(GEN_TILE_H * GEN_TILE_W == SPAN_TILE_PIXELS, "a tile's pixels are the span product's");
static_assert(GEN_TILE_SETS * GEN_TILE_SET_THREADS == SPAN_TILE_THREADS &&
              GEN_TILE_SET_THREADS * GEN_TILE_RUN * GEN_TILE_THREAD_CHANNELS == SPAN_TILE_PIXELS * GEN_TILE_CHANNELS &&
              GEN_TILE_W % GEN_TILE_RUN == 0 && GEN_TILE_PARTIAL_STRIDE > SPAN_TILE_PIXELS,
              "each set of threads covers the tile's pixels x a channel chunk");

// The GEN_TILE_RUN weights of a thread's pixels (consecutive, 16-byte aligned) by 16-byte loads.
template <typename weight_t>
__device__ __forceinline__ void load_run(const weight_t* from, weight_t (&to)[GEN_TILE_RUN]) {
    typedef Vector16<weight_t> V;
    static_assert(GEN_TILE_RUN % V::lanes == 0, "whole vectors");
#pragma unroll
    for (int v = 0; v < GEN_TILE_RUN / V::lanes; ++v) {
        const V vector = reinterpret_cast<const V*>(from)[v];
#pragma unroll
        for (int l = 0; l < V::lanes; ++l) to[v * V::lanes + l] = vector.lane[l];
    }
}

// One kernel row's taps of a thread's GEN_TILE_RUN pixels x GEN_TILE_THREAD_CHANNELS channels
// (channels GEN_TILE_CHANNEL_STEP apart in `row`, the staged row at the thread's first channel) at
// column stride S and no dilation: tap b of pixel px0 + j reads column S (px0 + j) + b, so
// window[q] holds the columns of the taps b = q (mod S) and moves by one pixel every S taps:
// each staged value is read once for all the pixels it serves.
template <int S, typename acc_t, typename weight_t>
__device__ __forceinline__ void slide_row(const acc_t* row, const weight_t* tap_weights, int px0, int kernel_w,
                                          acc_t (&sums)[GEN_TILE_RUN][GEN_TILE_THREAD_CHANNELS]) {
    acc_t window[S][GEN_TILE_RUN][GEN_TILE_THREAD_CHANNELS];
#pragma unroll
    for (int q = 0; q < S; ++q) {
        if (q >= kernel_w) break;
#pragma unroll
        for (int j = 0; j < GEN_TILE_RUN; ++j) {
#pragma unroll
            for (int k = 0; k < GEN_TILE_THREAD_CHANNELS; ++k) {
                window[q][j][k] = row[(S * (px0 + j) + q) * GEN_TILE_IN_STRIDE + k * GEN_TILE_CHANNEL_STEP];
            }
        }
    }
#pragma unroll
    for (int b0 = 0; b0 < kernel_w; b0 += S) {
#pragma unroll
        for (int q = 0; q < S; ++q) {
            const int b = b0 + q;
            if (b >= kernel_w) break;
            if (b0 > 0) {
#pragma unroll
                for (int j = 0; j + 1 < GEN_TILE_RUN; ++j) {
#pragma unroll
                    for (int k = 0; k < GEN_TILE_THREAD_CHANNELS; ++k) window[q][j][k] = window[q][j + 1][k];
                }
#pragma unroll
                for (int k = 0; k < GEN_TILE_THREAD_CHANNELS; ++k) {
                    window[q][GEN_TILE_RUN - 1][k] = row[(S * (px0 + GEN_TILE_RUN - 1) + b) * GEN_TILE_IN_STRIDE + k * GEN_TILE_CHANNEL_STEP];
                }
            }
            weight_t weight[GEN_TILE_RUN];
            load_run(tap_weights + b * SPAN_TILE_SUMS_STRIDE, weight);
#pragma unroll
            for (int j = 0; j < GEN_TILE_RUN; ++j) {
#pragma unroll
                for (int k = 0; k < GEN_TILE_THREAD_CHANNELS; ++k) {
                    sums[j][k] = oplib_fma((acc_t)weight[j], window[q][j][k], sums[j][k]);
                }
            }
        }
    }
}

// Whether 0 <= value < size, in one comparison: a negative value wraps past every size.
__device__ __forceinline__ bool within(int value, int size) { return (unsigned int)value < (unsigned int)size; }

// Block (32, SPAN_TILE_WARPS); grid (tiles_h * tiles_w, groups, N).
template <typename scalar_t, int KERNEL, int STRIDE>
__global__ void __launch_bounds__(SPAN_TILE_THREADS, 2) involution_generated_tile(
    const scalar_t* __restrict__ input, const scalar_t* __restrict__ feature, const scalar_t* __restrict__ span_weight,
    const scalar_t* __restrict__ bias, scalar_t* __restrict__ out, int channels, int height, int width, int groups,
    int kernel_h, int kernel_w, int out_h, int out_w, int stride_h, int stride_w, int pad_h, int pad_w, int dilation_h,
    int dilation_w, int reduced, int tiles_w, index_t input_n, index_t input_c, index_t input_h, index_t input_w,
    index_t out_n, index_t out_c, index_t out_hs, index_t out_ws, index_t feature_n, index_t feature_c,
    index_t feature_h, index_t feature_w, bool channels_last) {
    typedef SpanTile<scalar_t> Tile;
    typedef typename Tile::word_t word_t;
    typedef typename Tile::acc_t weight_t;
    typedef typename Element<scalar_t>::acc_t acc_t;
    constexpr int per_word = Tile::values_per_word;
    constexpr int stride = Tile::stride;
    constexpr int chunk_words = SPAN_TILE_REDUCED / per_word;
    const TileGeometry<KERNEL, STRIDE> geometry(kernel_h, kernel_w, stride_h, stride_w, dilation_h, dilation_w);
    const int taps = geometry.kernel_h * geometry.kernel_w, group_channels = channels / groups;
    const int in_h = (GEN_TILE_H - 1) * geometry.stride_h + (geometry.kernel_h - 1) * geometry.dilation_h + 1;
    const int in_w = (GEN_TILE_W - 1) * geometry.stride_w + (geometry.kernel_w - 1) * geometry.dilation_w + 1;
    const int chunk_bytes = 2 * SPAN_TILE_PIXELS * stride * (int)sizeof(word_t);
    const int in_row = in_w | 1;
    const int input_bytes = in_h * in_row * GEN_TILE_IN_STRIDE * (int)sizeof(acc_t);
    const int staging_bytes = chunk_bytes > input_bytes ? chunk_bytes : input_bytes;
    OPLIB_DYNAMIC_SHARED(unsigned char, shared);
    word_t* feature_chunk = reinterpret_cast<word_t*>(shared);
    word_t* span_chunk = feature_chunk + SPAN_TILE_PIXELS * stride;
    acc_t* staged = reinterpret_cast<acc_t*>(shared);
    weight_t* weights = reinterpret_cast<weight_t*>(shared + (staging_bytes + 15) / 16 * 16);

    const int thread = threadIdx.x + 32 * threadIdx.y;
    const int tile_y = blockIdx.x / tiles_w, tile_x = blockIdx.x % tiles_w;
    const int out_y0 = tile_y * GEN_TILE_H, out_x0 = tile_x * GEN_TILE_W;
    const int group = blockIdx.y;
    const index_t n = blockIdx.z;

    // 1. The tile's weights: (pixels x R) (R x taps) + bias, R a chunk at a time.
    const scalar_t* group_bias = bias + (index_t)group * taps;
    Tile low(group_bias, 0, taps), high(group_bias, SPAN_TILE_ROWS, taps);
    const scalar_t* sample_feature = feature + n * feature_n;
    // A thread stages feature_passes words of each chunk, consecutive threads consecutive values:
    // pixels, or a channels_last feature's channels. Its column of the tile stays; from one pass
    // to the next it moves down whole tile rows (channels_last) or along the chunk's words.
    // (double keeps the pixel order: the choice costs it the registers it has not got on sm_90)
    const bool feature_last = sizeof(acc_t) == 4 && feature_c == 1;
    constexpr int feature_passes = SPAN_TILE_PIXELS * chunk_words / SPAN_TILE_THREADS;
    static_assert(SPAN_TILE_THREADS % (chunk_words * GEN_TILE_W) == 0 && SPAN_TILE_THREADS % SPAN_TILE_PIXELS == 0,
                  "a pass of the block's threads covers whole tile rows of a word, or whole words of the tile");
    const int feature_pixel = feature_last ? thread / chunk_words : thread % SPAN_TILE_PIXELS;
    const int feature_word = feature_last ? thread % chunk_words : thread / SPAN_TILE_PIXELS;
    const int pass_rows = feature_last ? SPAN_TILE_THREADS / chunk_words / GEN_TILE_W : 0;
    const int pass_words = feature_last ? 0 : SPAN_TILE_THREADS / SPAN_TILE_PIXELS;
    const int feature_y = out_y0 + feature_pixel / GEN_TILE_W, feature_x = out_x0 + feature_pixel % GEN_TILE_W;
    // Each pass's value at r0 (a pointer may point outside the feature where it is not read).
    const scalar_t* first_value =
        sample_feature + (index_t)feature_word * per_word * feature_c + feature_y * feature_h + feature_x * feature_w;
    const index_t pass_offset = (index_t)pass_words * per_word * feature_c + pass_rows * feature_h;
    const scalar_t* pass_value[feature_passes];
#pragma unroll
    for (int pass = 0; pass < feature_passes; ++pass) pass_value[pass] = first_value + pass * pass_offset;
    const index_t chunk_offset = SPAN_TILE_REDUCED * feature_c;
    for (int r0 = 0; r0 < reduced; r0 += SPAN_TILE_REDUCED) {
#pragma unroll
        for (int pass = 0; pass < feature_passes; ++pass) {
            const int word = feature_word + pass * pass_words;
            const int r = r0 + word * per_word;
            const bool inside = feature_x < out_w && feature_y + pass * pass_rows < out_h;
            feature_chunk[(feature_pixel + pass * pass_rows * GEN_TILE_W) * stride + word] =
                Tile::read(pass_value[pass], feature_c, inside ? reduced - r : 0);
            pass_value[pass] += chunk_offset;
        }
        stage_span_rows<GEN_TILE_TAPS, Tile>(span_chunk, span_weight + (index_t)group * taps * reduced, taps, reduced, r0,
                                             thread);
        __syncthreads();  // the feature and span chunks are staged
        low.add(feature_chunk, span_chunk);
        high.add(feature_chunk, span_chunk + SPAN_TILE_ROWS * stride);
        __syncthreads();  // every warp is done with the feature and span chunks
    }
    low.store(weights);
    high.store(weights + SPAN_TILE_ROWS * SPAN_TILE_SUMS_STRIDE);
    // (the barrier after the first input chunk is staged also puts every weight in place)

    // 2. The aggregation, a chunk of the group's channels at a time. The thread sets split the
    // kernel rows; a thread sums GEN_TILE_RUN pixels of a tile row x GEN_TILE_THREAD_CHANNELS
    // channels, each weight loaded once for its channels, each input column (a stride-1
    // window) once for the pixels it serves; the sets' partial sums meet in shared memory.
    const int set = thread / GEN_TILE_SET_THREADS, member = thread % GEN_TILE_SET_THREADS;
    const int first = member % GEN_TILE_CHANNEL_STEP, run = member / GEN_TILE_CHANNEL_STEP;
    const int py = run / (GEN_TILE_W / GEN_TILE_RUN), px0 = run % (GEN_TILE_W / GEN_TILE_RUN) * GEN_TILE_RUN;
    const int row_begin = set * geometry.kernel_h / GEN_TILE_SETS, row_end = (set + 1) * geometry.kernel_h / GEN_TILE_SETS;
    // the most kernel rows a set has: a constant bound for the unrolled loop where the window is fixed
    const int set_rows = (geometry.kernel_h + GEN_TILE_SETS - 1) / GEN_TILE_SETS;
    acc_t* partials = reinterpret_cast<acc_t*>(weights + GEN_TILE_TAPS * SPAN_TILE_SUMS_STRIDE);
    const int top = out_y0 * geometry.stride_h - pad_h, left = out_x0 * geometry.stride_w - pad_w;
    const index_t group_channel0 = (index_t)group * group_channels;
    const scalar_t* sample_input = input + n * input_n;
    // A thread stages one channel of a chunk at every stage_step-th pixel of the window (row by
    // row), from its first. channels_last: consecutive threads read consecutive channels. NCHW:
    // a warp reads 8 consecutive pixels of 4 channels at a time (channels c, c + 4, c + 8, c + 12
    // of the chunk in turn), whose 32 values fall in 32 different banks.
    constexpr int stage_step = SPAN_TILE_THREADS / GEN_TILE_CHANNELS;
    static_assert(stage_step == 16 && GEN_TILE_CHANNELS == 16, "NCHW: two sets of 128 threads, 8 pixels x 16 channels each");
    const int stage_channel = channels_last ? thread % GEN_TILE_CHANNELS : thread % 4 + thread / 32 % 4 * 4;
    const int stage_first = channels_last ? thread / GEN_TILE_CHANNELS : thread / 4 % 8 + thread / 128 * 8;
    // A step moves step_rows rows and step_columns columns through the window, and one row more
    // (a wrapping step) where that passes the row's end; the input and the staged slot move with it.
    const int step_rows = stage_step / in_w, step_columns = stage_step % in_w;
    const int first_row = stage_first / in_w, first_column = stage_first % in_w;
    const index_t step_input = step_rows * input_h + step_columns * input_w;
    const index_t wrap_step_input = step_input + input_h - in_w * input_w;
    const int step_slot = (step_rows * in_row + step_columns) * GEN_TILE_IN_STRIDE;
    const int wrap_step_slot = step_slot + (in_row - in_w) * GEN_TILE_IN_STRIDE;
    const int first_y = top + first_row, first_x = left + first_column, end_x = left + in_w;
    acc_t* const first_slot = staged + (first_row * in_row + first_column) * GEN_TILE_IN_STRIDE + stage_channel;
    const int window_pixels = in_h * in_w, whole_passes = window_pixels / stage_step;
    // The sets' sums are stored by store_passes passes of the block's threads, consecutive threads
    // along the layout: a thread keeps its pixel and moves along the channels (NCHW), or keeps its
    // channel and moves down whole tile rows (channels_last).
    constexpr int store_passes = SPAN_TILE_PIXELS * GEN_TILE_CHANNELS / SPAN_TILE_THREADS;
    static_assert(SPAN_TILE_THREADS % SPAN_TILE_PIXELS == 0 && SPAN_TILE_THREADS % (GEN_TILE_CHANNELS * GEN_TILE_W) == 0,
                  "a pass of the block's threads covers whole channels, or whole tile rows");
    const int store_channel = channels_last ? thread % GEN_TILE_CHANNELS : thread / SPAN_TILE_PIXELS;
    const int store_pixel = channels_last ? thread / GEN_TILE_CHANNELS : thread % SPAN_TILE_PIXELS;
    const int store_pass_channels = channels_last ? 0 : SPAN_TILE_THREADS / SPAN_TILE_PIXELS;
    const int store_pass_rows = channels_last ? SPAN_TILE_THREADS / GEN_TILE_CHANNELS / GEN_TILE_W : 0;
    const int store_y = out_y0 + store_pixel / GEN_TILE_W, store_x = out_x0 + store_pixel % GEN_TILE_W;
    const index_t store_first = n * out_n + (group_channel0 + store_channel) * out_c + store_y * out_hs + store_x * out_ws;
    const index_t store_pass = store_pass_channels * out_c + store_pass_rows * out_hs;
    // No barrier before a chunk is staged: every thread passed the previous chunk's partials
    // barrier, after its last read of the staged input, and the next barrier (the chunk is
    // staged) comes after its last read of the partials.
    for (int c0 = 0; c0 < group_channels; c0 += GEN_TILE_CHANNELS) {
        const bool channel_inside = c0 + stage_channel < group_channels;
        // (the input pointer may point outside the image, where it is never read)
        const scalar_t* from =
            sample_input + (group_channel0 + c0 + stage_channel) * input_c + first_y * input_h + first_x * input_w;
        acc_t* to = first_slot;
        int iy = first_y, ix = first_x;
        const auto stage = [&] {
            const bool inside = channel_inside && within(iy, height) && within(ix, width);
            *to = inside ? Element<scalar_t>::load(from) : (acc_t)0;
            ix += step_columns;
            const bool wraps = ix >= end_x;
            iy += wraps ? step_rows + 1 : step_rows;
            ix -= wraps ? in_w : 0;
            from += wraps ? wrap_step_input : step_input;
            to += wraps ? wrap_step_slot : step_slot;
        };
        // Every thread's whole passes (a constant count where the window is fixed: unrolled, their
        // loads in flight together), then the last pixels, by the threads whose first lies before them.
#pragma unroll 4
        for (int pass = 0; pass < whole_passes; ++pass) stage();
        if (stage_first < window_pixels % stage_step) stage();
        __syncthreads();  // the input chunk is staged
        acc_t sums[GEN_TILE_RUN][GEN_TILE_THREAD_CHANNELS] = {};
#pragma unroll
        for (int t = 0; t < set_rows; ++t) {
            const int a = row_begin + t;
            if (a >= row_end) break;
            const acc_t* row = staged + (py * geometry.stride_h + a * geometry.dilation_h) * in_row * GEN_TILE_IN_STRIDE + first;
            const weight_t* tap_weights = weights + a * geometry.kernel_w * SPAN_TILE_SUMS_STRIDE + py * GEN_TILE_W + px0;
            // (double sums and a double window do not fit beside each other in the registers)
            if constexpr (sizeof(acc_t) == 4) {
                if (geometry.dilation_w == 1 && geometry.stride_w == 1) {
                    slide_row<1>(row, tap_weights, px0, geometry.kernel_w, sums);
                    continue;
                }
                if (geometry.dilation_w == 1 && geometry.stride_w == 2) {
                    slide_row<2>(row, tap_weights, px0, geometry.kernel_w, sums);
                    continue;
                }
            }
            // (double rolled: a fixed window's taps unrolled spill its registers on sm_90)
#pragma unroll(sizeof(acc_t) == 8 ? 1 : 2)
            for (int b = 0; b < geometry.kernel_w; ++b) {
                weight_t weight[GEN_TILE_RUN];
                load_run(tap_weights + b * SPAN_TILE_SUMS_STRIDE, weight);
#pragma unroll
                for (int j = 0; j < GEN_TILE_RUN; ++j) {
                    const acc_t* values = row + ((px0 + j) * geometry.stride_w + b * geometry.dilation_w) * GEN_TILE_IN_STRIDE;
#pragma unroll
                    for (int k = 0; k < GEN_TILE_THREAD_CHANNELS; ++k) {
                        sums[j][k] = oplib_fma((acc_t)weight[j], values[k * GEN_TILE_CHANNEL_STEP], sums[j][k]);
                    }
                }
            }
        }
        acc_t* mine = partials + set * GEN_TILE_CHANNELS * GEN_TILE_PARTIAL_STRIDE;
#pragma unroll
        for (int j = 0; j < GEN_TILE_RUN; ++j) {
#pragma unroll
            for (int k = 0; k < GEN_TILE_THREAD_CHANNELS; ++k) {
                mine[(first + k * GEN_TILE_CHANNEL_STEP) * GEN_TILE_PARTIAL_STRIDE + py * GEN_TILE_W + px0 + j] = sums[j][k];
            }
        }
        __syncthreads();  // every set's partial sums are in place
        // The sets' sums added in set order and stored.
        const index_t chunk_first = store_first + c0 * out_c;
#pragma unroll
        for (int pass = 0; pass < store_passes; ++pass) {
            const int c = store_channel + pass * store_pass_channels;
            const int pixel = store_pixel + pass * store_pass_rows * GEN_TILE_W;
            if (store_y + pass * store_pass_rows >= out_h || store_x >= out_w || c0 + c >= group_channels) continue;
            acc_t sum = partials[c * GEN_TILE_PARTIAL_STRIDE + pixel];
#pragma unroll
            for (int other = 1; other < GEN_TILE_SETS; ++other) {
                sum = oplib_add(sum, partials[(other * GEN_TILE_CHANNELS + c) * GEN_TILE_PARTIAL_STRIDE + pixel]);
            }
            out[chunk_first + pass * store_pass] = Element<scalar_t>::store(sum);
        }
    }
}
