"""``example::swish(Tensor x, float beta) -> Tensor``: y = x * sigmoid(beta * x), a custom op
written outside oplib, the way a user of oplib writes one.

It follows the pattern of oplib's own ops: one argument check shared by the kernel and the
fake, error messages as templates (so the spec's error inputs reuse them), an autograd rule
whose backward is differentiable again, and a vmap rule.
"""

from __future__ import annotations

import torch
from torch import Tensor

FLOATING_DTYPE = "example.swish: expected x to have a floating-point dtype, got {dtype}"


def _check_swish_args(x: Tensor) -> None:
    torch._check(x.is_floating_point(), lambda: FLOATING_DTYPE.format(dtype=x.dtype))


@torch.library.custom_op("example::swish", mutates_args=())
def swish(x: Tensor, beta: float) -> Tensor:
    """x: any shape, floating dtype -> the same shape, laid out like ``torch.empty_like(x)``."""
    _check_swish_args(x)
    # Written into empty_like(x) so that the real strides are the fake's, for any input layout.
    return torch.mul(x, torch.sigmoid(beta * x), out=torch.empty_like(x))


@swish.register_fake
def _swish_fake(x: Tensor, beta: float) -> Tensor:
    _check_swish_args(x)
    return torch.empty_like(x)


def _setup_context(ctx, inputs, output) -> None:
    x, beta = inputs
    ctx.save_for_backward(x)
    ctx.beta = beta


def _backward(ctx, grad: Tensor):
    (x,) = ctx.saved_tensors
    s = torch.sigmoid(ctx.beta * x)
    # d/dx x*s(bx) = s + b*x*s*(1-s), written in differentiable torch ops for double backward.
    return grad * (s + ctx.beta * x * s * (1 - s)), None


swish.register_autograd(_backward, setup_context=_setup_context)


def _vmap(info, in_dims, x: Tensor, beta: float):
    # Elementwise: the vmapped dimension is one more dimension.
    return swish(x, beta), in_dims[0]


swish.register_vmap(_vmap)
