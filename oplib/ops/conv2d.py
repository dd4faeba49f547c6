"""``oplib::conv2d(Tensor input, Tensor weight, Tensor? bias, SymInt[] stride,
SymInt[] padding, SymInt[] dilation, SymInt groups) -> Tensor``.

``torch.nn.functional.conv2d`` semantics for batched ``(N, C, H, W)`` and unbatched
``(C, H, W)`` input, with an explicit backward through ``aten.convolution_backward``
(the kernel torch's own autograd uses; it is differentiable again, so double backward
works).
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor
from torch.utils.flop_counter import register_flop_formula

from ._common import CHANNELS_DIVISIBLE, GROUPS_POSITIVE, register_autocast_policy, window_output_size
from ._rules import Rule, Rules, bias_rule, tensor_rules, window_fits_rules, window_rules
from .._memory_format import is_channels_last
from ._transforms import register_jvp, sum_tangents


# The layouts the dimension checks name.
INPUT_LAYOUT = "3-D (C, H, W) or 4-D (N, C, H, W)"
WEIGHT_LAYOUT = "4-D (out_channels, in_channels / groups, KH, KW)"

OUT_CHANNELS_DIVISIBLE = "oplib.conv2d: expected weight's out_channels ({out_channels}) to be divisible by groups ({groups})"
CHANNELS = (
    "oplib.conv2d: expected input of size {input_size} to have {expected} channels "
    "(weight of size {weight_size}, groups={groups}), got {channels} channels"
)


def _channels_message(x, w, *a) -> str:
    return CHANNELS.format(input_size=list(x.shape), expected=w.shape[1] * a[-1], weight_size=list(w.shape),
                           groups=a[-1], channels=x.shape[-3])


# conv2d(input, weight, bias, stride, padding, dilation, groups)
_CONV2D_RULES = Rules("oplib::conv2d", [
    *tensor_rules("conv2d", (0, "input", (3, 4), INPUT_LAYOUT), (1, "weight", 4, WEIGHT_LAYOUT),
                  (2, "bias", None, None, True)),
    *window_rules("conv2d", 3),
    Rule(lambda *a: a[6] > 0, lambda *a: GROUPS_POSITIVE.format(op="conv2d", groups=a[6]), ValueError),
    Rule(lambda x, *a: x.shape[-3] % a[-1] == 0,
         lambda x, *a: CHANNELS_DIVISIBLE.format(op="conv2d", channels=x.shape[-3], groups=a[-1])),
    Rule(lambda x, w, *a: w.shape[0] % a[-1] == 0,
         lambda x, w, *a: OUT_CHANNELS_DIVISIBLE.format(out_channels=w.shape[0], groups=a[-1])),
    Rule(lambda x, w, *a: w.shape[1] * a[-1] == x.shape[-3], _channels_message),
    bias_rule("conv2d", "out_channels"),
    *window_fits_rules("conv2d", lambda x, *_: x.shape[-2:], lambda x, w, *_: w.shape[2:], lambda *a: a[4],
                       lambda *a: a[5]),
])


def _output_memory_format(input: Tensor, weight: Tensor) -> torch.memory_format:
    """channels_last when either operand is laid out channels_last, as torch's CPU/cuDNN
    convolutions do. The real kernel enforces it so that fake and real strides agree."""
    return torch.channels_last if is_channels_last(input) or is_channels_last(weight) else torch.contiguous_format


def _output_shape(input, weight, stride, padding, dilation) -> list:
    out_size = window_output_size(input.shape[-2:], weight.shape[2:], stride, padding, dilation)
    return [*input.shape[:-3], weight.shape[0], *out_size]


@torch.library.custom_op("oplib::conv2d", mutates_args=())
def conv2d(
    input: Tensor,
    weight: Tensor,
    bias: Optional[Tensor],
    stride: list[int],
    padding: list[int],
    dilation: list[int],
    groups: int,
) -> Tensor:
    """input: (N, C, H, W) or (C, H, W); weight: (O, C / groups, KH, KW); bias: (O,) or None.
    Returns (N, O, Ho, Wo) (or (O, Ho, Wo)), Ho = (H + 2 ph - dh (KH - 1) - 1) // sh + 1."""
    _CONV2D_RULES.enforce(input, weight, bias, stride, padding, dilation, groups)
    out = torch.nn.functional.conv2d(input, weight, bias, stride, padding, dilation, groups)
    if input.dim() == 3 or (input.is_contiguous() and weight.is_contiguous()):
        return out.contiguous()
    return out.contiguous(memory_format=_output_memory_format(input, weight))


@conv2d.register_fake
def _conv2d_fake(input, weight, bias, stride, padding, dilation, groups) -> Tensor:
    _CONV2D_RULES.enforce(input, weight, bias, stride, padding, dilation, groups)
    shape = _output_shape(input, weight, stride, padding, dilation)
    if input.dim() == 3:
        return input.new_empty(shape)
    return torch.empty(
        shape, dtype=input.dtype, device=input.device, memory_format=_output_memory_format(input, weight)
    )


def _conv2d_setup_context(ctx, inputs, output) -> None:
    input, weight, bias, stride, padding, dilation, groups = inputs
    needs_input, needs_weight, _ = ctx.needs_input_grad[:3]
    # grad_input needs the weight, grad_weight the input; otherwise only their shapes.
    ctx.save_for_backward(input if needs_weight else None, weight if needs_input else None)
    ctx.input_shape, ctx.weight_shape = input.shape, weight.shape
    ctx.has_bias = bias is not None
    ctx.params = (stride, padding, dilation, groups)


# One convolution_backward call for all three gradients: at ResNet-50's stage shapes it was
# never slower than torch.nn.grad's conv2d_input + conv2d_weight + a bias sum (settled by the
# former section 3 of bench/dense.py; its last table is bench/results/dense.md at 7b14f82).
def _conv2d_backward(ctx, grad: Tensor):
    input, weight = ctx.saved_tensors
    stride, padding, dilation, groups = ctx.params
    needs_input, needs_weight, needs_bias = ctx.needs_input_grad[:3]
    # convolution_backward reads only the sizes of an operand whose own gradient is not
    # needed; a zero-stride expand stands in for it without allocating.
    if input is None:
        input = grad.new_zeros(()).expand(ctx.input_shape)
    if weight is None:
        weight = grad.new_zeros(()).expand(ctx.weight_shape)
    unbatched = input.dim() == 3
    if unbatched:
        input, grad = input.unsqueeze(0), grad.unsqueeze(0)
    grad_input, grad_weight, grad_bias = torch.ops.aten.convolution_backward(
        grad,
        input,
        weight,
        [weight.shape[0]] if ctx.has_bias else None,
        stride,
        padding,
        dilation,
        False,
        [0, 0],
        groups,
        [needs_input, needs_weight, needs_bias and ctx.has_bias],
    )
    if unbatched and grad_input is not None:
        grad_input = grad_input.squeeze(0)
    return grad_input, grad_weight, grad_bias, None, None, None, None


conv2d.register_autograd(_conv2d_backward, setup_context=_conv2d_setup_context)


def _conv2d_vmap(info, in_dims, input, weight, bias, stride, padding, dilation, groups):
    input_dim, weight_dim, bias_dim = in_dims[:3]
    batch = info.batch_size
    per_sample_unbatched = input.dim() - (input_dim is not None) == 3
    x = input.movedim(input_dim, 0) if input_dim is not None else input.expand(batch, *input.shape)
    if per_sample_unbatched:
        x = x.unsqueeze(1)  # (B, 1, C, H, W): each sample is a batch of one
    fused_bias = bias if bias_dim is None else None
    if weight_dim is None:
        # Fold the vmapped dimension into N.
        out = conv2d(x.flatten(0, 1), weight, fused_bias, stride, padding, dilation, groups)
        out = out.unflatten(0, (batch, -1))
    else:
        # Per-sample weights: fold the vmapped dimension into the groups,
        # (N, B*C, H, W) * (B*O, C/g, KH, KW) with B*g groups.
        w = weight.movedim(weight_dim, 0)
        folded = x.movedim(0, 1).flatten(1, 2)
        b = fused_bias.repeat(batch) if fused_bias is not None else None
        out = conv2d(folded, w.flatten(0, 1), b, stride, padding, dilation, groups * batch)
        out = out.unflatten(1, (batch, -1)).movedim(1, 0)
    if bias_dim is not None:
        out = out + bias.movedim(bias_dim, 0)[:, None, :, None, None]
    if per_sample_unbatched:
        out = out.squeeze(1)
    return out, 0


conv2d.register_vmap(_conv2d_vmap)


def _conv2d_jvp(inputs, output: Tensor, tangents) -> Tensor:
    input, weight, _, stride, padding, dilation, groups = inputs
    input_dot, weight_dot, bias_dot = tangents[:3]
    # Bilinear in (input, weight) plus the bias, like linear.
    tangent = sum_tangents(
        conv2d(input_dot, weight, None, stride, padding, dilation, groups) if input_dot is not None else None,
        conv2d(input, weight_dot, None, stride, padding, dilation, groups) if weight_dot is not None else None,
    )
    if bias_dot is None:
        return tangent
    bias_dot = bias_dot[:, None, None]  # (O,) -> (O, 1, 1), broadcast over (N, O, Ho, Wo)
    return bias_dot.expand_as(output) if tangent is None else tangent + bias_dot


register_jvp(conv2d, _conv2d_jvp)

# torch runs conv2d in the autocast dtype on both devices.
register_autocast_policy("oplib::conv2d", "cpu", "lower_precision")
register_autocast_policy("oplib::conv2d", "cuda", "lower_precision")


@register_flop_formula(torch.ops.oplib.conv2d)
def _conv2d_flops(input_shape, weight_shape, bias_shape, stride, padding, dilation, groups, out_shape=None, **kwargs) -> int:
    """2 * N * Ho * Wo * (Cout * Cin/groups * KH * KW), torch's count for aten.convolution
    (bias not counted); an unbatched input counts as N = 1."""
    batch = out_shape[0] if len(out_shape) == 4 else 1
    per_pixel = weight_shape[0] * weight_shape[1] * weight_shape[2] * weight_shape[3]
    return 2 * batch * out_shape[-2] * out_shape[-1] * per_pixel
