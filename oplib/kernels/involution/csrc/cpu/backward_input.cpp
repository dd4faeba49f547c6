// grad_input with the stored weight (N, G, KH, KW, Ho, Wo).

#include "backward_input.h"
#include "kernels.h"

namespace oplib_cpu {

template <typename scalar_t>
void backward_input(const Geometry& geo, const Planes<scalar_t>& grad_output, const Weight<scalar_t>& weight,
                    const OutputPlanes<scalar_t>& grad_input) {
  backward_input_kernel<scalar_t>(geo, grad_output, StoredWeight<scalar_t>{weight}, grad_input);
}

#define OPLIB_INSTANTIATE(T) template void backward_input<T>(const Geometry&, const Planes<T>&, const Weight<T>&, const OutputPlanes<T>&);
OPLIB_FOR_EACH_DTYPE(OPLIB_INSTANTIATE)

}  // namespace oplib_cpu
