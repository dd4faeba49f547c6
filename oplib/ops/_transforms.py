"""Forward-mode AD and the torch.func transforms for oplib's custom ops: ``register_jvp``.

``torch.library.custom_op`` (torch 2.13) gives an op reverse-mode autograd
(``register_autograd``) and vmap (``register_vmap``) but leaves two gaps that a native op
does not have:

- **No forward-mode rule.** The Autograd kernel that custom_op installs takes its no-grad
  path for dual tensors (they do not require grad), so ``torch.autograd.forward_ad`` gets a
  ``None`` tangent and ``torch.func.jvp`` / ``jacfwd`` get zeros, silently. A
  ``register_jvp`` for custom ops was proposed upstream (pytorch/pytorch#131116) and not merged.
- **No torch.func.grad / jacrev.** Under a functorch grad level, custom_op's generated
  ``autograd.Function`` is rejected because it has no ``setup_context`` staticmethod.

Both are closed by the route torch.func supports for Python-defined derivatives, an
``autograd.Function`` with ``setup_context``, ``backward``, ``jvp`` and ``vmap``, built here
from the op's own registrations (``setup_context``/``backward`` from ``register_autograd``,
``vmap`` from ``register_vmap``, ``jvp`` given to ``register_jvp``) and reached through two
more kernels of the same op, so ``torch.ops.oplib.*``, the Python API and the modules all get
it:

- a ``FuncTorchDynamicLayerFrontMode`` kernel: while any torch.func transform is active the
  call goes to functorch's ``custom_function_call``, exactly as ``Function.apply`` would from
  user code, and functorch applies its rule for each level (grad, jvp, vmap, nested);
- an ``Autograd`` kernel, in place of custom_op's: an input with a tangent at the active
  forward-AD level goes through the same ``autograd.Function``; otherwise the call takes
  custom_op's own reverse-mode kernel, or a redispatch below autograd when nothing needs a
  gradient (the path custom_op takes, without its per-call metadata object). Where the next
  stop below autograd is a device kernel oplib registered (``_common.direct_kernel``: an eager
  call on real tensors) the kernel calls it directly, and a call that needs a gradient goes
  through a leaner copy of custom_op's ``autograd.Function`` (``_eager_reverse_mode``: the
  same name, setup_context and backward, without the per-call metadata object, the defaults
  filled in and the redispatch).

torch.compile, torch.export and AOTInductor trace the op above these keys (dynamo) or through
custom_op's reverse-mode kernel (AOTAutograd), so what they see is unchanged.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Optional

import torch
import torch.autograd.forward_ad as forward_ad
from torch import Tensor

from .._torch_private import (
    AutoDispatchBelowAutograd,
    CustomOpDef,
    after_autograd_keyset,
    any_requires_grad,
    custom_function_call,
    forward_ad_level,
    make_autograd_impl,
)
from ._common import AUTOGRAD_KERNELS, direct_kernel, namespace_library, overriding_kernels

# jvp(inputs, output, tangents) -> the output's tangent. ``inputs`` are the op's arguments,
# ``tangents`` one per argument: a tensor, or None where the argument has no tangent.
JvpRule = Callable[[tuple, Tensor, tuple], Tensor]


def sum_tangents(*terms: Optional[Tensor]) -> Optional[Tensor]:
    """The sum of the terms that are not None (None if all are): each term of a product
    rule is missing when its tangent is."""
    total = None
    for term in terms:
        if term is not None:
            total = term if total is None else total + term
    return total


def _has_tangent(args: tuple) -> bool:
    return any(
        isinstance(a, Tensor) and forward_ad.unpack_dual(a).tangent is not None for a in args
    )


def _function_for(opdef: CustomOpDef, jvp: JvpRule) -> type[torch.autograd.Function]:
    op = opdef._opoverload

    def forward(*args):
        return op(*args)

    def setup_context(ctx, inputs, output):
        ctx.primal_inputs, ctx.primal_output = inputs, output
        opdef._setup_context_fn(ctx=ctx, inputs=inputs, output=output)

    def backward(ctx, *grads):
        return opdef._backward_fn(ctx, *grads)

    def function_jvp(ctx, *tangents):
        tangent = jvp(ctx.primal_inputs, ctx.primal_output, tangents)
        if tangent is None:
            raise RuntimeError(f"{opdef._qualname}: the jvp rule returned no tangent for tangents {tangents}")
        return tangent

    def vmap(info, in_dims, *args):
        return opdef._vmap_fn(info, in_dims, *args)

    return type(
        f"{opdef._name}_function",
        (torch.autograd.Function,),
        {
            "forward": staticmethod(forward),
            "setup_context": staticmethod(setup_context),
            "backward": staticmethod(backward),
            "jvp": staticmethod(function_jvp),
            "vmap": staticmethod(vmap),
        },
    )


def _is_tensor_list(schema_type) -> bool:
    """A schema type that holds tensors in a list (``Tensor[]``, ``Tensor?[]``, optional or not)."""
    text = str(schema_type)
    return "List[" in text and "Tensor" in text


def _eager_reverse_mode(opdef: CustomOpDef) -> Optional[type[torch.autograd.Function]]:
    """custom_op's reverse-mode ``autograd.Function`` (``make_autograd_impl``'s) for an eager
    call whose device kernel is known: applied as ``apply(*args, kernel)``, it runs ``kernel``
    below autograd and the op's ``setup_context``; its backward is the op's, ``needs_input_grad``
    without the kernel's entry, as custom_op's hides its metadata's. Named as custom_op's, so
    that a graph's ``grad_fn`` and the profiler's events read the same. None for a schema whose
    calls custom_op's handles differently (keyword-only arguments, lists of tensors)."""
    schema = opdef._opoverload._schema
    if any(a.kwarg_only or _is_tensor_list(a.type) for a in schema.arguments) or any(
        _is_tensor_list(r.type) for r in schema.returns
    ):
        return None
    setup_context, backward_fn = opdef._setup_context_fn, opdef._backward_fn

    def forward(ctx, *args):
        kernel, inputs = args[-1], args[:-1]
        with AutoDispatchBelowAutograd():
            output = kernel(*inputs)
        setup_context(ctx=ctx, inputs=inputs, output=output)
        return output

    def backward(ctx, *grads):
        needs_input_grad = ctx.needs_input_grad
        ctx.needs_input_grad = needs_input_grad[:-1]
        try:
            result = backward_fn(ctx, *grads)
        finally:
            ctx.needs_input_grad = needs_input_grad
        return (*result, None) if isinstance(result, tuple) else (result, None)

    op = opdef._opoverload
    return type(
        f"GeneratedBackwardFor_{op._namespace}_{op._opname}_{op._overloadname}",
        (torch.autograd.Function,),
        {"forward": staticmethod(forward), "backward": staticmethod(backward)},
    )


def register_jvp(opdef: CustomOpDef, jvp: JvpRule) -> None:
    """Give ``opdef`` forward-mode AD and the torch.func transforms (see the module
    docstring). Call after ``register_autograd`` and ``register_vmap``."""
    if opdef._backward_fn is None or opdef._vmap_fn is None:
        raise RuntimeError(f"register_jvp({opdef._qualname}): register_autograd and register_vmap come first")
    function = _function_for(opdef, jvp)
    reverse_mode = make_autograd_impl(opdef._opoverload, opdef)
    eager_reverse_mode = _eager_reverse_mode(opdef)
    op = opdef._opoverload
    qualname = opdef._qualname
    custom_op_kernels = opdef._backend_fns  # (read at each call: register_kernel adds to it)
    library = namespace_library(qualname.split("::")[0])
    arguments = len(op._schema.arguments)
    after_autograd = after_autograd_keyset
    is_grad_enabled = torch.is_grad_enabled

    def autograd_kernel(keyset, *args: Any):
        if forward_ad_level() >= 0 and _has_tangent(args):
            return function.apply(*args)
        below = keyset & after_autograd
        kernel = direct_kernel(qualname, below, custom_op_kernels)
        if is_grad_enabled() and any_requires_grad(*args):
            # (every argument given: custom_op's fills in defaults the dispatcher left out)
            if kernel is not None and eager_reverse_mode is not None and len(args) == arguments:
                return eager_reverse_mode.apply(*args, kernel)
            return reverse_mode(keyset, *args)
        with AutoDispatchBelowAutograd():
            if kernel is not None:
                return kernel(*args)
            return op.redispatch(below, *args)

    def functorch_kernel(*args: Any):
        return custom_function_call(function, *args)

    with overriding_kernels():  # (custom_op's Autograd kernel replaced)
        # (the op's own namespace: register_jvp serves any custom op, not only oplib's)
        library.impl(opdef._name, autograd_kernel, "Autograd", with_keyset=True, allow_override=True)
    AUTOGRAD_KERNELS[qualname] = autograd_kernel
    library.impl(opdef._name, functorch_kernel, "FuncTorchDynamicLayerFrontMode")
