"""The specs of ``oplib::involution`` and its two backward ops, built by one factory from
one table of cases: each op's arguments are read off the same (input, weight, grad_output)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor

from ...ops import involution as ops
from ...ops._common import CHANNELS_DIVISIBLE, DIM, FLOATING_DTYPE, PAIR_RANGE, SAME_DTYPE, window_output_size
from ...registry import Draw, ErrorInput, OpSpec, SampleInput
from ._oplib import register_oplib_spec
from ..inputs import LAYOUTS, draw_window, expect_message, make


def reference(input, weight, stride, padding, dilation) -> Tensor:
    """The unfold formulation of the paper's reference code: every output pixel's K*K
    neighbourhood, weighted by that pixel's kernel."""
    n, channels = input.shape[:2]
    _, groups, kh, kw, out_h, out_w = weight.shape
    columns = F.unfold(input, (kh, kw), dilation=dilation, padding=padding, stride=stride)
    columns = columns.view(n, groups, channels // groups, kh * kw, out_h, out_w)
    return (columns * weight.view(n, groups, 1, kh * kw, out_h, out_w)).sum(3).view(n, channels, out_h, out_w)


def backward_input_reference(grad_output, weight, input_size, stride, padding, dilation) -> Tensor:
    """The vector-Jacobian product of the reference with respect to its input."""
    n, channels = grad_output.shape[:2]
    with torch.enable_grad():
        input = grad_output.new_zeros((n, channels, *input_size), requires_grad=True)
        out = reference(input, weight, stride, padding, dilation)
        (grad,) = torch.autograd.grad(out, input, grad_output, create_graph=True)
    return grad


def backward_weight_reference(grad_output, input, kernel_size, stride, padding, dilation, groups) -> Tensor:
    """The vector-Jacobian product of the reference with respect to its weight."""
    n, _, out_h, out_w = grad_output.shape
    with torch.enable_grad():
        weight = input.new_zeros((n, groups, *kernel_size, out_h, out_w), requires_grad=True)
        out = reference(input, weight, stride, padding, dilation)
        (grad,) = torch.autograd.grad(out, weight, grad_output, create_graph=True)
    return grad


class CaseTensors(NamedTuple):
    input: Tensor  # (N, C, H, W)
    weight: Tensor  # (N, G, KH, KW, Ho, Wo)
    grad_output: Tensor  # (N, C, Ho, Wo)


class InvolutionCase(NamedTuple):
    name: str
    shape: tuple  # (N, C, H, W)
    groups: int
    kernel: tuple  # (KH, KW)
    stride: list = [1, 1]
    padding: list = [1, 1]
    dilation: list = [1, 1]
    layout: str = "contiguous"
    weight_layout: str = "contiguous"

    @property
    def window(self) -> tuple:
        return self.stride, self.padding, self.dilation

    def tensors(self, device: str, dtype: torch.dtype, requires_grad: bool) -> CaseTensors:
        out_size = window_output_size(self.shape[2:], self.kernel, self.stride, self.padding, self.dilation)
        n, channels = self.shape[:2]
        return CaseTensors(
            make(self.shape, device, dtype, requires_grad, self.layout),
            make((n, self.groups, *self.kernel, *out_size), device, dtype, requires_grad, self.weight_layout),
            make((n, channels, *out_size), device, dtype, requires_grad, self.layout),
        )


CASES = (
    InvolutionCase("3x3-g2", (2, 4, 9, 8), 2, (3, 3)),
    InvolutionCase("rect-kernel-hw-params", (2, 4, 9, 8), 1, (3, 2), [2, 1], [1, 0], [1, 2]),
    InvolutionCase("stride2-odd-size-g=c", (1, 4, 7, 7), 4, (3, 3), [2, 2]),
    InvolutionCase("dilation2", (1, 2, 8, 8), 1, (3, 3), [1, 1], [2, 2], [2, 2]),
    InvolutionCase("stride3-wide-kernel", (2, 6, 10, 11), 3, (2, 4), [3, 2], [2, 1]),
    InvolutionCase("empty-batch", (0, 4, 6, 6), 2, (3, 3)),
    InvolutionCase("channels_last", (2, 4, 6, 5), 2, (3, 3), layout="channels_last", weight_layout="noncontiguous"),
    InvolutionCase("transposed", (1, 4, 6, 7), 1, (3, 3), [2, 1], layout="transposed"),
)


def random_case(draw: Draw) -> InvolutionCase:
    groups = draw(1, 3)
    kernel, stride, padding, dilation, size = draw_window(draw)
    shape = (draw(0, 3), groups * draw(1, 3), *size)
    name = f"random-{list(shape)}-g{groups}-k{kernel}-s{stride}-p{padding}-d{dilation}"
    return InvolutionCase(name, shape, groups, tuple(kernel), stride, padding, dilation,
                          LAYOUTS[draw(0, 3)], LAYOUTS[draw(0, 2)])


# Each op's positional arguments for one case.
Arguments = Callable[[InvolutionCase, CaseTensors], tuple]


def _forward_arguments(case: InvolutionCase, t: CaseTensors) -> tuple:
    return (t.input, t.weight, *case.window)


def _backward_input_arguments(case: InvolutionCase, t: CaseTensors) -> tuple:
    return (t.grad_output, t.weight, list(case.shape[2:]), *case.window)


def _backward_weight_arguments(case: InvolutionCase, t: CaseTensors) -> tuple:
    return (t.grad_output, t.input, list(case.kernel), *case.window, case.groups)


def _errors(device: str) -> dict[str, list]:
    """Each op's error calls: (args, error type, name, expected message)."""
    f32 = dict(device=device, dtype=torch.float32)
    x = torch.randn(2, 4, 7, 7, **f32)
    w = torch.randn(2, 2, 3, 3, 7, 7, **f32)
    g = torch.randn(2, 4, 7, 7, **f32)
    same = ([1, 1], [1, 1], [1, 1])
    fwd, bwd_in, bwd_w = (dict(op=name) for name in ("involution", "involution_backward_input", "involution_backward_weight"))
    dtype_mismatch = dict(dtype=torch.float64, reference_dtype=torch.float32)
    return {
        "involution": [
            ((torch.randn(4, 7, 7, **f32), w, *same), RuntimeError, "3d-input",
             expect_message(DIM, **fwd, name="input", layout=ops.INPUT_LAYOUT, dim=3, size=[4, 7, 7])),
            ((x, torch.randn(2, 2, 9, 7, 7, **f32), *same), RuntimeError, "5d-weight",
             expect_message(DIM, **fwd, name="weight", layout=ops.WEIGHT_LAYOUT, dim=5, size=[2, 2, 9, 7, 7])),
            ((x, torch.randn(3, 2, 3, 3, 7, 7, **f32), *same), RuntimeError, "batch-mismatch",
             expect_message(ops.BATCH, input_size=[2, 4, 7, 7], weight_size=[3, 2, 3, 3, 7, 7])),
            ((x, torch.randn(2, 3, 3, 3, 7, 7, **f32), *same), RuntimeError, "groups-divide",
             expect_message(ops.GROUPS_DIVIDE, channels=4, groups=3, input_size=[2, 4, 7, 7],
                            weight_size=[2, 3, 3, 3, 7, 7])),
            ((x, w, [2, 2], [1, 1], [1, 1]), RuntimeError, "output-size",
             expect_message(ops.OUTPUT_SIZE, expected=(4, 4), input_size=[2, 4, 7, 7], kernel=[3, 3], stride=[2, 2],
                            padding=[1, 1], dilation=[1, 1], got=(7, 7))),
            ((x, w.double(), *same), RuntimeError, "dtype-mismatch",
             expect_message(SAME_DTYPE, **fwd, name="weight", reference_name="input", **dtype_mismatch)),
            ((x.long(), w.long(), *same), RuntimeError, "integer",
             expect_message(FLOATING_DTYPE, **fwd, name="input", dtype=torch.int64)),
            ((x, w, [0, 1], [1, 1], [1, 1]), ValueError, "zero-stride",
             expect_message(PAIR_RANGE, **fwd, name="stride", bound="positive", values=[0, 1])),
            ((x, w, [1, 1], [1, 1], [1, 0]), ValueError, "zero-dilation",
             expect_message(PAIR_RANGE, **fwd, name="dilation", bound="positive", values=[1, 0])),
            ((x, w, [1, 1], [-1, 1], [1, 1]), ValueError, "negative-padding",
             expect_message(PAIR_RANGE, **fwd, name="padding", bound="non-negative", values=[-1, 1])),
            ((x, torch.randn(2, 2, 0, 3, 10, 7, **f32), *same), RuntimeError, "zero-kernel-height",
             expect_message(ops.KERNEL_SIZE, **fwd, weight_size=[2, 2, 0, 3, 10, 7])),
            ((x, torch.randn(2, 2, 3, 0, 7, 10, **f32), *same), RuntimeError, "zero-kernel-width",
             expect_message(ops.KERNEL_SIZE, **fwd, weight_size=[2, 2, 3, 0, 7, 10])),
        ],
        "involution_backward_input": [
            ((g[0], w, [7, 7], *same), RuntimeError, "3d-grad_output",
             expect_message(DIM, **bwd_in, name="grad_output", layout=ops.GRAD_OUTPUT_LAYOUT, dim=3, size=[4, 7, 7])),
            ((g, w, [8, 7], *same), RuntimeError, "input-size",
             expect_message(ops.OUTPUT_SIZE_OF_INPUT, expected=[8, 7], input_size=[8, 7], grad_size=[2, 4, 7, 7],
                            weight_size=[2, 2, 3, 3, 7, 7])),
            ((g, w, [7], *same), ValueError, "input-size-length", expect_message(ops.INPUT_SIZE_PAIR, input_size=[7])),
            ((g, torch.randn(2, 3, 3, 3, 7, 7, **f32), [7, 7], *same), RuntimeError, "groups-divide",
             expect_message(ops.WEIGHT_FOR_GRAD, grad_size=[2, 4, 7, 7], weight_size=[2, 3, 3, 3, 7, 7])),
            # Found by tools/plant_bugs.py: the batch check had no error input of its own.
            ((g, torch.randn(3, 2, 3, 3, 7, 7, **f32), [7, 7], *same), RuntimeError, "batch",
             expect_message(ops.WEIGHT_FOR_GRAD, grad_size=[2, 4, 7, 7], weight_size=[3, 2, 3, 3, 7, 7])),
            ((g.long(), w.long(), [7, 7], *same), RuntimeError, "integer",
             expect_message(FLOATING_DTYPE, **bwd_in, name="grad_output", dtype=torch.int64)),
            ((g, torch.randn(2, 2, 0, 3, 7, 7, **f32), [4, 7], *same), RuntimeError, "zero-kernel-height",
             expect_message(ops.KERNEL_SIZE, **bwd_in, weight_size=[2, 2, 0, 3, 7, 7])),
        ],
        "involution_backward_weight": [
            ((g[0], x, [3, 3], *same, 2), RuntimeError, "3d-grad_output",
             expect_message(DIM, **bwd_w, name="grad_output", layout=ops.GRAD_OUTPUT_LAYOUT, dim=3, size=[4, 7, 7])),
            ((g, x, [3, 3], *same, 3), RuntimeError, "groups-divide",
             expect_message(CHANNELS_DIVISIBLE, **bwd_w, channels=4, groups=3)),
            ((g, x, [3, 3], [2, 2], [1, 1], [1, 1], 2), RuntimeError, "grad-size",
             expect_message(ops.GRAD_OUTPUT_SIZE, expected=[2, 4, 4, 4], got=[2, 4, 7, 7], input_size=[2, 4, 7, 7])),
            # Found by tools/plant_bugs.py: above, grad_output and input have one size, so a
            # message that swapped them passed.
            ((g, torch.randn(2, 4, 9, 9, **f32), [3, 3], *same, 2), RuntimeError, "grad-size-of-another-input",
             expect_message(ops.GRAD_OUTPUT_SIZE, expected=[2, 4, 9, 9], got=[2, 4, 7, 7], input_size=[2, 4, 9, 9])),
            ((g, x, [3, 0], *same, 2), ValueError, "kernel-size", expect_message(ops.KERNEL_SIZE_PAIR, kernel_size=[3, 0])),
            ((g, x.double(), [3, 3], *same, 2), RuntimeError, "dtype-mismatch",
             expect_message(SAME_DTYPE, **bwd_w, name="input", reference_name="grad_output", **dtype_mismatch)),
        ],
    }


def _spec(name: str, reference_fn, arguments: Arguments) -> OpSpec:
    def sample_inputs(device: str, dtype: torch.dtype, requires_grad: bool) -> Iterator[SampleInput]:
        for case in CASES:
            yield SampleInput(arguments(case, case.tensors(device, dtype, requires_grad)), case.name)

    def error_inputs(device: str) -> Iterator[ErrorInput]:
        for args, error_type, error_name, match in _errors(device)[name]:
            yield ErrorInput(SampleInput(args, error_name), error_type, match)

    def random_sample(draw: Draw, device: str, dtype: torch.dtype, requires_grad: bool) -> SampleInput:
        case = random_case(draw)
        return SampleInput(arguments(case, case.tensors(device, dtype, requires_grad)), case.name)

    return register_oplib_spec(name, reference_fn, sample_inputs, error_inputs, random_sample,
                               fast_gradgradcheck=True)


SPECS = tuple(
    _spec(name, reference_fn, arguments)
    for name, reference_fn, arguments in (
        ("involution", reference, _forward_arguments),
        ("involution_backward_input", backward_input_reference, _backward_input_arguments),
        ("involution_backward_weight", backward_weight_reference, _backward_weight_arguments),
    )
)
