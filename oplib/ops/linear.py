"""``oplib::linear(Tensor input, Tensor weight, Tensor? bias) -> Tensor``: y = x W^T + b.

Same semantics as ``torch.nn.functional.linear``; the backward is written out with
matrix products and computes only the gradients autograd asks for.
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor
from torch.utils.flop_counter import register_flop_formula

from ._common import register_autocast_policy
from ._rules import Rule, Rules, bias_rule, tensor_rules
from ._transforms import register_jvp, sum_tangents


# The layouts the dimension checks name.
INPUT_LAYOUT = "at least 1-D (*, in_features)"
WEIGHT_LAYOUT = "2-D (out_features, in_features)"

IN_FEATURES = (
    "oplib.linear: expected input's last dimension to equal weight's in_features, "
    "got input of size {input_size} and weight of size {weight_size}"
)


# linear(input, weight, bias)
_LINEAR_RULES = Rules("oplib::linear", [
    *tensor_rules("linear", (0, "input", range(1, 64), INPUT_LAYOUT), (1, "weight", 2, WEIGHT_LAYOUT),
                  (2, "bias", None, None, True)),
    Rule(lambda x, w, _: x.shape[-1] == w.shape[1],
         lambda x, w, _: IN_FEATURES.format(input_size=list(x.shape), weight_size=list(w.shape))),
    bias_rule("linear", "out_features"),
])


@torch.library.custom_op("oplib::linear", mutates_args=())
def linear(input: Tensor, weight: Tensor, bias: Optional[Tensor]) -> Tensor:
    """input: (*, in), weight: (out, in), bias: (out,) or None -> (*, out), contiguous."""
    _LINEAR_RULES.enforce(input, weight, bias)
    return torch.nn.functional.linear(input, weight, bias).contiguous()


@linear.register_fake
def _linear_fake(input: Tensor, weight: Tensor, bias: Optional[Tensor]) -> Tensor:
    _LINEAR_RULES.enforce(input, weight, bias)
    return input.new_empty((*input.shape[:-1], weight.shape[0]))


def _linear_setup_context(ctx, inputs, output) -> None:
    input, weight, bias = inputs
    needs_input, needs_weight, _ = ctx.needs_input_grad[:3]
    # grad_input needs only the weight and grad_weight only the input.
    ctx.save_for_backward(input if needs_weight else None, weight if needs_input else None)


def _linear_backward(ctx, grad: Tensor):
    input, weight = ctx.saved_tensors
    needs_input, needs_weight, needs_bias = ctx.needs_input_grad[:3]
    grad_input = grad_weight = grad_bias = None
    grad_2d = grad.reshape(-1, grad.shape[-1])  # (M, out), M = product of leading dims
    if needs_input:
        grad_input = grad @ weight  # (*, out) @ (out, in) -> (*, in)
    if needs_weight:
        grad_weight = grad_2d.t() @ input.reshape(-1, input.shape[-1])  # (out, M) @ (M, in)
    if needs_bias:
        grad_bias = grad_2d.sum(0)
    return grad_input, grad_weight, grad_bias


linear.register_autograd(_linear_backward, setup_context=_linear_setup_context)


def _linear_vmap(info, in_dims, input: Tensor, weight: Tensor, bias: Optional[Tensor]):
    input_dim, weight_dim, bias_dim = in_dims
    batch = info.batch_size
    x = input.movedim(input_dim, 0) if input_dim is not None else input
    if weight_dim is None and bias_dim is None:
        # A batched input is one more leading dimension of a single linear.
        return linear(x, weight, bias), (0 if input_dim is not None else None)
    if weight_dim is None:
        out = linear(x, weight, None)
        if input_dim is None:
            out = out.expand(batch, *out.shape)
    else:
        # Per-sample weights: a batched matrix product (B, M, in) @ (B, in, out).
        if input_dim is None:
            x = x.expand(batch, *x.shape)
        w = weight.movedim(weight_dim, 0)
        leading = x.shape[1:-1]
        out = torch.bmm(x.reshape(batch, -1, x.shape[-1]), w.transpose(1, 2)).reshape(batch, *leading, w.shape[1])
    if bias is not None:
        b = bias.movedim(bias_dim, 0) if bias_dim is not None else bias.expand(batch, *bias.shape)
        out = out + b.reshape(batch, *([1] * (out.dim() - 2)), b.shape[-1])
    return out, 0


linear.register_vmap(_linear_vmap)


def _linear_jvp(inputs, output: Tensor, tangents) -> Tensor:
    input, weight, _ = inputs
    input_dot, weight_dot, bias_dot = tangents
    # Bilinear in (input, weight) plus the bias: d(x W^T + b) = dx W^T + x dW^T + db.
    tangent = sum_tangents(
        linear(input_dot, weight, None) if input_dot is not None else None,
        linear(input, weight_dot, None) if weight_dot is not None else None,
    )
    if bias_dot is None:
        return tangent
    return bias_dot.expand_as(output) if tangent is None else tangent + bias_dot


register_jvp(linear, _linear_jvp)

# torch runs linear in the autocast dtype on both devices.
register_autocast_policy("oplib::linear", "cpu", "lower_precision")
register_autocast_policy("oplib::linear", "cuda", "lower_precision")


@register_flop_formula(torch.ops.oplib.linear)
def _linear_flops(input_shape, weight_shape, bias_shape=None, out_shape=None, **kwargs) -> int:
    """2 * M * in * out for M rows, as FlopCounterMode counts torch's addmm / mm (bias not counted)."""
    rows = 1
    for size in input_shape[:-1]:
        rows *= size
    return 2 * rows * weight_shape[0] * weight_shape[1]
