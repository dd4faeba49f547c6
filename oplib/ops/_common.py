"""Pieces every oplib op shares: argument checks, autocast policies, pair normalisation.

The checks use ``torch._check*`` so that the same code raises the same error in eager
mode (real tensors) and while tracing (fake tensors with symbolic sizes).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Literal, Optional

import torch
from torch import Tensor

from .._torch_private import DispatchKey, DispatchKeySet, ExcludeDispatchKeyGuard, dispatch_key_for_device

# One Library object per namespace for the registrations that torch.library has no helper
# for (autocast kernels that read the autocast dtype at call time); kept alive for the life
# of the process.
_LIBRARIES: dict[str, torch.library.Library] = {}

AutocastPolicy = Literal["lower_precision", "fp32"]

# qualname -> {device type: policy}, as each op declared it through register_autocast_policy;
# the registry's specs read it from here.
AUTOCAST_POLICIES: dict[str, dict[str, AutocastPolicy]] = {}


# Eager fast paths. An op whose arguments are stated as ``Rules`` (``_rules.py``: the
# involution ops) registers the predicate derived from them. The dense ops still state both
# by hand: each op's ``_check_<op>_args`` states every condition with its message,
# through ``check`` (one call and one message closure per condition, which adds up to a
# sizeable share of custom_op's own per-call cost: bench/dense.py's section on oplib's
# overhead measures it). Its kernel first asks a predicate that evaluates the same
# conditions as plain comparisons, and runs the checks only when the predicate says no, so an
# invalid call still raises the checks' error. The fakes always run the checks: there sizes
# may be symbolic, and a plain comparison would specialise them. The registry's tests hold
# each predicate to its checks: True on every sample input, False on every error input.
ARGUMENT_PREDICATES: dict[str, Callable[..., bool]] = {}


def argument_predicate(qualname: str):
    """Register the decorated function as the eager fast path of ``qualname``'s checks."""

    def register(predicate: Callable[..., bool]) -> Callable[..., bool]:
        ARGUMENT_PREDICATES[qualname] = predicate
        return predicate

    return register


def window_params_valid(stride: Sequence, padding: Sequence, dilation: Sequence) -> bool:
    """``check_window_params`` as a predicate: positive stride and dilation pairs, a
    non-negative padding pair."""
    return (
        len(stride) == 2
        and len(padding) == 2
        and len(dilation) == 2
        and stride[0] >= 1
        and stride[1] >= 1
        and dilation[0] >= 1
        and dilation[1] >= 1
        and padding[0] >= 0
        and padding[1] >= 0
    )


def window_fits(size, kernel, padding, dilation) -> bool:
    """``check_window_fits`` as a predicate."""
    return (
        size[0] + 2 * padding[0] >= dilation[0] * (kernel[0] - 1) + 1
        and size[1] + 2 * padding[1] >= dilation[1] * (kernel[1] - 1) + 1
    )


def check(condition, message) -> None:
    """``torch._check`` (RuntimeError), skipped when ``condition`` is a plain True: in eager
    mode sizes are ints and every check costs a comparison. A symbolic condition still
    goes to torch._check, which records it instead of specialising the shape."""
    if condition is not True:
        torch._check(condition, message)


def check_value(condition, message) -> None:
    """``torch._check_value`` (ValueError) with the same fast path as ``check``."""
    if condition is not True:
        torch._check_value(condition, message)


# Error messages are templates, formatted by the checks and, with the values a test expects,
# by the specs' error inputs (oplib.testing.expect_message): one wording, one place.
FLOATING_DTYPE = "oplib.{op}: expected {name} to have a floating-point dtype, got {dtype}"
SAME_DTYPE = (
    "oplib.{op}: expected {name} and {reference_name} to have the same dtype, "
    "got {name}.dtype={dtype} and {reference_name}.dtype={reference_dtype}"
)
SAME_DEVICE = (
    "oplib.{op}: expected {name} and {reference_name} to be on the same device, "
    "got {name} on {device} and {reference_name} on {reference_device}"
)
DIM = "oplib.{op}: expected {name} to be {layout}, got a {dim}-D tensor of size {size}"
PAIR_LENGTH = "oplib.{op}: expected {name} to have 2 elements (height, width), got {values}"
PAIR_RANGE = "oplib.{op}: expected {name} to be {bound}, got {name}={values}"
GROUPS_POSITIVE = "oplib.{op}: expected groups to be positive, got groups={groups}"
CHANNELS_DIVISIBLE = "oplib.{op}: expected input channels ({channels}) to be divisible by groups ({groups})"
BIAS_SIZE = "oplib.{op}: expected bias of size [{size}] ({dim_name}), got bias of size {bias_size}"
WINDOW_FITS = (
    "oplib.{op}: input {axis} with padding ({size} + 2*{padding}) is smaller than the dilated kernel {axis} ({extent})"
)


def check_floating(op: str, name: str, tensor: Tensor) -> None:
    check(tensor.is_floating_point(), lambda: FLOATING_DTYPE.format(op=op, name=name, dtype=tensor.dtype))


def check_same_dtype_and_device(op: str, reference_name: str, reference: Tensor, **others: Optional[Tensor]) -> None:
    """Every tensor in ``others`` must match ``reference`` in dtype and device."""
    for name, tensor in others.items():
        if tensor is None:
            continue
        check(
            tensor.dtype == reference.dtype,
            lambda: SAME_DTYPE.format(
                op=op, name=name, reference_name=reference_name, dtype=tensor.dtype, reference_dtype=reference.dtype
            ),
        )
        check(
            tensor.device == reference.device,
            lambda: SAME_DEVICE.format(
                op=op, name=name, reference_name=reference_name, device=tensor.device, reference_device=reference.device
            ),
        )


def check_dim(op: str, name: str, tensor: Tensor, allowed: Sequence[int], layout: str) -> None:
    check(
        tensor.dim() in allowed,
        lambda: DIM.format(op=op, name=name, layout=layout, dim=tensor.dim(), size=list(tensor.shape)),
    )


def check_window_params(op: str, stride: Sequence, padding: Sequence, dilation: Sequence) -> None:
    """Stride and dilation must be positive pairs, padding a non-negative pair."""
    for name, values, lowest in (("stride", stride, 1), ("padding", padding, 0), ("dilation", dilation, 1)):
        check_value(len(values) == 2, lambda: PAIR_LENGTH.format(op=op, name=name, values=list(values)))
        for v in values:
            check_value(
                v >= lowest,
                lambda: PAIR_RANGE.format(
                    op=op, name=name, bound="positive" if lowest else "non-negative", values=list(values)
                ),
            )


def window_output_size(size, kernel, stride, padding, dilation) -> tuple:
    """(Ho, Wo) of a sliding window (conv, involution) over ``size`` = (H, W), every parameter
    a (height, width) pair; the same formula as torch's."""
    return tuple((size[a] + 2 * padding[a] - dilation[a] * (kernel[a] - 1) - 1) // stride[a] + 1 for a in (0, 1))


def check_window_fits(op: str, size, kernel, padding, dilation) -> None:
    """The padded input must hold the dilated kernel along height and width."""
    for a, name in enumerate(("height", "width")):
        extent = dilation[a] * (kernel[a] - 1) + 1
        check(
            size[a] + 2 * padding[a] >= extent,
            lambda: WINDOW_FITS.format(op=op, axis=name, size=size[a], padding=padding[a], extent=extent),
        )


def as_pair(op: str, name: str, value: int | Sequence[int]) -> list[int]:
    """Normalise ``3`` or ``(3, 3)`` to ``[3, 3]`` (custom ops cannot take list defaults)."""
    # Not torch.nn.modules.utils._pair (torchvision's choice): it is private, passes a
    # sequence of any length through unchecked, and returns a tuple where the ops' schemas
    # take lists; the error here names the op and the argument.
    if isinstance(value, (int, torch.SymInt)):
        return [value, value]
    values = list(value)
    if len(values) == 1:
        return values * 2
    if len(values) != 2:
        raise ValueError(f"oplib.{op}: expected {name} to be an int or a pair, got {value!r}")
    return values


def _autocast_cast(value, device_type: str, dtype: torch.dtype):
    # Same eligibility rule as torch's autocast: only floating tensors of the autocast
    # device, never float64.
    if (
        isinstance(value, Tensor)
        and value.is_floating_point()
        and value.dtype != torch.float64
        and value.device.type == device_type
    ):
        return value.to(dtype)
    return value


def register_autocast_policy(qualname: str, device_type: str, policy: AutocastPolicy) -> None:
    """Register an autocast kernel following one of torch's autocast policies.

    ``lower_precision``: inputs are cast to the autocast dtype in force at call time
    (``torch.get_autocast_dtype``), as torch does for ``linear`` and ``conv2d``.
    ``torch.library.register_autocast`` fixes the dtype at registration, which would
    ignore ``torch.autocast(dtype=...)``, hence this helper.
    ``fp32``: inputs are cast to float32, as torch does for ``exp`` on CUDA.
    """
    key = "Autocast" + dispatch_key_for_device(device_type)
    excluded = DispatchKeySet(getattr(DispatchKey, key))
    namespace, name = qualname.split("::")
    op = getattr(getattr(torch.ops, namespace), name).default

    def kernel(_keyset, *args):
        dtype = torch.get_autocast_dtype(device_type) if policy == "lower_precision" else torch.float32
        with ExcludeDispatchKeyGuard(excluded):
            return op(*(_autocast_cast(a, device_type, dtype) for a in args))

    if namespace not in _LIBRARIES:
        _LIBRARIES[namespace] = torch.library.Library(namespace, "FRAGMENT")
    _LIBRARIES[namespace].impl(name, kernel, key, with_keyset=True)
    AUTOCAST_POLICIES.setdefault(qualname, {})[device_type] = policy
