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
//   feature chunk  SPAN_TILE_PIXELS x SPAN_TILE_STRIDE values        [pixel][r]
//   span chunk     SPAN_TILE_ROWS x SPAN_TILE_STRIDE values          [row][r]
//   sums           SPAN_TILE_ROWS x SPAN_TILE_SUMS_STRIDE accumulators  [row][pixel]
// where float16/bfloat16 values sit in pairs of consecutive r, a 32-bit word each, as the
// tensor-core fragments take them. Past R, the plane or the rows, the chunks hold zeros.

#include "warp.cuh"

constexpr int SPAN_TILE_WARPS = 8;
constexpr int SPAN_TILE_THREADS = 256;
constexpr int SPAN_TILE_PIXELS = 64;
constexpr int SPAN_TILE_ROWS = 32;
constexpr int SPAN_TILE_REDUCED = 16;
// Row lengths in shared memory, in values: with 24, the 32 words of a fragment load (8 rows x
// 4 words) fall in 32 different banks.
constexpr int SPAN_TILE_STRIDE = 24;
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
            for (int j = 0; j < 4; ++j) f[j] = feature[(column + 16 * j) * SPAN_TILE_STRIDE + r];
#pragma unroll
            for (int i = 0; i < 4; ++i) s[i] = span[(row + i) * SPAN_TILE_STRIDE + r];
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
        const unsigned int low = count > 0 ? __ldg(reinterpret_cast<const unsigned short*>(values)) : 0u;
        const unsigned int high = count > 1 ? __ldg(reinterpret_cast<const unsigned short*>(values + step)) : 0u;
        return low | high << 16;
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
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const OplibFragmentB b = oplib_load_fragment_b(span + (16 * (threadIdx.y / 4) + 8 * h) * stride, stride);
            oplib_mma<half_t>(sums[h], a, b);
        }
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

// Block (32, SPAN_TILE_WARPS); grid (pixel tiles, row tiles, N).
template <typename scalar_t>
__global__ void __launch_bounds__(SPAN_TILE_THREADS, 2) involution_span_tile(
    const scalar_t* __restrict__ feature, const scalar_t* __restrict__ span_weight, const scalar_t* __restrict__ bias,
    scalar_t* __restrict__ weight, index_t plane, int reduced, int rows) {
    typedef SpanTile<scalar_t> Tile;
    typedef typename Tile::word_t word_t;
    typedef typename Tile::acc_t acc_t;
    constexpr int per_word = Tile::values_per_word;
    constexpr int stride = SPAN_TILE_STRIDE / per_word;  // words per row of a staged chunk
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
        for (int i = thread; i < SPAN_TILE_ROWS * chunk_words; i += SPAN_TILE_THREADS) {
            const int row = i / chunk_words, word = i % chunk_words;
            const int r = r0 + word * per_word;
            const int k = row0 + row;
            span_chunk[row * stride + word] = Tile::read(span_weight + (index_t)k * reduced + r, 1, k < rows ? reduced - r : 0);
        }
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
