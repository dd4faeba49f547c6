#!/usr/bin/env python
"""Benchmark oplib's dense ops against torch on CPU, float32, in one run.

1. ``oplib.conv2d`` vs ``F.conv2d``, forward+backward, at ResNet-50 stage shapes (batch 8).
2. ``oplib.linear`` vs ``F.linear``, forward+backward (ResNet-50 fc, a ViT-B MLP layer).
4. Per-call eager overhead on tiny tensors: oplib op vs plain torch op vs a
   ``torch.autograd.Function`` made of the op's own registered setup_context and backward,
   with and without ``requires_grad``.
5. oplib's own cost over custom_op's: every registry op on its first sample input vs a bare
   ``torch.library.custom_op`` of the same schema that runs the same kernel with the same
   ``register_autograd`` backward and no argument checks (custom_op's floor).

(Section 3, the conv2d backward route, is settled: see ``_conv2d_backward`` in
oplib/ops/conv2d.py.)

Candidates are timed with ``torch.utils.benchmark.Timer.blocked_autorange`` in
interleaved rounds (the order rotates every round). A time is the median of the
candidate's per-round medians; a ratio is the median of the per-round ratios, each
taken between measurements made seconds apart, so that a change in the machine's load
(other processes stealing a core stall every OpenMP region) cancels out.
The results are printed and written as markdown (``bench/results/dense.md``). The
script exits with status 1 if an oplib/torch forward+backward ratio of section 1 or 2
exceeds ``--max-ratio``, or an oplib/bare ratio of section 5 exceeds ``--max-floor-ratio``.

Usage (from the repo root)::

    python bench/dense.py                          # full run, about 6 minutes
    python bench/dense.py --quick --max-ratio inf  # smoke test (< 30 s), no ratio gate

Timings are only meaningful on an otherwise idle machine: each section reports how many
cores other processes kept busy while it ran, and warns when that was too many.
"""

from __future__ import annotations

import argparse
import datetime
import functools
import os
import platform
import resource
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from statistics import median
from typing import Any, Generic, Optional, TypeVar

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.utils.benchmark import Compare, Measurement, Timer

import oplib
from machine import cpu_model
from oplib import registry

_RESULTS_DIR = Path(__file__).resolve().parent / "results"
_BATCH = 8
# Other processes keeping more than this many cores busy on average make a section's
# timings unreliable when every core runs a torch thread.
_BUSY_CORES_WARNING = 0.1

# Timed statements. ``_FWD_BWD`` drops the gradients after each step (as
# ``zero_grad(set_to_none=True)`` does), so no step pays for accumulating into the last.
_CALL = "fn(*args)"
_FWD_BWD = "fn(*args).backward(grad)\nfor leaf in leaves:\n    leaf.grad = None"


@dataclass(frozen=True)
class _Settings:
    """How long and on how many threads to time."""

    threads: int
    rounds: int
    min_run_time: float  # seconds per candidate per round, sections 1, 2 and 5b
    tiny_min_run_time: float  # seconds per candidate per round, section 4
    quick: bool


@dataclass(frozen=True)
class _ConvShape:
    """A stride-1 'same' convolution of a ResNet-50 stage: (N, C, S, S) -> (N, O, S, S)."""

    stage: int
    in_channels: int
    out_channels: int
    size: int
    kernel: int

    @property
    def padding(self) -> int:
        return self.kernel // 2

    @property
    def name(self) -> str:
        return (
            f"stage {self.stage} {self.kernel}x{self.kernel} "
            f"{self.in_channels}->{self.out_channels} @{self.size}x{self.size}"
        )


@dataclass(frozen=True)
class _LinearShape:
    """(M, in) -> (M, out)."""

    what: str
    rows: int
    in_features: int
    out_features: int

    @property
    def name(self) -> str:
        return f"{self.what} ({self.rows}, {self.in_features}) -> {self.out_features}"


_CONV_SHAPES = (
    _ConvShape(1, 64, 64, 56, 3),
    _ConvShape(2, 128, 128, 28, 3),
    _ConvShape(3, 256, 256, 14, 3),
    _ConvShape(4, 512, 512, 7, 3),
    _ConvShape(1, 256, 64, 56, 1),
    _ConvShape(2, 512, 128, 28, 1),
    _ConvShape(3, 1024, 256, 14, 1),
    _ConvShape(4, 2048, 512, 7, 1),
)
_QUICK_CONV_SHAPES = (_ConvShape(4, 512, 512, 7, 3), _ConvShape(4, 2048, 512, 7, 1))

_LINEAR_SHAPES = (
    _LinearShape("ResNet-50 fc", _BATCH, 2048, 1000),
    _LinearShape("ViT-B MLP up", _BATCH * 196, 768, 3072),
)
_QUICK_LINEAR_SHAPES = _LINEAR_SHAPES[:1]


@dataclass
class _Result:
    """One candidate's timings: every round merged (for Compare), and each round's median
    (seconds)."""

    measurement: Measurement
    round_medians: list[float]

    @property
    def median(self) -> float:
        return median(self.round_medians)


@dataclass
class _Row:
    """One shape of a head-to-head: ``candidate`` timed against ``baseline``."""

    name: str
    baseline: _Result
    candidate: _Result

    @property
    def round_ratios(self) -> list[float]:
        """candidate/baseline of each round's medians."""
        return [c / b for c, b in zip(self.candidate.round_medians, self.baseline.round_medians, strict=True)]

    @property
    def ratio(self) -> float:
        return median(self.round_ratios)


@dataclass
class _OverheadRow:
    """One tiny op in one grad mode: a result per implementation."""

    op: str
    requires_grad: bool
    results: dict[str, _Result]


@dataclass(frozen=True)
class _CpuSnapshot:
    """CPU seconds used so far by the whole machine (None without /proc/stat) and by this
    process, and a wall-clock reading."""

    machine: Optional[float]
    process: float
    wall: float

    @staticmethod
    def take() -> _CpuSnapshot:
        """Read the counters now."""
        try:
            with open("/proc/stat") as f:
                ticks = [int(v) for v in f.readline().split()[1:9]]
            user, nice, system, _idle, _iowait, irq, softirq, steal = ticks
            machine: Optional[float] = (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")
        except (OSError, ValueError):
            machine = None
        usage = resource.getrusage(resource.RUSAGE_SELF)
        return _CpuSnapshot(machine, usage.ru_utime + usage.ru_stime, time.monotonic())

    def other_cores_since(self, start: _CpuSnapshot) -> Optional[float]:
        """How many cores other processes (and the hypervisor's steal) kept busy on
        average since ``start``."""
        if self.machine is None or start.machine is None:
            return None
        others = (self.machine - start.machine) - (self.process - start.process)
        return max(others, 0.0) / (self.wall - start.wall)


_RowT = TypeVar("_RowT")


@dataclass
class _Section(Generic[_RowT]):
    """A section's rows and how busy the rest of the machine was while it ran."""

    rows: list[_RowT]
    other_cores: Optional[float]


def _run_section(bench: Callable[[], list[_RowT]]) -> _Section[_RowT]:
    """Run one benchmark section, watching the rest of the machine meanwhile."""
    start = _CpuSnapshot.take()
    rows = bench()
    return _Section(rows, _CpuSnapshot.take().other_cores_since(start))


# ---------------------------------------------------------------------------------------
# Baselines made of the ops' own pieces, so that they follow any change to an op
# ---------------------------------------------------------------------------------------


def _opdef(spec: registry.OpSpec) -> Any:
    return torch._library.custom_ops._maybe_get_opdef(spec.qualname)


def _bare_kernel(spec: registry.OpSpec) -> Callable[..., Tensor]:
    """The kernel an op ends in, without oplib around it: the torch function it wraps, or for
    the involution ops (whose CPU kernels are private) the op's own registered CPU kernel."""
    return spec.torch_equivalent or _opdef(spec)._init_fn


def _autograd_function(spec: registry.OpSpec) -> Callable[..., Tensor]:
    """``apply`` of a ``torch.autograd.Function`` that runs the op's bare kernel, then the op's
    registered setup_context, and whose backward is the op's registered one: the op's math and
    backward without the custom-op machinery or oplib's argument checks. (A Function with a
    separate setup_context staticmethod would bind its arguments with ``inspect`` on every call;
    custom_op's own Function calls setup_context from forward, as this one does.)"""
    opdef = _opdef(spec)
    kernel, setup_context = _bare_kernel(spec), opdef._setup_context_fn

    def forward(ctx: Any, *args: Any) -> Tensor:
        output = kernel(*args)
        setup_context(ctx, args, output)
        return output

    methods = {"forward": staticmethod(forward), "backward": staticmethod(opdef._backward_fn)}
    return type(f"{spec.name}_function", (torch.autograd.Function,), methods).apply


@functools.cache
def _bare_custom_op(name: str) -> Callable[..., Tensor]:
    """A ``torch.library.custom_op`` with the op's schema whose kernel is the op's bare
    kernel (no argument checks, no layout normalisation) and whose autograd is the op's own
    ``register_autograd`` pair: the least any custom op with that math costs per call.
    Defined once per op (sections 5 and 5b share linear's)."""
    spec = registry.get(name)
    opdef = _opdef(spec)
    kernel = _bare_kernel(spec)
    schema = "(" + str(spec.op._schema).split("(", 1)[1]
    bare = torch.library.custom_op(f"oplib_bench::{name}", lambda *args: kernel(*args), mutates_args=(), schema=schema)
    bare.register_autograd(opdef._backward_fn, setup_context=opdef._setup_context_fn)
    return getattr(torch.ops.oplib_bench, name).default


# ---------------------------------------------------------------------------------------
# Timing helpers
# ---------------------------------------------------------------------------------------


def _timer(stmt: str, env: dict[str, Any], label: str, sub_label: str, description: str, threads: int) -> Timer:
    """A Timer on ``threads`` threads (Timer otherwise times on one thread)."""
    return Timer(
        stmt=stmt,
        globals=env,
        label=label,
        sub_label=sub_label,
        description=description,
        num_threads=threads,
    )


def _leaves(args: Sequence[Any]) -> list[Tensor]:
    """The arguments that receive gradients."""
    return [a for a in args if isinstance(a, Tensor) and a.requires_grad]


def _step_env(fn: Callable[..., Any], args: Sequence[Any], grad: Optional[Tensor]) -> dict[str, Any]:
    """Globals for ``_CALL`` (grad None) or ``_FWD_BWD``."""
    return {"fn": fn, "args": tuple(args), "grad": grad, "leaves": _leaves(args)}


def _measure(timers: Sequence[Timer], rounds: int, min_run_time: float) -> list[_Result]:
    """Time every timer ``rounds`` times, interleaved: round r starts with timer r mod n,
    so that neither order nor a change in load between rounds favours a candidate."""
    measured: list[list[Measurement]] = [[] for _ in timers]
    for r in range(rounds):
        for k in range(len(timers)):
            i = (r + k) % len(timers)
            measured[i].append(timers[i].blocked_autorange(min_run_time=min_run_time))
    return [_Result(Measurement.merge(ms)[0], [m.median for m in ms]) for ms in measured]


def _fwd_bwd_grads(fn: Callable[..., Tensor], args: Sequence[Any], grad: Tensor) -> list[Tensor]:
    """The output and the gradients of every leaf, from one forward+backward."""
    out = fn(*args)
    out.backward(grad)
    grads = [out.detach()]
    for leaf in _leaves(args):
        grads.append(leaf.grad)
        leaf.grad = None
    return grads


def _assert_same(expected: Sequence[Tensor], actual: Sequence[Tensor], what: str) -> None:
    """Sanity check that two candidates compute the same thing (loose: different reduction
    orders are fine, this is not an accuracy test)."""
    for e, a in zip(expected, actual, strict=True):
        torch.testing.assert_close(a, e, rtol=1e-4, atol=1e-3, msg=lambda m: f"{what}: {m}")


def _fwd_bwd_row(
    label: str,
    name: str,
    args: Sequence[Any],
    grad: Tensor,
    torch_fn: Callable[..., Tensor],
    oplib_fn: Callable[..., Tensor],
    settings: _Settings,
) -> _Row:
    """oplib vs torch forward+backward on the same tensors."""
    _assert_same(_fwd_bwd_grads(torch_fn, args, grad), _fwd_bwd_grads(oplib_fn, args, grad), f"{label}, {name}")
    timers = [
        _timer(_FWD_BWD, _step_env(fn, args, grad), label, name, description, settings.threads)
        for description, fn in (("torch", torch_fn), ("oplib", oplib_fn))
    ]
    baseline, candidate = _measure(timers, settings.rounds, settings.min_run_time)
    return _Row(name, baseline, candidate)


def _print_compare(results: Sequence[_Result]) -> None:
    """Print a section's measurements side by side, as torch.utils.benchmark lays them out."""
    Compare([r.measurement for r in results]).print()


# ---------------------------------------------------------------------------------------
# Sections
# ---------------------------------------------------------------------------------------


def _conv_tensors(shape: _ConvShape, requires_grad: bool) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """input, weight, bias and an output gradient for ``shape`` at batch ``_BATCH``."""
    c, o, s, k = shape.in_channels, shape.out_channels, shape.size, shape.kernel
    input = torch.randn(_BATCH, c, s, s, requires_grad=requires_grad)
    weight = torch.randn(o, c, k, k, requires_grad=requires_grad)
    bias = torch.randn(o, requires_grad=requires_grad)
    return input, weight, bias, torch.randn(_BATCH, o, s, s)


def _bench_conv2d(shapes: Sequence[_ConvShape], settings: _Settings) -> list[_Row]:
    """Section 1: oplib.conv2d vs F.conv2d, forward+backward."""
    rows = []
    for shape in shapes:
        input, weight, bias, grad = _conv_tensors(shape, requires_grad=True)
        args = (input, weight, bias, 1, shape.padding)
        rows.append(_fwd_bwd_row("conv2d fwd+bwd", shape.name, args, grad, F.conv2d, oplib.conv2d, settings))
    return rows


def _bench_linear(shapes: Sequence[_LinearShape], settings: _Settings) -> list[_Row]:
    """Section 2: oplib.linear vs F.linear, forward+backward."""
    rows = []
    for shape in shapes:
        input = torch.randn(shape.rows, shape.in_features, requires_grad=True)
        weight = torch.randn(shape.out_features, shape.in_features, requires_grad=True)
        bias = torch.randn(shape.out_features, requires_grad=True)
        grad = torch.randn(shape.rows, shape.out_features)
        rows.append(
            _fwd_bwd_row("linear fwd+bwd", shape.name, (input, weight, bias), grad, F.linear, oplib.linear, settings)
        )
    return rows


def _tiny_cases(requires_grad: bool) -> list[tuple[str, tuple[Any, ...], Tensor, dict[str, Callable[..., Tensor]]]]:
    """(op description, args, output gradient, implementation name -> callable)."""

    def make(*shape: int) -> Tensor:
        return torch.randn(*shape, requires_grad=requires_grad)

    def impls(name: str, oplib_fn: Callable[..., Tensor]) -> dict[str, Callable[..., Tensor]]:
        spec = registry.get(name)
        return {"torch": spec.torch_equivalent, "oplib": oplib_fn, "autograd.Function": _autograd_function(spec)}

    return [
        ("exp, 8 elements", (make(8),), torch.randn(8), impls("exp", oplib.exp)),
        ("linear (2, 4) x (3, 4)^T + b", (make(2, 4), make(3, 4), make(3)), torch.randn(2, 3), impls("linear", oplib.linear)),
        (
            "conv2d 1x1x3x3 * 1x1x1x1 + b",
            (make(1, 1, 3, 3), make(1, 1, 1, 1), make(1), [1, 1], [0, 0], [1, 1], 1),
            torch.randn(1, 1, 3, 3),
            impls("conv2d", oplib.conv2d),
        ),
    ]


_TINY_IMPLS = ("torch", "oplib", "autograd.Function")


def _bench_overhead(settings: _Settings) -> list[_OverheadRow]:
    """Section 4: per-call time on tiny tensors, forward only without grad, forward+backward
    with grad."""
    rows = []
    for requires_grad in (False, True):
        label = "per-call, fwd+bwd, requires_grad" if requires_grad else "per-call, forward, no grad"
        for op, args, grad, impls in _tiny_cases(requires_grad):
            if requires_grad:
                expected = _fwd_bwd_grads(impls["torch"], args, grad)
                for name in _TINY_IMPLS[1:]:
                    _assert_same(expected, _fwd_bwd_grads(impls[name], args, grad), f"{label}, {op}, {name}")
            stmt = _FWD_BWD if requires_grad else _CALL
            env_grad = grad if requires_grad else None
            timers = [
                _timer(stmt, _step_env(impls[name], args, env_grad), label, op, name, settings.threads)
                for name in _TINY_IMPLS
            ]
            results = _measure(timers, settings.rounds, settings.tiny_min_run_time)
            rows.append(_OverheadRow(op, requires_grad, dict(zip(_TINY_IMPLS, results))))
    return rows


_FLOOR_IMPLS = ("bare custom_op", "torch.ops.oplib")


def _bench_floor(settings: _Settings) -> list[_OverheadRow]:
    """Section 5: every registry op vs its bare custom_op, forward without grad and
    forward+backward with grad, on the op's first float32 sample input."""
    rows = []
    for spec in registry.all_specs():
        impls = {"bare custom_op": _bare_custom_op(spec.name), "torch.ops.oplib": spec.op}
        for requires_grad in (False, True):
            sample = next(iter(spec.sample_inputs("cpu", torch.float32, requires_grad)))
            args = sample.args
            grad = torch.randn_like(spec.op(*args)) if requires_grad else None
            label = "vs bare custom_op, " + ("fwd+bwd" if requires_grad else "forward")
            what = f"{spec.name} {sample.name}"
            if requires_grad:
                expected = _fwd_bwd_grads(impls["bare custom_op"], args, grad)
                _assert_same(expected, _fwd_bwd_grads(spec.op, args, grad), f"{label}, {what}")
            timers = [
                _timer(_FWD_BWD if requires_grad else _CALL, _step_env(impls[name], args, grad), label, what, name, settings.threads)
                for name in _FLOOR_IMPLS
            ]
            results = _measure(timers, settings.rounds, settings.tiny_min_run_time)
            rows.append(_OverheadRow(what, requires_grad, dict(zip(_FLOOR_IMPLS, results))))
    return rows


_FC_FLOOR_IMPLS = ("torch", "bare custom_op", "torch.ops.oplib")


def _bench_fc_floor(shape: _LinearShape, settings: _Settings) -> _OverheadRow:
    """Section 5b: linear forward+backward at ``shape``, torch vs the bare custom_op vs oplib:
    how much of oplib's ratio to torch is custom_op's own."""
    x = torch.randn(shape.rows, shape.in_features, requires_grad=True)
    weight = torch.randn(shape.out_features, shape.in_features, requires_grad=True)
    bias = torch.randn(shape.out_features, requires_grad=True)
    grad = torch.randn(shape.rows, shape.out_features)
    impls = dict(zip(_FC_FLOOR_IMPLS, (F.linear, _bare_custom_op("linear"), torch.ops.oplib.linear.default)))
    args = (x, weight, bias)
    label = "fc floor"
    timers = [_timer(_FWD_BWD, _step_env(impls[name], args, grad), label, shape.name, name, settings.threads) for name in _FC_FLOOR_IMPLS]
    return _OverheadRow(shape.name, True, dict(zip(_FC_FLOOR_IMPLS, _measure(timers, settings.rounds, settings.min_run_time))))


def _ratio_to(row: _OverheadRow, name: str, baseline: str) -> float:
    """Median over rounds of row[name] / row[baseline]."""
    ours, base = (row.results[n].round_medians for n in (name, baseline))
    return median(o / b for o, b in zip(ours, base, strict=True))


def _fc_floor_table(row: _OverheadRow) -> list[str]:
    """Markdown table of section 5b."""
    lines = ["| candidate | fwd+bwd (ms) | / torch |", "|---|---:|---:|"]
    for name in _FC_FLOOR_IMPLS:
        lines.append(f"| {name} | {row.results[name].median * 1e3:.3f} | **{_ratio_to(row, name, 'torch'):.3f}** |")
    return lines


def _floor_ratio(row: _OverheadRow) -> float:
    """Median over rounds of oplib / bare."""
    return _ratio_to(row, "torch.ops.oplib", "bare custom_op")


# ---------------------------------------------------------------------------------------
# Report
# ---------------------------------------------------------------------------------------


def _machine_lines(settings: _Settings) -> list[str]:
    """Markdown bullets: machine, versions, date and timing method."""
    return [
        f"- CPU: {cpu_model()}",
        f"- cores (os.cpu_count()): {os.cpu_count()}; torch threads: {torch.get_num_threads()}",
        f"- torch {torch.__version__} (mkldnn {'on' if torch.backends.mkldnn.is_available() else 'off'}), "
        f"Python {platform.python_version()}, oplib {oplib.__version__}",
        f"- date: {datetime.datetime.now().astimezone().isoformat(timespec='seconds')}",
        f"- timing: `torch.utils.benchmark.Timer.blocked_autorange`, {settings.rounds} interleaved "
        f"round(s) per candidate of >= {settings.min_run_time:g} s (section 4: >= {settings.tiny_min_run_time:g} s); "
        "times are medians of the per-round medians, ratios medians of the per-round ratios"
        + (" (**--quick: smoke-test timing, not for conclusions**)" if settings.quick else ""),
    ]


def _ratio_table(rows: Sequence[_Row], baseline: str, candidate: str, max_ratio: float) -> list[str]:
    """Markdown table of candidate vs baseline in ms, with a pass column."""
    lines = [
        f"| shape | {baseline} (ms) | {candidate} (ms) | {candidate} / {baseline} | per-round ratio min-max | <= {max_ratio:g} |",
        "|---|---:|---:|---:|---:|:---:|",
    ]
    for row in rows:
        low, high = min(row.round_ratios), max(row.round_ratios)
        lines.append(
            f"| {row.name} | {row.baseline.median * 1e3:.2f} | {row.candidate.median * 1e3:.2f} "
            f"| **{row.ratio:.3f}** | {low:.3f}-{high:.3f} | {'ok' if row.ratio <= max_ratio else 'FAIL'} |"
        )
    return lines


def _contention_line(section: _Section[Any]) -> str:
    """How busy the rest of the machine was during ``section``, with a warning if too busy."""
    if section.other_cores is None:
        return "Other processes' CPU use during this section: unknown (no /proc/stat)."
    line = f"Other processes kept {section.other_cores:.2f} cores busy on average during this section."
    if section.other_cores > _BUSY_CORES_WARNING:
        line += (
            " **Warning: timings unreliable** (with a torch thread on every core, one busy core "
            "stalls every parallel region; see the per-round ratio spread). Rerun on a quiet machine."
        )
    return line


def _overhead_table(rows: Sequence[_OverheadRow]) -> list[str]:
    """Markdown table of section 4 in microseconds, with each implementation's extra over torch."""
    lines = [
        "| op | requires_grad (timed) | torch (us) | oplib (us) | autograd.Function (us) "
        "| oplib - torch (us) | Function - torch (us) |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    for row in rows:
        t, o, f = (row.results[name].median * 1e6 for name in _TINY_IMPLS)
        mode = "yes (fwd+bwd)" if row.requires_grad else "no (forward)"
        lines.append(f"| {row.op} | {mode} | {t:.1f} | {o:.1f} | {f:.1f} | {o - t:+.1f} | {f - t:+.1f} |")
    return lines


def _floor_table(rows: Sequence[_OverheadRow], max_ratio: float) -> list[str]:
    """Markdown table of section 5."""
    lines = [
        f"| op (sample) | timed | bare custom_op (us) | torch.ops.oplib (us) | oplib / bare | <= {max_ratio:g} |",
        "|---|---|---:|---:|---:|:---:|",
    ]
    for row in rows:
        bare, ours = (row.results[name].median * 1e6 for name in _FLOOR_IMPLS)
        ratio = _floor_ratio(row)
        mode = "fwd+bwd" if row.requires_grad else "forward"
        lines.append(f"| {row.op} | {mode} | {bare:.1f} | {ours:.1f} | **{ratio:.3f}** | {'ok' if ratio <= max_ratio else 'FAIL'} |")
    return lines


def _failures(
    conv: _Section[_Row], linear: _Section[_Row], floor: _Section[_OverheadRow], max_ratio: float, max_floor_ratio: float
) -> list[str]:
    """The shapes whose oplib/torch fwd+bwd ratio exceeds ``max_ratio`` and the ops whose
    oplib/bare ratio exceeds ``max_floor_ratio``."""
    return [row.name for row in (*conv.rows, *linear.rows) if row.ratio > max_ratio] + [
        f"{row.op} ({'fwd+bwd' if row.requires_grad else 'forward'}) vs bare custom_op"
        for row in floor.rows
        if _floor_ratio(row) > max_floor_ratio
    ]


def _report(
    settings: _Settings,
    conv: _Section[_Row],
    linear: _Section[_Row],
    overhead: _Section[_OverheadRow],
    floor: _Section[_OverheadRow],
    fc_floor: _Section[_OverheadRow],
    max_ratio: float,
    max_floor_ratio: float,
) -> str:
    """The whole markdown report."""
    failures = _failures(conv, linear, floor, max_ratio, max_floor_ratio)
    verdict = (
        f"**FAIL**: above its bar at: {', '.join(failures)}."
        if failures
        else f"**PASS**: every oplib/torch fwd+bwd ratio is <= {max_ratio:g} and every oplib/bare custom_op "
        f"ratio <= {max_floor_ratio:g}."
    )
    if any(s.other_cores is not None and s.other_cores > _BUSY_CORES_WARNING for s in (conv, linear)):
        verdict += " Measured while other processes were busy: see the warnings below."
    lines = [
        "# Dense ops: oplib vs torch (CPU, float32)",
        "",
        "Written by `python bench/dense.py" + (" --quick" if settings.quick else "") + "`.",
        "",
        *_machine_lines(settings),
        "",
        verdict,
        "",
        f"## 1. conv2d forward+backward (batch {_BATCH}, stride 1, 'same' padding, with bias)",
        "",
        "Input, weight and bias require grad; one step is `conv2d(...).backward(grad)` with a "
        "precomputed `grad`, then the gradients are set to None.",
        "",
        _contention_line(conv),
        "",
        *_ratio_table(conv.rows, "torch", "oplib", max_ratio),
        "",
        "## 2. linear forward+backward (with bias)",
        "",
        _contention_line(linear),
        "",
        *_ratio_table(linear.rows, "torch", "oplib", max_ratio),
        "",
        "## 4. Per-call eager overhead (tiny tensors)",
        "",
        "Without grad: one forward call. With grad: forward, then `backward(grad)` with a "
        "precomputed `grad`, then the gradients set to None. `autograd.Function`: a Function whose "
        "forward is the torch op and whose setup_context and backward are the ones oplib's op "
        "registers, so it has the op's math and backward without the custom-op machinery and "
        "without oplib's argument checks.",
        "",
        _contention_line(overhead),
        "",
        *_overhead_table(overhead.rows),
        "",
        "## 5. oplib's own cost over custom_op's (each registry op's first float32 sample)",
        "",
        "`bare custom_op`: a `torch.library.custom_op` defined in this script with the op's schema "
        "and the op's own `register_autograd` pair, whose kernel is the torch function the op wraps "
        "with no argument checks and no layout normalisation; for the involution ops (whose CPU "
        "kernels are private) it is the op's own registered CPU kernel, so there the ratio leaves "
        "out oplib's argument predicate. What is left in the ratio is what oplib adds per call.",
        "",
        _contention_line(floor),
        "",
        *_floor_table(floor.rows, max_floor_ratio),
        "",
        f"### 5b. custom_op's share at {fc_floor.rows[0].op}",
        "",
        "Forward+backward of the same linear by torch, by the bare custom_op above and by oplib, "
        "interleaved: the bare custom_op's ratio to torch is what any custom op pays there.",
        "",
        _contention_line(fc_floor),
        "",
        *_fc_floor_table(fc_floor.rows[0]),
        "",
    ]
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------
# Entry point
# ---------------------------------------------------------------------------------------


def _parse_args(argv: Optional[Sequence[str]]) -> argparse.Namespace:
    """The command line; see --help."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, default=os.cpu_count(), help="torch threads (default: os.cpu_count())")
    parser.add_argument(
        "--max-ratio",
        type=float,
        default=1.10,
        help="fail (exit 1) if an oplib/torch fwd+bwd time ratio exceeds this (default: 1.10; inf disables)",
    )
    parser.add_argument(
        "--max-floor-ratio",
        type=float,
        default=1.15,
        help="fail if an oplib/bare custom_op time ratio of section 5 exceeds this (default: 1.15; inf disables)",
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help="smoke test: smallest shapes, two short rounds (too noisy for the ratio gate: add --max-ratio inf)",
    )
    parser.add_argument("--rounds", type=int, help="interleaved rounds per candidate (default: 10; --quick: 2)")
    parser.add_argument(
        "--min-run-time", type=float, help="seconds per candidate per round, sections 1, 2 and 5b (default: 0.5; --quick: 0.2)"
    )
    parser.add_argument(
        "--output",
        type=Path,
        help="markdown output (default: bench/results/dense.md; --quick: bench/results/dense-quick.md)",
    )
    return parser.parse_args(argv)


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Run every section, print and write the report; 1 if a ratio is above its bar."""
    args = _parse_args(argv)
    torch.set_num_threads(args.threads)
    min_run_time = args.min_run_time if args.min_run_time is not None else (0.2 if args.quick else 0.5)
    settings = _Settings(
        threads=args.threads,
        rounds=args.rounds if args.rounds is not None else (2 if args.quick else 10),
        min_run_time=min_run_time,
        tiny_min_run_time=min_run_time / 2,
        quick=args.quick,
    )
    output = args.output or _RESULTS_DIR / ("dense-quick.md" if args.quick else "dense.md")
    torch.manual_seed(0)

    print("\n".join(_machine_lines(settings)), flush=True)
    conv_shapes = _QUICK_CONV_SHAPES if args.quick else _CONV_SHAPES
    linear_shapes = _QUICK_LINEAR_SHAPES if args.quick else _LINEAR_SHAPES
    conv = _run_section(lambda: _bench_conv2d(conv_shapes, settings))
    _print_compare([r for row in conv.rows for r in (row.baseline, row.candidate)])
    linear = _run_section(lambda: _bench_linear(linear_shapes, settings))
    _print_compare([r for row in linear.rows for r in (row.baseline, row.candidate)])
    overhead = _run_section(lambda: _bench_overhead(settings))
    _print_compare([r for row in overhead.rows for r in row.results.values()])
    floor = _run_section(lambda: _bench_floor(settings))
    _print_compare([r for row in floor.rows for r in row.results.values()])
    fc_floor = _run_section(lambda: [_bench_fc_floor(_LINEAR_SHAPES[0], settings)])
    _print_compare(list(fc_floor.rows[0].results.values()))

    report = _report(settings, conv, linear, overhead, floor, fc_floor, args.max_ratio, args.max_floor_ratio)
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(report)
    print(f"\n{report}\nwritten to {output}")
    return 1 if _failures(conv, linear, floor, args.max_ratio, args.max_floor_ratio) else 0


if __name__ == "__main__":
    sys.exit(main())
