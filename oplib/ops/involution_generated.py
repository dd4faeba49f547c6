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

CPU: the native kernels of ``oplib/kernels/cpu/`` (``involution_generated_forward`` and
``..._backward_input``), else the plain-PyTorch route (the span conv, then involution's
own CPU kernels). CUDA: the kernels of ``involution_generated.cu`` (generic: one thread per
sample, group and pixel; not yet specialised like involution's), which form the weights in
registers.
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor
from torch.utils.flop_counter import register_flop_formula

from ..kernels import Launcher, cuda_dispatch, cupy_launcher, involution_cpu, native
from . import involution as unfused
from ._common import (
    CHANNELS_DIVISIBLE,
    argument_predicate,
    check,
    check_dim,
    check_floating,
    check_same_dtype_and_device,
    check_value,
    check_window_fits,
    check_window_params,
    register_autocast_policy,
    window_fits,
    window_output_size,
    window_params_valid,
)
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


def _check_args(op: str, activation_name: str, activation: Tensor, feature: Tensor, span_weight: Tensor,
                span_bias: Optional[Tensor], input_size, kernel_size, stride, padding, dilation) -> None:
    """The checks of both ops: ``activation`` is the input (forward) or grad_output, whose
    channels are the input's, and ``input_size`` the input's (H, W)."""
    check_dim(op, activation_name, activation, (4,), unfused.INPUT_LAYOUT)
    check_dim(op, "feature", feature, (4,), FEATURE_LAYOUT)
    check_dim(op, "span_weight", span_weight, (2,), SPAN_WEIGHT_LAYOUT)
    if span_bias is not None:
        check_dim(op, "span_bias", span_bias, (1,), SPAN_BIAS_LAYOUT)
    check_floating(op, activation_name, activation)
    check_same_dtype_and_device(op, activation_name, activation, feature=feature, span_weight=span_weight,
                                span_bias=span_bias)
    check_window_params(op, stride, padding, dilation)
    check_value(
        len(kernel_size) == 2 and kernel_size[0] > 0 and kernel_size[1] > 0,
        lambda: KERNEL_SIZE.format(op=op, kernel_size=list(kernel_size)),
    )
    taps = kernel_size[0] * kernel_size[1]
    rows = span_weight.shape[0]
    span_size = list(span_weight.shape)
    check((rows > 0) & (rows % taps == 0), lambda: SPAN_ROWS.format(op=op, rows=rows, taps=taps, span_size=span_size))
    groups = rows // taps
    channels = activation.shape[1]
    check(channels % groups == 0, lambda: CHANNELS_DIVISIBLE.format(op=op, channels=channels, groups=groups))
    check(
        feature.shape[1] == span_weight.shape[1],
        lambda: REDUCED.format(op=op, feature_size=list(feature.shape), span_size=span_size),
    )
    if span_bias is not None:
        check(span_bias.shape[0] == rows, lambda: SPAN_BIAS.format(op=op, rows=rows, bias_size=list(span_bias.shape)))
    check_window_fits(op, input_size, kernel_size, padding, dilation)
    out_h, out_w = window_output_size(input_size, kernel_size, stride, padding, dilation)
    if activation_name == "grad_output":
        out_h, out_w = activation.shape[2], activation.shape[3]
        expected = window_output_size(input_size, kernel_size, stride, padding, dilation)
        check(
            (expected[0] == out_h) & (expected[1] == out_w),
            lambda: GRAD_OUTPUT_SIZE.format(expected=list(expected), input_size=list(input_size),
                                            grad_size=list(activation.shape)),
        )
    check(
        (feature.shape[0] == activation.shape[0]) & (feature.shape[2] == out_h) & (feature.shape[3] == out_w),
        lambda: FEATURE_SIZE.format(op=op, batch=activation.shape[0], out_h=out_h, out_w=out_w, name=activation_name,
                                    feature_size=list(feature.shape)),
    )


def _check_forward_args(input, feature, span_weight, span_bias, kernel_size, stride, padding, dilation) -> None:
    check_dim(FORWARD, "input", input, (4,), unfused.INPUT_LAYOUT)
    _check_args(FORWARD, "input", input, feature, span_weight, span_bias, input.shape[2:], kernel_size, stride,
                padding, dilation)


def _check_backward_input_args(grad_output, feature, span_weight, span_bias, input_size, kernel_size, stride, padding,
                               dilation) -> None:
    check_value(len(input_size) == 2, lambda: INPUT_SIZE_PAIR.format(input_size=list(input_size)))
    _check_args(BACKWARD_INPUT, "grad_output", grad_output, feature, span_weight, span_bias, input_size, kernel_size,
                stride, padding, dilation)


def _args_valid(activation: Tensor, feature: Tensor, span_weight: Tensor, span_bias: Optional[Tensor], input_size,
                kernel_size, stride, padding, dilation) -> bool:
    """The checks above as plain comparisons (the eager fast path, see ARGUMENT_PREDICATES)."""
    if not (
        activation.dim() == 4 and feature.dim() == 4 and span_weight.dim() == 2
        and (span_bias is None or span_bias.dim() == 1)
        and activation.is_floating_point()
        and all(t.dtype == activation.dtype and t.device == activation.device
                for t in (feature, span_weight, span_bias) if t is not None)
        and window_params_valid(stride, padding, dilation)
        and len(input_size) == 2 and len(kernel_size) == 2 and kernel_size[0] > 0 and kernel_size[1] > 0
    ):
        return False
    taps = kernel_size[0] * kernel_size[1]
    rows, reduced = span_weight.shape
    if not (rows > 0 and rows % taps == 0 and activation.shape[1] % (rows // taps) == 0
            and feature.shape[1] == reduced and (span_bias is None or span_bias.shape[0] == rows)
            and window_fits(input_size, kernel_size, padding, dilation)):
        return False
    out_size = window_output_size(input_size, kernel_size, stride, padding, dilation)
    return tuple(feature.shape[2:]) == out_size and feature.shape[0] == activation.shape[0]


@argument_predicate("oplib::involution_generated")
def _forward_args_valid(input, feature, span_weight, span_bias, kernel_size, stride, padding, dilation) -> bool:
    return input.dim() == 4 and _args_valid(input, feature, span_weight, span_bias, input.shape[2:], kernel_size,
                                            stride, padding, dilation)


@argument_predicate("oplib::involution_generated_backward_input")
def _backward_input_args_valid(grad_output, feature, span_weight, span_bias, input_size, kernel_size, stride, padding,
                               dilation) -> bool:
    return (
        _args_valid(grad_output, feature, span_weight, span_bias, input_size, kernel_size, stride, padding, dilation)
        and tuple(grad_output.shape[2:]) == tuple(feature.shape[2:])
    )


def generated_weight(feature: Tensor, span_weight: Tensor, span_bias: Optional[Tensor], kernel_size) -> Tensor:
    """feature: (N, R, Ho, Wo), span_weight: (G*KH*KW, R), span_bias: (G*KH*KW,) or None
    -> the weight (N, G, KH, KW, Ho, Wo) of ``oplib::involution``, as ``Involution2d``'s span
    conv computes it (pixel-major in memory when ``feature`` is channels_last)."""
    n, _, out_h, out_w = feature.shape
    kh, kw = kernel_size
    weight = torch.nn.functional.conv2d(feature, span_weight[:, :, None, None], span_bias)
    return weight.view(n, span_weight.shape[0] // (kh * kw), kh, kw, out_h, out_w)


# ---------------------------------------------------------------------------------------
# The two ops
# ---------------------------------------------------------------------------------------


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
    if not _forward_args_valid(input, feature, span_weight, span_bias, kernel_size, stride, padding, dilation):
        _check_forward_args(input, feature, span_weight, span_bias, kernel_size, stride, padding, dilation)
    out = unfused.result_like(input, feature.shape[2:])
    module = native.involution()
    if module is not None:
        return module.involution_generated_forward(input, feature, span_weight, span_bias, kernel_size, stride, padding,
                                                   dilation, out=out)
    weight = generated_weight(feature, span_weight, span_bias, kernel_size)
    return out.copy_(involution_cpu.pytorch_involution(input, weight, stride, padding, dilation))


@involution_generated.register_fake
def _involution_generated_fake(input, feature, span_weight, span_bias, kernel_size, stride, padding, dilation):
    _check_forward_args(input, feature, span_weight, span_bias, kernel_size, stride, padding, dilation)
    return unfused.result_like(input, feature.shape[2:])


@involution_generated.register_kernel("cuda")
def _involution_generated_cuda(input, feature, span_weight, span_bias, kernel_size, stride, padding, dilation):
    if not _forward_args_valid(input, feature, span_weight, span_bias, kernel_size, stride, padding, dilation):
        _check_forward_args(input, feature, span_weight, span_bias, kernel_size, stride, padding, dilation)
    return launch_involution_generated(input, feature, span_weight, span_bias, kernel_size, stride, padding, dilation,
                                       cupy_launcher())


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
    args = (grad_output, feature, span_weight, span_bias, input_size, kernel_size, stride, padding, dilation)
    if not _backward_input_args_valid(*args):
        _check_backward_input_args(*args)
    grad_input = unfused.result_like(grad_output, input_size)
    module = native.involution()
    if module is not None:
        return module.involution_generated_backward_input(*args, out=grad_input)
    weight = generated_weight(feature, span_weight, span_bias, kernel_size)
    return grad_input.copy_(involution_cpu.pytorch_involution_backward_input(grad_output, weight, input_size, stride, padding,
                                                                             dilation))


@involution_generated_backward_input.register_fake
def _backward_input_fake(grad_output, feature, span_weight, span_bias, input_size, kernel_size, stride, padding,
                         dilation):
    _check_backward_input_args(grad_output, feature, span_weight, span_bias, input_size, kernel_size, stride, padding,
                               dilation)
    return unfused.result_like(grad_output, input_size)


@involution_generated_backward_input.register_kernel("cuda")
def _backward_input_cuda(grad_output, feature, span_weight, span_bias, input_size, kernel_size, stride, padding,
                         dilation):
    args = (grad_output, feature, span_weight, span_bias, input_size, kernel_size, stride, padding, dilation)
    if not _backward_input_args_valid(*args):
        _check_backward_input_args(*args)
    return launch_involution_generated_backward_input(*args, cupy_launcher())


# ---------------------------------------------------------------------------------------
# CUDA dispatch (involution_generated.cu), through a launcher: CuPy on a GPU, the host
# emulation of oplib.testing in the tests
# ---------------------------------------------------------------------------------------

_SOURCE = "involution_generated.cu"


def _launch(launcher: Launcher, kernel: str, activation: Tensor, feature: Tensor, span_weight: Tensor,
            span_bias: Optional[Tensor], out_size, kernel_size, stride, padding, dilation) -> Tensor:
    """The forward (``kernel`` "involution_generated_forward", ``activation`` the input) or
    grad_input ("..._backward_input", ``activation`` grad_output): a result of ``out_size``
    (H, W), channels_last when ``activation`` is, one thread per (sample, group, pixel of it)."""
    n, channels = activation.shape[:2]
    out = unfused.result_like(activation, out_size)
    groups = span_weight.shape[0] // (kernel_size[0] * kernel_size[1])
    bias = span_weight.new_zeros(span_weight.shape[0]) if span_bias is None else span_bias
    operands = tuple(t.contiguous() for t in (activation, feature, span_weight, bias))
    # The kernels' scalars name the input's size and the output's, whichever is read.
    height, width = out_size if kernel.endswith("backward_input") else activation.shape[2:]
    threads = n * groups * out_size[0] * out_size[1]
    scalars = (threads, channels, height, width, groups, *kernel_size, *feature.shape[2:], *stride, *padding, *dilation,
               feature.shape[1])
    return unfused._run(launcher, kernel, out, out.is_contiguous(), operands, scalars, threads, source=_SOURCE)


@cuda_dispatch("oplib::involution_generated", _SOURCE, ["involution_generated_forward"])
def launch_involution_generated(input: Tensor, feature: Tensor, span_weight: Tensor, span_bias: Optional[Tensor],
                                kernel_size, stride, padding, dilation, launcher: Launcher) -> Tensor:
    """input: (N, C, H, W), feature: (N, R, Ho, Wo) -> (N, C, Ho, Wo), channels_last when the input is."""
    return _launch(launcher, "involution_generated_forward", input, feature, span_weight, span_bias,
                   tuple(feature.shape[2:]), kernel_size, stride, padding, dilation)


@cuda_dispatch("oplib::involution_generated_backward_input", _SOURCE, ["involution_generated_backward_input"])
def launch_involution_generated_backward_input(grad_output: Tensor, feature: Tensor, span_weight: Tensor,
                                               span_bias: Optional[Tensor], input_size, kernel_size, stride, padding,
                                               dilation, launcher: Launcher) -> Tensor:
    """grad_output: (N, C, Ho, Wo), feature: (N, R, Ho, Wo) -> grad_input: (N, C, H, W),
    channels_last when grad_output is."""
    return _launch(launcher, "involution_generated_backward_input", grad_output, feature, span_weight, span_bias,
                   tuple(input_size), kernel_size, stride, padding, dilation)


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


def _forward_setup_context(ctx, inputs, output) -> None:
    input, feature, span_weight, span_bias, kernel_size, stride, padding, dilation = inputs
    _save(ctx, input, feature, span_weight, span_bias, (kernel_size, stride, padding, dilation))


def _forward_backward(ctx, grad: Tensor):
    input, feature, span_weight, span_bias = ctx.saved_tensors
    kernel_size, stride, padding, dilation = ctx.params
    grad_input = None
    if ctx.needs_input_grad[0]:
        grad_input = involution_generated_backward_input(grad, feature, span_weight, span_bias,
                                                         list(ctx.shapes[0][2:]), kernel_size, stride, padding,
                                                         dilation)
    return grad_input, *_generator_grads(ctx, grad, input, feature, span_weight), None, None, None, None


def _backward_input_setup_context(ctx, inputs, output) -> None:
    grad_output, feature, span_weight, span_bias, input_size, kernel_size, stride, padding, dilation = inputs
    _save(ctx, grad_output, feature, span_weight, span_bias, (kernel_size, stride, padding, dilation))


def _backward_input_backward(ctx, upstream: Tensor):
    grad_output, feature, span_weight, span_bias = ctx.saved_tensors
    kernel_size, stride, padding, dilation = ctx.params
    d_grad_output = None
    if ctx.needs_input_grad[0]:
        d_grad_output = involution_generated(upstream, feature, span_weight, span_bias, kernel_size, stride, padding,
                                             dilation)
    # grad_input = involution_backward_input(grad_output, weight): d/dweight is
    # involution_backward_weight(grad_output, upstream).
    return d_grad_output, *_generator_grads(ctx, grad_output, upstream, feature, span_weight), None, None, None, None, None


involution_generated.register_autograd(_forward_backward, setup_context=_forward_setup_context)
involution_generated_backward_input.register_autograd(_backward_input_backward,
                                                      setup_context=_backward_input_setup_context)


# ---------------------------------------------------------------------------------------
# vmap: a vmapped activation or feature folds into N; a vmapped span_weight or span_bias
# differs per vmapped element, so the weights are generated per element and the unfused op runs
# ---------------------------------------------------------------------------------------


def _vmap(info, in_dims, activation, feature, span_weight, span_bias, kernel_size, fused, unfused_op, unfused_args):
    x, f = unfused._fold_batch(info, in_dims[:2], (activation, feature))
    if in_dims[2] is None and in_dims[3] is None:
        return unfused._unfold_batch(info, fused(x, f, span_weight, span_bias))
    spans = [s.movedim(d, 0) if d is not None else s.expand(info.batch_size, *s.shape)
             for s, d in zip((span_weight, span_bias), in_dims[2:4]) if s is not None]
    n = f.shape[0] // info.batch_size
    f = f.unflatten(0, (info.batch_size, n))  # (B, N, R, Ho, Wo)
    weight = torch.einsum("bkr,bnrhw->bnkhw", spans[0], f)
    if span_bias is not None:
        weight = weight + spans[1][:, None, :, None, None]
    kh, kw = kernel_size
    weight = weight.reshape(info.batch_size * n, spans[0].shape[1] // (kh * kw), kh, kw, *f.shape[3:])
    return unfused._unfold_batch(info, unfused_op(x, weight, *unfused_args))


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
