// involution_generated's forward on maps small enough that one block holds a (sample, group)
// whole (float16, bfloat16): the weights generated on tensor cores, and their aggregation one
// product on tensor cores as well, by the window written as a dense matrix; and its grad_input
// the same way, the matrix transposed (involution_generated_dense_window_backward_input, further
// on); and involution's own grad_weight as one product of grad_output and the input, gathered
// at the taps (involution_dense_window_backward_weight, at the end of the file).
//
//   out[n, c, i, j] = sum_{a, b} weight(n, g(c), a*KW + b, i, j) * input[n, c, i*sh - ph + a*dh, j*sw - pw + b*dw]
//   weight(n, g, t, i, j) = bias[g*T + t] + sum_r span_weight[g*T + t, r] * feature[n, r, i, j]
//
// input: (N, C, H, W), out: (N, C, Ho, Wo), feature: (N, R, Ho, Wo) of any strides; span_weight
// (G*T, R) and bias (G*T) contiguous. The host sends a call here where P = Ho*Wo <= DENSE_PIXELS,
// T <= DENSE_TAPS, 1 <= R <= DENSE_REDUCED and 1 <= Q = H*W <= DENSE_INPUTS; any window, stride,
// padding and dilation whose taps' offsets, (KH - 1) * dh and (KW - 1) * dw, fit 16 bits.
//
// Pixel p's tap t reads one input pixel q(p, t) (or none: the padding). With the dense matrix
//   dense[p, q] = weight(.., t, p) where q = q(p, t), else 0          (P x Q)
// (no two taps of a pixel read the same input pixel) a group's outputs are one product,
//   out[p, c] = sum_q dense[p, q] * input[q, c]                       (P x Q) (Q x channels)
// On RedNet-50's 7 x 7 maps at stage 4 that is a 49 x 49 matrix (at stride 2, 49 x 196), a
// quarter (a sixteenth) of it nonzero: the zeros cost tensor-core work, which is plentiful, where
// the tiled kernels' per-tap sums and bands cost issue slots. The generation is the product
// (P x R) (R x T) + bias, as in generated_mma.cu.
//
// A block of DENSE_WARPS warps takes one (sample, group) (grid: groups x samples); warp w takes
// the pixels 16 w .. 16 w + 15, an m-tile of both products:
//   1. the block stages the sample's feature and the group's span_weight rows in shared memory;
//   2. each warp forms its pixels' weights, (16 x R) (R x T) on tensor cores, into registers
//      (C fragments); after a barrier, the dense matrices (hi and lo, zeros written first) take
//      their place: each weight w, bias added, goes to its input pixel split in two values of
//      the storage type, hi = w rounded and lo = (w - hi) rounded (mma_split.cuh: hi alone
//      would round the weights as the span conv's output does);
//   3. per DENSE_CHANNELS of the group's channels, the block stages the input (zeros past the
//      map and the group's channels), and each warp multiplies both matrices' rows by it, over
//      the k-steps of the input rows its pixels' windows reach.
// A product by a zero of the dense matrix is no product of the sum: an inf or a nan of the input
// makes nan every output whose warp's products reach it, where the direct sum reads it at most
// 49 times, and a
// weight at a tap in the padding (not in the matrix) is one of the direct sum's terms, times
// zero. A warp whose weights and outputs are all finite has met none (an inf or a nan in any
// product reaches the output); one that has recomputes its outputs by the direct sum, every
// tap, from global memory (dense_direct_sums), so that non-finite values land exactly where
// torch puts them. No atomics, every sum in a fixed order: deterministic.
//
// float and double have no such product, nor has a GPU before sm_80: those instantiations are
// empty and the host declines those calls. LAST (channels_last's layout: the feature's and the
// input's channels adjacent) chooses the staged layouts, a template argument so that each
// instantiation's fragment loads are of one kind; any strides are read either way.
//
// Dynamic shared memory, 32-bit words each holding two 16-bit values, the lower one (column,
// reduced index or channel) in its lower half (the host's dense_window_shared_bytes is its size),
// with k_r = R rounded up to 16, k_q = Q rounded up to 16, and strides 4 words past a multiple of
// 8 (a fragment load's 8 rows x 4 words in 32 different banks):
//   feature  LAST: DENSE_PIXELS x (k_r / 2 + 4)      [pixel][r]
//            else: k_r x DENSE_PIXEL_STRIDE           [r][pixel]
//   span     k_t x (k_r / 2 + 4)                      [tap][r], k_t = T rounded up to 16
//   dense    2 x DENSE_PIXELS x (k_q / 2 + 4)         hi then lo, [pixel][input pixel], in the
//            place of feature and span once the weights are formed
//   staged   LAST: k_q x DENSE_CHANNEL_STRIDE         [input pixel][channel]
//            else: DENSE_CHANNELS x (k_q / 2 + 4)     [channel][input pixel]
//   taps     2 x DENSE_TAPS                           each tap's row and column offsets, its place

#include "mma_split.cuh"
#include "tile.cuh"

constexpr int DENSE_WARPS = 4;
constexpr int DENSE_THREADS = 128;
constexpr int DENSE_PIXELS = 64;  // a map's output pixels at most: an m-tile a warp
constexpr int DENSE_TAPS = 64;  // a window's taps at most: the generation's 8 n-tiles
constexpr int DENSE_TAP_TILES = 8;
constexpr int DENSE_REDUCED = 128;  // R at most
constexpr int DENSE_INPUTS = 256;  // a map's input pixels at most: the dense matrix's columns
constexpr int DENSE_CHANNELS = 16;  // a pass over the group's channels: two n-tiles
constexpr int DENSE_PIXEL_STRIDE = 36;  // words of an NCHW feature's staged r: DENSE_PIXELS / 2, and 4
constexpr int DENSE_CHANNEL_STRIDE = 12;  // words of a channels_last input pixel's staged channels: 8, and 4

static_assert(DENSE_THREADS == 32 * DENSE_WARPS && DENSE_PIXELS == 16 * DENSE_WARPS, "a warp an m-tile of pixels");
static_assert(DENSE_TAP_TILES * 8 == DENSE_TAPS && DENSE_TAP_TILES % 2 == 0, "the generation's n-tiles in pairs");
static_assert(DENSE_PIXEL_STRIDE == DENSE_PIXELS / 2 + 4 && DENSE_CHANNEL_STRIDE == DENSE_CHANNELS / 2 + 4,
              "4 words past a multiple of 8");
static_assert(DENSE_REDUCED % 16 == 0 && DENSE_INPUTS % 16 == 0 && DENSE_TAPS <= DENSE_PIXELS &&
                  DENSE_THREADS == 8 * DENSE_CHANNELS,
              "the host's limits: whole k-steps of both products; 8 threads a staged channel");

// The warp's pixels `first` .. first + 15 of every row's stage: a lane's two, row and row + 8.
struct DensePixel {
    int index;  // p
    bool inside;  // p < P
    int top, left;  // its window's first input row and column (before the taps' offsets)
    index_t out;  // its output's offset in out (from its channel's)
};

__device__ __forceinline__ DensePixel dense_pixel(int p, int pixels, int out_w, int stride_h, int stride_w, int pad_h,
                                                  int pad_w, index_t out_hs, index_t out_ws) {
    DensePixel pixel;
    const int i = p / out_w, j = p % out_w;
    pixel.index = p;
    pixel.inside = p < pixels;
    pixel.top = i * stride_h - pad_h;
    pixel.left = j * stride_w - pad_w;
    pixel.out = i * out_hs + j * out_ws;
    return pixel;
}

// `rows` rows of 16-bit values into `words`, row r's words_per_row words at words + r * stride
// (word j holding values 2j and 2j + 1), from rows_inside on zeros: row r is pixel (r / row_w,
// r % row_w) of a map whose rows and columns lie row_h_step and row_w_step values apart from
// `values`, its values `step` apart, `count` of them inside (zeros past). Consecutive threads
// take consecutive words of a row; VECTORS (step 1, every row's first value 16-byte aligned,
// count a multiple of 8 or past the row) takes 8 values a 16-byte load. A thread's next row and
// column are its last ones stepped (a carry, no division a turn).
template <bool VECTORS>
__device__ __forceinline__ void dense_stage_rows(unsigned int* words, int stride, int rows, int rows_inside,
                                                 int words_per_row, const unsigned short* values, int row_w,
                                                 index_t row_h_step, index_t row_w_step, index_t step, int count) {
    const int thread = threadIdx.x + 32 * threadIdx.y;
    const int per_row = VECTORS ? words_per_row / 4 : words_per_row;  // a row's turns
    const int rows_step = DENSE_THREADS / per_row, columns_step = DENSE_THREADS % per_row;
    int row = thread / per_row, column = thread % per_row;
    int y = row / row_w, x = row % row_w;
    while (row < rows) {
        const unsigned short* at = values + y * row_h_step + x * row_w_step;
        if constexpr (VECTORS) {
            Vector16<unsigned int> chunk = {};
            if (row < rows_inside && 8 * column < count)
                chunk = *reinterpret_cast<const Vector16<unsigned int>*>(at + 8 * column);
            *reinterpret_cast<Vector16<unsigned int>*>(words + row * stride + 4 * column) = chunk;
        } else {
            words[row * stride + column] =
                oplib_load_pair(at + 2 * column * step, step, row < rows_inside ? count - 2 * column : 0);
        }
        row += rows_step;
        x += rows_step;
        column += columns_step;
        if (column >= per_row) {
            column -= per_row;
            ++row;
            ++x;
        }
        while (x >= row_w) {
            x -= row_w;
            ++y;
        }
    }
}

// The lane's 8 outputs (pixels row, row + 8 of the warp x channels c0 + 2 quad, + 1 of each
// n-tile) by the direct sum over every tap, each weight formed again in float from global memory:
// for a warp whose products met an inf or a nan. A function of its own, rolled: cold code, kept
// out of the kernel's registers.
template <typename half_t>
__device__ __noinline__ void dense_direct_sums(const unsigned short* input, const unsigned short* feature,
                                               const unsigned short* span, const unsigned short* bias, half_t* out,
                                               int first, int c0, int group_channels, int pixels, int height, int width,
                                               int out_w, int kernel_h, int kernel_w, int stride_h, int stride_w,
                                               int pad_h, int pad_w, int dilation_h, int dilation_w, int reduced,
                                               index_t input_c, index_t input_h, index_t input_w, index_t out_c,
                                               index_t out_hs, index_t out_ws, index_t feature_c, index_t feature_h,
                                               index_t feature_w) {
    const int lane = oplib_lane(), row = lane >> 2, quad = lane & 3, taps = kernel_h * kernel_w;
    for (int v = 0; v < 8; ++v) {
        const int p = first + row + 8 * (v >> 1 & 1), c = c0 + 8 * (v >> 2) + 2 * quad + (v & 1);
        if (p >= pixels || c >= group_channels) continue;
        const int i = p / out_w, j = p % out_w;
        const unsigned short* pixel_feature = feature + i * feature_h + j * feature_w;
        float sum = 0.0f;
        for (int t = 0; t < taps; ++t) {
            float weight = mma_to_float(__ldg(bias + t), half_t());
            for (int r = 0; r < reduced; ++r)
                weight = oplib_fma(mma_to_float(__ldg(span + (index_t)t * reduced + r), half_t()),
                                   mma_to_float(__ldg(pixel_feature + r * feature_c), half_t()), weight);
            const int y = i * stride_h - pad_h + t / kernel_w * dilation_h, x = j * stride_w - pad_w + t % kernel_w * dilation_w;
            const bool inside = (unsigned int)y < (unsigned int)height && (unsigned int)x < (unsigned int)width;
            const float value = inside ? mma_to_float(__ldg(input + c * input_c + y * input_h + x * input_w), half_t()) : 0.0f;
            sum = oplib_fma(weight, value, sum);
        }
        out[c * out_c + (index_t)i * out_hs + (index_t)j * out_ws] = Element<half_t>::store(sum);
    }
}

// B's two n-tiles of one k-step from 16 staged [k][n] rows (`stride` words apart) from `rows`,
// whose words 0-3 are the first n-tile's 8 columns and words 4-7 the second's: ldmatrix
// transposed, matrix i the rows 8 (i & 1) .., words 4 (i >> 1) ...
__device__ __forceinline__ void dense_load_b_transposed(const unsigned int* rows, int stride, OplibFragmentB& low,
                                                        OplibFragmentB& high) {
    const int lane = oplib_lane(), i = lane >> 3;
    unsigned int reg[4];
    oplib_load_matrices<4, true>(rows + (8 * (i & 1) + (lane & 7)) * stride + 4 * (i >> 1), reg);
    low.reg[0] = reg[0];
    low.reg[1] = reg[1];
    high.reg[0] = reg[2];
    high.reg[1] = reg[3];
}

// B's two n-tiles of k-step k from staged [pixel][channel] rows of DENSE_CHANNEL_STRIDE words
// (channels_last's staging): a row's channels are B's columns.
__device__ __forceinline__ void dense_load_rows_b(const unsigned int* staged, int k, OplibFragmentB& low,
                                                  OplibFragmentB& high) {
    dense_load_b_transposed(staged + 16 * k * DENSE_CHANNEL_STRIDE, DENSE_CHANNEL_STRIDE, low, high);
}

// The words of the generation's region, from the start of the shared memory: the larger of the
// staged feature and span rows and the two dense matrices (the staged activation lies past it).
template <bool LAST>
__device__ __forceinline__ int dense_generation_words(int inputs, int taps, int reduced) {
    const int r_steps = (reduced + 15) / 16, reduced_stride = 8 * r_steps + 4;
    const int feature_words = LAST ? DENSE_PIXELS * reduced_stride : 16 * r_steps * DENSE_PIXEL_STRIDE;
    const int rows_words = feature_words + 16 * ((taps + 15) / 16) * reduced_stride;
    const int dense_words = 2 * DENSE_PIXELS * (8 * ((inputs + 15) / 16) + 4);
    return rows_words > dense_words ? rows_words : dense_words;
}

// An NCHW activation's DENSE_CHANNELS planes, from `planes` (channel_step apart, `channels` of
// them inside) of a map `map_w` pixels wide (rows map_h_step and columns map_w_step values
// apart, `pixels` of them), into staged [channel][pixel] rows of `words` words, `stride` apart,
// pixel pairs a word (zeros past the map and the channels): 8 threads a channel, a thread every
// 8th pair, its pixels' rows and columns stepped (a carry, no division a word).
__device__ __forceinline__ void dense_stage_planes(unsigned int* staged, int stride, int words,
                                                   const unsigned short* planes, index_t channel_step, int channels,
                                                   int map_w, index_t map_h_step, index_t map_w_step, int pixels) {
    const int thread = threadIdx.x + 32 * threadIdx.y, c = thread / 8;
    const unsigned short* plane = planes + c * channel_step;
    const bool c_inside = c < channels;
    int q = 2 * (thread % 8), y = q / map_w, x = q % map_w;
    for (int w = thread % 8; w < words; w += 8, q += 16) {
        const int next_y = x + 1 < map_w ? y : y + 1, next_x = x + 1 < map_w ? x + 1 : 0;
        const unsigned int low_value = c_inside && q < pixels ? __ldg(plane + y * map_h_step + x * map_w_step) : 0u;
        const unsigned int high_value =
            c_inside && q + 1 < pixels ? __ldg(plane + next_y * map_h_step + next_x * map_w_step) : 0u;
        staged[c * stride + w] = low_value | high_value << 16;
        x += 16;
        while (x >= map_w) {
            x -= map_w;
            ++y;
        }
    }
}

// Steps 1 and 2 of both kernels for a (sample n, group), every thread of the block: the feature
// and the group's span rows staged, each warp's weights formed on tensor cores, and the dense
// matrices (hi, then lo, at `shared`, in the place of the staged rows) written; `tap_offsets`
// (2 DENSE_TAPS words) takes each tap's offsets. Returns whether a weight of the warp's pixels
// (one at a tap in the padding too) is an inf or a nan; the matrices are written once the caller's
// barrier is passed.
template <typename half_t, bool LAST, bool VECTORS>
__device__ __forceinline__ bool dense_form_matrices(unsigned int* shared, unsigned int* tap_offsets, const half_t* feature,
                                                    const half_t* span_weight, const half_t* bias, index_t n, int group,
                                                    int height, int width, int kernel_h, int kernel_w, int out_h,
                                                    int out_w, int stride_h, int stride_w, int pad_h, int pad_w,
                                                    int dilation_h, int dilation_w, int reduced, index_t feature_n,
                                                    index_t feature_c, index_t feature_h, index_t feature_w) {
    const int warp = threadIdx.y, lane = threadIdx.x, thread = lane + 32 * warp;
    const int row = lane >> 2, quad = lane & 3;  // a fragment's row (pixel) and column pair
    const int taps = kernel_h * kernel_w, pixels = out_h * out_w, inputs = height * width, first = 16 * warp;
    const int r_steps = (reduced + 15) / 16, q_steps = (inputs + 15) / 16, tap_rows = 16 * ((taps + 15) / 16);
    const int reduced_stride = 8 * r_steps + 4, dense_stride = 8 * q_steps + 4;
    const int feature_words = LAST ? DENSE_PIXELS * reduced_stride : 16 * r_steps * DENSE_PIXEL_STRIDE;
    const int dense_words = DENSE_PIXELS * dense_stride;
    unsigned int* staged_feature = shared;
    unsigned int* span = shared + feature_words;
    unsigned int* dense = shared;  // hi, then lo dense_words further
    // each tap's input row and column offsets (16 bits each: the host declines more) and its
    // place in a dense row (row offset * width + column offset), formed once: no division a tap
    if (thread < taps) {
        const int dy = thread / kernel_w * dilation_h, dx = thread % kernel_w * dilation_w;
        tap_offsets[2 * thread] = (unsigned int)dy | (unsigned int)dx << 16;
        tap_offsets[2 * thread + 1] = (unsigned int)(dy * width + dx);
    }
    const unsigned short* feature_bits = reinterpret_cast<const unsigned short*>(feature) + n * feature_n;
    const unsigned short* group_span = reinterpret_cast<const unsigned short*>(span_weight) + (index_t)group * taps * reduced;
    const unsigned short* group_bias = reinterpret_cast<const unsigned short*>(bias) + (index_t)group * taps;

    // 1. The feature (every pixel's R values) and the group's span rows.
    if constexpr (LAST) {
        dense_stage_rows<VECTORS>(staged_feature, reduced_stride, DENSE_PIXELS, pixels, 8 * r_steps, feature_bits,
                                  out_w, feature_h, feature_w, feature_c, reduced);
    } else {
        // [r][pixel]: a lane's pixel pair is the same for every r (its two offsets formed once)
        for (int w = thread % (DENSE_PIXELS / 2); w < DENSE_PIXELS / 2; w += DENSE_THREADS) {
            const int p = 2 * w;
            const index_t low = p / out_w * feature_h + p % out_w * feature_w;
            const index_t high = (p + 1) / out_w * feature_h + (p + 1) % out_w * feature_w;
            for (int r = thread / (DENSE_PIXELS / 2); r < 16 * r_steps; r += DENSE_THREADS / (DENSE_PIXELS / 2)) {
                const unsigned short* plane = feature_bits + r * feature_c;
                const bool r_inside = r < reduced;
                const unsigned int low_value = r_inside && p < pixels ? __ldg(plane + low) : 0u;
                const unsigned int high_value = r_inside && p + 1 < pixels ? __ldg(plane + high) : 0u;
                staged_feature[r * DENSE_PIXEL_STRIDE + w] = low_value | high_value << 16;
            }
        }
    }
    dense_stage_rows<VECTORS>(span, reduced_stride, tap_rows, taps, 8 * r_steps, group_span, tap_rows, 0, reduced,
                              1, reduced);
    __syncthreads();  // the feature and the span rows are staged

    // 2. The warp's weights: C fragment t holds pixels row, row + 8 x taps 8 t + 2 quad, + 1.
    OplibFragmentC weights[DENSE_TAP_TILES];
#pragma unroll
    for (int t = 0; t < DENSE_TAP_TILES; ++t) weights[t] = OplibFragmentC{};
    if (first < pixels) {
        for (int k = 0; k < r_steps; ++k) {
            const OplibFragmentA a =
                LAST ? oplib_load_fragment_a(staged_feature + first * reduced_stride + 8 * k, reduced_stride)
                     : oplib_load_fragment_a_transposed(staged_feature + 16 * k * DENSE_PIXEL_STRIDE + first / 2,
                                                        DENSE_PIXEL_STRIDE);
#pragma unroll
            for (int t = 0; t < DENSE_TAP_TILES; t += 2) {
                if (8 * t >= taps) break;
                OplibFragmentB low, high;
                oplib_load_fragments_b(span + 8 * t * reduced_stride + 8 * k, reduced_stride, 8 * reduced_stride,
                                       low, high);
                oplib_mma<half_t>(weights[t], a, low);
                oplib_mma<half_t>(weights[t + 1], a, high);
            }
        }
    }
    __syncthreads();  // every warp is done with the feature and the span rows: the dense matrices' place
    {
        Vector16<unsigned int>* vectors = reinterpret_cast<Vector16<unsigned int>*>(dense);
        for (int v = thread; v < 2 * dense_words / 4; v += DENSE_THREADS) vectors[v] = Vector16<unsigned int>{};
    }
    __syncthreads();  // the zeros are written
    const DensePixel low_pixel = dense_pixel(first + row, pixels, out_w, stride_h, stride_w, pad_h, pad_w, 0, 0);
    const DensePixel high_pixel = dense_pixel(first + row + 8, pixels, out_w, stride_h, stride_w, pad_h, pad_w, 0, 0);
    unsigned short* dense_hi = reinterpret_cast<unsigned short*>(dense);
    // the lane's pixels' places in their dense rows, where their windows' first tap would be
    const int low_place = 2 * low_pixel.index * dense_stride + low_pixel.top * width + low_pixel.left;
    const int high_place = 2 * high_pixel.index * dense_stride + high_pixel.top * width + high_pixel.left;
    bool non_finite = false;
#pragma unroll
    for (int t = 0; t < DENSE_TAP_TILES; ++t) {
        if (8 * t >= taps) break;
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const int tap = 8 * t + 2 * quad + h;
            if (tap >= taps) continue;
            const float tap_bias = mma_to_float(__ldg(group_bias + tap), half_t());
            const unsigned int offsets = tap_offsets[2 * tap];
            const int dy = (int)(offsets & 0xffffu), dx = (int)(offsets >> 16), tap_place = (int)tap_offsets[2 * tap + 1];
#pragma unroll
            for (int half = 0; half < 2; ++half) {
                const DensePixel& pixel = half ? high_pixel : low_pixel;
                if (!pixel.inside) continue;
                const float w = oplib_add(weights[t].value[2 * half + h], tap_bias);
                non_finite |= !mma_finite(w);
                if ((unsigned int)(pixel.top + dy) >= (unsigned int)height ||
                    (unsigned int)(pixel.left + dx) >= (unsigned int)width)
                    continue;
                // hi and lo: w rounded, and its rest (no check of an inf: a warp whose w is one
                // sums directly, and a float16 hi past 65504 makes its outputs nans, which do too)
                const unsigned short hi = (unsigned short)(mma_round_pair(w, 0.0f, half_t()) & 0xffffu);
                const float rest = oplib_fma(-1.0f, mma_to_float(hi, half_t()), w);
                const int place = (half ? high_place : low_place) + tap_place;
                dense_hi[place] = hi;
                dense_hi[place + 2 * dense_words] = (unsigned short)(mma_round_pair(rest, 0.0f, half_t()) & 0xffffu);
            }
        }
    }
    return oplib_warp_any(non_finite);
}

// The steps of 16 input pixels (row-major) that hold the input rows the windows of output pixels
// first .. first + 15 reach: k_first .. k_end - 1 (none where they reach no row of the map).
__device__ __forceinline__ void dense_reached_steps(int first, int pixels, int out_w, int stride_h, int pad_h,
                                                    int kernel_h, int dilation_h, int height, int width, int& k_first,
                                                    int& k_end) {
    const int last = (first + 15 < pixels ? first + 15 : pixels - 1) / out_w;
    const int top = first / out_w * stride_h - pad_h, bottom = last * stride_h - pad_h + (kernel_h - 1) * dilation_h;
    const int y_first = top > 0 ? top : 0, y_end = bottom < height ? bottom + 1 : height;
    k_first = y_first < y_end ? y_first * width / 16 : 0;
    k_end = y_first < y_end ? (y_end * width + 15) / 16 : 0;
}

// VECTORS (the host's dense_window_vectors): the span rows, and in channels_last the feature's
// and the input's rows, move as 16-byte vectors. A template argument, not a runtime one: each
// instantiation then holds one way of staging (the runtime flags kept both in the code).
//
// oplib-instantiate: involution_generated_dense_window
// oplib-template: LAST = false | true
// oplib-template: VECTORS = false | true
//
// Block (32, DENSE_WARPS); grid (groups, N).
template <typename scalar_t, bool LAST, bool VECTORS>
__global__ void __launch_bounds__(DENSE_THREADS, 4) involution_generated_dense_window(
    const scalar_t* __restrict__ input, const scalar_t* __restrict__ feature, const scalar_t* __restrict__ span_weight,
    const scalar_t* __restrict__ bias, scalar_t* __restrict__ out, int channels, int height, int width, int groups,
    int kernel_h, int kernel_w, int out_h, int out_w, int stride_h, int stride_w, int pad_h, int pad_w,
    int dilation_h, int dilation_w, int reduced, index_t input_n, index_t input_c, index_t input_h, index_t input_w,
    index_t out_n, index_t out_c, index_t out_hs, index_t out_ws, index_t feature_n, index_t feature_c,
    index_t feature_h, index_t feature_w) {
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800
    if constexpr (sizeof(scalar_t) == 2) {
        typedef scalar_t half_t;
        const int warp = threadIdx.y, lane = threadIdx.x;
        const int row = lane >> 2, quad = lane & 3;  // a fragment's row (pixel) and column pair
        const int taps = kernel_h * kernel_w, pixels = out_h * out_w, inputs = height * width;
        const int group_channels = channels / groups, group = blockIdx.x, first = 16 * warp;
        const index_t n = blockIdx.y;
        const int q_steps = (inputs + 15) / 16, dense_stride = 8 * q_steps + 4, dense_words = DENSE_PIXELS * dense_stride;
        OPLIB_DYNAMIC_SHARED(unsigned int, shared);
        unsigned int* dense = shared;  // hi, then lo dense_words further
        unsigned int* staged = shared + dense_generation_words<LAST>(inputs, taps, reduced);
        unsigned int* tap_offsets = staged + (LAST ? 16 * q_steps * DENSE_CHANNEL_STRIDE : DENSE_CHANNELS * dense_stride);
        const bool warp_non_finite = dense_form_matrices<half_t, LAST, VECTORS>(
            shared, tap_offsets, feature, span_weight, bias, n, group, height, width, kernel_h, kernel_w, out_h, out_w,
            stride_h, stride_w, pad_h, pad_w, dilation_h, dilation_w, reduced, feature_n, feature_c, feature_h, feature_w);
        const DensePixel low_pixel = dense_pixel(first + row, pixels, out_w, stride_h, stride_w, pad_h, pad_w, out_hs,
                                                 out_ws);
        const DensePixel high_pixel = dense_pixel(first + row + 8, pixels, out_w, stride_h, stride_w, pad_h, pad_w,
                                                  out_hs, out_ws);
        const unsigned short* feature_bits = reinterpret_cast<const unsigned short*>(feature) + n * feature_n;
        const unsigned short* group_span = reinterpret_cast<const unsigned short*>(span_weight) + (index_t)group * taps * reduced;
        const unsigned short* group_bias = reinterpret_cast<const unsigned short*>(bias) + (index_t)group * taps;
        // The k-steps of the input rows the warp's windows reach (the matrix's other columns are
        // zeros in its rows: at stride 2 on RedNet-50's 14 x 14 input, about half of them)
        int k_first, k_end;
        dense_reached_steps(first, pixels, out_w, stride_h, pad_h, kernel_h, dilation_h, height, width, k_first, k_end);
        __syncthreads();  // the dense matrices are written

        // 3. Per DENSE_CHANNELS of the group's channels: the input staged, both products, the outputs.
        const unsigned short* input_bits =
            reinterpret_cast<const unsigned short*>(input) + n * input_n + (index_t)group * group_channels * input_c;
        half_t* out_group = out + n * out_n + (index_t)group * group_channels * out_c;
        for (int c0 = 0; c0 < group_channels; c0 += DENSE_CHANNELS) {
            if (c0 > 0) __syncthreads();  // every warp is done with the previous channels
            const unsigned short* chunk = input_bits + c0 * input_c;
            if constexpr (LAST) {
                // [input pixel][channel]: a row a pixel, 8 words (16 channels)
                dense_stage_rows<VECTORS>(staged, DENSE_CHANNEL_STRIDE, 16 * q_steps, inputs, DENSE_CHANNELS / 2, chunk,
                                          width, input_h, input_w, input_c, group_channels - c0);
            } else {
                // [channel][input pixel]
                dense_stage_planes(staged, dense_stride, 8 * q_steps, chunk, input_c, group_channels - c0, width, input_h,
                                   input_w, inputs);
            }
            __syncthreads();  // the channels are staged
            if (first >= pixels) continue;
            OplibFragmentC sums[2] = {};
            for (int k = k_first; k < k_end; ++k) {
                OplibFragmentB low, high;
                if constexpr (LAST) {
                    dense_load_rows_b(staged, k, low, high);
                } else {
                    oplib_load_fragments_b(staged + 8 * k, dense_stride, 8 * dense_stride, low, high);
                }
                const OplibFragmentA a_hi = oplib_load_fragment_a(dense + first * dense_stride + 8 * k, dense_stride);
                const OplibFragmentA a_lo =
                    oplib_load_fragment_a(dense + dense_words + first * dense_stride + 8 * k, dense_stride);
                mma_split_products<half_t>(sums, a_hi, a_lo, low, high);
            }
            if (mma_any_non_finite(sums) || warp_non_finite) {  // oplib-cold: an inf or a nan met by the warp
                OPLIB_COLD_BLOCK();
                dense_direct_sums<half_t>(input_bits, feature_bits, group_span, group_bias, out_group, first, c0,
                                          group_channels, pixels, height, width, out_w, kernel_h, kernel_w, stride_h,
                                          stride_w, pad_h, pad_w, dilation_h, dilation_w, reduced, input_c, input_h,
                                          input_w, out_c, out_hs, out_ws, feature_c, feature_h, feature_w);
                continue;
            }
#pragma unroll
            for (int v = 0; v < 8; ++v) {
                const DensePixel& pixel = v >> 1 & 1 ? high_pixel : low_pixel;
                const int c = c0 + 8 * (v >> 2) + 2 * quad + (v & 1);
                if (pixel.inside && c < group_channels)
                    out_group[c * out_c + pixel.out] = Element<half_t>::store(sums[v >> 2].value[v & 3]);
            }
        }
    }
#endif
}

// The lane's 8 grad_input values (input pixels row, row + 8 of m-tile `tile` x channels c0 +
// 2 quad, + 1 of each n-tile) by the direct sum over every (output pixel, tap) that reads them,
// each weight formed again in float from global memory: for a warp whose products met an inf or
// a nan. A function of its own, rolled: cold code.
template <typename half_t>
__device__ __noinline__ void dense_direct_grad_input(const unsigned short* grad, const unsigned short* feature,
                                                     const unsigned short* span, const unsigned short* bias,
                                                     half_t* out, int tile, int c0, int group_channels, int height,
                                                     int width, int out_h, int out_w, int kernel_h, int kernel_w,
                                                     int stride_h, int stride_w, int pad_h, int pad_w, int dilation_h,
                                                     int dilation_w, int reduced, index_t grad_c, index_t grad_h,
                                                     index_t grad_w, index_t out_c, index_t out_hs, index_t out_ws,
                                                     index_t feature_c, index_t feature_h, index_t feature_w) {
    const int lane = oplib_lane(), row = lane >> 2, quad = lane & 3, taps = kernel_h * kernel_w;
    for (int v = 0; v < 8; ++v) {
        const int q = 16 * tile + row + 8 * (v >> 1 & 1), c = c0 + 8 * (v >> 2) + 2 * quad + (v & 1);
        if (q >= height * width || c >= group_channels) continue;
        const int y = q / width, x = q % width;
        float sum = 0.0f;
        for (int t = 0; t < taps; ++t) {
            const int i_step = y + pad_h - t / kernel_w * dilation_h, j_step = x + pad_w - t % kernel_w * dilation_w;
            if (i_step < 0 || j_step < 0 || i_step % stride_h != 0 || j_step % stride_w != 0) continue;
            const int i = i_step / stride_h, j = j_step / stride_w;
            if (i >= out_h || j >= out_w) continue;
            float weight = mma_to_float(__ldg(bias + t), half_t());
            for (int r = 0; r < reduced; ++r)
                weight = oplib_fma(mma_to_float(__ldg(span + (index_t)t * reduced + r), half_t()),
                                   mma_to_float(__ldg(feature + r * feature_c + i * feature_h + j * feature_w), half_t()),
                                   weight);
            sum = oplib_fma(weight, mma_to_float(__ldg(grad + c * grad_c + i * grad_h + j * grad_w), half_t()), sum);
        }
        out[c * out_c + (index_t)y * out_hs + (index_t)x * out_ws] = Element<half_t>::store(sum);
    }
}

// involution_generated's grad_input on the same plan: the dense matrices' transposes times
// grad_output,
//   grad_input[q, c] = sum_p dense[p, q] * grad_output[p, c]          (Q x P) (P x channels)
// grad_output: (N, C, Ho, Wo), out: grad_input (N, C, H, W), feature as the forward's; the host
// sends a call here where the forward's kernel would serve the forward. After steps 1 and 2 as
// the forward's, per DENSE_CHANNELS of the group's channels the block stages grad_output and each
// warp takes the m-tiles w, w + DENSE_WARPS, .. of the input pixels, their A fragments the
// matrices' columns (ldmatrix transposed). A warp whose outputs are not all finite (an inf or a
// nan of grad_output times the matrices' zeros puts nans across them; one of the weights, an inf
// where it reads) sums them directly (dense_direct_grad_input): a weight at a tap in the padding
// reads no input pixel, so the outputs' check is all there is to make.
//
// Dynamic shared memory: the forward's generation region and taps, with the staged grad_output
//   staged   LAST: DENSE_PIXELS x DENSE_CHANNEL_STRIDE    [output pixel][channel]
//            else: DENSE_CHANNELS x DENSE_PIXEL_STRIDE    [channel][output pixel]
//
// oplib-instantiate: involution_generated_dense_window_backward_input
//
// Block (32, DENSE_WARPS); grid (groups, N).
template <typename scalar_t, bool LAST, bool VECTORS>
__global__ void __launch_bounds__(DENSE_THREADS, 4) involution_generated_dense_window_backward_input(
    const scalar_t* __restrict__ grad_output, const scalar_t* __restrict__ feature,
    const scalar_t* __restrict__ span_weight, const scalar_t* __restrict__ bias, scalar_t* __restrict__ out,
    int channels, int height, int width, int groups, int kernel_h, int kernel_w, int out_h, int out_w, int stride_h,
    int stride_w, int pad_h, int pad_w, int dilation_h, int dilation_w, int reduced, index_t grad_n, index_t grad_c,
    index_t grad_h, index_t grad_w, index_t out_n, index_t out_c, index_t out_hs, index_t out_ws, index_t feature_n,
    index_t feature_c, index_t feature_h, index_t feature_w) {
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800
    if constexpr (sizeof(scalar_t) == 2) {
        typedef scalar_t half_t;
        const int warp = threadIdx.y, lane = threadIdx.x;
        const int row = lane >> 2, quad = lane & 3;  // a fragment's row (input pixel) and column pair
        const int taps = kernel_h * kernel_w, pixels = out_h * out_w, inputs = height * width;
        const int group_channels = channels / groups, group = blockIdx.x;
        const index_t n = blockIdx.y;
        const int q_steps = (inputs + 15) / 16, p_steps = (pixels + 15) / 16;
        const int dense_stride = 8 * q_steps + 4, dense_words = DENSE_PIXELS * dense_stride;
        OPLIB_DYNAMIC_SHARED(unsigned int, shared);
        unsigned int* dense = shared;  // hi, then lo dense_words further
        unsigned int* staged = shared + dense_generation_words<LAST>(inputs, taps, reduced);
        unsigned int* tap_offsets = staged + (LAST ? DENSE_PIXELS * DENSE_CHANNEL_STRIDE : DENSE_CHANNELS * DENSE_PIXEL_STRIDE);
        dense_form_matrices<half_t, LAST, VECTORS>(shared, tap_offsets, feature, span_weight, bias, n, group, height,
                                                   width, kernel_h, kernel_w, out_h, out_w, stride_h, stride_w, pad_h,
                                                   pad_w, dilation_h, dilation_w, reduced, feature_n, feature_c,
                                                   feature_h, feature_w);
        __syncthreads();  // the dense matrices are written

        // 3. Per DENSE_CHANNELS of the group's channels: grad_output staged, the products, grad_input.
        const unsigned short* grad_bits =
            reinterpret_cast<const unsigned short*>(grad_output) + n * grad_n + (index_t)group * group_channels * grad_c;
        half_t* out_group = out + n * out_n + (index_t)group * group_channels * out_c;
        for (int c0 = 0; c0 < group_channels; c0 += DENSE_CHANNELS) {
            if (c0 > 0) __syncthreads();  // every warp is done with the previous channels' grad_output
            const unsigned short* chunk = grad_bits + c0 * grad_c;
            if constexpr (LAST) {
                // [output pixel][channel]: a row a pixel, 8 words (16 channels)
                dense_stage_rows<VECTORS>(staged, DENSE_CHANNEL_STRIDE, DENSE_PIXELS, pixels, DENSE_CHANNELS / 2, chunk,
                                          out_w, grad_h, grad_w, grad_c, group_channels - c0);
            } else {
                dense_stage_planes(staged, DENSE_PIXEL_STRIDE, DENSE_PIXELS / 2, chunk, grad_c, group_channels - c0,
                                   out_w, grad_h, grad_w, pixels);
            }
            __syncthreads();  // the channels are staged
            for (int tile = warp; tile < q_steps; tile += DENSE_WARPS) {
                OplibFragmentC sums[2] = {};
                for (int k = 0; k < p_steps; ++k) {
                    OplibFragmentB low, high;
                    if constexpr (LAST) {
                        dense_load_rows_b(staged, k, low, high);
                    } else {
                        oplib_load_fragments_b(staged + 8 * k, DENSE_PIXEL_STRIDE, 8 * DENSE_PIXEL_STRIDE, low, high);
                    }
                    // A: the matrices' columns 16 tile .. (input pixels) over rows 16 k .. (output pixels)
                    const OplibFragmentA a_hi =
                        oplib_load_fragment_a_transposed(dense + 16 * k * dense_stride + 8 * tile, dense_stride);
                    const OplibFragmentA a_lo =
                        oplib_load_fragment_a_transposed(dense + dense_words + 16 * k * dense_stride + 8 * tile, dense_stride);
                    mma_split_products<half_t>(sums, a_hi, a_lo, low, high);
                }
                if (mma_any_non_finite(sums)) {  // oplib-cold: an inf or a nan met by the warp
                    OPLIB_COLD_BLOCK();
                    dense_direct_grad_input<half_t>(
                        grad_bits, reinterpret_cast<const unsigned short*>(feature) + n * feature_n,
                        reinterpret_cast<const unsigned short*>(span_weight) + (index_t)group * taps * reduced,
                        reinterpret_cast<const unsigned short*>(bias) + (index_t)group * taps, out_group, tile, c0,
                        group_channels, height, width, out_h, out_w, kernel_h, kernel_w, stride_h, stride_w, pad_h,
                        pad_w, dilation_h, dilation_w, reduced, grad_c, grad_h, grad_w, out_c, out_hs, out_ws, feature_c,
                        feature_h, feature_w);
                    continue;
                }
#pragma unroll
                for (int h = 0; h < 2; ++h) {
                    const int q = 16 * tile + row + 8 * h;
                    if (q >= inputs) continue;
                    half_t* at = out_group + (index_t)(q / width) * out_hs + (index_t)(q % width) * out_ws;
#pragma unroll
                    for (int v = 0; v < 4; ++v) {
                        const int c = c0 + 8 * (v >> 1) + 2 * quad + (v & 1);
                        if (c < group_channels) at[c * out_c] = Element<half_t>::store(sums[v >> 1].value[2 * h + (v & 1)]);
                    }
                }
            }
        }
    }
#endif
}

// A lane's two adjacent float sums of the grad_weight kernel's products, stored at once (st.shared.v2).
struct alignas(8) DenseSumPair {
    float value[2];
};

// What the grad_weight kernel's gather adds up for a tap and a pixel, read at once (ld.shared.v4):
// a tap's row and column offsets, its out offset (a * out_kh + b * out_kw) and its place in a
// products row (dy * W + dx); a pixel's window's first row and column, its out offset
// (i * out_hs + j * out_ws) and its window's place in the products (its row's first, plus
// top * W + left). The host declines an out whose offsets within a (sample, group) pass an int.
struct alignas(16) DenseGatherEntry {
    int value[4];
};

// The grad_weight kernel's MAP (its comment).
constexpr int DENSE_MAP_ROUNDED = 0;
constexpr int DENSE_MAP_NARROW = 1;
constexpr int DENSE_MAP_WIDE = 2;
constexpr int DENSE_GATHER_LANES = 64;  // lanes along the gather's inner index: a pixel or a tap each
static_assert(DENSE_GATHER_LANES >= DENSE_PIXELS && DENSE_GATHER_LANES >= DENSE_TAPS &&
                  DENSE_THREADS % DENSE_GATHER_LANES == 0 && DENSE_GATHER_LANES % 32 == 0,
              "a lane every pixel or tap; a warp's lanes on one outer index");

// involution's grad_weight (involution_backward_weight) on tensor cores, float16 and bfloat16:
//   grad_weight[n, g, a, b, i, j] = sum over the group's channels c of grad_output[n, c, i, j] *
//                                   input[n, c, i*sh - ph + a*dh, j*sw - pw + b*dw]
// (0 at a tap in the padding), which is the product of the group's grad_output and input
// gathered at the taps:
//   products[p, q] = sum_c grad_output[p, c] * input[q, c]         (P x channels) (channels x Q)
//   grad_weight[t, p] = products[p, q(p, t)]
// Every term of a gathered sum is one of the direct sum's (the tiles' zeros, past the map and the
// group's channels, meet zeros or land in sums no tap reads), so infs and nans land where the
// direct sum puts them with no check; a tap in the padding is 0, as the op's other CUDA kernels
// make it (they skip it). The products are exact in float (16-bit values), the sums in float.
//
// grad_output: (N, C, Ho, Wo), input: (N, C, H, W) of any strides, out: (N, G, KH, KW, Ho, Wo) of
// any strides. A map larger than a block holds is cut into bands of band_rows output rows (the
// host's dense_weight_band_rows: at most DENSE_PIXELS pixels, the input rows their windows reach
// inside the map at most DENSE_INPUTS pixels; the whole map where it fits, as RedNet-50's last
// stage, its stages 2 and 3 in bands of 2 and 4 rows), T <= DENSE_TAPS, taps' offsets in 16 bits.
// A block takes one (sample, group, band) (grid: groups x samples x bands) and works on the band
// as a map of its own (P its pixels, Q the input pixels it stages); warp w takes the output
// pixels 16 w .. 16 w + 15 (an m-tile). Per DENSE_CHANNELS of the group's channels the block
// stages grad_output and the input (zeros past the maps and the channels); each warp multiplies
// its pixels' grad_output (A, one k-step) by the input's n-tiles in the rows its windows reach,
// adding the sums in float into its rows of the products. Then the block gathers, a lane a pixel
// (or a tap, along out's smaller stride of the two) and two taps (pixels) a turn, and stores
// each. No atomics, every sum in a fixed order: deterministic.
//
// Dynamic shared memory, 32-bit words (the host's dense_weight_shared_bytes), with k_q = Q rounded
// up to 16:
//   products   DENSE_PIXELS x (k_q + 8) floats        [pixel][input pixel] (a fragment's float2
//                                                   stores: 4 rows of 8 floats 8 banks apart), or
//                                                   16-bit values where one pass makes them final
//   staged grad_output  LAST: DENSE_PIXELS x DENSE_CHANNEL_STRIDE   [pixel][channel]
//                       else: DENSE_CHANNELS x DENSE_PIXEL_STRIDE   [channel][pixel]
//   staged input        LAST: k_q x DENSE_CHANNEL_STRIDE            [input pixel][channel]
//                       else: DENSE_CHANNELS x (k_q / 2 + 4)        [channel][input pixel]
//   taps       4 x DENSE_TAPS                       a tap's DenseGatherEntry
//   pixels     4 x DENSE_PIXELS                     a pixel's DenseGatherEntry
//
// MAP, what the products and the out are (a template argument, so that an instantiation holds
// one way): DENSE_MAP_ROUNDED, float products, out in the storage type; DENSE_MAP_NARROW, one pass
// over a group's channels (RedNet's 16) makes each product its final sum, kept rounded to the
// storage type (the rounding the store would make) in half the shared memory; DENSE_MAP_WIDE,
// float products and a float out (the fused op's generator gradients contract the map in
// float: the same sums, never rounded).
//
// oplib-instantiate: involution_dense_window_backward_weight
// oplib-template: MAP = DENSE_MAP_ROUNDED | DENSE_MAP_NARROW | DENSE_MAP_WIDE
//
// Block (32, DENSE_WARPS); grid (groups, N, bands).
template <typename scalar_t, bool LAST, bool VECTORS, int MAP>
__global__ void __launch_bounds__(DENSE_THREADS, 4) involution_dense_window_backward_weight(
    const scalar_t* __restrict__ grad_output, const scalar_t* __restrict__ input, void* __restrict__ out,
    int channels, int height, int width, int groups, int kernel_h, int kernel_w, int out_h, int out_w, int stride_h,
    int stride_w, int pad_h, int pad_w, int dilation_h, int dilation_w, int band_rows, index_t grad_n, index_t grad_c,
    index_t grad_h, index_t grad_w, index_t input_n, index_t input_c, index_t input_h, index_t input_w,
    index_t out_n, index_t out_g, index_t out_kh, index_t out_kw, index_t out_hs, index_t out_ws) {
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800
    if constexpr (sizeof(scalar_t) == 2) {
        typedef scalar_t half_t;
        const int warp = threadIdx.y, lane = threadIdx.x, thread = lane + 32 * warp;
        const int row = lane >> 2, quad = lane & 3;  // a fragment's row (pixel) and column pair
        const int taps = kernel_h * kernel_w, group_channels = channels / groups, group = blockIdx.x, first = 16 * warp;
        const index_t n = blockIdx.y;
        // The block's band: output rows band_top .. band_top + rows - 1, and the input rows their
        // windows reach inside the map, band_y .. band_y + band_height - 1: the map it stages. A
        // window's first tap is at its local row i * stride_h - band_pad_h.
        const int band_top = blockIdx.z * band_rows, rows = out_h - band_top < band_rows ? out_h - band_top : band_rows;
        const int reach_top = band_top * stride_h - pad_h;
        const int reach_end = reach_top + (rows - 1) * stride_h + (kernel_h - 1) * dilation_h + 1;
        const int band_y = reach_top > 0 ? reach_top : 0, band_end = reach_end < height ? reach_end : height;
        const int band_height = band_end > band_y ? band_end - band_y : 0, band_pad_h = band_y - reach_top;
        const int pixels = rows * out_w, inputs = band_height * width;
        const int q_steps = (inputs + 15) / 16, product_stride = 16 * q_steps + 8, input_stride = 8 * q_steps + 4;
        constexpr bool narrow = MAP == DENSE_MAP_NARROW;  // (the host's choice where one pass serves)
        OPLIB_DYNAMIC_SHARED(unsigned int, shared);
        float* products = reinterpret_cast<float*>(shared);
        unsigned short* narrow_products = reinterpret_cast<unsigned short*>(shared);
        unsigned int* staged_grad = shared + DENSE_PIXELS * product_stride / (narrow ? 2 : 1);
        unsigned int* staged_input =
            staged_grad + (LAST ? DENSE_PIXELS * DENSE_CHANNEL_STRIDE : DENSE_CHANNELS * DENSE_PIXEL_STRIDE);
        DenseGatherEntry* tap_entries = reinterpret_cast<DenseGatherEntry*>(
            staged_input + (LAST ? 16 * q_steps * DENSE_CHANNEL_STRIDE : DENSE_CHANNELS * input_stride));
        DenseGatherEntry* pixel_entries = tap_entries + DENSE_TAPS;
        // formed once, so that the gather divides and multiplies nothing
        if (thread < taps) {
            const int a = thread / kernel_w, b = thread % kernel_w, dy = a * dilation_h, dx = b * dilation_w;
            tap_entries[thread] = {{dy, dx, a * (int)out_kh + b * (int)out_kw, dy * width + dx}};
        }
        if (thread < pixels) {
            const int i = thread / out_w, j = thread % out_w, top = i * stride_h - band_pad_h, left = j * stride_w - pad_w;
            pixel_entries[thread] = {{top, left, i * (int)out_hs + j * (int)out_ws, thread * product_stride + top * width + left}};
        }
        int k_first, k_end;
        dense_reached_steps(first, pixels, out_w, stride_h, band_pad_h, kernel_h, dilation_h, band_height, width, k_first,
                            k_end);
        if (first >= pixels) k_end = k_first;
        const unsigned short* grad_bits = reinterpret_cast<const unsigned short*>(grad_output) + n * grad_n +
                                          (index_t)group * group_channels * grad_c + (index_t)band_top * grad_h;
        const unsigned short* input_bits = reinterpret_cast<const unsigned short*>(input) + n * input_n +
                                           (index_t)group * group_channels * input_c + (index_t)band_y * input_h;
        const int low_place = (first + row) * product_stride + 2 * quad;  // the lane's C values' places
        const int high_place = low_place + 8 * product_stride;

        for (int c0 = 0; c0 < group_channels; c0 += DENSE_CHANNELS) {
            if (c0 > 0) __syncthreads();  // every warp is done with the previous channels' staging
            if constexpr (LAST) {
                dense_stage_rows<VECTORS>(staged_grad, DENSE_CHANNEL_STRIDE, DENSE_PIXELS, pixels, DENSE_CHANNELS / 2,
                                          grad_bits + c0 * grad_c, out_w, grad_h, grad_w, grad_c, group_channels - c0);
                dense_stage_rows<VECTORS>(staged_input, DENSE_CHANNEL_STRIDE, 16 * q_steps, inputs, DENSE_CHANNELS / 2,
                                          input_bits + c0 * input_c, width, input_h, input_w, input_c,
                                          group_channels - c0);
            } else {
                dense_stage_planes(staged_grad, DENSE_PIXEL_STRIDE, DENSE_PIXELS / 2, grad_bits + c0 * grad_c, grad_c,
                                   group_channels - c0, out_w, grad_h, grad_w, pixels);
                dense_stage_planes(staged_input, input_stride, 8 * q_steps, input_bits + c0 * input_c, input_c,
                                   group_channels - c0, width, input_h, input_w, inputs);
            }
            __syncthreads();  // the channels are staged
            if (k_first >= k_end) continue;
            const OplibFragmentA a =
                LAST ? oplib_load_fragment_a(staged_grad + first * DENSE_CHANNEL_STRIDE, DENSE_CHANNEL_STRIDE)
                     : oplib_load_fragment_a_transposed(staged_grad + first / 2, DENSE_PIXEL_STRIDE);
            for (int k = k_first; k < k_end; ++k) {
                OplibFragmentB low, high;
                if constexpr (LAST) {
                    oplib_load_fragments_b(staged_input + 16 * k * DENSE_CHANNEL_STRIDE, DENSE_CHANNEL_STRIDE,
                                           8 * DENSE_CHANNEL_STRIDE, low, high);
                } else {
                    dense_load_b_transposed(staged_input + 8 * k, input_stride, low, high);
                }
                OplibFragmentC sums[2] = {};
                oplib_mma<half_t>(sums[0], a, low);
                oplib_mma<half_t>(sums[1], a, high);
#pragma unroll
                for (int h = 0; h < 4; ++h) {  // n-tile h & 1's values of pixel row + 8 (h >> 1)
                    const int place = (h >> 1 ? high_place : low_place) + 16 * k + 8 * (h & 1);
                    if constexpr (narrow) {  // the pair rounded, one 32-bit store
                        *reinterpret_cast<unsigned int*>(narrow_products + place) = mma_round_pair(
                            sums[h & 1].value[2 * (h >> 1)], sums[h & 1].value[2 * (h >> 1) + 1], half_t());
                        continue;
                    }
                    DenseSumPair* at = reinterpret_cast<DenseSumPair*>(products + place);
                    DenseSumPair sum = {{sums[h & 1].value[2 * (h >> 1)], sums[h & 1].value[2 * (h >> 1) + 1]}};
                    if (c0 > 0) {  // the lane's own places: no other lane reads or writes them before the gather
                        const DenseSumPair before = *at;
                        sum.value[0] = oplib_add(before.value[0], sum.value[0]);
                        sum.value[1] = oplib_add(before.value[1], sum.value[1]);
                    }
                    *at = sum;
                }
            }
        }
        __syncthreads();  // the products are summed

        // The gather: a lane along the inner index (pixels where out's stride along them is the
        // smaller, its NCHW layout; taps where it is not, pixel-major), its entry read once; two
        // outer indices a turn, a warp's lanes on one (its entry a broadcast).
        const bool pixels_inner = out_ws <= out_kw;
        const int inner = pixels_inner ? pixels : taps, outer = pixels_inner ? taps : pixels;
        const int index = thread % DENSE_GATHER_LANES;
        if (index < inner) {
            const DenseGatherEntry mine = (pixels_inner ? pixel_entries : tap_entries)[index];
            const DenseGatherEntry* others = pixels_inner ? tap_entries : pixel_entries;
            const index_t out_block = n * out_n + (index_t)group * out_g + (index_t)band_top * out_hs;
            for (int other_index = thread / DENSE_GATHER_LANES; other_index < outer;
                 other_index += DENSE_THREADS / DENSE_GATHER_LANES) {
                const DenseGatherEntry other = others[other_index];
                const DenseGatherEntry& pixel = pixels_inner ? mine : other;
                const DenseGatherEntry& tap = pixels_inner ? other : mine;
                const int y = pixel.value[0] + tap.value[0], x = pixel.value[1] + tap.value[1];
                const bool inside = (unsigned int)y < (unsigned int)band_height && (unsigned int)x < (unsigned int)width;
                const int place = pixel.value[3] + tap.value[3];
                const index_t at = out_block + pixel.value[2] + tap.value[2];
                if constexpr (MAP == DENSE_MAP_WIDE) {
                    static_cast<float*>(out)[at] = inside ? products[place] : 0.0f;
                } else if constexpr (narrow) {  // the rounded sum's bits, or +0
                    static_cast<unsigned short*>(out)[at] = inside ? narrow_products[place] : (unsigned short)0;
                } else {
                    static_cast<half_t*>(out)[at] = Element<half_t>::store(inside ? products[place] : 0.0f);
                }
            }
        }
    }
#endif
}
