"""Involution (Li et al., CVPR 2021) and its two backward ops: the ops' contract.

    out[n, c, i, j] = sum_{a < KH, b < KW} weight[n, c // (C/G), a, b, i, j]
                      * input[n, c, i*sh - ph + a*dh, j*sw - pw + b*dw]     (0 outside the image)

input: (N, C, H, W); weight: (N, G, KH, KW, Ho, Wo), the layout of the paper's code, so the
output (N, G*KH*KW, Ho, Wo) of a kernel-generating conv views into it.

Involution is bilinear in (input, weight), so every derivative of the three ops here is
again one of them:

    involution(x, w)               d/dx: backward_input(g, w)     d/dw: backward_weight(g, x)
    backward_input(g, w)  (-> dx)  d/dg: involution(u, w)         d/dw: backward_weight(g, u)
    backward_weight(g, x) (-> dw)  d/dg: involution(x, u)         d/dx: backward_input(g, u)

(u is the incoming gradient). Each op registers that rule (``_bilinear``), so derivatives of
any order work in eager mode, and forward-mode AD and vmap follow from it.

This file states the schemas, the argument rules, the results' layouts (the fakes'), the
derivatives, autocast and the FLOP formula; the device code lives in
``oplib.kernels.involution``, whose ``cpu`` and ``cuda`` backends write into the result each
op allocates here in its fake's layout.
"""

from __future__ import annotations

import torch
from torch import Tensor
from torch.utils.flop_counter import register_flop_formula

from .._memory_format import is_channels_last
from ..kernels.involution import cpu, cuda
from ..kernels.involution.layouts import result_like, weight_result
from ._bilinear import register_bilinear
from ._common import CHANNELS_DIVISIBLE, GROUPS_POSITIVE, register_autocast_policy, window_output_size
from ._rules import Contract, Rule, Rules, register_contract, tensor_rules, window_fits_rules, window_rules

# ---------------------------------------------------------------------------------------
# Argument rules, each stated once: the kernels' eager checks and the fakes' traced ones
# ---------------------------------------------------------------------------------------


# The layouts the dimension checks name.
INPUT_LAYOUT = "4-D (N, C, H, W)"
WEIGHT_LAYOUT = "6-D (N, G, KH, KW, Ho, Wo)"
GRAD_OUTPUT_LAYOUT = "4-D (N, C, Ho, Wo)"

KERNEL_SIZE = "oplib.{op}: expected weight's kernel size (KH, KW) to be positive, got weight of size {weight_size}"
BATCH = (
    "oplib.involution: expected weight's batch size to equal input's, "
    "got input of size {input_size} and weight of size {weight_size}"
)
NO_GROUPS = "oplib.involution: expected at least one group, got weight of size {weight_size}"
GROUPS_DIVIDE = (
    "oplib.involution: expected input channels ({channels}) to be divisible by the groups of weight ({groups}), "
    "got input of size {input_size} and weight of size {weight_size}"
)
OUTPUT_SIZE = (
    "oplib.involution: expected weight's output size (Ho, Wo) to be {expected}, the output size of input "
    "{input_size} with kernel {kernel}, stride {stride}, padding {padding}, dilation {dilation}; got {got}"
)
INPUT_SIZE_PAIR = "oplib.involution_backward_input: expected input_size to be (H, W), got {input_size}"
WEIGHT_FOR_GRAD = (
    "oplib.involution_backward_input: expected weight (N, G, ...) with the batch size of grad_output and G "
    "dividing its channels, got grad_output of size {grad_size} and weight of size {weight_size}"
)
OUTPUT_SIZE_OF_INPUT = (
    "oplib.involution_backward_input: expected grad_output and weight to have the output size {expected} of "
    "input size {input_size}, got grad_output of size {grad_size} and weight of size {weight_size}"
)
KERNEL_SIZE_PAIR = "oplib.involution_backward_weight: expected kernel_size to be a positive (KH, KW), got {kernel_size}"
GRAD_OUTPUT_SIZE = "oplib.involution_backward_weight: expected grad_output of size {expected}, got {got} (input of size {input_size})"


def _matches(size, expected):
    """(H, W) == expected, as one condition that stays symbolic while tracing."""
    return (size[0] == expected[0]) & (size[1] == expected[1])


def _sizes(first, second, *_) -> dict:
    return dict(input_size=list(first.shape), weight_size=list(second.shape))


def _kernel_positive(op: str) -> Rule:
    """The kernel dims (KH, KW) of the (N, G, KH, KW, Ho, Wo) second operand are positive."""
    return Rule(lambda _, w, *__: (w.shape[2] > 0) & (w.shape[3] > 0),
                lambda _, w, *__: KERNEL_SIZE.format(op=op, weight_size=list(w.shape)))


# involution(input, weight, stride, padding, dilation)
_INVOLUTION_RULES = Rules("oplib::involution", [
    *tensor_rules("involution", (0, "input", 4, INPUT_LAYOUT), (1, "weight", 6, WEIGHT_LAYOUT)),
    *window_rules("involution", 2),
    Rule(lambda x, w, *_: w.shape[0] == x.shape[0], lambda *a: BATCH.format(**_sizes(*a))),
    Rule(lambda x, w, *_: w.shape[1] > 0, lambda *a: NO_GROUPS.format(**_sizes(*a))),
    _kernel_positive("involution"),
    Rule(lambda x, w, *_: x.shape[1] % w.shape[1] == 0,
         lambda x, w, *_: GROUPS_DIVIDE.format(channels=x.shape[1], groups=w.shape[1], **_sizes(x, w))),
    *window_fits_rules("involution", lambda x, *_: x.shape[2:], lambda x, w, *_: w.shape[2:4], lambda *a: a[3],
                       lambda *a: a[4]),
    Rule(lambda x, w, *p: _matches(w.shape[4:], window_output_size(x.shape[2:], w.shape[2:4], *p)),
         lambda x, w, s, p, d: OUTPUT_SIZE.format(
             expected=window_output_size(x.shape[2:], w.shape[2:4], s, p, d), input_size=list(x.shape),
             kernel=list(w.shape[2:4]), stride=list(s), padding=list(p), dilation=list(d), got=tuple(w.shape[4:]))),
])


def _grad_sizes(g, w, *_) -> dict:
    return dict(grad_size=list(g.shape), weight_size=list(w.shape))


# involution_backward_input(grad_output, weight, input_size, stride, padding, dilation)
_BACKWARD_INPUT_RULES = Rules("oplib::involution_backward_input", [
    *tensor_rules("involution_backward_input", (0, "grad_output", 4, GRAD_OUTPUT_LAYOUT), (1, "weight", 6, WEIGHT_LAYOUT)),
    *window_rules("involution_backward_input", 3),
    Rule(lambda g, w, size, *_: len(size) == 2, lambda g, w, size, *_: INPUT_SIZE_PAIR.format(input_size=list(size)),
         ValueError),
    Rule(lambda g, w, *_: (w.shape[0] == g.shape[0]) & (w.shape[1] > 0), lambda *a: WEIGHT_FOR_GRAD.format(**_grad_sizes(*a))),
    Rule(lambda g, w, *_: g.shape[1] % w.shape[1] == 0, lambda *a: WEIGHT_FOR_GRAD.format(**_grad_sizes(*a))),
    _kernel_positive("involution_backward_input"),
    *window_fits_rules("involution_backward_input", lambda g, w, size, *_: size, lambda g, w, *_: w.shape[2:4],
                       lambda *a: a[4], lambda *a: a[5]),
    Rule(lambda g, w, size, *p: _matches(w.shape[4:], g.shape[2:])
         & _matches(window_output_size(size, w.shape[2:4], *p), g.shape[2:]),
         lambda g, w, size, *p: OUTPUT_SIZE_OF_INPUT.format(
             expected=list(window_output_size(size, w.shape[2:4], *p)), input_size=list(size), **_grad_sizes(g, w))),
])

# involution_backward_weight(grad_output, input, kernel_size, stride, padding, dilation, groups)
_BACKWARD_WEIGHT_RULES = Rules("oplib::involution_backward_weight", [
    *tensor_rules("involution_backward_weight", (0, "grad_output", 4, GRAD_OUTPUT_LAYOUT), (1, "input", 4, INPUT_LAYOUT)),
    *window_rules("involution_backward_weight", 3),
    Rule(lambda g, x, kernel, *_: len(kernel) == 2,
         lambda g, x, kernel, *_: KERNEL_SIZE_PAIR.format(kernel_size=list(kernel)), ValueError),
    Rule(lambda g, x, kernel, *_: (kernel[0] > 0) & (kernel[1] > 0),
         lambda g, x, kernel, *_: KERNEL_SIZE_PAIR.format(kernel_size=list(kernel)), ValueError),
    Rule(lambda *a: a[6] > 0, lambda *a: GROUPS_POSITIVE.format(op="involution_backward_weight", groups=a[6]),
         ValueError),
    Rule(lambda g, x, *a: x.shape[1] % a[-1] == 0,
         lambda g, x, *a: CHANNELS_DIVISIBLE.format(op="involution_backward_weight", channels=x.shape[1], groups=a[-1])),
    *window_fits_rules("involution_backward_weight", lambda g, x, *_: x.shape[2:], lambda g, x, kernel, *_: kernel,
                       lambda *a: a[4], lambda *a: a[5]),
    Rule(lambda g, x, kernel, s, p, d, _: (g.shape[0] == x.shape[0]) & (g.shape[1] == x.shape[1])
         & _matches(g.shape[2:], window_output_size(x.shape[2:], kernel, s, p, d)),
         lambda g, x, kernel, s, p, d, _: GRAD_OUTPUT_SIZE.format(
             expected=[*x.shape[:2], *window_output_size(x.shape[2:], kernel, s, p, d)], got=list(g.shape),
             input_size=list(x.shape))),
])


# ---------------------------------------------------------------------------------------
# The three custom ops: on each device the kernel enforces the rules, allocates the result
# in the fake's layout and hands it to that device's backend to write
# ---------------------------------------------------------------------------------------


def _backward_weight_result(grad_output, input, kernel_size, stride, padding, dilation, groups) -> Tensor:
    """(N, G, KH, KW, Ho, Wo), pixel-major in memory when the input is channels_last."""
    n, _, out_h, out_w = grad_output.shape
    return weight_result(grad_output, (n, groups, *kernel_size, out_h, out_w), is_channels_last(input))


_INVOLUTION = Contract(_INVOLUTION_RULES, lambda input, weight, *_: result_like(input, weight.shape[4:]),
                       {"cpu": cpu.involution, "cuda": cuda.involution},
                       cuda.TUNING_CANDIDATES["oplib::involution"])
_BACKWARD_INPUT = Contract(_BACKWARD_INPUT_RULES, lambda grad, _, size, *__: result_like(grad, size),
                           {"cpu": cpu.involution_backward_input, "cuda": cuda.involution_backward_input},
                           cuda.TUNING_CANDIDATES["oplib::involution_backward_input"])
_BACKWARD_WEIGHT = Contract(_BACKWARD_WEIGHT_RULES, _backward_weight_result,
                            {"cpu": cpu.involution_backward_weight, "cuda": cuda.involution_backward_weight},
                            cuda.TUNING_CANDIDATES["oplib::involution_backward_weight"])


def _involution_cpu(input: Tensor, weight: Tensor, stride: list[int], padding: list[int], dilation: list[int]) -> Tensor:
    """input: (N, C, H, W), weight: (N, G, KH, KW, Ho, Wo) -> (N, C, Ho, Wo), channels_last
    when the input is."""
    return _INVOLUTION.run("cpu", input, weight, stride, padding, dilation)


def _backward_input_cpu(
    grad_output: Tensor, weight: Tensor, input_size: list[int], stride: list[int], padding: list[int],
    dilation: list[int],
) -> Tensor:
    """grad_output: (N, C, Ho, Wo), weight: (N, G, KH, KW, Ho, Wo), input_size: (H, W)
    -> grad_input: (N, C, H, W), channels_last when grad_output is."""
    return _BACKWARD_INPUT.run("cpu", grad_output, weight, input_size, stride, padding, dilation)


def _backward_weight_cpu(
    grad_output: Tensor, input: Tensor, kernel_size: list[int], stride: list[int], padding: list[int],
    dilation: list[int], groups: int,
) -> Tensor:
    """grad_output: (N, C, Ho, Wo), input: (N, C, H, W) -> grad_weight: (N, G, KH, KW, Ho, Wo),
    pixel-major in memory when the input is channels_last."""
    return _BACKWARD_WEIGHT.run("cpu", grad_output, input, kernel_size, stride, padding, dilation, groups)


# Registered for CPU and CUDA only: any other device type gets torch's own "could not run
# ... with arguments from the ... backend" error.
involution = torch.library.custom_op("oplib::involution", _involution_cpu, mutates_args=(), device_types="cpu")
involution_backward_input = torch.library.custom_op(
    "oplib::involution_backward_input", _backward_input_cpu, mutates_args=(), device_types="cpu"
)
involution_backward_weight = torch.library.custom_op(
    "oplib::involution_backward_weight", _backward_weight_cpu, mutates_args=(), device_types="cpu"
)
register_contract(involution, _INVOLUTION)
register_contract(involution_backward_input, _BACKWARD_INPUT)
register_contract(involution_backward_weight, _BACKWARD_WEIGHT)


# ---------------------------------------------------------------------------------------
# Derivatives, vmap and jvp: the module docstring's table, (u, the other operand, the
# operands' shapes, the parameters after them)
# ---------------------------------------------------------------------------------------

register_bilinear(
    involution,
    lambda u, w, x_shape, w_shape, p: involution_backward_input(u, w, list(x_shape[2:]), *p),
    lambda u, x, x_shape, w_shape, p: involution_backward_weight(u, x, list(w_shape[2:4]), *p, w_shape[1]),
)
register_bilinear(
    involution_backward_input,
    lambda u, w, g_shape, w_shape, p: involution(u, w, *p[1:]),
    lambda u, g, g_shape, w_shape, p: involution_backward_weight(g, u, list(w_shape[2:4]), *p[1:], w_shape[1]),
)
register_bilinear(
    involution_backward_weight,
    lambda u, x, g_shape, x_shape, p: involution(x, u, *p[1:4]),
    lambda u, g, g_shape, x_shape, p: involution_backward_input(g, u, list(x_shape[2:]), *p[1:4]),
)

for _qualname in ("oplib::involution", "oplib::involution_backward_input", "oplib::involution_backward_weight"):
    register_autocast_policy(_qualname, "cpu", "lower_precision")
    register_autocast_policy(_qualname, "cuda", "lower_precision")


def _involution_flop_count(output_shape, kernel_size) -> int:
    """FLOPs as FlopCounterMode counts convolutions, 2 per multiply-add: each of the three ops
    does one multiply-add per (element of the (N, C, Ho, Wo) output or grad_output, kernel tap)."""
    n, channels, out_h, out_w = output_shape
    return 2 * n * channels * out_h * out_w * kernel_size[0] * kernel_size[1]


@register_flop_formula(torch.ops.oplib.involution)
def _involution_flops(input_shape, weight_shape, stride, padding, dilation, out_shape=None, **kwargs) -> int:
    return _involution_flop_count(out_shape, weight_shape[2:4])


@register_flop_formula(torch.ops.oplib.involution_backward_input)
def _involution_backward_input_flops(grad_output_shape, weight_shape, *args, out_shape=None, **kwargs) -> int:
    return _involution_flop_count(grad_output_shape, weight_shape[2:4])


@register_flop_formula(torch.ops.oplib.involution_backward_weight)
def _involution_backward_weight_flops(grad_output_shape, input_shape, kernel_size, *args, out_shape=None, **kwargs) -> int:
    return _involution_flop_count(grad_output_shape, kernel_size)
