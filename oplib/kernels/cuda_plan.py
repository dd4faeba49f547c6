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

Tuning (off unless ``set_cuda_tuning(True)`` or ``OPLIB_CUDA_TUNING=1``; torch's
``cudnn.benchmark`` for oplib's kernels): an op may name other writers of the same result
(``candidates``: a policy, a kernel the op does not take by default), each proven as the op's
own but waiting for a GPU to choose among them. With tuning on, the first call of a signature
runs every candidate once through a recorder, drops those that decline the call or make the
same launches as another, times the rest on the GPU (the launcher's ``time_calls``: device
time between CUDA events) and keeps the fastest, planned where its launches allow, else as the
writer that signature's calls take; the tuned plans apart from the untuned ones, so that
switching tuning re-times nothing. Every candidate is a correct writer, so tuning changes
which kernels run and how fast, never what is computed beyond their rounding; like cuDNN's
benchmark mode, which one wins may differ between runs.
"""

from __future__ import annotations

import contextlib
import os
import warnings
from collections.abc import Callable, Iterator, Sequence
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

# A candidate replaces the op's own choice only where it takes less than this share of its
# time: a near tie, which the timing's noise could decide either way from run to run, keeps the
# op's choice.
TUNING_MARGIN = 0.97
# Whether calls take the tuned plans (a new call signature timing its op's candidate writers
# and keeping the fastest) or the untuned ones (``set_cuda_tuning``); read at each call.
_TUNING = os.environ.get("OPLIB_CUDA_TUNING", "") == "1"


def set_cuda_tuning(enabled: bool) -> bool:
    """Turn kernel tuning on or off, and return whether it was on.

    With it on, the first CUDA call of each call signature (shapes, strides, dtypes, device,
    alignment, the int arguments) of an op with candidate kernels times them on the GPU and
    keeps the fastest for that signature; its later calls run it at once. As with
    ``torch.backends.cudnn.benchmark``, those first calls are slower, and which kernel wins may
    differ between runs and GPUs (every candidate meets the op's float64 reference). The plans
    made with tuning on and with it off are kept apart, so switching back and forth times
    nothing again. ``OPLIB_CUDA_TUNING=1`` turns it on at import::

        oplib.kernels.set_cuda_tuning(True)
        model(images)  # each new signature tuned, then replayed
    """
    global _TUNING
    was, _TUNING = _TUNING, bool(enabled)
    return was


def cuda_tuning_enabled() -> bool:
    """Whether kernel tuning is on (``set_cuda_tuning``)."""
    return _TUNING


@contextlib.contextmanager
def cuda_tuning(enabled: bool = True) -> Iterator[None]:
    """Kernel tuning ``enabled`` inside the block (``set_cuda_tuning``), as it was after it."""
    was = set_cuda_tuning(enabled)
    try:
        yield
    finally:
        set_cuda_tuning(was)


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


class Tuned(NamedTuple):
    """What tuning found for one call signature: each timed candidate's device time per call
    in seconds (by name, in the candidates' order), the chosen one's name, and the candidates
    that declined the call, failed, or made the launches of one named before them."""

    seconds: dict[str, float]
    chosen: str
    skipped: tuple[str, ...]


class LaunchPlans:
    """An op's CUDA kernel ``(*args) -> result`` with a plan per call signature.

    ``enforce(*args)`` raises on invalid arguments, ``result(*args)`` allocates the result in the
    fake's layout, ``writer(*args, out, launcher)`` launches the kernels that write it;
    ``launcher()`` gives the launcher (CuPy's, created at the first call so that a missing CuPy
    is reported then). A plan's signature covers everything the rules read, so a planned call
    skips them too. ``candidates``: name -> another writer of the result, ``(*args, out,
    launcher) -> out``, or None where it declines the call, which tuning times beside ``writer``
    (see the module docstring). A result that is not one tensor (a tuple) is never planned.
    """

    def __init__(self, enforce: Callable[..., None], result: Callable[..., Tensor], writer: Callable[..., Tensor],
                 launcher: Callable[[], Launcher], candidates: Optional[dict[str, Callable[..., Any]]] = None):
        self.enforce, self.result, self.writer = enforce, result, writer
        self.candidates = dict(candidates or {})
        self._launcher_factory = launcher
        self._launcher: Optional[Launcher] = None
        self.plans: dict[tuple, Optional[LaunchPlan]] = {}
        # With tuning on: the plans of the writers tuning kept, and the writers it kept that
        # cannot be planned (their signatures' plan None), which their calls take every time.
        self.tuned_plans: dict[tuple, Optional[LaunchPlan]] = {}
        self.writers: dict[tuple, Callable[..., Any]] = {}
        self.tuned: dict[tuple, Tuned] = {}

    def clear(self) -> None:
        """Forget every signature's plans and tuning."""
        self.plans.clear()
        self.tuned_plans.clear()
        self.writers.clear()
        self.tuned.clear()

    def __call__(self, *args) -> Tensor:
        key = plan_key(args)
        tuning = _TUNING and bool(self.candidates)
        plans = self.tuned_plans if tuning else self.plans
        plan = plans.get(key, _MISS) if key is not None else None
        if plan is not _MISS and plan is not None:
            return plan.run(args)
        launcher = self._launcher or self._make_launcher()
        self.enforce(*args)
        if plan is None:  # not plannable: the whole path, every call
            writer = self.writers.get(key, self.writer) if tuning else self.writer
            return writer(*args, self.result(*args), launcher)
        if len(plans) >= MAX_PLANS:
            self.clear()
        if tuning and getattr(launcher, "time_calls", None) is not None:
            if _capturing(args):  # what a capture launches is not run: nothing to time, nothing kept
                return self.writer(*args, self.result(*args), launcher)
            return self._tune(key, args, launcher)
        out = self.result(*args)
        recorder = LaunchRecorder(launcher)
        written, plannable = self._record(self.writer, args, out, recorder)
        plans[key] = self._plan(args, out, recorder.launches) if plannable else None
        return written

    @staticmethod
    def _record(writer: Callable[..., Any], args: tuple, out, recorder: LaunchRecorder) -> tuple[Any, bool]:
        """``writer``'s call into ``out`` through ``recorder``: what it returned, and whether its
        launches could be a plan (it wrote ``out`` itself, one tensor, and moved no version)."""
        versions = [a._version for a in args if type(a) is Tensor]
        version = out._version if type(out) is Tensor else None
        written = writer(*args, out, recorder)
        plannable = (type(out) is Tensor and written is out and out._version == version
                     and versions == [a._version for a in args if type(a) is Tensor])
        return written, plannable

    def _tune(self, key: tuple, args: tuple, launcher: Launcher) -> Optional[Any]:
        """The first call of ``key`` with tuning on: every writer once (the op's own first), the
        ones that declined, failed (a warning) or repeated another's launches dropped, the rest
        timed by ``launcher.time_calls`` and the fastest kept for ``key``; its result, by one
        more call of it. Where the launcher could not time them, nothing is kept and the result
        is the op's choice's."""
        runs, skipped, seen = [], [], set()
        kept = {}  # name -> (writer, plan), in the order of ``runs``
        for name, writer in (("the op's choice", self.writer), *self.candidates.items()):
            out = self.result(*args)
            recorder = LaunchRecorder(launcher)
            try:
                written, plannable = self._record(writer, args, out, recorder)
            except Exception as error:
                if not kept:  # the op's own choice: its error is the call's
                    raise
                # A candidate is a correct writer wherever it does not decline; one that fails
                # instead is a bug to report, not a reason to fail the user's call.
                warnings.warn(f"oplib's kernel tuning: the candidate {name!r} failed and was skipped "
                              f"({type(error).__name__}: {error})", RuntimeWarning, stacklevel=2)
                skipped.append(name)
                continue
            launches = tuple((source.sha256, kernel, dtype, config, specialisation,
                              tuple(None if isinstance(a, Tensor) else a for a in kernel_args))
                             for source, kernel, dtype, config, kernel_args, specialisation in recorder.launches)
            if written is None or (launches and launches in seen):
                skipped.append(name)
                continue
            seen.add(launches)
            plan = self._plan(args, out, recorder.launches) if plannable else None
            kept[name] = (writer, plan)
            del out, written  # one candidate's result alive at a time
            runs.append((lambda plan=plan: plan.run(args)) if plan is not None
                        else (lambda writer=writer: writer(*args, self.result(*args), launcher)))
        names = list(kept)
        seconds = launcher.time_calls(runs, self._device(args)) if len(runs) > 1 else [0.0]
        if seconds is None:
            return runs[0]()
        fastest = min(range(1, len(names)), key=lambda i: seconds[i], default=0)
        chosen = fastest if seconds[fastest] < TUNING_MARGIN * seconds[0] else 0
        writer, plan = kept[names[chosen]]
        self.tuned_plans[key] = plan
        if plan is None:
            self.writers[key] = writer
        self.tuned[key] = Tuned(dict(zip(names, seconds)), names[chosen], tuple(skipped))
        return runs[chosen]()

    @staticmethod
    def _device(args: tuple) -> Optional[int]:
        return next((a.device.index for a in args if type(a) is Tensor), None)

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


def _capturing(args: tuple) -> bool:
    """Whether the call's CUDA device's current stream is capturing a CUDA graph."""
    device = next((a.device for a in args if type(a) is Tensor), None)
    return device is not None and device.type == "cuda" and torch.cuda.is_current_stream_capturing()
