"""Involution with its kernel generated inside the op, the op's grad_input, and the gradient
op of its generator.

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
                                                 d/d(f, S, b): involution_generated_backward_generator(u, f, S, x)
    involution_generated_backward_input(g, f, S, b)  d/dg: involution_generated(u, f, S, b)
                                                 d/d(f, S, b): involution_generated_backward_generator(g, f, S, u)

The generator's gradient op contracts gw = involution_backward_weight(u, x), the gradient of
the generated weight, (N, G*KH*KW, Ho*Wo): grad_feature = S^T gw, grad_span_weight = sum over
n, pixels of gw f^T, grad_span_bias = sum of gw. Its own derivatives are generated ops again
(see its section below).

The device code is in ``oplib.kernels.involution``, which writes into the result each op
allocates here: on CPU the native kernels (``involution_generated_forward`` and
``..._backward_input``), else the plain-PyTorch route (the span conv, then involution's own
CPU kernels); on CUDA the forward's fused kernels where one serves the call (tensor cores
for float16/bfloat16, else a tiled kernel: the weights formed in shared memory or on
tensor-core fragments) and the generic kernel of ``involution_generated.cu`` elsewhere (one
thread per sample, group and pixel, the weights formed in registers); grad_input through the
weight map (the span conv, then involution's grad_input kernels), which the sixth H200 draw
measured far faster than the generic kernel.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Optional

import torch
from torch import Tensor
from torch.utils.flop_counter import register_flop_formula

from ..kernels.cuda_launch import cupy_launcher
from ..kernels.cuda_plan import LaunchPlans
from ..kernels.involution import cpu, cuda
from ..kernels.involution.layouts import result_like
from . import involution as unfused
from ._bilinear import fold_batch, unfold_batch
from ._common import CHANNELS_DIVISIBLE, register_autocast_policy, register_device_kernel, window_output_size
from ._rules import Contract, Rule, Rules, register_contract, tensor_rules, window_fits_rules, window_rules
from ._transforms import register_jvp, sum_tangents

FORWARD = "involution_generated"
BACKWARD_INPUT = "involution_generated_backward_input"
BACKWARD_GENERATOR = "involution_generated_backward_generator"

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
    "oplib.{op}: expected grad_output's (Ho, Wo) to be {expected}, the output size of "
    "input_size {input_size}, got grad_output of size {grad_size}"
)
INPUT_BATCH_CHANNELS = (
    "oplib.{op}: expected input of size [{batch}, {channels}, H, W] (grad_output's batch and channels), got input of "
    "size {input_size}"
)


_SPAN_BIAS_OPERAND = (3, "span_bias", 1, SPAN_BIAS_LAYOUT, True)


def _rules(op: str, activation_name: str, input_size: Callable, at: int, last=_SPAN_BIAS_OPERAND) -> list[Rule]:
    """The rules of the three ops: argument 0 is the activation (the input, or grad_output), whose
    channels are the input's, 1-2 the generator's feature and span_weight, 3 ``last``'s operand
    (span_bias; the input in the generator's gradient op), ``input_size(*args)`` the input's
    (H, W), and kernel_size, stride, padding, dilation are the arguments from ``at`` on."""
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
                      (2, "span_weight", 2, SPAN_WEIGHT_LAYOUT), last),
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
        *([Rule(lambda *a: a[3] is None or a[3].shape[0] == a[2].shape[0],
                lambda *a: SPAN_BIAS.format(op=op, rows=a[2].shape[0], bias_size=list(a[3].shape)))]
          if last is _SPAN_BIAS_OPERAND else
          [Rule(lambda *a: (a[3].shape[0] == a[0].shape[0]) & (a[3].shape[1] == a[0].shape[1]),
                lambda *a: INPUT_BATCH_CHANNELS.format(op=op, batch=a[0].shape[0], channels=a[0].shape[1],
                                                       input_size=list(a[3].shape)))]),
        *window_fits_rules(op, input_size, lambda *a: a[at], lambda *a: a[at + 2], lambda *a: a[at + 3]),
    ]
    if backward:
        rules.append(Rule(
            lambda *a: (out_size(*a)[0] == a[0].shape[2]) & (out_size(*a)[1] == a[0].shape[3]),
            lambda *a: GRAD_OUTPUT_SIZE.format(op=op, expected=list(out_size(*a)), input_size=list(input_size(*a)),
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
# involution_generated_backward_generator(grad_output, feature, span_weight, input, kernel_size, stride, padding,
# dilation)
_BACKWARD_GENERATOR_RULES = Rules("oplib::involution_generated_backward_generator", _rules(
    BACKWARD_GENERATOR, "grad_output", lambda *a: a[3].shape[2:], 4, (3, "input", 4, unfused.INPUT_LAYOUT)))


# ---------------------------------------------------------------------------------------
# The two ops
# ---------------------------------------------------------------------------------------


_FORWARD = Contract(_FORWARD_RULES, lambda input, feature, *_: result_like(input, feature.shape[2:]),
                    {"cpu": cpu.involution_generated, "cuda": cuda.involution_generated},
                    cuda.TUNING_CANDIDATES["oplib::involution_generated"])
_BACKWARD_INPUT = Contract(_BACKWARD_INPUT_RULES, lambda grad, feature, weight, bias, size, *_: result_like(grad, size),
                           {"cpu": cpu.involution_generated_backward_input,
                            "cuda": cuda.involution_generated_backward_input},
                           cuda.TUNING_CANDIDATES["oplib::involution_generated_backward_input"])


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


def _generator_grads_result(grad_output: Tensor, feature: Tensor, span_weight: Tensor, *_) -> tuple[Tensor, Tensor, Tensor]:
    """grad_feature in feature's layout, grad_span_weight and grad_span_bias contiguous."""
    return (result_like(feature, feature.shape[2:]), span_weight.new_empty(span_weight.shape),
            span_weight.new_empty(span_weight.shape[:1]))


# The CUDA writer launches a kernel and adds its partial sums up with torch, or composes oplib's
# own ops (the map route), so it stays outside the contract: launch plans replay a writer's
# launches, and this one's are not all its own.
_BACKWARD_GENERATOR = Contract(_BACKWARD_GENERATOR_RULES, _generator_grads_result,
                               {"cpu": cpu.involution_generated_backward_generator})


@torch.library.custom_op("oplib::involution_generated_backward_generator", mutates_args=(), device_types="cpu")
def involution_generated_backward_generator(
    grad_output: Tensor,
    feature: Tensor,
    span_weight: Tensor,
    input: Tensor,
    kernel_size: list[int],
    stride: list[int],
    padding: list[int],
    dilation: list[int],
) -> tuple[Tensor, Tensor, Tensor]:
    """grad_output: (N, C, Ho, Wo), feature: (N, R, Ho, Wo), span_weight: (G*KH*KW, R), input:
    (N, C, H, W) -> (grad_feature: (N, R, Ho, Wo) in feature's layout, grad_span_weight:
    (G*KH*KW, R), grad_span_bias: (G*KH*KW,)), the gradients of involution_generated's
    generator for the output gradient ``grad_output``. The generated weight's gradient gw =
    involution_backward_weight(grad_output, input), (N, G*KH*KW, Ho*Wo), is contracted as it is
    formed: grad_feature = span_weight^T gw, grad_span_weight = sum over samples and pixels of
    gw feature^T, grad_span_bias = sum of gw. On CPU the native kernel never writes gw to
    memory, nor does CUDA's tensor-core kernel (bfloat16, and float32 in 3xTF32, on sm_80 and
    newer, not yet the default: ``GENERATOR_ON_TENSOR_CORES``); the plain-PyTorch route and CUDA's map route make it
    and drop it."""
    return _BACKWARD_GENERATOR.run("cpu", grad_output, feature, span_weight, input, kernel_size, stride, padding,
                                   dilation)


register_contract(involution_generated_backward_generator, _BACKWARD_GENERATOR)
# Its CUDA kernel: the rules, the result and the writer as a planned op's are, never planned (its
# result is three tensors, and its writer launches into temporaries), but tuned among its
# kernels where tuning is on (oplib.kernels.cuda_plan); registered as the planned ops' kernels
# are, so that its eager calls are direct ones too (_common.DIRECT_CALLS).
BACKWARD_GENERATOR_CUDA = LaunchPlans(_BACKWARD_GENERATOR_RULES.enforce, _generator_grads_result,
                                      cuda.involution_generated_backward_generator, cupy_launcher,
                                      cuda.TUNING_CANDIDATES[f"oplib::{BACKWARD_GENERATOR}"])
register_device_kernel("oplib::involution_generated_backward_generator", "cuda", BACKWARD_GENERATOR_CUDA)


# ---------------------------------------------------------------------------------------
# Autograd: the rules of the module docstring
# ---------------------------------------------------------------------------------------


def _generator_grads(ctx, grad: Tensor, activation: Tensor, feature: Tensor, span_weight: Tensor):
    """The gradients of feature, span_weight and span_bias (None where not needed), the op
    involution_generated_backward_generator(grad, feature, span_weight, activation): ``grad`` is
    the gradient of the output (forward) or the upstream one (grad_input's op), and
    ``activation`` the input (forward) or the upstream gradient (grad_input's op, whose weight
    gradient is involution_backward_weight(grad_output, u))."""
    needs = ctx.needs_input_grad[1:4]
    if not any(needs):
        return None, None, None
    grads = involution_generated_backward_generator(grad, feature, span_weight, activation, *ctx.params)
    return tuple(g if need else None for g, need in zip(grads, needs))


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

# ---------------------------------------------------------------------------------------
# The generator's gradient op: its own autograd, vmap and forward AD. With gw the gradient
# of the generated weight (bilinear in grad_output u and input x), the op is
# (S^T gw, gw f^T, sum gw); for upstream gradients (vf, vS, vb) of its three results
#     <vf, S^T gw> + <vS, gw f^T> + <vb, sum gw> = <gw, W'>,   W' = S vf + vS f + vb,
# the weight generated by feature [vf; f], span [S, vS] and bias vb, so
#     d/du = involution_generated(x, [vf; f], [S, vS], vb)
#     d/dx = involution_generated_backward_input(u, [vf; f], [S, vS], vb)
#     (d/df, d/dS, -) = involution_generated_backward_generator(u, vf, vS, x)
# ---------------------------------------------------------------------------------------


def _backward_generator_setup(ctx, inputs, output) -> None:
    grad_output, feature, span_weight, input, *params = inputs
    ctx.save_for_backward(grad_output, feature, span_weight, input)
    ctx.params = tuple(params)


def _backward_generator_backward(ctx, grad_feature_up, grad_span_up, grad_bias_up):
    u, feature, span_weight, x = ctx.saved_tensors
    params = ctx.params
    needs_u, needs_f, needs_s, needs_x = ctx.needs_input_grad[:4]
    d_u = d_f = d_s = d_x = None
    if needs_u or needs_x:
        generator = _combined_generator(feature, span_weight, grad_feature_up, grad_span_up)
        if generator is not None or grad_bias_up is not None:
            f2, s2 = generator if generator is not None else (feature, torch.zeros_like(span_weight))
            if needs_u:
                d_u = involution_generated(x, f2, s2, grad_bias_up, *params)
            if needs_x:
                d_x = involution_generated_backward_input(u, f2, s2, grad_bias_up, list(x.shape[2:]), *params)
    if (needs_f and grad_span_up is not None) or (needs_s and grad_feature_up is not None):
        v_f = grad_feature_up if grad_feature_up is not None else torch.zeros_like(feature)
        v_s = grad_span_up if grad_span_up is not None else torch.zeros_like(span_weight)
        by_f, by_s, _ = involution_generated_backward_generator(u, v_f, v_s, x, *params)
        d_f = by_f if needs_f and grad_span_up is not None else None
        d_s = by_s if needs_s and grad_feature_up is not None else None
    return d_u, d_f, d_s, d_x, *(None for _ in params)


def _combined_generator(feature: Tensor, span_weight: Tensor, v_feature: Optional[Tensor],
                        v_span: Optional[Tensor]) -> Optional[tuple[Tensor, Tensor]]:
    """(feature', span') with span' feature' = span_weight v_feature + v_span feature: the
    channels of both terms side by side (None where neither is given)."""
    if v_feature is None and v_span is None:
        return None
    if v_span is None:
        return v_feature, span_weight
    if v_feature is None:
        return feature, v_span
    return torch.cat([v_feature, feature], 1), torch.cat([span_weight, v_span], 1)


involution_generated_backward_generator.register_autograd(_backward_generator_backward,
                                                          setup_context=_backward_generator_setup)


def _backward_generator_vmap(info, in_dims, grad_output, feature, span_weight, input, kernel_size, stride, padding,
                             dilation):
    """Each vmapped element sums over its own samples: gw for all elements at once (the
    vmapped dimension folded into N), contracted per element."""
    b = info.batch_size
    u, f, s, x = (t.movedim(d, 0) if d is not None else t.expand(b, *t.shape)
                  for t, d in zip((grad_output, feature, span_weight, input), in_dims[:4]))
    rows = s.shape[1]
    groups = rows // (kernel_size[0] * kernel_size[1])
    gw = unfused.involution_backward_weight(u.flatten(0, 1), x.flatten(0, 1), kernel_size, stride, padding, dilation,
                                            groups)
    gw = gw.reshape(b, u.shape[1], rows, f.shape[3] * f.shape[4])  # (B, N, G*KH*KW, Ho*Wo)
    f_flat = f.flatten(3)  # (B, N, R, Ho*Wo)
    grad_feature = torch.einsum("bkr,bnkp->bnrp", s, gw).reshape(f.shape)
    grad_span = torch.einsum("bnkp,bnrp->bkr", gw, f_flat)
    return (grad_feature, grad_span, gw.sum((1, 3))), (0, 0, 0)


involution_generated_backward_generator.register_vmap(_backward_generator_vmap)


def _backward_generator_jvp(inputs, output, tangents):
    """d(S^T gw, gw f^T, sum gw) = G(du, f, S, x) + G(u, f, S, dx) + (dS^T gw, gw df^T, 0)."""
    u, feature, span_weight, x, *params = inputs
    u_dot, feature_dot, span_dot, x_dot = tangents[:4]

    def op(*args):
        return involution_generated_backward_generator(*args, *params)

    terms = []
    if u_dot is not None:
        terms.append(op(u_dot, feature, span_weight, x))
    if x_dot is not None:
        terms.append(op(u, feature, span_weight, x_dot))
    if feature_dot is not None or span_dot is not None:
        by_f, by_s, bias = op(u, feature_dot if feature_dot is not None else torch.zeros_like(feature),
                              span_dot if span_dot is not None else torch.zeros_like(span_weight), x)
        terms.append((by_f, by_s, torch.zeros_like(bias)))
    return tuple(sum_tangents(*parts) for parts in zip(*terms))


register_jvp(involution_generated_backward_generator, _backward_generator_jvp)

for _qualname in ("oplib::involution_generated", "oplib::involution_generated_backward_input",
                  "oplib::involution_generated_backward_generator"):
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


@register_flop_formula(torch.ops.oplib.involution_generated_backward_generator)
def _backward_generator_flops(grad_shape, feature_shape, span_shape, input_shape, kernel_size, *args, out_shape=None,
                              **kwargs):
    """gw (one multiply-add per grad_output element and tap) and its two contractions (one per
    gw element and reduced channel each)."""
    n, reduced, out_h, out_w = feature_shape
    return (unfused._involution_flop_count(grad_shape, kernel_size)
            + 2 * 2 * n * out_h * out_w * span_shape[0] * reduced)
