// A kernel with a planted off-by-one: the thread of the last element reads one element past
// the end of `input`. The host emulation built with AddressSanitizer must report it.

#include "element.cuh"

template <typename scalar_t>
__global__ void copy_next(const scalar_t* __restrict__ input, scalar_t* __restrict__ output, index_t total) {
    for (index_t index = oplib_first_index(); index < total; index += oplib_grid_step()) {
        output[index] = input[index + 1];  // the bug: index + 1 == total on the last thread
    }
}
