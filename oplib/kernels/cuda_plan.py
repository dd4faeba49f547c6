"""Launch plans: a CUDA op's host path done once per call signature.

An op's CUDA kernel enforces its rules, allocates its result in the fake's layout and hands
both to its backend's writer, which reads the launch policy (which kernel, which layout,
channels per thread, 32- or 64-bit offsets) and launches. For a given call signature (each
tensor's shape, strides, dtype, device and pointer alignment; each int and int list) every
one of those decisions comes out the same. ``LaunchPlans`` therefore runs the whole path
once per signature through a recorder, and when the writer's only effects were launches on
the op's own tensors and its result, keeps them as a ``LaunchPlan``: a repeated call is then
one dictionary lookup, one allocation and the prepared launches with the new pointers.

A writer that copies an operand, launches into a temporary or touches a tensor through
torch (``out.copy_``, a zero fill) is not planned: the recorder sees a tensor that is neither
an argument nor the result, or a version counter that moved, and that signature takes the
whole path every time. A plan never changes what a call computes, only how much Python runs
before the same launches.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, NamedTuple, Optional

import torch
from torch import Tensor

from .cuda_launch import LaunchConfig, Launcher
from .cuda_source import KernelArg, KernelSource

# The alignment a launch policy may look at (a 16-byte vector): pointers that agree modulo
# this take the same kernels.
ALIGNMENT = 16
# Signatures remembered per op; past this the cache starts over (a model has a few dozen).
MAX_PLANS = 1024

_MISS = object()


def plan_key(args: Sequence[Any]) -> Optional[tuple]:
    """What a launch decision may read of ``args``: per plain tensor its shape, strides, dtype,
    device and pointer alignment; ints, floats, int lists and None as they are; None (never
    planned) for anything else, a tensor subclass included."""
    key = []
    for arg in args:
        kind = type(arg)
        if kind is Tensor:
            key.append((arg.shape, arg.stride(), arg.dtype, arg.device, arg.data_ptr() % ALIGNMENT))
        elif kind is list or kind is tuple:
            key.append(tuple(arg))
        elif arg is None or kind is int or kind is float or kind is bool:
            key.append(arg)
        else:
            return None
    return tuple(key)


class _Operand(NamedTuple):
    """A kernel argument that is the op's argument ``index`` (a tensor), or its result (-1)."""

    index: int


_RESULT = _Operand(-1)
PreparedLaunch = Callable[[Sequence[KernelArg]], None]


class LaunchPlan(NamedTuple):
    """The result's layout and the launches one call signature makes."""

    shape: tuple[int, ...]
    stride: tuple[int, ...]
    dtype: torch.dtype
    device: torch.device
    launches: tuple[tuple[PreparedLaunch, tuple], ...]  # (prepared launch, its arguments: values or _Operand)

    def run(self, args: Sequence[Any]) -> Tensor:
        out = torch.empty_strided(self.shape, self.stride, dtype=self.dtype, device=self.device)
        for launch, slots in self.launches:
            launch([(out if slot.index < 0 else args[slot.index]) if type(slot) is _Operand else slot
                    for slot in slots])
        return out


def prepare(launcher: Launcher, source: KernelSource, kernel: str, dtype: torch.dtype, config: LaunchConfig,
            specialisation: tuple[str, ...], device: int) -> PreparedLaunch:
    """One launch with everything but its argument values decided: the launcher's own
    ``prepare`` where it has one (CuPy's: the kernel handle looked up once), else its ``launch``."""
    own = getattr(launcher, "prepare", None)
    if own is not None:
        return own(source, kernel, dtype, config, specialisation, device)
    return lambda values: launcher.launch(source, kernel, dtype, config, values, specialisation)


class LaunchRecorder:
    """A launcher that forwards every launch to ``launcher`` and keeps it in ``launches``
    ((source, kernel, dtype, config, args, specialisation) tuples)."""

    def __init__(self, launcher: Launcher):
        self.launcher = launcher
        self.launches: list[tuple] = []

    def launch(self, source, kernel, dtype, config, args, specialisation=()) -> None:
        self.launcher.launch(source, kernel, dtype, config, args, specialisation)
        self.launches.append((source, kernel, dtype, config, tuple(args), specialisation))

    @property
    def occupancy(self):
        """The wrapped launcher's ``occupancy`` (None where it has none), so that a call planned
        through the recorder chooses its launch as an unplanned one does."""
        return getattr(self.launcher, "occupancy", None)

    @property
    def local_bytes(self):
        """The wrapped launcher's ``local_bytes`` (None where it has none), as ``occupancy``."""
        return getattr(self.launcher, "local_bytes", None)


class LaunchPlans:
    """An op's CUDA kernel ``(*args) -> result`` with a plan per call signature.

    ``enforce(*args)`` raises on invalid arguments, ``result(*args)`` allocates the result in the
    fake's layout, ``writer(*args, out, launcher)`` launches the kernels that write it;
    ``launcher()`` gives the launcher (CuPy's, created at the first call so that a missing CuPy
    is reported then). A plan's signature covers everything the rules read, so a planned call
    skips them too.
    """

    def __init__(self, enforce: Callable[..., None], result: Callable[..., Tensor], writer: Callable[..., Tensor],
                 launcher: Callable[[], Launcher]):
        self.enforce, self.result, self.writer = enforce, result, writer
        self._launcher_factory = launcher
        self._launcher: Optional[Launcher] = None
        self.plans: dict[tuple, Optional[LaunchPlan]] = {}

    def __call__(self, *args) -> Tensor:
        key = plan_key(args)
        plan = self.plans.get(key, _MISS) if key is not None else None
        if plan is not _MISS and plan is not None:
            return plan.run(args)
        launcher = self._launcher or self._make_launcher()
        self.enforce(*args)
        out = self.result(*args)
        if plan is None:  # not plannable: the whole path, every call
            return self.writer(*args, out, launcher)
        recorder = LaunchRecorder(launcher)
        versions = [a._version for a in args if type(a) is Tensor]
        version = out._version
        written = self.writer(*args, out, recorder)
        unchanged = out._version == version and versions == [a._version for a in args if type(a) is Tensor]
        if len(self.plans) >= MAX_PLANS:
            self.plans.clear()
        self.plans[key] = self._plan(args, out, recorder.launches) if written is out and unchanged else None
        return written

    def _make_launcher(self) -> Launcher:
        self._launcher = self._launcher_factory()
        return self._launcher

    def _plan(self, args: tuple, out: Tensor, launches: list[tuple]) -> Optional[LaunchPlan]:
        """The plan of one recorded call, or None where a launch read or wrote a tensor that is
        neither an argument nor the result (a copy, a temporary)."""
        by_identity = {id(a): i for i, a in enumerate(args) if type(a) is Tensor}
        by_identity[id(out)] = -1
        planned = []
        for source, kernel, dtype, config, kernel_args, specialisation in launches:
            slots = []
            for arg in kernel_args:
                if isinstance(arg, Tensor):
                    index = by_identity.get(id(arg))
                    if index is None:
                        return None
                    slots.append(_Operand(index))
                else:
                    slots.append(arg)
            launch = prepare(self._launcher, source, kernel, dtype, config, specialisation, out.device.index)
            planned.append((launch, tuple(slots)))
        return LaunchPlan(tuple(out.shape), out.stride(), out.dtype, out.device, tuple(planned))
