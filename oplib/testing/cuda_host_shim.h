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

// Run ``body`` once per thread of a grid of grid[0..2] blocks of block[0..2] threads.
template <typename Body>
void launch(const unsigned int* grid, const unsigned int* block, long long shared_bytes, Body body) {
    (void)shared_bytes;
    const long long blocks = (long long)grid[0] * grid[1] * grid[2];
#pragma omp parallel for schedule(dynamic)
    for (long long b = 0; b < blocks; ++b) {
        gridDim = {grid[0], grid[1], grid[2]};
        blockDim = {block[0], block[1], block[2]};
        blockIdx = {(unsigned int)(b % grid[0]), (unsigned int)(b / grid[0] % grid[1]),
                    (unsigned int)(b / ((long long)grid[0] * grid[1]))};
        for (unsigned int z = 0; z < block[2]; ++z) {
            for (unsigned int y = 0; y < block[1]; ++y) {
                for (unsigned int x = 0; x < block[0]; ++x) {
                    threadIdx = {x, y, z};
                    body();
                }
            }
        }
    }
}

}  // namespace oplib_emulation
