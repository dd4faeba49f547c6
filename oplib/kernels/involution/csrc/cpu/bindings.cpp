// The Python entry points of the native CPU kernels: each checks its tensors (device,
// layout, dtype, dimensions, shapes against the geometry) with TORCH_CHECK, so a wrong call
// raises a RuntimeError that names the argument instead of reading past a buffer, writes
// into the result tensor the op allocated (its `out` argument, in the fake's layout: the
// forward and grad_input write channels_last results in place) or a new contiguous one, and
// calls the kernel unit for the dtype. The ops' Python kernels
// (oplib.kernels.involution_cpu, oplib.ops.involution_generated) check the same rules first,
// with torch's own messages; these checks guard the module's direct callers.

#include <ATen/Dispatch.h>
#include <ATen/MemoryOverlap.h>
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <torch/csrc/utils/pybind.h>

#include <optional>
#include <tuple>
#include <vector>

#include "kernels.h"

namespace {

using oplib_cpu::Geometry;

void check_operand(const at::Tensor& t, const char* name, int64_t dims) {
  TORCH_CHECK(t.device().is_cpu(), "oplib's native CPU kernels: ", name, " is on ", t.device(), "; expected a CPU tensor");
  TORCH_CHECK(t.layout() == at::kStrided, "oplib's native CPU kernels: ", name, " has layout ", t.layout(),
              "; expected a strided (dense) tensor");
  const auto dtype = t.scalar_type();
  TORCH_CHECK(dtype == at::kFloat || dtype == at::kDouble || dtype == at::kHalf || dtype == at::kBFloat16,
              "oplib's native CPU kernels: ", name, " has dtype ", dtype, "; expected float32, float64, float16 or bfloat16");
  TORCH_CHECK(t.dim() == dims, "oplib's native CPU kernels: ", name, " has ", t.dim(), " dimensions; expected ", dims);
}

void check_same_dtype(const at::Tensor& t, const char* name, const at::Tensor& first, const char* first_name) {
  TORCH_CHECK(t.scalar_type() == first.scalar_type(), "oplib's native CPU kernels: ", name, " has dtype ", t.scalar_type(),
              " but ", first_name, " has ", first.scalar_type());
}

void check_pair(at::IntArrayRef values, const char* name, int64_t least) {
  TORCH_CHECK(values.size() == 2, "oplib's native CPU kernels: ", name, " has ", values.size(), " values; expected 2");
  TORCH_CHECK(values[0] >= least && values[1] >= least, "oplib's native CPU kernels: ", name, " is ", values,
              "; each value must be at least ", least);
}

int workers() { return at::in_parallel_region() ? 1 : at::get_num_threads(); }

// The geometry of an input (N, C, H, W) and weight shape (N, G, KH, KW, Ho, Wo), checked:
// the groups divide the channels, and (Ho, Wo) is what the window, stride, padding and
// dilation give on (H, W).
Geometry make_geometry(at::IntArrayRef input_shape, at::IntArrayRef weight_shape, at::IntArrayRef stride,
                       at::IntArrayRef padding, at::IntArrayRef dilation) {
  check_pair(stride, "stride", 1);
  check_pair(padding, "padding", 0);
  check_pair(dilation, "dilation", 1);
  const Geometry geo{input_shape[0], input_shape[1], input_shape[2], input_shape[3], weight_shape[1], weight_shape[2],
                     weight_shape[3], weight_shape[4], weight_shape[5], stride[0], stride[1], padding[0], padding[1],
                     dilation[0], dilation[1], workers()};
  TORCH_CHECK(weight_shape[0] == geo.batch, "oplib's native CPU kernels: the weight's batch ", weight_shape[0],
              " differs from the input's ", geo.batch);
  TORCH_CHECK(geo.groups >= 1 && geo.channels % geo.groups == 0, "oplib's native CPU kernels: ", geo.groups,
              " groups do not divide ", geo.channels, " channels");
  TORCH_CHECK(geo.kernel_h >= 1 && geo.kernel_w >= 1, "oplib's native CPU kernels: empty kernel ", geo.kernel_h, "x", geo.kernel_w);
  const int64_t out_h = (geo.height + 2 * geo.pad_h - geo.dilation_h * (geo.kernel_h - 1) - 1) / geo.stride_h + 1;
  const int64_t out_w = (geo.width + 2 * geo.pad_w - geo.dilation_w * (geo.kernel_w - 1) - 1) / geo.stride_w + 1;
  TORCH_CHECK(out_h >= 1 && out_w >= 1 && geo.out_h == out_h && geo.out_w == out_w, "oplib's native CPU kernels: the output is ",
              geo.out_h, "x", geo.out_w, " but a ", geo.kernel_h, "x", geo.kernel_w, " window on the ", geo.height, "x",
              geo.width, " input gives ", out_h, "x", out_w);
  return geo;
}

template <typename scalar_t>
oplib_cpu::Planes<scalar_t> planes(const at::Tensor& t) {
  return {t.data_ptr<scalar_t>(), t.stride(0), t.stride(1), t.stride(2), t.stride(3)};
}

template <typename scalar_t>
oplib_cpu::OutputPlanes<scalar_t> output_planes(const at::Tensor& t) {
  return {t.data_ptr<scalar_t>(), t.stride(0), t.stride(1), t.stride(2), t.stride(3)};
}

// The result (N, C, H, W): `out` where the caller allocated it (the op, in its fake's
// layout), checked to fit and not to overlap the operands; else a contiguous new tensor.
at::Tensor result_tensor(const std::optional<at::Tensor>& out, at::IntArrayRef shape, const at::Tensor& like,
                         const char* like_name, std::initializer_list<const at::Tensor*> operands) {
  if (!out.has_value()) return at::empty(shape, like.options());
  check_operand(*out, "out", static_cast<int64_t>(shape.size()));
  check_same_dtype(*out, "out", like, like_name);
  TORCH_CHECK(out->sizes() == shape, "oplib's native CPU kernels: out is ", out->sizes(), "; expected ", shape);
  at::assert_no_internal_overlap(*out);
  for (const at::Tensor* operand : operands) at::assert_no_overlap(*out, *operand);
  return *out;
}

template <typename scalar_t>
oplib_cpu::Weight<scalar_t> weight_view(const at::Tensor& t) {
  oplib_cpu::Weight<scalar_t> view{t.data_ptr<scalar_t>(), {}};
  for (int d = 0; d < 6; ++d) view.stride[d] = t.stride(d);
  return view;
}

// The (N, G, KH, KW, Ho, Wo) weight shape of involution_generated's operands, checked: the
// feature map (N, R, Ho, Wo), span_weight (G * KH * KW, R), span_bias (G * KH * KW,).
std::vector<int64_t> generated_weight_shape(const at::Tensor& first, const char* first_name, const at::Tensor& feature,
                                            const at::Tensor& span_weight, const std::optional<at::Tensor>& span_bias,
                                            at::IntArrayRef kernel_size) {
  check_operand(feature, "feature", 4);
  check_operand(span_weight, "span_weight", 2);
  check_same_dtype(feature, "feature", first, first_name);
  check_same_dtype(span_weight, "span_weight", first, first_name);
  check_pair(kernel_size, "kernel_size", 1);
  const int64_t taps = kernel_size[0] * kernel_size[1];
  TORCH_CHECK(span_weight.size(0) % taps == 0 && span_weight.size(0) > 0, "oplib's native CPU kernels: span_weight has ",
              span_weight.size(0), " rows; expected groups * ", taps, " for a ", kernel_size[0], "x", kernel_size[1], " window");
  TORCH_CHECK(span_weight.size(1) == feature.size(1), "oplib's native CPU kernels: span_weight takes ", span_weight.size(1),
              " reduced channels but the feature map has ", feature.size(1));
  TORCH_CHECK(feature.size(0) == first.size(0), "oplib's native CPU kernels: the feature map's batch ", feature.size(0),
              " differs from ", first_name, "'s ", first.size(0));
  if (span_bias.has_value()) {
    check_operand(*span_bias, "span_bias", 1);
    check_same_dtype(*span_bias, "span_bias", first, first_name);
    TORCH_CHECK(span_bias->size(0) == span_weight.size(0), "oplib's native CPU kernels: span_bias has ", span_bias->size(0),
                " values but span_weight has ", span_weight.size(0), " rows");
  }
  return {feature.size(0), span_weight.size(0) / taps, kernel_size[0], kernel_size[1], feature.size(2), feature.size(3)};
}

// Writes `result` (returned) with run(scalar_t{}, generator) in result's dtype, where generator
// is the GeneratorOperands of (feature, span_weight, span_bias): span and bias converted to the
// accumulation type, contiguous, kept alive while run runs.
template <typename Run>
at::Tensor run_generated(const at::Tensor& result, const at::Tensor& feature, const at::Tensor& span_weight,
                         const std::optional<at::Tensor>& span_bias, Run run) {
  if (result.numel() == 0) return result;
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, result.scalar_type(), "involution_generated", [&] {
    using acc_t = oplib_cpu::Acc<scalar_t>;
    const auto acc_type = c10::CppTypeToScalarType<acc_t>::value;
    const at::Tensor span = span_weight.to(acc_type).contiguous();
    const at::Tensor bias = span_bias.has_value() ? span_bias->to(acc_type).contiguous()
                                                  : at::empty({span_weight.size(0)}, span.options()).zero_();
    run(scalar_t{}, oplib_cpu::GeneratorOperands<scalar_t>{planes<scalar_t>(feature), span.data_ptr<acc_t>(),
                                                            bias.data_ptr<acc_t>(), span_weight.size(1)});
  });
  return result;
}

}  // namespace

// input: (N, C, H, W), weight: (N, G, KH, KW, Ho, Wo) -> out: (N, C, Ho, Wo), written into `out` where given.
at::Tensor involution_forward(const at::Tensor& input, const at::Tensor& weight, at::IntArrayRef stride,
                              at::IntArrayRef padding, at::IntArrayRef dilation, const std::optional<at::Tensor>& out_arg) {
  check_operand(input, "input", 4);
  check_operand(weight, "weight", 6);
  check_same_dtype(weight, "weight", input, "input");
  const Geometry geo = make_geometry(input.sizes(), weight.sizes(), stride, padding, dilation);
  at::Tensor out = result_tensor(out_arg, {geo.batch, geo.channels, geo.out_h, geo.out_w}, input, "input", {&input, &weight});
  if (out.numel() == 0) return out;
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, input.scalar_type(), "involution_forward", [&] {
    oplib_cpu::forward<scalar_t>(geo, planes<scalar_t>(input), weight_view<scalar_t>(weight), output_planes<scalar_t>(out));
  });
  return out;
}

// grad_output: (N, C, Ho, Wo), weight: (N, G, KH, KW, Ho, Wo) -> grad_input: (N, C, H, W).
at::Tensor involution_backward_input(const at::Tensor& grad_output, const at::Tensor& weight, at::IntArrayRef input_size,
                                     at::IntArrayRef stride, at::IntArrayRef padding, at::IntArrayRef dilation,
                                     const std::optional<at::Tensor>& out) {
  check_operand(grad_output, "grad_output", 4);
  check_operand(weight, "weight", 6);
  check_same_dtype(weight, "weight", grad_output, "grad_output");
  check_pair(input_size, "input_size", 0);
  const std::vector<int64_t> input_shape{grad_output.size(0), grad_output.size(1), input_size[0], input_size[1]};
  const Geometry geo = make_geometry(input_shape, weight.sizes(), stride, padding, dilation);
  TORCH_CHECK(grad_output.size(2) == geo.out_h && grad_output.size(3) == geo.out_w, "oplib's native CPU kernels: grad_output is ",
              grad_output.sizes(), " but the weight's output is ", geo.out_h, "x", geo.out_w);
  at::Tensor grad_input = result_tensor(out, input_shape, grad_output, "grad_output", {&grad_output, &weight});
  if (grad_input.numel() == 0) return grad_input;
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, grad_output.scalar_type(), "involution_backward_input", [&] {
    oplib_cpu::backward_input<scalar_t>(geo, planes<scalar_t>(grad_output), weight_view<scalar_t>(weight),
                                        output_planes<scalar_t>(grad_input));
  });
  return grad_input;
}

// grad_output: (N, C, Ho, Wo), input: (N, C, H, W) -> grad_weight: (N, groups, KH, KW, Ho, Wo),
// into `out` where given: in place where it is contiguous, else computed contiguous and copied.
at::Tensor involution_backward_weight(const at::Tensor& grad_output, const at::Tensor& input, at::IntArrayRef kernel_size,
                                      at::IntArrayRef stride, at::IntArrayRef padding, at::IntArrayRef dilation,
                                      int64_t groups, const std::optional<at::Tensor>& out_arg) {
  check_operand(grad_output, "grad_output", 4);
  check_operand(input, "input", 4);
  check_same_dtype(grad_output, "grad_output", input, "input");
  check_pair(kernel_size, "kernel_size", 1);
  TORCH_CHECK(grad_output.size(0) == input.size(0) && grad_output.size(1) == input.size(1), "oplib's native CPU kernels: grad_output is ",
              grad_output.sizes(), " but input is ", input.sizes());
  const std::vector<int64_t> weight_shape{input.size(0), groups, kernel_size[0], kernel_size[1], grad_output.size(2),
                                          grad_output.size(3)};
  const Geometry geo = make_geometry(input.sizes(), weight_shape, stride, padding, dilation);
  const at::Tensor out = result_tensor(out_arg, weight_shape, input, "input", {&input, &grad_output});
  // The kernels write a contiguous (N, G, KH, KW, Ho, Wo) block.
  at::Tensor grad_weight = out.is_contiguous() ? out : at::empty(weight_shape, input.options());
  if (grad_weight.numel() == 0) return out;
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, input.scalar_type(), "involution_backward_weight", [&] {
    oplib_cpu::backward_weight<scalar_t>(geo, planes<scalar_t>(grad_output), planes<scalar_t>(input), grad_weight.data_ptr<scalar_t>());
  });
  return grad_weight.is_same(out) ? out : out.copy_(grad_weight);
}

// input: (N, C, H, W), feature: (N, R, Ho, Wo), span_weight: (G * KH * KW, R),
// span_bias: (G * KH * KW,) or None -> out: (N, C, Ho, Wo).
at::Tensor involution_generated_forward(const at::Tensor& input, const at::Tensor& feature, const at::Tensor& span_weight,
                                        const std::optional<at::Tensor>& span_bias, at::IntArrayRef kernel_size,
                                        at::IntArrayRef stride, at::IntArrayRef padding, at::IntArrayRef dilation,
                                        const std::optional<at::Tensor>& out_arg) {
  check_operand(input, "input", 4);
  const auto weight_shape = generated_weight_shape(input, "input", feature, span_weight, span_bias, kernel_size);
  const Geometry geo = make_geometry(input.sizes(), weight_shape, stride, padding, dilation);
  at::Tensor out = result_tensor(out_arg, {geo.batch, geo.channels, geo.out_h, geo.out_w}, input, "input", {&input, &feature});
  return run_generated(out, feature, span_weight, span_bias, [&](auto zero, const auto& generator) {
    using scalar_t = decltype(zero);
    oplib_cpu::forward_generated<scalar_t>(geo, planes<scalar_t>(input), generator, output_planes<scalar_t>(out));
  });
}

// grad_output: (N, C, Ho, Wo) and the generator as above -> grad_input: (N, C, H, W).
at::Tensor involution_generated_backward_input(const at::Tensor& grad_output, const at::Tensor& feature,
                                               const at::Tensor& span_weight, const std::optional<at::Tensor>& span_bias,
                                               at::IntArrayRef input_size, at::IntArrayRef kernel_size, at::IntArrayRef stride,
                                               at::IntArrayRef padding, at::IntArrayRef dilation, const std::optional<at::Tensor>& out) {
  check_operand(grad_output, "grad_output", 4);
  check_pair(input_size, "input_size", 0);
  const auto weight_shape = generated_weight_shape(grad_output, "grad_output", feature, span_weight, span_bias, kernel_size);
  const std::vector<int64_t> input_shape{grad_output.size(0), grad_output.size(1), input_size[0], input_size[1]};
  const Geometry geo = make_geometry(input_shape, weight_shape, stride, padding, dilation);
  TORCH_CHECK(grad_output.size(2) == geo.out_h && grad_output.size(3) == geo.out_w, "oplib's native CPU kernels: grad_output is ",
              grad_output.sizes(), " but the feature map is ", geo.out_h, "x", geo.out_w);
  at::Tensor grad_input = result_tensor(out, input_shape, grad_output, "grad_output", {&grad_output, &feature});
  return run_generated(grad_input, feature, span_weight, span_bias, [&](auto zero, const auto& generator) {
    using scalar_t = decltype(zero);
    oplib_cpu::backward_input_generated<scalar_t>(geo, planes<scalar_t>(grad_output), generator,
                                                  output_planes<scalar_t>(grad_input));
  });
}

// grad_output: (N, C, Ho, Wo), feature: (N, R, Ho, Wo), span_weight: (G * KH * KW, R), input:
// (N, C, H, W) -> (grad_feature (N, R, Ho, Wo), grad_span_weight (G * KH * KW, R), grad_span_bias
// (G * KH * KW,)), each into the tensor given where one is.
std::tuple<at::Tensor, at::Tensor, at::Tensor> involution_generated_backward_generator(
    const at::Tensor& grad_output, const at::Tensor& feature, const at::Tensor& span_weight, const at::Tensor& input,
    at::IntArrayRef kernel_size, at::IntArrayRef stride, at::IntArrayRef padding, at::IntArrayRef dilation,
    const std::optional<at::Tensor>& grad_feature_arg, const std::optional<at::Tensor>& grad_span_arg,
    const std::optional<at::Tensor>& grad_bias_arg) {
  check_operand(grad_output, "grad_output", 4);
  check_operand(input, "input", 4);
  check_same_dtype(input, "input", grad_output, "grad_output");
  TORCH_CHECK(grad_output.size(0) == input.size(0) && grad_output.size(1) == input.size(1), "oplib's native CPU kernels: grad_output is ",
              grad_output.sizes(), " but input is ", input.sizes());
  const auto weight_shape = generated_weight_shape(grad_output, "grad_output", feature, span_weight, std::nullopt, kernel_size);
  const Geometry geo = make_geometry(input.sizes(), weight_shape, stride, padding, dilation);
  TORCH_CHECK(grad_output.size(2) == geo.out_h && grad_output.size(3) == geo.out_w, "oplib's native CPU kernels: grad_output is ",
              grad_output.sizes(), " but the feature map is ", geo.out_h, "x", geo.out_w);
  const std::initializer_list<const at::Tensor*> operands{&grad_output, &feature, &span_weight, &input};
  at::Tensor grad_feature = result_tensor(grad_feature_arg, feature.sizes(), grad_output, "grad_output", operands);
  at::Tensor grad_span = result_tensor(grad_span_arg, span_weight.sizes(), grad_output, "grad_output", operands);
  at::Tensor grad_bias = result_tensor(grad_bias_arg, {span_weight.size(0)}, grad_output, "grad_output", operands);
  // The span's results are written as flat arrays: into a contiguous copy where they are not.
  at::Tensor span_out = grad_span.is_contiguous() ? grad_span : at::empty(span_weight.sizes(), grad_output.options());
  at::Tensor bias_out = grad_bias.is_contiguous() ? grad_bias : at::empty({span_weight.size(0)}, grad_output.options());
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, grad_output.scalar_type(), "involution_generated_backward_generator", [&] {
    using acc_t = oplib_cpu::Acc<scalar_t>;
    const at::Tensor span = span_weight.to(c10::CppTypeToScalarType<acc_t>::value).contiguous();
    oplib_cpu::backward_generator<scalar_t>(geo, planes<scalar_t>(grad_output), planes<scalar_t>(input), planes<scalar_t>(feature),
                                            span.data_ptr<acc_t>(), span_weight.size(1), output_planes<scalar_t>(grad_feature),
                                            span_out.data_ptr<scalar_t>(), bias_out.data_ptr<scalar_t>());
  });
  if (!span_out.is_same(grad_span)) grad_span.copy_(span_out);
  if (!bias_out.is_same(grad_bias)) grad_bias.copy_(bias_out);
  return {grad_feature, grad_span, grad_bias};
}

// out (optional, keyword or last positional): the result tensor to write, of any strides.
PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  using pybind11::arg;
  m.def("involution_forward", &involution_forward, arg("input"), arg("weight"), arg("stride"), arg("padding"), arg("dilation"),
        arg("out") = pybind11::none());
  m.def("involution_backward_input", &involution_backward_input, arg("grad_output"), arg("weight"), arg("input_size"), arg("stride"),
        arg("padding"), arg("dilation"), arg("out") = pybind11::none());
  m.def("involution_backward_weight", &involution_backward_weight, arg("grad_output"), arg("input"), arg("kernel_size"),
        arg("stride"), arg("padding"), arg("dilation"), arg("groups"), arg("out") = pybind11::none());
  m.def("involution_generated_forward", &involution_generated_forward, arg("input"), arg("feature"), arg("span_weight"),
        arg("span_bias"), arg("kernel_size"), arg("stride"), arg("padding"), arg("dilation"), arg("out") = pybind11::none());
  m.def("involution_generated_backward_input", &involution_generated_backward_input, arg("grad_output"), arg("feature"),
        arg("span_weight"), arg("span_bias"), arg("input_size"), arg("kernel_size"), arg("stride"), arg("padding"), arg("dilation"),
        arg("out") = pybind11::none());
  m.def("involution_generated_backward_generator", &involution_generated_backward_generator, arg("grad_output"), arg("feature"),
        arg("span_weight"), arg("input"), arg("kernel_size"), arg("stride"), arg("padding"), arg("dilation"),
        arg("grad_feature") = pybind11::none(), arg("grad_span_weight") = pybind11::none(), arg("grad_span_bias") = pybind11::none());
}
