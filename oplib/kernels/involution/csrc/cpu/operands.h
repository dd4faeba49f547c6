// The operands of the native CPU kernels as the kernel units see them: plain pointers and
// strides, with the geometry, the accumulation type and the work split over threads. The
// kernel units include no ATen tensor header (bindings.cpp turns tensors into these views),
// which keeps each unit's compile small.

#pragma once

#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <algorithm>
#include <cstdint>
#include <exception>
#include <type_traits>
#include <vector>

#if defined(_OPENMP)
#include <omp.h>
#endif

namespace oplib_cpu {

// The type sums are kept in: float for 16-bit operands, else the dtype itself.
template <typename T>
struct AccumulateOf {
  using type = T;
};
template <>
struct AccumulateOf<c10::Half> {
  using type = float;
};
template <>
struct AccumulateOf<c10::BFloat16> {
  using type = float;
};
template <typename T>
using Acc = typename AccumulateOf<T>::type;

// dst[j] = src[j * stride] for j < count, converted; the contiguous case vectorises.
template <typename scalar_t, typename acc_t>
inline void convert(const scalar_t* src, int64_t stride, int64_t count, acc_t* dst) {
  if (stride == 1) {
    for (int64_t j = 0; j < count; ++j) dst[j] = static_cast<acc_t>(src[j]);
  } else {
    for (int64_t j = 0; j < count; ++j) dst[j] = static_cast<acc_t>(src[j * stride]);
  }
}

inline int64_t round_up(int64_t value, int64_t multiple) { return (value + multiple - 1) / multiple * multiple; }

// An involution's sizes. `threads`: the workers the (sample, group) items are split over.
struct Geometry {
  int64_t batch, channels, height, width, groups, kernel_h, kernel_w, out_h, out_w;
  int64_t stride_h, stride_w, pad_h, pad_w, dilation_h, dilation_w;
  int threads;

  int64_t group_channels() const { return channels / groups; }
  int64_t taps() const { return kernel_h * kernel_w; }
  // The rows the windows reach, from -pad_h on: scratch row r is input row r - pad_h.
  int64_t scratch_rows() const { return (out_h - 1) * stride_h + (kernel_h - 1) * dilation_h + 1; }
};

// A 4-D operand (N, C, H, W) of any strides.
template <typename scalar_t>
struct Planes {
  const scalar_t* data;
  int64_t stride_n, stride_c, stride_h, stride_w;

  const scalar_t* at(int64_t n, int64_t c, int64_t h) const { return data + n * stride_n + c * stride_c + h * stride_h; }
};

// A 4-D result (N, C, H, W) of any strides, allocated by the op in its fake's layout
// (channels_last where the operand is) and written in place.
template <typename scalar_t>
struct OutputPlanes {
  scalar_t* data;
  int64_t stride_n, stride_c, stride_h, stride_w;

  scalar_t* at(int64_t n, int64_t c, int64_t h) const { return data + n * stride_n + c * stride_c + h * stride_h; }
};

// The weight (N, G, KH, KW, Ho, Wo) of any strides.
template <typename scalar_t>
struct Weight {
  const scalar_t* data;
  int64_t stride[6];

  const scalar_t* row(int64_t n, int64_t g, int64_t a, int64_t b, int64_t i) const {
    return data + n * stride[0] + g * stride[1] + a * stride[2] + b * stride[3] + i * stride[4];
  }

  // Whether each (n, g)'s taps, rows and columns lie as in a contiguous tensor.
  bool standard(const Geometry& geo) const {
    return stride[5] == 1 && stride[4] == geo.out_w && stride[3] == geo.out_h * geo.out_w &&
           stride[2] == geo.kernel_w * geo.out_h * geo.out_w;
  }

  // The weight of (n, g) as acc_t values [tap][i][j] (tap stride Ho * Wo, row stride Wo): the
  // tensor's own memory where it already is that and `direct` allows it, else a copy in
  // buffer, which holds `slack` zeros after the values for reads past the last row.
  template <typename acc_t>
  const acc_t* planes(const Geometry& geo, int64_t n, int64_t g, bool direct, int64_t slack, std::vector<acc_t>& buffer) const {
    const int64_t plane = geo.out_h * geo.out_w, count = geo.taps() * plane;
    if constexpr (std::is_same_v<scalar_t, acc_t>) {
      if (direct && standard(geo)) return row(n, g, 0, 0, 0);
    }
    if (static_cast<int64_t>(buffer.size()) != count + slack) buffer.assign(count + slack, acc_t(0));
    if (standard(geo)) {
      convert(row(n, g, 0, 0, 0), 1, count, buffer.data());
    } else {
      for (int64_t t = 0; t < geo.taps(); ++t) {
        for (int64_t i = 0; i < geo.out_h; ++i) {
          convert(row(n, g, t / geo.kernel_w, t % geo.kernel_w, i), stride[5], geo.out_w, buffer.data() + t * plane + i * geo.out_w);
        }
      }
    }
    return buffer.data();
  }
};

// The generation branch of involution_generated: the feature map (N, R, Ho, Wo) of any
// strides, and the span's (G * KH * KW, R) matrix and bias, contiguous, in the accumulation type.
template <typename scalar_t>
struct GeneratorOperands {
  Planes<scalar_t> feature;
  const Acc<scalar_t>* span;
  const Acc<scalar_t>* bias;
  int64_t reduced;
};

// body(begin, end) over the `count` items split into one contiguous range per worker (as
// at::parallel_for splits them), run on geo.threads OpenMP threads: the runtime the kernel
// units are compiled with (GCC's libgomp, which torch shares, or clang's libomp), with the
// thread count torch was asked for. Each item is computed by one worker in an order fixed by
// the geometry, so results do not depend on the thread count. An exception thrown by a
// worker is rethrown here.
template <typename Body>
void parallel_items(int64_t count, int threads, const Body& body) {
  if (count <= 0) return;
  const int workers = static_cast<int>(std::clamp<int64_t>(threads, 1, count));
#if defined(_OPENMP)
  if (workers > 1) {
    std::exception_ptr failure;
#pragma omp parallel num_threads(workers)
    {
      const int64_t team = omp_get_num_threads(), chunk = (count + team - 1) / team;
      const int64_t begin = omp_get_thread_num() * chunk, end = std::min(count, begin + chunk);
      if (begin < end) {
        try {
          body(begin, end);
        } catch (...) {
#pragma omp critical(oplib_cpu_failure)
          if (!failure) failure = std::current_exception();
        }
      }
    }
    if (failure) std::rethrow_exception(failure);
    return;
  }
#endif
  body(0, count);
}

}  // namespace oplib_cpu
