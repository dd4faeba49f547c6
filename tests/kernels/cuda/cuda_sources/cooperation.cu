// Kernels that exercise the host emulation's cooperating threads (cuda_host_shim.h): the warp
// shuffles against CUDA's rules, a barrier over static shared memory, fresh dynamic shared
// memory in every block, and blocks that can never finish, which the emulation must report.

#include "warp.cuh"

// Each thread offers its index in the grid; out[4 t + k] is what thread t got from the k-th
// shuffle: __shfl_sync of a float, __shfl_up_sync of an int, __shfl_down_sync of an unsigned
// int, __shfl_xor_sync of a double.
template <typename scalar_t>
__global__ void shuffles(scalar_t* __restrict__ out, int source, unsigned int delta, int lane_mask, int width) {
    typedef typename Element<scalar_t>::acc_t acc_t;
    const index_t t = (index_t)blockIdx.x * blockDim.x + threadIdx.x;
    out[4 * t] = Element<scalar_t>::store((acc_t)__shfl_sync(OPLIB_FULL_WARP, (float)t, source, width));
    out[4 * t + 1] = Element<scalar_t>::store((acc_t)__shfl_up_sync(OPLIB_FULL_WARP, (int)t, delta, width));
    out[4 * t + 2] = Element<scalar_t>::store((acc_t)__shfl_down_sync(OPLIB_FULL_WARP, (unsigned int)t, delta, width));
    out[4 * t + 3] = Element<scalar_t>::store((acc_t)__shfl_xor_sync(OPLIB_FULL_WARP, (double)t, lane_mask, width));
}

// output[t] = input[(t + shift) mod threads] within each block's slice, through static shared
// memory; the block may have any shape (t is the linear index).
template <typename scalar_t>
__global__ void rotate(const scalar_t* __restrict__ input, scalar_t* __restrict__ output, int shift) {
    __shared__ scalar_t slice[1024];
    const int threads = blockDim.x * blockDim.y * blockDim.z;
    const int t = threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
    const index_t base = (index_t)blockIdx.x * threads;
    slice[t] = input[base + t];
    __syncthreads();  // the slice is written
    output[base + t] = slice[((t + shift) % threads + threads) % threads];
}

// out[b, t] = byte t of block b's dynamic shared memory as the block finds it; then the block
// overwrites it.
template <typename scalar_t>
__global__ void first_bytes(scalar_t* __restrict__ out) {
    typedef typename Element<scalar_t>::acc_t acc_t;
    OPLIB_DYNAMIC_SHARED(unsigned char, bytes);
    out[(index_t)blockIdx.x * blockDim.x + threadIdx.x] = Element<scalar_t>::store((acc_t)bytes[threadIdx.x]);
    __syncthreads();
    bytes[threadIdx.x] = 0;
}

// out[t] = t, after cooperation that, by `mode`, every thread completes (0) or that can never
// complete: 1 the upper half of the block skips a barrier, 2 the upper half returns before
// it, 3 the halves wait at two different barriers, 4 lanes 16-31 skip a shuffle, 5 lanes
// 16-31 call a shuffle whose mask leaves them out, 6 lanes 0-15 read lanes 16-31 that their
// mask leaves out, 7 a shuffle of width 3, 8 lanes read past the end of a partial warp.
template <typename scalar_t>
__global__ void stuck(scalar_t* __restrict__ out, int mode) {
    typedef typename Element<scalar_t>::acc_t acc_t;
    const int t = threadIdx.x, lane = t % 32;
    const bool upper = t >= (int)blockDim.x / 2;
    float value = (float)t;
    if (mode == 1 && !upper) __syncthreads();
    if (mode == 2 && upper) return;
    if (mode == 2) __syncthreads();
    if (mode == 3 && upper) __syncthreads();
    if (mode == 3 && !upper) __syncthreads();
    if (mode == 4 && lane < 16) value = __shfl_sync(OPLIB_FULL_WARP, value, lane);
    if (mode == 5) value = __shfl_sync(0x0000ffffu, value, lane % 16);
    if (mode == 6 && lane < 16) value = __shfl_sync(0x0000ffffu, value, lane + 16);
    if (mode == 7) value = __shfl_sync(OPLIB_FULL_WARP, value, lane, 3);
    if (mode == 8) value = __shfl_down_sync(OPLIB_FULL_WARP, value, 4) - 4.0f * (lane < 28);
    __syncthreads();
    out[(index_t)blockIdx.x * blockDim.x + t] = Element<scalar_t>::store((acc_t)value);
}
