// What the tensor-core kernels (generated_mma.cu, dense_window.cu) share to hold a float
// weight in two values of a 16-bit storage type, hi = w rounded and lo = (w - hi) rounded, whose
// sum keeps a float's 16 top bits and more where hi alone would round w as the span conv's
// output does: the rounding of two floats into a word, a 16-bit value's float, the rest, the
// product of a split pair with two n-tiles, and the check of its sums for an inf or a nan.
//
// Like element.cuh, no system or CUDA header is included; the host emulation runs all of it.
#pragma once

#include "warp.cuh"

// Whether v is neither inf nor nan: its exponent bits, the sign shifted out, are not all ones
// (on the bits: NVRTC makes a float comparison a flushing one under CuPy's -ftz=true).
__device__ __forceinline__ bool mma_finite(float v) { return __float_as_uint(v) << 1 < 0xff000000u; }

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

// sums[t] += (hi + lo) x b[t] for the two n-tiles t: a split weight's A fragments, hi's product
// then lo's into each accumulator (the order every caller's bits rest on).
template <typename half_t>
__device__ __forceinline__ void mma_split_products(OplibFragmentC (&sums)[2], const OplibFragmentA& hi,
                                                   const OplibFragmentA& lo, const OplibFragmentB& low,
                                                   const OplibFragmentB& high) {
    oplib_mma<half_t>(sums[0], hi, low);
    oplib_mma<half_t>(sums[1], hi, high);
    oplib_mma<half_t>(sums[0], lo, low);
    oplib_mma<half_t>(sums[1], lo, high);
}

// Whether any of a warp's two D fragments holds an inf or a nan (every lane gets the answer).
__device__ __forceinline__ bool mma_any_non_finite(const OplibFragmentC (&sums)[2]) {
    unsigned int bad = 0;
#pragma unroll
    for (int t = 0; t < 2; ++t) {
#pragma unroll
        for (int v = 0; v < 4; ++v) bad |= mma_finite(sums[t].value[v]) ? 0u : 1u;
    }
    return oplib_warp_any(bad != 0);
}
