// grad_input of involution_generated: each (sample, group) pair's weights formed over the
// whole plane in the thread's buffer, never written to the result.

#include "backward_input.h"
#include "kernels.h"

namespace oplib_cpu {

template <typename scalar_t>
void backward_input_generated(const Geometry& geo, const Planes<scalar_t>& grad_output,
                              const GeneratorOperands<scalar_t>& generator, const OutputPlanes<scalar_t>& grad_input) {
  backward_input_kernel<scalar_t>(geo, grad_output, GeneratedWeight<scalar_t>{Generator<scalar_t>(generator, geo.groups, geo.taps())},
                                  grad_input);
}

#define OPLIB_INSTANTIATE(T) \
  template void backward_input_generated<T>(const Geometry&, const Planes<T>&, const GeneratorOperands<T>&, const OutputPlanes<T>&);
OPLIB_FOR_EACH_DTYPE(OPLIB_INSTANTIATE)

}  // namespace oplib_cpu
