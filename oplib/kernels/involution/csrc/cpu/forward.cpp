// The forward with the stored weight (N, G, KH, KW, Ho, Wo).

#include "forward.h"
#include "kernels.h"

namespace oplib_cpu {

template <typename scalar_t>
void forward(const Geometry& geo, const Planes<scalar_t>& input, const Weight<scalar_t>& weight, const OutputPlanes<scalar_t>& out) {
  forward_kernel<scalar_t>(geo, input, StoredWeight<scalar_t>{weight}, out);
}

#define OPLIB_INSTANTIATE(T) template void forward<T>(const Geometry&, const Planes<T>&, const Weight<T>&, const OutputPlanes<T>&);
OPLIB_FOR_EACH_DTYPE(OPLIB_INSTANTIATE)

}  // namespace oplib_cpu
