// The vector layer of the native CPU kernels.
//
// Vectors are the GCC/clang vector extension (`vector_size` types with element-wise
// arithmetic, a scalar operand broadcast, lane subscripts and __builtin_shufflevector), which
// both compilers lower to the target's own instructions: AVX-512 or AVX2 on x86-64, SSE2 on
// baseline x86-64, NEON on aarch64. The widest vector is 64 bytes where AVX-512 is on, 32
// bytes elsewhere (two registers on SSE2 and NEON, still one loop body). Intrinsics appear
// only inside `#if` blocks that name their instruction set, each beside a generic path that
// gives the same values, so every target computes the same sums in the same order.

#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <utility>

#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#if defined(__AVX512F__) || defined(__AVX2__)
#include <immintrin.h>
#endif

namespace oplib_cpu {

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

// Vector registers a kernel may plan its sums for: AVX-512 has 32 of its 64-byte registers;
// AVX2 has 16, and SSE2 and NEON hold a 32-byte vector in two of theirs.
constexpr int kVectorRegisters = kWideBytes == 64 ? 32 : 16;

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

// Two-input shuffles: lane i of shuffle<Pick, LANES>(a, b) is lane Pick::lane(i) of a and b
// side by side (index LANES + k is b's lane k). GCC before 12 has only __builtin_shuffle,
// which takes the indices as a vector.
template <typename Pick, typename V, size_t... I>
inline V shuffle_lanes(const V& a, const V& b, std::index_sequence<I...>) {
#if defined(__clang__) || !defined(__GNUC__) || __GNUC__ >= 12
  return __builtin_shufflevector(a, b, Pick::lane(I)...);
#else
  using Index = std::conditional_t<sizeof(a[0]) == 8, int64_t, int32_t>;
  using Mask = typename Lanes<Index, sizeof...(I)>::type;
  return __builtin_shuffle(a, b, Mask{static_cast<Index>(Pick::lane(I))...});
#endif
}

template <typename Pick, int LANES, typename V>
inline V shuffle(const V& a, const V& b) {
  return shuffle_lanes<Pick>(a, b, std::make_index_sequence<LANES>{});
}

// LANES x LANES blocks are transposed in registers, between a plane's rows (one channel,
// LANES columns per vector) and channel rows (one column, LANES channels per vector): each
// round of two-input shuffles swaps one bit of the row index with that bit of the lane index.
// Row r (bit clear) takes lane i from row r + BIT's lane i - BIT where i has the bit, row
// r + BIT takes lane i from row r's lane i + BIT where i lacks it.
template <int LANES, int BIT, bool UPPER>
struct Butterfly {
  static constexpr int lane(size_t i) {
    const int k = static_cast<int>(i);
    return UPPER ? ((k & BIT) ? LANES + k : k + BIT) : ((k & BIT) ? LANES + k - BIT : k);
  }
};

template <typename T, int LANES, int BIT = 1>
inline void transpose(typename Lanes<T, LANES>::type* rows) {
  if constexpr (BIT < LANES) {
    for (int r = 0; r < LANES; ++r) {
      if (r & BIT) continue;
      const auto a = rows[r], b = rows[r + BIT];
      rows[r] = shuffle<Butterfly<LANES, BIT, false>, LANES>(a, b);
      rows[r + BIT] = shuffle<Butterfly<LANES, BIT, true>, LANES>(a, b);
    }
    transpose<T, LANES, BIT * 2>(rows);
  }
}

// Lanes that have BIT from one input (FROM_A: the first), the others from the second.
template <int LANES, int BIT, bool FROM_A>
struct Blend {
  static constexpr int lane(size_t i) {
    const int k = static_cast<int>(i);
    return ((k & BIT) != 0) == FROM_A ? k : LANES + k;
  }
};

// Lane i ^ BIT of the first input.
template <int BIT>
struct SwapPairs {
  static constexpr int lane(size_t i) { return static_cast<int>(i) ^ BIT; }
};

// The LANES outputs' sums, each across its vector: product(c) is output c's vector of
// products; lane c of the result is the sum of product(c)'s lanes. Pairs of vectors are
// shuffled and added as in transpose, halves first (few vectors live at once).
template <typename T, int LANES, int FIRST, int SPAN, typename Product>
inline typename Lanes<T, LANES>::type sum_lanes(Product&& product) {
  if constexpr (SPAN == 1) {
    return product(FIRST);
  } else {
    // Pairing a (outputs FIRST...) with b (outputs FIRST + BIT...): lane i keeps a's lane
    // where i lacks BIT, b's where it has it, and adds the partner lane i ^ BIT of the same input.
    constexpr int BIT = SPAN / 2;
    const auto a = sum_lanes<T, LANES, FIRST, BIT>(product), b = sum_lanes<T, LANES, FIRST + BIT, BIT>(product);
    const auto partner = shuffle<Blend<LANES, BIT, true>, LANES>(a, b);
    return shuffle<Blend<LANES, BIT, false>, LANES>(a, b) + shuffle<SwapPairs<BIT>, LANES>(partner, partner);
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
#elif defined(__AVX2__)
    // GCC turns the loop below into a memcpy, expanded as `rep movs`, whose start-up cost
    // dominates a copy of a few values: 15% of grad_weight's time at RedNet's 14-wide maps
    // on AVX2 (bench/results/native-ab.md measured the channel-lane kernel 5-8% slower than
    // the previous build, which had inlined it elsewhere).
    if (stride == 1) {
      if constexpr (std::is_same_v<acc_t, float> && LANES == 8) {
        const __m256i first = _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(count)), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
        return reinterpret_cast<V>(_mm256_maskload_ps(src, first));
      }
      if constexpr (std::is_same_v<acc_t, float> && LANES == 4) {
        const __m128i first = _mm_cmpgt_epi32(_mm_set1_epi32(static_cast<int>(count)), _mm_setr_epi32(0, 1, 2, 3));
        return reinterpret_cast<V>(_mm_maskload_ps(src, first));
      }
      if constexpr (std::is_same_v<acc_t, double> && LANES == 4) {
        const __m256i first = _mm256_cmpgt_epi64(_mm256_set1_epi64x(count), _mm256_setr_epi64x(0, 1, 2, 3));
        return reinterpret_cast<V>(_mm256_maskload_pd(src, first));
      }
    }
#endif
  }
  V v = {};
  for (int64_t l = 0; l < count; ++l) v[l] = static_cast<acc_t>(src[l * stride]);
  return v;
}

// `count` 16-bit values: a whole vector in one store; a partial one (a row's end) by a memcpy
// of variable length, a library call, which the whole vectors must not pay.
template <int LANES, typename T>
inline void store_bits(T* to, const void* bits, int64_t count) {
  static_assert(sizeof(T) == 2, "16-bit values");
  if (count == LANES) {
    std::memcpy(to, bits, 2 * LANES);
  } else {
    std::memcpy(to, bits, 2 * count);
  }
}

// The first `count` float lanes of v to `to` as BFloat16, rounded as c10 rounds one value (to
// nearest even, a NaN to the quiet NaN), every lane at once: c10's conversion of one value,
// inlined at each store of an unrolled kernel (49 taps x its row slots) and vectorised there
// by the compiler, made the pixel-lane grad_weight's unit most of the first-use build.
template <int LANES, typename V>
inline void store_bfloat16(c10::BFloat16* to, const V& v, int64_t count) {
  using Bits = typename Lanes<uint32_t, LANES>::type;
  using Halves = typename Lanes<uint16_t, LANES>::type;
  const Bits bits = reinterpret_cast<Bits>(v);
  const Bits rounded = (bits + (((bits >> 16) & 1u) + 0x7FFFu)) >> 16;
  const Halves result = __builtin_convertvector(v != v ? Bits{} + 0x7FC0u : rounded, Halves);
  store_bits<LANES>(to, &result, count);
}

// The same for Half where the target converts vectors (F16C: the instruction c10 uses for one
// value, so the same bits); elsewhere c10's conversion, value by value. Returns false where
// LANES has no vector conversion.
template <int LANES, typename V>
inline bool store_half(c10::Half* to, const V& v, int64_t count) {
#if defined(__F16C__)
  uint16_t result[LANES];
  if constexpr (LANES == 16) {
#if defined(__AVX512F__)
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(result), _mm512_cvtps_ph(reinterpret_cast<__m512>(v), _MM_FROUND_TO_NEAREST_INT));
#else
    return false;
#endif
  } else if constexpr (LANES == 8) {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(result), _mm256_cvtps_ph(reinterpret_cast<__m256>(v), _MM_FROUND_TO_NEAREST_INT));
  } else if constexpr (LANES == 4) {
    _mm_storel_epi64(reinterpret_cast<__m128i*>(result), _mm_cvtps_ph(reinterpret_cast<__m128>(v), _MM_FROUND_TO_NEAREST_INT));
  } else {
    return false;
  }
  store_bits<LANES>(to, result, count);
  return true;
#else
  return false;
#endif
}

// The first `count` lanes of v to `to`, converted (a partial block ends every row of a map
// whose width is no multiple of LANES: RedNet's 7-, 14-, 28- and 56-wide maps all have one,
// and the 7- and 14-wide ones have nothing else).
template <int LANES, typename scalar_t, typename V>
inline void store_first(scalar_t* to, const V& v, int64_t count) {
  using T = std::remove_cv_t<std::remove_reference_t<decltype(v[0])>>;
  if constexpr (std::is_same_v<scalar_t, c10::BFloat16> && std::is_same_v<T, float>) {
    return store_bfloat16<LANES>(to, v, count);
  }
  if constexpr (std::is_same_v<scalar_t, c10::Half> && std::is_same_v<T, float>) {
    if (store_half<LANES>(to, v, count)) return;
  }
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

// A stored vector that skips the cache where the target has a streaming store for it and
// `to` is a whole aligned line (the result of grad_weight is large and not read again here):
// AVX-512 float vectors; elsewhere an ordinary store. Returns nothing either way; call
// stream_fence() before the written lines count as done.
template <typename T, int LANES, typename V>
inline void store_streaming(T* to, const V& v) {
#if defined(__AVX512F__)
  if constexpr (std::is_same_v<T, float> && LANES == 16) {
    if (reinterpret_cast<uintptr_t>(to) % 64 == 0) {
      _mm512_stream_ps(to, reinterpret_cast<__m512>(v));
      return;
    }
  }
#endif
  store_lanes(to, v);
}

// count values from `from` (in the cache) to `to`, whole aligned lines past the cache where
// the target has streaming stores.
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

// Streamed lines are visible to other threads once this returns.
inline void stream_fence() {
#if defined(__AVX512F__)
  _mm_sfence();
#endif
}

// The next output row's weights: one row per tap, a (Ho, Wo) plane apart, more streams than
// the hardware prefetcher follows. They go to L2 (locality 2), not L1: a whole row's worth
// (49 taps for K = 7) sent to L1 at once saved less than half as much (interleaved, 64@56
// forward, batch 8, 2 threads: 2.48 ms to L1, 1.93 ms to L2).
template <typename T>
inline void prefetch_rows(const T* first, int64_t rows, int64_t row_stride, int64_t count) {
  constexpr int64_t kLine = 64 / sizeof(T);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t j = 0; j < count; j += kLine) __builtin_prefetch(first + r * row_stride + j, 0, 2);
  }
}

}  // namespace oplib_cpu
