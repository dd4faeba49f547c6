"""Reverse-mode, forward-mode and vmap rules of an op bilinear in its two tensor arguments,
built from the op's two partial derivatives.

For ``out = op(a, b, *params)`` bilinear in (a, b), the gradient with respect to ``a`` of the
loss reached through an incoming gradient ``u`` is again linear in (u, b), and the one with
respect to ``b`` linear in (u, a): each op states those two maps (``grad_first``,
``grad_second``) and everything else follows:

- backward: the two maps, each called only when its gradient is needed, and each operand
  saved only when the other one's gradient is (the derivative with respect to one operand
  of a bilinear op reads only the other);
- jvp: ``op(a_dot, b) + op(a, b_dot)``, a term dropped where its tangent is missing;
- vmap: the vmapped dimension folded into the leading batch dimension of both operands (an
  unbatched operand expanded), the op called once, the result unfolded.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from torch import Tensor

from .._torch_private import CustomOpDef
from ._transforms import register_jvp, sum_tangents

# (u, other operand, first operand's shape, second operand's shape, params) -> a gradient.
Partial = Callable[[Tensor, Tensor, tuple, tuple, tuple], Tensor]


def fold_batch(info, in_dims: Sequence, tensors: Sequence[Tensor]) -> list[Tensor]:
    """Move each vmapped dim to the front (expanding unbatched operands) and merge it into N."""
    folded = []
    for tensor, dim in zip(tensors, in_dims):
        t = tensor.movedim(dim, 0) if dim is not None else tensor.expand(info.batch_size, *tensor.shape)
        folded.append(t.flatten(0, 1))
    return folded


def unfold_batch(info, out: Tensor):
    """The folded result with the vmapped dim split off N again, at dim 0."""
    return out.unflatten(0, (info.batch_size, out.shape[0] // info.batch_size)), 0


def register_bilinear(op: CustomOpDef, grad_first: Partial, grad_second: Partial) -> None:
    """Register ``op``'s autograd, vmap and jvp rules (see the module docstring); ``op`` takes
    its two operands first, then parameters that have no gradient."""

    def setup_context(ctx, inputs, output) -> None:
        first, second, *params = inputs
        needs_first, needs_second = ctx.needs_input_grad[:2]
        ctx.save_for_backward(first if needs_second else None, second if needs_first else None)
        ctx.shapes = (first.shape, second.shape)
        ctx.params = tuple(params)

    def backward(ctx, u: Tensor):
        first, second = ctx.saved_tensors
        shapes, params = ctx.shapes, ctx.params
        d_first = grad_first(u, second, *shapes, params) if ctx.needs_input_grad[0] else None
        d_second = grad_second(u, first, *shapes, params) if ctx.needs_input_grad[1] else None
        return d_first, d_second, *(None for _ in params)

    def vmap(info, in_dims, first, second, *params):
        a, b = fold_batch(info, in_dims[:2], (first, second))
        return unfold_batch(info, op(a, b, *params))

    def jvp(inputs, output, tangents) -> Tensor:
        first, second, *params = inputs
        first_dot, second_dot = tangents[:2]
        return sum_tangents(
            op(first_dot, second, *params) if first_dot is not None else None,
            op(first, second_dot, *params) if second_dot is not None else None,
        )

    op.register_autograd(backward, setup_context=setup_context)
    op.register_vmap(vmap)
    register_jvp(op, jvp)
