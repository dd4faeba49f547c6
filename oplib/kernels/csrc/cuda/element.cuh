// What every oplib kernel source shares: the 64-bit index type, the float16/bfloat16 storage
// types with their conversions, per-type load/store/accumulator, and grid-stride loop bounds.
//
// No system or CUDA header is included, so NVRTC needs no include path but this folder's, and
// float16/bfloat16 are converted in plain integer arithmetic (round to nearest even) that runs
// the same on a GPU and in the host emulation of the tests.
#pragma once

typedef long long index_t;

// CuPy compiles with -ftz=true, and an option of ours cannot undo it: float32 arithmetic would
// then flush subnormal inputs and results to zero, where torch's kernels and oplib's CPU path
// keep them. Every float32 multiply and multiply-add here goes through these two, which name
// the IEEE instructions (no .ftz) on the GPU; the host emulation computes the same in C++.
__device__ __forceinline__ float oplib_mul(float a, float b) {
#ifdef __CUDA_ARCH__
    float product;
    asm("mul.rn.f32 %0, %1, %2;" : "=f"(product) : "f"(a), "f"(b));
    return product;
#else
    return a * b;
#endif
}

__device__ __forceinline__ float oplib_fma(float a, float b, float c) {
#ifdef __CUDA_ARCH__
    float result;
    asm("fma.rn.f32 %0, %1, %2, %3;" : "=f"(result) : "f"(a), "f"(b), "f"(c));
    return result;
#else
    return a * b + c;
#endif
}

__device__ __forceinline__ double oplib_fma(double a, double b, double c) { return a * b + c; }

// Storage types of the 16-bit floats: the raw bits of an IEEE binary16 / bfloat16.
struct oplib_half {
    unsigned short bits;
};
struct oplib_bfloat16 {
    unsigned short bits;
};

__device__ __forceinline__ float oplib_half_to_float(unsigned short h) {
    const unsigned int sign = (h & 0x8000u) << 16;
    const unsigned int exponent = (h >> 10) & 0x1fu;
    const unsigned int mantissa = h & 0x3ffu;
    if (exponent == 0) {
        // Zero or subnormal: mantissa * 2^-24, exact in float32.
        const float magnitude = oplib_mul((float)mantissa, 5.9604644775390625e-8f);
        return __uint_as_float(sign | __float_as_uint(magnitude));
    }
    if (exponent == 0x1fu) {
        return __uint_as_float(sign | 0x7f800000u | (mantissa << 13));  // inf / nan
    }
    return __uint_as_float(sign | ((exponent + 112u) << 23) | (mantissa << 13));  // rebias 15 -> 127
}

__device__ __forceinline__ unsigned short oplib_float_to_half(float f) {
    unsigned int u = __float_as_uint(f);
    const unsigned short sign = (unsigned short)((u >> 16) & 0x8000u);
    u &= 0x7fffffffu;
    if (u >= 0x7f800000u) {
        return (unsigned short)(sign | (u > 0x7f800000u ? 0x7e00u : 0x7c00u));  // nan stays nan, inf stays inf
    }
    if (u >= 0x477ff000u) {
        return (unsigned short)(sign | 0x7c00u);  // >= 65520 rounds to inf
    }
    if (u < 0x38800000u) {
        // Below the smallest normal half (2^-14): the result is round(|f| * 2^24) units of 2^-24,
        // rounded to nearest even; a result of 1024 is the smallest normal, as it should be.
        return (unsigned short)(sign | (unsigned short)rintf(oplib_mul(__uint_as_float(u), 16777216.0f)));
    }
    // Normal: rebias the exponent (127 -> 15) and round the 13 dropped bits to nearest even.
    const unsigned int odd = (u >> 13) & 1u;
    u += 0xc8000fffu + odd;
    return (unsigned short)(sign | (u >> 13));
}

__device__ __forceinline__ float oplib_bfloat16_to_float(unsigned short b) {
    return __uint_as_float((unsigned int)b << 16);
}

__device__ __forceinline__ unsigned short oplib_float_to_bfloat16(float f) {
    const unsigned int u = __float_as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) {
        return (unsigned short)((u >> 16) | 0x40u);  // quiet nan
    }
    const unsigned int odd = (u >> 16) & 1u;
    return (unsigned short)((u + 0x7fffu + odd) >> 16);  // round to nearest even
}

// Per storage type: the accumulator type, a read-only cached load and a rounding store. float
// and double are their own accumulators.
template <typename scalar_t>
struct Element {
    typedef scalar_t acc_t;
    static __device__ __forceinline__ scalar_t load(const scalar_t* p) { return __ldg(p); }
    static __device__ __forceinline__ scalar_t value(scalar_t v) { return v; }
    static __device__ __forceinline__ scalar_t store(scalar_t v) { return v; }
};

// The 16-bit types' conversions, by overload: to float exactly, from float rounded to nearest even.
__device__ __forceinline__ float oplib_to_float(oplib_half v) { return oplib_half_to_float(v.bits); }
__device__ __forceinline__ float oplib_to_float(oplib_bfloat16 v) { return oplib_bfloat16_to_float(v.bits); }
__device__ __forceinline__ void oplib_round(float v, oplib_half& h) { h.bits = oplib_float_to_half(v); }
__device__ __forceinline__ void oplib_round(float v, oplib_bfloat16& b) { b.bits = oplib_float_to_bfloat16(v); }

// half and bfloat16: loaded as their 16 bits, accumulated in float.
template <typename half_t>
struct Element16 {
    typedef float acc_t;
    static __device__ __forceinline__ float load(const half_t* p) {
        half_t v;
        v.bits = __ldg(reinterpret_cast<const unsigned short*>(p));
        return oplib_to_float(v);
    }
    static __device__ __forceinline__ float value(half_t v) { return oplib_to_float(v); }
    static __device__ __forceinline__ half_t store(float v) {
        half_t h;
        oplib_round(v, h);
        return h;
    }
};

template <>
struct Element<oplib_half> : Element16<oplib_half> {};

template <>
struct Element<oplib_bfloat16> : Element16<oplib_bfloat16> {};

// The bytes of the vectors channels_last kernels move: one load or store instruction
// (ld.global.v4 / st.global.v4). The host checks channel counts and pointer alignment against
// this line (oplib.kernels.involution.cuda reads it).
constexpr int VECTOR_BYTES = 16;

// VECTOR_BYTES of one storage type, aligned for that one instruction.
template <typename scalar_t>
struct alignas(VECTOR_BYTES) Vector16 {
    static constexpr int lanes = VECTOR_BYTES / sizeof(scalar_t);
    scalar_t lane[lanes];
};

__device__ __forceinline__ index_t oplib_first_index() {
    return (index_t)blockIdx.x * blockDim.x + threadIdx.x;
}

__device__ __forceinline__ index_t oplib_grid_step() {
    return (index_t)blockDim.x * gridDim.x;
}
