// involution's forward and grad_weight for channels_last tensors, a 16-byte vector of one
// group's channels a lane (DCNv4's mapping):
//
//   out[n, i, j, c] = sum_{a, b} weight[n, i, j, g(c), a, b] * input[n, i*S - ph + a, j*S - pw + b, c]
//   grad_weight[n, i, j, g, a, b] = sum over the group's channels c of
//                                   grad_output[n, i, j, c] * input[n, i*S - ph + a, j*S - pw + b, c]
//
// Activations channels_last, (N, H, W, C) in memory; the weight and grad_weight pixel-major,
// (N, Ho, Wo, G, K, K) in memory (the layout involution.cu's channels_last kernels read and
// write); square kernels of KERNEL taps a side, equal strides STRIDE, dilation 1, any padding.
// The host takes these kernels where a group's channels, at least LAST_MIN_GROUP_CHANNELS, are
// PARTS vectors of 16 bytes, PARTS a power of two up to a warp (at 16 channels a group: 2 lanes
// in bfloat16, 4 in float32, 8 in float64), and the activations are aligned to a vector;
// involution.cu's chunked kernels serve the rest.
//
// Why: involution.cu's chunked kernels give a thread up to 16 channels (grad_weight: a whole
// group and one kernel row), so a warp's load touches twice the lines it needs, or seven rows
// of input at once; its weight loads, a record's taps 98 bytes apart at K = 7, touch a dozen
// lines each (the sixth H200 draw measured its channels_last kernels at 3.0x-5.6x their DRAM
// floor at RedNet-50's first stage in bfloat16, the kernels RedNet training runs). Here the
// lanes of a warp lie along the channels of adjacent pixels: each tap is one 16-byte load a
// lane, the warp's loads whole lines, and the warp's weights (forward) or results (grad_weight),
// runs of consecutive records, move between global and shared memory as whole vectors.
//
// Each kernel row's loads are issued together, with no branch between them (a tap outside the
// image reads the sample's first pixel instead, and its term is dropped), so that they are in
// flight at once. Grid-stride loop over warps, 32-bit work items, 64-bit offsets into the
// tensors; every lane of a warp takes every shuffle and every copy (lanes past the end add
// nothing and store nothing).

#include "warp.cuh"

// The block size of every grid-stride launch (oplib.kernels.cuda_launch.BLOCK_SIZE), whose
// warps each stage one warp's results: 32 / PARTS records of KERNEL^2 values, which at
// LAST_MIN_GROUP_CHANNELS channels a group or more is at most 32 bytes a tap in every dtype
// (16 records of bfloat16, 8 of float32, 4 of float64). The host reads these lines.
constexpr int LAST_THREADS = 256;
constexpr int LAST_WARPS = LAST_THREADS / 32;
// Blocks an SM is asked to hold. The forward and grad_input fit four (64 registers, no spills
// on any target), and the offline model, which finds the forward bound by instruction issue at
// three, puts four at 0.77x of three's time at RedNet-50's first stage in bfloat16; grad_weight
// spilled at four (sm_90), so three.
constexpr int LAST_MIN_BLOCKS = 4;
constexpr int LAST_WEIGHT_MIN_BLOCKS = 3;
constexpr int LAST_MIN_GROUP_CHANNELS = 16;
constexpr int LAST_MAX_PARTS = 32;
constexpr int LAST_STAGED_BYTES_PER_TAP = 32 * VECTOR_BYTES / LAST_MIN_GROUP_CHANNELS;

// A storage value as its accumulator: Element's conversion, but float16 by the GPU's own exact
// conversion (cvt.f32.f16, no .ftz: subnormals kept), where element.cuh's integer one, exact too
// and what the host emulation runs, spilled registers on sm_120 at three blocks an SM.
template <typename scalar_t>
__device__ __forceinline__ typename Element<scalar_t>::acc_t widen(scalar_t v) {
    return Element<scalar_t>::value(v);
}

template <>
__device__ __forceinline__ float widen<oplib_half>(oplib_half v) {
#ifdef __CUDA_ARCH__
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(v.bits));
    return f;
#else
    return oplib_half_to_float(v.bits);
#endif
}

// values[e] = vector.lane[e] as the accumulator type. bfloat16: each 32-bit word holds two
// values, the first in its low half, and a value's float is its 16 bits in a word's high half:
// one shift or one mask each (the generic conversion takes the half out first, two).
template <typename scalar_t>
__device__ __forceinline__ void widen_vector(typename Element<scalar_t>::acc_t* values, const Vector16<scalar_t>& vector) {
#pragma unroll
    for (int e = 0; e < Vector16<scalar_t>::lanes; ++e) values[e] = widen(vector.lane[e]);
}

template <>
__device__ __forceinline__ void widen_vector<oplib_bfloat16>(float* values, const Vector16<oplib_bfloat16>& vector) {
    const unsigned int* words = reinterpret_cast<const unsigned int*>(vector.lane);
#pragma unroll
    for (int h = 0; h < 4; ++h) {
        values[2 * h] = __uint_as_float(words[h] << 16);
        values[2 * h + 1] = __uint_as_float(words[h] & 0xffff0000u);
    }
}

// Whether row y lies in [0, height).
__device__ __forceinline__ bool row_inside(int y, index_t height) { return y >= 0 && y < height; }

// Bit b set where column x0 + b lies in [0, width): which of a kernel row's taps read the image.
template <int KERNEL>
__device__ __forceinline__ unsigned int columns_inside(int x0, index_t width) {
    unsigned int mask = 0;
#pragma unroll
    for (int b = 0; b < KERNEL; ++b) mask |= (x0 + b >= 0 && x0 + b < width) ? 1u << b : 0u;
    return mask;
}

// values[u] = the vector at first + (start + u) step, for u < COUNT (and start + u < LIMIT),
// loaded with no branch between: where bit start + u of `present` is clear, the vector at
// `elsewhere` instead (a pixel of the tensor, the same line for every lane), whose term the
// caller drops. So that they can be in flight at once: grad_weight's and grad_input's are
// (sm_90's SASS); the forward's, each used only inside its tap's branch, ptxas moves into the
// branches, one load in flight, as it did when a lane took one pixel.
template <typename scalar_t, int COUNT, int LIMIT = COUNT>
__device__ __forceinline__ void load_vectors(Vector16<scalar_t>* values, const scalar_t* first, index_t step, int start,
                                             unsigned int present, const scalar_t* elsewhere) {
#pragma unroll
    for (int u = 0; u < COUNT && start + u < LIMIT; ++u)
        values[u] = *reinterpret_cast<const Vector16<scalar_t>*>(
            (present >> (start + u)) & 1u ? first + (start + u) * step : elsewhere);
}

// A lane's work item in the forward and grad_weight (LastLaunch::pair_item): a vector of
// channels of one group at two adjacent output pixels of a row. A record (n, i, j, g) is the
// weight's KERNEL^2 values of a pixel and group, record r at r * KERNEL^2 in the pixel-major
// layout.
struct LastItem {
    bool active;
    int record, part, pixel, n, i, j;  // the first pixel's record, pixel and place
    index_t c0;                         // the vector's first channel
};

// The weight's records of a warp's pair items, in order: a unit (a pair, a group g) reads its
// first pixel's record, pixel * G + g, and where its second pixel lies inside the row the
// second's, G records on. From the warp's first unit's first record to its last unit's last
// they are contiguous but where the warp takes part of a pair's groups: the first pair's groups
// before the warp's first unit, at its second pixel, and the last pair's groups after the
// warp's last unit, at its first pixel (or, both pairs one, its groups outside the warp between
// its two pixels). So up to three runs, run r the records [start[r], end[r]) (empty where the
// two are equal; one run where the warp takes whole pairs), staged one after another: at most
// two records a unit. Staged whole from the first to the last, the span at 32 groups of 16
// channels (RedNet-50's stage 4) in bfloat16 was 48 records for a staging of 32.
struct PairRecords {
    int start[3], end[3];

    // Where `record`, one of the runs', lies in the staging, in records.
    __device__ __forceinline__ int position(int record) const {
        int at = record - start[0];
        if (record >= start[1]) at -= start[1] - end[0];
        if (record >= start[2]) at -= start[2] - end[1];
        return at;
    }
};

// A launch's sizes as the kernels use them (work items in 32 bits: the host keeps them below
// 2^31 with a grid to spare; sizes that scale offsets in 64), the calling lane and warp, and
// the warp's first round of the grid-stride loop over warps.
struct LastLaunch {
    int G, OH, OW, items, parts, lane, warp, first, step;
    index_t C, H, W;

    __device__ __forceinline__ LastLaunch(index_t total, index_t channels, index_t height, index_t width,
                                          index_t groups, index_t out_h, index_t out_w, int lanes)
        : G((int)groups), OH((int)out_h), OW((int)out_w), items((int)total), parts((int)(channels / groups / lanes)),
          lane(oplib_lane()), warp((int)(threadIdx.x / 32u)), first(((int)blockIdx.x * LAST_WARPS + warp) * 32),
          step((int)gridDim.x * LAST_THREADS), C(channels), H(height), W(width) {}

    // The lane's work item in the round from `base`: a vector of `lanes` channels of one group
    // at the output pixels (i, j) and, PIXELS 2, (i, j + 1), j a multiple of PIXELS (the second
    // past the row where OW is odd). Items run over (n, i, j / PIXELS, g, part), part fastest;
    // `record` and `pixel` are the first pixel's (the warp's records, every pixel's of each
    // item, and their places in the staging: PairRecords).
    template <int PIXELS>
    __device__ __forceinline__ LastItem pair_item(int base, int lanes) const {
        LastItem it;
        const int item = base + lane, pairs = (OW + PIXELS - 1) / PIXELS;
        it.active = item < items;
        const int unit = item / parts;
        it.part = item - unit * parts;
        const int g = unit % G, run = unit / G;
        it.j = run % pairs * PIXELS;
        it.i = (run / pairs) % OH;
        it.n = run / (pairs * OH);
        it.pixel = (it.n * OH + it.i) * OW + it.j;
        it.record = it.pixel * G + g;
        it.c0 = (index_t)g * (C / G) + it.part * lanes;
        return it;
    }

    // The records of the warp's pair items in the round from `base` (PairRecords).
    template <int PIXELS>
    __device__ __forceinline__ PairRecords pair_records(int base) const;
};

// With a pixel a lane (PIXELS 1) the warp's records are one run.
template <int PIXELS>
__device__ __forceinline__ PairRecords LastLaunch::pair_records(int base) const {
    const int pairs = (OW + PIXELS - 1) / PIXELS, last_lane = (items - base < 32 ? items - base : 32) - 1;
    const int unit0 = base / parts, unit1 = (base + last_lane) / parts;  // the first and last units
    const int pair0 = unit0 / G, pair1 = unit1 / G, group0 = unit0 - pair0 * G, group1 = unit1 - pair1 * G;
    const int j0 = pair0 % pairs * PIXELS, j1 = pair1 % pairs * PIXELS;
    const int pixel0 = pair0 / pairs * OW + j0, pixel1 = pair1 / pairs * OW + j1;  // the pairs' first pixels
    const bool two0 = PIXELS == 2 && j0 + 1 < OW, two1 = PIXELS == 2 && j1 + 1 < OW;
    PairRecords runs;
    runs.start[0] = pixel0 * G + group0;
    runs.end[2] = (two1 ? pixel1 + 1 : pixel1) * G + group1 + 1;
    runs.end[0] = runs.start[1] = runs.start[0];
    runs.end[1] = runs.start[2] = runs.end[2];
    if (two0 && (pair0 == pair1 ? group1 - group0 + 1 < G : group0 > 0)) {
        runs.end[0] = pixel0 * G + (pair0 == pair1 ? group1 + 1 : G);
        runs.start[1] = (pixel0 + 1) * G + group0;
    }
    if (two1 && pair0 != pair1 && group1 + 1 < G) {
        runs.end[1] = pixel1 * G + group1 + 1;
        runs.start[2] = (pixel1 + 1) * G;
    }
    return runs;
}

// to[0 .. count) = from[0 .. count) by a warp's lanes, adjacent lanes adjacent values: 16 bytes
// a lane where both ends are aligned to them, then a value a lane for the rest.
template <typename scalar_t>
__device__ __forceinline__ void warp_copy(scalar_t* to, const scalar_t* from, int count, int lane) {
    constexpr int LANES = Vector16<scalar_t>::lanes;
    int copied = 0;
    if ((reinterpret_cast<unsigned long long>(to) | reinterpret_cast<unsigned long long>(from)) % VECTOR_BYTES == 0) {
        const int vectors = count / LANES;
        for (int v = lane; v < vectors; v += 32)
            reinterpret_cast<Vector16<scalar_t>*>(to)[v] = reinterpret_cast<const Vector16<scalar_t>*>(from)[v];
        copied = vectors * LANES;
    }
    for (int v = copied + lane; v < count; v += 32) to[v] = from[v];
}

// The forward: a lane owns a 16-byte vector of a group's channels at two adjacent output
// pixels of a row (PIXELS 2; at PIXELS 1, one: a kernel row's K vectors, one run of records);
// the warp's records' weights (both pixels' of each lane) are first copied into shared memory
// in whole runs (PairRecords), then each input vector of a kernel row is one load, widened
// once, and serves a tap of each pixel (column c of the row: tap c of the first, tap c - S of
// the second), each a shared-memory read of its weight. The taps of each pixel are added in
// involution.cu's chunked kernel's order, those outside the image dropped: its bits.
//
// Why two pixels: with a lane one pixel (this kernel before) each tap's input load, its
// address and the 8 conversions of a bfloat16 vector served one tap; here the K + S vectors of
// a kernel row serve 2K taps. The offline model counts 2.7 instructions a traced one against
// 3.8 then (bfloat16, stride 1, sm_90) and predicts 0.72x of the time at RedNet-50's first
// stage, float32 bound by DRAM at its first three (bench/results/cuda-model.md). The vectors
// are loaded LAST_FORWARD_LOADED at a time, as grad_input's, within the 64 registers four
// blocks leave.
//
// Why a pixel a lane too (PIXELS 1, this kernel and grad_weight): pairs halve the grid. At
// RedNet-50's stage 4 (7 x 7 outputs) in bfloat16, batch 32, pairs are 224 blocks for an H200's
// 132 SMs of four, and the offline model puts both kernels there faster with a pixel a lane (392
// blocks, each tap's vector serving one pixel), as grad_input's bands there. The host takes a
// pixel a lane where the grid of pairs is under LAST_PAIRS_MIN_WAVES waves of the blocks the GPU
// holds at once (the driver's occupancy calculator, for the pairs' instantiation), and pairs
// where it cannot tell (oplib.kernels.involution.cuda.last_pixels), which reads these lines: a
// pair's pixels, the instantiation it asks the GPU's occupancy of.
constexpr int LAST_PAIR_PIXELS = 2;
constexpr int LAST_FORWARD_LOADED = 2;
constexpr int LAST_PAIRS_MIN_WAVES = 1;
static_assert(LAST_PAIRS_MIN_WAVES >= 1, "pairs wherever they fill less than a wave would never run");

// The forward's blocks an SM is asked to hold: float64's took more registers than four blocks
// leave once a warp's records were staged in runs (16 bytes spilled on sm_75, sm_80 and sm_90),
// so three there.
template <typename scalar_t>
struct LastForwardMinBlocks {
    static constexpr int value = sizeof(scalar_t) == 8 ? 3 : LAST_MIN_BLOCKS;
};

// oplib-instantiate: involution_forward_last, involution_backward_weight_last, involution_backward_input_last
// oplib-template: KERNEL = 3 | 5 | 7
// oplib-template: STRIDE = 1 | 2
// oplib-template: PIXELS = 2 | 1
template <typename scalar_t, int KERNEL, int STRIDE, int PIXELS>
__global__ void __launch_bounds__(LAST_THREADS, LastForwardMinBlocks<scalar_t>::value) involution_forward_last(
    const scalar_t* __restrict__ input, const scalar_t* __restrict__ weight, scalar_t* __restrict__ output,
    index_t total, index_t channels, index_t height, index_t width, index_t groups, index_t out_h, index_t out_w,
    index_t pad_h, index_t pad_w) {
    typedef typename Element<scalar_t>::acc_t acc_t;
    constexpr int LANES = Vector16<scalar_t>::lanes;
    constexpr int TAPS = KERNEL * KERNEL;
    constexpr int COLUMNS = KERNEL + (PIXELS - 1) * STRIDE;  // the input columns of a kernel row the pixels read
    constexpr int LOADED = LAST_FORWARD_LOADED;
    static_assert(PIXELS == 1 || PIXELS == LAST_PAIR_PIXELS, "a lane's one or two pixels");
    __shared__ Vector16<scalar_t> staged_vectors[LAST_WARPS][PIXELS * LAST_STAGED_BYTES_PER_TAP * TAPS / VECTOR_BYTES];
    const LastLaunch launch(total, channels, height, width, groups, out_h, out_w, LANES);
    const index_t C = launch.C, H = launch.H, W = launch.W;
    scalar_t* staged = reinterpret_cast<scalar_t*>(staged_vectors[launch.warp]);
    for (int base = launch.first; base < launch.items; base += launch.step) {
        // The runs' bounds are computed again where used, and the item after the copy: live
        // across it, they took registers the taps' loop needed (spills at 64 a thread).
#pragma unroll 1
        for (int r = 0; r < 3; ++r) {
            const PairRecords records = launch.template pair_records<PIXELS>(base);
            // selects, not records.start[r]: an array indexed by the loop's counter would live
            // in local memory
            const int start = r == 0 ? records.start[0] : r == 1 ? records.start[1] : records.start[2];
            const int count = (r == 0 ? records.end[0] : r == 1 ? records.end[1] : records.end[2]) - start;
            warp_copy(staged + records.position(start) * TAPS, weight + (index_t)start * TAPS, count * TAPS,
                      launch.lane);
        }
        __syncwarp();
        const LastItem it = launch.template pair_item<PIXELS>(base, LANES);
        const bool second = PIXELS == 2 && it.active && it.j + 1 < launch.OW;
        const int y0 = it.i * STRIDE - (int)pad_h, x0 = it.j * STRIDE - (int)pad_w;
        const unsigned int columns = it.active ? columns_inside<COLUMNS>(x0, W) : 0u;
        // A second pixel past the row reads the first's weights (its sums are not stored).
        const PairRecords records = launch.template pair_records<PIXELS>(base);
        const int first_at = records.position(it.record);
        const scalar_t* taps = staged + first_at * TAPS;
        const scalar_t* second_taps = taps + (second ? records.position(it.record + launch.G) - first_at : 0) * TAPS;
        const scalar_t* row = input + (((index_t)it.n * H + y0) * W + x0) * C + it.c0;
        acc_t sum[PIXELS][LANES];
#pragma unroll
        for (int r = 0; r < PIXELS; ++r)
#pragma unroll
            for (int e = 0; e < LANES; ++e) sum[r][e] = 0;
        for (int a = 0; a < KERNEL; ++a, row += W * C) {
            const unsigned int inside = row_inside(y0 + a, H) ? columns : 0u;
#pragma unroll
            for (int c0 = 0; c0 < COLUMNS; c0 += LOADED) {
                Vector16<scalar_t> values[LOADED];
                load_vectors<scalar_t, LOADED, COLUMNS>(values, row, C, c0, inside, input + it.c0);
#pragma unroll
                for (int u = 0; u < LOADED && c0 + u < COLUMNS; ++u) {
                    const int c = c0 + u;
                    if (!((inside >> c) & 1u)) continue;
                    acc_t x[LANES];
                    widen_vector<scalar_t>(x, values[u]);
                    if (c < KERNEL) {
                        const acc_t w = widen(taps[a * KERNEL + c]);
#pragma unroll
                        for (int e = 0; e < LANES; ++e) sum[0][e] = oplib_fma(w, x[e], sum[0][e]);
                    }
                    if (PIXELS == 2 && c >= STRIDE) {
                        const acc_t w = widen(second_taps[a * KERNEL + c - STRIDE]);
#pragma unroll
                        for (int e = 0; e < LANES; ++e) sum[PIXELS - 1][e] = oplib_fma(w, x[e], sum[PIXELS - 1][e]);
                    }
                }
            }
        }
#pragma unroll
        for (int r = 0; r < PIXELS; ++r) {
            if (!(r == 0 ? it.active : second)) continue;
            Vector16<scalar_t> result;
#pragma unroll
            for (int e = 0; e < LANES; ++e) result.lane[e] = Element<scalar_t>::store(sum[r][e]);
            *reinterpret_cast<Vector16<scalar_t>*>(output + ((index_t)it.pixel + r) * C + it.c0) = result;
        }
        __syncwarp();  // the staging is free for the next round
    }
}

// grad_weight's blocks an SM is asked to hold: float64's sums and the next row's loads took
// more registers than three blocks leave (16 bytes spilled on sm_90), so two there.
template <typename scalar_t>
struct LastWeightMinBlocks {
    static constexpr int value = sizeof(scalar_t) == 8 ? 2 : LAST_WEIGHT_MIN_BLOCKS;
};

// grad_weight, the same mapping, a lane a vector of a group's channels at two adjacent output
// pixels of a row (the forward's pair items; at PIXELS 1, one): the lane's two grad_output
// vectors are loaded once for all taps; per kernel row the K + S input vectors the two pixels read are each one
// load, widened once, and serve a tap of each pixel (column c: tap c of the first, tap c - S of
// the second). A tap's partial sum over a lane's channels is added across the group's PARTS
// lanes by shuffles (a butterfly: every lane of the group gets the same bits) as soon as it is
// formed, and staged in shared memory, each part its share of the taps; then the warp's
// records are written out in whole runs (PairRecords), instead of one 2-byte store a lane per
// tap. A tap outside the image sums to +0, what the chunked kernel writes. The group's sum is
// split across lanes, so its bits are not the chunked kernel's (each is checked against the
// float64 reference); it is deterministic, and a pixel's are the same as with a pixel a lane.
//
// Why two pixels: with a lane one pixel (this kernel before), each input load, its address and
// the 8 conversions of a bfloat16 vector served one tap; here the K + S vectors of a row serve
// 2K taps. The sums are shuffled as they are formed, not a row's together: a row's 2K sums
// beside the two grad_output vectors took more than the 80 registers three blocks leave and
// spilled (bfloat16 and float16 at K = 7, sm_90). The vectors are loaded LAST_WEIGHT_LOADED at a
// time: at two (the forward's), the offline model found float32 bound by their latency; at four,
// by DRAM at RedNet-50's first three stages, and bfloat16 as at two (by instruction issue), with
// no spill on any target. Pairs halve the grid: where they leave the GPU short of a wave, a
// pixel a lane (PIXELS 1; the forward's comment above).
constexpr int LAST_WEIGHT_LOADED = 4;

template <typename scalar_t, int KERNEL, int STRIDE, int PIXELS>
__global__ void __launch_bounds__(LAST_THREADS, LastWeightMinBlocks<scalar_t>::value) involution_backward_weight_last(
    const scalar_t* __restrict__ grad_output, const scalar_t* __restrict__ input, scalar_t* __restrict__ grad_weight,
    index_t total, index_t channels, index_t height, index_t width, index_t groups, index_t out_h, index_t out_w,
    index_t pad_h, index_t pad_w) {
    typedef typename Element<scalar_t>::acc_t acc_t;
    constexpr int LANES = Vector16<scalar_t>::lanes;
    constexpr int TAPS = KERNEL * KERNEL;
    constexpr int COLUMNS = KERNEL + (PIXELS - 1) * STRIDE;  // the input columns of a kernel row the pixels read
    constexpr int LOADED = LAST_WEIGHT_LOADED;
    static_assert(PIXELS == 1 || PIXELS == LAST_PAIR_PIXELS, "a lane's one or two pixels");
    __shared__ Vector16<scalar_t> staged_vectors[LAST_WARPS][PIXELS * LAST_STAGED_BYTES_PER_TAP * TAPS / VECTOR_BYTES];
    const LastLaunch launch(total, channels, height, width, groups, out_h, out_w, LANES);
    const index_t C = launch.C, H = launch.H, W = launch.W;
    const int parts = launch.parts;
    scalar_t* staged = reinterpret_cast<scalar_t*>(staged_vectors[launch.warp]);
    for (int base = launch.first; base < launch.items; base += launch.step) {
        const LastItem it = launch.template pair_item<PIXELS>(base, LANES);
        const bool active = it.active, second = PIXELS == 2 && active && it.j + 1 < launch.OW;
        const index_t c0 = it.c0;
        acc_t grad[PIXELS][LANES];
#pragma unroll
        for (int r = 0; r < PIXELS; ++r) {
            const bool present = r == 0 ? active : second;
            Vector16<scalar_t> values;
            if (present) values = *reinterpret_cast<const Vector16<scalar_t>*>(grad_output + ((index_t)it.pixel + r) * C + c0);
            widen_vector<scalar_t>(grad[r], values);
#pragma unroll
            for (int e = 0; e < LANES; ++e) grad[r][e] = present ? grad[r][e] : (acc_t)0;
        }
        const int y0 = it.i * STRIDE - (int)pad_h, x0 = it.j * STRIDE - (int)pad_w;
        const unsigned int columns = active ? columns_inside<COLUMNS>(x0, W) : 0u;
        // The taps this part stages (b mod parts == part; parts is a power of two).
        unsigned int staged_taps = 0;
#pragma unroll
        for (int b = 0; b < KERNEL; ++b) staged_taps |= (b & (parts - 1)) == it.part ? 1u << b : 0u;
        scalar_t* first_taps;
        scalar_t* second_taps;
        {
            // computed again for the copy below: live across the rows, the runs' bounds took
            // registers the taps needed
            const PairRecords records = launch.template pair_records<PIXELS>(base);
            first_taps = staged + records.position(it.record) * TAPS;
            second_taps = staged + records.position(it.record + launch.G) * TAPS;
        }
        const scalar_t* row = input + (((index_t)it.n * H + y0) * W + x0) * C + c0;
        for (int a = 0; a < KERNEL; ++a) {
            const unsigned int inside = row_inside(y0 + a, H) ? columns : 0u;
#pragma unroll
            for (int c_first = 0; c_first < COLUMNS; c_first += LOADED) {
                Vector16<scalar_t> values[LOADED];
                load_vectors<scalar_t, LOADED, COLUMNS>(values, row, C, c_first, inside, input + c0);
#pragma unroll
                for (int u = 0; u < LOADED && c_first + u < COLUMNS; ++u) {
                    const int c = c_first + u;
                    acc_t x[LANES];
                    widen_vector<scalar_t>(x, values[u]);
                    acc_t sum[PIXELS];
#pragma unroll
                    for (int r = 0; r < PIXELS; ++r) {
                        sum[r] = 0;
                        if (r == 0 ? c >= KERNEL : c < STRIDE) continue;  // no tap of pixel r
#pragma unroll
                        for (int e = 0; e < LANES; ++e) sum[r] = oplib_fma(grad[r][e], x[e], sum[r]);
                        if (!((inside >> c) & 1u)) sum[r] = 0;
                    }
                    // The group's parts are adjacent lanes from a multiple of `parts` on: sum over them.
#pragma unroll
                    for (int offset = LAST_MAX_PARTS / 2; offset >= 1; offset >>= 1) {
                        if (offset >= parts) continue;
#pragma unroll
                        for (int r = 0; r < PIXELS; ++r) {
                            if (r == 0 ? c >= KERNEL : c < STRIDE) continue;
                            sum[r] = oplib_add(sum[r], __shfl_xor_sync(OPLIB_FULL_WARP, sum[r], offset));
                        }
                    }
                    if (c < KERNEL && active && (staged_taps >> c) & 1u)
                        first_taps[a * KERNEL + c] = Element<scalar_t>::store(sum[0]);
                    if (PIXELS == 2 && c >= STRIDE && second && (staged_taps >> (c - STRIDE)) & 1u)
                        second_taps[a * KERNEL + c - STRIDE] = Element<scalar_t>::store(sum[PIXELS - 1]);
                }
            }
            row += W * C;  // the next kernel row
        }
        __syncwarp();
        // The warp's records, in runs, out whole.
#pragma unroll 1
        for (int r = 0; r < 3; ++r) {
            const PairRecords records = launch.template pair_records<PIXELS>(base);
            const int start = r == 0 ? records.start[0] : r == 1 ? records.start[1] : records.start[2];
            const int count = (r == 0 ? records.end[0] : r == 1 ? records.end[1] : records.end[2]) - start;
            warp_copy(grad_weight + (index_t)start * TAPS, staged + records.position(start) * TAPS, count * TAPS,
                      launch.lane);
        }
        __syncwarp();  // the staging is free for the next round
    }
}

// grad_input, the same lanes on a block's scale: a block takes a band of LAST_GRAD_INPUT_ROWS
// input rows over a segment of columns, SEGMENT = LAST_THREADS / V pixels (V = C / LANES
// vectors a pixel, a power of two up to LAST_THREADS: the host declines the rest), a lane a
// vector of a group's channels at one column of every row of the band, and
//
//   grad_input[n, y, x, c] = sum over the taps (a, b) with y + ph = i*S + a, x + pw = j*S + b
//                            of weight[n, i, j, g(c), a, b] * grad_output[n, i, j, c].
//
// Why: involution.cu's chunked kernel at a vector a thread loads a tap's weight per lane, from
// a record of its own (the records of a warp's pixels and groups, a line each: 8 to 16 lines a
// load). A weight record's kernel row serves the row's pixels at adjacent columns, so for each
// output row the band reads the block first copies the rows of the records its segment reads
// (the rows the band's input rows take, adjacent in memory, for every group) into shared
// memory with all its threads; then each tap is one grad_output vector load (whole lines, as
// the forward's input) and a shared-memory read of its weight for each of the band's rows. A
// vector, loaded and widened once, serves every row of the band: with a block an input row
// (this kernel before), each tap's load, its address and the 8 conversions of a bfloat16
// vector were for one row's sums, and ptxas kept no staging address across taps (about 14
// instructions a tap to rebuild it); the offline model counts 4.3 instructions a traced one
// here against 6.3 then (bfloat16, stride 1, sm_90) and predicts 0.68x of the time at
// RedNet-50's first stage (bench/results/cuda-model.md). The output row is the block's own, so
// the copy is between two barriers and no thread skips them. Output rows are taken last first,
// so that each input row's kernel rows come in the chunked kernel's order (kernel row, then
// column), and taps with no output pixel are skipped: its bits. Shared memory: the segment's
// records at most (SEGMENT + KERNEL - 1) x G pieces of ROWS x KERNEL values, at most ROWS x
// 256 K^2 bytes at LAST_MIN_GROUP_CHANNELS channels a group or more. A block per band segment,
// grid-stride over them (`total` is their count times LAST_THREADS).
//
// Two rows a band: three spilled (sm_90, stride 2) and took 37 KiB of shared memory a block. A
// lane loads its taps' grad_output vectors LAST_GRAD_INPUT_LOADED at a time: with more in
// registers at once beside the band's sums, ptxas took more than the 64 registers four blocks
// an SM leave and spilled (all of a row's: float32, and bfloat16 at stride 2, on sm_90; four:
// float16 on sm_75 to sm_90, bfloat16 on sm_75 and sm_80; three: float16 on sm_75, sm_80 and
// sm_90), and the offline model finds the kernel bound by instruction issue, not by its loads'
// latency, at two. A band's row past the image (the last band of an odd height) is summed like
// the others and not stored: testing for it at each tap took more instructions everywhere and
// spilled at stride 2 (sm_90), where the row's sums are wasted only at the one RedNet-50 row of
// odd height (stage 4, 7 x 7). There, in bfloat16, the bands leave 256 blocks at batch 32 for an
// H200's 132 SMs, too few warps to issue from, and the model puts this kernel slower than a
// block a row: the one RedNet-50 row where it does.
constexpr int LAST_GRAD_INPUT_ROWS = 2;
constexpr int LAST_GRAD_INPUT_LOADED = 2;

// What grad_input's staging copies at once: a 4-byte unit of two 16-bit values, or one value of
// 4 or 8 bytes. A value at a time, each taking a division, a bound and a 64-bit address, the
// copy took 25 instructions a value on sm_90 (NVRTC), a third of the kernel's instructions in
// bfloat16 at RedNet-50's first stage and more than half at its last, whose segments of 4
// pixels read 320 records an output row. A lane now stages the same unit of each piece it
// copies: 22 instructions a unit of two 16-bit values, 12 a float32 value (sm_90, NVRTC). The
// host passes a weight that starts and ends on a unit's boundary (WEIGHT_UNIT_BYTES: a 16-bit
// weight of an even count of values from a 4-byte boundary) and declines others.
constexpr int WEIGHT_UNIT_BYTES = 4;
template <typename scalar_t, bool WIDE = sizeof(scalar_t) == 8>
struct StagingUnit {
    typedef unsigned int type;
    static_assert(sizeof(type) == WEIGHT_UNIT_BYTES, "the host's unit");
    static constexpr int values = WEIGHT_UNIT_BYTES / (int)sizeof(scalar_t);
};
template <typename scalar_t>
struct StagingUnit<scalar_t, true> {
    typedef unsigned long long type;
    static constexpr int values = 1;
};

template <typename scalar_t, int KERNEL, int STRIDE>
__global__ void __launch_bounds__(LAST_THREADS, LAST_MIN_BLOCKS) involution_backward_input_last(
    const scalar_t* __restrict__ grad_output, const scalar_t* __restrict__ weight, scalar_t* __restrict__ grad_input,
    index_t total, index_t channels, index_t height, index_t width, index_t groups, index_t out_h, index_t out_w,
    index_t pad_h, index_t pad_w) {
    typedef typename Element<scalar_t>::acc_t acc_t;
    constexpr int LANES = Vector16<scalar_t>::lanes;
    constexpr int TAPS = KERNEL * KERNEL;
    constexpr int ROWS = LAST_GRAD_INPUT_ROWS;
    constexpr int RUN = ROWS * KERNEL;  // a piece: the band's kernel rows of one record
    constexpr int PHASE_TAPS = (KERNEL + STRIDE - 1) / STRIDE;  // the taps of a column phase
    constexpr int LOADED = PHASE_TAPS < LAST_GRAD_INPUT_LOADED ? PHASE_TAPS : LAST_GRAD_INPUT_LOADED;
    typedef typename StagingUnit<scalar_t>::type unit_t;
    constexpr int UNIT_VALUES = StagingUnit<scalar_t>::values;
    constexpr int STAGED_UNITS = RUN / UNIT_VALUES;  // a piece's, each from a unit's first value (RUN is even)
    static_assert(RUN % 2 == 0 && TAPS % 2 == 1, "the staging's two-value units take an odd kernel, two rows a band");
    // The copy's lanes: SLOTS a piece, a power of two and at least STAGED_UNITS, so that a
    // thread stages the same unit of pieces PIECES_APART apart (an even count: their first
    // values lie at the same place in a unit of memory).
    constexpr int SLOTS = STAGED_UNITS <= 4 ? 4 : STAGED_UNITS <= 8 ? 8 : STAGED_UNITS <= 16 ? 16 : 32;
    constexpr int PIECES_APART = LAST_THREADS / SLOTS;
    static_assert(STAGED_UNITS <= SLOTS && PIECES_APART % 2 == 0, "a thread's pieces start at one place in a unit");
    constexpr int MAX_PIECES = LAST_THREADS * KERNEL / (int)sizeof(scalar_t);
    __shared__ unit_t staged_units[MAX_PIECES * STAGED_UNITS];
    const scalar_t* staged = reinterpret_cast<const scalar_t*>(staged_units);
    const index_t C = channels;
    const int H = (int)height, W = (int)width, G = (int)groups, OH = (int)out_h, OW = (int)out_w;
    const int ph = (int)pad_h, pw = (int)pad_w;
    const int vectors = (int)(C / LANES), segment = LAST_THREADS / vectors, segments = (W + segment - 1) / segment;
    const int bands = (H + ROWS - 1) / ROWS;
    const int parts = (int)(C / G) / LANES;
    const int tid = (int)threadIdx.x, px = tid / vectors, v = tid - px * vectors, g = v / parts;
    const index_t c0 = (index_t)v * LANES;
    const int tasks = (int)(total / LAST_THREADS);
    const index_t grad_row_step = (index_t)OW * C, weight_row_step = (index_t)OW * G * TAPS;  // an output row's
    for (int task = (int)blockIdx.x; task < tasks; task += (int)gridDim.x) {
        const int band = task / segments, x_first = (task - band * segments) * segment;
        const int y_first = (band % bands) * ROWS, n = band / bands;
        const int x = x_first + px, x_last = (x_first + segment < W ? x_first + segment : W) - 1;
        const bool active = x < W;
        // Tap b reaches column x from output column (x + pw - b) / S when that is an integer
        // in [0, OW): b = b_phase + S t, from output column j_first - t.
        const int b_phase = (x + pw) % STRIDE, j_first = (x + pw - b_phase) / STRIDE;
        // The output columns the segment reads: [j_low, j_high].
        const int reach = x_first + pw - (KERNEL - 1);
        const int j_low_unclamped = reach > 0 ? (reach + STRIDE - 1) / STRIDE : reach / STRIDE;
        const int j_low = j_low_unclamped > 0 ? j_low_unclamped : 0;
        const int j_high = (x_last + pw) / STRIDE < OW - 1 ? (x_last + pw) / STRIDE : OW - 1;
        const int pieces = (j_high - j_low + 1) * G;  // no more than zero when the segment reads none
        // The output rows the band reads, [i_low, i_high]: from output row i, the band's row r
        // (input row y_first + r) takes kernel row a_first + r, a_first = y_first + ph - i S.
        const int rise = y_first + ph - (KERNEL - 1);
        const int i_low_unclamped = rise > 0 ? (rise + STRIDE - 1) / STRIDE : rise / STRIDE;
        const int i_low = i_low_unclamped > 0 ? i_low_unclamped : 0;
        const int i_high = (y_first + ROWS - 1 + ph) / STRIDE < OH - 1 ? (y_first + ROWS - 1 + ph) / STRIDE : OH - 1;
        // Bit t: tap t has an output column (the same at every output row). Tap t's column
        // lies t * C values before tap 0's, and its weight t * (G RUN - S) before tap 0's in the
        // staging.
        unsigned int taps = 0;
#pragma unroll
        for (int t = 0; t < PHASE_TAPS; ++t) {
            const int j = j_first - t;
            taps |= active && b_phase + STRIDE * t < KERNEL && j >= 0 && j < OW ? 1u << t : 0u;
        }
        // The sample's first output row at the lane's first tap, and at the segment's pieces.
        const scalar_t* grad_sample = grad_output + ((index_t)n * OH * OW + j_first) * C + c0;
        const scalar_t* weight_sample = weight + ((index_t)n * OH * OW + j_low) * G * TAPS;
        const scalar_t* first_weight = staged + ((j_first - j_low) * G + g) * RUN + b_phase;
        const int weight_step = G * RUN - STRIDE;
        acc_t sum[ROWS][LANES];
#pragma unroll
        for (int r = 0; r < ROWS; ++r)
#pragma unroll
            for (int e = 0; e < LANES; ++e) sum[r][e] = 0;
        for (int i = i_high; i >= i_low; --i) {
            const int a_first = y_first + ph - i * STRIDE;
            // Value q of piece p (record j_low + p / G, group p % G) is value a_first K + q of
            // the record, where that lies in it (a band's row past the kernel's rows takes none).
            // Piece p, values first .. first + RUN - 1 of record p (from records), is copied to
            // values p RUN ... of the staging in units, a lane a unit: from the unit of memory
            // that holds the same values where the piece's first value is a unit's first, else
            // (every other piece: TAPS is odd) from the second value of one and the first of the
            // next. Only units of memory that hold a value inside the record (the only ones
            // read) are read; such a unit may lie across two records, never past the tensor:
            // the host passes a weight of whole units (WEIGHT_UNIT_BYTES).
            const scalar_t* records = weight_sample + i * weight_row_step;
            const int first = a_first * KERNEL;
            {
                const int slot = tid & (SLOTS - 1), copied = tid / SLOTS;  // the thread's first piece
                const int phase = UNIT_VALUES > 1 ? (int)((size_t)records / sizeof(scalar_t)) & 1 : 0;
                const int shift = UNIT_VALUES > 1 ? (copied * TAPS + first + phase) & 1 : 0;  // its first value's place
                const int value = first + slot * UNIT_VALUES;  // the staged unit's first value, in the record
                const bool inside = (unsigned int)value < TAPS, next_inside = UNIT_VALUES > 1 && (unsigned int)(value + 1) < TAPS;
                const bool own = slot < STAGED_UNITS && (inside || (!shift && next_inside));
                const bool next = slot < STAGED_UNITS && shift && next_inside;
                const unit_t* from = reinterpret_cast<const unit_t*>(records + copied * TAPS + value - shift);
                unit_t* to = staged_units + copied * STAGED_UNITS + slot;
#pragma unroll 1
                for (int p = copied; p < pieces; p += PIECES_APART) {
                    unit_t unit = own ? from[0] : 0;
                    if (UNIT_VALUES > 1 && shift) unit = (unit >> 16) | ((next ? from[1] : 0) << 16);
                    if (slot < STAGED_UNITS) *to = unit;
                    from += PIECES_APART * TAPS / UNIT_VALUES;
                    to += PIECES_APART * STAGED_UNITS;
                }
            }
            __syncthreads();
            const scalar_t* column = grad_sample + i * grad_row_step;
#pragma unroll
            for (int t0 = 0; t0 < PHASE_TAPS; t0 += LOADED) {
                Vector16<scalar_t> values[LOADED];
                load_vectors<scalar_t, LOADED, PHASE_TAPS>(values, column, -C, t0, taps, grad_output + c0);
#pragma unroll
                for (int u = 0; u < LOADED && t0 + u < PHASE_TAPS; ++u) {
                    const int t = t0 + u;
                    if (!((taps >> t) & 1u)) continue;
                    acc_t go[LANES];
                    widen_vector<scalar_t>(go, values[u]);
#pragma unroll
                    for (int r = 0; r < ROWS; ++r) {
                        if ((unsigned int)(a_first + r) >= (unsigned int)KERNEL) continue;  // the band's, whole
                        const acc_t w = widen(first_weight[r * KERNEL - t * weight_step]);
#pragma unroll
                        for (int e = 0; e < LANES; ++e) sum[r][e] = oplib_fma(w, go[e], sum[r][e]);
                    }
                }
            }
            __syncthreads();  // the staging is free for the next output row
        }
#pragma unroll
        for (int r = 0; r < ROWS; ++r) {
            if (!active || y_first + r >= H) continue;
            Vector16<scalar_t> result;
#pragma unroll
            for (int e = 0; e < LANES; ++e) result.lane[e] = Element<scalar_t>::store(sum[r][e]);
            *reinterpret_cast<Vector16<scalar_t>*>(grad_input + ((index_t)(n * H + y_first + r) * W + x) * C + c0) = result;
        }
    }
}
