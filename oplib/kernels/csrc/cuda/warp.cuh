// What kernels whose threads cooperate share: dynamic shared memory, sums over a warp's lanes
// by shuffles, and the tensor-core product mma.m16n8k16 on float16/bfloat16 fragments.
//
// Like element.cuh, no system or CUDA header is included. The host emulation
// (oplib/testing/cuda_host_shim.h) runs all of this: its shuffles move values between the
// fibers of a warp's lanes, and the tensor-core product, below sm_80 and on the host, is
// computed from the very fragments each lane holds, fetched from the other lanes by
// shuffles, so a fragment loaded in the wrong layout gives wrong numbers there too.
#pragma once

#include "element.cuh"

constexpr unsigned int OPLIB_FULL_WARP = 0xffffffffu;

// `type* name`: the block's dynamic shared memory (the launch's shared_bytes), 16-byte
// aligned. (A template cannot declare `extern __shared__ T name[]` for more than one T, so
// the bytes are declared once and cast; the host shim defines its own.)
#ifndef OPLIB_DYNAMIC_SHARED
#define OPLIB_DYNAMIC_SHARED(type, name)                                   \
    extern __shared__ __align__(16) unsigned char oplib_dynamic_shared[]; \
    type* name = reinterpret_cast<type*>(oplib_dynamic_shared)
#endif

// Marks a block of code that runs only for an inf or a nan (the `oplib-cold` blocks): nothing on
// the GPU; the host emulation counts its runs, so that a check on finite values can require
// none (a kernel that read shared memory before writing it would read the emulation's nans
// and take such a block, which may well give the right result from global memory).
#ifndef OPLIB_COLD_BLOCK
#define OPLIB_COLD_BLOCK() ((void)0)
#endif

// The calling thread's lane: its linear index in the block modulo the warp size.
__device__ __forceinline__ int oplib_lane() {
    return (int)((threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z)) % 32u);
}

// Whether v holds for any lane of the (whole, converged) warp: one vote on the GPU; on the host,
// whose shim has shuffles and no votes, a butterfly of them (the same answer in every lane).
__device__ __forceinline__ bool oplib_warp_any(bool v) {
#ifdef __CUDA_ARCH__
    return __any_sync(OPLIB_FULL_WARP, v) != 0;
#else
    unsigned int any = v ? 1u : 0u;
    for (int offset = 16; offset > 0; offset >>= 1) any |= __shfl_xor_sync(OPLIB_FULL_WARP, any, offset);
    return any != 0;
#endif
}

// a + b, IEEE in float32 (no flush of subnormals under CuPy's -ftz=true, as oplib_fma).
__device__ __forceinline__ float oplib_add(float a, float b) {
#ifdef __CUDA_ARCH__
    float sum;
    asm("add.rn.f32 %0, %1, %2;" : "=f"(sum) : "f"(a), "f"(b));
    return sum;
#else
    return a + b;
#endif
}

__device__ __forceinline__ double oplib_add(double a, double b) { return a + b; }

// The sum of `value` over the lanes whose index differs from the caller's only in the bits
// LOW..HIGH (powers of two, LOW <= HIGH): <1, 16> sums the whole warp, <16, 16> each lane
// with the lane 16 away. Every lane of the warp must call it; each gets its group's sum, the
// same bits in every lane of the group (a butterfly of shuffles, HIGH first).
template <int LOW, int HIGH, typename T>
__device__ __forceinline__ T oplib_warp_sum(T value) {
    static_assert(LOW > 0 && (LOW & (LOW - 1)) == 0 && HIGH >= LOW && HIGH <= 16 && (HIGH & (HIGH - 1)) == 0,
                  "LOW and HIGH are powers of two up to 16");
#pragma unroll
    for (int offset = HIGH; offset >= LOW; offset >>= 1) {
        value = oplib_add(value, __shfl_xor_sync(OPLIB_FULL_WARP, value, offset));
    }
    return value;
}

// ---------------------------------------------------------------------------------------
// Tensor cores: D = A B + C of shape m16n8k16, A and B float16 or bfloat16, C and D float
// ---------------------------------------------------------------------------------------
//
// The fragments of the warp's 32 lanes, in the layout of the PTX ISA ("Matrix Fragments for
// mma.m16n8k16 with floating point type"). With group = lane / 4 and quad = lane % 4, a lane
// holds (a 32-bit register holds two 16-bit values, the lower column or row in its lower half):
//
//   A (16 x 16, row-major)    a[0]: row group,     columns 2 quad, 2 quad + 1
//                             a[1]: row group + 8, columns 2 quad, 2 quad + 1
//                             a[2]: row group,     columns 2 quad + 8, 2 quad + 9
//                             a[3]: row group + 8, columns 2 quad + 8, 2 quad + 9
//   B (16 x 8, column-major)  b[0]: rows 2 quad, 2 quad + 1 of column group
//                             b[1]: rows 2 quad + 8, 2 quad + 9 of column group
//   C, D (16 x 8, float)      c[0], c[1]: row group,     columns 2 quad, 2 quad + 1
//                             c[2], c[3]: row group + 8, columns 2 quad, 2 quad + 1
struct OplibFragmentA {
    unsigned int reg[4];
};
struct OplibFragmentB {
    unsigned int reg[2];
};
struct OplibFragmentC {
    float value[4];
};

// COUNT 8 x 8 matrices of 16-bit values from shared memory, by ldmatrix: lane 8 i + r gives
// the address of matrix i's row r, 16 bytes (4 words) 16-byte aligned; lane (group, quad) gets
// word quad of row group of matrix i in reg[i], or, TRANSPOSED (ldmatrix .trans), the values of
// column `group` at rows 2 quad and 2 quad + 1 (the first in the lower half). One instruction
// where the fragments' plain loads take 2 COUNT: their words go through the same banks (a
// matrix's 8 rows of 16 bytes are one pass when they fall in different banks, as the layouts' 4
// words of padding, or the generator's swapped halves, make them). Every lane of the warp calls
// it, lanes past 8 COUNT with an address of the same matrices (the hardware ignores it). The asm
// names no memory: a barrier before it (__syncwarp, __syncthreads) orders it after the tile's
// stores, as for any load, and the emulation stops where one is missing. On the host, each lane
// reads its row and the words go to their lanes by shuffles (transposed, a lane's two values
// out of two lanes' rows shuffled whole), each address checked as the hardware takes it
// (oplib_check_matrix_row: in the block's shared memory, aligned).
template <int COUNT, bool TRANSPOSED = false>
__device__ __forceinline__ void oplib_load_matrices(const unsigned int* row, unsigned int (&reg)[COUNT]) {
    static_assert(COUNT == 1 || COUNT == 2 || COUNT == 4, "ldmatrix loads 1, 2 or 4 matrices");
#ifdef __CUDA_ARCH__  // every target (sm_75 and newer) has ldmatrix
    // The builtin, not a cvta in asm: the compiler then keeps the rows' addresses as 32-bit
    // shared offsets (an asm's operand made it form each 64-bit generic address first, three
    // instructions a load, rematerialised in the loops).
    const unsigned int address = (unsigned int)__cvta_generic_to_shared(row);
    if constexpr (COUNT == 4 && TRANSPOSED) {
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];"
                     : "=r"(reg[0]), "=r"(reg[1]), "=r"(reg[2]), "=r"(reg[3])
                     : "r"(address));
    } else if constexpr (COUNT == 4) {
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
                     : "=r"(reg[0]), "=r"(reg[1]), "=r"(reg[2]), "=r"(reg[3])
                     : "r"(address));
    } else if constexpr (COUNT == 2 && TRANSPOSED) {
        asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0, %1}, [%2];"
                     : "=r"(reg[0]), "=r"(reg[1])
                     : "r"(address));
    } else if constexpr (COUNT == 2) {
        asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0, %1}, [%2];" : "=r"(reg[0]), "=r"(reg[1]) : "r"(address));
    } else if constexpr (TRANSPOSED) {
        asm volatile("ldmatrix.sync.aligned.m8n8.x1.trans.shared.b16 {%0}, [%1];" : "=r"(reg[0]) : "r"(address));
    } else {
        asm volatile("ldmatrix.sync.aligned.m8n8.x1.shared.b16 {%0}, [%1];" : "=r"(reg[0]) : "r"(address));
    }
#elif defined(__CUDACC__)
    // nvcc's host pass, which parses device code it never runs (the emulation's checks are the
    // host shim's).
    (void)row;
#pragma unroll
    for (int i = 0; i < COUNT; ++i) reg[i] = 0u;
#else
    // Each lane reads its row where it stands in its warp's run, as its plain loads would, and
    // reads it again once every lane has reached the load (the first shuffle's release): a
    // write by another lane in between, a __syncwarp left out, stops the launch there, and the
    // words that go to the lanes are the first read's (stale, in the order that races).
    const int lane = oplib_lane(), group = lane >> 2, quad = lane & 3;
    const bool reads = lane < 8 * COUNT;
    // The row's words 2 h, 2 h + 1 as one shuffle's value.
    const auto half_row = [row](int h) { return row[2 * h] | (unsigned long long)row[2 * h + 1] << 32; };
    // Value `group` of a row shuffled whole: its word group / 2, the half group & 1.
    const auto value = [group](unsigned long long low, unsigned long long high) {
        const unsigned long long words = group < 4 ? low : high;
        return (unsigned int)(words >> 32 * (group >> 1 & 1)) >> 16 * (group & 1) & 0xffffu;
    };
    unsigned long long halves[2] = {};
    if (reads) {
        oplib_check_matrix_row(row);
        halves[0] = half_row(0);
        halves[1] = half_row(1);
    }
#pragma unroll
    for (int i = 0; i < COUNT; ++i) {
        // the rows of lanes 8 i + group (plain), or 8 i + 2 quad and the next (transposed)
        const int first = TRANSPOSED ? 8 * i + 2 * quad : 8 * i + group;
        const unsigned long long low = __shfl_sync(OPLIB_FULL_WARP, halves[0], first);
        if (i == 0 && reads) oplib_check_matrix_row_unchanged(halves[0] == half_row(0) && halves[1] == half_row(1));
        const unsigned long long high = __shfl_sync(OPLIB_FULL_WARP, halves[1], first);
        if constexpr (TRANSPOSED) {
            const unsigned long long next_low = __shfl_sync(OPLIB_FULL_WARP, halves[0], first + 1);
            const unsigned long long next_high = __shfl_sync(OPLIB_FULL_WARP, halves[1], first + 1);
            reg[i] = value(low, high) | value(next_low, next_high) << 16;
        } else {
            reg[i] = (unsigned int)((quad < 2 ? low : high) >> 32 * (quad & 1));
        }
    }
#endif
}

// A from a 16 x 16 tile of 16-bit values in pairs in shared memory: row m's 16 values are the
// 8 words words[m * stride ...], word j holding columns 2j (lower half) and 2j + 1; words and
// stride 16-byte aligned. Matrix i: rows 8 (i & 1) .. + 7, words 4 (i >> 1) .. + 3.
__device__ __forceinline__ OplibFragmentA oplib_load_fragment_a(const unsigned int* words, int stride) {
    const int lane = oplib_lane();
    OplibFragmentA a;
    oplib_load_matrices<4>(words + ((lane & 7) + 8 * (lane >> 3 & 1)) * stride + 4 * (lane >> 4), a.reg);
    return a;
}

// A from a 16 x 16 tile held column by column in shared memory: column k's 16 values are the 8
// words words[k * stride ...], word j holding rows 2j (lower half) and 2j + 1; words and stride
// 16-byte aligned. Matrix i: columns 8 (i >> 1) .. + 7, words 4 (i & 1) .. + 3, transposed.
__device__ __forceinline__ OplibFragmentA oplib_load_fragment_a_transposed(const unsigned int* words, int stride) {
    const int lane = oplib_lane();
    OplibFragmentA a;
    oplib_load_matrices<4, true>(words + ((lane & 7) + 8 * (lane >> 4)) * stride + 4 * (lane >> 3 & 1), a.reg);
    return a;
}

// B from a 16 x 8 tile held column by column in shared memory: column n's 16 values are the 8
// words words[n * stride ...], word j holding rows 2j (lower half) and 2j + 1; words and stride
// 16-byte aligned. Matrix i: the 8 columns' words 4 i .. + 3.
__device__ __forceinline__ OplibFragmentB oplib_load_fragment_b(const unsigned int* words, int stride) {
    const int lane = oplib_lane();
    OplibFragmentB b;
    oplib_load_matrices<2>(words + (lane & 7) * stride + 4 * (lane >> 3 & 1), b.reg);
    return b;
}

// Two B tiles as oplib_load_fragment_b loads each, the second `second` words after the first
// (the next n-tile, or the next k-step): one ldmatrix.
__device__ __forceinline__ void oplib_load_fragments_b(const unsigned int* words, int stride, int second,
                                                       OplibFragmentB& first_b, OplibFragmentB& second_b) {
    const int lane = oplib_lane();
    unsigned int reg[4];
    oplib_load_matrices<4>(words + (lane >> 4) * second + (lane & 7) * stride + 4 * (lane >> 3 & 1), reg);
    first_b.reg[0] = reg[0];
    first_b.reg[1] = reg[1];
    second_b.reg[0] = reg[2];
    second_b.reg[1] = reg[3];
}

// D's element (m, n) to tile[m * row_step + n * column_step].
__device__ __forceinline__ void oplib_store_fragment_c(const OplibFragmentC& d, float* tile, int row_step,
                                                       int column_step) {
    const int lane = oplib_lane(), group = lane >> 2, quad = lane & 3;
    tile[group * row_step + 2 * quad * column_step] = d.value[0];
    tile[group * row_step + (2 * quad + 1) * column_step] = d.value[1];
    tile[(group + 8) * row_step + 2 * quad * column_step] = d.value[2];
    tile[(group + 8) * row_step + (2 * quad + 1) * column_step] = d.value[3];
}

// The float values of a register's two 16-bit halves.
template <typename half_t>
__device__ __forceinline__ float oplib_low_half(unsigned int pair) {
    half_t v;
    v.bits = (unsigned short)(pair & 0xffffu);
    return oplib_to_float(v);
}

template <typename half_t>
__device__ __forceinline__ float oplib_high_half(unsigned int pair) {
    half_t v;
    v.bits = (unsigned short)(pair >> 16);
    return oplib_to_float(v);
}

// acc += the products of two registers' halves: a's columns k, k + 1 with b's rows k, k + 1.
template <typename half_t>
__device__ __forceinline__ float oplib_pair_fma(unsigned int a, unsigned int b, float acc) {
    acc = oplib_fma(oplib_low_half<half_t>(a), oplib_low_half<half_t>(b), acc);
    return oplib_fma(oplib_high_half<half_t>(a), oplib_high_half<half_t>(b), acc);
}

// acc += A B from the fragments alone, as mma.m16n8k16 does, for targets without it (sm_75)
// and the host: a lane's outputs are row group and group + 8, columns 2 quad and 2 quad + 1,
// so it takes rows group, group + 8 of A from the four lanes of its group, and columns
// 2 quad, 2 quad + 1 of B from the lanes of groups 2 quad and 2 quad + 1, one k-slice (the
// pairs a source quad holds) at a time. Products of 16-bit values are exact in float.
template <typename half_t>
__device__ __forceinline__ void oplib_mma_by_shuffles(OplibFragmentC& acc, const OplibFragmentA& a,
                                                      const OplibFragmentB& b) {
    const int lane = oplib_lane(), group = lane >> 2, quad = lane & 3;
#pragma unroll
    for (int source = 0; source < 4; ++source) {
        // Columns 2 source, +1 (low) and 2 source + 8, +9 (high) of rows group and group + 8.
        const int a_lane = group * 4 + source;
        const unsigned int row_low = __shfl_sync(OPLIB_FULL_WARP, a.reg[0], a_lane);
        const unsigned int row8_low = __shfl_sync(OPLIB_FULL_WARP, a.reg[1], a_lane);
        const unsigned int row_high = __shfl_sync(OPLIB_FULL_WARP, a.reg[2], a_lane);
        const unsigned int row8_high = __shfl_sync(OPLIB_FULL_WARP, a.reg[3], a_lane);
#pragma unroll
        for (int j = 0; j < 2; ++j) {
            // The same rows of B (k) in column 2 quad + j, held by group 2 quad + j's lane `source`.
            const int b_lane = (2 * quad + j) * 4 + source;
            const unsigned int column_low = __shfl_sync(OPLIB_FULL_WARP, b.reg[0], b_lane);
            const unsigned int column_high = __shfl_sync(OPLIB_FULL_WARP, b.reg[1], b_lane);
            acc.value[j] = oplib_pair_fma<half_t>(row_high, column_high,
                                                  oplib_pair_fma<half_t>(row_low, column_low, acc.value[j]));
            acc.value[2 + j] = oplib_pair_fma<half_t>(row8_high, column_high,
                                                      oplib_pair_fma<half_t>(row8_low, column_low, acc.value[2 + j]));
        }
    }
}

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
#define OPLIB_MMA_M16N8K16(type)                                                                            \
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32." type "." type                                      \
                 ".f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"                        \
                 : "+f"(acc.value[0]), "+f"(acc.value[1]), "+f"(acc.value[2]), "+f"(acc.value[3])           \
                 : "r"(a.reg[0]), "r"(a.reg[1]), "r"(a.reg[2]), "r"(a.reg[3]), "r"(b.reg[0]), "r"(b.reg[1]))

__device__ __forceinline__ void oplib_mma_instruction(OplibFragmentC& acc, const OplibFragmentA& a,
                                                      const OplibFragmentB& b, oplib_half) {
    OPLIB_MMA_M16N8K16("f16");
}

__device__ __forceinline__ void oplib_mma_instruction(OplibFragmentC& acc, const OplibFragmentA& a,
                                                      const OplibFragmentB& b, oplib_bfloat16) {
    OPLIB_MMA_M16N8K16("bf16");
}
#endif

// acc += A B for the warp (every lane calls it with its fragments): on sm_80 and newer one
// tensor-core instruction, elsewhere oplib_mma_by_shuffles.
template <typename half_t>
__device__ __forceinline__ void oplib_mma(OplibFragmentC& acc, const OplibFragmentA& a, const OplibFragmentB& b) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    oplib_mma_instruction(acc, a, b, half_t());
#else
    oplib_mma_by_shuffles<half_t>(acc, a, b);
#endif
}

// ---------------------------------------------------------------------------------------
// Tensor cores in TF32: D = A B + C of shape m16n8k8, A and B TF32, C and D float
// ---------------------------------------------------------------------------------------
//
// TF32 is a float's sign, exponent and top 10 mantissa bits (the tensor cores ignore the other
// 13), held in a 32-bit register. The fragments (PTX ISA, "Matrix Fragments for mma.m16n8k8"
// of .tf32), with group = lane / 4 and quad = lane % 4:
//
//   A (16 x 8, row-major)    a[0]: (group, quad)    a[1]: (group + 8, quad)
//                            a[2]: (group, quad + 4) a[3]: (group + 8, quad + 4)
//   B (8 x 8, column-major)  b[0]: (quad, group)    b[1]: (quad + 4, group)
//   C, D (16 x 8, float)     as m16n8k16's
//
// A float32 product takes three of them (3xTF32): x = hi + lo, hi = x rounded to TF32 and lo =
// x - hi rounded again, and a b ~ a_lo b_hi + a_hi b_lo + a_hi b_hi (a_lo b_lo, 2^-22 of a b
// and less, left out): close to a float's product where one TF32 product keeps 11 bits.
struct OplibFragmentTf32A {
    float value[4];
};
struct OplibFragmentTf32B {
    float value[2];
};

// v rounded to TF32, to nearest with ties away from zero, as cvt.rna.tf32.f32 does (the low 13
// bits zero; an inf kept, a nan a nan; a value past TF32's largest an inf, as IEEE rounding
// makes it). One instruction on sm_80 and newer; on the host, the bits: half of the dropped
// bits' weight added to the magnitude carries into the kept ones exactly where rna rounds up.
__device__ __forceinline__ float oplib_round_tf32(float v) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    unsigned int bits;
    asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(bits) : "f"(v));
    return __uint_as_float(bits);
#else
    const unsigned int bits = __float_as_uint(v);
    if ((bits & 0x7f800000u) == 0x7f800000u) return (bits & 0x007fffffu) ? __uint_as_float(0x7fffe000u) : v;
    return __uint_as_float((bits + 0x1000u) & 0xffffe000u);
#endif
}

// The TF32 value the tensor cores take of a float: its low 13 bits dropped (an inf or a nan as
// it is), for the host's product.
__device__ __forceinline__ float oplib_tf32_operand(float v) {
    const unsigned int bits = __float_as_uint(v);
    return (bits & 0x7f800000u) == 0x7f800000u ? v : __uint_as_float(bits & 0xffffe000u);
}

// acc += A B from the fragments alone, as mma.m16n8k8.tf32 does, for the host (and targets
// before sm_80): a lane's outputs are rows group and group + 8, columns 2 quad and 2 quad + 1;
// it takes A's rows from the four lanes of its group (columns source and source + 4 of each) and
// B's columns from groups 2 quad and 2 quad + 1. Products of two TF32 values are exact in float.
__device__ __forceinline__ void oplib_mma_tf32_by_shuffles(OplibFragmentC& acc, const OplibFragmentTf32A& a,
                                                           const OplibFragmentTf32B& b) {
    const int lane = oplib_lane(), group = lane >> 2, quad = lane & 3;
#pragma unroll
    for (int source = 0; source < 4; ++source) {
        const int a_lane = group * 4 + source;
        float rows[4];  // (group, source), (group + 8, source), (group, source + 4), (group + 8, source + 4)
#pragma unroll
        for (int i = 0; i < 4; ++i) rows[i] = oplib_tf32_operand(__shfl_sync(OPLIB_FULL_WARP, a.value[i], a_lane));
#pragma unroll
        for (int j = 0; j < 2; ++j) {
            const int b_lane = (2 * quad + j) * 4 + source;
            const float low = oplib_tf32_operand(__shfl_sync(OPLIB_FULL_WARP, b.value[0], b_lane));
            const float high = oplib_tf32_operand(__shfl_sync(OPLIB_FULL_WARP, b.value[1], b_lane));
            acc.value[j] = oplib_fma(rows[2], high, oplib_fma(rows[0], low, acc.value[j]));
            acc.value[2 + j] = oplib_fma(rows[3], high, oplib_fma(rows[1], low, acc.value[2 + j]));
        }
    }
}

// acc += A B for the warp in TF32 (every lane calls it with its fragments): one tensor-core
// instruction on sm_80 and newer, elsewhere oplib_mma_tf32_by_shuffles.
__device__ __forceinline__ void oplib_mma_tf32(OplibFragmentC& acc, const OplibFragmentTf32A& a,
                                               const OplibFragmentTf32B& b) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
                 "{%0, %1, %2, %3};"
                 : "+f"(acc.value[0]), "+f"(acc.value[1]), "+f"(acc.value[2]), "+f"(acc.value[3])
                 : "r"(__float_as_uint(a.value[0])), "r"(__float_as_uint(a.value[1])), "r"(__float_as_uint(a.value[2])),
                   "r"(__float_as_uint(a.value[3])), "r"(__float_as_uint(b.value[0])), "r"(__float_as_uint(b.value[1])));
#else
    oplib_mma_tf32_by_shuffles(acc, a, b);
#endif
}

// A float32 operand split for 3xTF32: hi = v rounded to TF32, lo = v - hi rounded (exact before
// the rounding: hi is v's nearest). An inf or a nan in v makes lo a nan: the callers check their
// results and recompute those that are not finite.
struct OplibTf32Split {
    float hi, lo;
};

__device__ __forceinline__ OplibTf32Split oplib_split_tf32(float v) {
    const float hi = oplib_round_tf32(v);
    // v - hi as an FMA by -1: a negation under CuPy's -ftz=true would flush a subnormal hi
    return OplibTf32Split{hi, oplib_round_tf32(oplib_fma(hi, -1.0f, v))};
}

// v split into the `index`-th values of a TF32 fragment's hi and lo (OplibFragmentTf32A or B).
template <typename Fragment>
__device__ __forceinline__ void oplib_split_tf32_into(Fragment& hi, Fragment& lo, int index, float v) {
    const OplibTf32Split split = oplib_split_tf32(v);
    hi.value[index] = split.hi;
    lo.value[index] = split.lo;
}

// The three products of oplib_mma_3xtf32 by shuffles at once, for the host: each source lane's
// hi and lo values fetched once (64 shuffles where three products took 96: the emulation's
// float32 kernels spend their time here), its k-slice's small products added before its large
// one. (The tensor cores' order of a product's sums is theirs; the results agree to a float's
// rounding, as the reference checks require.)
__device__ __forceinline__ void oplib_mma_3xtf32_by_shuffles(OplibFragmentC& acc, const OplibFragmentTf32A& a_hi,
                                                             const OplibFragmentTf32A& a_lo,
                                                             const OplibFragmentTf32B& b_hi,
                                                             const OplibFragmentTf32B& b_lo) {
    const int lane = oplib_lane(), group = lane >> 2, quad = lane & 3;
#pragma unroll
    for (int source = 0; source < 4; ++source) {
        const int a_lane = group * 4 + source;
        float hi[4], lo[4];  // as oplib_mma_tf32_by_shuffles's rows
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            hi[i] = oplib_tf32_operand(__shfl_sync(OPLIB_FULL_WARP, a_hi.value[i], a_lane));
            lo[i] = oplib_tf32_operand(__shfl_sync(OPLIB_FULL_WARP, a_lo.value[i], a_lane));
        }
#pragma unroll
        for (int j = 0; j < 2; ++j) {
            const int b_lane = (2 * quad + j) * 4 + source;
            float b[2][2];  // [hi, lo][k = source, source + 4]
#pragma unroll
            for (int e = 0; e < 2; ++e) {
                b[0][e] = oplib_tf32_operand(__shfl_sync(OPLIB_FULL_WARP, b_hi.value[e], b_lane));
                b[1][e] = oplib_tf32_operand(__shfl_sync(OPLIB_FULL_WARP, b_lo.value[e], b_lane));
            }
#pragma unroll
            for (int h = 0; h < 2; ++h) {  // rows group, group + 8
                float sum = acc.value[2 * h + j];
                sum = oplib_fma(lo[2 + h], b[0][1], oplib_fma(lo[h], b[0][0], sum));
                sum = oplib_fma(hi[2 + h], b[1][1], oplib_fma(hi[h], b[1][0], sum));
                acc.value[2 * h + j] = oplib_fma(hi[2 + h], b[0][1], oplib_fma(hi[h], b[0][0], sum));
            }
        }
    }
}

// acc += A B in 3xTF32 from the split fragments: the small products first, so that each enters
// the running sum before the large one (three tensor-core instructions on sm_80 and newer).
__device__ __forceinline__ void oplib_mma_3xtf32(OplibFragmentC& acc, const OplibFragmentTf32A& a_hi,
                                                 const OplibFragmentTf32A& a_lo, const OplibFragmentTf32B& b_hi,
                                                 const OplibFragmentTf32B& b_lo) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    oplib_mma_tf32(acc, a_lo, b_hi);
    oplib_mma_tf32(acc, a_hi, b_lo);
    oplib_mma_tf32(acc, a_hi, b_hi);
#else
    oplib_mma_3xtf32_by_shuffles(acc, a_hi, a_lo, b_hi, b_lo);
#endif
}
