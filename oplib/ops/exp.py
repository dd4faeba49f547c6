"""``oplib::exp(Tensor x) -> Tensor``: the custom activation y = e^x.

Backward saves the output rather than the input, since d/dx e^x = e^x = y.
"""

from __future__ import annotations

import torch
from torch import Tensor
from torch.utils.flop_counter import register_flop_formula

from ._common import register_autocast_policy
from ._rules import Rules, tensor_rules
from ._transforms import register_jvp


# exp(x): any shape, a floating dtype.
_EXP_RULES = Rules("oplib::exp", tensor_rules("exp", (0, "x", None, None)))


@torch.library.custom_op("oplib::exp", mutates_args=())
def exp(x: Tensor) -> Tensor:
    """Elementwise e^x. x: any shape, floating dtype. Returns a tensor laid out like x."""
    _EXP_RULES.enforce(x)
    if x.is_contiguous():
        return torch.exp(x)
    # Writing into empty_like(x) makes the output strides exactly those of the fake (for an
    # input with gaps, torch.exp would order the output's strides like the input's).
    return torch.exp(x, out=torch.empty_like(x))


@exp.register_fake
def _exp_fake(x: Tensor) -> Tensor:
    _EXP_RULES.enforce(x)
    return torch.empty_like(x)


def _exp_setup_context(ctx, inputs, output) -> None:
    ctx.save_for_backward(output if ctx.needs_input_grad[0] else None)


def _exp_backward(ctx, grad: Tensor) -> Tensor:
    (y,) = ctx.saved_tensors
    # d/dx e^x = e^x. y keeps its graph, so this product is differentiable again.
    return grad * y


exp.register_autograd(_exp_backward, setup_context=_exp_setup_context)


def _exp_vmap(info, in_dims, x: Tensor):
    # Elementwise: the vmapped dimension is just another dimension.
    return exp(x), in_dims[0]


exp.register_vmap(_exp_vmap)


def _exp_jvp(inputs, output: Tensor, tangents) -> Tensor:
    (x_dot,) = tangents
    return x_dot * output  # d/dx e^x = e^x


register_jvp(exp, _exp_jvp)

# torch.exp is on CUDA autocast's float32 list and on no CPU autocast list (it keeps
# its input dtype there), so only CUDA gets a kernel.
register_autocast_policy("oplib::exp", "cuda", "fp32")


@register_flop_formula(torch.ops.oplib.exp)
def _exp_flops(x_shape, out_shape=None, **kwargs) -> int:
    # FlopCounterMode counts no FLOPs for torch's pointwise ops (torch.exp included).
    return 0
