"""An op's argument rules, stated once, enforced the same way in eager mode and while tracing.

A ``Rule`` is a condition over the op's arguments and the message (and error type) of its
failure. ``Rules.enforce`` evaluates the conditions in order: with real tensors every
condition is a plain bool, so a passing call costs one call and one identity test per rule
(no message closure, no ``torch._check``), and the first failing rule raises its error; while
tracing, a condition on symbolic sizes is a SymBool, handed to ``torch._check`` (or
``torch._check_value``), which records it as a guard instead of specialising the size. Rules
after a failing one are never evaluated, so a later rule may index what an earlier one
checked (the dims before the shape).

Conditions combine comparisons with ``&``, never ``and`` or tuple equality: ``and`` would
ask a SymBool for its truth value, which specialises the size.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, NamedTuple, Optional

import torch

from ..kernels.cuda_launch import cupy_launcher
from ..kernels.cuda_plan import LaunchPlans
from ._common import (
    BIAS_SIZE,
    DIM,
    FLOATING_DTYPE,
    PAIR_LENGTH,
    PAIR_RANGE,
    SAME_DEVICE,
    SAME_DTYPE,
    WINDOW_FITS,
    register_device_kernel,
)

# qualname -> ``Rules.satisfied`` of the op's rules: whether a call's arguments pass, without
# raising. The registry's tests hold each to its op's errors: True on every sample input, False
# on every error input.
ARGUMENT_PREDICATES: dict[str, Callable[..., bool]] = {}


class Rule(NamedTuple):
    holds: Callable[..., Any]  # (*op args) -> bool, or a SymBool while tracing
    message: Callable[..., str]  # (*op args) -> the error's message, formatted only on failure
    error: type[Exception] = RuntimeError  # ValueError for a bad non-tensor argument


class Rules:
    """The rules of the op ``qualname``, in the order they are checked; registered as its
    argument predicate (``satisfied``), which the registry's tests hold to ``enforce``."""

    def __init__(self, qualname: str, rules: Iterable[Rule]):
        self.qualname = qualname
        self.rules = tuple(rules)
        # Signatures (see _signature) of eager calls that passed every rule: the rules read
        # nothing else, so a call with the same signature passes too, and skips the one lambda
        # call per rule that otherwise costs about 10 us per call.
        self._passed: set = set()
        ARGUMENT_PREDICATES[qualname] = self.satisfied

    def enforce(self, *args) -> None:
        """Raise the first failing rule's error (eager), or record the symbolic conditions."""
        key = _signature(args)
        if key is not None and key in self._passed:
            return
        self._enforce(args)
        if key is not None:
            if len(self._passed) >= _MAX_SIGNATURES:
                self._passed.clear()
            self._passed.add(key)

    def _enforce(self, args: tuple) -> None:
        for rule in self.rules:
            holds = rule.holds(*args)
            if holds is True:
                continue
            if holds is False:
                raise rule.error(rule.message(*args))
            check = torch._check_value if rule.error is ValueError else torch._check
            check(holds, lambda rule=rule: rule.message(*args))

    def satisfied(self, *args) -> bool:
        """Whether every rule holds (real tensors: the conditions are plain bools)."""
        for rule in self.rules:
            if rule.holds(*args) is not True:
                return False
        return True


_MAX_SIGNATURES = 1024


def _signature(args: tuple):
    """What the rules can read of ``args``: each plain tensor's shape, dtype and device, each
    int or list of ints, None; or None (never remembered) where an argument is anything else,
    a tensor subclass (the fake tensors of tracing, whose sizes may be symbolic) included."""
    key = []
    for arg in args:
        if type(arg) is torch.Tensor:
            key.append((arg.shape, arg.dtype, arg.device))
        elif type(arg) is list or type(arg) is tuple:
            if not all(type(v) is int for v in arg):
                return None
            key.append(tuple(arg))
        elif arg is None or type(arg) is int:
            key.append(arg)
        else:
            return None
    return tuple(key)


def tensor_rules(op: str, *operands: tuple) -> list[Rule]:
    """(argument index, name, dims, layout[, optional]) of each tensor operand: each has its dims
    (an int, a collection of ints, or None where the op states the operand's size by a rule of
    its own), the first a floating dtype, the others the first's dtype and device; an optional
    operand may be None."""
    rules = []
    for index, name, dims, layout, *optional in operands:
        if dims is None:
            continue
        allowed = (dims,) if isinstance(dims, int) else tuple(dims)
        rules.append(Rule(
            lambda *a, i=index, d=allowed, o=bool(optional): (o and a[i] is None) or a[i].dim() in d,
            lambda *a, i=index, n=name, layout=layout: DIM.format(op=op, name=n, layout=layout, dim=a[i].dim(),
                                                                   size=list(a[i].shape)),
        ))
    first, first_name = operands[0][0], operands[0][1]
    rules.append(Rule(
        lambda *a: a[first].is_floating_point(),
        lambda *a: FLOATING_DTYPE.format(op=op, name=first_name, dtype=a[first].dtype),
    ))
    for index, name, *_ in operands[1:]:
        rules.append(Rule(
            lambda *a, i=index: a[i] is None or a[i].dtype == a[first].dtype,
            lambda *a, i=index, n=name: SAME_DTYPE.format(op=op, name=n, reference_name=first_name, dtype=a[i].dtype,
                                                          reference_dtype=a[first].dtype),
        ))
        rules.append(Rule(
            lambda *a, i=index: a[i] is None or a[i].device == a[first].device,
            lambda *a, i=index, n=name: SAME_DEVICE.format(op=op, name=n, reference_name=first_name,
                                                           device=a[i].device, reference_device=a[first].device),
        ))
    return rules


def bias_rule(op: str, dim_name: str) -> Rule:
    """Argument 2, the bias, is None or 1-D with one value per row of argument 1, the weight
    (``dim_name``: what those rows are, e.g. out_channels)."""
    return Rule(
        lambda x, w, b, *_: b is None or ((b.dim() == 1) and (b.shape[0] == w.shape[0])),
        lambda x, w, b, *_: BIAS_SIZE.format(op=op, size=w.shape[0], dim_name=dim_name, bias_size=list(b.shape)),
    )


def window_rules(op: str, at: int) -> list[Rule]:
    """Arguments ``at``, ``at + 1`` and ``at + 2`` (stride, padding, dilation) are pairs, stride and
    dilation positive, padding non-negative (ValueError, as torch's conv2d)."""
    rules = []
    for offset, name, lowest in ((0, "stride", 1), (1, "padding", 0), (2, "dilation", 1)):
        i = at + offset
        rules.append(Rule(
            lambda *a, i=i: len(a[i]) == 2,
            lambda *a, i=i, n=name: PAIR_LENGTH.format(op=op, name=n, values=list(a[i])),
            ValueError,
        ))
        rules.append(Rule(
            lambda *a, i=i, low=lowest: (a[i][0] >= low) & (a[i][1] >= low),
            lambda *a, i=i, n=name, low=lowest: PAIR_RANGE.format(op=op, name=n, bound="positive" if low else "non-negative",
                                                                  values=list(a[i])),
            ValueError,
        ))
    return rules


def window_fits_rules(op: str, size: Callable, kernel: Callable, padding: Callable, dilation: Callable) -> list[Rule]:
    """The padded input holds the dilated kernel along height and width; each argument maps the
    op's arguments to that (H, W) pair."""
    rules = []
    for axis, name in enumerate(("height", "width")):
        def extent(*a, axis=axis):
            return dilation(*a)[axis] * (kernel(*a)[axis] - 1) + 1

        rules.append(Rule(
            lambda *a, axis=axis, extent=extent: size(*a)[axis] + 2 * padding(*a)[axis] >= extent(*a),
            lambda *a, axis=axis, name=name, extent=extent: WINDOW_FITS.format(
                op=op, axis=name, size=size(*a)[axis], padding=padding(*a)[axis], extent=extent(*a)),
        ))
    return rules


class Contract(NamedTuple):
    """What an op promises on every device: its rules, and its result (uninitialised, in the
    layout the fake returns, ``result(*args)``), which each device's backend writes
    (``writers``: device type -> ``writer(*args, out)``). ``cuda_candidates``: other writers of
    the CUDA result, by name, which tuning times beside the writer
    (``oplib.kernels.cuda_plan``)."""

    rules: Rules
    result: Callable[..., Any]
    writers: dict[str, Callable[..., Any]]
    cuda_candidates: Optional[dict[str, Callable[..., Any]]] = None

    def run(self, device: str, *args):
        """The op's kernel on ``device``: the rules, the result allocated, the backend's writer."""
        self.rules.enforce(*args)
        return self.writers[device](*args, self.result(*args))

    def fake(self, *args):
        self.rules.enforce(*args)
        return self.result(*args)


# qualname -> its Contract, for every op defined by one (bench/dense.py times the writers bare).
CONTRACTS: dict[str, Contract] = {}
# qualname -> the CUDA kernel registered for it (its launch plans can be looked at).
CUDA_KERNELS: dict[str, LaunchPlans] = {}


def register_contract(op, contract: Contract) -> None:
    """``op``'s fake, and its CUDA kernel where ``contract.writers`` has one: a ``LaunchPlans``
    over the rules, the result and the writer, so that a repeated call signature skips straight
    to its launches (``oplib.kernels.cuda_plan``), registered without custom_op's per-call
    wrappers (``register_device_kernel``). The CPU kernel is the function ``op`` was defined
    with, which calls ``contract.run``, as custom_op registered it (so that custom_op's
    ``register_kernel("cpu")`` still replaces it)."""
    if not set(contract.writers) <= {"cpu", "cuda"}:
        raise ValueError(f"{op._qualname}: writers for {sorted(contract.writers)}; oplib's ops run on CPU and CUDA")
    CONTRACTS[op._qualname] = contract
    op.register_fake(contract.fake)
    if "cuda" in contract.writers:
        CUDA_KERNELS[op._qualname] = cuda_kernel(contract)
        register_device_kernel(op._qualname, "cuda", CUDA_KERNELS[op._qualname])


def cuda_kernel(contract: Contract, launcher: Callable[[], Any] = cupy_launcher) -> LaunchPlans:
    """The op's CUDA kernel: ``contract`` with a plan per call signature, launching through
    ``launcher()`` (CuPy's; the host-time benchmark passes a launcher that only records)."""
    return LaunchPlans(contract.rules.enforce, contract.result, contract.writers["cuda"], launcher,
                       contract.cuda_candidates)
