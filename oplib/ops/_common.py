"""Pieces every oplib op shares: the argument errors' message templates (the rules that raise
them are in ``_rules.py``), the window output size, autocast policies, pair normalisation."""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from contextlib import contextmanager
from typing import Literal, Optional

import torch
from torch import Tensor

from .._torch_private import (
    DispatchKey,
    DispatchKeySet,
    ExcludeDispatchKeyGuard,
    disable_dynamo_lazily,
    dispatch_key_for_device,
    maybe_get_opdef,
)

# One Library object per namespace for the registrations that torch.library has no helper
# for (autocast kernels that read the autocast dtype at call time, device kernels without
# custom_op's wrappers, the autograd and functorch kernels of ``_transforms.register_jvp``);
# kept alive for the life of the process.
_LIBRARIES: dict[str, torch.library.Library] = {}

AutocastPolicy = Literal["lower_precision", "fp32"]

# qualname -> {device type: policy}, as each op declared it through register_autocast_policy;
# the registry's specs read it from here.
AUTOCAST_POLICIES: dict[str, dict[str, AutocastPolicy]] = {}

# Direct calls. Each layer of Python kernels an eager call crosses (autocast, autograd, the
# device's kernel) costs a crossing from the dispatcher into Python, about 9 us on a 2-core
# EPYC for involution's schema (its int lists boxed), more than the device kernel's own host
# path. Where a layer's next stop is a kernel oplib registered in Python and nothing stands
# between (no mode, subclass, functionalization or tracer: their keys sort higher), the layer
# calls that kernel itself, under the same dispatch guards, rather than going back through the
# dispatcher (``direct_kernel``, ``AUTOGRAD_KERNELS``). ``DIRECT_CALLS = False`` turns it off
# (bench/host_launch.py times both).
DIRECT_CALLS = True
# (qualname, dispatch key) -> (the kernel ``register_device_kernel`` registered there, its
# device type, custom_op's own kernel for that device type then: ``direct_kernel``).
DIRECT_KERNELS: dict[tuple[str, DispatchKey], tuple[Callable, str, object]] = {}
# qualname -> the op's Autograd kernel (``_transforms.register_jvp``), ``kernel(keyset, *args)``.
AUTOGRAD_KERNELS: dict[str, Callable] = {}


def direct_kernel(qualname: str, keyset: DispatchKeySet, custom_op_kernels: Optional[dict] = None):
    """The kernel a redispatch of ``qualname`` with ``keyset`` would run, where
    ``register_device_kernel`` registered it and its key is the set's highest; else None. None
    too where ``custom_op_kernels`` (the op's ``CustomOpDef._backend_fns``) holds another kernel
    for the device than when oplib registered its own: a ``register_kernel``
    (``torch.library.register_kernel``) made since, which the dispatcher runs instead. (A kernel
    put over oplib's with ``Library.impl`` itself is not seen: ``DIRECT_CALLS = False`` sends
    every call through the dispatcher.)"""
    if not DIRECT_CALLS:
        return None
    entry = DIRECT_KERNELS.get((qualname, keyset.highestPriorityTypeId()))
    if entry is None or (custom_op_kernels or {}).get(entry[1]) is not entry[2]:
        return None
    return entry[0]


# Error messages are templates, formatted by the rules (``_rules.py``) and, with the values a test expects,
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


def window_output_size(size, kernel, stride, padding, dilation) -> tuple:
    """(Ho, Wo) of a sliding window (conv, involution) over ``size`` = (H, W), every parameter
    a (height, width) pair; the same formula as torch's."""
    return tuple((size[a] + 2 * padding[a] - dilation[a] * (kernel[a] - 1) - 1) // stride[a] + 1 for a in (0, 1))


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
    # (a tensor already in ``dtype`` is returned as it is, as ``to`` would, without its call)
    if (
        isinstance(value, Tensor)
        and value.dtype != dtype
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
    autocast_key = getattr(DispatchKey, key)
    autograd_key = getattr(DispatchKey, "Autograd" + dispatch_key_for_device(device_type))
    excluded = DispatchKeySet(autocast_key)
    namespace, name = qualname.split("::")
    op = getattr(getattr(torch.ops, namespace), name).default

    def kernel(keyset, *args):
        dtype = torch.get_autocast_dtype(device_type) if policy == "lower_precision" else torch.float32
        with ExcludeDispatchKeyGuard(excluded):
            cast = [_autocast_cast(a, device_type, dtype) for a in args]
            below = keyset.remove(autocast_key)
            # (a direct call: see DIRECT_CALLS; the op's next stop is its autograd kernel)
            autograd = AUTOGRAD_KERNELS.get(qualname) if DIRECT_CALLS else None
            if autograd is not None and below.highestPriorityTypeId() == autograd_key:
                return autograd(below, *cast)
            return op(*cast)

    namespace_library(namespace).impl(name, kernel, key, with_keyset=True)
    AUTOCAST_POLICIES.setdefault(qualname, {})[device_type] = policy


def namespace_library(namespace: str) -> torch.library.Library:
    """The process's one FRAGMENT library of ``namespace`` (``_LIBRARIES``)."""
    if namespace not in _LIBRARIES:
        _LIBRARIES[namespace] = torch.library.Library(namespace, "FRAGMENT")
    return _LIBRARIES[namespace]


@contextmanager
def overriding_kernels():
    """Registrations that replace a kernel on purpose (the Autograd kernels ``register_jvp``
    puts over custom_op's, a device kernel over an earlier one), without torch's warning that
    a kernel is overridden."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r"(?s).*Overriding a previously registered kernel")
        yield


def register_device_kernel(qualname: str, device_type: str, kernel) -> None:
    """``kernel`` as the op's kernel for ``device_type``, registered with ``Library.impl``
    rather than custom_op's ``register_kernel``, whose per-call wrappers (the check that the
    result aliases no input, a dynamo-disable wrapper and a lookup of disabled kernels) cost
    about 4 us a call; ``torch.compiler.disable`` keeps dynamo out of the kernel's Python, which
    it would otherwise try to trace where an eager call runs inside a compiled function (torch's
    lazy form of it: ``torch.compiler.disable`` would import dynamo with oplib). For kernels
    that return a fresh tensor (never an input or a view of one). Replaces a kernel registered
    for the device before (bench/host_launch.py puts the CUDA kernels over the CPU ones)."""
    namespace, name = qualname.split("::")
    key = dispatch_key_for_device(device_type)
    wrapped = disable_dynamo_lazily(kernel)
    with overriding_kernels():
        namespace_library(namespace).impl(name, wrapped, key, allow_override=True)
    opdef = maybe_get_opdef(qualname)
    custom_op_kernel = None if opdef is None else opdef._backend_fns.get(device_type)
    DIRECT_KERNELS[(qualname, getattr(DispatchKey, key))] = (wrapped, device_type, custom_op_kernel)
