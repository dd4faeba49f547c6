// involution_generated's forward with both of its products on tensor cores (float16, bfloat16):
// the generation of a tile's weights, and their aggregation over the windows as well.
//
//   out[n, c, i, j] = sum_{a, b} weight(n, g(c), a*KW + b, i, j) * input[n, c, i*sh - ph + a*dh, j*sw - pw + b*dw]
//   weight(n, g, t, i, j) = bias[g*T + t] + sum_r span_weight[g*T + t, r] * feature[n, r, i, j]
//
// input: (N, C, H, W), out: (N, C, Ho, Wo), feature: (N, R, Ho, Wo) of any strides; span_weight
// (G*T, R) and bias (G*T) contiguous; T = KH*KW taps, at most MMA_TAPS, KW at most MMA_BAND_WIDTH.
//
// The aggregation is no GEMM as it stands (each pixel has its own weights), but one kernel row
// of it is, over a run of MMA_TILE_W pixels of an output row: pixel j's taps b read input columns
// j*sw + b*dw of the run's window, so with the band matrix
//   band_a[j, k] = weight(.., a*KW + b, .., j) where k = j*sw + b*dw, else 0    (16 x K)
// the run's outputs over that kernel row are band_a (16 x K) times the window's input rows
// (K x channels): mma.m16n8k16 on K/16 k-steps. The zeros cost tensor-core work, which is
// plentiful, where the FMAs of the direct sum cost issue slots, which are not (the tiled kernel
// of span_tile.cu is issue-bound).
//
// A block of MMA_WARPS warps takes MMA_TILE_H output rows (a warp each) x MMA_TILE_W columns of
// one (sample, group) (grid: tiles x groups x samples):
//   1. each warp forms its run's weights, (16 pixels x R) (R x T) + bias on tensor cores, the
//      feature's fragments read from global memory and span_weight staged in shared memory a
//      chunk of MMA_REDUCED at a time; each weight w split in two values of the storage type,
//      hi = w rounded and lo = (w - hi) rounded, into the warp's `plain` rows, [pixel][tap]
//      (hi alone would round the weights as the span conv's output does, past the op's
//      tolerance: hi + lo holds a float's 16 bits and more);
//   2. per chunk of MMA_CHANNELS of the group's channels, the block stages the input rows its
//      windows read, [row][channel][column] (zeros outside the image);
//   3. each warp, per kernel row a, copies that row's weights into its two bands, hi and lo
//      (whose zeros were written once: every kernel row fills the same places), and multiplies
//      both by the input rows.
// A product by a band zero is no product of the sum: an inf or nan in the input makes it nan
// where the direct sum has none. A warp whose outputs are all finite has met none (an inf or a
// nan in any product reaches the output); one that has recomputes its outputs by the direct sum
// from the same staged weights and input, so non-finite values land exactly where torch puts
// them. No atomics, every sum in a fixed order: deterministic.
//
// float and double have no such tensor-core product, nor has a GPU before sm_80 (whose
// product by shuffles spills): those instantiations are empty, and the host declines those calls
// (the generic and tiled kernels serve them). The host emulation runs the kernel whole.
//
// Dynamic shared memory, 32-bit words each holding two 16-bit values, the lower column (or
// reduced index) in its lower half (the host's generated_mma_shared_bytes is its size):
//   span     MMA_TAPS x MMA_SPAN_STRIDE        a chunk of span_weight, [tap][r]; once the
//            weights are formed, in the same place:
//   staged   in_h x MMA_CHANNELS x stride      the input chunk, [row][channel][column k]
//   plain    2 x MMA_WARPS x MMA_TILE_W x plain_stride   each warp's weights, hi then lo, [pixel][tap]
//   band     2 x MMA_WARPS x MMA_TILE_W x stride         each warp's bands, hi then lo, [pixel][k]
// with stride = 8 * k_steps + 4 words (K = 16 k_steps columns) and plain_stride the tap tiles'
// 4 words each, and 4 more where that is a multiple of 8: 4 past a multiple of 8, so that a
// fragment load's (or store's) 8 rows x 4 words fall in 32 different banks.

#include "tile.cuh"

constexpr int MMA_WARPS = 8;
constexpr int MMA_THREADS = 256;
constexpr int MMA_TILE_H = 8;  // a warp an output row
constexpr int MMA_TILE_W = 16;  // a run: the M of every product
constexpr int MMA_TAPS = 64;
constexpr int MMA_TAP_TILES = 8;
constexpr int MMA_REDUCED = 64;
constexpr int MMA_CHANNELS = 16;  // two n-tiles
// The most band columns a run's kernel row spans (k_steps <= 4), and the widest kernel row: a
// warp's 32 lanes copy its 16 x KW weights in at most MMA_BAND_COPIES turns.
constexpr int MMA_BAND = 64;
constexpr int MMA_BAND_WIDTH = 8;
constexpr int MMA_BAND_COPIES = 4;
constexpr int MMA_SPAN_STRIDE = 36;  // words: MMA_REDUCED / 2, and 4

static_assert(MMA_THREADS == 32 * MMA_WARPS && MMA_TILE_H == MMA_WARPS && MMA_TILE_W == 16 && MMA_CHANNELS == 16,
              "a warp a run of 16 pixels of its own output row, two n-tiles of channels");
static_assert(MMA_TAP_TILES * 8 == MMA_TAPS && MMA_BAND_COPIES * 32 == MMA_TILE_W * MMA_BAND_WIDTH, "as said");
static_assert(MMA_SPAN_STRIDE == MMA_REDUCED / 2 + 4,
              "4 words past a multiple of 8: a fragment load's 8 rows x 4 words in 32 different banks");
static_assert(MMA_TAPS * MMA_REDUCED / 2 % MMA_THREADS == 0, "the span chunk in whole passes of the block");
static_assert(MMA_BAND % 16 == 0, "the host declines a band past MMA_BAND columns: whole k-steps");

// Whether v is neither inf nor nan: its exponent bits, the sign shifted out, are not all ones
// (on the bits: NVRTC makes a float comparison a flushing one under CuPy's -ftz=true).
__device__ __forceinline__ bool mma_finite(float v) { return __float_as_uint(v) << 1 < 0xff000000u; }

// A lane's 8 outputs (pixels row, row + 8 x channels 2 quad, + 1 of each n-tile) by the direct
// sum, from the warp's plain weights (hi + lo: `plain`, `lo_offset` values further) and its
// output row's staged input rows (`rows`), stored at `out` (the output row's first channel of
// the group): for a warp whose band products met an inf or a nan. A function of its own,
// rolled: cold code, kept out of the kernel's registers.
template <typename half_t>
__device__ __noinline__ void mma_direct_sums(const unsigned short* plain, int lo_offset, int plain_stride,
                                             const unsigned short* rows, half_t* out, index_t out_c, index_t out_ws,
                                             int c0, int group_channels, int out_x0, int out_w, int kernel_h,
                                             int kernel_w, int stride_w, int dilation_h, int dilation_w, int stride) {
    const int lane = oplib_lane(), row = lane >> 2, quad = lane & 3;
    for (int v = 0; v < 8; ++v) {
        const int j = row + 8 * (v >> 1 & 1), c = c0 + 8 * (v >> 2) + 2 * quad + (v & 1);
        if (out_x0 + j >= out_w || c >= group_channels) continue;
        float sum = 0.0f;
        for (int a = 0; a < kernel_h; ++a) {
            const unsigned short* in_row = rows + 2 * (a * dilation_h * MMA_CHANNELS + c - c0) * stride;
            for (int b = 0; b < kernel_w; ++b) {
                half_t hi, lo, x;
                hi.bits = plain[2 * j * plain_stride + a * kernel_w + b];
                lo.bits = plain[2 * j * plain_stride + a * kernel_w + b + lo_offset];
                x.bits = in_row[j * stride_w + b * dilation_w];
                sum = oplib_fma(oplib_add(oplib_to_float(hi), oplib_to_float(lo)), oplib_to_float(x), sum);
            }
        }
        out[c * out_c + (index_t)(out_x0 + j) * out_ws] = Element<half_t>::store(sum);
    }
}

// Two floats rounded to nearest even, as a word of two 16-bit values (`low` in the lower half):
// one cvt.rn on sm_80 and newer (no .ftz: subnormals kept), element.cuh's rounding elsewhere
// and on the host. The same bits but for a nan's payload.
__device__ __forceinline__ unsigned int mma_round_pair(float low, float high, oplib_bfloat16) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    unsigned int pair;
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(pair) : "f"(high), "f"(low));
    return pair;
#else
    return oplib_float_to_bfloat16(low) | (unsigned int)oplib_float_to_bfloat16(high) << 16;
#endif
}

__device__ __forceinline__ unsigned int mma_round_pair(float low, float high, oplib_half) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    unsigned int pair;
    asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(pair) : "f"(high), "f"(low));
    return pair;
#else
    return oplib_float_to_half(low) | (unsigned int)oplib_float_to_half(high) << 16;
#endif
}

// A 16-bit value's float: exact either way; one cvt on sm_80 and newer for float16 (whose
// conversion in software takes a dozen instructions), a shift for bfloat16.
__device__ __forceinline__ float mma_to_float(unsigned short bits, oplib_bfloat16) {
    return oplib_bfloat16_to_float(bits);
}

__device__ __forceinline__ float mma_to_float(unsigned short bits, oplib_half) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    float value;
    asm("cvt.f32.f16 %0, %1;" : "=f"(value) : "h"(bits));
    return value;
#else
    return oplib_half_to_float(bits);
#endif
}

// w's part past hi, its value in the storage type: w - hi exactly (an FMA by -1), or 0 where hi
// is an inf (w - hi would be a nan where w * x is an inf).
template <typename half_t>
__device__ __forceinline__ float mma_rest(float w, unsigned short hi_bits) {
    const float high = mma_to_float(hi_bits, half_t());
    return mma_finite(high) ? oplib_fma(-1.0f, high, w) : 0.0f;
}

// Specialised instantiations: a square window of KERNEL taps a side at equal strides STRIDE and
// no dilation (RedNet's 7x7 at stride 1 or 2, and 3x3 and 5x5), whose sizes are then constants:
// the band copies' places, the kernel rows and k-steps (unrolled), the staging's unit counts.
// KERNEL = STRIDE = 0 reads the window from the arguments and serves every other geometry (the
// host picks). Both add every sum's terms in the same order: the same bits.
//
// The instantiations a host may ask for (oplib.kernels reads these lines):
// oplib-instantiate: involution_generated_mma
// oplib-template: KERNEL, STRIDE = 0, 0 | 3, 1 | 3, 2 | 5, 1 | 5, 2 | 7, 1 | 7, 2
//
// Block (32, MMA_WARPS); grid (tiles_h * tiles_w, groups, N).
template <typename scalar_t, int KERNEL, int STRIDE>
__global__ void __launch_bounds__(MMA_THREADS, 2) involution_generated_mma(
    const scalar_t* __restrict__ input, const scalar_t* __restrict__ feature, const scalar_t* __restrict__ span_weight,
    const scalar_t* __restrict__ bias, scalar_t* __restrict__ out, int channels, int height, int width, int groups,
    int window_h, int window_w, int out_h, int out_w, int step_h, int step_w, int pad_h, int pad_w, int spacing_h,
    int spacing_w, int reduced, int tiles_w, index_t input_n, index_t input_c, index_t input_h, index_t input_w,
    index_t out_n, index_t out_c, index_t out_hs, index_t out_ws, index_t feature_n, index_t feature_c,
    index_t feature_h, index_t feature_w, bool vector_input) {
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800
    if constexpr (sizeof(scalar_t) == 2) {
        const TileGeometry<KERNEL, STRIDE> geometry(window_h, window_w, step_h, step_w, spacing_h, spacing_w);
        const int kernel_h = geometry.kernel_h, kernel_w = geometry.kernel_w;
        const int stride_h = geometry.stride_h, stride_w = geometry.stride_w;
        const int dilation_h = geometry.dilation_h, dilation_w = geometry.dilation_w;
        typedef scalar_t half_t;
        const int warp = threadIdx.y, lane = threadIdx.x, thread = lane + 32 * warp;
        const int row = lane >> 2, quad = lane & 3;  // a fragment's row (pixel) and column pair
        const int taps = kernel_h * kernel_w, group_channels = channels / groups;
        const int band_columns = (MMA_TILE_W - 1) * stride_w + (kernel_w - 1) * dilation_w + 1;
        const int k_steps = (band_columns + 15) / 16, stride = 8 * k_steps + 4;
        const int in_h = (MMA_TILE_H - 1) * stride_h + (kernel_h - 1) * dilation_h + 1;
        const int tap_tiles = (taps + 7) / 8, plain_stride = 4 * tap_tiles + (tap_tiles % 2 ? 0 : 4);
        const int staged_words = in_h * MMA_CHANNELS * stride;
        OPLIB_DYNAMIC_SHARED(unsigned int, shared);
        unsigned int* span = shared;
        unsigned int* staged = shared;
        const int plain_words = MMA_WARPS * MMA_TILE_W * plain_stride, band_words = MMA_WARPS * MMA_TILE_W * stride;
        unsigned int* plain = shared + (staged_words > MMA_TAPS * MMA_SPAN_STRIDE ? staged_words : MMA_TAPS * MMA_SPAN_STRIDE) +
                              warp * MMA_TILE_W * plain_stride;
        unsigned int* band = plain - warp * MMA_TILE_W * plain_stride + 2 * plain_words + warp * MMA_TILE_W * stride;

        const int tile_y = blockIdx.x / tiles_w, tile_x = blockIdx.x % tiles_w;
        const int out_y = tile_y * MMA_TILE_H + warp, out_x0 = tile_x * MMA_TILE_W;
        const int group = blockIdx.y;
        const index_t n = blockIdx.z;
        const bool row_inside = out_y < out_h;  // (a warp past the map still takes the block's barriers)

        // 1. The run's weights: C fragment t of tap tile t holds pixels row, row + 8 x taps
        // 8 t + 2 quad, + 1, from the bias on.
        OplibFragmentC weights[MMA_TAP_TILES];
        const unsigned short* group_bias = reinterpret_cast<const unsigned short*>(bias) + (index_t)group * taps;
#pragma unroll
        for (int t = 0; t < MMA_TAP_TILES; ++t) {
            const int tap = 8 * t + 2 * quad;
            weights[t].value[0] = weights[t].value[2] = tap < taps ? mma_to_float(__ldg(group_bias + tap), half_t()) : 0.0f;
            weights[t].value[1] = weights[t].value[3] =
                tap + 1 < taps ? mma_to_float(__ldg(group_bias + tap + 1), half_t()) : 0.0f;
        }
        const unsigned short* feature_bits = reinterpret_cast<const unsigned short*>(feature) + n * feature_n +
                                             (index_t)out_y * feature_h;
        const bool low_inside = row_inside && out_x0 + row < out_w, high_inside = row_inside && out_x0 + row + 8 < out_w;
        const unsigned short* low_pixel = feature_bits + (index_t)(out_x0 + row) * feature_w;
        const unsigned short* high_pixel = low_pixel + 8 * feature_w;
        const unsigned short* group_span = reinterpret_cast<const unsigned short*>(span_weight) + (index_t)group * taps * reduced;
        for (int r0 = 0; r0 < reduced; r0 += MMA_REDUCED) {
            if (r0 > 0) __syncthreads();  // every warp is done with the previous span chunk
            // Consecutive threads stage consecutive words of a tap's row.
#pragma unroll
            for (int pass = 0; pass < MMA_TAPS * MMA_REDUCED / 2 / MMA_THREADS; ++pass) {
                const int word = thread + pass * MMA_THREADS;
                const int tap = word / (MMA_REDUCED / 2), r = r0 + 2 * (word % (MMA_REDUCED / 2));
                span[tap * MMA_SPAN_STRIDE + word % (MMA_REDUCED / 2)] =
                    oplib_load_pair(group_span + (index_t)tap * reduced + r, 1, tap < taps ? reduced - r : 0);
            }
            __syncthreads();  // the span chunk is staged
            if (!row_inside) continue;
            for (int k0 = 0; k0 < MMA_REDUCED && r0 + k0 < reduced; k0 += 16) {
                const int r = r0 + k0 + 2 * quad;
                OplibFragmentA a;
                a.reg[0] = oplib_load_pair(low_pixel + r * feature_c, feature_c, low_inside ? reduced - r : 0);
                a.reg[1] = oplib_load_pair(high_pixel + r * feature_c, feature_c, high_inside ? reduced - r : 0);
                a.reg[2] = oplib_load_pair(low_pixel + (r + 8) * feature_c, feature_c, low_inside ? reduced - r - 8 : 0);
                a.reg[3] = oplib_load_pair(high_pixel + (r + 8) * feature_c, feature_c, high_inside ? reduced - r - 8 : 0);
#pragma unroll
                for (int t = 0; t < MMA_TAP_TILES; ++t) {
                    if (8 * t >= taps) break;
                    const OplibFragmentB b = oplib_load_fragment_b(span + 8 * t * MMA_SPAN_STRIDE + k0 / 2, MMA_SPAN_STRIDE);
                    oplib_mma<half_t>(weights[t], a, b);
                }
            }
        }
        // The weights split, hi and lo, into the warp's plain rows; the bands' zeros.
#pragma unroll
        for (int t = 0; t < MMA_TAP_TILES; ++t) {
            if (8 * t >= taps) break;
#pragma unroll
            for (int h = 0; h < 2; ++h) {  // pixels row, row + 8; taps 8 t + 2 quad, + 1
                const float w0 = weights[t].value[2 * h], w1 = weights[t].value[2 * h + 1];
                const unsigned int hi = mma_round_pair(w0, w1, half_t());
                const unsigned int lo = mma_round_pair(mma_rest<half_t>(w0, (unsigned short)(hi & 0xffffu)),
                                                       mma_rest<half_t>(w1, (unsigned short)(hi >> 16)), half_t());
                plain[(row + 8 * h) * plain_stride + 4 * t + quad] = hi;
                plain[plain_words + (row + 8 * h) * plain_stride + 4 * t + quad] = lo;
            }
        }
        for (int word = lane; word < MMA_TILE_W * stride; word += 32) band[word] = band[band_words + word] = 0u;
        // The copies of a kernel row into the band a lane makes (the same for every row): from
        // plain's tap b of pixel j (tap a*KW + b for row a) to band column j*sw + b*dw; -1: none.
        int copy_from[MMA_BAND_COPIES], copy_to[MMA_BAND_COPIES];
#pragma unroll
        for (int i = 0; i < MMA_BAND_COPIES; ++i) {
            const int item = lane + 32 * i, j = item / kernel_w, b = item % kernel_w;
            const bool copies = item < MMA_TILE_W * kernel_w;
            copy_from[i] = copies ? 2 * j * plain_stride + b : -1;
            copy_to[i] = copies ? 2 * j * stride + j * stride_w + b * dilation_w : -1;
        }
        const unsigned short* plain_bits = reinterpret_cast<const unsigned short*>(plain);
        unsigned short* band_bits = reinterpret_cast<unsigned short*>(band);
        __syncwarp();  // the plain rows and the bands' zeros are written

        // 2., 3. A chunk of the group's channels at a time.
        const int top = tile_y * MMA_TILE_H * stride_h - pad_h, left = out_x0 * stride_w - pad_w;
        const index_t group_channel0 = (index_t)group * group_channels;
        const unsigned short* sample_input = reinterpret_cast<const unsigned short*>(input) + n * input_n;
        const int column_words = 8 * k_steps;
        // channels_last with every pair of a chunk's channels 4-byte aligned: 32-bit stores.
        const bool pair_stores = out_c == 1 && ((out_n | out_hs | out_ws | (index_t)group_channels) & 1) == 0 &&
                                 (reinterpret_cast<unsigned long long>(out) & 3) == 0;
        for (int c0 = 0; c0 < group_channels; c0 += MMA_CHANNELS) {
            __syncthreads();  // every warp is done with the previous chunk (the first: with the span chunk)
            if (vector_input) {
                // channels_last, whole 16-byte vectors: a thread takes two adjacent columns x 8
                // channels, two loads, and writes their 8 channels' words.
                const int units = in_h * column_words * 2;
                for (int unit = thread; unit < units; unit += MMA_THREADS) {
                    const int half = unit & 1, word = (unit >> 1) % column_words, y = (unit >> 1) / column_words;
                    const int iy = top + y, ix = left + 2 * word, c = c0 + 8 * half;
                    const bool rows_in = c < group_channels && (unsigned int)iy < (unsigned int)height;
                    const unsigned short* at = sample_input + (group_channel0 + c) * input_c + (index_t)iy * input_h +
                                               (index_t)ix * input_w;
                    Vector16<half_t> low = {}, high = {};
                    if (rows_in && (unsigned int)ix < (unsigned int)width) low = *reinterpret_cast<const Vector16<half_t>*>(at);
                    if (rows_in && (unsigned int)(ix + 1) < (unsigned int)width)
                        high = *reinterpret_cast<const Vector16<half_t>*>(at + input_w);
                    unsigned int* to = staged + (y * MMA_CHANNELS + 8 * half) * stride + word;
#pragma unroll
                    for (int k = 0; k < 8; ++k) to[k * stride] = low.lane[k].bits | (unsigned int)high.lane[k].bits << 16;
                }
            } else {
                // Any strides: a thread takes a word (two adjacent columns of a channel),
                // consecutive threads along the columns.
                const int words = in_h * MMA_CHANNELS * column_words;
                for (int i = thread; i < words; i += MMA_THREADS) {
                    const int word = i % column_words, c = i / column_words % MMA_CHANNELS, y = i / column_words / MMA_CHANNELS;
                    const int iy = top + y, ix = left + 2 * word;
                    const bool row_in = c0 + c < group_channels && (unsigned int)iy < (unsigned int)height;
                    const unsigned short* at = sample_input + (group_channel0 + c0 + c) * input_c + (index_t)iy * input_h +
                                               (index_t)ix * input_w;
                    const unsigned int low = row_in && (unsigned int)ix < (unsigned int)width ? __ldg(at) : 0u;
                    const unsigned int high = row_in && (unsigned int)(ix + 1) < (unsigned int)width ? __ldg(at + input_w) : 0u;
                    staged[(y * MMA_CHANNELS + c) * stride + word] = low | high << 16;
                }
            }
            __syncthreads();  // the input chunk is staged
            if (!row_inside) continue;
            OplibFragmentC sums[2] = {};
#pragma unroll
            for (int a = 0; a < kernel_h; ++a) {
#pragma unroll
                for (int i = 0; i < MMA_BAND_COPIES; ++i) {
                    if (copy_from[i] < 0) continue;
                    band_bits[copy_to[i]] = plain_bits[copy_from[i] + a * kernel_w];
                    band_bits[2 * band_words + copy_to[i]] = plain_bits[2 * plain_words + copy_from[i] + a * kernel_w];
                }
                __syncwarp();  // the bands of row a are written
                const unsigned int* rows = staged + (warp * stride_h + a * dilation_h) * MMA_CHANNELS * stride;
#pragma unroll
                for (int k = 0; k < k_steps; ++k) {
                    const OplibFragmentA hi = oplib_load_fragment_a(band + 8 * k, stride);
                    const OplibFragmentA lo = oplib_load_fragment_a(band + band_words + 8 * k, stride);
#pragma unroll
                    for (int t = 0; t < 2; ++t) {
                        const OplibFragmentB window = oplib_load_fragment_b(rows + 8 * t * stride + 8 * k, stride);
                        oplib_mma<half_t>(sums[t], hi, window);
                        oplib_mma<half_t>(sums[t], lo, window);
                    }
                }
                __syncwarp();  // every lane is done with the bands of row a
            }
            // Whether any of the warp's outputs is an inf or a nan.
            unsigned int bad = 0;
#pragma unroll
            for (int t = 0; t < 2; ++t) {
#pragma unroll
                for (int v = 0; v < 4; ++v) bad |= mma_finite(sums[t].value[v]) ? 0u : 1u;
            }
#pragma unroll
            for (int offset = 16; offset > 0; offset >>= 1) bad |= __shfl_xor_sync(OPLIB_FULL_WARP, bad, offset);
            // D's element (pixel j, channel c) to the output; with an inf or a nan among the warp's
            // outputs, the direct sum's instead (rolled: it runs for those warps only).
            const index_t out_row = n * out_n + group_channel0 * out_c + (index_t)out_y * out_hs;
            if (bad) {
                const unsigned short* rows = reinterpret_cast<const unsigned short*>(staged) + 2 * warp * stride_h * MMA_CHANNELS * stride;
                mma_direct_sums(plain_bits, 2 * plain_words, plain_stride, rows, out + out_row, out_c, out_ws, c0,
                                group_channels, out_x0, out_w, kernel_h, kernel_w, stride_w, dilation_h, dilation_w, stride);
                continue;
            }
            // Two channels a store where they are adjacent and aligned (channels_last), else one.
#pragma unroll
            for (int h = 0; h < 2; ++h) {  // pixels row, row + 8
                const int j = row + 8 * h;
                if (out_x0 + j >= out_w) continue;
                half_t* pixel_out = out + out_row + (index_t)(out_x0 + j) * out_ws;
#pragma unroll
                for (int t = 0; t < 2; ++t) {
                    const int c = c0 + 8 * t + 2 * quad;
                    const unsigned int pair = mma_round_pair(sums[t].value[2 * h], sums[t].value[2 * h + 1], half_t());
                    if (pair_stores && c + 1 < group_channels) {
                        *reinterpret_cast<unsigned int*>(pixel_out + c) = pair;
                        continue;
                    }
                    if (c < group_channels) reinterpret_cast<unsigned short*>(pixel_out)[c * out_c] = (unsigned short)(pair & 0xffffu);
                    if (c + 1 < group_channels) reinterpret_cast<unsigned short*>(pixel_out)[(c + 1) * out_c] = (unsigned short)(pair >> 16);
                }
            }
        }
    }
#endif
}
