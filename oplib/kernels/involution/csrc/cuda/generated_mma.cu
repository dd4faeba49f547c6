// involution_generated's forward with both of its products on tensor cores (float16, bfloat16):
// the generation of a tile's weights, and their aggregation over the windows as well; and its
// grad_input the same way (involution_generated_mma_backward_input, at the end of the file).
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
// one (sample, group) (grid: tiles x groups x samples), or on a narrow map two samples' tiles
// of 8 x 8 pixels, a warp 8 columns of two rows (FOLDED, at the kernel):
//   1. each warp forms its run's weights, (16 pixels x R) (R x T) + bias on tensor cores, the
//      feature's fragments read from global memory (a pair of R's channels one 32-bit load
//      where the host says it is an aligned word: channels_last) and span_weight staged in
//      shared memory a chunk of MMA_REDUCED at a time (its k-steps up to R only); each weight
//      w split in two values of the storage type, hi = w rounded and lo = (w - hi) rounded,
//      into the warp's `plain` rows, [pixel][tap]
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
//   staged   in_h x MMA_CHANNELS x stride      the input chunk, [row][channel][column k] (folded:
//            twice, the block's two samples')
//   plain    2 x MMA_WARPS x MMA_TILE_W x plain_stride   each warp's weights, hi then lo, [pixel][tap]
//   band     2 x MMA_WARPS x MMA_TILE_W x stride         each warp's bands, hi then lo, [pixel][k]
// with stride = 8 * k_steps + 4 words (K = 16 k_steps columns, a run's window) and plain_stride the tap tiles'
// 4 words each, and 4 more where that is a multiple of 8: 4 past a multiple of 8, so that a
// fragment load's (or store's) 8 rows x 4 words fall in 32 different banks.

#include "mma_split.cuh"
#include "tile.cuh"

// The blocks an SM a kernel's launch bound asks for, by the target: before sm_80, from sm_80,
// from sm_90 and from sm_100 on (the host emulation takes the first). The kernels' comments say
// why each number: the room each target's shared memory leaves and where ptxas spilled.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 1000
#define OPLIB_BLOCKS_BY_ARCH(before_80, from_80, from_90, from_100) (from_100)
#elif defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define OPLIB_BLOCKS_BY_ARCH(before_80, from_80, from_90, from_100) (from_90)
#elif defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
#define OPLIB_BLOCKS_BY_ARCH(before_80, from_80, from_90, from_100) (from_80)
#else
#define OPLIB_BLOCKS_BY_ARCH(before_80, from_80, from_90, from_100) (before_80)
#endif

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
// The most band columns a folded run's kernel row spans (8 columns of a row): the host folds no
// run wider, the unrolled products of a folded row kept to two k-steps.
constexpr int MMA_FOLDED_BAND = 32;
constexpr int MMA_BAND_COPIES = 4;
constexpr int MMA_SPAN_STRIDE = 36;  // words: MMA_REDUCED / 2, and 4

static_assert(MMA_THREADS == 32 * MMA_WARPS && MMA_TILE_H == MMA_WARPS && MMA_TILE_W == 16 && MMA_CHANNELS == 16,
              "a warp a run of 16 pixels of its own output row, two n-tiles of channels");
static_assert(MMA_TAP_TILES * 8 == MMA_TAPS && MMA_BAND_COPIES * 32 == MMA_TILE_W * MMA_BAND_WIDTH, "as said");
static_assert(MMA_SPAN_STRIDE == MMA_REDUCED / 2 + 4,
              "4 words past a multiple of 8: a fragment load's 8 rows x 4 words in 32 different banks");
static_assert(MMA_TAPS * 8 % MMA_THREADS == 0 && MMA_REDUCED % 16 == 0, "a k-step of the span chunk in whole passes of the block");
static_assert(MMA_BAND % 16 == 0 && MMA_FOLDED_BAND % 16 == 0 && MMA_FOLDED_BAND <= MMA_BAND,
              "the host declines a band past MMA_BAND columns (folded: MMA_FOLDED_BAND): whole k-steps");
static_assert(MMA_CHANNELS * MMA_BAND / 2 <= 2 * MMA_THREADS, "a staged row's words of every channel in two passes");

// Blocks marked `oplib-cold` run only for an inf or a nan: the device-time model leaves their
// code out of a kernel's instruction count (oplib.testing.device_model.cold_lines), and each
// begins with OPLIB_COLD_BLOCK (warp.cuh), whose runs the host emulation counts.


// A lane's 8 outputs (pixels row, row + 8 x channels 2 quad, + 1 of each n-tile) by the direct
// sum, from the warp's plain weights (hi + lo: `plain`, `lo_offset` values further) and its
// output row's staged input rows (`rows`), stored at `out` (the output row's first channel of
// the group): for a warp whose band products met an inf or a nan. A run of `run_w` pixels of a
// row: 16, or 8 for a folded one, whose pixels 8-15 lie on the next output row (their staged
// rows `high_rows` values further, their outputs `out_high`; `high_row_inside`: that row is in
// the map). A function of its own, rolled: cold code, kept out of the kernel's registers.
template <typename half_t>
__device__ __noinline__ void mma_direct_sums(const unsigned short* plain, int lo_offset, int plain_stride,
                                             const unsigned short* rows, half_t* out, index_t out_c, index_t out_ws,
                                             int c0, int group_channels, int out_x0, int out_w, int kernel_h,
                                             int kernel_w, int stride_w, int dilation_h, int dilation_w, int stride,
                                             int run_w, int high_rows, index_t out_high, bool high_row_inside) {
    const int lane = oplib_lane(), row = lane >> 2, quad = lane & 3;
    for (int v = 0; v < 8; ++v) {
        const int j = row + 8 * (v >> 1 & 1), c = c0 + 8 * (v >> 2) + 2 * quad + (v & 1);
        const int h = j / run_w, x = j % run_w;  // the pixel's row in the run, its column
        if (out_x0 + x >= out_w || c >= group_channels || (h > 0 && !high_row_inside)) continue;
        float sum = 0.0f;
        for (int a = 0; a < kernel_h; ++a) {
            const unsigned short* in_row = rows + h * high_rows + 2 * (a * dilation_h * MMA_CHANNELS + c - c0) * stride;
            for (int b = 0; b < kernel_w; ++b) {
                half_t hi, lo, x_value;
                hi.bits = plain[2 * j * plain_stride + a * kernel_w + b];
                lo.bits = plain[2 * j * plain_stride + a * kernel_w + b + lo_offset];
                x_value.bits = in_row[x * stride_w + b * dilation_w];
                sum = oplib_fma(oplib_add(oplib_to_float(hi), oplib_to_float(lo)), oplib_to_float(x_value), sum);
            }
        }
        out[c * out_c + h * out_high + (index_t)(out_x0 + x) * out_ws] = Element<half_t>::store(sum);
    }
}

// The lo word of two floats' split, whose hi word (mma_round_pair's) is `hi`: their parts past
// hi, rounded.
template <typename half_t>
__device__ __forceinline__ unsigned int mma_rest_pair(float w0, float w1, unsigned int hi) {
    return mma_round_pair(mma_rest<half_t>(w0, (unsigned short)(hi & 0xffffu)),
                          mma_rest<half_t>(w1, (unsigned short)(hi >> 16)), half_t());
}

// mma_rest_pair's word where neither half of hi is an inf or a nan (mma_non_finite_halves(hi)
// is 0): the same bits without its check of each value, a third of a split's instructions. The
// callers check a warp's hi words at once and take mma_rest_pair for a warp whose words hold one.
template <typename half_t>
__device__ __forceinline__ unsigned int mma_rest_pair_finite(float w0, float w1, unsigned int hi) {
    return mma_round_pair(oplib_fma(-1.0f, mma_to_float((unsigned short)(hi & 0xffffu), half_t()), w0),
                          oplib_fma(-1.0f, mma_to_float((unsigned short)(hi >> 16), half_t()), w1), half_t());
}

// Nonzero where a half of a word of two 16-bit values is an inf or a nan: its exponent's bits all
// ones, which adding the exponent's lowest bit carries into the half's sign bit (and no further).
__device__ __forceinline__ unsigned int mma_non_finite_halves(unsigned int pair, oplib_bfloat16) {
    return ((pair & 0x7f807f80u) + 0x00800080u) & 0x80008000u;
}

__device__ __forceinline__ unsigned int mma_non_finite_halves(unsigned int pair, oplib_half) {
    return ((pair & 0x7c007c00u) + 0x04000400u) & 0x80008000u;
}

// values[0] and values[step] as a word (values[0] in its lower half), each if it lies inside
// (count > 0, > 1), else zero: one 32-bit load where `word` says the pair is one aligned word
// (step 1, an even count: both inside or neither), else two 16-bit loads.
__device__ __forceinline__ unsigned int mma_load_pair(const unsigned short* values, index_t step, int count, bool word) {
    if (word) return count > 0 ? __ldg(reinterpret_cast<const unsigned int*>(values)) : 0u;
    return oplib_load_pair(values, step, count);
}

// Stages MMA_CHANNELS channels, from c0, of `rows` rows x 2 column_words columns of a (sample,
// group)'s activation (`values`: its first channel), the window from (top, left), zeros outside
// the height x width map and past the group's channels, into staged [row][channel][column], two
// columns a word, `stride` words a (row, channel). With `vectors` (channels_last, every pixel's
// and group's channels 16-byte aligned) a thread takes two adjacent columns x 8 channels, two
// 16-byte loads, and writes their 8 channels' words; else a word at a time, consecutive threads
// along a row's column words, then its channels, each thread down the rows of its word. Every
// thread of the block takes part.
template <typename half_t>
__device__ __forceinline__ void mma_stage_rows(unsigned int* staged, const unsigned short* values, int c0,
                                               int group_channels, int rows, int column_words, int stride, int top,
                                               int left, int height, int width, index_t value_c, index_t value_h,
                                               index_t value_w, bool vectors, int thread) {
    if (vectors) {
        const int units = rows * column_words * 2;
        for (int unit = thread; unit < units; unit += MMA_THREADS) {
            const int half = unit & 1, word = (unit >> 1) % column_words, y = (unit >> 1) / column_words;
            const int iy = top + y, ix = left + 2 * word, c = c0 + 8 * half;
            const bool rows_in = c < group_channels && (unsigned int)iy < (unsigned int)height;
            const unsigned short* at = values + c * value_c + (index_t)iy * value_h + (index_t)ix * value_w;
            // The 8 channels of each column as 4 words (channels 2 m, 2 m + 1 in word m), each
            // channel's word of the two columns made by one mask-and-shift (as 16-bit values
            // the compiler moved each half by a byte permute of its own).
            Vector16<unsigned int> low = {}, high = {};
            if (rows_in && (unsigned int)ix < (unsigned int)width) low = *reinterpret_cast<const Vector16<unsigned int>*>(at);
            if (rows_in && (unsigned int)(ix + 1) < (unsigned int)width)
                high = *reinterpret_cast<const Vector16<unsigned int>*>(at + value_w);
            unsigned int* to = staged + (y * MMA_CHANNELS + 8 * half) * stride + word;
#pragma unroll
            for (int m = 0; m < 4; ++m) {
                to[2 * m * stride] = (low.lane[m] & 0xffffu) | high.lane[m] << 16;
                to[(2 * m + 1) * stride] = low.lane[m] >> 16 | (high.lane[m] & 0xffff0000u);
            }
        }
        return;
    }
    // Each thread keeps a channel and column word and steps down the rows, its address a fixed
    // step further each time (a flat loop over the words formed each word's 64-bit address
    // anew, some fifty instructions a word). `first` and `step` in rows.
    const auto stage_down = [&](int word, int c, int first, int step) {
        const int ix = left + 2 * word;
        const bool channel_in = c0 + c < group_channels;
        const bool low_in = (unsigned int)ix < (unsigned int)width, high_in = (unsigned int)(ix + 1) < (unsigned int)width;
        const unsigned short* at = values + (c0 + c) * value_c + (index_t)(top + first) * value_h + (index_t)ix * value_w;
        const index_t at_step = (index_t)step * value_h;
        unsigned int* to = staged + (first * MMA_CHANNELS + c) * stride + word;
#pragma unroll 2
        for (int y = first; y < rows; y += step, at += at_step, to += step * MMA_CHANNELS * stride) {
            const bool row_in = channel_in && (unsigned int)(top + y) < (unsigned int)height;
            const unsigned int low = row_in && low_in ? __ldg(at) : 0u;
            const unsigned int high = row_in && high_in ? __ldg(at + value_w) : 0u;
            *to = low | high << 16;
        }
    };
    const int row_words = MMA_CHANNELS * column_words;  // a row's words of every channel: 128 to 512
    if (MMA_THREADS % row_words == 0) {  // a pass covers whole rows (column_words 8 or 16)
        stage_down(thread % column_words, thread / column_words % MMA_CHANNELS, thread / row_words,
                   MMA_THREADS / row_words);
        return;
    }
#pragma unroll
    for (int slot = 0; slot < 2; ++slot) {  // else words thread and thread + MMA_THREADS of every row
        const int item = thread + slot * MMA_THREADS;
        if (item < row_words) stage_down(item % column_words, item / column_words, 0, 1);
    }
}

// A run's sums over one kernel row: both bands (hi and lo, 16 x 16 k_steps, `band_words` apart)
// times the staged rows' two n-tiles of channels (`rows`: 16 k_steps columns each), accumulated
// into sums; k_steps at most MAX_STEPS. Fragments by ldmatrix: with PAIRED_WINDOWS both n-tiles'
// B fragments in one (the forward), else one each (grad_input, whose float16 instantiations on
// sm_120 sit at the 128 registers of two blocks an SM: two more live ones spill there).
// FOLDED, for a folded run (8 columns of two output rows, pixels 8-15 the lower row's): the
// band's rows 0-7 times the upper row's window (`rows`), its rows 8-15 times the lower row's
// (`lower`). Each A fragment serves both, the other row's half of it zeros (a band of both
// rows' columns side by side would take twice the band loads and shared memory, half of it
// zeros).
template <typename half_t, int MAX_STEPS, bool PAIRED_WINDOWS, bool FOLDED = false>
__device__ __forceinline__ void mma_band_products(OplibFragmentC (&sums)[2], const unsigned int* band, int band_words,
                                                  const unsigned int* rows, int stride, int k_steps,
                                                  const unsigned int* lower = nullptr) {
#pragma unroll
    for (int k = 0; k < MAX_STEPS; ++k) {
        if (k >= k_steps) break;
        const OplibFragmentA hi = oplib_load_fragment_a(band + 8 * k, stride);
        const OplibFragmentA lo = oplib_load_fragment_a(band + band_words + 8 * k, stride);
#pragma unroll
        for (int half = 0; half < (FOLDED ? 2 : 1); ++half) {  // folded: the upper row's pixels, then the lower's
            // a[0], a[2] hold rows 0-7, a[1], a[3] rows 8-15
            const unsigned int upper = FOLDED && half ? 0u : ~0u, below = FOLDED && !half ? 0u : ~0u;
            const OplibFragmentA hi_rows = {{hi.reg[0] & upper, hi.reg[1] & below, hi.reg[2] & upper, hi.reg[3] & below}};
            const OplibFragmentA lo_rows = {{lo.reg[0] & upper, lo.reg[1] & below, lo.reg[2] & upper, lo.reg[3] & below}};
            const unsigned int* window_rows = half ? lower : rows;
            OplibFragmentB window[2];
            if constexpr (PAIRED_WINDOWS)
                oplib_load_fragments_b(window_rows + 8 * k, stride, 8 * stride, window[0], window[1]);
#pragma unroll
            for (int t = 0; t < 2; ++t) {
                if constexpr (!PAIRED_WINDOWS) window[t] = oplib_load_fragment_b(window_rows + 8 * t * stride + 8 * k, stride);
                oplib_mma<half_t>(sums[t], hi_rows, window[t]);
                oplib_mma<half_t>(sums[t], lo_rows, window[t]);
            }
        }
    }
}

// D's elements of the lane's two pixels (fragment rows row and row + 8) to `pixel` and
// `pixel + high_step` (each pixel's first channel of the chunk, c0 of its group), where
// low_inside and high_inside say they lie in the map, channels past the group's left out: two
// channels a 32-bit store where `pair_stores` (channels_last, an even count of the group's
// channels, every pair 4-byte aligned), else one. The two ways apart, each with a pixel's
// address once (interleaved, the compiler had formed each store's address and branched at
// each: 166 instructions in the forward).
template <typename half_t>
__device__ __forceinline__ void mma_store_pixels(const OplibFragmentC (&sums)[2], half_t* pixel, index_t high_step,
                                                 index_t out_c, int c0, int group_channels, bool low_inside,
                                                 bool high_inside, bool pair_stores) {
    const int quad = oplib_lane() & 3, c = c0 + 2 * quad;  // n-tile t: c + 8 t
    if (pair_stores) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {  // pixels row, row + 8
            if (!(h ? high_inside : low_inside)) continue;
            unsigned int* pairs = reinterpret_cast<unsigned int*>(pixel + h * high_step + c);
#pragma unroll
            for (int t = 0; t < 2; ++t) {  // c even and the count even: the pair is inside or outside
                if (c + 8 * t < group_channels)
                    pairs[4 * t] = mma_round_pair(sums[t].value[2 * h], sums[t].value[2 * h + 1], half_t());
            }
        }
        return;
    }
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        if (!(h ? high_inside : low_inside)) continue;
        unsigned short* at = reinterpret_cast<unsigned short*>(pixel + h * high_step) + (index_t)c * out_c;
#pragma unroll
        for (int t = 0; t < 2; ++t) {
            const unsigned int pair = mma_round_pair(sums[t].value[2 * h], sums[t].value[2 * h + 1], half_t());
            unsigned short* tile_at = at + 8 * t * out_c;
            if (c + 8 * t < group_channels) tile_at[0] = (unsigned short)(pair & 0xffffu);
            if (c + 8 * t + 1 < group_channels) tile_at[out_c] = (unsigned short)(pair >> 16);
        }
    }
}

// mma_store_pixels for a run of 16 pixels of a row from `run` (its first pixel), pixels x0 + j
// past `width` left out.
template <typename half_t>
__device__ __forceinline__ void mma_store_run(const OplibFragmentC (&sums)[2], half_t* run, index_t out_c,
                                              index_t out_ws, int c0, int group_channels, int x0, int width,
                                              bool pair_stores) {
    const int row = oplib_lane() >> 2;
    mma_store_pixels(sums, run + (index_t)row * out_ws, 8 * out_ws, out_c, c0, group_channels, x0 + row < width,
                     x0 + row + 8 < width, pair_stores);
}

// Whether out's pairs of a chunk's channels may be stored by one store each (a 32-bit word, or
// for float 8 bytes): channels_last, the group's channels and every pixel's aligned to a pair.
template <typename value_t>
__device__ __forceinline__ bool mma_pair_stores(const value_t* out, index_t out_n, index_t out_c, index_t out_hs,
                                                index_t out_ws, int group_channels) {
    return out_c == 1 && ((out_n | out_hs | out_ws | (index_t)group_channels) & 1) == 0 &&
           (reinterpret_cast<unsigned long long>(out) & (2 * sizeof(value_t) - 1)) == 0;
}

// Specialised instantiations: a square window of KERNEL taps a side at equal strides STRIDE and
// no dilation (RedNet's 7x7 at stride 1 or 2, and 3x3 and 5x5), whose sizes are then constants:
// the band copies' places, the kernel rows and k-steps (unrolled), the staging's unit counts.
// KERNEL = STRIDE = 0 reads the window from the arguments and serves every other geometry (the
// host picks). Both add every sum's terms in the same order: the same bits.
//
// The instantiations a host may ask for, of this kernel and of the two backward ones below
// (oplib.kernels reads these lines):
// oplib-instantiate: involution_generated_mma, involution_generated_mma_backward_input, involution_generated_mma_backward_generator
// oplib-instantiate: involution_generated_mma_backward_input_staged, involution_generated_mma_staged
// oplib-template: KERNEL, STRIDE = 0, 0 | 3, 1 | 3, 2 | 5, 1 | 5, 2 | 7, 1 | 7, 2
// oplib-template: FOLDED = false | true
// oplib-template: NARROW = false | true
// oplib-template: VECTORS = false | true
// oplib-template: INPUT_VECTORS, FEATURE_PAIRS = false, false | true, false | false, true
//
// FOLDED: folded runs (the host's pick where the map's width leaves fewer of the runs' pixels
// outside it so, as a 7x7 map does: 7 of a run's 16, 14 of a folded one's). A warp's run is 8
// columns of two output rows (pixels 8-15 the lower row's), and the block's 8 warps take two
// samples' tiles of 8 x 8 pixels (warps 0-3 the first sample's, 4-7 the second's), each sample's
// input rows staged apart; the band holds a pixel's 8-column window, mma_band_products
// (FOLDED) applies it to either row. A template argument, not a runtime one: each way's sizes
// are then constants of the specialised instantiations (with a runtime flag the staging's and
// the products' loop counts were runtime ones, 2.6 times the SASS), and each instantiation
// holds one way's code (the runtime instantiation holding both spilled on sm_90).
//
// Block (32, MMA_WARPS); grid (tiles_h * tiles_w, groups, N), or (.., .., N / 2 rounded up) folded.
template <typename scalar_t, int KERNEL, int STRIDE, bool FOLDED>
__global__ void __launch_bounds__(MMA_THREADS, 2) involution_generated_mma(
    const scalar_t* __restrict__ input, const scalar_t* __restrict__ feature, const scalar_t* __restrict__ span_weight,
    const scalar_t* __restrict__ bias, scalar_t* __restrict__ out, int channels, int height, int width, int groups,
    int window_h, int window_w, int out_h, int out_w, int step_h, int step_w, int pad_h, int pad_w, int spacing_h,
    int spacing_w, int reduced, int tiles_w, index_t input_n, index_t input_c, index_t input_h, index_t input_w,
    index_t out_n, index_t out_c, index_t out_hs, index_t out_ws, index_t feature_n, index_t feature_c,
    index_t feature_h, index_t feature_w, bool vector_input, bool feature_words, int batch) {
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
        constexpr bool folded = FOLDED;
        const int run_w = folded ? MMA_TILE_W / 2 : MMA_TILE_W;  // a run's columns
        const int band_columns = (run_w - 1) * stride_w + (kernel_w - 1) * dilation_w + 1;
        const int k_steps = (band_columns + 15) / 16, stride = 8 * k_steps + 4;
        // the input rows of the tile's output rows (folded, a map of fewer rows than a tile: its rows)
        const int tile_rows = folded && out_h < MMA_TILE_H ? out_h : MMA_TILE_H;
        const int in_h = (tile_rows - 1) * stride_h + (kernel_h - 1) * dilation_h + 1;
        const int tap_tiles = (taps + 7) / 8, plain_stride = 4 * tap_tiles + (tap_tiles % 2 ? 0 : 4);
        const int sample_words = in_h * MMA_CHANNELS * stride, staged_words = (folded ? 2 : 1) * sample_words;
        OPLIB_DYNAMIC_SHARED(unsigned int, shared);
        unsigned int* span = shared;
        unsigned int* staged = shared;
        const int plain_words = MMA_WARPS * MMA_TILE_W * plain_stride, band_words = MMA_WARPS * MMA_TILE_W * stride;
        unsigned int* plain = shared + (staged_words > MMA_TAPS * MMA_SPAN_STRIDE ? staged_words : MMA_TAPS * MMA_SPAN_STRIDE) +
                              warp * MMA_TILE_W * plain_stride;
        unsigned int* band = plain - warp * MMA_TILE_W * plain_stride + 2 * plain_words + warp * MMA_TILE_W * stride;

        const int tile_y = blockIdx.x / tiles_w, tile_x = blockIdx.x % tiles_w;
        const int half = folded ? warp / 4 : 0;  // the block's sample the warp takes
        const int tile_row = folded ? 2 * (warp % 4) : warp;  // the warp's (upper) output row in the tile
        const int out_y = tile_y * MMA_TILE_H + tile_row, out_x0 = tile_x * run_w;
        const int group = blockIdx.y;
        const index_t first_sample = folded ? 2 * (index_t)blockIdx.z : (index_t)blockIdx.z, n = first_sample + half;
        // (a warp past the map or the batch still takes the block's barriers)
        const bool row_inside = out_y < out_h && n < batch;

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
        // the pixels of the lane's fragment rows row and row + 8 (folded: column `row` of the lower row)
        const bool low_inside = row_inside && out_x0 + row < out_w;
        const bool high_inside = folded ? low_inside && out_y + 1 < out_h : row_inside && out_x0 + row + 8 < out_w;
        const unsigned short* low_pixel = feature_bits + (index_t)(out_x0 + row) * feature_w;
        const unsigned short* high_pixel = low_pixel + (folded ? feature_h : 8 * feature_w);
        // The thread's place in the span chunk: tap row thread / 8 (+ 32 a pass), word thread % 8
        // of a k-step, and its tap row in span_weight (the 64-bit offsets formed once).
        const int span_tap = thread / 8, span_word = thread % 8;
        const unsigned short* thread_span =
            reinterpret_cast<const unsigned short*>(span_weight) + ((index_t)group * taps + span_tap) * reduced;
        const index_t pass_span = (index_t)(MMA_THREADS / 8) * reduced;
        for (int r0 = 0; r0 < reduced; r0 += MMA_REDUCED) {
            if (r0 > 0) __syncthreads();  // every warp is done with the previous span chunk
            // A k-step's 8 words of every tap's row at a time (8 consecutive threads a row), as
            // many k-steps as the loop below reads: RedNet's R of 16 and 32 take one or two of
            // the chunk's four.
#pragma unroll
            for (int step = 0; step < MMA_REDUCED / 16; ++step) {
                if (16 * step >= reduced - r0) break;
                const int column = 8 * step + span_word, r = r0 + 2 * column;
#pragma unroll
                for (int pass = 0; pass < MMA_TAPS * 8 / MMA_THREADS; ++pass) {
                    const int tap = span_tap + pass * (MMA_THREADS / 8);
                    span[tap * MMA_SPAN_STRIDE + column] =
                        oplib_load_pair(thread_span + pass * pass_span + r, 1, tap < taps ? reduced - r : 0);
                }
            }
            __syncthreads();  // the span chunk is staged
            if (!row_inside) continue;
            for (int k0 = 0; k0 < MMA_REDUCED && r0 + k0 < reduced; k0 += 16) {
                const int r = r0 + k0 + 2 * quad;
                // The four loads under one branch (per load, the compiler branched at each).
                OplibFragmentA a;
                const int low_count = low_inside ? reduced - r : 0, high_count = high_inside ? reduced - r : 0;
                if (feature_words) {
                    a.reg[0] = mma_load_pair(low_pixel + r, 1, low_count, true);
                    a.reg[1] = mma_load_pair(high_pixel + r, 1, high_count, true);
                    a.reg[2] = mma_load_pair(low_pixel + r + 8, 1, low_count - 8, true);
                    a.reg[3] = mma_load_pair(high_pixel + r + 8, 1, high_count - 8, true);
                } else {
                    a.reg[0] = oplib_load_pair(low_pixel + r * feature_c, feature_c, low_count);
                    a.reg[1] = oplib_load_pair(high_pixel + r * feature_c, feature_c, high_count);
                    a.reg[2] = oplib_load_pair(low_pixel + (r + 8) * feature_c, feature_c, low_count - 8);
                    a.reg[3] = oplib_load_pair(high_pixel + (r + 8) * feature_c, feature_c, high_count - 8);
                }
                // Two tap tiles' B fragments a load (past the taps, the staged zeros).
#pragma unroll
                for (int t = 0; t < MMA_TAP_TILES; t += 2) {
                    if (8 * t >= taps) break;
                    OplibFragmentB b[2];
                    oplib_load_fragments_b(span + 8 * t * MMA_SPAN_STRIDE + k0 / 2, MMA_SPAN_STRIDE, 8 * MMA_SPAN_STRIDE,
                                           b[0], b[1]);
                    oplib_mma<half_t>(weights[t], a, b[0]);
                    if (8 * (t + 1) < taps) oplib_mma<half_t>(weights[t + 1], a, b[1]);
                }
            }
        }
        // The weights split, hi and lo, into the warp's plain rows; the bands' zeros. lo the
        // short way, then, where a hi of the warp is an inf or a nan, again the long way.
        unsigned int non_finite = 0;
#pragma unroll
        for (int t = 0; t < MMA_TAP_TILES; ++t) {
            if (8 * t >= taps) break;
#pragma unroll
            for (int h = 0; h < 2; ++h) {  // pixels row, row + 8; taps 8 t + 2 quad, + 1
                const float w0 = weights[t].value[2 * h], w1 = weights[t].value[2 * h + 1];
                const unsigned int hi = mma_round_pair(w0, w1, half_t());
                non_finite |= mma_non_finite_halves(hi, half_t());
                plain[(row + 8 * h) * plain_stride + 4 * t + quad] = hi;
                plain[plain_words + (row + 8 * h) * plain_stride + 4 * t + quad] = mma_rest_pair_finite<half_t>(w0, w1, hi);
            }
        }
        if (oplib_warp_any(non_finite != 0)) {  // oplib-cold: a hi of the warp is an inf or a nan
            OPLIB_COLD_BLOCK();
#pragma unroll
            for (int t = 0; t < MMA_TAP_TILES; ++t) {
                if (8 * t >= taps) break;
#pragma unroll
                for (int h = 0; h < 2; ++h) {
                    const float w0 = weights[t].value[2 * h], w1 = weights[t].value[2 * h + 1];
                    plain[plain_words + (row + 8 * h) * plain_stride + 4 * t + quad] =
                        mma_rest_pair<half_t>(w0, w1, mma_round_pair(w0, w1, half_t()));
                }
            }
        }
        // The bands' zeros 16 bytes a store (a band's 16 rows of `stride` words, 4 past a multiple
        // of 8, are whole vectors, as are the bands' offsets).
        Vector16<unsigned int>* band_vectors = reinterpret_cast<Vector16<unsigned int>*>(band);
#pragma unroll 1
        for (int v = lane; v < MMA_TILE_W * stride / 4; v += 32)
            band_vectors[v] = band_vectors[band_words / 4 + v] = Vector16<unsigned int>{};
        // The copies of a kernel row into the band a lane makes (the same for every row): from
        // plain's tap b of pixel j (tap a*KW + b for row a) to band column j*sw + b*dw; -1: none.
        int copy_from[MMA_BAND_COPIES], copy_to[MMA_BAND_COPIES];
#pragma unroll
        for (int i = 0; i < MMA_BAND_COPIES; ++i) {
            const int item = lane + 32 * i, j = item / kernel_w, b = item % kernel_w;
            const bool copies = item < MMA_TILE_W * kernel_w;
            copy_from[i] = copies ? 2 * j * plain_stride + b : -1;
            copy_to[i] = copies ? 2 * j * stride + (folded ? j % 8 : j) * stride_w + b * dilation_w : -1;
        }
        const unsigned short* plain_bits = reinterpret_cast<const unsigned short*>(plain);
        unsigned short* band_bits = reinterpret_cast<unsigned short*>(band);
        __syncwarp();  // the plain rows and the bands' zeros are written

        // 2., 3. A chunk of the group's channels at a time.
        const int top = tile_y * MMA_TILE_H * stride_h - pad_h, left = out_x0 * stride_w - pad_w;
        const index_t group_channel0 = (index_t)group * group_channels;
        const unsigned short* block_input = reinterpret_cast<const unsigned short*>(input) + first_sample * input_n +
                                            group_channel0 * input_c;
        const bool second_sample = folded && first_sample + 1 < batch;  // folded: whether it stages a second
        // Folded, the lower row's staged rows; where that row is past the map (and may be past the
        // rows staged), the upper row's again: its outputs are not stored, but its sums are
        // checked for an inf or a nan, which the staged rows hold only where the input does.
        const int lower_rows = folded && out_y + 1 < out_h ? stride_h * MMA_CHANNELS * stride : 0;
        const int column_words = 8 * k_steps;
        const bool pair_stores = mma_pair_stores(out, out_n, out_c, out_hs, out_ws, group_channels);
        for (int c0 = 0; c0 < group_channels; c0 += MMA_CHANNELS) {
            __syncthreads();  // every warp is done with the previous chunk (the first: with the span chunk)
            mma_stage_rows<half_t>(staged, block_input, c0, group_channels, in_h, column_words, stride, top, left, height,
                                   width, input_c, input_h, input_w, vector_input, thread);
            if (second_sample) {
                mma_stage_rows<half_t>(staged + sample_words, block_input + input_n, c0, group_channels, in_h, column_words,
                                       stride, top, left, height, width, input_c, input_h, input_w, vector_input, thread);
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
                const unsigned int* rows = staged + half * sample_words +
                                           (tile_row * stride_h + a * dilation_h) * MMA_CHANNELS * stride;
                if constexpr (folded)
                    mma_band_products<half_t, MMA_FOLDED_BAND / 16, true, true>(sums, band, band_words, rows, stride, k_steps,
                                                                                rows + lower_rows);
                else
                    mma_band_products<half_t, MMA_BAND / 16, true>(sums, band, band_words, rows, stride, k_steps);
                __syncwarp();  // every lane is done with the bands of row a
            }
            // D's element (pixel j, channel c) to the output; with an inf or a nan among the warp's
            // outputs, the direct sum's instead (rolled: it runs for those warps only).
            const index_t out_row = n * out_n + group_channel0 * out_c + (index_t)out_y * out_hs;
            if (mma_any_non_finite(sums)) {  // oplib-cold: an inf or a nan among the warp's sums
                OPLIB_COLD_BLOCK();
                const unsigned short* rows = reinterpret_cast<const unsigned short*>(staged + half * sample_words) +
                                             2 * tile_row * stride_h * MMA_CHANNELS * stride;
                mma_direct_sums(plain_bits, 2 * plain_words, plain_stride, rows, out + out_row, out_c, out_ws, c0,
                                group_channels, out_x0, out_w, kernel_h, kernel_w, stride_w, dilation_h, dilation_w, stride,
                                run_w, 2 * stride_h * MMA_CHANNELS * stride, out_hs, out_y + 1 < out_h);
                continue;
            }
            mma_store_pixels(sums, out + out_row + (index_t)(out_x0 + row) * out_ws, folded ? out_hs : 8 * out_ws, out_c,
                             c0, group_channels, low_inside, high_inside, pair_stores);
        }
    }
#endif
}

// ---------------------------------------------------------------------------------------
// grad_input (involution_generated_backward_input) on tensor cores: the same band, transposed
// ---------------------------------------------------------------------------------------
//
//   grad_input[n, c, y, x] = sum over the taps (a, b) and output pixels (i, j) whose window reads
//                            (y, x), i*sh - ph + a*dh = y and j*sw - pw + b*dw = x, of
//                            weight(n, g(c), a*KW + b, i, j) * grad_output[n, c, i, j]
//
// grad_output: (N, C, Ho, Wo), grad_input: (N, C, H, W), feature: (N, R, Ho, Wo), any strides.
// Per kernel row a, input row y reads output row i = (y + ph - a*dh) / sh where that divides
// (else none), and a run of MMA_TILE_W input pixels x0 + j reads that row's output columns: with
// the run's first one `first` (the lowest any tap reads) and k = j' - first,
//   band_a[j, k] = weight(.., a*KW + b, i, first + k) where (first + k)*sw - pw + b*dw = x0 + j, else 0
// the run's sums over that kernel row are band_a (16 x K) times the output row's grad_output
// (K x channels), as in the forward. But a band column holds one output pixel's weights, each
// row another tap of it: no warp's weights serve another's band (output row i and kernel row a
// fix the input row), so each warp forms, per kernel row, that row's KW taps at the band's
// 16 k_steps output pixels, (16 k_steps x R)(R x 8) + bias on tensor cores (the feature's A
// fragments from the output row's feature, staged in shared memory, the whole of the group's
// span_weight staged there too), and each lane writes its D values, split hi and lo, straight
// to their band places (the same places for every kernel row: the bands' zeros are written
// once). An output pixel outside the map gets weight 0 (the staged grad_output there is 0 too:
// no inf times 0).
//
// A block of MMA_WARPS warps takes MMA_TILE_H input rows (a warp each) x MMA_TILE_W columns of
// one (sample, group) (grid: tiles x groups x samples); per chunk of MMA_CHANNELS of the group's
// channels it stages the output rows its windows read, then takes those rows one at a time: the
// block stages the row's feature at the band's pixels once (loaded a row ahead: below,
// MMA_FEATURE_SHARE), and each warp whose input row reads that output row (through one kernel
// row a) forms and applies that kernel row's weights. The
// feature of an output row serves up to KH warps: read from global memory once a block, where
// each warp's own fragment loads read it again for each of its kernel rows (and their 64-bit
// addressing and bounds took most of the kernel's instructions at large R). Each input pixel is
// written by one warp, its sum in a fixed order (its kernel rows from the last): deterministic,
// no atomics. inf and nan as in the forward: a warp whose sums are not all finite recomputes
// them by the direct sum, the weights formed again one by one from global memory.
//
// Dynamic shared memory, 32-bit words of two 16-bit values (generated_mma_backward_shared_bytes):
//   span     span_rows x span_stride                  span_weight's rows of the group, [tap][r]
//            (span_rows = (KH - 1) KW + 8: row a's n-tile reads taps a KW .. a KW + 7; zeros
//            past the taps and past R to a whole k-step)
//   staged   rows_h x MMA_CHANNELS x stride           the grad_output chunk, [row][channel][column]
//   band     2 x MMA_WARPS x MMA_TILE_W x stride      each warp's bands, hi then lo, [pixel][k]
//   features 16 k_steps x span_stride                 an output row's feature at the band's
//            pixels, [pixel][r] (zeros outside the map and past R to a whole k-step)
// with stride = 8 * k_steps + 4 and span_stride = 8 * ceil(R / 16) + 4 words.

// The most output columns a run's band reads (k_steps <= 2: RedNet's 7x7 windows need 22 at
// stride 1, 12 at stride 2): a warp holds that many pixels' weights of a kernel row at once.
constexpr int MMA_GRAD_BAND = 32;
static_assert(MMA_GRAD_BAND % 16 == 0 && MMA_GRAD_BAND <= MMA_BAND, "whole k-steps");

// a / b rounded down, b > 0 (C's division rounds a negative a up).
__device__ __forceinline__ int mma_floor_div(int a, int b) { return a >= 0 ? a / b : -((b - 1 - a) / b); }

// A lane's 8 sums (input pixels row, row + 8 of the run x channels 2 quad, + 1 of each n-tile)
// by the direct sum, each weight formed again from the staged span rows and the feature, stored
// at `run` (the run's first pixel, the group's first channel): for a warp whose band products
// met an inf or a nan. Cold, rolled, kept out of the kernel's registers.
template <typename half_t>
__device__ __noinline__ void mma_backward_direct_sums(
    const unsigned short* span, int span_stride, const half_t* bias, const unsigned short* feature, index_t feature_c,
    index_t feature_h, index_t feature_w, int reduced, const unsigned short* staged, int stride, int first_row,
    int first_column, half_t* run, index_t out_c, index_t out_ws, int c0, int group_channels, int y, int x0, int width,
    int out_h, int out_w, int kernel_h, int kernel_w, int stride_h, int stride_w, int pad_h, int pad_w, int dilation_h,
    int dilation_w) {
    const int lane = oplib_lane(), row = lane >> 2, quad = lane & 3;
    for (int v = 0; v < 8; ++v) {
        const int j = row + 8 * (v >> 1 & 1), c = c0 + 8 * (v >> 2) + 2 * quad + (v & 1);
        if (x0 + j >= width || c >= group_channels) continue;
        float sum = 0.0f;
        for (int a = 0; a < kernel_h; ++a) {
            const int from_y = y + pad_h - a * dilation_h;
            if (from_y % stride_h != 0 || (unsigned int)(from_y / stride_h) >= (unsigned int)out_h) continue;
            const int i = from_y / stride_h;
            for (int b = 0; b < kernel_w; ++b) {
                const int from_x = x0 + j + pad_w - b * dilation_w;
                if (from_x % stride_w != 0 || (unsigned int)(from_x / stride_w) >= (unsigned int)out_w) continue;
                const int o = from_x / stride_w, tap = a * kernel_w + b;
                float weight = mma_to_float(bias[tap].bits, half_t());
                const unsigned short* pixel = feature + (index_t)i * feature_h + (index_t)o * feature_w;
                for (int r = 0; r < reduced; ++r) {
                    weight = oplib_fma(mma_to_float(span[2 * tap * span_stride + r], half_t()),
                                       mma_to_float(pixel[r * feature_c], half_t()), weight);
                }
                const unsigned short g = staged[2 * ((i - first_row) * MMA_CHANNELS + c - c0) * stride + o - first_column];
                sum = oplib_fma(weight, mma_to_float(g, half_t()), sum);
            }
        }
        run[c * out_c + (index_t)j * out_ws] = Element<half_t>::store(sum);
    }
}

// An output row's feature at the band's 16 live_steps pixels, staged a row ahead: a thread
// loads its share of the next row into registers (mma_load_feature_share) once the current
// row's weights are formed, and stores it (mma_store_feature_share) after the row's band
// products, so the loads' latency passes behind them (loaded and stored at once, each row's
// staging was a chain of dependent round trips between two barriers, which a 7x7 map's few
// blocks could not hide). The block's 256 threads cover the pixels, MMA_THREADS / pixels threads
// a pixel (16 or 8: shifts, no division by a runtime count): channels_last (`word_pairs`, a pair
// of R's channels one aligned 32-bit word) consecutive threads along a pixel's words, NCHW along
// a word's pixels, two 16-bit loads a word, joined as they are loaded (so NCHW's products wait
// for its loads: kept apart to the store, the values took registers that two blocks an SM do
// not have). A thread holds MMA_FEATURE_SHARE words, those `step` apart from `word`, and stages
// any further ones (a large R: RedNet's last two stages) when it stores; a share of 4 spilled on
// sm_80 and sm_86. Zeros outside the row's `width` and past R (to a whole k-step: `words`).
constexpr int MMA_FEATURE_SHARE = 2;
static_assert(MMA_THREADS == 256 && MMA_GRAD_BAND == 32, "16 or 32 pixels, 16 or 8 threads each");

// A thread's place in a row's feature: its pixel, its first word and the step to its next, and
// the pixel's values in the row (`row_values`, the band's first output column `first`; `inside`
// the row's `width`). Of a block's barely changing values: recomputed at each use, they take no
// registers across the products.
struct MmaFeaturePlace {
    int pixel, word, step;
    bool inside;
    const unsigned short* values;

    __device__ __forceinline__ MmaFeaturePlace(int live_steps, bool word_pairs, int thread,
                                               const unsigned short* row_values, int first, int width, index_t value_w) {
        const int shift = live_steps > 1 ? 3 : 4;  // log2 of the threads a pixel
        step = 1 << shift;
        pixel = word_pairs ? thread >> shift : thread & (MMA_THREADS / step - 1);
        word = word_pairs ? thread & (step - 1) : thread >> (8 - shift);
        const int o = first + pixel;
        inside = (unsigned int)o < (unsigned int)width;
        values = row_values + (index_t)o * value_w;
    }
};

struct MmaFeatureShare {
    unsigned int words[MMA_FEATURE_SHARE];
};

__device__ __forceinline__ unsigned int mma_feature_word(const unsigned short* pixel_values, int r, int count,
                                                         index_t value_c, bool word_pairs) {
    return word_pairs ? mma_load_pair(pixel_values + r, 1, count, true) : oplib_load_pair(pixel_values + r * value_c, value_c, count);
}

// `row_values`: the sample's output row; `first`: the band's first output column.
__device__ __forceinline__ void mma_load_feature_share(MmaFeatureShare& share, const unsigned short* row_values,
                                                       int first, int width, int reduced, int words, index_t value_c,
                                                       index_t value_w, bool word_pairs, int live_steps, int thread) {
    const MmaFeaturePlace place(live_steps, word_pairs, thread, row_values, first, width, value_w);
#pragma unroll
    for (int v = 0; v < MMA_FEATURE_SHARE; ++v) {
        const int r = 2 * (place.word + v * place.step);
        share.words[v] = mma_feature_word(place.values, r, place.inside && r < 2 * words ? reduced - r : 0, value_c,
                                          word_pairs);
    }
}

// Stores the share into features [pixel][word] (`stride` words a pixel), then stages the
// thread's words past it.
__device__ __forceinline__ void mma_store_feature_share(unsigned int* features, const MmaFeatureShare& share,
                                                        const unsigned short* row_values, int first, int width,
                                                        int reduced, int words, int stride, index_t value_c,
                                                        index_t value_w, bool word_pairs, int live_steps, int thread) {
    const MmaFeaturePlace place(live_steps, word_pairs, thread, row_values, first, width, value_w);
    unsigned int* to = features + place.pixel * stride;
#pragma unroll
    for (int v = 0; v < MMA_FEATURE_SHARE; ++v) {
        const int word = place.word + v * place.step;
        if (word < words) to[word] = share.words[v];
    }
#pragma unroll 1
    for (int word = place.word + MMA_FEATURE_SHARE * place.step; word < words; word += place.step)
        to[word] = mma_feature_word(place.values, 2 * word, place.inside ? reduced - 2 * word : 0, value_c, word_pairs);
}

// The group's span_weight rows [tap][r] into `span` (`span_stride` words a row), rows past
// `taps` and words past R (to `span_words`) zeros. The block's threads take the rows' units as
// one run, consecutive threads consecutive units, a thread's units MMA_THREADS apart, SPAN_BATCH
// of them loaded before any is stored (a unit at a time, a large R's staging was a chain of
// round trips); a unit's row and column step with a carry, as staged_region's do (no division
// a unit). A unit is 8 values (one 16-byte load and store) where R is a multiple of 8 and the
// rows 16-byte aligned (RedNet's: every R is), else a word (two 16-bit loads): about 30
// instructions a word, where 8 threads a row with a batch along it (the earlier way) took 280
// instructions a warp at RedNet's stage 1 (R = 16), a tenth of the staged forward's. Every
// thread of the block takes part.
template <int WORDS>
struct alignas(4 * WORDS) SpanUnit {
    unsigned int lane[WORDS];
};

template <int UNIT_WORDS, int SPAN_BATCH>
__device__ __forceinline__ void mma_stage_span_units(unsigned int* span, const unsigned short* group_span,
                                                     int span_rows, int taps, int reduced, int span_words,
                                                     int span_stride, int thread) {
    typedef SpanUnit<UNIT_WORDS> Unit;
    const int row_units = span_words / UNIT_WORDS, units = span_rows * row_units;
    const int step = MMA_THREADS / row_units, shift = MMA_THREADS - step * row_units;
    int tap = thread / row_units, column = thread - tap * row_units;
#pragma unroll 1
    for (int unit0 = thread; unit0 < units; unit0 += SPAN_BATCH * MMA_THREADS) {
        Unit values[SPAN_BATCH];
        int places[SPAN_BATCH];
#pragma unroll
        for (int v = 0; v < SPAN_BATCH; ++v) {
            // a 32-bit offset in the group's rows (the 64-bit one took a dozen instructions a word)
            const int r = 2 * UNIT_WORDS * column, count = unit0 + v * MMA_THREADS < units && tap < taps ? reduced - r : 0;
            const unsigned short* at = group_span + (tap * reduced + r);
            if constexpr (UNIT_WORDS == 1)
                values[v].lane[0] = oplib_load_pair(at, 1, count);
            else
                values[v] = count > 0 ? *reinterpret_cast<const Unit*>(at) : Unit{};
            places[v] = tap * span_stride + UNIT_WORDS * column;
            column += shift;
            const bool carry = column >= row_units;
            column -= carry ? row_units : 0;
            tap += step + carry;
        }
#pragma unroll
        for (int v = 0; v < SPAN_BATCH; ++v)
            if (unit0 + v * MMA_THREADS < units) *reinterpret_cast<Unit*>(span + places[v]) = values[v];
    }
}

// SPAN_BATCH: a thread's units loaded before the first is stored (fewer where registers are held
// by other work: the staged forward's sums between its passes).
template <int SPAN_BATCH = 4>
__device__ __forceinline__ void mma_stage_span_rows(unsigned int* span, const unsigned short* group_span, int span_rows,
                                                    int taps, int reduced, int span_words, int span_stride,
                                                    int thread) {
    // span_words (8 a k-step) and span_stride (4 more) whole units of 4 words, rows 16-byte aligned
    if (reduced % 8 == 0 && reinterpret_cast<size_t>(group_span) % 16 == 0)
        mma_stage_span_units<4, SPAN_BATCH>(span, group_span, span_rows, taps, reduced, span_words, span_stride, thread);
    else
        mma_stage_span_units<1, SPAN_BATCH>(span, group_span, span_rows, taps, reduced, span_words, span_stride, thread);
}

// The group's span_bias in float into `span_bias` (span_rows floats, zeros past the taps, so that
// an n-tile's 8 rows may start at any tap): each of the staged kernels adds it to the weights it forms.
template <typename half_t>
__device__ __forceinline__ void mma_stage_span_bias(float* span_bias, const void* bias, int group, int taps,
                                                    int span_rows, int thread) {
    if (thread < span_rows) {
        const unsigned short* group_bias = reinterpret_cast<const unsigned short*>(bias) + (index_t)group * taps;
        span_bias[thread] = thread < taps ? mma_to_float(__ldg(group_bias + thread), half_t()) : 0.0f;
    }
}

// Instantiated for the forward's windows (the oplib-template line above).
//
// Block (32, MMA_WARPS); grid (tiles_h * tiles_w, groups, N), tiles of grad_input.
template <typename scalar_t, int KERNEL, int STRIDE>
__global__ void __launch_bounds__(MMA_THREADS, 2) involution_generated_mma_backward_input(
    const scalar_t* __restrict__ grad_output, const scalar_t* __restrict__ feature,
    const scalar_t* __restrict__ span_weight, const scalar_t* __restrict__ bias, scalar_t* __restrict__ grad_input,
    int channels, int height, int width, int groups, int window_h, int window_w, int out_h, int out_w, int step_h,
    int step_w, int pad_h, int pad_w, int spacing_h, int spacing_w, int reduced, int tiles_w, index_t grad_n,
    index_t grad_c, index_t grad_h, index_t grad_w, index_t in_n, index_t in_c, index_t in_hs, index_t in_ws,
    index_t feature_n, index_t feature_c, index_t feature_h, index_t feature_w, bool vector_grad, bool feature_words) {
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800
    if constexpr (sizeof(scalar_t) == 2) {
        const TileGeometry<KERNEL, STRIDE> geometry(window_h, window_w, step_h, step_w, spacing_h, spacing_w);
        const int kernel_h = geometry.kernel_h, kernel_w = geometry.kernel_w;
        const int stride_h = geometry.stride_h, stride_w = geometry.stride_w;
        const int dilation_h = geometry.dilation_h, dilation_w = geometry.dilation_w;
        typedef scalar_t half_t;
        const int warp = threadIdx.y, lane = threadIdx.x, thread = lane + 32 * warp;
        const int row = lane >> 2, quad = lane & 3;
        const int taps = kernel_h * kernel_w, group_channels = channels / groups;
        const int band_columns = (MMA_TILE_W - 1 + (kernel_w - 1) * dilation_w + stride_w - 1) / stride_w + 1;
        const int k_steps = (band_columns + 15) / 16, stride = 8 * k_steps + 4;
        const int rows_h = (MMA_TILE_H - 1 + (kernel_h - 1) * dilation_h + stride_h - 1) / stride_h + 1;
        const int span_rows = (kernel_h - 1) * kernel_w + 8, span_words = 8 * ((reduced + 15) / 16);
        const int span_stride = span_words + 4;
        OPLIB_DYNAMIC_SHARED(unsigned int, shared);
        unsigned int* span = shared;
        unsigned int* staged = span + span_rows * span_stride;
        const int band_words = MMA_WARPS * MMA_TILE_W * stride;
        unsigned int* band = staged + rows_h * MMA_CHANNELS * stride + warp * MMA_TILE_W * stride;
        unsigned int* features = staged + rows_h * MMA_CHANNELS * stride + 2 * band_words;

        const int tile_y = blockIdx.x / tiles_w, tile_x = blockIdx.x % tiles_w;
        const int y = tile_y * MMA_TILE_H + warp, x0 = tile_x * MMA_TILE_W;
        const int group = blockIdx.y;
        const index_t n = blockIdx.z;
        const bool row_inside = y < height;  // (a warp past the map still takes the block's barriers)
        // The output rows and columns the block's windows read begin at (first_row, first_column).
        const int first_row = mma_floor_div(tile_y * MMA_TILE_H + pad_h - (kernel_h - 1) * dilation_h, stride_h);
        const int first_column = mma_floor_div(x0 + pad_w - (kernel_w - 1) * dilation_w, stride_w);
        // The band's k-steps that hold output pixels of the map: those past its right edge hold
        // only zero weights times zero grad_output (a 7x7 map's runs read output columns -3 to 28,
        // the second k-step all past the map). The others' weights are neither formed nor applied.
        const int live_columns = out_w - first_column;
        const int live_steps = live_columns >= 16 * k_steps ? k_steps : live_columns <= 0 ? 0 : (live_columns + 15) / 16;

        const unsigned short* group_span = reinterpret_cast<const unsigned short*>(span_weight) + (index_t)group * taps * reduced;
        mma_stage_span_rows(span, group_span, span_rows, taps, reduced, span_words, span_stride, thread);
        // The bands' zeros 16 bytes a store, as the forward's.
        Vector16<unsigned int>* band_vectors = reinterpret_cast<Vector16<unsigned int>*>(band);
#pragma unroll 1
        for (int v = lane; v < MMA_TILE_W * stride / 4; v += 32)
            band_vectors[v] = band_vectors[band_words / 4 + v] = Vector16<unsigned int>{};
        unsigned short* band_bits = reinterpret_cast<unsigned short*>(band);
        const unsigned short* feature_bits = reinterpret_cast<const unsigned short*>(feature) + n * feature_n;
        const unsigned short* group_bias = reinterpret_cast<const unsigned short*>(bias) + (index_t)group * taps;

        const index_t group_channel0 = (index_t)group * group_channels;
        const unsigned short* sample_grad = reinterpret_cast<const unsigned short*>(grad_output) + n * grad_n;
        const bool pair_stores = mma_pair_stores(grad_input, in_n, in_c, in_hs, in_ws, group_channels);
        // The output rows the block reads that lie in the map (q_bottom to q_top, of rows_h).
        const int q_top = rows_h - 1 < out_h - 1 - first_row ? rows_h - 1 : out_h - 1 - first_row;
        const int q_bottom = first_row < 0 ? -first_row : 0;
        MmaFeatureShare share;
        for (int c0 = 0; c0 < group_channels; c0 += MMA_CHANNELS) {
            // the first row's feature in flight while the grad_output chunk is staged
            if (q_top >= q_bottom)
                mma_load_feature_share(share, feature_bits + (index_t)(first_row + q_top) * feature_h, first_column,
                                       out_w, reduced, span_words, feature_c, feature_w, feature_words, live_steps,
                                       thread);
            __syncthreads();  // every warp is done with the previous chunk (the first: the span is staged)
            mma_stage_rows<half_t>(staged, sample_grad + group_channel0 * grad_c, c0, group_channels, rows_h, 8 * k_steps,
                                   stride, first_row, first_column, out_h, out_w, grad_c, grad_h, grad_w, vector_grad,
                                   thread);
            OplibFragmentC sums[2] = {};
            // The output rows the block reads, the last first: input row y reads output row i
            // through kernel row a = (y + ph - i sh) / dh where that divides and lies in the window.
            // (A row's barriers order the grad_output chunk's staging before its reads as well.)
            // Rolled: each row's generation and band products are a long body already.
#pragma unroll 1
            for (int q = q_top; q >= q_bottom; --q) {
                const int i = first_row + q;
                __syncthreads();  // the previous row's feature is used (the first: grad_output is staged)
                mma_store_feature_share(features, share, feature_bits + (index_t)i * feature_h, first_column, out_w,
                                        reduced, span_words, span_stride, feature_c, feature_w, feature_words,
                                        live_steps, thread);
                __syncthreads();  // the row's feature is staged
                const int to_a = y + pad_h - i * stride_h;
                const int a = to_a / dilation_h;
                const bool reads = row_inside && to_a >= 0 && to_a == a * dilation_h && a < kernel_h;
                if (reads) {  // the warp's input row reads output row i, through kernel row a
                    // Row a's weights at the band's output pixels: C fragment m holds pixels first_column +
                    // 16 m + row, + 8 x taps a KW + 2 quad, + 1, from the bias on.
                    OplibFragmentC weights[MMA_GRAD_BAND / 16];
                    const int tap = a * kernel_w + 2 * quad;
                    const float bias_low = 2 * quad < kernel_w ? mma_to_float(__ldg(group_bias + tap), half_t()) : 0.0f;
                    const float bias_high = 2 * quad + 1 < kernel_w ? mma_to_float(__ldg(group_bias + tap + 1), half_t()) : 0.0f;
#pragma unroll
                    for (int m = 0; m < MMA_GRAD_BAND / 16; ++m) {
                        weights[m].value[0] = weights[m].value[2] = bias_low;
                        weights[m].value[1] = weights[m].value[3] = bias_high;
                    }
#pragma unroll 1
                    for (int k0 = 0; k0 < reduced; k0 += 16) {
                        const OplibFragmentB b = oplib_load_fragment_b(span + a * kernel_w * span_stride + k0 / 2, span_stride);
#pragma unroll
                        for (int m = 0; m < MMA_GRAD_BAND / 16; ++m) {
                            if (m >= live_steps) break;
                            oplib_mma<half_t>(weights[m], oplib_load_fragment_a(features + 16 * m * span_stride + k0 / 2, span_stride), b);
                        }
                    }
                    // Each value, split hi and lo, to its band places: output pixel o = first_column + k
                    // (band column k) and tap b serve input pixel x0 + j = o sw - pw + b dw. lo the
                    // short way, unchecked: an inf or a nan hi makes its products, hence the warp's
                    // sums, an inf or a nan, and the warp then takes the direct sums, which form each
                    // weight anew (the forward's direct sums read its split's hi and lo instead, so
                    // the forward takes the long way where a hi is an inf or a nan).
#pragma unroll
                    for (int m = 0; m < MMA_GRAD_BAND / 16; ++m) {
                        if (m >= live_steps) break;
#pragma unroll
                        for (int h = 0; h < 2; ++h) {
                            const int k = 16 * m + row + 8 * h, o = first_column + k;
                            const bool pixel_in = (unsigned int)o < (unsigned int)out_w;
                            const float w0 = pixel_in ? weights[m].value[2 * h] : 0.0f;
                            const float w1 = pixel_in ? weights[m].value[2 * h + 1] : 0.0f;
                            const unsigned int hi = mma_round_pair(w0, w1, half_t());
                            const unsigned int lo = mma_rest_pair_finite<half_t>(w0, w1, hi);
#pragma unroll
                            for (int e = 0; e < 2; ++e) {
                                const int b = 2 * quad + e, j = o * stride_w - pad_w + b * dilation_w - x0;
                                if (b >= kernel_w || (unsigned int)j >= (unsigned int)MMA_TILE_W) continue;
                                band_bits[2 * j * stride + k] = (unsigned short)(hi >> 16 * e);
                                band_bits[2 * band_words + 2 * j * stride + k] = (unsigned short)(lo >> 16 * e);
                            }
                        }
                    }
                }
                // The next row's feature, in flight during this row's band products (issued before
                // the weights are formed, it took registers that two blocks an SM do not have).
                if (q > q_bottom)
                    mma_load_feature_share(share, feature_bits + (index_t)(i - 1) * feature_h, first_column, out_w,
                                           reduced, span_words, feature_c, feature_w, feature_words, live_steps,
                                           thread);
                if (!reads) continue;
                __syncwarp();  // the bands of row a are written
                const unsigned int* rows = staged + q * MMA_CHANNELS * stride;
                mma_band_products<half_t, MMA_GRAD_BAND / 16, false>(sums, band, band_words, rows, stride, live_steps);
                __syncwarp();  // every lane is done with the bands of row a
            }
            if (!row_inside) continue;
            scalar_t* run = grad_input + n * in_n + group_channel0 * in_c + (index_t)y * in_hs + (index_t)x0 * in_ws;
            if (mma_any_non_finite(sums)) {  // oplib-cold: an inf or a nan among the warp's sums
                OPLIB_COLD_BLOCK();
                mma_backward_direct_sums(reinterpret_cast<const unsigned short*>(span), span_stride, bias + (index_t)group * taps,
                                         feature_bits, feature_c, feature_h, feature_w, reduced,
                                         reinterpret_cast<const unsigned short*>(staged), stride, first_row, first_column,
                                         run, in_c, in_ws, c0, group_channels, y, x0, width, out_h, out_w, kernel_h,
                                         kernel_w, stride_h, stride_w, pad_h, pad_w, dilation_h, dilation_w);
                continue;
            }
            mma_store_run(sums, run, in_c, in_ws, c0, group_channels, x0, width, pair_stores);
        }
    }
#endif
}

// ---------------------------------------------------------------------------------------
// involution_generated's grad_input with the weights staged: formed on tensor cores into
// shared memory, summed by FMAs (involution_generated_mma_backward_input_staged)
// ---------------------------------------------------------------------------------------
//
// The band kernel above spends its issue slots on the bands: each weight split in two, written
// to its band places, and multiplied with a band's zeros. Here the aggregation is involution's
// grad_input as the ops' kernels do it, in float FMAs, but with the weights and grad_output read
// from shared memory:
//   grad_input[n, c, y, x] = sum_{a, b} weight(n, g, a*K + b, i, o) * grad_output[n, c, i, o]
//   where i = (y + ph - a) / S and o = (x + pw - b) / S divide.
// A block of MMA_WARPS warps takes a tile of tile_h x tile_w input pixels of one (sample, group)
// and a chunk of MMA_CHANNELS of the group's channels (grid: tiles x groups x samples * chunks;
// a group's chunks form their weights each, as a loop over them in the block would):
//   1. forms every kernel row's taps (an n-tile of 8 a row, those past K unstored) at the output
//      rows the tile reads through any of them (tile_h / S through each, the rows' sets shifted
//      by a row or half of one) x the region's columns, (pixels x R)(R x K taps) + bias on
//      tensor cores, the feature's A fragment loaded from global memory once for all the rows'
//      n-tiles, span_weight's rows staged whole; each value a run reads in float into shared
//      memory ([tap][row][column]), 0 at pixels outside the map;
//   2. stages grad_output over the region of output pixels the tile's windows read, [row]
//      [column][channel], zeros outside the map, where the span rows were;
//   3. each thread sums, for its run of 4 input pixels (S columns apart: pixels of one column
//      parity) and 4 channels, each row's taps of its parity: the run's 4 weights of a tap one
//      16-byte load (each tap's row of the buffer shifted so that it is aligned), each
//      grad_output vector of the window (4 channels, 8 bytes) read once and used by every tap
//      and pixel it meets.
// Every row at once: a tile's output rows formed once, where a row at a time formed each of them
// for each kernel row that reads it (a stride-1 tile of 8 rows: 56 output rows formed in place of
// 14), and a pixel's feature loads and addresses once for the K rows' products and stores. A
// pixel's places step by constants from its place in kernel row 0's weights (a row on, K taps on;
// its second tap a constant further at stride 1, one of two at stride 2); a value no run reads
// (a pixel of a row no run of the kernel row reads, or past a tap's runs) is unstored: a
// predicated store, no branch. The float32 way (below) forms a row at a time
// into two buffers, the next rows' while these rows' are summed (STAGED_GRAD_ROWS).
// A warp's 8 runs x 4 channel quarters lie on one row parity and one column parity (S = 2: the
// 4 parity classes are 4 of the block's warps each), so a warp's taps and rows are the same
// for all its lanes: no divergence. runs_w (the host's choice: 8, 4 or 2, a warp's runs along a
// row; 8 / runs_w rows of runs) fits the tile to the map (56 and 28 wide: 32 columns at S = 1;
// 14: 16). Every sum in a fixed order, no atomics: deterministic. An inf or a nan lands where
// the direct sum puts it: each weight is a whole dot product (no band zeros), and a pixel
// outside the map has weight 0 and grad_output 0.
//
// Dynamic shared memory (generated_mma_staged_shared_bytes), 32-bit words:
//   span     span_rows x span_stride            span_weight's rows of the group, as the band
//                                               kernel stages them (while the weights are formed)
//   bias     span_rows                          float, the group's bias, zeros past its taps
//   staged   region_h x region_w x STAGED_PIXEL  grad_output, a pixel's 16 channels as 8 words
//                                               of two 16-bit values, and 2 words of padding
//                                               (runs 4 pixels apart in different banks), in
//                                               the span rows' place once the weights are formed
//   weights  (K x K + 1) taps x tap_stride      float, [tap][row][place], after the larger of the
//                                               two above: tap a K + b kernel row a's tap b (the
//                                               one tap past them: a run of the odd column parity
//                                               at S = 2 loads a tap past its row's, unused);
//                                               place 4 run_x + p holds the weight the tap gives
//                                               pixel p of the runs run_x (staged_tap_offset),
//                                               rows tile_w / S apart, taps tap_stride apart (4
//                                               past a multiple of 32: a D fragment's stores in
//                                               different banks)
// where region_h x region_w is the most output pixels a tile's windows read. The float32 way's
// layout: its helpers' comment.

constexpr int STAGED_RUN = 4;  // a thread's pixels, and its channels (a quarter of MMA_CHANNELS)
constexpr int STAGED_PIXEL = 10;  // words a staged grad_output pixel: 8, and 2 of padding
// The float32 grad_input's kernel rows formed at once: one, in two buffers (its span rows and
// grad_output in floats leave no room for every row's weights at three blocks an SM, and every
// row at once spilled at 80 registers on sm_90).
constexpr int STAGED_GRAD_ROWS = 1;
static_assert(STAGED_GRAD_ROWS >= 1, "a kernel row at least");
static_assert(MMA_CHANNELS == 4 * STAGED_RUN && MMA_THREADS == 256, "a warp's lanes: 8 runs x 4 channel quarters");
static_assert(STAGED_PIXEL % 2 == 0 && STAGED_PIXEL >= MMA_CHANNELS / 2 && STAGED_PIXEL % 8 != 0,
              "a quarter's 2 words 8-byte aligned; runs 4 pixels apart not all in the same banks");

// A thread's 4 channels of a staged grad_output pixel: one 8-byte load.
struct alignas(8) StagedQuarter {
    unsigned int word[2];
};

// A D fragment's two taps' bias, staged in float: one 8-byte load.
struct alignas(8) StagedBias {
    float value[2];
};

// A region of region_h x region_w pixels of a map of rows x columns (its pixel (ri, col) the
// map's (first_row + ri, first_column + col): zeros outside the map) staged in 16-bit values,
// the chunk's MMA_CHANNELS channels from c0 (zeros past the group's) a pixel, STAGED_PIXEL words
// apart: pixel (ri, col) at place ri * pitch + col, or SPLIT = 2 each row's even columns first,
// then its odd ones (col / 2, and (region_w + 1) / 2 + col / 2; pitch twice that), so that runs
// reading every other column read consecutive places. `plane` is the map at the group's first
// channel. `samples` regions one after the other, of the maps sample_step apart, those from the
// `present`-th zeros (samples past the batch). A unit is a pixel's 8 channels (half the chunk):
// one 16-byte load where the host says they are a vector (channels_last, aligned); else, where
// a row's columns pair into aligned words (NCHW, even widths and strides: staged_region_pairs),
// 8 channels x 2 columns; else two 16-bit loads a pair; 4 word stores.
template <int SPLIT>
__device__ __forceinline__ int staged_place(int ri, int col, int pitch, int region_w) {
    return ri * pitch + (SPLIT == 2 ? (col & 1) * ((region_w + 1) >> 1) + (col >> 1) : col);
}

// staged_region's NCHW way where a row's columns pair into aligned 32-bit words: a unit is a
// pixel pair's 8 channels (half the chunk; x even), a word load a channel, joined into each
// column's 4 channel pairs (two 8-byte stores a column): about 7 instructions a value in its
// sm_90 SASS, where 16-bit loads took about 14.5 at RedNet's NCHW stage 1. Units along a row's column pairs, then
// the chunk's halves, then the rows, stepping a block's worth a trip with a carry (no division
// a unit); a 32-bit offset from `plane` (the host's maps: `offsets_fit`).
template <int SPLIT>
__device__ __forceinline__ void staged_region_pairs(unsigned int* staged, const unsigned short* plane, int c0,
                                                    int group_channels, int region_h, int region_w, int pitch,
                                                    int samples, int present, int sample_step, int first_row,
                                                    int first_column, int rows, int columns, int c_stride,
                                                    int h_stride, unsigned int sample_magic, int thread) {
    const int first_even = first_column & ~1, lead = first_column - first_even;  // (floored for negatives too)
    const int row_pairs = (region_w + lead + 1) >> 1, lines = samples * region_h * 2;
    const int step = MMA_THREADS / row_pairs, shift = MMA_THREADS - step * row_pairs;
    int line = thread / row_pairs, pair = thread - line * row_pairs;  // line: (row, half)
#pragma unroll 1
    while (line < lines) {
        const int ri = line >> 1, half = line & 1;
        const int sample = (int)(((unsigned int)ri * sample_magic) >> 16), i = first_row + ri - sample * region_h;
        const int x = first_even + 2 * pair, c = c0 + 8 * half;
        // x is even and so is the width: the pair lies in the map whole or not at all
        const bool in_map =
            sample < present && (unsigned int)i < (unsigned int)rows && (unsigned int)x < (unsigned int)columns;
        const unsigned int* at =
            reinterpret_cast<const unsigned int*>(plane + (sample * sample_step + c * c_stride + i * h_stride + x));
        unsigned int words[8];
#pragma unroll
        for (int k = 0; k < 8; ++k) words[k] = in_map && c + k < group_channels ? __ldg(at + k * (c_stride >> 1)) : 0u;
        StagedQuarter columns_words[2][2];  // [column][quarter]: channel pairs (k, k + 1)
#pragma unroll
        for (int k = 0; k < 8; k += 2) {
            columns_words[0][k >> 2].word[(k >> 1) & 1] = (words[k] & 0xffffu) | (words[k + 1] << 16);
            columns_words[1][k >> 2].word[(k >> 1) & 1] = (words[k] >> 16) | (words[k + 1] & 0xffff0000u);
        }
        const int col = x - first_column;  // the region column of the pair's first
#pragma unroll
        for (int p = 0; p < 2; ++p) {
            if (col + p < 0 || col + p >= region_w) continue;
            StagedQuarter* to = reinterpret_cast<StagedQuarter*>(
                staged + staged_place<SPLIT>(ri, col + p, pitch, region_w) * STAGED_PIXEL + 4 * half);
            to[0] = columns_words[p][0];
            to[1] = columns_words[p][1];
        }
        pair += shift;
        const bool carry = pair >= row_pairs;
        pair -= carry ? row_pairs : 0;
        line += step + carry;
    }
}

template <int SPLIT>
__device__ __forceinline__ void staged_region(unsigned int* staged, const unsigned short* plane, int c0,
                                              int group_channels, int region_h, int region_w, int pitch,
                                              int samples, int present, index_t sample_step, int first_row,
                                              int first_column, int rows, int columns, index_t c_stride,
                                              index_t h_stride, index_t w_stride, bool vector, int thread) {
    // A thread's units step a block's worth (MMA_THREADS) a trip: `step` rows and `shift`
    // columns, and a row more where the columns pass the row's end (a select, not a branch),
    // its half fixed (a row holds an even number of units), where dividing each unit's index by
    // the row's runtime length took a dozen instructions a trip.
    const int row_units = 2 * region_w, step = MMA_THREADS / row_units;
    const int shift = (MMA_THREADS - step * row_units) / 2, half = thread & 1, c = c0 + 8 * half;
    // A staged row ri's sample, ri / region_h, by a multiply and a shift: exact for ri < 2^16 /
    // region_h (the error ri (ceil(2^16 / region_h) region_h - 2^16) / 2^16 / region_h stays
    // under 1 / region_h), here at most 4 x 69 rows.
    const unsigned int sample_magic = (65536u + region_h - 1) / region_h;
    // (the pair way's 32-bit offsets: the samples' regions' furthest element within 2^31)
    const bool offsets_fit = (samples * sample_step + group_channels * c_stride + rows * h_stride + columns) < (1ll << 31);
    if (!vector && w_stride == 1 && ((columns | c_stride | h_stride | sample_step) & 1) == 0 && offsets_fit &&
        reinterpret_cast<size_t>(plane) % 4 == 0) {
        staged_region_pairs<SPLIT>(staged, plane, c0, group_channels, region_h, region_w, pitch, samples, present,
                                   (int)sample_step, first_row, first_column, rows, columns, (int)c_stride,
                                   (int)h_stride, sample_magic, thread);
        return;
    }
    int ri = thread / row_units, col = (thread - ri * row_units) >> 1;
#pragma unroll 1
    while (ri < samples * region_h) {
        const int sample = (int)(((unsigned int)ri * sample_magic) >> 16), i = first_row + ri - sample * region_h;
        const int o = first_column + col;
        const bool in_map = sample < present && (unsigned int)i < (unsigned int)rows &&
                            (unsigned int)o < (unsigned int)columns;
        const unsigned short* at = plane + sample * sample_step + (index_t)c * c_stride + (index_t)i * h_stride +
                                   (index_t)o * w_stride;
        unsigned int words[4] = {};
        if (vector) {
            if (in_map && c < group_channels) {
                const Vector16<unsigned int> v = *reinterpret_cast<const Vector16<unsigned int>*>(at);
#pragma unroll
                for (int m = 0; m < 4; ++m) words[m] = v.lane[m];
            }
        } else {
#pragma unroll
            for (int m = 0; m < 4; ++m)
                words[m] = oplib_load_pair(at + 2 * m * c_stride, c_stride, in_map ? group_channels - c - 2 * m : 0);
        }
        unsigned int* to = staged + staged_place<SPLIT>(ri, col, pitch, region_w) * STAGED_PIXEL + 4 * half;
#pragma unroll
        for (int m = 0; m < 4; ++m) to[m] = words[m];
        col += shift;
        const bool carry = col >= region_w;
        col -= carry ? region_w : 0;
        ri += step + carry;
    }
}

// A k-step's A fragment of the feature at the lane's two pixels: `values` point at each pixel's
// reduced channel r0 = k0 + 2 quad (the lane's first) and move on past the k-step; channels
// feature_step apart (pairs one aligned word where the host says so: feature_words), zeros past
// R and at a pixel outside the map (inside[h] false).
__device__ __forceinline__ OplibFragmentA staged_feature_fragment(const unsigned short* (&values)[2],
                                                                  const bool (&inside)[2], int r0, int reduced,
                                                                  index_t feature_step, bool feature_words) {
    const index_t eighth_step = 8 * feature_step;
    OplibFragmentA f;
#pragma unroll
    for (int v = 0; v < 4; ++v) {
        const int h = v & 1, r = r0 + 8 * (v >> 1), count = inside[h] ? reduced - r : 0;
        const unsigned short* pair = values[h] + (v >> 1) * eighth_step;
        f.reg[v] = feature_words ? (count > 0 ? __ldg(reinterpret_cast<const unsigned int*>(pair)) : 0u)
                                 : oplib_load_pair(pair, feature_step, count);
    }
#pragma unroll
    for (int h = 0; h < 2; ++h) values[h] += 2 * eighth_step;
    return f;
}

// staged_feature_fragment where the lane's two pixels are adjacent columns of an NCHW feature
// whose pixel pairs are aligned words (FEATURE_PAIRS, the host's generated_mma_feature_pairs; the
// staged forward's lane takes pixels 2 row and 2 row + 1 of its m-tile): a channel's word holds
// both pixels' values, and two channels' words give each pixel's pair (its A register), so a
// k-step is four word loads where a pair of 16-bit loads a register took eight. `values` points at the first pixel's reduced
// channel r0 = k0 + 2 quad and moves on past the k-step; zeros past R and outside the map (both
// pixels are in it or neither: an even width, an even first column).
__device__ __forceinline__ OplibFragmentA staged_feature_pixel_pairs(const unsigned short*& values, bool inside, int r0,
                                                                     int reduced, index_t feature_c) {
    OplibFragmentA f;
#pragma unroll
    for (int half = 0; half < 2; ++half) {
        const int r = r0 + 8 * half;
        const unsigned short* channel = values + 8 * half * feature_c;
        const unsigned int first = inside && r < reduced ? __ldg(reinterpret_cast<const unsigned int*>(channel)) : 0u;
        const unsigned int second =
            inside && r + 1 < reduced ? __ldg(reinterpret_cast<const unsigned int*>(channel + feature_c)) : 0u;
        f.reg[2 * half] = (first & 0xffffu) | second << 16;  // the first pixel's channels r, r + 1
        f.reg[2 * half + 1] = first >> 16 | (second & 0xffff0000u);  // the second pixel's
    }
    values += 16 * feature_c;
    return f;
}

// A thread's run's sums, rounded, to its 4 pixels (columns x + step p, those before `columns`;
// `at` the run's row at its first channel c) and 4 channels (those of the group's): a pair of
// channels one word where the host's layout allows it (pair_stores), else 16-bit stores.
template <typename half_t>
__device__ __forceinline__ void staged_store_run(const float (&sums)[STAGED_RUN][STAGED_RUN], half_t* at, int x, int step,
                                                 int columns, index_t w_stride, int c, int group_channels,
                                                 index_t c_stride, bool pair_stores) {
#pragma unroll
    for (int p = 0; p < STAGED_RUN; ++p) {
        const int xp = x + step * p;
        if (xp >= columns) continue;
        unsigned short* pixel = reinterpret_cast<unsigned short*>(at + (index_t)xp * w_stride);
#pragma unroll
        for (int e = 0; e < STAGED_RUN; e += 2) {
            const unsigned int pair = mma_round_pair(sums[p][e], sums[p][e + 1], half_t());
            if (pair_stores && c + e < group_channels) {
                *reinterpret_cast<unsigned int*>(pixel + e) = pair;
                continue;
            }
            if (c + e < group_channels) pixel[e * c_stride] = (unsigned short)(pair & 0xffffu);
            if (c + e + 1 < group_channels) pixel[(e + 1) * c_stride] = (unsigned short)(pair >> 16);
        }
    }
}

// The output rows (or columns) a tile of `tile` input pixels from `origin` reads, from
// first = floor((origin + pad - (K - 1)) / S): at most (tile - 1 + K - 1 + S - 1) / S + 1 of them.
template <int KERNEL, int STRIDE>
__device__ __forceinline__ int staged_first_read(int origin, int pad) {
    return mma_floor_div(origin + pad - (KERNEL - 1), STRIDE);
}

// The region column that tap b reads at the first pixel of run 0 of the threads that read the
// tap (those of column parity b - pw): the weights buffer holds tap b's row from there, so that
// a run's 4 weights lie at 4 run_x, one aligned 16-byte load. column_base = tile_x + pad_w, and
// column_base - b + parity = tile_x - S floor((b - pad_w) / S), a multiple of S (tile_x is): a
// shift divides it exactly.
template <int STRIDE>
__device__ __forceinline__ int staged_tap_offset(int b, int column_base, int pad_w, int first_column) {
    static_assert(STRIDE == 1 || STRIDE == 2, "a shift divides by the stride");
    const int parity = (b - pad_w) & (STRIDE - 1);
    return ((column_base - b + parity) >> (STRIDE - 1)) - first_column;
}

// One kernel row's sums for a thread's run: its taps b0 + S t (t < taps: TAPS, or one fewer for
// the odd column parity of an odd K at S = 2), each tap's 4 weights from `first_tap` (tap b0's
// row, the run's place in it; tap t's S t rows further), the window's grad_output pixels from
// `window` (the first the run's tap TAPS - 1 would read), STAGED_PIXEL words apart. A missing
// tap is left out, not given weight 0: its window pixel may hold an inf.
template <typename half_t, int TAPS>
__device__ __forceinline__ void staged_row_sums(float (&sums)[STAGED_RUN][STAGED_RUN], const float* first_tap,
                                                int tap_step, int taps, const unsigned int* window) {
    float w[TAPS][STAGED_RUN];
#pragma unroll
    for (int t = 0; t < TAPS; ++t) {
        const Vector16<float> v = *reinterpret_cast<const Vector16<float>*>(first_tap + t * tap_step);
#pragma unroll
        for (int p = 0; p < STAGED_RUN; ++p) w[t][p] = v.lane[p];
    }
    // Window pixel k meets the run's pixel p through tap t = p + TAPS - 1 - k.
#pragma unroll
    for (int k = 0; k < STAGED_RUN + TAPS - 1; ++k) {
        const StagedQuarter quarter = *reinterpret_cast<const StagedQuarter*>(window + k * STAGED_PIXEL);
        const float g[STAGED_RUN] = {mma_to_float((unsigned short)(quarter.word[0] & 0xffffu), half_t()),
                                     mma_to_float((unsigned short)(quarter.word[0] >> 16), half_t()),
                                     mma_to_float((unsigned short)(quarter.word[1] & 0xffffu), half_t()),
                                     mma_to_float((unsigned short)(quarter.word[1] >> 16), half_t())};
#pragma unroll
        for (int t = TAPS - 1; t >= 0; --t) {
            const int p = k + t - (TAPS - 1);
            if (p < 0 || p >= STAGED_RUN || t >= taps) continue;
#pragma unroll
            for (int c = 0; c < STAGED_RUN; ++c) sums[p][c] = oplib_fma(w[t][p], g[c], sums[p][c]);
        }
    }
}

// The staged kernels in float32 (the staged grad_input below and the staged forward after it):
// the same kernels with their products in 3xTF32 (warp.cuh), where FMAs could not reach the
// op's bar (the tiled FMA kernel is issue-bound: one FFMA a multiply-add a lane, where a TF32
// mma does 1024 of them a warp and 3xTF32 keeps a float's accuracy). What differs from the
// 16-bit way (the "wide" helpers below):
//   - span rows in float, [tap][r], staged_wide_span_stride floats a row (R in whole k-steps of
//     8, and 8 more where that is a multiple of 16: a B fragment's 8-byte loads, taps group x
//     reduced 2 quad, of each half-warp in 32 banks); the forward's a pass's rows at a time at
//     both strides, the grad_input's all of the group's, as its 16-bit way's;
//   - the input (grad_output) staged in float, a pixel's 16 channels and 4 floats of padding
//     (STAGED_WIDE_PIXEL: a quarter's 16-byte loads by runs 4 pixels apart in different banks);
//     the forward at stride 2, whose region is four times as large (16 channels of RedNet-50's
//     stride-2 regions took 112-116 KiB, past the 99 KiB every architecture gives a block), takes
//     a chunk of 8 channels a block (STAGED_WIDE_HALF channels, a thread 2 of them; a pixel 8
//     floats and 2 of padding, STAGED_WIDE_HALF_PIXEL), each chunk's block forming the weights
//     again (the grad_input's region, of output pixels, is a quarter of it there);
//   - k-steps of 8, whose k order is permuted alike in A and B: the fragment's column quad is
//     reduced channel k0 + 2 quad and column quad + 4 is k0 + 2 quad + 1, so that a lane's two
//     values of a pixel are adjacent channels (one 8-byte load channels_last) and its two of a
//     span row adjacent floats (one 8-byte shared load);
//   - each operand split into TF32 hi and lo as it is loaded; a warp whose formed weights are not
//     all finite (an inf or a nan in the feature, span_weight or bias, which the split turns into
//     nans) forms them again by the direct sum in float, from the same staged span rows: inf and
//     nan land where torch puts them (the aggregation is FMAs, as the 16-bit way's);
//   - the sums stored as they are (pairs of channels one 8-byte store where the layout allows).
constexpr int STAGED_WIDE_PIXEL = 20;  // floats a staged input pixel: 16 channels, 4 of padding
constexpr int STAGED_WIDE_HALF = 8;  // stride 2's chunk of channels
constexpr int STAGED_WIDE_HALF_PIXEL = 10;  // floats a pixel of it: 8 channels, 2 of padding
static_assert(STAGED_WIDE_PIXEL >= MMA_CHANNELS && STAGED_WIDE_PIXEL % 4 == 0 && STAGED_WIDE_PIXEL % 8 != 0,
              "a quarter one aligned 16-byte load; runs 4 pixels apart in different banks");
static_assert(STAGED_WIDE_HALF_PIXEL >= STAGED_WIDE_HALF && STAGED_WIDE_HALF_PIXEL % 2 == 0 &&
                  STAGED_WIDE_HALF_PIXEL % 8 != 0,
              "a quarter one aligned 8-byte load; runs 4 pixels apart in different banks");

// A thread's CH channels of a staged pixel: one 16-byte (CH 4) or 8-byte (CH 2) load or store.
template <int CH>
struct alignas(4 * CH) StagedWideQuarter {
    float lane[CH];
};

// Floats a staged span row: R in whole k-steps of 8, 8 past a multiple of 16.
__host__ __device__ constexpr int staged_wide_span_stride(int reduced) {
    return 8 * ((reduced + 7) / 8) % 16 == 0 ? 8 * ((reduced + 7) / 8) + 8 : 8 * ((reduced + 7) / 8);
}

// Two floats of one 8-byte load or store.
struct alignas(8) StagedWidePair {
    float value[2];
};

// `count` rows of span_weight from `rows` (R floats each; those from the `rows_left`-th zeros:
// past the window's taps) into span [row][r], `stride` floats a row, zeros past R to a whole
// k-step. Consecutive threads along a row, every thread of the block.
__device__ __forceinline__ void staged_wide_span_rows(float* span, const float* rows, int count, int rows_left,
                                                      int reduced, int stride, int thread) {
    const int steps = 8 * ((reduced + 7) / 8);
#pragma unroll 1
    for (int unit = thread; unit < count * steps; unit += MMA_THREADS) {
        const int row = unit / steps, r = unit - row * steps;
        span[row * stride + r] = row < rows_left && r < reduced ? __ldg(rows + (index_t)row * reduced + r) : 0.0f;
    }
}

// staged_region in float: the chunk's 4 CH channels a pixel, PIXEL floats apart, at
// staged_place's places. A unit is a pixel's quarter (CH channels): one load where the host
// says they are a vector (channels_last, 16-byte aligned), units along a pixel's quarters, then
// its columns; else CH loads c_stride apart, units along a row's columns (consecutive threads
// consecutive columns: NCHW's loads coalesce), then the quarters. A thread's units step a
// block's worth a trip with a carry (no division a unit); a staged row's sample by staged_region's
// multiply and shift.
template <int SPLIT, int CH, int PIXEL>
__device__ __forceinline__ void staged_wide_region(float* staged, const float* plane, int c0, int group_channels,
                                                   int region_h, int region_w, int pitch, int samples, int present,
                                                   index_t sample_step, int first_row, int first_column, int rows,
                                                   int columns, index_t c_stride, index_t h_stride, index_t w_stride,
                                                   bool vector, int thread) {
    const unsigned int sample_magic = (65536u + region_h - 1) / region_h;
    // vector: a line is a staged row, a thread's quarter fixed (the block's threads a multiple of
    // 4); else a line is a (staged row, quarter), the quarter its lowest 2 bits
    const int per_line = region_w, threads = vector ? MMA_THREADS / 4 : MMA_THREADS;
    const int first = vector ? thread >> 2 : thread, lines = vector ? samples * region_h : 4 * samples * region_h;
    const int step = threads / per_line, shift = threads - step * per_line;
    int line = first / per_line, col = first - line * per_line;
#pragma unroll 1
    while (line < lines) {
        const int ri = vector ? line : line >> 2, quarter = vector ? thread & 3 : line & 3;
        const int sample = (int)(((unsigned int)ri * sample_magic) >> 16), i = first_row + ri - sample * region_h;
        const int o = first_column + col, c = c0 + CH * quarter;
        const bool in_map = sample < present && (unsigned int)i < (unsigned int)rows &&
                            (unsigned int)o < (unsigned int)columns;
        const float* at = plane + sample * sample_step + (index_t)c * c_stride + (index_t)i * h_stride +
                          (index_t)o * w_stride;
        StagedWideQuarter<CH> v;
        if (vector) {
            v = in_map && c < group_channels ? *reinterpret_cast<const StagedWideQuarter<CH>*>(at)
                                             : StagedWideQuarter<CH>{};
        } else {
#pragma unroll
            for (int m = 0; m < CH; ++m) v.lane[m] = in_map && c + m < group_channels ? __ldg(at + m * c_stride) : 0.0f;
        }
        *reinterpret_cast<StagedWideQuarter<CH>*>(staged + staged_place<SPLIT>(ri, col, pitch, region_w) * PIXEL +
                                                  CH * quarter) = v;
        col += shift;
        const bool carry = col >= per_line;
        col -= carry ? per_line : 0;
        line += step + carry;
    }
}

// A k-step's A fragments, hi and lo, of the feature at the lane's two pixels (rows group and
// group + 8): `values` point at each pixel's reduced channel r0 = k0 + 2 quad and move on past
// the k-step; channels feature_step apart (a pair one aligned 8-byte load where the host says so:
// feature_words, R even), zeros past R and at a pixel outside the map (inside[h] false). Column
// quad is channel r0, column quad + 4 channel r0 + 1 (the permuted k order).
__device__ __forceinline__ void staged_wide_feature_fragments(const float* (&values)[2], const bool (&inside)[2],
                                                              int r0, int reduced, index_t feature_step,
                                                              bool feature_words, OplibFragmentTf32A& hi,
                                                              OplibFragmentTf32A& lo) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        const int count = inside[h] ? reduced - r0 : 0;
        float v[2] = {0.0f, 0.0f};
        if (feature_words) {
            if (count > 0) {
                const StagedWidePair pair = *reinterpret_cast<const StagedWidePair*>(values[h]);
                v[0] = pair.value[0];
                v[1] = pair.value[1];
            }
        } else {
            v[0] = count > 0 ? __ldg(values[h]) : 0.0f;
            v[1] = count > 1 ? __ldg(values[h] + feature_step) : 0.0f;
        }
#pragma unroll
        for (int e = 0; e < 2; ++e) oplib_split_tf32_into(hi, lo, 2 * e + h, v[e]);
        values[h] += 8 * feature_step;
    }
}

// One kernel row's sums for a thread's run in float: staged_forward_row_sums with the window's
// pixels' CH channels one load each, PIXEL floats apart.
template <int K, int S, int CH, int PIXEL>
__device__ __forceinline__ void staged_wide_row_sums(float (&sums)[STAGED_RUN][CH], const float* first_tap,
                                                     int tap_stride, const float* window, int odd) {
    float w[K][STAGED_RUN];
#pragma unroll
    for (int b = 0; b < K; ++b) {
        const Vector16<float> v = *reinterpret_cast<const Vector16<float>*>(first_tap + b * tap_stride);
#pragma unroll
        for (int p = 0; p < STAGED_RUN; ++p) w[b][p] = v.lane[p];
    }
#pragma unroll
    for (int k = 0; k < S * (STAGED_RUN - 1) + K; ++k) {
        const float* at = S == 2 ? window + (k & 1) * odd + (k >> 1) * PIXEL : window + k * PIXEL;
        const StagedWideQuarter<CH> x = *reinterpret_cast<const StagedWideQuarter<CH>*>(at);
#pragma unroll
        for (int p = 0; p < STAGED_RUN; ++p) {
            const int b = k - S * p;
            if (b < 0 || b >= K) continue;
#pragma unroll
            for (int c = 0; c < CH; ++c) sums[p][c] = oplib_fma(w[b][p], x.lane[c], sums[p][c]);
        }
    }
}

// staged_row_sums in float (the staged grad_input's): a window pixel's 4 channels one 16-byte
// load, STAGED_WIDE_PIXEL floats apart.
template <int TAPS>
__device__ __forceinline__ void staged_wide_grad_row_sums(float (&sums)[STAGED_RUN][STAGED_RUN], const float* first_tap,
                                                          int tap_step, int taps, const float* window) {
    float w[TAPS][STAGED_RUN];
#pragma unroll
    for (int t = 0; t < TAPS; ++t) {
        const Vector16<float> v = *reinterpret_cast<const Vector16<float>*>(first_tap + t * tap_step);
#pragma unroll
        for (int p = 0; p < STAGED_RUN; ++p) w[t][p] = v.lane[p];
    }
#pragma unroll
    for (int k = 0; k < STAGED_RUN + TAPS - 1; ++k) {
        const Vector16<float> g = *reinterpret_cast<const Vector16<float>*>(window + k * STAGED_WIDE_PIXEL);
#pragma unroll
        for (int t = TAPS - 1; t >= 0; --t) {
            const int p = k + t - (TAPS - 1);
            if (p < 0 || p >= STAGED_RUN || t >= taps) continue;
#pragma unroll
            for (int c = 0; c < STAGED_RUN; ++c) sums[p][c] = oplib_fma(w[t][p], g.lane[c], sums[p][c]);
        }
    }
}

// A thread's run's float sums to its 4 pixels (columns x + step p, those before `columns`; `at` the
// run's row at its first channel c) and CH channels (those of the group's): a pair of channels
// one 8-byte store where the layout allows it (pair_stores), else one store a value.
template <int CH>
__device__ __forceinline__ void staged_wide_store_run(const float (&sums)[STAGED_RUN][CH], float* at, int x, int step,
                                                      int columns, index_t w_stride, int c, int group_channels,
                                                      index_t c_stride, bool pair_stores) {
#pragma unroll
    for (int p = 0; p < STAGED_RUN; ++p) {
        const int xp = x + step * p;
        if (xp >= columns) continue;
        float* pixel = at + (index_t)xp * w_stride;
#pragma unroll
        for (int e = 0; e < CH; e += 2) {
            if (pair_stores && c + e < group_channels) {
                *reinterpret_cast<StagedWidePair*>(pixel + e) = StagedWidePair{{sums[p][e], sums[p][e + 1]}};
                continue;
            }
            if (c + e < group_channels) pixel[e * c_stride] = sums[p][e];
            if (c + e + 1 < group_channels) pixel[(e + 1) * c_stride] = sums[p][e + 1];
        }
    }
}

// Instantiated for the forward's windows (the oplib-template line above); only the square
// windows of KERNEL and STRIDE (1 or 2) are served: KERNEL = 0's instantiation is empty, and
// the host declines other geometries (the map route serves them).
//
// Block (32, MMA_WARPS); grid (tiles_h * tiles_w, groups, N * chunks), tiles of grad_input.
// VECTORS as the staged forward's (grad_output's units vectors, the feature's pairs words,
// grad_input's pairs word stores): that instantiation holds only those ways.
// RedNet's 7x7 windows: three blocks an SM at both strides from sm_90 on (80 registers, no
// spill; sm_90's 228 KiB hold three of RedNet-50's stride-1 tiles, 70-72 KiB with every kernel
// row's weights), two before (sm_80's 164 KiB hold two at stride 1; its stride-2 NCHW
// instantiation spilled 12 bytes at three); the other windows two (they spilled at three on
// sm_80, sm_100 or sm_120).
#define OPLIB_STAGED_GRAD_BLOCKS OPLIB_BLOCKS_BY_ARCH(2, 2, 3, 3)
#define OPLIB_STAGED_GRAD_STRIDED_BLOCKS OPLIB_BLOCKS_BY_ARCH(2, 2, 3, 3)
// float32's (its span rows and grad_output in floats: 62-69 KiB at RedNet-50's stride-1 shapes,
// 30-45 KiB at stride 2): three at stride 1 from sm_90 on (80 registers, no spill), two before
// (sm_80's 164 KiB hold two); two at stride 2 (its NCHW instantiation spilled 4 bytes at three
// on sm_90).
#define OPLIB_STAGED_GRAD_WIDE_BLOCKS OPLIB_BLOCKS_BY_ARCH(2, 2, 3, 3)
// The blocks an SM the staged grad_input asks for (a variable: see STAGED_FORWARD_BLOCKS).
template <typename scalar_t, int KERNEL, int STRIDE>
constexpr int STAGED_GRAD_BLOCKS = KERNEL != 7               ? 2
                                   : sizeof(scalar_t) == 4 ? STRIDE == 1 ? OPLIB_STAGED_GRAD_WIDE_BLOCKS : 2
                                   : STRIDE == 1             ? OPLIB_STAGED_GRAD_BLOCKS
                                                             : OPLIB_STAGED_GRAD_STRIDED_BLOCKS;
template <typename scalar_t, int KERNEL, int STRIDE, bool VECTORS>
__global__ void __launch_bounds__(MMA_THREADS, STAGED_GRAD_BLOCKS<scalar_t, KERNEL, STRIDE>)
    involution_generated_mma_backward_input_staged(
    const scalar_t* __restrict__ grad_output, const scalar_t* __restrict__ feature,
    const scalar_t* __restrict__ span_weight, const scalar_t* __restrict__ bias, scalar_t* __restrict__ grad_input,
    int channels, int height, int width, int groups, int out_h, int out_w, int pad_h, int pad_w, int reduced,
    int tiles_w, int runs_w, index_t grad_n, index_t grad_c, index_t grad_h, index_t grad_w, index_t in_n,
    index_t in_c, index_t in_hs, index_t in_ws, index_t feature_n, index_t feature_c, index_t feature_h,
    index_t feature_w, bool vector_grad, bool feature_words) {
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800
    if constexpr (sizeof(scalar_t) == 2 && KERNEL > 0 && STRIDE <= 2) {
        typedef scalar_t half_t;
        constexpr int K = KERNEL, S = STRIDE, TAPS = (K + S - 1) / S;  // a parity's most taps of a row
        constexpr int ROW_GROUPS = MMA_WARPS / (S * S);  // a parity class's warps
        // Every kernel row formed at once, from one A fragment: an n-tile a row (its taps 0 .. 7,
        // those past K unstored), so that a value's row is its n-tile's and its tap the lane's
        // (where K K taps packed 8 an n-tile took a division a value and about 30 instructions
        // a (tile, value) pair to find its row, tap and place).
        static_assert(K <= 8, "a kernel row's taps in one n-tile");
        const int warp = threadIdx.y, lane = threadIdx.x, thread = lane + 32 * warp;
        const int runs_h = MMA_WARPS / runs_w;
        const int tile_h = S * ROW_GROUPS * runs_h, tile_w = S * STAGED_RUN * runs_w;
        const int region_h = (tile_h - 1 + K - 1 + S - 1) / S + 1, region_w = (tile_w - 1 + K - 1 + S - 1) / S + 1;
        const int weight_rows = tile_h / S, row_stride = tile_w / S;
        // a tap's places, weight_rows x row_stride = ROW_GROUPS x STAGED_RUN x MMA_WARPS whatever
        // runs_w (a constant: a row's places of a tap and the next rows' taps immediate offsets)
        constexpr int tap_stride = ((ROW_GROUPS * STAGED_RUN * MMA_WARPS + 27) & ~31) + 4;
        const int taps = K * K, group_channels = channels / groups;
        const int span_rows = K * K + 7, span_words = 8 * ((reduced + 15) / 16), span_stride = span_words + 4;
        // span_weight's rows and bias while the weights are formed, grad_output in their place
        // once they are (the weights' buffer after the larger of the two)
        const int span_place = span_rows * (span_stride + 1), staged_place = region_h * region_w * STAGED_PIXEL;
        OPLIB_DYNAMIC_SHARED(unsigned int, shared);
        unsigned int* span = shared;
        float* span_bias = reinterpret_cast<float*>(span + span_rows * span_stride);
        unsigned int* staged = shared;
        float* weights = reinterpret_cast<float*>(shared + (((span_place > staged_place ? span_place : staged_place) + 3) & ~3));

        const int tile_y = blockIdx.x / tiles_w, tile_x = blockIdx.x % tiles_w;
        const int y0 = tile_y * tile_h, x0 = tile_x * tile_w;
        const int group = blockIdx.y, chunks = (group_channels + MMA_CHANNELS - 1) / MMA_CHANNELS;
        const index_t n = blockIdx.z / chunks;
        const int c0 = MMA_CHANNELS * (blockIdx.z % chunks);
        const int first_row = staged_first_read<K, S>(y0, pad_h), first_column = staged_first_read<K, S>(x0, pad_w);

        // The thread's run: warp = (row group, row parity, column parity), lane = (run, quarter).
        const int parity = warp % (S * S), row_parity = parity / S, column_parity = parity % S;
        const int run = lane >> 2, quarter = lane & 3, run_x = run & (runs_w - 1), run_y = run / runs_w;
        const int y = y0 + row_parity + S * (warp / (S * S) * runs_h + run_y);
        const int x = x0 + column_parity + S * STAGED_RUN * run_x;  // the run's first pixel; then S apart
        // The row's taps of the warp's column parity: b0 + S t, t < taps_b.
        const int b0 = ((x + pad_w) % S + S) % S, taps_b = S == 1 ? TAPS : (K - b0 + S - 1) / S;
        // The run's first window column: tap TAPS - 1's at pixel 0 (at S = 2 and the odd parity,
        // an output column of the region all the same: (x + pw - K) / 2 >= first_column).
        const int window_column = (x + pad_w - b0) / S - (TAPS - 1) - first_column;
        const int run_place = STAGED_RUN * run_x;
        const int column_base = x0 + pad_w;

        const unsigned short* group_span = reinterpret_cast<const unsigned short*>(span_weight) + (index_t)group * taps * reduced;
        mma_stage_span_rows(span, group_span, span_rows, taps, reduced, span_words, span_stride, thread);
        mma_stage_span_bias<half_t>(span_bias, bias, group, taps, span_rows, thread);
        const unsigned short* feature_bits = reinterpret_cast<const unsigned short*>(feature) + n * feature_n;
        const unsigned short* sample_grad =
            reinterpret_cast<const unsigned short*>(grad_output) + n * grad_n + (index_t)group * group_channels * grad_c;
        const int row = lane >> 2, quad = lane & 3;  // a fragment's
        // the lane's row of a B fragment's ldmatrix (oplib_load_fragment_b's, formed once)
        const unsigned int* lane_span = span + (lane & 7) * span_stride + 4 * (lane >> 3 & 1);
        // A reduced channel's step in the feature (channels_last with pairs as words: 1, the
        // word loads' step; else the channel stride, two 16-bit loads a pair).
        const bool words = VECTORS || feature_words;
        const index_t feature_step = words ? 1 : feature_c;

        // A pixel's row among the formed ones, p / region_w, by a multiply (exact for p below
        // 2^32 / region_w).
        const unsigned int column_magic = 0xffffffffu / (unsigned int)region_w + 1u;

        __syncthreads();  // span_weight's rows are staged
        // Every kernel row's weights: m-tiles of 16 of the pixels (row-major) of the output rows
        // any row reads (kernel row a's weight_rows from i_low(a) = floor((y0 + ph - a + S - 1)
        // / S); the union from the last row's, i_first) x the region's columns, the warps in turn,
        // every row's taps of a pixel from one A fragment; pixel p at output row i_first + p /
        // region_w, column first_column + p % region_w. Row a's tap b of a pixel at formed row ui
        // and region column col lands at
        //   (a K + b) tap_stride + (ui - ui_low(a)) row_stride + col - offset(b)
        // (ui_low(a) = i_low(a) - i_first; offset: staged_tap_offset), where the row reads the
        // pixel's row (0 <= ui - ui_low(a) < weight_rows) and the tap's runs its column
        // (0 <= col - offset(b) < row_stride): a part of the tap, one of the pixel, one of the row.
        {
            const int i_first = mma_floor_div(y0 + pad_h - (K - 1) + S - 1, S);
            const int pixels = (mma_floor_div(y0 + pad_h + S - 1, S) - i_first + weight_rows) * region_w;
            const int m_tiles = (pixels + 15) / 16;
            const int row_base = y0 + pad_h + S - 1;  // i_low(a) = floor((row_base - a) / S)
            // (the lane's taps' bias; a tap past K: the next row's, unstored)
            const float* taps_bias = span_bias + 2 * quad;
            // The lane's first tap's part of a place (its second's: tap_gap further on; a tap past
            // K: unused).
            const int tap_offset = staged_tap_offset<S>(2 * quad, column_base, pad_w, first_column);
            const int tap_part = 2 * quad * tap_stride - tap_offset;
            // The lane's taps b and b + 1 are a column apart at stride 1 (offset(b + 1) = offset(b)
            // - 1); at stride 2 of two parities, offset(b + 1) = offset(b) - (pad_w & 1).
            const int tap_gap = tap_stride + (S == 1 ? 1 : pad_w & 1);
            // Kernel row a reads output rows from ui_low(a) = ui_low(0) - rows_on(a): at stride 1
            // rows_on(a) = a; at stride 2 a / 2, an odd row's one more where row_base is even.
            const int ui_low0 = (row_base >> (S - 1)) - i_first, odd_row_on = ~row_base & 1;
            const int odd_step = odd_row_on * row_stride;  // (S = 2) an odd kernel row's rows past the even one's
            // (An m-tile of 16 columns of one output row formed the region's 38 columns of
            // RedNet's stage-1 tile as 48, a fifth of its pixels past them; a pixel past the rows
            // here reads a row's weights no run reads: unstored.)
#pragma unroll 1
            for (int m = warp; m < m_tiles; m += MMA_WARPS) {
                const unsigned short* values[2];
                bool inside[2];
                // the lane's first pixel's row among the formed ones and region column (its second,
                // 8 pixels on, found from them); region_w is above 8, so the second is at most a
                // row further
                const int p = 16 * m + row, first_ui = (int)(((unsigned long long)p * column_magic) >> 32);
                const int first_col = p - first_ui * region_w;
                const bool second_wraps = first_col + 8 >= region_w;
#pragma unroll
                for (int h = 0; h < 2; ++h) {
                    const bool wraps = h == 1 && second_wraps;
                    const int i = i_first + first_ui + wraps, o = first_column + first_col + 8 * h - (wraps ? region_w : 0);
                    inside[h] = (unsigned int)i < (unsigned int)out_h && (unsigned int)o < (unsigned int)out_w;
                    values[h] = feature_bits + (index_t)i * feature_h + (index_t)o * feature_w;
                }
                // The pixels' values of the lane's reduced channels, advanced a k-step at a time
                // (formed anew at each load, their 64-bit addresses took most of the row's code).
#pragma unroll
                for (int h = 0; h < 2; ++h) values[h] += 2 * quad * feature_step;
                OplibFragmentC d[K];
#pragma unroll
                for (int a = 0; a < K; ++a) {
                    const float low = taps_bias[K * a], high = taps_bias[K * a + 1];
                    d[a] = OplibFragmentC{{low, high, low, high}};
                }
#pragma unroll 1
                for (int k0 = 0; k0 < reduced; k0 += 16) {
                    const OplibFragmentA f =
                        staged_feature_fragment(values, inside, k0 + 2 * quad, reduced, feature_step, words);
#pragma unroll
                    for (int a = 0; a < K; ++a) {
                        OplibFragmentB b;
                        oplib_load_matrices<2>(lane_span + a * K * span_stride + k0 / 2, b.reg);
                        oplib_mma<half_t>(d[a], f, b);
                    }
                }
#pragma unroll
                for (int h = 0; h < 2; ++h) {
                    const bool wraps = h == 1 && second_wraps;
                    const int ui = first_ui + wraps, col = first_col + 8 * h - (wraps ? region_w : 0);
                    bool tap_reads[2];  // a run of the tap's reads the pixel's column
#pragma unroll
                    for (int e = 0; e < 2; ++e)
                        tap_reads[e] = 2 * quad + e < K &&
                                       (unsigned int)(col - tap_offset + (e ? tap_gap - tap_stride : 0)) < (unsigned int)row_stride;
                    // the pixel's row among kernel row 0's weights, and its place there (the lane's
                    // first tap); kernel row a's rows_on(a) rows on, K taps further
                    const int row0 = ui - ui_low0;
                    // (a pointer stepped a row at a time, a kernel row's taps' part an immediate:
                    // at stride 2 an instruction fewer a kernel row than each row's place formed anew)
                    float* row_place = weights + row0 * row_stride + col + tap_part;
#pragma unroll
                    for (int a = 0; a < K; ++a) {
                        const int rows_on = S == 1 ? a : a / 2 + (a % 2 ? odd_row_on : 0);
                        const bool row_reads = (unsigned int)(row0 + rows_on) < (unsigned int)weight_rows;
                        if (a > 0 && a % S == 0) row_place += row_stride;  // kernel row a - S's a row on
                        float* const place = row_place + a * K * tap_stride + (a % S ? odd_step : 0);
                        // (a value no run reads unstored: a predicated store, no branch)
                        if (row_reads && tap_reads[0]) place[0] = inside[h] ? d[a].value[2 * h] : 0.0f;
                        if (row_reads && tap_reads[1]) place[tap_gap] = inside[h] ? d[a].value[2 * h + 1] : 0.0f;
                    }
                }
            }
        }
        __syncthreads();  // every kernel row's weights are formed, and the span rows read
        // grad_output over the region, in the span rows' place.
        staged_region<1>(staged, sample_grad, c0, group_channels, region_h, region_w, region_w, 1, 1, 0, first_row,
                         first_column, out_h, out_w, grad_c, grad_h, grad_w, VECTORS || vector_grad, thread);
        __syncthreads();  // grad_output is staged
        float sums[STAGED_RUN][STAGED_RUN] = {};
#pragma unroll
        for (int a = 0; a < K; ++a) {
            const int from_y = y + pad_h - a;
            if (from_y % S == 0) {  // the warp's rows read output row i through kernel row a
                const int i = from_y / S;
                const int wi = i - mma_floor_div(y0 + pad_h - a + S - 1, S);
                const unsigned int* window =
                    staged + ((i - first_row) * region_w + window_column) * STAGED_PIXEL + 2 * quarter;
                staged_row_sums<half_t, TAPS>(sums, weights + (a * K + b0) * tap_stride + wi * row_stride + run_place,
                                              S * tap_stride, taps_b, window);
            }
        }
        // The run's sums, rounded, to its pixels (S columns apart) and 4 channels.
        if (y >= height) return;
        const bool pair_stores = VECTORS || mma_pair_stores(grad_input, in_n, in_c, in_hs, in_ws, group_channels);
        const int c = c0 + STAGED_RUN * quarter;
        scalar_t* at = grad_input + n * in_n + ((index_t)group * group_channels + c) * in_c + (index_t)y * in_hs;
        staged_store_run(sums, at, x, S, width, in_ws, c, group_channels, in_c, pair_stores);
    } else if constexpr (sizeof(scalar_t) == 4 && KERNEL > 0 && STRIDE <= 2) {
        // float32: the 16-bit way above with its products in 3xTF32 (the "wide" helpers'
        // comment says what differs); the group's span rows all staged, in float. The same
        // layout of runs and rows; a kernel row's weights formed at a time (STAGED_GRAD_ROWS)
        // into two buffers, span rows and grad_output apart.
        constexpr int K = KERNEL, S = STRIDE, TAPS = (K + S - 1) / S;
        constexpr int ROW_GROUPS = MMA_WARPS / (S * S);
        constexpr int ROWS = K < STAGED_GRAD_ROWS ? K : STAGED_GRAD_ROWS;
        static_assert(K <= 8, "a kernel row's taps in one n-tile");
        const int warp = threadIdx.y, lane = threadIdx.x, thread = lane + 32 * warp;
        const int runs_h = MMA_WARPS / runs_w;
        const int tile_h = S * ROW_GROUPS * runs_h, tile_w = S * STAGED_RUN * runs_w;
        const int region_h = (tile_h - 1 + K - 1 + S - 1) / S + 1, region_w = (tile_w - 1 + K - 1 + S - 1) / S + 1;
        const int weight_rows = tile_h / S, row_stride = tile_w / S;
        const int tap_stride = ((weight_rows * row_stride + 27) & ~31) + 4;
        const int taps = K * K, group_channels = channels / groups;
        const int span_rows = K * K + 7, span_stride = staged_wide_span_stride(reduced);
        OPLIB_DYNAMIC_SHARED(float, shared);
        float* span = shared;
        float* span_bias = span + span_rows * span_stride;
        float* staged = span_bias + ((span_rows + 3) & ~3);
        float* weights = staged + ((region_h * region_w * STAGED_WIDE_PIXEL + 3) & ~3);

        const int tile_y = blockIdx.x / tiles_w, tile_x = blockIdx.x % tiles_w;
        const int y0 = tile_y * tile_h, x0 = tile_x * tile_w;
        const int group = blockIdx.y, chunks = (group_channels + MMA_CHANNELS - 1) / MMA_CHANNELS;
        const index_t n = blockIdx.z / chunks;
        const int c0 = MMA_CHANNELS * (blockIdx.z % chunks);
        const int first_row = staged_first_read<K, S>(y0, pad_h), first_column = staged_first_read<K, S>(x0, pad_w);

        const int parity = warp % (S * S), row_parity = parity / S, column_parity = parity % S;
        const int run = lane >> 2, quarter = lane & 3, run_x = run & (runs_w - 1), run_y = run / runs_w;
        const int y = y0 + row_parity + S * (warp / (S * S) * runs_h + run_y);
        const int x = x0 + column_parity + S * STAGED_RUN * run_x;
        const int b0 = ((x + pad_w) % S + S) % S, taps_b = S == 1 ? TAPS : (K - b0 + S - 1) / S;
        const int window_column = (x + pad_w - b0) / S - first_column - (TAPS - 1);
        const int run_place = STAGED_RUN * run_x;
        const int column_base = x0 + pad_w;

        staged_wide_span_rows(span, span_weight + (index_t)group * taps * reduced, span_rows, taps, reduced,
                              span_stride, thread);
        if (thread < span_rows) span_bias[thread] = thread < taps ? __ldg(bias + (index_t)group * taps + thread) : 0.0f;
        const float* sample_feature = feature + n * feature_n;
        const float* sample_grad = grad_output + n * grad_n + (index_t)group * group_channels * grad_c;
        const int row = lane >> 2, quad = lane & 3;
        // the lane's two floats of a B fragment: tap `row` of a kernel row's n-tile, channels
        // k0 + 2 quad, + 1
        const float* lane_span = span + row * span_stride + 2 * quad;
        const bool words = VECTORS || feature_words;
        const index_t feature_step = words ? 1 : feature_c;
        const unsigned int column_magic = 1u + 0xffffffffu / (unsigned int)region_w;

        // form_rows of the 16-bit way: kernel rows a0 .. a0 + rows - 1's weights into `into`.
        const auto form_rows = [&](int a0, float* into) {
            const int rows = K - a0 < ROWS ? K - a0 : ROWS;
            const int i_first = mma_floor_div(y0 + pad_h - a0 - (rows - 1) + S - 1, S);
            const int pixels = (mma_floor_div(y0 + pad_h - a0 + S - 1, S) - i_first + weight_rows) * region_w;
            const int m_tiles = (pixels + 15) / 16;
            const float* rows_bias = span_bias + a0 * K + 2 * quad;
            const int row_base = y0 + pad_h - a0 + S - 1;
            const float* rows_span = lane_span + a0 * K * span_stride;
#pragma unroll 1
            for (int m = warp; m < m_tiles; m += MMA_WARPS) {
                const float* values[2];  // each pixel's reduced channel 2 quad, the lane's first
                bool inside[2];
                const int p = 16 * m + row, first_ui = (int)(((unsigned long long)p * column_magic) >> 32);
                const int first_col = p - first_ui * region_w;
                const bool second_wraps = first_col + 8 >= region_w;
#pragma unroll
                for (int h = 0; h < 2; ++h) {
                    const bool wraps = h == 1 && second_wraps;
                    const int i = i_first + first_ui + wraps, o = first_column + first_col + 8 * h - (wraps ? region_w : 0);
                    inside[h] = (unsigned int)i < (unsigned int)out_h && (unsigned int)o < (unsigned int)out_w;
                    values[h] = sample_feature + (index_t)i * feature_h + (index_t)o * feature_w + 2 * quad * feature_step;
                }
                OplibFragmentC d[ROWS];
#pragma unroll
                for (int t = 0; t < ROWS; ++t) {
                    const float low = t < rows ? rows_bias[K * t] : 0.0f;
                    const float high = t < rows ? rows_bias[1 + K * t] : 0.0f;
                    d[t] = OplibFragmentC{{low, high, low, high}};
                }
#pragma unroll 1
                for (int k0 = 0; k0 < reduced; k0 += 8) {
                    OplibFragmentTf32A a_hi, a_lo;
                    staged_wide_feature_fragments(values, inside, k0 + 2 * quad, reduced, feature_step, words, a_hi,
                                                  a_lo);
#pragma unroll
                    for (int t = 0; t < ROWS; ++t) {
                        if (t >= rows) break;
                        const StagedWidePair pair =
                            *reinterpret_cast<const StagedWidePair*>(rows_span + t * K * span_stride + k0);
                        OplibFragmentTf32B b_hi, b_lo;
#pragma unroll
                        for (int e = 0; e < 2; ++e) oplib_split_tf32_into(b_hi, b_lo, e, pair.value[e]);
                        oplib_mma_3xtf32(d[t], a_hi, a_lo, b_hi, b_lo);  // (a kernel row's n-tile)
                    }
                }
                bool non_finite = false;
#pragma unroll
                for (int t = 0; t < ROWS; ++t) {
#pragma unroll
                    for (int v = 0; v < 4; ++v) non_finite |= t < rows && !mma_finite(d[t].value[v]);
                }
                if (oplib_warp_any(non_finite)) {  // oplib-cold: an inf or a nan among the warp's weights
                    OPLIB_COLD_BLOCK();
                    // each weight by the direct sum in float, from the staged span rows and bias
                    // (the pixels' channel 0 found again from where the k-steps left `values`)
                    const index_t back = (8 * ((reduced + 7) / 8) + 2 * quad) * feature_step;
#pragma unroll
                    for (int t = 0; t < ROWS; ++t) {
                        if (t >= rows) break;
#pragma unroll
                        for (int v = 0; v < 4; ++v) {
                            const int h = v >> 1, tap = (a0 + t) * K + 2 * quad + (v & 1);
                            if (!inside[h]) continue;
                            float sum = span_bias[tap];
                            const float* span_row = span + tap * span_stride;
#pragma unroll 1
                            for (int r = 0; r < reduced; ++r)
                                sum = oplib_fma(span_row[r], __ldg(values[h] - back + r * feature_step), sum);
                            d[t].value[v] = sum;
                        }
                    }
                }
#pragma unroll
                for (int t = 0; t < ROWS; ++t) {
                    if (t >= rows) continue;
                    const int ui_low = -i_first + ((row_base - t) >> (S - 1));
#pragma unroll
                    for (int e = 0; e < 2; ++e) {
                        const int b = 2 * quad + e;
                        if (b >= K) continue;
                        const int offset = staged_tap_offset<S>(b, column_base, pad_w, first_column);
#pragma unroll
                        for (int h = 0; h < 2; ++h) {
                            const bool wraps = h == 1 && second_wraps;
                            const int wi = first_ui + wraps - ui_low;
                            const int at = first_col + 8 * h - (wraps ? region_w : 0) - offset;
                            if ((unsigned int)at < (unsigned int)row_stride && (unsigned int)wi < (unsigned int)weight_rows)
                                into[(t * K + b) * tap_stride + wi * row_stride + at] = inside[h] ? d[t].value[2 * h + e] : 0.0f;
                        }
                    }
                }
            }
        };

        // grad_output over the region, in float.
        staged_wide_region<1, STAGED_RUN, STAGED_WIDE_PIXEL>(staged, sample_grad, c0, group_channels, region_h, region_w,
                                                             region_w, 1, 1, 0, first_row, first_column, out_h, out_w,
                                                             grad_c, grad_h, grad_w, VECTORS || vector_grad, thread);
        __syncthreads();  // span_weight's float rows are staged
        form_rows(0, weights);
        float sums[STAGED_RUN][STAGED_RUN] = {};
        const int buffer_taps = ROWS * K;
#pragma unroll 1
        for (int a0 = 0, step = 0; a0 < K; a0 += ROWS, ++step) {
            __syncthreads();  // rows a0 .. a0 + ROWS - 1's float weights (and grad_output) are staged
            const float* buffer = weights + (step & 1) * buffer_taps * tap_stride;
            const int end = a0 + ROWS < K ? a0 + ROWS : K;
#pragma unroll
            for (int r = 0; r < ROWS; ++r) {
                const int a = a0 + r;
                if (a >= end) break;
                const int from_y = y + pad_h - a;
                if (from_y % S == 0) {
                    const int i = from_y / S;
                    const int wi = i - mma_floor_div(y0 + pad_h - a + S - 1, S);
                    const float* window = staged + ((i - first_row) * region_w + window_column) * STAGED_WIDE_PIXEL +
                                          STAGED_RUN * quarter;
                    staged_wide_grad_row_sums<TAPS>(sums, buffer + (r * K + b0) * tap_stride + wi * row_stride + run_place,
                                                    S * tap_stride, taps_b, window);
                }
            }
            if (end < K) form_rows(end, weights + (~step & 1) * buffer_taps * tap_stride);
        }
        if (y >= height) return;
        const bool pair_stores = VECTORS || mma_pair_stores(grad_input, in_n, in_c, in_hs, in_ws, group_channels);
        const int c = c0 + STAGED_RUN * quarter;
        float* at = grad_input + n * in_n + ((index_t)group * group_channels + c) * in_c + (index_t)y * in_hs;
        staged_wide_store_run(sums, at, x, S, width, in_ws, c, group_channels, in_c, pair_stores);
    }
#endif
}

// ---------------------------------------------------------------------------------------
// involution_generated's forward with the weights staged: formed on tensor cores into shared
// memory, summed by FMAs (involution_generated_mma_staged)
// ---------------------------------------------------------------------------------------
//
// The staged grad_input's design, the forward way round, where it is simpler: a pixel's weights
// are its own (no halo of weights), so a tile's are formed once, many taps together, and the
// feature is read once a pass. A block of MMA_WARPS warps takes a tile of tile_h x tile_w output
// pixels of one (sample, group) and a chunk of MMA_CHANNELS of the group's channels, or folded
// (a map in a quarter of the tile's rows) of 1 << fold_shift samples, each sample's map in its
// share of the rows (grid: tiles x groups x sample blocks * chunks):
//   1. stages the span rows (whole n-tiles of 8 taps; at S = 2 the first pass's), the bias of all T taps,
//      and the input over the region the tile's windows read, 16-bit ([row][place][channel],
//      zeros outside the image; at S = 2 each row's even columns, then its odd ones:
//      staged_region<2>);
//   2. per pass of kernel rows (staged_pass_first: the rows shared out evenly, the longer
//      passes first): all K in one at S = 1 but for a 7 x 7 window, two there (so that four
//      blocks fit an SM); at S = 2, where the region of a stride-2 tile is four times as large,
//      one pass more (a 7 x 7 window's rows 3, 2, 2: three blocks an SM where the region leaves
//      room, RedNet-50's second and third stages):
//      a. forms the pass's taps at the tile's pixels, (pixels x R)(R x taps) + bias on tensor
//         cores: an m-tile is 16 of the tile's pixels (row-major), its feature's A fragments
//         loaded from global memory once for all the pass's n-tiles of 8 taps (from the n-tile
//         of its first row's first tap); each value in float into shared memory, [tap][pixel];
//      b. each thread sums, for its run of 4 consecutive output pixels and 4 channels, per
//         kernel row a of the pass: the row's K taps' 4 weights (a 16-byte load each) and the
//         window's input pixels (4 channels, an 8-byte load each), each read once and used by
//         every tap and pixel it meets;
//      c. at S = 2, stages the next pass's span rows in place of the pass's (staged_pass_span_rows).
// A warp's lanes are 8 runs x 4 channel quarters, runs_w runs along a row (the host's choice,
// 8, 4 or 2: tiles of 32 x 8, 16 x 16 or 8 x 32 pixels); at S = 2 the runs of a row read
// columns 8 apart, consecutive places of a parity (STAGED_PIXEL words apart: different banks).
// A barrier a pass and one between passes, no atomics, every sum in a fixed order (kernel rows,
// then taps): deterministic, the same bits whatever the layout. A window pixel outside the image
// is staged as 0 and its weight is a whole dot product: an inf or a nan lands where the direct
// sum puts it.
//
// Dynamic shared memory (generated_mma_staged_forward_shared_bytes), 32-bit words:
//   span     8 SPAN_TILES x span_stride           the span rows: at S = 2 a pass's (the most n-tiles
//                                                 of 8 taps a pass forms, staged_pass_tiles), at
//                                                 S = 1 all T in n-tiles (rows past T zeros)
//   bias     span_rows                            float, the T taps' bias in n-tiles of 8
//                                                 (span_rows; zeros past T)
//   staged   region_h x pitch x STAGED_PIXEL      the input chunk (pitch: region_w, or at S = 2
//                                                 twice its even columns), over the windows of
//                                                 the tile's pixels in the map's extent (a map
//                                                 smaller than the tile: its own)
//   weights  staged_pass_rows x tap_stride        float, [tap][pixel], a pass's taps from its
//                                                 first n-tile's: tap_stride the tile's pixels
//                                                 and 4 (a D fragment's stores in different
//                                                 banks; rows 16-byte aligned)

// The first kernel row of pass `pass` of `passes` over a K-wide window's rows (pass `passes`:
// K): the rows shared out as evenly as they go, the longer passes first (7 rows in 3: 3, 2, 2).
__host__ __device__ constexpr int staged_pass_first(int K, int passes, int pass) {
    return (pass * K + passes - 1) / passes;
}

// Of the passes of a K-wide window's rows: the most n-tiles of 8 taps a pass forms (from the
// n-tile of its first row's first tap), and the most of the weights buffer's rows a pass fills
// (its taps, from that n-tile's first).
__host__ __device__ constexpr int staged_pass_tiles(int K, int passes) {
    int most = 0;
    for (int pass = 0; pass < passes; ++pass) {
        const int first = staged_pass_first(K, passes, pass), end = staged_pass_first(K, passes, pass + 1);
        const int tiles = (end * K + 7) / 8 - first * K / 8;
        most = tiles > most ? tiles : most;
    }
    return most;
}

__host__ __device__ constexpr int staged_pass_rows(int K, int passes) {
    int most = 0;
    for (int pass = 0; pass < passes; ++pass) {
        const int first = staged_pass_first(K, passes, pass), end = staged_pass_first(K, passes, pass + 1);
        const int filled = end * K - 8 * (first * K / 8);
        most = filled > most ? filled : most;
    }
    return most;
}

// blockIdx.y, read from its register where the compiler may not keep an earlier read's value
// (nor what it computed from it) live across a loop.
__device__ __forceinline__ unsigned int block_y_again() {
#if defined(__CUDA_ARCH__)
    unsigned int y;
    asm volatile("mov.u32 %0, %%ctaid.y;" : "=r"(y));
    return y;
#else
    return blockIdx.y;
#endif
}

// The span rows of pass `pass`'s n-tiles (of a K-wide window's rows in `passes`) into `span`, from
// its first n-tile's first tap (rows past the window's taps zeros): a buffer of
// staged_pass_tiles(K, passes) n-tiles, not the window's all, so that a block of RedNet-50's
// second stage at stride 2 fits three an SM (32 of 56 rows fewer at R = 32, 2.5 KiB).
// The group (blockIdx.y) and the rows' sizes found again from the block's index and R: kept live
// from the start across the passes' sums, they spilled 8 bytes at 64 registers on sm_90.
template <int K, int passes, int SPAN_BATCH>
__device__ __forceinline__ void staged_pass_span_rows(unsigned int* span, const void* span_weight, int pass,
                                                      int reduced) {
    const int first_tile = staged_pass_first(K, passes, pass) * K / 8;
    const int tiles = (staged_pass_first(K, passes, pass + 1) * K + 7) / 8 - first_tile;
    const int span_words = 8 * ((reduced + 15) / 16), thread = threadIdx.x + 32 * threadIdx.y;
    const unsigned short* rows =
        reinterpret_cast<const unsigned short*>(span_weight) + ((index_t)block_y_again() * K * K + 8 * first_tile) * reduced;
    mma_stage_span_rows<SPAN_BATCH>(span, rows, 8 * tiles, K * K - 8 * first_tile, reduced, span_words, span_words + 4,
                                    thread);
}

// One kernel row's sums for a thread's run of 4 output pixels at column stride S: tap b's 4
// weights from `first_tap` + b tap_stride (one 16-byte load), the window's input pixels from
// `window` (the place of column S x + 0 of the row; at S = 2 its odd columns `odd` words on).
// Window column k meets the run's pixel p through tap b = k - S p.
template <typename half_t, int K, int S>
__device__ __forceinline__ void staged_forward_row_sums(float (&sums)[STAGED_RUN][STAGED_RUN], const float* first_tap,
                                                        int tap_stride, const unsigned int* window, int odd) {
    float w[K][STAGED_RUN];
#pragma unroll
    for (int b = 0; b < K; ++b) {
        const Vector16<float> v = *reinterpret_cast<const Vector16<float>*>(first_tap + b * tap_stride);
#pragma unroll
        for (int p = 0; p < STAGED_RUN; ++p) w[b][p] = v.lane[p];
    }
#pragma unroll
    for (int k = 0; k < S * (STAGED_RUN - 1) + K; ++k) {
        const unsigned int* at = S == 2 ? window + (k & 1) * odd + (k >> 1) * STAGED_PIXEL : window + k * STAGED_PIXEL;
        const StagedQuarter quarter = *reinterpret_cast<const StagedQuarter*>(at);
        const float x[STAGED_RUN] = {mma_to_float((unsigned short)(quarter.word[0] & 0xffffu), half_t()),
                                     mma_to_float((unsigned short)(quarter.word[0] >> 16), half_t()),
                                     mma_to_float((unsigned short)(quarter.word[1] & 0xffffu), half_t()),
                                     mma_to_float((unsigned short)(quarter.word[1] >> 16), half_t())};
#pragma unroll
        for (int p = 0; p < STAGED_RUN; ++p) {
            const int b = k - S * p;
            if (b < 0 || b >= K) continue;
#pragma unroll
            for (int c = 0; c < STAGED_RUN; ++c) sums[p][c] = oplib_fma(w[b][p], x[c], sums[p][c]);
        }
    }
}

// staged_pass_span_rows in float: pass `pass`'s n-tiles of span rows (of a K-wide window's rows
// in `passes`) from the first n-tile's first tap.
template <int K, int passes>
__device__ __forceinline__ void staged_wide_pass_span_rows(float* span, const float* span_weight, int pass,
                                                           int reduced, int thread) {
    const int first_tile = staged_pass_first(K, passes, pass) * K / 8;
    const int tiles = (staged_pass_first(K, passes, pass + 1) * K + 7) / 8 - first_tile;
    const float* rows = span_weight + ((index_t)block_y_again() * K * K + 8 * first_tile) * reduced;
    staged_wide_span_rows(span, rows, 8 * tiles, K * K - 8 * first_tile, reduced, staged_wide_span_stride(reduced),
                          thread);
}

// Four blocks an SM at stride 1 on sm_90 (its 228 KiB hold four stride-1 tiles of 49-51 KiB,
// their weights formed in two passes of kernel rows; in one pass, 73 KiB, they held three),
// at most 64 registers, with no spill; three from sm_100 on (four spilled 4 bytes on sm_100,
// 24 on sm_120, whose 100 KiB hold one anyway) and from sm_80 on (sm_80's 164 KiB hold three;
// sm_86's and sm_89's 100 KiB one). Four blocks put 8 warps on each scheduler, three 6: the
// warps' dependent instructions issue from more of them. At stride 2 three blocks from sm_90
// on (80 registers, no spill), where a block's region leaves room: sm_90's and sm_100's 228
// KiB hold three of RedNet-50's third stage (69 KiB) and of its second (74 KiB: a pass's span
// rows staged, not all; 77 KiB with all of them); two before
// (sm_80 spilled 4 bytes at three, which its 164 KiB could not hold anyway). (Thresholds only,
// as every architecture test of the sources: NVCC_ARCHITECTURES, test_cuda_compile's, holds a
// target on each side of each.)
#define OPLIB_STAGED_FORWARD_BLOCKS OPLIB_BLOCKS_BY_ARCH(2, 3, 4, 3)
#define OPLIB_STAGED_FORWARD_STRIDED_BLOCKS OPLIB_BLOCKS_BY_ARCH(2, 2, 3, 3)
// float32's (its tiles take about 1.4 times the room): three an SM at stride 1 from sm_90 on (the
// 69-74 KiB of RedNet-50's stride-1 stages, 80 registers), two before (sm_80's 164 KiB hold two;
// sm_86's and sm_89's 100 KiB one); two at stride 2, whose regions fit 99 KiB only on small maps.
#define OPLIB_STAGED_WIDE_BLOCKS OPLIB_BLOCKS_BY_ARCH(2, 2, 3, 3)
// The blocks an SM the staged forward asks for (a variable: the host reads a launch bound's
// expression up to its first parenthesis).
template <typename scalar_t, int STRIDE>
constexpr int STAGED_FORWARD_BLOCKS = sizeof(scalar_t) == 4 ? STRIDE == 1 ? OPLIB_STAGED_WIDE_BLOCKS : 2
                                      : STRIDE == 1           ? OPLIB_STAGED_FORWARD_BLOCKS
                                                              : OPLIB_STAGED_FORWARD_STRIDED_BLOCKS;

// Instantiated for the forward's windows (the oplib-template line above); only the square
// windows of KERNEL and STRIDE (1 or 2) are served: KERNEL = 0's instantiation is empty, and
// the host declines other geometries (the other forward kernels serve them). INPUT_VECTORS:
// the host found the input's 8-channel units 16-byte vectors, the feature's channel pairs
// aligned words and the output's channel pairs word stores (channels_last, aligned): that
// instantiation holds only those ways (each runtime flag's other way took its place in the
// staging, the k-step and the stores, where one way runs: as FOLDED, a template argument), the
// others every way. FEATURE_PAIRS: an NCHW feature whose pixel pairs are aligned words (the
// host's generated_mma_feature_pairs): its k-steps load a channel's two pixels at once
// (staged_feature_pixel_pairs), a template argument too (a runtime choice of the two k-step
// loops kept both in the code).
//
// Block (32, MMA_WARPS); grid (tiles_h * tiles_w, groups, ceil(N / 2^fold_shift) * chunks), tiles of the output.
template <typename scalar_t, int KERNEL, int STRIDE, bool INPUT_VECTORS, bool FEATURE_PAIRS>
__global__ void __launch_bounds__(MMA_THREADS, STAGED_FORWARD_BLOCKS<scalar_t, STRIDE>) involution_generated_mma_staged(
    const scalar_t* __restrict__ input, const scalar_t* __restrict__ feature, const scalar_t* __restrict__ span_weight,
    const scalar_t* __restrict__ bias, scalar_t* __restrict__ out, int channels, int height, int width, int groups,
    int out_h, int out_w, int pad_h, int pad_w, int reduced, int tiles_w, int runs_w, int batch, int fold_shift,
    index_t input_n, index_t input_c, index_t input_h, index_t input_w, index_t out_n, index_t out_c, index_t out_hs,
    index_t out_ws, index_t feature_n, index_t feature_c, index_t feature_h, index_t feature_w, bool vector_input,
    bool feature_words) {
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800
    if constexpr (sizeof(scalar_t) == 2 && KERNEL > 0 && STRIDE <= 2) {
        typedef scalar_t half_t;
        constexpr int K = KERNEL, S = STRIDE, T = K * K;
        // The kernel rows in PASSES passes, each pass's taps formed and summed in turn: a 7 x 7
        // window's weights at once would leave room for three blocks an SM at S = 1, not four,
        // and at S = 2 the region takes four times the room (one pass more: a 7 x 7 window's
        // third pass makes room for a third block at RedNet-50's second and third stages, the
        // folded last stage's four regions room beside an R of 128).
        constexpr int PASSES = 1 + (S == 2) + (K * K > 32);
        constexpr int BUFFER_TILES = staged_pass_tiles(K, PASSES);
        constexpr int TILE_PIXELS = MMA_WARPS * 8 * STAGED_RUN;  // a warp's 8 runs of 4 pixels, whatever runs_w
        static_assert(staged_pass_rows(K, PASSES) <= 8 * BUFFER_TILES, "a pass's taps in its n-tiles");
        // At S = 2 a pass's span rows at a time (staged_pass_span_rows), where the region leaves
        // no room for all of them (RedNet-50's second stage at three blocks an SM); at S = 1 all of
        // them once, as one pass's (no block more would fit without them).
        constexpr bool PASS_SPAN = S == 2;
        constexpr int SPAN_TILES = PASS_SPAN ? BUFFER_TILES : (T + 7) / 8;
        const int warp = threadIdx.y, lane = threadIdx.x, thread = lane + 32 * warp;
        const int runs_h = 8 / runs_w;  // a warp's rows of runs
        const int tile_w = STAGED_RUN * runs_w, tile_h = MMA_WARPS * runs_h;
        const int tile_w_shift = runs_w == 8 ? 5 : runs_w == 4 ? 4 : 3;  // log2(tile_w), no division
        // Folded (fold_shift > 0: 1 << fold_shift samples a block, a map of one tile), a sample's
        // share of the tile is its sample_rows rows: tile row py is sample py >> sample_shift's
        // row py & (sample_rows - 1).
        const int sample_shift = (runs_w == 8 ? 3 : runs_w == 4 ? 4 : 5) - fold_shift, sample_rows = 1 << sample_shift;
        // The region a sample's pixels inside the map read: a map smaller than the tile (14 x 14
        // in 16 x 16) stages only its own windows' input.
        const int region_h = S * ((sample_rows < out_h ? sample_rows : out_h) - 1) + K;
        const int region_w = S * ((tile_w < out_w ? tile_w : out_w) - 1) + K;
        const int odd = S == 2 ? (region_w + 1) / 2 * STAGED_PIXEL : 0, pitch = S == 2 ? 2 * ((region_w + 1) / 2) : region_w;
        const int tap_stride = TILE_PIXELS + 4;
        const int group_channels = channels / groups;
        const int span_rows = 8 * ((T + 7) / 8), span_words = 8 * ((reduced + 15) / 16), span_stride = span_words + 4;
        OPLIB_DYNAMIC_SHARED(unsigned int, shared);
        unsigned int* span = shared;  // 8 SPAN_TILES span rows
        float* span_bias = reinterpret_cast<float*>(span + 8 * SPAN_TILES * span_stride);
        unsigned int* staged = reinterpret_cast<unsigned int*>(span_bias + span_rows);
        const int region_words = region_h * pitch * STAGED_PIXEL;  // a sample's
        float* weights = reinterpret_cast<float*>(staged + (((region_words << fold_shift) + 3) & ~3));

        const int tile_y = blockIdx.x / tiles_w, tile_x = blockIdx.x % tiles_w;
        const int y0 = tile_y * tile_h, x0 = tile_x * tile_w;
        const int group = blockIdx.y, chunks = (group_channels + MMA_CHANNELS - 1) / MMA_CHANNELS;
        const int n0 = (blockIdx.z / chunks) << fold_shift;  // the block's first sample
        const int c0 = MMA_CHANNELS * (blockIdx.z % chunks);

        staged_pass_span_rows<K, PASS_SPAN ? PASSES : 1, 4>(span, span_weight, 0, reduced);
        mma_stage_span_bias<half_t>(span_bias, bias, group, T, span_rows, thread);
        // each sample's region in turn (a sample past the batch: zeros, nothing read; its outputs
        // are not stored)
        const unsigned short* plane =
            reinterpret_cast<const unsigned short*>(input) + (index_t)n0 * input_n + (index_t)group * group_channels * input_c;
        staged_region<S>(staged, plane, c0, group_channels, region_h, region_w, pitch, 1 << fold_shift, batch - n0,
                         input_n, S * y0 - pad_h, S * x0 - pad_w, height, width, input_c, input_h, input_w,
                         INPUT_VECTORS || vector_input, thread);
        __syncthreads();  // the span rows, their bias and the input are staged

        const int row = lane >> 2, quad = lane & 3;  // a fragment's
        // the lane's row of a B fragment's ldmatrix (oplib_load_fragment_b's, formed once: per
        // k-step the compiler formed the lane from threadIdx and blockDim again)
        const unsigned int* lane_span = span + (lane & 7) * span_stride + 4 * (lane >> 3 & 1);
        const unsigned short* feature_bits = reinterpret_cast<const unsigned short*>(feature);
        // A reduced channel's step in the feature (channels_last with pairs as words: 1, the
        // word loads' step; else the channel stride, two 16-bit loads a pair).
        const bool words = INPUT_VECTORS || feature_words;
        const index_t feature_step = words ? 1 : feature_c;
        // The thread's run: lane = (run, quarter), a warp's runs runs_w along a row.
        const int run = lane >> 2, quarter = lane & 3, run_x = run & (runs_w - 1), run_y = run / runs_w;
        const int ty = warp * runs_h + run_y, tx = STAGED_RUN * run_x;
        // the run's sample (of the block's) and row in the sample's share of the tile
        const int run_sample = ty >> sample_shift, sample_y = ty & (sample_rows - 1);
        float sums[STAGED_RUN][STAGED_RUN] = {};
#pragma unroll
        for (int pass = 0; pass < PASSES; ++pass) {
            const int first_a = staged_pass_first(K, PASSES, pass), end_a = staged_pass_first(K, PASSES, pass + 1);
            const int first_tile = first_a * K / 8, tiles = (end_a * K + 7) / 8 - first_tile;
            if (pass > 0) __syncthreads();  // every warp is done with the previous pass's weights
            // The pass's taps at the tile's pixels: m-tiles of 16 of them (row-major), the warps
            // in turn; n-tile nt's taps at buffer rows 8 (nt - first_tile) on.
#pragma unroll
            for (int warp_tile = 0; warp_tile < TILE_PIXELS / 16 / MMA_WARPS; ++warp_tile) {
                const int m = warp + MMA_WARPS * warp_tile;
                const unsigned short* pixels[2];
                bool inside[2];
                // the lane's two pixels (fragment rows row and row + 8) adjacent columns of a tile
                // row, 2 row and 2 row + 1 of the m-tile (tile_w is even): one word of a channel
                // in an NCHW feature (FEATURE_PAIRS), one 8-byte store of a tap's two weights
#pragma unroll
                for (int h = 0; h < 2; ++h) {
                    const int pixel = 16 * m + 2 * row + h, py = pixel >> tile_w_shift, sample = n0 + (py >> sample_shift);
                    const int i = y0 + (py & (sample_rows - 1)), o = x0 + pixel - (py << tile_w_shift);
                    inside[h] = i < out_h && o < out_w && sample < batch;
                    pixels[h] = feature_bits + (index_t)(inside[h] ? sample : n0) * feature_n + (index_t)i * feature_h +
                                (index_t)o * feature_w + 2 * quad * feature_step;
                }
                float* to = weights + 16 * m + 2 * row;
                // All the pass's n-tiles at once, the feature's A fragment read once a k-step (the
                // bias from shared memory left room for their accumulators: no spill on any
                // target at three blocks an SM).
                OplibFragmentC d[BUFFER_TILES];
#pragma unroll
                for (int t = 0; t < BUFFER_TILES; ++t) {
                    if (t >= tiles) break;
                    // the D fragment's two taps' bias (zeros past T): one 8-byte load
                    const StagedBias start =
                        *reinterpret_cast<const StagedBias*>(span_bias + 8 * (first_tile + t) + 2 * quad);
                    d[t] = OplibFragmentC{{start.value[0], start.value[1], start.value[0], start.value[1]}};
                }
                const unsigned short* values[2] = {pixels[0], pixels[1]};
                const auto products = [&](const OplibFragmentA& f, int k0) {
#pragma unroll
                    for (int t = 0; t < BUFFER_TILES; ++t) {
                        if (t >= tiles) break;
                        OplibFragmentB b;
                        oplib_load_matrices<2>(lane_span + 8 * (t + (PASS_SPAN ? 0 : first_tile)) * span_stride + k0 / 2,
                                               b.reg);
                        oplib_mma<half_t>(d[t], f, b);
                    }
                };
                if constexpr (FEATURE_PAIRS) {
#pragma unroll 1
                    for (int k0 = 0; k0 < reduced; k0 += 16)
                        products(staged_feature_pixel_pairs(values[0], inside[0], k0 + 2 * quad, reduced, feature_c), k0);
                } else {
#pragma unroll 1
                    for (int k0 = 0; k0 < reduced; k0 += 16)
                        products(staged_feature_fragment(values, inside, k0 + 2 * quad, reduced, feature_step, words), k0);
                }
#pragma unroll
                for (int t = 0; t < BUFFER_TILES; ++t) {
#pragma unroll
                    for (int e = 0; e < 2; ++e) {
                        const int place = 8 * t + 2 * quad + e;  // the pass's taps only
                        if (t >= tiles || 8 * first_tile + place >= end_a * K) continue;
                        // a pixel outside the map keeps its bias: no stored output reads it
                        *reinterpret_cast<StagedBias*>(to + place * tap_stride) =
                            StagedBias{{d[t].value[e], d[t].value[2 + e]}};
                    }
                }
            }
            __syncthreads();  // the pass's weights are formed, its span rows read
            const float* run_weights = weights + ty * tile_w + tx;
            // column S tx of the region: place tx (at S = 2, of the row's even columns)
            const unsigned int* run_window =
                staged + run_sample * region_words + (S * sample_y * pitch + tx) * STAGED_PIXEL + 2 * quarter;
            // A run from outside the map has nothing to store (and its windows lie past the
            // region); one in it reads its pixels' windows, inside the region, and past the
            // region's row only for its pixels outside the map, whose sums are not stored (the
            // last row's past the region but within the weights after it).
            if (y0 + sample_y < out_h && x0 + tx < out_w && n0 + run_sample < batch) {
#pragma unroll 1
                for (int a = first_a; a < end_a; ++a)
                    staged_forward_row_sums<half_t, K, S>(sums, run_weights + (a * K - 8 * first_tile) * tap_stride,
                                                          tap_stride, run_window + a * pitch * STAGED_PIXEL, odd);
            }
            // the next pass's span rows in place of this one's (the barrier that starts that pass
            // shows them)
            if (PASS_SPAN && pass + 1 < PASSES)
                staged_pass_span_rows<K, PASSES, 1>(span, span_weight, pass + 1, reduced);
        }

        // The run's sums, rounded, to its 4 pixels and 4 channels.
        const int y = y0 + sample_y, x = x0 + tx;
        if (y >= out_h || n0 + run_sample >= batch) return;
        const int c = c0 + STAGED_RUN * quarter;
        const bool pair_stores = INPUT_VECTORS || mma_pair_stores(out, out_n, out_c, out_hs, out_ws, group_channels);
        scalar_t* at = out + (index_t)(n0 + run_sample) * out_n + ((index_t)group * group_channels + c) * out_c +
                       (index_t)y * out_hs;
        staged_store_run(sums, at, x, 1, out_w, out_ws, c, group_channels, out_c, pair_stores);
    } else if constexpr (sizeof(scalar_t) == 4 && KERNEL > 0 && STRIDE <= 2) {
        // float32: the 16-bit way above with its products in 3xTF32 (what differs: the comment
        // above staged_wide_span_rows). A pass's span rows at a time at both strides: float rows
        // take twice the room. A 7 x 7 window's rows in three passes at stride 1 too (3, 2, 2):
        // in two, the accumulators of a pass's 4 n-tiles beside the run's sums spilled at the 80
        // registers of three blocks an SM (sm_90, sm_100, sm_120).
        constexpr int K = KERNEL, S = STRIDE, T = K * K;
        constexpr int PASSES = 1 + (S == 2 || K * K > 32) + (K * K > 32);
        // the block's chunk of channels, a thread's share of them and a staged pixel's floats
        constexpr int CHUNK = S == 2 ? STAGED_WIDE_HALF : MMA_CHANNELS, CH = CHUNK / 4;
        constexpr int PIXEL = S == 2 ? STAGED_WIDE_HALF_PIXEL : STAGED_WIDE_PIXEL;
        constexpr int BUFFER_TILES = staged_pass_tiles(K, PASSES);
        constexpr int TILE_PIXELS = MMA_WARPS * 8 * STAGED_RUN;
        static_assert(staged_pass_rows(K, PASSES) <= 8 * BUFFER_TILES, "a pass's taps in its n-tiles");
        const int warp = threadIdx.y, lane = threadIdx.x, thread = lane + 32 * warp;
        const int runs_h = 8 / runs_w;
        const int tile_w = STAGED_RUN * runs_w, tile_h = MMA_WARPS * runs_h;
        const int tile_w_shift = runs_w == 8 ? 5 : runs_w == 4 ? 4 : 3;
        const int sample_shift = (runs_w == 8 ? 3 : runs_w == 4 ? 4 : 5) - fold_shift, sample_rows = 1 << sample_shift;
        const int share_h = sample_rows < out_h ? sample_rows : out_h, share_w = tile_w < out_w ? tile_w : out_w;
        const int region_h = S * (share_h - 1) + K, region_w = S * (share_w - 1) + K;
        const int odd = S == 2 ? (region_w + 1) / 2 * PIXEL : 0;
        const int pitch = S == 2 ? 2 * ((region_w + 1) / 2) : region_w;
        const int tap_stride = TILE_PIXELS + 4;
        const int group_channels = channels / groups;
        const int span_rows = 8 * ((T + 7) / 8), span_stride = staged_wide_span_stride(reduced);
        OPLIB_DYNAMIC_SHARED(float, shared);
        float* span = shared;  // 8 BUFFER_TILES span rows
        float* span_bias = span + 8 * BUFFER_TILES * span_stride;
        float* staged = span_bias + span_rows;
        const int region_floats = region_h * pitch * PIXEL;  // a sample's
        float* weights = staged + (((region_floats << fold_shift) + 3) & ~3);

        const int tile_y = blockIdx.x / tiles_w, tile_x = blockIdx.x % tiles_w;
        const int y0 = tile_y * tile_h, x0 = tile_x * tile_w;
        const int group = blockIdx.y, chunks = (group_channels + CHUNK - 1) / CHUNK;
        const int n0 = (blockIdx.z / chunks) << fold_shift;
        const int c0 = CHUNK * (blockIdx.z % chunks);

        staged_wide_pass_span_rows<K, PASSES>(span, span_weight, 0, reduced, thread);
        if (thread < span_rows) span_bias[thread] = thread < T ? __ldg(bias + (index_t)group * T + thread) : 0.0f;
        const float* plane = input + (index_t)n0 * input_n + (index_t)group * group_channels * input_c;
        staged_wide_region<S, CH, PIXEL>(staged, plane, c0, group_channels, region_h, region_w, pitch, 1 << fold_shift, batch - n0,
                              input_n, S * y0 - pad_h, S * x0 - pad_w, height, width, input_c, input_h, input_w,
                              INPUT_VECTORS || vector_input, thread);
        __syncthreads();  // the span rows, their bias and the input are staged

        const int row = lane >> 2, quad = lane & 3;
        // the lane's two floats of a B fragment: tap `row` of an n-tile, channels k0 + 2 quad, + 1
        const float* lane_span = span + row * span_stride + 2 * quad;
        const bool words = INPUT_VECTORS || feature_words;
        const index_t feature_step = words ? 1 : feature_c;
        const int run = lane >> 2, quarter = lane & 3, run_x = run & (runs_w - 1), run_y = run / runs_w;
        const int ty = warp * runs_h + run_y, tx = STAGED_RUN * run_x;
        const int run_sample = ty >> sample_shift, sample_y = ty & (sample_rows - 1);
        float sums[STAGED_RUN][CH] = {};
#pragma unroll
        for (int pass = 0; pass < PASSES; ++pass) {
            const int first_a = staged_pass_first(K, PASSES, pass), end_a = staged_pass_first(K, PASSES, pass + 1);
            const int first_tile = first_a * K / 8, tiles = (end_a * K + 7) / 8 - first_tile;
            if (pass > 0) __syncthreads();  // the previous pass's weights are read, this one's span rows staged
#pragma unroll 1
            for (int warp_tile = 0; warp_tile < TILE_PIXELS / 16 / MMA_WARPS; ++warp_tile) {
                const int m = warp + MMA_WARPS * warp_tile;
                const float* values[2];  // each pixel's reduced channel 2 quad, the lane's first
                bool inside[2];
#pragma unroll
                for (int h = 0; h < 2; ++h) {
                    const int pixel = 16 * m + row + 8 * h, py = pixel >> tile_w_shift, sample = n0 + (py >> sample_shift);
                    const int i = y0 + (py & (sample_rows - 1)), o = x0 + pixel - (py << tile_w_shift);
                    inside[h] = sample < batch && i < out_h && o < out_w;
                    const int read_sample = inside[h] ? sample : n0;  // (a pixel outside: any address)
                    values[h] = feature + (index_t)read_sample * feature_n + (index_t)i * feature_h +
                                (index_t)o * feature_w + 2 * quad * feature_step;
                }
                float* to = weights + 16 * m + row;
                OplibFragmentC d[BUFFER_TILES];
#pragma unroll
                for (int t = 0; t < BUFFER_TILES; ++t) {
                    if (t >= tiles) break;
                    const StagedBias start =
                        *reinterpret_cast<const StagedBias*>(span_bias + 8 * (first_tile + t) + 2 * quad);
                    d[t] = OplibFragmentC{{start.value[0], start.value[1], start.value[0], start.value[1]}};
                }
#pragma unroll 1
                for (int k0 = 0; k0 < reduced; k0 += 8) {
                    OplibFragmentTf32A a_hi, a_lo;
                    staged_wide_feature_fragments(values, inside, k0 + 2 * quad, reduced, feature_step, words, a_hi,
                                                  a_lo);
#pragma unroll
                    for (int t = 0; t < BUFFER_TILES; ++t) {
                        if (t >= tiles) break;
                        const StagedWidePair pair =
                            *reinterpret_cast<const StagedWidePair*>(lane_span + 8 * t * span_stride + k0);
                        OplibFragmentTf32B b_hi, b_lo;
#pragma unroll
                        for (int e = 0; e < 2; ++e) oplib_split_tf32_into(b_hi, b_lo, e, pair.value[e]);
                        oplib_mma_3xtf32(d[t], a_hi, a_lo, b_hi, b_lo);
                    }
                }
                bool non_finite = false;
#pragma unroll
                for (int t = 0; t < BUFFER_TILES; ++t) {
#pragma unroll
                    for (int v = 0; v < 4; ++v) non_finite |= t < tiles && !mma_finite(d[t].value[v]);
                }
                if (oplib_warp_any(non_finite)) {  // oplib-cold: an inf or a nan among the warp's weights
                    OPLIB_COLD_BLOCK();
                    // each weight by the direct sum in float, from the staged span rows and bias;
                    // the pixels' channel 0 found again from where the k-steps left `values` (kept
                    // live across them, the pointers spilled at 80 registers)
                    const index_t back = (2 * quad + 8 * ((reduced + 7) / 8)) * feature_step;
#pragma unroll
                    for (int t = 0; t < BUFFER_TILES; ++t) {
                        if (t >= tiles) break;
#pragma unroll
                        for (int v = 0; v < 4; ++v) {
                            const int h = v >> 1, place = 8 * t + 2 * quad + (v & 1);
                            if (!inside[h]) continue;
                            float sum = span_bias[8 * first_tile + place];
                            const float* span_row = span + place * span_stride;
#pragma unroll 1
                            for (int r = 0; r < reduced; ++r)
                                sum = oplib_fma(span_row[r], __ldg(values[h] - back + r * feature_step), sum);
                            d[t].value[v] = sum;
                        }
                    }
                }
#pragma unroll
                for (int t = 0; t < BUFFER_TILES; ++t) {
#pragma unroll
                    for (int e = 0; e < 2; ++e) {
                        const int place = 8 * t + 2 * quad + e;
                        if (t >= tiles || place >= end_a * K - 8 * first_tile) continue;
#pragma unroll
                        for (int h = 0; h < 2; ++h) to[place * tap_stride + 8 * h] = d[t].value[2 * h + e];
                    }
                }
            }
            __syncthreads();  // the pass's float weights are formed, its span rows read
            const float* run_weights = weights + ty * tile_w + tx;
            const float* run_window =
                staged + run_sample * region_floats + (S * sample_y * pitch + tx) * PIXEL + CH * quarter;
            if (y0 + sample_y < out_h && x0 + tx < out_w && n0 + run_sample < batch) {
#pragma unroll 1
                for (int a = first_a; a < end_a; ++a)
                    staged_wide_row_sums<K, S, CH, PIXEL>(sums, run_weights + (a * K - 8 * first_tile) * tap_stride,
                                                          tap_stride, run_window + a * pitch * PIXEL, odd);
            }
            if (pass + 1 < PASSES) staged_wide_pass_span_rows<K, PASSES>(span, span_weight, pass + 1, reduced, thread);
        }

        const int y = y0 + sample_y, x = x0 + tx;
        if (y >= out_h || n0 + run_sample >= batch) return;
        const int c = c0 + CH * quarter;
        const bool pair_stores = INPUT_VECTORS || mma_pair_stores(out, out_n, out_c, out_hs, out_ws, group_channels);
        float* at = out + (index_t)(n0 + run_sample) * out_n + ((index_t)group * group_channels + c) * out_c +
                    (index_t)y * out_hs;
        staged_wide_store_run(sums, at, x, 1, out_w, out_ws, c, group_channels, out_c, pair_stores);
    }
#endif
}

// ---------------------------------------------------------------------------------------
// The generator's gradients (involution_generated_backward_generator) on tensor cores
// ---------------------------------------------------------------------------------------
//
//   gw[n, g, t, i, j]            = sum over the group's channels c of grad_output[n, c, i, j] *
//                                  input[n, c, i*sh - ph + a*dh, j*sw - pw + b*dw]     (t = a*KW + b)
//   grad_feature[n, r, i, j]     = sum over g, t of span_weight[g*T + t, r] * gw[n, g, t, i, j]
//   grad_span_weight[g*T + t, r] = sum over n, i, j of gw[n, g, t, i, j] * feature[n, r, i, j]
//   grad_span_bias[g*T + t]      = sum over n, i, j of gw[n, g, t, i, j]
//
// grad_output, grad_feature: (N, C, Ho, Wo) and (N, R, Ho, Wo), input: (N, C, H, W), feature
// (N, R, Ho, Wo), any strides; span_weight (G*T, R) contiguous. The map gw, (N, G*T, Ho, Wo),
// never reaches global memory. A block of MMA_WARPS warps takes MMA_TILE_H output rows (a warp
// each) x tile_w columns of one sample, span_r of R's channels, and its share of the groups
// (grid: tiles x R ranges x group splits x samples): tile_w = MMA_TILE_W and span_r = GEN_GRAD_R,
// or, NARROW (the host's choice for a map at most 8 wide, RedNet's last stage), 8 columns and
// twice the channels, so that a 7-wide map's 49 pixels fill 64 of a tile's rather than 128, and
// its gw is formed once for 64 of R's channels rather than 32. Per group:
//   1. the tile's gw, in float in shared memory: per kernel row a, a run's products with the
//      input row its windows read are, over all of that row's columns, one product, the run's
//      grad_output (16 pixels x 16 channels; NARROW, 8 pixels and 8 rows of zeros) times the
//      staged input row (16 channels x K columns) on tensor cores: a fixed window's n-tiles of
//      K all, three at a time (unrolled: the products back to back, each store's place its
//      lane's and a constant), a window read from the arguments those with a tap of a pixel
//      inside the map only; pixel j's tap b is its element (j, j*sw + b*dw), and the others are
//      dropped (the forward's band, read the other way round). A chunk of MMA_CHANNELS of the
//      group's channels at a time, added up in place;
//   2. each warp splits its rows of gw in place, once, into the two values of the storage type
//      both products take (below), two rows a lane between warp barriers, and sums them per
//      tap for grad_span_bias (a pixel past the map as zeros, whatever its products left);
//   3. each warp's share of grad_feature, (16 pixels x T)(T x GEN_GRAD_R) on tensor cores (the
//      16 pixels its row's, or NARROW two rows' of 8, and half the R range),
//      summed over the block's groups in registers and stored at the end: as the result where
//      one block takes all groups, else in float to its split's part, which the host adds up
//      (a small map leaves a grid of tiles too few blocks to fill the GPU; the host splits the
//      groups where it has fewer than GENERATOR_SPLIT_BLOCKS, cuda.py's);
//   4. the block's share of grad_span_weight, (T x the tile's pixels)(the tile's pixels x
//      GEN_GRAD_R) on tensor cores, and (R range 0 only) of grad_span_bias, the warps' sums
//      added up, to the block's slot of two partial sums in float, which the host adds up over
//      the slots.
// gw enters both products as two values of the storage type, hi and lo (as the forward's
// weights do): hi alone would round it before the sums over a batch's pixels, which cancel.
// The split is made once (step 2) and both products load gw's fragments by ldmatrix, the second
// transposed: split from floats at each fragment, as before, the splits took half the kernel's
// instructions (four of grad_feature's k-steps and eight of grad_span_weight's a group, each
// split again in every R range).
// Every product of the three sums is one of the direct sum's, or 0 times 0 (taps past T and
// pixels past the map hold gw = 0, and meet zeros), but for an inf in span_weight or the
// feature: hi and lo would each meet it (0 times inf where lo is 0, infs of opposite signs where
// lo's sign is not hi's), so a group whose staged span rows hold one (step 3) and a block whose
// staged feature does (step 4) take each product once, in float, from the same staged values
// (gw as hi + lo):
// inf and nan land where torch puts them. No atomics, every sum in a fixed order: deterministic.
// The 16-bit way serves bfloat16 only (GenGradServes): a float16 gw past 65504, which the float32
// map holds, would be an inf; its instantiation, like double's, is empty, and the host declines
// those calls. float32 has a way of its own (generator_wide, below).
//
// Dynamic shared memory, 32-bit words (generated_mma_generator_shared_bytes):
//   span      span_r x span_stride           the group's span_weight, [r][tap pair], zeros past T
//                                           and R (span_stride = tap_pad / 2 + 4)
//   features  span_r x pixel_words           the tile's feature, [r][pixel pair] (pixel_words: the
//                                           tile's pixels in pairs, and 4)
//   staged    in_h x columns x GEN_GRAD_COLUMN_WORDS   the input chunk, [row][column][channel pair],
//                                           the two halves of a column's words swapped in
//                                           columns 4-7 of every 8 (gen_grad_load_columns)
//                                           (after the products: the warps' sums for
//                                           grad_span_bias, MMA_WARPS x MMA_TAPS floats)
//   gw        MMA_WARPS x tile_w x gw_stride floats   [pixel][tap] (gw_stride = tap_pad + 4);
//                                           split: a pixel's tap_pad / 2 hi words, then its lo
//   flags     2 ints                        an inf in the staged feature; the last group with
//                                           one in its span rows
// with tap_pad = T rounded up to 16 (whole k-steps) and columns = K, whole n-tiles of 8. Each
// other stride is 4 words past a multiple of 8 or 32: a fragment's 8 rows x 4 words in 32 banks.

constexpr int GEN_GRAD_R = 32;  // four n-tiles of grad_feature a warp
constexpr int GEN_GRAD_COLUMN_WORDS = 8;  // a staged column's 16 channels, no padding (swapped halves)
static_assert(GEN_GRAD_R % 16 == 0 && MMA_CHANNELS == 16, "whole pairs of n-tiles; one k-step of channels");
static_assert(MMA_TAPS / 16 * (GEN_GRAD_R / 8) <= 2 * MMA_WARPS, "grad_span_weight's tiles, two a warp");
static_assert((MMA_WARPS * MMA_TILE_W / 2 + 4) % 32 == 4 && (MMA_WARPS * MMA_TILE_W / 4 + 4) % 32 == 4 &&
                  GEN_GRAD_COLUMN_WORDS == MMA_CHANNELS / 2,
              "the feature's rows (either tile) 4 words past a multiple of 32, the staged columns' halves swapped: "
              "a fragment's 8 rows x 4 words in 32 banks");
static_assert(MMA_TILE_H * MMA_TILE_W / 2 * GEN_GRAD_COLUMN_WORDS >= MMA_WARPS * MMA_TAPS && MMA_TAPS == 4 * 16,
              "the warps' bias sums fit in the least staged input; a row's taps, 4 a lane, in half a warp");

// A lane's two hi (or lo) words of gw's split, stored at once (st.shared.v2).
struct alignas(8) GenGradWords {
    unsigned int word[2];
};

// Where word w (channels 2w, 2w + 1) of staged input column k lies among the column's words: the
// two halves swapped in columns 4-7 of every 8, so that a B fragment's 8 columns x 4 words, 8
// words apart, fall in 32 different banks without the 4 words of padding a column would take
// (a third of the staged input, and at stride 2 the third block per SM).
__device__ __forceinline__ int gen_grad_column_word(int column, int word) { return word ^ (column & 4); }

// B's fragment of the staged input, channels (k) x 8 columns (n) from `column0` of a row
// (`row_words`: its first column's words), column0 a multiple of 8, by ldmatrix: matrix i's row
// r is column column0 + r's words 4 i .. + 3, which gen_grad_column_word's swap puts at 4 i ^ 4
// in columns 4-7 (a row's 4 words stay together, 16-byte aligned).
__device__ __forceinline__ OplibFragmentB gen_grad_load_columns(const unsigned int* row_words, int column0) {
    const int lane = oplib_lane(), column = column0 + (lane & 7);
    OplibFragmentB b;
    oplib_load_matrices<2>(row_words + column * GEN_GRAD_COLUMN_WORDS + gen_grad_column_word(column, 4 * (lane >> 3 & 1)),
                           b.reg);
    return b;
}

// The storage types the kernel's 16-bit way serves (see the comment above): bfloat16.
template <typename scalar_t>
struct GenGradServes {
    static constexpr bool value = false;
};

template <>
struct GenGradServes<oplib_bfloat16> {
    static constexpr bool value = true;
};

// Whether a 16-bit value (its bits) is an inf.
template <typename half_t>
__device__ __forceinline__ bool gen_grad_is_inf(unsigned short bits) {
    return __float_as_uint(mma_to_float(bits, half_t())) << 1 == 0xff000000u;
}

template <typename half_t>
__device__ __forceinline__ bool gen_grad_pair_has_inf(unsigned int pair) {
    return gen_grad_is_inf<half_t>((unsigned short)(pair & 0xffffu)) || gen_grad_is_inf<half_t>((unsigned short)(pair >> 16));
}

// gw at `tap` of the split row `row_words` (step 2): its hi and lo, which both products take, added
// in float (exactly: lo is what hi leaves of the float; 0 where hi is an inf or a nan).
template <typename half_t>
__device__ __forceinline__ float gen_grad_gw(const unsigned int* row_words, int tap, int tap_pad) {
    const int shift = 16 * (tap & 1);
    return oplib_add(mma_to_float((unsigned short)(row_words[tap >> 1] >> shift), half_t()),
                     mma_to_float((unsigned short)(row_words[tap_pad / 2 + (tap >> 1)] >> shift), half_t()));
}

// sum over k < count of gw at (the row `rows` + k row_step, tap + k tap_step) times the k-th value
// of `pairs` (pairs[k / 2], its lower half for an even k), one term at a time in float: the
// direct sums of steps 3 and 4 for the staged values that hold an inf. Rolled, and inline in its
// cold branches: a call there made the kernel hold its live values across it, which spilled at
// three blocks per SM.
template <typename half_t>
__device__ __forceinline__ float gen_grad_direct_sum(const unsigned int* rows, int row_step, int tap, int tap_step,
                                                     int tap_pad, const unsigned int* pairs, int count) {
    float sum = 0.0f;
#pragma unroll 1
    for (int k = 0; k < count; ++k, rows += row_step, tap += tap_step)
        sum = oplib_fma(gen_grad_gw<half_t>(rows, tap, tap_pad),
                        mma_to_float((unsigned short)(pairs[k >> 1] >> 16 * (k & 1)), half_t()), sum);
    return sum;
}

// The products of a fixed window's band a warp holds at once (12 registers; the five of a 7-wide
// window at stride 2 at once spilled on sm_90 at 80 registers).
constexpr int GEN_GRAD_PRODUCTS_LIVE = 3;
static_assert(GEN_GRAD_PRODUCTS_LIVE >= 1, "a product at least (and the constant referenced where sm_75 compiles the kernels out)");

// Whether a fixed window's band products are unrolled: but for a narrow tile at stride 2 from
// sm_80 to sm_89, whose unrolled products spilled 8-16 bytes on sm_80 at its 80 registers (sm_86
// and sm_89 held them; thresholds only, as every architecture test of the sources). The host's
// emulation (no __CUDA_ARCH__) unrolls them.
#define OPLIB_GEN_GRAD_NARROW_STRIDED_UNROLLED OPLIB_BLOCKS_BY_ARCH(true, false, true, true)
template <int KERNEL, int STRIDE, bool NARROW>
struct GenGradUnrolled {
    static constexpr bool value = KERNEL > 0 && (!NARROW || STRIDE == 1 || OPLIB_GEN_GRAD_NARROW_STRIDED_UNROLLED);
};

// The rows of gw a lane splits at once (two of every other row: 8 floats), between one warp
// barrier and the next; a tile's rows (16, or 8 narrow) a whole number of such batches. Four
// spilled on sm_80 at its 80 registers.
constexpr int GEN_GRAD_SPLIT_ROWS = 2;
static_assert((MMA_TILE_W / 2) % (2 * GEN_GRAD_SPLIT_ROWS) == 0, "whole batches of rows in either tile");

// The n-tiles of 8 columns a run's band of a fixed window spans (KERNEL > 0, no dilation): a
// tile's row of pixels reads (tile_w - 1) S + KERNEL columns.
template <int KERNEL, int STRIDE, bool NARROW>
struct GenGradBandTiles {
    static constexpr int value = (((NARROW ? MMA_TILE_W / 2 : MMA_TILE_W) - 1) * STRIDE + KERNEL + 7) / 8;
};

// A generator block's tile (MMA_TILE_H output rows, a warp each, of tile_w columns), R range
// (span_r of R's channels) and split of the groups, and its warp's pixels: both ways'.
template <bool NARROW>
struct GenGradTile {
    static constexpr int tile_w = NARROW ? MMA_TILE_W / 2 : MMA_TILE_W, span_r = NARROW ? 2 * GEN_GRAD_R : GEN_GRAD_R;
    int tile_y, out_y, out_x0, r0, group_first, group_end;
    index_t n, slot;
    bool low_inside, high_inside;  // the lane's fragment rows' pixels (row, row + 8) in the map
    // The n-tiles of a run's products that hold a tap of a pixel inside the map: its last pixel
    // there reads columns up to (live_w - 1) sw + (KW - 1) dw (at RedNet's last stage, two of
    // three at stride 1 and three of five at stride 2). gw past the map is written as zeros.
    int live_tiles;
    // grad_feature's m-tile of the warp: 16 of the tile's pixels from m_pixel (the warp's row,
    // or NARROW two rows of 8 from row m_y), and its channels of the R range from r_half; the
    // lane's fragment rows' pixels: (m_y, m_x), and (high_y, high_x) pixel 8 of the row, or
    // NARROW the next row's pixel 0
    int m_pixel, m_y, r_half, m_x, high_x, high_y;

    __device__ __forceinline__ GenGradTile(int tiles_w, int group_splits, int groups, int out_h, int out_w,
                                           int stride_w, int kernel_w, int dilation_w) {
        const int warp = threadIdx.y, row = threadIdx.x >> 2;
        tile_y = blockIdx.x / tiles_w;
        const int tile_x = blockIdx.x % tiles_w;
        out_y = tile_y * MMA_TILE_H + warp, out_x0 = tile_x * tile_w;
        r0 = blockIdx.y / group_splits * span_r;
        const int split = blockIdx.y % group_splits;
        group_first = split * groups / group_splits, group_end = (split + 1) * groups / group_splits;
        n = blockIdx.z, slot = blockIdx.x + (index_t)gridDim.x * n;
        low_inside = out_y < out_h && out_x0 + row < out_w;
        high_inside = !NARROW && out_y < out_h && out_x0 + row + 8 < out_w;
        const int live_w = out_w - out_x0 < tile_w ? out_w - out_x0 : tile_w;
        live_tiles = ((live_w - 1) * stride_w + (kernel_w - 1) * dilation_w) / 8 + 1;
        m_pixel = NARROW ? 16 * (warp % 4) : 16 * warp;
        m_y = NARROW ? tile_y * MMA_TILE_H + 2 * (warp % 4) : out_y;
        r_half = NARROW ? GEN_GRAD_R * (warp / 4) : 0;
        m_x = out_x0 + row, high_x = NARROW ? m_x : m_x + 8, high_y = NARROW ? m_y + 1 : m_y;
    }
};

// A run's product with n-tile t of the input row its kernel row a reads into the warp's gw
// ([pixel][tap], gw_stride floats a pixel): the product's element (j, k) is pixel j's tap b
// where k = j sw + b dw, the others dropped; the first chunk's stored, the others' added. A
// pixel past the map keeps what its product holds (0 times an inf is a nan): the split (step 2)
// reads only the map's pixels and takes the others as zeros. KERNEL > 0 (a fixed window, the
// caller's n-tiles unrolled, t a constant): a fragment row and column whose lanes meet no tap
// of their pixels at any lane are left out at compile time (at stride 1 of a 7-wide window, the
// first n-tile's rows 8-15 and the last's rows 0-7), and each element's tap is its lane's offset
// and a constant.
template <bool NARROW, int KERNEL, int STRIDE>
__device__ __forceinline__ void gen_grad_store_product(const OplibFragmentC& product, float* warp_gw, int gw_stride,
                                                       int a, int t, int kernel_w, int stride_w, int dilation_w,
                                                       bool first) {
    const int row = threadIdx.x >> 2, quad = threadIdx.x & 3;
#pragma unroll
    for (int v = 0; v < (NARROW ? 2 : 4); ++v) {  // NARROW: pixels 8-15 are no tile's
        const int high = v >> 1, column = 8 * t + (v & 1);  // (the lanes add row and 2 quad)
        // the taps of this element at the lanes: column + 2 quad - (row + 8 high) S, quad 0-3, row 0-7
        if (KERNEL > 0 && (column + 6 - 8 * high * STRIDE < 0 || column - (7 + 8 * high) * STRIDE >= KERNEL)) continue;
        const int j = row + 8 * high, offset = column + 2 * quad - j * stride_w;
        const int b = offset / dilation_w;
        if (offset < 0 || offset != b * dilation_w || b >= kernel_w) continue;
        float* at = warp_gw + j * gw_stride + a * kernel_w + b;
        const float value = product.value[v];
        *at = first ? value : oplib_add(*at, value);
    }
}

// grad_span_weight's sums of a warp's COUNT tiles (taps m0 .. + 15, r of n-tiles t0 ..) to its
// block's slot, taps past T and channels past R left out. Fragment row r is tap m0 + r, or
// PAIRED (float32's: a lane's two taps adjacent) m0 + 2 (r % 8) + r / 8.
template <int COUNT, bool PAIRED = false>
__device__ __forceinline__ void gen_grad_store_span_sums(const OplibFragmentC (&sums)[COUNT], float* slot_sums, int m0,
                                                         int t0, int r0, int taps, int reduced) {
    const int row = threadIdx.x >> 2, quad = threadIdx.x & 3;
#pragma unroll
    for (int u = 0; u < COUNT; ++u) {
#pragma unroll
        for (int v = 0; v < 4; ++v) {  // taps m0 + row (+ 8) x r r0 + 8 (t0 + u) + 2 quad (+ 1)
            const int tap = PAIRED ? m0 + 2 * row + (v >> 1) : m0 + row + 8 * (v >> 1);
            const int r = r0 + 8 * (t0 + u) + 2 * quad + (v & 1);
            if (tap < taps && r < reduced) slot_sums[(index_t)tap * reduced + r] = sums[u].value[v];
        }
    }
}

// grad_feature's sums of a warp's m-tile in float, channels r_first + 8 t + 2 quad (+ 1), to `low`
// (the lane's first fragment row's map row, at column 0) and `high` (its second's), a pixel
// x_step and a channel r_step apart: pixels past the map and channels past R left out.
template <bool NARROW>
__device__ __forceinline__ void gen_grad_store_feature_sums(const OplibFragmentC (&sums)[GEN_GRAD_R / 8], float* low,
                                                            float* high, index_t x_step, index_t r_step,
                                                            const GenGradTile<NARROW>& tile, int r_first, int out_h,
                                                            int out_w, int reduced) {
    const int quad = threadIdx.x & 3;
#pragma unroll
    for (int t = 0; t < GEN_GRAD_R / 8; ++t) {
#pragma unroll
        for (int v = 0; v < 4; ++v) {  // pixel row (+ 8) x r 8 t + 2 quad (+ 1)
            const int x = v >> 1 ? tile.high_x : tile.m_x, r = r_first + 8 * t + 2 * quad + (v & 1);
            if ((v >> 1 ? tile.high_y : tile.m_y) < out_h && x < out_w && r < reduced)
                (v >> 1 ? high : low)[(index_t)x * x_step + (index_t)r * r_step] = sums[t].value[v];
        }
    }
}

// grad_span_bias's sums over the tile (R range 0's blocks): the warps' parts ([warp][tap]) added
// up in order, to the block's slot.
__device__ __forceinline__ void gen_grad_store_bias(const float* bias_parts, float* bias_sums, index_t slot, int groups,
                                                    int group, int taps, int thread) {
    if (thread < taps) {
        float total = bias_parts[thread];
        for (int part = 1; part < MMA_WARPS; ++part) total = oplib_add(total, bias_parts[part * MMA_TAPS + thread]);
        bias_sums[(slot * groups + group) * taps + thread] = total;
    }
}

// The generator's gradients in float32: the kernel's three products in 3xTF32 (warp.cuh), where
// the map route (gw in float32, then cuBLAS) was float32's only way. The same tiles, grid, R
// ranges, group splits and outputs as the 16-bit way above; what differs:
//   - gw stays in float and each product splits its operands into TF32 hi and lo as it loads
//     them (no split pass: there is no storage type to round gw to); the pass over gw after the
//     products (step 2) writes zeros at taps past T and pixels past the map, sums grad_span_bias
//     and notes a group whose gw holds a value whose hi is not finite;
//   - the input is staged a k-step at a time, GEN_GRAD_WIDE_CHANNELS channels, [row][column]
//     [channel]: a B fragment's 8-byte loads, 8 columns x 4 channel pairs, in 32 banks with no
//     padding (16 channels in float took a stride-2 tile past 99 KiB);
//   - k-steps of 8 in the products. The first two permute their k order alike in A and B (column
//     quad is channel, or tap, k0 + 2 quad, column quad + 4 is k0 + 2 quad + 1: a lane's pair one
//     8-byte load, of grad_output channels_last, of the staged input, of gw's and span's rows);
//     grad_span_weight's (k the tile's pixels) is in order, its A (gw transposed) with its rows
//     paired instead (a lane's two taps of a pixel one 8-byte load) and its B (the feature's
//     rows) by ldmatrix;
//   - span rows, the feature and gw in floats, their rows GEN_GRAD_WIDE_PAD floats past the taps'
//     whole k-steps (8 past a multiple of 32, or 24: a half-warp's 8-byte loads 4 rows x 4 pairs
//     in 32 banks) and the feature's 4 past the tile's pixels;
//   - an inf or a nan: 3xTF32 gives nan where a product's operand is not finite (lo = x - hi), so
//     a product of gw whose warp's results are not all finite is formed again by the direct sum
//     in float (the chunk's grad_output read again from global memory); grad_feature's products
//     of a group whose span rows or gw hold a non-finite hi, and grad_span_weight's of a block
//     whose feature does or a group whose gw does, are each the direct sum in float from the
//     same staged values: inf and nan land where torch puts them.
//
// Dynamic shared memory (generated_mma_generator_shared_bytes), floats:
//   span      span_r x (tap_pad + GEN_GRAD_WIDE_PAD)    the group's span_weight, [r][tap]
//   features  span_r x (MMA_WARPS tile_w + 4)           the tile's feature, [r][pixel]
//   staged    in_h x columns x GEN_GRAD_WIDE_CHANNELS   the input's k-step, [row][column][channel]
//                                                       (then the warps' bias sums)
//   gw        MMA_WARPS x tile_w x (tap_pad + GEN_GRAD_WIDE_PAD)   [pixel][tap]
//   flags     3 ints                                    a non-finite hi in the feature; the last
//                                                       group with one in its span rows, and in gw
constexpr int GEN_GRAD_WIDE_CHANNELS = 8;  // a staged k-step of the input
constexpr int GEN_GRAD_WIDE_PAD = 8;  // floats past a gw or span row's taps
static_assert((64 + GEN_GRAD_WIDE_PAD) % 32 == 8 && (16 + GEN_GRAD_WIDE_PAD) % 32 == 24 &&
                  (MMA_WARPS * MMA_TILE_W + 4) % 32 == 4 && (MMA_WARPS * MMA_TILE_W / 2 + 4) % 32 == 4,
              "rows of taps 8 or 24 past a multiple of 32 words; the feature's rows 4");
static_assert(MMA_TILE_H * 8 * GEN_GRAD_WIDE_CHANNELS >= MMA_WARPS * MMA_TAPS,
              "the warps' bias sums fit in the least staged input");

// Whether v's TF32 hi (v rounded) is finite: 3xTF32 takes v whole where it is.
__device__ __forceinline__ bool gen_grad_wide_finite(float v) { return mma_finite(oplib_round_tf32(v)); }

// The products of a fixed window's band a warp holds at once in float32 (the 16-bit way's
// GEN_GRAD_PRODUCTS_LIVE, its operands in hi and lo): two, but one for a tile 16 wide at stride 2
// on sm_90, whose two spilled 32 bytes at its 80 registers (sm_100 and sm_120 held them).
#define OPLIB_GEN_GRAD_WIDE_STRIDED_LIVE OPLIB_BLOCKS_BY_ARCH(2, 2, 1, 2)
template <int STRIDE, bool NARROW>
constexpr int GEN_GRAD_WIDE_PRODUCTS_LIVE = STRIDE > 1 && !NARROW ? OPLIB_GEN_GRAD_WIDE_STRIDED_LIVE : 2;

// A run's product (run_hi + run_lo, pixels x the k-step's channels) with n-tile t of the staged
// input row `input_row` ([column][channel], CH floats a column), in 3xTF32, into `product`
// (zeroed); whether the lane's four results are finite.
__device__ __forceinline__ bool gen_grad_wide_product(OplibFragmentC& product, const OplibFragmentTf32A& run_hi,
                                                      const OplibFragmentTf32A& run_lo, const float* input_row, int t) {
    const int row = threadIdx.x >> 2, quad = threadIdx.x & 3;
    const StagedWidePair in =
        *reinterpret_cast<const StagedWidePair*>(input_row + (8 * t + row) * GEN_GRAD_WIDE_CHANNELS + 2 * quad);
    OplibFragmentTf32B in_hi, in_lo;
    oplib_split_tf32_into(in_hi, in_lo, 0, in.value[0]);
    oplib_split_tf32_into(in_hi, in_lo, 1, in.value[1]);
    oplib_mma_3xtf32(product, run_hi, run_lo, in_hi, in_lo);
    bool finite = true;
#pragma unroll
    for (int v = 0; v < 4; ++v) finite &= mma_finite(product.value[v]);
    return finite;
}

// The same product as the direct sum in float, from grad_output's k-step again (`low` and `high`:
// the lane's fragment rows' pixels at the k-step's first channel, a channel `grad_c` apart, `left`
// of the group's channels from there): inf and nan where torch puts them, where 3xTF32 gives nan.
__device__ __forceinline__ void gen_grad_wide_direct_product(OplibFragmentC& product, const float* input_row, int t,
                                                             const float* low, const float* high, index_t grad_c,
                                                             int left, bool low_inside, bool high_inside) {
    const int quad = threadIdx.x & 3;
    const int count = left < GEN_GRAD_WIDE_CHANNELS ? left : GEN_GRAD_WIDE_CHANNELS;
#pragma unroll 1
    for (int v = 0; v < 4; ++v) {  // pixel row (+ 8) x column 8 t + 2 quad (+ 1)
        const float* grad_at = v >> 1 ? high : low;
        const float* column = input_row + (8 * t + 2 * quad + (v & 1)) * GEN_GRAD_WIDE_CHANNELS;
        float sum = 0.0f;
#pragma unroll 1
        for (int k = 0; k < count && (v >> 1 ? high_inside : low_inside); ++k)
            sum = oplib_fma(__ldg(grad_at + k * grad_c), column[k], sum);
        product.value[v] = sum;
    }
}

template <int KERNEL, int STRIDE, bool NARROW>
__device__ __forceinline__ void generator_wide(
    const float* __restrict__ grad_output, const float* __restrict__ input, const float* __restrict__ feature,
    const float* __restrict__ span_weight, float* __restrict__ grad_feature, float* __restrict__ feature_parts,
    float* __restrict__ span_sums, float* __restrict__ bias_sums, int group_splits, int channels, int height, int width,
    int groups, int window_h, int window_w, int out_h, int out_w, int step_h, int step_w, int pad_h, int pad_w,
    int spacing_h, int spacing_w, int reduced, int tiles_w, index_t grad_n, index_t grad_c, index_t grad_h,
    index_t grad_w, index_t input_n, index_t input_c, index_t input_h, index_t input_w, index_t feature_n,
    index_t feature_c, index_t feature_h, index_t feature_w, index_t result_n, index_t result_c, index_t result_h,
    index_t result_w, bool vector_input, bool grad_words) {
    const TileGeometry<KERNEL, STRIDE> geometry(window_h, window_w, step_h, step_w, spacing_h, spacing_w);
    const int kernel_h = geometry.kernel_h, kernel_w = geometry.kernel_w;
    const int stride_h = geometry.stride_h, stride_w = geometry.stride_w;
    const int dilation_h = geometry.dilation_h, dilation_w = geometry.dilation_w;
    const int warp = threadIdx.y, lane = threadIdx.x, thread = lane + 32 * warp;
    const int row = lane >> 2, quad = lane & 3;
    const int taps = kernel_h * kernel_w, group_channels = channels / groups;
    const int tap_pad = 16 * ((taps + 15) / 16), tap_stride = tap_pad + GEN_GRAD_WIDE_PAD;
    constexpr int tile_w = GenGradTile<NARROW>::tile_w, span_r = GenGradTile<NARROW>::span_r;
    constexpr int tile_pixels = MMA_WARPS * tile_w, feature_stride = tile_pixels + 4;
    constexpr int span_tiles = NARROW ? 4 : 2;  // grad_span_weight's n-tiles a warp
    constexpr int CH = GEN_GRAD_WIDE_CHANNELS;
    const int band_columns = (tile_w - 1) * stride_w + (kernel_w - 1) * dilation_w + 1;
    const int columns = 8 * ((band_columns + 7) / 8);
    const int in_h = (MMA_TILE_H - 1) * stride_h + (kernel_h - 1) * dilation_h + 1;
    OPLIB_DYNAMIC_SHARED(unsigned int, shared);
    float* span = reinterpret_cast<float*>(shared);
    float* features = span + span_r * tap_stride;
    float* staged = features + span_r * feature_stride;
    float* gw = staged + in_h * columns * CH;
    int* flags = reinterpret_cast<int*>(gw + MMA_WARPS * tile_w * tap_stride);
    float* warp_gw = gw + warp * tile_w * tap_stride;
    float* bias_parts = staged;  // [warp][tap], after the products

    const GenGradTile<NARROW> tile(tiles_w, group_splits, groups, out_h, out_w, stride_w, kernel_w, dilation_w);
    const int out_y = tile.out_y, r0 = tile.r0, m_y = tile.m_y;
    const index_t n = tile.n;

    if (thread == 0) flags[0] = 0, flags[1] = -1, flags[2] = -1;
    __syncthreads();  // the flags are set before any thread may raise one
    // The tile's feature for the R range, [r][pixel] (pixel p = warp * tile_w + j), zeros past the
    // map and past R; consecutive threads along a row's pixels.
    const float* sample_feature = feature + n * feature_n;
#pragma unroll 1
    for (int e = thread; e < span_r * tile_pixels; e += MMA_THREADS) {
        const int r = e / tile_pixels, p = e % tile_pixels;
        const int y = tile.tile_y * MMA_TILE_H + p / tile_w, x = tile.out_x0 + p % tile_w;
        const bool inside = r0 + r < reduced && y < out_h && x < out_w;
        const float value =
            inside ? __ldg(sample_feature + (index_t)(r0 + r) * feature_c + (index_t)y * feature_h + (index_t)x * feature_w)
                   : 0.0f;
        features[r * feature_stride + p] = value;
        if (!gen_grad_wide_finite(value)) flags[0] = 1;
    }

    OplibFragmentC feature_sums[GEN_GRAD_R / 8] = {};  // NARROW: of the range's half r_half
    const float* sample_grad = grad_output + n * grad_n;
    const float* sample_input = input + n * input_n;
    const float* low_grad = sample_grad + (index_t)out_y * grad_h + (index_t)(tile.out_x0 + row) * grad_w;
    const float* high_grad = low_grad + 8 * grad_w;
    const int top = tile.tile_y * MMA_TILE_H * stride_h - pad_h, left = tile.out_x0 * stride_w - pad_w;
    for (int group = tile.group_first; group < tile.group_end; ++group) {
        __syncthreads();  // every warp is done with the previous group's span, gw and bias parts
        // span_weight's rows of the group for the R range, [r][tap]: a thread a pair of taps of
        // one r, consecutive threads along r (span_weight's rows).
        const float* group_span = span_weight + (index_t)group * taps * reduced;
#pragma unroll 1
        for (int e = thread; e < span_r * (tap_pad / 2); e += MMA_THREADS) {
            const int r = e % span_r, tap = 2 * (e / span_r);
            const bool live_r = r0 + r < reduced;
            const StagedWidePair pair = {{live_r && tap < taps ? __ldg(group_span + (index_t)tap * reduced + r0 + r) : 0.0f,
                                          live_r && tap + 1 < taps ? __ldg(group_span + (index_t)(tap + 1) * reduced + r0 + r)
                                                                   : 0.0f}};
            *reinterpret_cast<StagedWidePair*>(span + r * tap_stride + tap) = pair;
            if (!gen_grad_wide_finite(pair.value[0]) || !gen_grad_wide_finite(pair.value[1])) flags[1] = group;
        }
        const index_t channel0 = (index_t)group * group_channels;
        for (int c0 = 0; c0 < group_channels; c0 += CH) {
            if (c0 > 0) __syncthreads();  // every warp is done with the previous k-step's input
            // The k-step's input rows, [row][column][channel], zeros outside the image and past the
            // group's channels: a unit a column's 4 channels, one 16-byte load (channels_last,
            // aligned: vector_input) along the units of a column, else 4 loads, consecutive
            // threads along a row's columns; one 16-byte store.
            const float* chunk = sample_input + (channel0 + c0) * input_c;
#pragma unroll 1
            for (int unit = thread; unit < in_h * columns * 2; unit += MMA_THREADS) {
                const int half = vector_input ? unit & 1 : unit / columns % 2;
                const int column = vector_input ? (unit >> 1) % columns : unit % columns;
                const int y = vector_input ? (unit >> 1) / columns : unit / columns / 2;
                const int iy = top + y, ix = left + column, c = c0 + 4 * half;
                const bool inside = (unsigned int)iy < (unsigned int)height && (unsigned int)ix < (unsigned int)width;
                const float* at = chunk + 4 * half * input_c + (index_t)iy * input_h + (index_t)ix * input_w;
                Vector16<float> v = {};
                if (vector_input) {
                    if (inside && c < group_channels) v = *reinterpret_cast<const Vector16<float>*>(at);
                } else {
#pragma unroll
                    for (int m = 0; m < 4; ++m) v.lane[m] = inside && c + m < group_channels ? __ldg(at + m * input_c) : 0.0f;
                }
                *reinterpret_cast<Vector16<float>*>(staged + (y * columns + column) * CH + 4 * half) = v;
            }
            __syncthreads();  // the input's k-step (and, the first, the span rows) staged
            // The run's grad_output, pixels x the k-step's channels: A's fragment, hi and lo (zeros
            // past the map and the group's channels); column quad channel c, quad + 4 channel c + 1.
            const index_t chunk_grad = (channel0 + c0) * grad_c;
            const int c = c0 + 2 * quad;
            OplibFragmentTf32A run_hi, run_lo;
#pragma unroll
            for (int h = 0; h < 2; ++h) {  // pixels row, row + 8
                const float* at = (h ? high_grad : low_grad) + chunk_grad + 2 * quad * grad_c;
                const int count = (h ? tile.high_inside : tile.low_inside) ? group_channels - c : 0;
                StagedWidePair pair = {{0.0f, 0.0f}};
                if (grad_words) {
                    if (count > 0) pair = *reinterpret_cast<const StagedWidePair*>(at);
                } else {
                    pair.value[0] = count > 0 ? __ldg(at) : 0.0f;
                    pair.value[1] = count > 1 ? __ldg(at + grad_c) : 0.0f;
                }
                oplib_split_tf32_into(run_hi, run_lo, h, pair.value[0]);
                oplib_split_tf32_into(run_hi, run_lo, h + 2, pair.value[1]);
            }
#pragma unroll 1
            for (int a = 0; a < kernel_h && out_y < out_h; ++a) {
                const float* input_row = staged + (warp * stride_h + a * dilation_h) * columns * CH;
                // A fixed window's n-tiles all formed, GEN_GRAD_WIDE_PRODUCTS_LIVE at a time, then
                // stored (the 16-bit way's unrolled products above: a tile past the live ones holds
                // taps of pixels past the map only, which step 2 writes as zeros); else the live
                // n-tiles one at a time.
                if constexpr (KERNEL > 0) {
                    constexpr int band_tiles = GenGradBandTiles<KERNEL, STRIDE, NARROW>::value;
                    constexpr int held = GEN_GRAD_WIDE_PRODUCTS_LIVE<STRIDE, NARROW>;
#pragma unroll
                    for (int t0 = 0; t0 < band_tiles; t0 += held) {
                        OplibFragmentC products[held] = {};
                        bool non_finite[held] = {};
#pragma unroll
                        for (int u = 0; u < held && t0 + u < band_tiles; ++u)
                            non_finite[u] = !gen_grad_wide_product(products[u], run_hi, run_lo, input_row, t0 + u);
                        bool any_non_finite = false;
#pragma unroll
                        for (int u = 0; u < held; ++u) any_non_finite |= non_finite[u];
                        if (oplib_warp_any(any_non_finite)) {  // oplib-cold: an inf or a nan among the warp's products
                            OPLIB_COLD_BLOCK();
#pragma unroll
                            for (int u = 0; u < held && t0 + u < band_tiles; ++u)
                                if (oplib_warp_any(non_finite[u]))
                                    gen_grad_wide_direct_product(products[u], input_row, t0 + u, low_grad + chunk_grad,
                                                                 high_grad + chunk_grad, grad_c, group_channels - c0,
                                                                 tile.low_inside, tile.high_inside);
                        }
#pragma unroll
                        for (int u = 0; u < held && t0 + u < band_tiles; ++u)
                            gen_grad_store_product<NARROW, KERNEL, STRIDE>(products[u], warp_gw, tap_stride, a, t0 + u,
                                                                           kernel_w, stride_w, dilation_w, c0 == 0);
                    }
                } else {
#pragma unroll 1
                    for (int t = 0; t < tile.live_tiles; ++t) {
                        OplibFragmentC product = {};
                        const bool finite = gen_grad_wide_product(product, run_hi, run_lo, input_row, t);
                        if (oplib_warp_any(!finite)) {  // oplib-cold: an inf or a nan among the warp's products
                            OPLIB_COLD_BLOCK();
                            gen_grad_wide_direct_product(product, input_row, t, low_grad + chunk_grad, high_grad + chunk_grad,
                                                         grad_c, group_channels - c0, tile.low_inside, tile.high_inside);
                        }
                        gen_grad_store_product<NARROW, 0, 0>(product, warp_gw, tap_stride, a, t, kernel_w, stride_w,
                                                             dilation_w, c0 == 0);
                    }
                }
            }
        }
        // 2. The warp's rows of gw: zeros at taps past T and at pixels past the map (whose floats
        // the products leave as they were), each pixel's gw summed per tap for grad_span_bias, and a
        // hi that is not finite noted. A lane 4 taps of every other row.
        const int lane_taps = 4 * (lane & 15);
        float bias[4] = {};
        bool gw_non_finite = false;
        __syncwarp();  // every lane's products are in the warp's gw rows
#pragma unroll 1
        for (int j = lane >> 4; j < tile_w && lane_taps < tap_pad; j += 2) {
            float* gw_row = warp_gw + j * tap_stride + lane_taps;
            const bool pixel_inside = out_y < out_h && tile.out_x0 + j < out_w;
            Vector16<float> four = *reinterpret_cast<const Vector16<float>*>(gw_row);
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                four.lane[e] = pixel_inside && lane_taps + e < taps ? four.lane[e] : 0.0f;
                gw_non_finite |= !gen_grad_wide_finite(four.lane[e]);
                bias[e] = oplib_add(bias[e], four.lane[e]);
            }
            *reinterpret_cast<Vector16<float>*>(gw_row) = four;
        }
        if (oplib_warp_any(gw_non_finite) && lane == 0) flags[2] = group;
#pragma unroll
        for (int e = 0; e < 4; ++e) bias[e] = oplib_add(bias[e], __shfl_xor_sync(OPLIB_FULL_WARP, bias[e], 16));
        __syncthreads();  // every warp's gw of the group is written (and done with the staged input)
        if (r0 == 0 && lane < 16 && lane_taps < tap_pad)
            *reinterpret_cast<Vector16<float>*>(bias_parts + warp * MMA_TAPS + lane_taps) = {{bias[0], bias[1], bias[2], bias[3]}};
        const bool gw_finite = flags[2] != group;

        // 3. grad_feature += gw (16 pixels x taps) span^T (taps x GEN_GRAD_R of the range), but for
        // an m-tile past the map (its sums are never stored).
        const float* m_rows = gw + tile.m_pixel * tap_stride;  // the warp's m-tile
        if ((flags[1] == group || !gw_finite) && m_y < out_h) {  // oplib-cold: a hi of the span rows or gw not finite
            OPLIB_COLD_BLOCK();
#pragma unroll 1
            for (int t = 0; t < GEN_GRAD_R / 8; ++t) {
#pragma unroll 1
                for (int v = 0; v < 4; ++v) {  // pixel row (+ 8) x r r_half + 8 t + 2 quad (+ 1)
                    const float* gw_row = m_rows + (row + 8 * (v >> 1)) * tap_stride;
                    const float* span_row = span + (tile.r_half + 8 * t + 2 * quad + (v & 1)) * tap_stride;
                    float sum = 0.0f;
#pragma unroll 1
                    for (int tap = 0; tap < taps; ++tap) sum = oplib_fma(gw_row[tap], span_row[tap], sum);
                    feature_sums[t].value[v] = oplib_add(feature_sums[t].value[v], sum);
                }
            }
        }
#pragma unroll 1
        for (int k0 = 0; k0 < tap_pad && flags[1] != group && gw_finite && m_y < out_h; k0 += 8) {
            OplibFragmentTf32A hi, lo;
#pragma unroll
            for (int h = 0; h < 2; ++h) {  // pixels row, row + 8; taps k0 + 2 quad, + 1
                const StagedWidePair pair = *reinterpret_cast<const StagedWidePair*>(m_rows + (row + 8 * h) * tap_stride + k0 + 2 * quad);
                oplib_split_tf32_into(hi, lo, h, pair.value[0]);
                oplib_split_tf32_into(hi, lo, h + 2, pair.value[1]);
            }
#pragma unroll
            for (int t = 0; t < GEN_GRAD_R / 8; ++t) {
                const StagedWidePair pair =
                    *reinterpret_cast<const StagedWidePair*>(span + (tile.r_half + 8 * t + row) * tap_stride + k0 + 2 * quad);
                OplibFragmentTf32B b_hi, b_lo;
                oplib_split_tf32_into(b_hi, b_lo, 0, pair.value[0]);
                oplib_split_tf32_into(b_hi, b_lo, 1, pair.value[1]);
                oplib_mma_3xtf32(feature_sums[t], hi, lo, b_hi, b_lo);
            }
        }
        // 4. The block's grad_span_weight, a tile taps 16 x R range columns 8, over the tile's
        // pixels (k-steps of 8, in order; those past the map's rows left out): the 16-bit way's
        // tiles a warp, two n-tiles at a time (NARROW's four at once spilled at three blocks an
        // SM; gw's fragments are loaded again for the second two).
        if (span_tiles * warp < tap_pad / 16 * (span_r / 8)) {
            const int m0 = 16 * (span_tiles * warp / (span_r / 8)), t0 = span_tiles * warp % (span_r / 8);
            const int live_rows = out_h - tile.tile_y * MMA_TILE_H;
            const int live_pixels = tile_w * (live_rows < MMA_WARPS ? live_rows : MMA_WARPS);
            const bool direct = flags[0] || !gw_finite;
            float* slot_sums = span_sums + (tile.slot * groups + group) * (index_t)taps * reduced;
#pragma unroll 1
            for (int u0 = 0; u0 < span_tiles; u0 += 2) {
                OplibFragmentC sums[2] = {};
                if (direct) {  // oplib-cold: a hi of the tile's feature or of gw not finite
                    OPLIB_COLD_BLOCK();
#pragma unroll 1
                    for (int u = 0; u < 2; ++u) {
#pragma unroll 1
                        for (int v = 0; v < 4; ++v) {  // taps m0 + 2 row (+ 1) x r 8 (t0 + u0 + u) + 2 quad (+ 1)
                            const float* gw_column = gw + m0 + 2 * row + (v >> 1);
                            const float* feature_row = features + (8 * (t0 + u0 + u) + 2 * quad + (v & 1)) * feature_stride;
                            float sum = 0.0f;
#pragma unroll 1
                            for (int p = 0; p < live_pixels; ++p)
                                sum = oplib_fma(gw_column[p * tap_stride], feature_row[p], sum);
                            sums[u].value[v] = sum;
                        }
                    }
                }
#pragma unroll 1
                for (int p0 = 0; p0 < live_pixels && !direct; p0 += 8) {
                    // A: gw transposed, its rows paired (fragment row r tap m0 + 2 (r % 8) + r / 8: a lane's
                    // two taps of a pixel adjacent, one 8-byte load) x pixels p0 + quad (+ 4)
                    OplibFragmentTf32A hi, lo;
#pragma unroll
                    for (int h = 0; h < 2; ++h) {
                        const StagedWidePair pair =
                            *reinterpret_cast<const StagedWidePair*>(gw + (p0 + quad + 4 * h) * tap_stride + m0 + 2 * row);
                        oplib_split_tf32_into(hi, lo, 2 * h, pair.value[0]);
                        oplib_split_tf32_into(hi, lo, 2 * h + 1, pair.value[1]);
                    }
                    // B: the feature's two n-tiles by ldmatrix, pixels p0 .. + 7 x r 8 (t0 + u0) .. + 15:
                    // matrix i rows r 8 (t0 + u0 + i / 2) .. + 7, their pixels p0 + 4 (i % 2) .. + 3
                    unsigned int words[4];
                    oplib_load_matrices<4>(reinterpret_cast<const unsigned int*>(features) +
                                               (8 * (t0 + u0) + (lane & 7) + 8 * (lane >> 4)) * feature_stride + p0 +
                                               4 * (lane >> 3 & 1),
                                           words);
#pragma unroll
                    for (int u = 0; u < 2; ++u) {
                        OplibFragmentTf32B b_hi, b_lo;
                        oplib_split_tf32_into(b_hi, b_lo, 0, __uint_as_float(words[2 * u]));
                        oplib_split_tf32_into(b_hi, b_lo, 1, __uint_as_float(words[2 * u + 1]));
                        oplib_mma_3xtf32(sums[u], hi, lo, b_hi, b_lo);
                    }
                }
                gen_grad_store_span_sums<2, true>(sums, slot_sums, m0, t0 + u0, r0, taps, reduced);
            }
        }
        if (r0 == 0) {  // grad_span_bias's sums over the tile, from R range 0's blocks
            __syncthreads();  // every warp's part is staged
            gen_grad_store_bias(bias_parts, bias_sums, tile.slot, groups, group, taps, thread);
        }
    }
    // grad_feature's sums of the warp's m-tile, its channels of the R range: to the result, or to
    // the split's part, [split][n][y][x][r].
    if (m_y >= out_h) return;
    const bool parts = group_splits > 1;
    // the split and R range again from the block's index (kept from the start across the groups,
    // they took a register)
    const unsigned int y_block = block_y_again();
    const int r_first = y_block / group_splits * span_r + tile.r_half;
    float* low = parts ? feature_parts + (((index_t)(y_block % group_splits) * gridDim.z + n) * out_h + m_y) * out_w * reduced
                       : grad_feature + n * result_n + (index_t)m_y * result_h;
    float* high = low + (NARROW ? (parts ? (index_t)out_w * reduced : result_h) : 0);
    gen_grad_store_feature_sums(feature_sums, low, high, parts ? reduced : result_w, parts ? 1 : result_c, tile, r_first,
                                out_h, out_w, reduced);
}

// Instantiated for the forward's windows (the oplib-template line above). Three blocks per SM
// (at most 80 registers) for the instantiations that fix the window, which the model puts at
// about half the time of two: the kernel is issue-bound, and two blocks leave a scheduler four
// warps to hide each one's dependent instructions. Its loops over staging stay rolled for it
// (unrolled, their hoisted indices spilled), and a row's n-tiles are unrolled a few products at
// a time (GEN_GRAD_PRODUCTS_LIVE, GEN_GRAD_WIDE_PRODUCTS_LIVE). The one that reads the
// window from its arguments keeps two (its runtime sizes take more registers).
//
// Block (32, MMA_WARPS); grid (tiles_h * tiles_w, R ranges x group splits, N), tiles of the output.
// float32's (its staged rows and gw in floats: 74-90 KiB a block at RedNet-50's 7x7 windows,
// 61-70 KiB narrow): three from sm_90 on (80 registers, no spill), two before (sm_80's 164 KiB
// hold two, and its non-narrow instantiations spilled 20 bytes at three).
#define OPLIB_GEN_GRAD_WIDE_BLOCKS OPLIB_BLOCKS_BY_ARCH(2, 2, 3, 3)
// The blocks an SM the generator kernel asks for (a variable: see STAGED_FORWARD_BLOCKS).
template <typename scalar_t, int KERNEL>
constexpr int GEN_GRAD_BLOCKS = KERNEL == 0 ? 2 : sizeof(scalar_t) == 4 ? OPLIB_GEN_GRAD_WIDE_BLOCKS : 3;
template <typename scalar_t, int KERNEL, int STRIDE, bool NARROW>
__global__ void __launch_bounds__(MMA_THREADS, GEN_GRAD_BLOCKS<scalar_t, KERNEL>) involution_generated_mma_backward_generator(
    const scalar_t* __restrict__ grad_output, const scalar_t* __restrict__ input, const scalar_t* __restrict__ feature,
    const scalar_t* __restrict__ span_weight, scalar_t* __restrict__ grad_feature, float* __restrict__ feature_parts,
    float* __restrict__ span_sums, float* __restrict__ bias_sums, int group_splits, int channels, int height, int width,
    int groups, int window_h, int window_w, int out_h, int out_w, int step_h, int step_w, int pad_h, int pad_w,
    int spacing_h, int spacing_w, int reduced, int tiles_w, index_t grad_n, index_t grad_c, index_t grad_h,
    index_t grad_w, index_t input_n, index_t input_c,
    index_t input_h, index_t input_w, index_t feature_n, index_t feature_c, index_t feature_h, index_t feature_w,
    index_t result_n, index_t result_c, index_t result_h, index_t result_w, bool vector_input, bool grad_words) {
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800
    if constexpr (GenGradServes<scalar_t>::value) {
        const TileGeometry<KERNEL, STRIDE> geometry(window_h, window_w, step_h, step_w, spacing_h, spacing_w);
        const int kernel_h = geometry.kernel_h, kernel_w = geometry.kernel_w;
        const int stride_h = geometry.stride_h, stride_w = geometry.stride_w;
        const int dilation_h = geometry.dilation_h, dilation_w = geometry.dilation_w;
        typedef scalar_t half_t;
        const int warp = threadIdx.y, lane = threadIdx.x, thread = lane + 32 * warp;
        const int row = lane >> 2, quad = lane & 3;
        const int taps = kernel_h * kernel_w, group_channels = channels / groups;
        const int tap_pad = 16 * ((taps + 15) / 16), span_stride = tap_pad / 2 + 4, gw_stride = tap_pad + 4;
        // NARROW: a tile 8 columns wide, twice the R range (the same registers of grad_feature's
        // sums: a warp's m-tile two rows of 8 pixels, half the range's channels)
        constexpr int tile_w = NARROW ? MMA_TILE_W / 2 : MMA_TILE_W, span_r = NARROW ? 2 * GEN_GRAD_R : GEN_GRAD_R;
        constexpr int pixel_words = MMA_WARPS * tile_w / 2 + 4;  // the tile's pixels in pairs, and 4
        constexpr int span_tiles = NARROW ? 4 : 2;  // grad_span_weight's n-tiles a warp
        const int band_columns = (tile_w - 1) * stride_w + (kernel_w - 1) * dilation_w + 1;
        const int n_tiles = (band_columns + 7) / 8, columns = 8 * n_tiles;
        const int in_h = (MMA_TILE_H - 1) * stride_h + (kernel_h - 1) * dilation_h + 1;
        OPLIB_DYNAMIC_SHARED(unsigned int, shared);
        unsigned int* span = shared;
        unsigned int* features = span + span_r * span_stride;
        unsigned int* staged = features + span_r * pixel_words;
        float* gw = reinterpret_cast<float*>(staged + in_h * columns * GEN_GRAD_COLUMN_WORDS);
        int* inf_flags = reinterpret_cast<int*>(gw + MMA_WARPS * tile_w * gw_stride);
        float* warp_gw = gw + warp * tile_w * gw_stride;
        // gw split (step 2): pixel p's hi words at gw_words + p * gw_stride, its lo tap_pad / 2 after
        const unsigned int* gw_words = reinterpret_cast<const unsigned int*>(gw);
        // grad_span_bias's sums of each warp's pixels, [warp][tap], over the staged input (free
        // once every warp's products are done)
        float* bias_parts = reinterpret_cast<float*>(staged);

        const GenGradTile<NARROW> tile(tiles_w, group_splits, groups, out_h, out_w, stride_w, kernel_w, dilation_w);
        const int tile_y = tile.tile_y, out_y = tile.out_y, out_x0 = tile.out_x0, r0 = tile.r0, live_tiles = tile.live_tiles;
        const int m_pixel = tile.m_pixel, m_y = tile.m_y, r_half = tile.r_half;
        const index_t n = tile.n, slot = tile.slot;
        const bool low_inside = tile.low_inside, high_inside = tile.high_inside;

        if (thread == 0) inf_flags[0] = 0, inf_flags[1] = -1;
        __syncthreads();  // the flags are set before any thread may raise one
        // The tile's feature for the R range, [r][pixel pair] (pixel p = warp * tile_w + j), zeros
        // past the map and past R.
        const unsigned short* sample_feature = reinterpret_cast<const unsigned short*>(feature) + n * feature_n;
#pragma unroll 1
        for (int word = thread; word < span_r * (pixel_words - 4); word += MMA_THREADS) {
            const int r = word / (pixel_words - 4), pair = word % (pixel_words - 4);
            const int y = tile_y * MMA_TILE_H + pair / (tile_w / 2), x = out_x0 + 2 * (pair % (tile_w / 2));
            const bool inside = r0 + r < reduced && y < out_h;
            const unsigned int values =
                oplib_load_pair(sample_feature + (index_t)(r0 + r) * feature_c + (index_t)y * feature_h + (index_t)x * feature_w,
                                feature_w, inside ? out_w - x : 0);
            features[r * pixel_words + pair] = values;
            if (gen_grad_pair_has_inf<half_t>(values)) inf_flags[0] = 1;
        }

        OplibFragmentC feature_sums[GEN_GRAD_R / 8] = {};  // NARROW: of the range's half r_half
        const unsigned short* sample_grad = reinterpret_cast<const unsigned short*>(grad_output) + n * grad_n;
        const unsigned short* sample_input = reinterpret_cast<const unsigned short*>(input) + n * input_n;
        const unsigned short* low_grad = sample_grad + (index_t)out_y * grad_h + (index_t)(out_x0 + row) * grad_w;
        const unsigned short* high_grad = low_grad + 8 * grad_w;
        const int top = tile_y * MMA_TILE_H * stride_h - pad_h, left = out_x0 * stride_w - pad_w;
        for (int group = tile.group_first; group < tile.group_end; ++group) {
            __syncthreads();  // every warp is done with the previous group's span, gw and bias parts
            // span_weight's rows of the group for the R range, [r][tap pair]; consecutive
            // threads along r (span_weight's rows), a thread's words GEN_GRAD_SPAN_BATCH at a time
            // loaded before any is stored (a word at a time, a group's staging was a chain of
            // round trips: 7 at RedNet's last stage, in each group of a block; now 4).
            const unsigned short* group_span = reinterpret_cast<const unsigned short*>(span_weight) + (index_t)group * taps * reduced;
            const int span_words = span_r * (tap_pad / 2);
            constexpr int GEN_GRAD_SPAN_BATCH = 2;  // 4 spilled the runtime window's sm_80 code
#pragma unroll 1
            for (int word0 = thread; word0 < span_words; word0 += GEN_GRAD_SPAN_BATCH * MMA_THREADS) {
                unsigned int values[GEN_GRAD_SPAN_BATCH];
#pragma unroll
                for (int v = 0; v < GEN_GRAD_SPAN_BATCH; ++v) {
                    const int word = word0 + v * MMA_THREADS, r = word % span_r, tap = 2 * (word / span_r);
                    values[v] = oplib_load_pair(group_span + (index_t)tap * reduced + r0 + r, reduced,
                                                word < span_words && r0 + r < reduced ? taps - tap : 0);
                }
#pragma unroll
                for (int v = 0; v < GEN_GRAD_SPAN_BATCH; ++v) {
                    const int word = word0 + v * MMA_THREADS, r = word % span_r, tap = 2 * (word / span_r);
                    if (word >= span_words) break;
                    span[r * span_stride + tap / 2] = values[v];
                    if (gen_grad_pair_has_inf<half_t>(values[v])) inf_flags[1] = group;
                }
            }
            const index_t channel0 = (index_t)group * group_channels;
            for (int c0 = 0; c0 < group_channels; c0 += MMA_CHANNELS) {
                if (c0 > 0) __syncthreads();  // every warp is done with the previous chunk
                // The chunk's input rows, [row][column][channel pair], zeros outside the image and
                // past the group's channels: 16-byte vectors of 8 channels (channels_last), else
                // consecutive threads along a row's columns.
                const unsigned short* chunk = sample_input + (channel0 + c0) * input_c;
                if (vector_input) {
#pragma unroll 1
                    for (int unit = thread; unit < in_h * columns * 2; unit += MMA_THREADS) {
                        const int half = unit & 1, column = (unit >> 1) % columns, y = (unit >> 1) / columns;
                        const int iy = top + y, ix = left + column;
                        Vector16<half_t> v = {};
                        if (c0 + 8 * half < group_channels && (unsigned int)iy < (unsigned int)height &&
                            (unsigned int)ix < (unsigned int)width)
                            v = *reinterpret_cast<const Vector16<half_t>*>(chunk + 8 * half + (index_t)iy * input_h +
                                                                          (index_t)ix * input_w);
                        unsigned int* to = staged + (y * columns + column) * GEN_GRAD_COLUMN_WORDS +
                                           gen_grad_column_word(column, 4 * half);
#pragma unroll
                        for (int k = 0; k < 4; ++k) to[k] = v.lane[2 * k].bits | (unsigned int)v.lane[2 * k + 1].bits << 16;
                    }
                } else {
#pragma unroll 1
                    for (int unit = thread; unit < in_h * columns * 8; unit += MMA_THREADS) {
                        const int column = unit % columns, pair = unit / columns % 8, y = unit / columns / 8;
                        const int iy = top + y, ix = left + column, c = c0 + 2 * pair;
                        const bool inside = (unsigned int)iy < (unsigned int)height && (unsigned int)ix < (unsigned int)width;
                        staged[(y * columns + column) * GEN_GRAD_COLUMN_WORDS + gen_grad_column_word(column, pair)] =
                            oplib_load_pair(chunk + 2 * pair * input_c + (index_t)iy * input_h + (index_t)ix * input_w,
                                            input_c, inside ? group_channels - c : 0);
                    }
                }
                __syncthreads();  // the input chunk (and, the first, the span rows) staged
                // The run's grad_output, pixels x channels: A's fragment (zeros past the map).
                const index_t chunk_grad = (channel0 + c0) * grad_c;
                const int c = c0 + 2 * quad;
                OplibFragmentA run;
                run.reg[0] = mma_load_pair(low_grad + chunk_grad + 2 * quad * grad_c, grad_c, low_inside ? group_channels - c : 0, grad_words);
                run.reg[1] = mma_load_pair(high_grad + chunk_grad + 2 * quad * grad_c, grad_c, high_inside ? group_channels - c : 0, grad_words);
                run.reg[2] = mma_load_pair(low_grad + chunk_grad + (2 * quad + 8) * grad_c, grad_c, low_inside ? group_channels - c - 8 : 0, grad_words);
                run.reg[3] = mma_load_pair(high_grad + chunk_grad + (2 * quad + 8) * grad_c, grad_c, high_inside ? group_channels - c - 8 : 0, grad_words);
#pragma unroll 1
                for (int a = 0; a < kernel_h && out_y < out_h; ++a) {
                    const unsigned int* input_row = staged + (warp * stride_h + a * dilation_h) * columns * GEN_GRAD_COLUMN_WORDS;
                    // The products (the product's element (j, k) is pixel j's tap b where
                    // k = j*sw + b*dw) to gw. A fixed window's n-tiles all formed, then stored
                    // (GenGradBandTiles, a constant: the products issue back to back and each
                    // store's place is its lane's and a constant; GenGradUnrolled); a tile past the
                    // live ones holds taps of pixels past the map only, which the split does not
                    // read. Else the live n-tiles, one tile's values at a time.
                    if constexpr (GenGradUnrolled<KERNEL, STRIDE, NARROW>::value) {
                        constexpr int band_tiles = GenGradBandTiles<KERNEL, STRIDE, NARROW>::value;
#pragma unroll
                        for (int t0 = 0; t0 < band_tiles; t0 += GEN_GRAD_PRODUCTS_LIVE) {
                            OplibFragmentC products[GEN_GRAD_PRODUCTS_LIVE] = {};
#pragma unroll
                            for (int u = 0; u < GEN_GRAD_PRODUCTS_LIVE && t0 + u < band_tiles; ++u)
                                oplib_mma<half_t>(products[u], run, gen_grad_load_columns(input_row, 8 * (t0 + u)));
#pragma unroll
                            for (int u = 0; u < GEN_GRAD_PRODUCTS_LIVE && t0 + u < band_tiles; ++u)
                                gen_grad_store_product<NARROW, KERNEL, STRIDE>(products[u], warp_gw, gw_stride, a, t0 + u,
                                                                               kernel_w, stride_w, dilation_w, c0 == 0);
                        }
                    } else {
#pragma unroll 1
                        for (int t = 0; t < live_tiles; ++t) {
                            OplibFragmentC product = {};
                            oplib_mma<half_t>(product, run, gen_grad_load_columns(input_row, 8 * t));
                            gen_grad_store_product<NARROW, 0, 0>(product, warp_gw, gw_stride, a, t, kernel_w, stride_w,
                                                                 dilation_w, c0 == 0);
                        }
                    }
                }
            }
            // 2. The warp splits its own rows of gw in place, hi then lo: a row's taps in pairs,
            // its hi words first and its lo words tap_pad / 2 after them (taps past T, and pixels
            // past the map, whose floats the products leave as they were, as zeros); and sums its
            // pixels' gw per tap, in float, for grad_span_bias. A lane 4 taps of every other row
            // (a row's floats read whole, those past T dropped), GEN_GRAD_SPLIT_ROWS rows at a
            // time: every lane reads its words of the rows before any lane writes over them (one
            // warp barrier for the rows, not one a row).
            const int lane_taps = 4 * (lane & 15);
            const bool lane_live = lane_taps < tap_pad;
            float bias[4] = {};
            __syncwarp();  // every lane's products are in the warp's rows
#pragma unroll 1
            for (int j0 = lane >> 4; j0 < tile_w; j0 += 2 * GEN_GRAD_SPLIT_ROWS) {
                float w[GEN_GRAD_SPLIT_ROWS][4] = {};
#pragma unroll
                for (int i = 0; i < GEN_GRAD_SPLIT_ROWS; ++i) {
                    const int j = j0 + 2 * i;
                    const bool pixel_inside = out_y < out_h && out_x0 + j < out_w;
                    if (pixel_inside && lane_live) {
                        const Vector16<float> four = *reinterpret_cast<const Vector16<float>*>(warp_gw + j * gw_stride + lane_taps);
#pragma unroll
                        for (int e = 0; e < 4; ++e) w[i][e] = lane_taps + e < taps ? four.lane[e] : 0.0f;
                    }
                }
                __syncwarp();  // the row's words read, by every lane, before any is written over
#pragma unroll
                for (int i = 0; i < GEN_GRAD_SPLIT_ROWS; ++i) {
                    unsigned int hi[2], lo[2], non_finite = 0;
#pragma unroll
                    for (int h = 0; h < 2; ++h) {
                        hi[h] = mma_round_pair(w[i][2 * h], w[i][2 * h + 1], half_t());
                        non_finite |= mma_non_finite_halves(hi[h], half_t());
                        lo[h] = mma_rest_pair_finite<half_t>(w[i][2 * h], w[i][2 * h + 1], hi[h]);
                    }
                    if (non_finite != 0) {  // oplib-cold: a hi is an inf or a nan
                        OPLIB_COLD_BLOCK();
#pragma unroll
                        for (int h = 0; h < 2; ++h) lo[h] = mma_rest_pair<half_t>(w[i][2 * h], w[i][2 * h + 1], hi[h]);
                    }
#pragma unroll
                    for (int e = 0; e < 4; ++e) bias[e] = oplib_add(bias[e], w[i][e]);
                    if (lane_live) {
                        unsigned int* words = reinterpret_cast<unsigned int*>(warp_gw + (j0 + 2 * i) * gw_stride) + lane_taps / 2;
                        *reinterpret_cast<GenGradWords*>(words) = {{hi[0], hi[1]}};
                        *reinterpret_cast<GenGradWords*>(words + tap_pad / 2) = {{lo[0], lo[1]}};
                    }
                }
            }
#pragma unroll
            for (int e = 0; e < 4; ++e) bias[e] = oplib_add(bias[e], __shfl_xor_sync(OPLIB_FULL_WARP, bias[e], 16));
            __syncthreads();  // every warp's gw of the group is split (and done with the staged input)
            if (r0 == 0 && lane < 16 && lane_taps < tap_pad)
                *reinterpret_cast<Vector16<float>*>(bias_parts + warp * MMA_TAPS + lane_taps) = {{bias[0], bias[1], bias[2], bias[3]}};

            // 3. grad_feature += gw (16 pixels x taps) span^T (taps x GEN_GRAD_R of the range), but
            // for an m-tile past the map (its sums are never stored).
            const unsigned int* m_words = gw_words + m_pixel * gw_stride;  // the warp's m-tile
            if (inf_flags[1] == group && m_y < out_h) {  // oplib-cold: an inf in the group's span rows
                OPLIB_COLD_BLOCK();
#pragma unroll
                for (int t = 0; t < GEN_GRAD_R / 8; ++t) {
#pragma unroll
                    for (int v = 0; v < 4; ++v) {  // pixel row (+ 8) x r r_half + 8 t + 2 quad (+ 1)
                        const int j = row + 8 * (v >> 1), r = r_half + 8 * t + 2 * quad + (v & 1);
                        feature_sums[t].value[v] = oplib_add(
                            feature_sums[t].value[v],
                            gen_grad_direct_sum<half_t>(m_words + j * gw_stride, 0, 0, 1, tap_pad, span + r * span_stride, taps));
                    }
                }
            }
#pragma unroll 1
            for (int k0 = 0; k0 < tap_pad && inf_flags[1] != group && m_y < out_h; k0 += 16) {
                const OplibFragmentA hi = oplib_load_fragment_a(m_words + k0 / 2, gw_stride);
                const OplibFragmentA lo = oplib_load_fragment_a(m_words + tap_pad / 2 + k0 / 2, gw_stride);
#pragma unroll
                for (int t = 0; t < GEN_GRAD_R / 8; ++t) {
                    const OplibFragmentB b = oplib_load_fragment_b(span + (r_half + 8 * t) * span_stride + k0 / 2, span_stride);
                    oplib_mma<half_t>(feature_sums[t], hi, b);
                    oplib_mma<half_t>(feature_sums[t], lo, b);
                }
            }
            // 4. The block's grad_span_weight, a tile taps 16 (an m-tile) x R range columns 8 (an
            // n-tile), over the tile's pixels (k-steps of 16: a warp's row, or NARROW two; those
            // past the map left out): warp w takes span_tiles n-tiles of one m-tile, from tile
            // span_tiles w on, so that each of gw's fragments is loaded once for them all.
            if (span_tiles * warp < tap_pad / 16 * (span_r / 8)) {
                const int m0 = 16 * (span_tiles * warp / (span_r / 8)), t0 = span_tiles * warp % (span_r / 8);
                const int live_rows = out_h - tile_y * MMA_TILE_H;
                const int live_pixels = tile_w * (live_rows < MMA_WARPS ? live_rows : MMA_WARPS);
                OplibFragmentC sums[span_tiles] = {};
                if (inf_flags[0]) {  // oplib-cold: an inf in the tile's feature
                    OPLIB_COLD_BLOCK();
#pragma unroll
                    for (int u = 0; u < span_tiles; ++u) {
#pragma unroll
                        for (int v = 0; v < 4; ++v) {  // taps m0 + row (+ 8) x r 8 (t0 + u) + 2 quad (+ 1)
                            const int tap = m0 + row + 8 * (v >> 1), r = 8 * (t0 + u) + 2 * quad + (v & 1);
                            sums[u].value[v] = gen_grad_direct_sum<half_t>(gw_words, gw_stride, tap, 0, tap_pad,
                                                                           features + r * pixel_words, live_pixels);
                        }
                    }
                }
#pragma unroll 1
                for (int p0 = 0; p0 < live_pixels && !inf_flags[0]; p0 += 16) {
                    const unsigned int* at = gw_words + p0 * gw_stride + m0 / 2;
                    const OplibFragmentA hi = oplib_load_fragment_a_transposed(at, gw_stride);
                    const OplibFragmentA lo = oplib_load_fragment_a_transposed(at + tap_pad / 2, gw_stride);
                    OplibFragmentB b[span_tiles];
#pragma unroll
                    for (int u = 0; u < span_tiles; u += 2)
                        oplib_load_fragments_b(features + 8 * (t0 + u) * pixel_words + p0 / 2, pixel_words, 8 * pixel_words,
                                               b[u], b[u + 1]);
#pragma unroll
                    for (int u = 0; u < span_tiles; ++u) {
                        oplib_mma<half_t>(sums[u], hi, b[u]);
                        oplib_mma<half_t>(sums[u], lo, b[u]);
                    }
                }
                gen_grad_store_span_sums(sums, span_sums + (slot * groups + group) * (index_t)taps * reduced, m0, t0, r0,
                                         taps, reduced);
            }
            if (r0 == 0) {  // grad_span_bias's sums over the tile, from R range 0's blocks
                __syncthreads();  // every warp's part is staged
                gen_grad_store_bias(bias_parts, bias_sums, slot, groups, group, taps, thread);
            }
        }
        // grad_feature's sums of the warp's m-tile, its channels of the R range: to the result, or in
        // float to the split's part, [split][n][y][x][r]. Fragment rows 8-15 are pixels 8-15 of the
        // warp's row, or NARROW the next row's 0-7.
        const int m_x = tile.m_x, high_x = tile.high_x, high_y = tile.high_y;
        if (m_y < out_h && group_splits > 1) {
            // the split and R range again from the block's index, read anew (kept from the start
            // across the groups, they took a register that spilled on sm_80)
            const unsigned int y_block = block_y_again();
            const int split_again = y_block % group_splits, r_first = y_block / group_splits * span_r + r_half;
            float* part = feature_parts + (((index_t)split_again * gridDim.z + n) * out_h + m_y) * out_w * reduced;
            float* high_part = part + (NARROW ? (index_t)out_w * reduced : 0);
            gen_grad_store_feature_sums(feature_sums, part, high_part, reduced, 1, tile, r_first, out_h, out_w, reduced);
        } else if (m_y < out_h) {
            half_t* pixel = grad_feature + n * result_n + (index_t)m_y * result_h + (index_t)m_x * result_w;
            const bool pair_stores = mma_pair_stores(grad_feature, result_n, result_c, result_h, result_w, reduced);
#pragma unroll
            for (int t = 0; t < GEN_GRAD_R / 16; ++t) {
                const OplibFragmentC pair[2] = {feature_sums[2 * t], feature_sums[2 * t + 1]};
                mma_store_pixels(pair, pixel, NARROW ? result_h : 8 * result_w, result_c, r0 + r_half + 16 * t, reduced,
                                 m_x < out_w, high_y < out_h && high_x < out_w, pair_stores);
            }
        }
    } else if constexpr (sizeof(scalar_t) == 4) {
        generator_wide<KERNEL, STRIDE, NARROW>(grad_output, input, feature, span_weight, grad_feature, feature_parts,
                                               span_sums, bias_sums, group_splits, channels, height, width, groups,
                                               window_h, window_w, out_h, out_w, step_h, step_w, pad_h, pad_w, spacing_h,
                                               spacing_w, reduced, tiles_w, grad_n, grad_c, grad_h, grad_w, input_n,
                                               input_c, input_h, input_w, feature_n, feature_c, feature_h, feature_w,
                                               result_n, result_c, result_h, result_w, vector_input, grad_words);
    }
#endif
}
