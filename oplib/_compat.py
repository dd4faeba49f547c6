"""What differs across the torch releases oplib supports, from the oldest (pyproject.toml's
``dependencies``; ``make test-oldest`` runs the suite on it) to the newest (``make test``).

Each name here is the newer torch's API where it exists and a stand-in with the same result
where it does not; its comment names the releases.
"""

from __future__ import annotations

import inspect
from typing import Any

import torch
from torch import Tensor


def _any_requires_grad_python(*args: Any) -> bool:
    # oplib's schemas take Tensor and Tensor? arguments, never Tensor[]: a flat scan is enough.
    return any(isinstance(a, Tensor) and a.requires_grad for a in args)


# Whether any tensor argument requires grad. torch >= 2.8: torch._C._any_requires_grad, in C++
# (custom_op's own Autograd kernel calls it); torch 2.7 has no such function (its custom_op
# scans the arguments with a pytree in Python).
any_requires_grad = getattr(torch._C, "_any_requires_grad", _any_requires_grad_python)

# torch >= 2.8: Library.impl(..., allow_override=True) replaces a kernel that Python registered
# before; torch 2.7 has no such argument and refuses the second kernel.
_IMPL_TAKES_ALLOW_OVERRIDE = "allow_override" in inspect.signature(torch.library.Library.impl).parameters


def impl_override(lib: torch.library.Library, op_name: str, fn: Any, dispatch_key: str, *, with_keyset: bool = False) -> None:
    """``lib.impl`` for a dispatch key that already has a kernel registered from Python (a
    custom_op's own Autograd kernel). On torch 2.7 the refusal comes from a record in Python
    (the private set ``torch.library._impls``), not from the dispatcher, which replaces the
    kernel with a warning: the record forgets that key first."""
    if _IMPL_TAKES_ALLOW_OVERRIDE:
        lib.impl(op_name, fn, dispatch_key, with_keyset=with_keyset, allow_override=True)
        return
    torch.library._impls.discard(f"{lib.ns}/{op_name}/{dispatch_key}")
    lib.impl(op_name, fn, dispatch_key, with_keyset=with_keyset)
