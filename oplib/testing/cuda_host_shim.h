// Host shim for CUDA kernel sources: with it, g++ compiles a .cu file unchanged, and
// oplib_emulation::launch runs a kernel over its whole grid on the CPU.
//
// Blocks run in parallel as OpenMP threads; the threads of one block run one after another,
// so a kernel that needs __syncthreads (or shared memory) is rejected at compile time rather
// than emulated wrongly: this shim does not define them.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline

struct dim3 {
    unsigned int x = 1, y = 1, z = 1;
};

// Each emulated CUDA thread sees its own indices; thread_local lets blocks run in parallel.
inline thread_local dim3 blockIdx, threadIdx, blockDim, gridDim;

template <typename T>
inline T __ldg(const T* pointer) {
    return *pointer;
}

inline float __uint_as_float(unsigned int bits) {
    float value;
    std::memcpy(&value, &bits, sizeof value);
    return value;
}

inline unsigned int __float_as_uint(float value) {
    unsigned int bits;
    std::memcpy(&bits, &value, sizeof bits);
    return bits;
}

inline float rintf(float value) {
    return std::nearbyint(value);  // round half to even in the default rounding mode, as on the GPU
}

namespace oplib_emulation {

// Run ``body`` once per thread of a 1-D grid of ``grid`` blocks of ``block`` threads.
template <typename Body>
void launch(long long grid, long long block, Body body) {
#pragma omp parallel for schedule(dynamic)
    for (long long b = 0; b < grid; ++b) {
        gridDim.x = (unsigned int)grid;
        blockDim.x = (unsigned int)block;
        blockIdx.x = (unsigned int)b;
        for (long long t = 0; t < block; ++t) {
            threadIdx.x = (unsigned int)t;
            body();
        }
    }
}

}  // namespace oplib_emulation
