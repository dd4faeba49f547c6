// The kernel units' entry points, each explicitly instantiated in its unit for the dtypes of
// OPLIB_FOR_EACH_DTYPE. bindings.cpp checks the tensors and calls these. out and grad_input
// (N, C, H, W) are written into the tensor given, of any strides (the op allocates it in its
// fake's layout); grad_weight (N, G, KH, KW, Ho, Wo) into a contiguous one.

#pragma once

#include "operands.h"

#define OPLIB_FOR_EACH_DTYPE(MACRO) MACRO(float) MACRO(double) MACRO(c10::Half) MACRO(c10::BFloat16)
// The inner loops' instantiations: each accumulation type with each lane count with_lanes
// may pick (those wider than the target's vectors compile to nothing).
#define OPLIB_FOR_EACH_ACCUMULATE_LANES(MACRO)                                                      \
  MACRO(float, 1) MACRO(float, 2) MACRO(float, 4) MACRO(float, 8) MACRO(float, 16) MACRO(double, 1) \
  MACRO(double, 2) MACRO(double, 4) MACRO(double, 8) MACRO(double, 16)

namespace oplib_cpu {

// forward.cpp
template <typename scalar_t>
void forward(const Geometry& geo, const Planes<scalar_t>& input, const Weight<scalar_t>& weight, const OutputPlanes<scalar_t>& out);
// forward_generated.cpp
template <typename scalar_t>
void forward_generated(const Geometry& geo, const Planes<scalar_t>& input, const GeneratorOperands<scalar_t>& generator,
                       const OutputPlanes<scalar_t>& out);
// backward_input.cpp
template <typename scalar_t>
void backward_input(const Geometry& geo, const Planes<scalar_t>& grad_output, const Weight<scalar_t>& weight,
                    const OutputPlanes<scalar_t>& grad_input);
// backward_input_generated.cpp
template <typename scalar_t>
void backward_input_generated(const Geometry& geo, const Planes<scalar_t>& grad_output,
                              const GeneratorOperands<scalar_t>& generator, const OutputPlanes<scalar_t>& grad_input);
// backward_generator.cpp: grad_feature (N, R, Ho, Wo) of any strides; grad_span (G * KH * KW, R)
// and grad_bias (G * KH * KW,) contiguous; span (G * KH * KW, R) contiguous, in the accumulation type.
template <typename scalar_t>
void backward_generator(const Geometry& geo, const Planes<scalar_t>& grad_output, const Planes<scalar_t>& input,
                        const Planes<scalar_t>& feature, const Acc<scalar_t>* span, int64_t reduced,
                        const OutputPlanes<scalar_t>& grad_feature, scalar_t* grad_span, scalar_t* grad_bias);
// backward_weight.cpp
template <typename scalar_t>
void backward_weight(const Geometry& geo, const Planes<scalar_t>& grad_output, const Planes<scalar_t>& input,
                     scalar_t* grad_weight);
// backward_weight_pixels.cpp: the pixel-lane grad_weight where the geometry and the target
// have one (returns false, nothing written, otherwise).
template <typename scalar_t>
bool backward_weight_by_pixels(const Geometry& geo, const Planes<scalar_t>& grad_output, const Planes<scalar_t>& input,
                               scalar_t* grad_weight);

}  // namespace oplib_cpu
