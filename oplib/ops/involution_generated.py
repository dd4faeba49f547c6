"""Involution with its kernel generated inside the op, and the op's grad_input.

    weight[n, g, a, b, i, j] = span_bias[k] + sum_r span_weight[k, r] * feature[n, r, i, j],   k = (g*KH + a)*KW + b
    out = involution(input, weight, stride, padding, dilation)

input: (N, C, H, W); feature: (N, R, Ho, Wo), the kernel-generation branch's output (in
``Involution2d``: pooling, the reduce 1x1 conv, BatchNorm, ReLU); span_weight: (G*KH*KW, R) and
span_bias: (G*KH*KW,) or None, the span 1x1 conv's parameters (its weight's two leading dims).
The (N, G, KH, KW, Ho, Wo) weight, about three times the input's size in ``Involution2d``,
is what the span conv writes and ``oplib::involution`` reads back; here the native CPU kernels
form each output row's weights in a buffer that stays in cache and use them at once, forward
and grad_input: the map never reaches memory. Nothing is saved for backward beyond the
op's inputs.

The op is bilinear in (input, weight) and the weight is affine in (feature, span_weight,
span_bias), so every derivative is again an op of oplib (u: the incoming gradient):

    involution_generated(x, f, S, b)             d/dx: involution_generated_backward_input(u, f, S, b)
                                                 d/d(f, S, b): through gw = involution_backward_weight(u, x)
    involution_generated_backward_input(g, f, S, b)  d/dg: involution_generated(u, f, S, b)
                                                 d/d(f, S, b): through gw = involution_backward_weight(g, u)

with gw, (N, G*KH*KW, Ho*Wo), contracted by ``_generator_grads``: grad_feature = S^T gw,
grad_span_weight = sum over n, pixels of gw f^T, grad_span_bias = sum of gw. That gw is a map
of the weight's size, made and dropped inside the backward (never saved).

The device code is in ``oplib.kernels.involution``, which writes into the result each op
allocates here: on CPU the native kernels (``involution_generated_forward`` and
``..._backward_input``), else the plain-PyTorch route (the span conv, then involution's own
CPU kernels); on CUDA the kernels of ``involution_generated.cu`` (generic: one thread per
sample, group and pixel; not yet specialised like involution's), which form the weights in
registers.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Optional

import torch
from torch import Tensor
from torch.utils.flop_counter import register_flop_formula

from ..kernels.involution import cpu, cuda
from ..kernels.involution.layouts import result_like
from . import involution as unfused
from ._bilinear import fold_batch, unfold_batch
from ._common import CHANNELS_DIVISIBLE, register_autocast_policy, window_output_size
from ._rules import Contract, Rule, Rules, register_contract, tensor_rules, window_fits_rules, window_rules
from ._transforms import register_jvp, sum_tangents

FORWARD = "involution_generated"
BACKWARD_INPUT = "involution_generated_backward_input"

FEATURE_LAYOUT = "4-D (N, R, Ho, Wo)"
SPAN_WEIGHT_LAYOUT = "2-D (G*KH*KW, R)"
SPAN_BIAS_LAYOUT = "1-D (G*KH*KW,)"

KERNEL_SIZE = "oplib.{op}: expected kernel_size to be a positive (KH, KW), got {kernel_size}"
SPAN_ROWS = (
    "oplib.{op}: expected span_weight's rows ({rows}) to be a positive multiple of KH*KW ({taps}), one row per "
    "(group, tap), got span_weight of size {span_size}"
)
REDUCED = (
    "oplib.{op}: expected feature's channels to equal span_weight's columns (R), got feature of size "
    "{feature_size} and span_weight of size {span_size}"
)
SPAN_BIAS = "oplib.{op}: expected span_bias of size [{rows}] (span_weight's rows), got span_bias of size {bias_size}"
FEATURE_SIZE = (
    "oplib.{op}: expected feature of size [{batch}, R, {out_h}, {out_w}] (the batch of {name} and the output size), "
    "got feature of size {feature_size}"
)
INPUT_SIZE_PAIR = "oplib.involution_generated_backward_input: expected input_size to be (H, W), got {input_size}"
GRAD_OUTPUT_SIZE = (
    "oplib.involution_generated_backward_input: expected grad_output's (Ho, Wo) to be {expected}, the output size of "
    "input_size {input_size}, got grad_output of size {grad_size}"
)


def _rules(op: str, activation_name: str, input_size: Callable, at: int) -> list[Rule]:
    """The rules of both ops: argument 0 is the activation (the input, or grad_output), whose
    channels are the input's, 1-3 the generator, ``input_size(*args)`` the input's (H, W), and
    kernel_size, stride, padding, dilation are the arguments from ``at`` on."""
    backward = activation_name == "grad_output"

    def taps(*a):
        return a[at][0] * a[at][1]

    def out_size(*a):
        return window_output_size(input_size(*a), *a[at:at + 4])

    def feature_size(*a):
        """(Ho, Wo) the feature map must have: grad_output's in the backward, else the output's."""
        return tuple(a[0].shape[2:]) if backward else out_size(*a)

    rules = [
        *tensor_rules(op, (0, activation_name, 4, unfused.INPUT_LAYOUT), (1, "feature", 4, FEATURE_LAYOUT),
                      (2, "span_weight", 2, SPAN_WEIGHT_LAYOUT), (3, "span_bias", 1, SPAN_BIAS_LAYOUT, True)),
        *window_rules(op, at + 1),
        Rule(lambda *a: len(a[at]) == 2, lambda *a: KERNEL_SIZE.format(op=op, kernel_size=list(a[at])), ValueError),
        Rule(lambda *a: (a[at][0] > 0) & (a[at][1] > 0), lambda *a: KERNEL_SIZE.format(op=op, kernel_size=list(a[at])),
             ValueError),
        Rule(lambda *a: (a[2].shape[0] > 0) & (a[2].shape[0] % taps(*a) == 0),
             lambda *a: SPAN_ROWS.format(op=op, rows=a[2].shape[0], taps=taps(*a), span_size=list(a[2].shape))),
        Rule(lambda *a: a[0].shape[1] % (a[2].shape[0] // taps(*a)) == 0,
             lambda *a: CHANNELS_DIVISIBLE.format(op=op, channels=a[0].shape[1], groups=a[2].shape[0] // taps(*a))),
        Rule(lambda *a: a[1].shape[1] == a[2].shape[1],
             lambda *a: REDUCED.format(op=op, feature_size=list(a[1].shape), span_size=list(a[2].shape))),
        Rule(lambda *a: a[3] is None or a[3].shape[0] == a[2].shape[0],
             lambda *a: SPAN_BIAS.format(op=op, rows=a[2].shape[0], bias_size=list(a[3].shape))),
        *window_fits_rules(op, input_size, lambda *a: a[at], lambda *a: a[at + 2], lambda *a: a[at + 3]),
    ]
    if backward:
        rules.append(Rule(
            lambda *a: (out_size(*a)[0] == a[0].shape[2]) & (out_size(*a)[1] == a[0].shape[3]),
            lambda *a: GRAD_OUTPUT_SIZE.format(expected=list(out_size(*a)), input_size=list(input_size(*a)),
                                               grad_size=list(a[0].shape)),
        ))
    rules.append(Rule(
        lambda *a: (a[1].shape[0] == a[0].shape[0]) & (a[1].shape[2] == feature_size(*a)[0])
        & (a[1].shape[3] == feature_size(*a)[1]),
        lambda *a: FEATURE_SIZE.format(op=op, batch=a[0].shape[0], out_h=feature_size(*a)[0],
                                       out_w=feature_size(*a)[1], name=activation_name, feature_size=list(a[1].shape)),
    ))
    return rules


# involution_generated(input, feature, span_weight, span_bias, kernel_size, stride, padding, dilation)
_FORWARD_RULES = Rules("oplib::involution_generated", _rules(FORWARD, "input", lambda *a: a[0].shape[2:], 4))
# involution_generated_backward_input(grad_output, feature, span_weight, span_bias, input_size, kernel_size, stride,
# padding, dilation)
_BACKWARD_INPUT_RULES = Rules("oplib::involution_generated_backward_input", [
    Rule(lambda *a: len(a[4]) == 2, lambda *a: INPUT_SIZE_PAIR.format(input_size=list(a[4])), ValueError),
    *_rules(BACKWARD_INPUT, "grad_output", lambda *a: a[4], 5),
])


# ---------------------------------------------------------------------------------------
# The two ops
# ---------------------------------------------------------------------------------------


_FORWARD = Contract(_FORWARD_RULES, lambda input, feature, *_: result_like(input, feature.shape[2:]),
                    {"cpu": cpu.involution_generated, "cuda": cuda.involution_generated})
_BACKWARD_INPUT = Contract(_BACKWARD_INPUT_RULES, lambda grad, feature, weight, bias, size, *_: result_like(grad, size),
                           {"cpu": cpu.involution_generated_backward_input,
                            "cuda": cuda.involution_generated_backward_input})


@torch.library.custom_op("oplib::involution_generated", mutates_args=(), device_types="cpu")
def involution_generated(
    input: Tensor,
    feature: Tensor,
    span_weight: Tensor,
    span_bias: Optional[Tensor],
    kernel_size: list[int],
    stride: list[int],
    padding: list[int],
    dilation: list[int],
) -> Tensor:
    """input: (N, C, H, W), feature: (N, R, Ho, Wo), span_weight: (G*KH*KW, R), span_bias:
    (G*KH*KW,) or None -> (N, C, Ho, Wo), channels_last when the input is."""
    return _FORWARD.run("cpu", input, feature, span_weight, span_bias, kernel_size, stride, padding, dilation)


@torch.library.custom_op("oplib::involution_generated_backward_input", mutates_args=(), device_types="cpu")
def involution_generated_backward_input(
    grad_output: Tensor,
    feature: Tensor,
    span_weight: Tensor,
    span_bias: Optional[Tensor],
    input_size: list[int],
    kernel_size: list[int],
    stride: list[int],
    padding: list[int],
    dilation: list[int],
) -> Tensor:
    """grad_output: (N, C, Ho, Wo), feature: (N, R, Ho, Wo), span_weight: (G*KH*KW, R),
    span_bias: (G*KH*KW,) or None, input_size: (H, W) -> grad_input: (N, C, H, W),
    channels_last when grad_output is."""
    return _BACKWARD_INPUT.run("cpu", grad_output, feature, span_weight, span_bias, input_size, kernel_size, stride,
                               padding, dilation)


register_contract(involution_generated, _FORWARD)
register_contract(involution_generated_backward_input, _BACKWARD_INPUT)


# ---------------------------------------------------------------------------------------
# Autograd: the rules of the module docstring
# ---------------------------------------------------------------------------------------


def _generator_grads(ctx, grad: Tensor, activation: Tensor, feature: Tensor, span_weight: Tensor):
    """The gradients of feature, span_weight and span_bias (None where not needed) from gw,
    the gradient of the generated weight: involution_backward_weight(grad, activation), with
    ``grad`` the gradient of the output (forward) or the upstream one (grad_input's op). gw
    goes through the span 1x1 conv's own backward (aten.convolution_backward, differentiable
    again): the contractions of the module docstring as one GEMM each."""
    needs = ctx.needs_input_grad[1:4]
    if not any(needs):
        return None, None, None
    kernel_size, stride, padding, dilation = ctx.params
    n, _, out_h, out_w = feature.shape
    rows = span_weight.shape[0]
    grad_weight = unfused.involution_backward_weight(grad, activation, kernel_size, stride, padding, dilation,
                                                     rows // (kernel_size[0] * kernel_size[1]))
    gw = grad_weight.reshape(n, rows, out_h, out_w)
    grad_feature, grad_span_weight, grad_span_bias = torch.ops.aten.convolution_backward(
        gw, feature, span_weight[:, :, None, None], [rows], [1, 1], [0, 0], [1, 1], False, [0, 0], 1, list(needs))
    return grad_feature, None if grad_span_weight is None else grad_span_weight.flatten(1), grad_span_bias


def _save(ctx, activation: Tensor, feature: Tensor, span_weight: Tensor, span_bias: Optional[Tensor], params) -> None:
    """Only what a requested gradient reads: the activation for the generator's gradients,
    span_bias for the activation's, feature and span_weight for every gradient (span_weight
    is a parameter, and in Involution2d feature is the output that its ReLU keeps anyway)."""
    needs_activation = ctx.needs_input_grad[0]
    ctx.save_for_backward(
        activation if any(ctx.needs_input_grad[1:4]) else None,
        feature,
        span_weight,
        span_bias if needs_activation else None,
    )
    ctx.shapes = (activation.shape,)
    ctx.params = params


def _register_autograd(op, d_activation, weight_gradient_operands) -> None:
    """``op``'s autograd. ``op`` takes (activation, feature, span_weight, span_bias, *params);
    ``d_activation(u, feature, span_weight, span_bias, activation_shape, params)`` is the
    activation's gradient for the incoming gradient u, and ``weight_gradient_operands(u,
    activation)`` the (grad, activation) pair whose involution_backward_weight is the gradient of
    the generated weight (see ``_generator_grads``)."""

    def setup_context(ctx, inputs, output) -> None:
        activation, feature, span_weight, span_bias, *params = inputs
        _save(ctx, activation, feature, span_weight, span_bias, tuple(params[-4:]))
        ctx.op_params = tuple(params)

    def backward(ctx, u: Tensor):
        activation, feature, span_weight, span_bias = ctx.saved_tensors
        d = None
        if ctx.needs_input_grad[0]:
            d = d_activation(u, feature, span_weight, span_bias, ctx.shapes[0], ctx.op_params)
        generator = _generator_grads(ctx, *weight_gradient_operands(u, activation), feature, span_weight)
        return d, *generator, *(None for _ in ctx.op_params)

    op.register_autograd(backward, setup_context=setup_context)


# The forward: d/dinput is grad_input's op; the generated weight's gradient is
# involution_backward_weight(u, input).
_register_autograd(
    involution_generated,
    lambda u, f, s, b, input_shape, p: involution_generated_backward_input(u, f, s, b, list(input_shape[2:]), *p),
    lambda u, input: (u, input),
)
# grad_input = involution_backward_input(grad_output, weight): d/dgrad_output is the forward op;
# d/dweight is involution_backward_weight(grad_output, u).
_register_autograd(
    involution_generated_backward_input,
    lambda u, f, s, b, grad_shape, p: involution_generated(u, f, s, b, *p[1:]),
    lambda u, grad_output: (grad_output, u),
)


# ---------------------------------------------------------------------------------------
# vmap: a vmapped activation or feature folds into N; a vmapped span_weight or span_bias
# differs per vmapped element, so the weights are generated per element and the unfused op runs
# ---------------------------------------------------------------------------------------


def _vmap(info, in_dims, activation, feature, span_weight, span_bias, kernel_size, fused, unfused_op, unfused_args):
    x, f = fold_batch(info, in_dims[:2], (activation, feature))
    if in_dims[2] is None and in_dims[3] is None:
        return unfold_batch(info, fused(x, f, span_weight, span_bias))
    spans = [s.movedim(d, 0) if d is not None else s.expand(info.batch_size, *s.shape)
             for s, d in zip((span_weight, span_bias), in_dims[2:4]) if s is not None]
    n = f.shape[0] // info.batch_size
    f = f.unflatten(0, (info.batch_size, n))  # (B, N, R, Ho, Wo)
    weight = torch.einsum("bkr,bnrhw->bnkhw", spans[0], f)
    if span_bias is not None:
        weight = weight + spans[1][:, None, :, None, None]
    kh, kw = kernel_size
    weight = weight.reshape(info.batch_size * n, spans[0].shape[1] // (kh * kw), kh, kw, *f.shape[3:])
    return unfold_batch(info, unfused_op(x, weight, *unfused_args))


def _forward_vmap(info, in_dims, input, feature, span_weight, span_bias, kernel_size, stride, padding, dilation):
    return _vmap(info, in_dims, input, feature, span_weight, span_bias, kernel_size,
                 lambda x, f, s, b: involution_generated(x, f, s, b, kernel_size, stride, padding, dilation),
                 unfused.involution, (stride, padding, dilation))


def _backward_input_vmap(info, in_dims, grad_output, feature, span_weight, span_bias, input_size, kernel_size, stride,
                         padding, dilation):
    return _vmap(info, in_dims, grad_output, feature, span_weight, span_bias, kernel_size,
                 lambda g, f, s, b: involution_generated_backward_input(g, f, s, b, input_size, kernel_size, stride,
                                                                        padding, dilation),
                 unfused.involution_backward_input, (input_size, stride, padding, dilation))


involution_generated.register_vmap(_forward_vmap)
involution_generated_backward_input.register_vmap(_backward_input_vmap)


# ---------------------------------------------------------------------------------------
# Forward-mode AD: linear in the activation, bilinear in (feature, span_weight) and affine
# in span_bias, so the tangent is the op on each tangent with the other primals, the bias
# dropped where the tangent is the feature's
# ---------------------------------------------------------------------------------------


def _tangent(op, activation, feature, span_weight, span_bias, tangents):
    """op(activation, feature, span_weight, span_bias) differentiated along ``tangents``."""
    activation_dot, feature_dot, span_weight_dot, span_bias_dot = tangents[:4]
    span_term = None
    if span_weight_dot is not None or span_bias_dot is not None:
        span_dot = span_weight_dot if span_weight_dot is not None else torch.zeros_like(span_weight)
        span_term = op(activation, feature, span_dot, span_bias_dot)
    return sum_tangents(
        op(activation_dot, feature, span_weight, span_bias) if activation_dot is not None else None,
        op(activation, feature_dot, span_weight, None) if feature_dot is not None else None,
        span_term,
    )


def _forward_jvp(inputs, output, tangents) -> Tensor:
    input, feature, span_weight, span_bias, kernel_size, stride, padding, dilation = inputs
    return _tangent(lambda x, f, s, b: involution_generated(x, f, s, b, kernel_size, stride, padding, dilation),
                    input, feature, span_weight, span_bias, tangents)


def _backward_input_jvp(inputs, output, tangents) -> Tensor:
    grad_output, feature, span_weight, span_bias, input_size, kernel_size, stride, padding, dilation = inputs
    return _tangent(
        lambda g, f, s, b: involution_generated_backward_input(g, f, s, b, input_size, kernel_size, stride, padding,
                                                               dilation),
        grad_output, feature, span_weight, span_bias, tangents)


register_jvp(involution_generated, _forward_jvp)
register_jvp(involution_generated_backward_input, _backward_input_jvp)

for _qualname in ("oplib::involution_generated", "oplib::involution_generated_backward_input"):
    register_autocast_policy(_qualname, "cpu", "lower_precision")
    register_autocast_policy(_qualname, "cuda", "lower_precision")


def _generated_flop_count(activation_shape, out_shape, feature_shape, span_shape, kernel_size) -> int:
    """2 FLOPs per multiply-add: the involution's (one per element of the (N, C, Ho, Wo) output
    or grad_output and tap) and the generation's (one per weight element and reduced channel)."""
    n, reduced, out_h, out_w = feature_shape
    return (unfused._involution_flop_count((n, activation_shape[1], out_h, out_w), kernel_size)
            + 2 * n * out_h * out_w * span_shape[0] * reduced)


@register_flop_formula(torch.ops.oplib.involution_generated)
def _forward_flops(input_shape, feature_shape, span_shape, bias_shape, kernel_size, *args, out_shape=None, **kwargs):
    return _generated_flop_count(input_shape, out_shape, feature_shape, span_shape, kernel_size)


@register_flop_formula(torch.ops.oplib.involution_generated_backward_input)
def _backward_input_flops(grad_shape, feature_shape, span_shape, bias_shape, input_size, kernel_size, *args,
                          out_shape=None, **kwargs):
    return _generated_flop_count(grad_shape, out_shape, feature_shape, span_shape, kernel_size)
