// The forward of involution_generated: the weights formed from the feature map, a block of
// output rows at a time, never written to memory.

#include "forward.h"
#include "kernels.h"

namespace oplib_cpu {

template <typename scalar_t>
void forward_generated(const Geometry& geo, const Planes<scalar_t>& input, const GeneratorOperands<scalar_t>& generator,
                       const OutputPlanes<scalar_t>& out) {
  forward_kernel<scalar_t>(geo, input, GeneratedWeight<scalar_t>{Generator<scalar_t>(generator, geo.groups, geo.taps())}, out);
}

#define OPLIB_INSTANTIATE(T) \
  template void forward_generated<T>(const Geometry&, const Planes<T>&, const GeneratorOperands<T>&, const OutputPlanes<T>&);
OPLIB_FOR_EACH_DTYPE(OPLIB_INSTANTIATE)

}  // namespace oplib_cpu
