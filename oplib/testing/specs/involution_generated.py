"""The specs of ``oplib::involution_generated``, its grad_input op and the gradient op of its
generator, on involution's own table of cases (``specs.involution.CASES``) with a generator
added: a feature map of R channels at the output size, a span matrix and a bias (none in some
cases)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import NamedTuple, Optional

import torch
from torch import Tensor

from ...ops import involution as unfused_ops
from ...ops import involution_generated as ops
from ...ops._common import CHANNELS_DIVISIBLE, DIM, FLOATING_DTYPE, PAIR_RANGE, SAME_DTYPE, window_output_size
from ...registry import Draw, ErrorInput, OpSpec, SampleInput
from ._oplib import register_oplib_spec
from ..inputs import expect_message, make
from .involution import CASES, InvolutionCase, random_case
from .involution import backward_input_reference as involution_backward_input_reference
from .involution import backward_weight_reference as involution_backward_weight_reference
from .involution import reference as involution_reference


def reference(input, feature, span_weight, span_bias, kernel_size, stride, padding, dilation) -> Tensor:
    """The span 1x1 conv as a sum over the reduced channels, then involution's unfold reference."""
    weight = _reference_weight(feature, span_weight, span_bias, kernel_size)
    return involution_reference(input, weight, stride, padding, dilation)


def backward_input_reference(grad_output, feature, span_weight, span_bias, input_size, kernel_size, stride, padding,
                             dilation) -> Tensor:
    """The vector-Jacobian product of the reference with respect to its input."""
    weight = _reference_weight(feature, span_weight, span_bias, kernel_size)
    return involution_backward_input_reference(grad_output, weight, input_size, stride, padding, dilation)


def backward_generator_reference(grad_output, feature, span_weight, input, kernel_size, stride, padding,
                                 dilation) -> tuple[Tensor, Tensor, Tensor]:
    """The generated weight's gradient by involution's reference, contracted as the module
    docstring of ``oplib.ops.involution_generated`` says (plain torch: differentiable, and
    traceable by the torch.func transforms)."""
    n, reduced, out_h, out_w = feature.shape
    rows = span_weight.shape[0]
    gw = involution_backward_weight_reference(grad_output, input, kernel_size, stride, padding, dilation,
                                              rows // (kernel_size[0] * kernel_size[1]))
    gw = gw.reshape(n, rows, out_h * out_w)
    f = feature.reshape(n, reduced, out_h * out_w)
    grad_feature = torch.einsum("kr,nkp->nrp", span_weight, gw).reshape(feature.shape)
    return grad_feature, torch.einsum("nkp,nrp->kr", gw, f), gw.sum((0, 2))


def _reference_weight(feature, span_weight, span_bias, kernel_size) -> Tensor:
    """(N, R, Ho, Wo) -> (N, G, KH, KW, Ho, Wo): weight[n, k, i, j] = bias[k] + sum_r span[k, r] feature[n, r, i, j]."""
    n, _, out_h, out_w = feature.shape
    weight = (span_weight[None, :, :, None, None] * feature[:, None]).sum(2)
    if span_bias is not None:
        weight = weight + span_bias[None, :, None, None]
    return weight.view(n, span_weight.shape[0] // (kernel_size[0] * kernel_size[1]), *kernel_size, out_h, out_w)


class GeneratorCase(NamedTuple):
    case: InvolutionCase
    reduced: int
    bias: bool = True


CASES_GENERATED = tuple(GeneratorCase(case, reduced, bias) for case, reduced, bias in zip(
    CASES, (3, 2, 1, 4, 2, 3, 2, 5), (True, True, False, True, True, True, True, False)))


class Tensors(NamedTuple):
    input: Tensor
    grad_output: Tensor
    feature: Tensor
    span_weight: Tensor
    span_bias: Optional[Tensor]


def _tensors(generated: GeneratorCase, device: str, dtype: torch.dtype, requires_grad: bool) -> Tensors:
    case = generated.case
    t = case.tensors(device, dtype, requires_grad)
    out_size = window_output_size(case.shape[2:], case.kernel, case.stride, case.padding, case.dilation)
    rows = case.groups * case.kernel[0] * case.kernel[1]
    # The feature is post-ReLU in Involution2d; any values are valid for the op.
    feature = make((case.shape[0], generated.reduced, *out_size), device, dtype, requires_grad, case.layout)
    span_weight = make((rows, generated.reduced), device, dtype, requires_grad, case.weight_layout)
    span_bias = make((rows,), device, dtype, requires_grad) if generated.bias else None
    return Tensors(t.input, t.grad_output, feature, span_weight, span_bias)


def _forward_arguments(generated: GeneratorCase, t: Tensors) -> tuple:
    case = generated.case
    return (t.input, t.feature, t.span_weight, t.span_bias, list(case.kernel), *case.window)


def _backward_input_arguments(generated: GeneratorCase, t: Tensors) -> tuple:
    case = generated.case
    return (t.grad_output, t.feature, t.span_weight, t.span_bias, list(case.shape[2:]), list(case.kernel), *case.window)


def _backward_generator_arguments(generated: GeneratorCase, t: Tensors) -> tuple:
    case = generated.case
    return (t.grad_output, t.feature, t.span_weight, t.input, list(case.kernel), *case.window)


def _random_case(draw: Draw) -> GeneratorCase:
    return GeneratorCase(random_case(draw), draw(1, 4), bool(draw(0, 1)))


def _errors(device: str) -> dict[str, list]:
    """Each op's error calls: (args, error type, name, expected message)."""
    f32 = dict(device=device, dtype=torch.float32)
    x = torch.randn(2, 4, 7, 7, **f32)
    f = torch.randn(2, 3, 7, 7, **f32)
    s = torch.randn(18, 3, **f32)  # G = 2, 3x3 taps
    b = torch.randn(18, **f32)
    k, same = [3, 3], ([1, 1], [1, 1], [1, 1])
    fwd, bwd, gen = dict(op=ops.FORWARD), dict(op=ops.BACKWARD_INPUT), dict(op=ops.BACKWARD_GENERATOR)
    return {
        ops.FORWARD: [
            ((x[0], f, s, b, k, *same), RuntimeError, "3d-input",
             expect_message(DIM, **fwd, name="input", layout=unfused_ops.INPUT_LAYOUT, dim=3, size=[4, 7, 7])),
            ((x, f[0], s, b, k, *same), RuntimeError, "3d-feature",
             expect_message(DIM, **fwd, name="feature", layout=ops.FEATURE_LAYOUT, dim=3, size=[3, 7, 7])),
            ((x, f, s[..., None, None], b, k, *same), RuntimeError, "4d-span-weight",
             expect_message(DIM, **fwd, name="span_weight", layout=ops.SPAN_WEIGHT_LAYOUT, dim=4, size=[18, 3, 1, 1])),
            ((x, f, s, b[None], k, *same), RuntimeError, "2d-span-bias",
             expect_message(DIM, **fwd, name="span_bias", layout=ops.SPAN_BIAS_LAYOUT, dim=2, size=[1, 18])),
            ((x.long(), f.long(), s.long(), b.long(), k, *same), RuntimeError, "integer",
             expect_message(FLOATING_DTYPE, **fwd, name="input", dtype=torch.int64)),
            ((x, f.double(), s, b, k, *same), RuntimeError, "dtype-mismatch",
             expect_message(SAME_DTYPE, **fwd, name="feature", reference_name="input", dtype=torch.float64,
                            reference_dtype=torch.float32)),
            ((x, f, s, b, [3, 0], *same), ValueError, "kernel-size",
             expect_message(ops.KERNEL_SIZE, **fwd, kernel_size=[3, 0])),
            ((x, f, s[:16], b[:16], k, *same), RuntimeError, "span-rows",
             expect_message(ops.SPAN_ROWS, **fwd, rows=16, taps=9, span_size=[16, 3])),
            ((x, f, torch.randn(27, 3, **f32), None, k, *same), RuntimeError, "groups-divide",
             expect_message(CHANNELS_DIVISIBLE, **fwd, channels=4, groups=3)),
            ((x, f[:, :2], s, b, k, *same), RuntimeError, "reduced-mismatch",
             expect_message(ops.REDUCED, **fwd, feature_size=[2, 2, 7, 7], span_size=[18, 3])),
            ((x, f, s, b[:9], k, *same), RuntimeError, "span-bias-size",
             expect_message(ops.SPAN_BIAS, **fwd, rows=18, bias_size=[9])),
            ((x, f, s, b, k, [2, 2], [1, 1], [1, 1]), RuntimeError, "feature-size",
             expect_message(ops.FEATURE_SIZE, **fwd, batch=2, out_h=4, out_w=4, name="input", feature_size=[2, 3, 7, 7])),
            ((x, f[:1], s, b, k, *same), RuntimeError, "feature-batch",
             expect_message(ops.FEATURE_SIZE, **fwd, batch=2, out_h=7, out_w=7, name="input", feature_size=[1, 3, 7, 7])),
            ((x, f, s, b, k, [0, 1], [1, 1], [1, 1]), ValueError, "zero-stride",
             expect_message(PAIR_RANGE, **fwd, name="stride", bound="positive", values=[0, 1])),
        ],
        ops.BACKWARD_INPUT: [
            ((x, f, s, b, [7], k, *same), ValueError, "input-size-length",
             expect_message(ops.INPUT_SIZE_PAIR, input_size=[7])),
            ((x, f, s, b, [9, 7], k, *same), RuntimeError, "grad-output-size",
             expect_message(ops.GRAD_OUTPUT_SIZE, **bwd, expected=[9, 7], input_size=[9, 7], grad_size=[2, 4, 7, 7])),
            ((x, f[:, :2], s, b, [7, 7], k, *same), RuntimeError, "reduced-mismatch",
             expect_message(ops.REDUCED, **bwd, feature_size=[2, 2, 7, 7], span_size=[18, 3])),
            ((x, f, s.double(), b, [7, 7], k, *same), RuntimeError, "dtype-mismatch",
             expect_message(SAME_DTYPE, **bwd, name="span_weight", reference_name="grad_output", dtype=torch.float64,
                            reference_dtype=torch.float32)),
        ],
        ops.BACKWARD_GENERATOR: [
            ((x, f, s, x[0], k, *same), RuntimeError, "3d-input",
             expect_message(DIM, **gen, name="input", layout=unfused_ops.INPUT_LAYOUT, dim=3, size=[4, 7, 7])),
            ((x, f, s, x[:1], k, *same), RuntimeError, "input-batch",
             expect_message(ops.INPUT_BATCH_CHANNELS, **gen, batch=2, channels=4, input_size=[1, 4, 7, 7])),
            ((x, f, s, torch.randn(2, 4, 9, 7, **f32), k, *same), RuntimeError, "grad-output-size",
             expect_message(ops.GRAD_OUTPUT_SIZE, **gen, expected=[9, 7], input_size=[9, 7], grad_size=[2, 4, 7, 7])),
            ((x, f[:, :2], s, x, k, *same), RuntimeError, "reduced-mismatch",
             expect_message(ops.REDUCED, **gen, feature_size=[2, 2, 7, 7], span_size=[18, 3])),
            ((x, f, s, x.double(), k, *same), RuntimeError, "dtype-mismatch",
             expect_message(SAME_DTYPE, **gen, name="input", reference_name="grad_output", dtype=torch.float64,
                            reference_dtype=torch.float32)),
            ((x, f, torch.randn(27, 3, **f32), x, k, *same), RuntimeError, "groups-divide",
             expect_message(CHANNELS_DIVISIBLE, **gen, channels=4, groups=3)),
        ],
    }


def _spec(name: str, reference_fn, arguments) -> OpSpec:
    def sample_inputs(device: str, dtype: torch.dtype, requires_grad: bool) -> Iterator[SampleInput]:
        for generated in CASES_GENERATED:
            yield SampleInput(arguments(generated, _tensors(generated, device, dtype, requires_grad)),
                              generated.case.name)

    def error_inputs(device: str) -> Iterator[ErrorInput]:
        for args, error_type, error_name, match in _errors(device)[name]:
            yield ErrorInput(SampleInput(args, error_name), error_type, match)

    def random_sample(draw: Draw, device: str, dtype: torch.dtype, requires_grad: bool) -> SampleInput:
        generated = _random_case(draw)
        return SampleInput(arguments(generated, _tensors(generated, device, dtype, requires_grad)),
                           f"{generated.case.name}-r{generated.reduced}")

    return register_oplib_spec(name, reference_fn, sample_inputs, error_inputs, random_sample,
                               fast_gradgradcheck=True)


SPECS = (
    _spec(ops.FORWARD, reference, _forward_arguments),
    _spec(ops.BACKWARD_INPUT, backward_input_reference, _backward_input_arguments),
    _spec(ops.BACKWARD_GENERATOR, backward_generator_reference, _backward_generator_arguments),
)
