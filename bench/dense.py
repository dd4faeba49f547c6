#!/usr/bin/env python
"""Benchmark oplib's dense ops against torch on CPU, float32, in one run.

1. ``oplib.conv2d`` vs ``F.conv2d``, forward+backward, at ResNet-50 stage shapes (batch 8),
   with the peak memory of one step.
2. ``oplib.linear`` vs ``F.linear``, forward+backward (ResNet-50 fc, a ViT-B MLP layer).
3. Per-call eager overhead on tiny tensors: oplib op vs plain torch op vs a
   ``torch.autograd.Function`` made of the op's own registered setup_context and backward,
   with and without ``requires_grad``.
4. oplib's own cost over custom_op's: every registry op on its first sample input vs a bare
   ``torch.library.custom_op`` of the same schema that runs the same kernel with the same
   ``register_autograd`` backward and no argument checks (custom_op's floor).

(The conv2d backward route is settled: see ``_conv2d_backward`` in oplib/ops/conv2d.py.)
Timing, load monitoring, peak memory and the report come from bench/_harness.py. The script
exits with status 1 if an oplib/torch forward+backward ratio of section 1 or 2 exceeds
``--max-ratio``, or an oplib/bare ratio of section 4 exceeds ``--max-floor-ratio``.

Usage (from the repo root)::

    python bench/dense.py                          # full run, about 7 minutes; bench/results/dense.md
    python bench/dense.py --quick --max-ratio inf  # smoke test (< 1 minute), no ratio gate
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Optional

import torch
import torch.nn.functional as F
from torch import Tensor

import _harness
import oplib
from _harness import Section, megabytes
from oplib import benchmark, registry
from oplib.benchmark import Timing, fwd_bwd, ratio, round_ratios
from oplib.ops._rules import CONTRACTS

_BATCH = 8


@dataclass(frozen=True)
class _ConvShape:
    """A stride-1 'same' convolution of a ResNet-50 stage: (N, C, S, S) -> (N, O, S, S)."""

    stage: int
    in_channels: int
    out_channels: int
    size: int
    kernel: int

    @property
    def name(self) -> str:
        return (
            f"stage {self.stage} {self.kernel}x{self.kernel} "
            f"{self.in_channels}->{self.out_channels} @{self.size}x{self.size}"
        )

    def tensors(self) -> tuple[tuple[Any, ...], Tensor]:
        """(input, weight, bias, stride, padding) requiring grad, and an output gradient."""
        c, o, s, k = self.in_channels, self.out_channels, self.size, self.kernel
        input = torch.randn(_BATCH, c, s, s, requires_grad=True)
        weight = torch.randn(o, c, k, k, requires_grad=True)
        bias = torch.randn(o, requires_grad=True)
        return (input, weight, bias, 1, k // 2), torch.randn(_BATCH, o, s, s)


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

    def tensors(self) -> tuple[tuple[Any, ...], Tensor]:
        """(input, weight, bias) requiring grad, and an output gradient."""
        input = torch.randn(self.rows, self.in_features, requires_grad=True)
        weight = torch.randn(self.out_features, self.in_features, requires_grad=True)
        bias = torch.randn(self.out_features, requires_grad=True)
        return (input, weight, bias), torch.randn(self.rows, self.out_features)


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

# Sections 1 and 2: the candidates by name, per op.
_HEAD_TO_HEAD: dict[str, dict[str, Callable[..., Tensor]]] = {
    "conv2d": {"torch": F.conv2d, "oplib": oplib.conv2d},
    "linear": {"torch": F.linear, "oplib": oplib.linear},
}


# ---------------------------------------------------------------------------------------
# Baselines made of the ops' own pieces, so that they follow any change to an op
# ---------------------------------------------------------------------------------------


def _bare_kernel(spec: registry.OpSpec) -> Callable[..., Tensor]:
    """The kernel an op ends in, without oplib around it: the torch function it wraps, or for
    an op defined by a Contract (the involution ops) its CPU backend writing the result the
    contract allocates, without the argument rules."""
    if spec.torch_equivalent is not None:
        return spec.torch_equivalent
    contract = CONTRACTS[spec.qualname]
    write, result = contract.writers["cpu"], contract.result
    return lambda *args: write(*args, result(*args))


def _autograd_function(spec: registry.OpSpec) -> Callable[..., Tensor]:
    """``apply`` of a ``torch.autograd.Function`` that runs the op's bare kernel, then the op's
    registered setup_context, and whose backward is the op's registered one: the op's math and
    backward without the custom-op machinery or oplib's argument checks. (A Function with a
    separate setup_context staticmethod would bind its arguments with ``inspect`` on every call;
    custom_op's own Function calls setup_context from forward, as this one does.)"""
    opdef = spec._opdef()
    kernel, setup_context = _bare_kernel(spec), opdef._setup_context_fn

    def forward(ctx: Any, *args: Any) -> Tensor:
        output = kernel(*args)
        setup_context(ctx, args, output)
        return output

    methods = {"forward": staticmethod(forward), "backward": staticmethod(opdef._backward_fn)}
    return type(f"{spec.name}_function", (torch.autograd.Function,), methods).apply


@functools.cache
def _bare_custom_op(name: str) -> Callable[..., Tensor]:
    """A ``torch.library.custom_op`` with the spec's schema whose kernel is the op's bare
    kernel (no argument checks, no layout normalisation) and whose autograd is the op's own
    ``register_autograd`` pair: the least any custom op with that math costs per call.
    Defined once per op (sections 4 and 4b share linear's)."""
    spec = registry.get(name)
    opdef = spec._opdef()
    kernel = _bare_kernel(spec)
    schema = "(" + str(spec.op._schema).split("(", 1)[1]
    bare = torch.library.custom_op(f"oplib_bench::{spec.name}", lambda *args: kernel(*args), mutates_args=(), schema=schema)
    bare.register_autograd(opdef._backward_fn, setup_context=opdef._setup_context_fn)
    return getattr(torch.ops.oplib_bench, spec.name).default


# ---------------------------------------------------------------------------------------
# Checks that candidates compute the same thing
# ---------------------------------------------------------------------------------------


def _fwd_bwd_grads(fn: Callable[..., Tensor], args: Sequence[Any], grad: Tensor) -> list[Tensor]:
    """The output and the gradients of every leaf, from one forward+backward."""
    out = fn(*args)
    out.backward(grad)
    grads = [out.detach()]
    for leaf in benchmark.leaves(args):
        grads.append(leaf.grad)
        leaf.grad = None
    return grads


def _assert_same(impls: dict[str, Callable[..., Tensor]], args: Sequence[Any], grad: Tensor, what: str) -> None:
    """Every implementation's output and gradients against the first's (loose: different
    reduction orders are fine, this is not an accuracy test)."""
    first, *others = impls
    expected = _fwd_bwd_grads(impls[first], args, grad)
    for name in others:
        for e, a in zip(expected, _fwd_bwd_grads(impls[name], args, grad), strict=True):
            torch.testing.assert_close(a, e, rtol=1e-4, atol=1e-3, msg=lambda m: f"{what}, {name}: {m}")


# ---------------------------------------------------------------------------------------
# Sections
# ---------------------------------------------------------------------------------------


@dataclass
class _Row:
    """One case of a section: a Timing per implementation, peak bytes where measured."""

    name: str
    times: dict[str, Timing]
    peaks: Optional[dict[str, int]] = None
    requires_grad: bool = True

    def ratio(self, numerator: str, denominator: str) -> float:
        return ratio(self.times[numerator], self.times[denominator])

    @property
    def mode(self) -> str:
        return "fwd+bwd" if self.requires_grad else "forward"


def _head_to_head_step(op: str, shape: _ConvShape | _LinearShape, impl: str) -> Callable[[], None]:
    """One forward+backward of ``impl`` at ``shape`` (for the peak, in a fresh process)."""
    torch.manual_seed(0)
    args, grad = shape.tensors()
    return benchmark.fwd_bwd_step(_HEAD_TO_HEAD[op][impl], args, grad)


def _bench_head_to_head(section: Section, op: str, shapes: Sequence[_ConvShape | _LinearShape]) -> list[_Row]:
    """Sections 1 and 2: oplib vs torch forward+backward on the same tensors; then the peak
    memory of each, in fresh processes."""
    impls = _HEAD_TO_HEAD[op]
    rows = []
    for shape in shapes:
        args, grad = shape.tensors()
        _assert_same(impls, args, grad, f"{op}, {shape.name}")
        times = section.measure(f"{op} {shape.name}", {name: fwd_bwd(fn, args, grad) for name, fn in impls.items()})
        rows.append(_Row(shape.name, times))
    for shape, row in zip(shapes, rows):
        row.peaks = {name: _harness.peak_memory(_head_to_head_step, op, shape, name) for name in impls}
    return rows


_TINY_IMPLS = ("torch", "oplib", "autograd.Function")


def _tiny_cases(requires_grad: bool) -> list[tuple[str, registry.OpSpec, Callable[..., Tensor], tuple[Any, ...], Tensor]]:
    """(description, spec, oplib's function, args, output gradient)."""

    def make(*shape: int) -> Tensor:
        return torch.randn(*shape, requires_grad=requires_grad)

    return [
        ("exp, 8 elements", registry.get("exp"), oplib.exp, (make(8),), torch.randn(8)),
        ("linear (2, 4) x (3, 4)^T + b", registry.get("linear"), oplib.linear, (make(2, 4), make(3, 4), make(3)), torch.randn(2, 3)),
        (
            "conv2d 1x1x3x3 * 1x1x1x1 + b",
            registry.get("conv2d"),
            oplib.conv2d,
            (make(1, 1, 3, 3), make(1, 1, 1, 1), make(1), [1, 1], [0, 0], [1, 1], 1),
            torch.randn(1, 1, 3, 3),
        ),
    ]


def _bench_overhead(section: Section) -> list[_Row]:
    """Section 3: per-call time on tiny tensors, forward only without grad, forward+backward
    with grad."""
    rows = []
    for requires_grad in (False, True):
        for what, spec, oplib_fn, args, grad in _tiny_cases(requires_grad):
            impls = dict(zip(_TINY_IMPLS, (spec.torch_equivalent, oplib_fn, _autograd_function(spec))))
            if requires_grad:
                _assert_same(impls, args, grad, f"per-call, {what}")
            stmts = {
                name: fwd_bwd(fn, args, grad) if requires_grad else benchmark.call(fn, *args) for name, fn in impls.items()
            }
            rows.append(_Row(what, section.measure(f"per-call {what}", stmts), requires_grad=requires_grad))
    return rows


_FLOOR_IMPLS = ("bare custom_op", "torch.ops.oplib")


def _bench_floor(section: Section) -> list[_Row]:
    """Section 4: every registry op vs its bare custom_op, forward without grad and
    forward+backward with grad, on the op's first float32 sample input."""
    rows = []
    for spec in registry.all_specs():
        impls = dict(zip(_FLOOR_IMPLS, (_bare_custom_op(spec.name), spec.op)))
        for requires_grad in (False, True):
            sample = next(iter(spec.sample_inputs("cpu", torch.float32, requires_grad)))
            what = f"{spec.name} {sample.name}"
            if requires_grad:
                grad = torch.randn_like(spec.op(*sample.args))
                _assert_same(impls, sample.args, grad, f"vs bare custom_op, {what}")
                stmts = {name: fwd_bwd(fn, sample.args, grad) for name, fn in impls.items()}
            else:
                stmts = {name: benchmark.call(fn, *sample.args) for name, fn in impls.items()}
            rows.append(_Row(what, section.measure(f"floor {what}", stmts), requires_grad=requires_grad))
    return rows


_FC_FLOOR_IMPLS = ("torch", "bare custom_op", "torch.ops.oplib")


def _bench_fc_floor(section: Section, shape: _LinearShape) -> _Row:
    """Section 4b: linear forward+backward at ``shape``, torch vs the bare custom_op vs oplib:
    how much of oplib's ratio to torch is custom_op's own."""
    args, grad = shape.tensors()
    impls = dict(zip(_FC_FLOOR_IMPLS, (F.linear, _bare_custom_op("linear"), registry.get("linear").op)))
    return _Row(shape.name, section.measure(f"fc floor {shape.name}", {n: fwd_bwd(fn, args, grad) for n, fn in impls.items()}))


# ---------------------------------------------------------------------------------------
# Report
# ---------------------------------------------------------------------------------------


def _pass(value: float, bar: float) -> str:
    return "ok" if value <= bar else "FAIL"


def _ratio_table(rows: Sequence[_Row], max_ratio: float) -> list[str]:
    """Sections 1 and 2: oplib vs torch in ms, the bar, the peak memory of each."""
    cells = []
    for row in rows:
        ratios = round_ratios(row.times["oplib"], row.times["torch"])
        r = row.ratio("oplib", "torch")
        cells.append(
            (
                row.name,
                f"{row.times['torch'].median * 1e3:.2f}",
                f"{row.times['oplib'].median * 1e3:.2f}",
                f"**{r:.3f}**",
                f"{min(ratios):.3f}-{max(ratios):.3f}",
                _pass(r, max_ratio),
                megabytes(row.peaks["torch"]),
                megabytes(row.peaks["oplib"]),
            )
        )
    columns = ("shape", "torch (ms)", "oplib (ms)", "oplib / torch", "per-round ratio min-max", f"<= {max_ratio:g}",
               "torch peak (MB)", "oplib peak (MB)")  # fmt: skip
    return _harness.table(columns, "lrrrrcrr", cells)


def _overhead_table(rows: Sequence[_Row]) -> list[str]:
    """Section 3 in microseconds, with each implementation's extra over torch."""
    cells = []
    for row in rows:
        t, o, f = (row.times[name].median * 1e6 for name in _TINY_IMPLS)
        mode = "yes (fwd+bwd)" if row.requires_grad else "no (forward)"
        cells.append((row.name, mode, f"{t:.1f}", f"{o:.1f}", f"{f:.1f}", f"{o - t:+.1f}", f"{f - t:+.1f}"))
    columns = ("op", "requires_grad (timed)", "torch (us)", "oplib (us)", "autograd.Function (us)", "oplib - torch (us)",
               "Function - torch (us)")  # fmt: skip
    return _harness.table(columns, "llrrrrr", cells)


def _floor_table(rows: Sequence[_Row], max_floor_ratio: float) -> list[str]:
    """Section 4 in microseconds, with the bar."""
    cells = []
    for row in rows:
        bare, ours = (row.times[name].median * 1e6 for name in _FLOOR_IMPLS)
        r = row.ratio("torch.ops.oplib", "bare custom_op")
        cells.append((row.name, row.mode, f"{bare:.1f}", f"{ours:.1f}", f"**{r:.3f}**", _pass(r, max_floor_ratio)))
    columns = ("op (sample)", "timed", "bare custom_op (us)", "torch.ops.oplib (us)", "oplib / bare", f"<= {max_floor_ratio:g}")
    return _harness.table(columns, "llrrrc", cells)


def _fc_floor_table(row: _Row) -> list[str]:
    """Section 4b: each candidate in ms and over torch."""
    cells = [
        (name, f"{row.times[name].median * 1e3:.3f}", f"**{row.ratio(name, 'torch'):.3f}**") for name in _FC_FLOOR_IMPLS
    ]
    return _harness.table(("candidate", "fwd+bwd (ms)", "/ torch"), "lrr", cells)


def _failures(head_to_head: Sequence[_Row], floor: Sequence[_Row], max_ratio: float, max_floor_ratio: float) -> list[str]:
    """The shapes whose oplib/torch fwd+bwd ratio exceeds ``max_ratio`` and the ops whose
    oplib/bare ratio exceeds ``max_floor_ratio``."""
    return [row.name for row in head_to_head if row.ratio("oplib", "torch") > max_ratio] + [
        f"{row.name} ({row.mode}) vs bare custom_op"
        for row in floor
        if row.ratio("torch.ops.oplib", "bare custom_op") > max_floor_ratio
    ]


def _parse_args(argv: Optional[Sequence[str]]) -> tuple[Any, _harness.Settings]:
    parser = _harness.parser(__doc__, rounds=10, min_run_time=0.5, quick_rounds=2)
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
        help="fail if an oplib/bare custom_op time ratio of section 4 exceeds this (default: 1.15; inf disables)",
    )
    args = parser.parse_args(argv)
    return args, _harness.start(args, __file__)


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Run every section, print and write the report; 1 if a ratio is above its bar."""
    args, settings = _parse_args(argv)
    torch.manual_seed(0)
    conv, linear, fc = Section(settings), Section(settings), Section(settings)
    tiny, floor = Section(settings, settings.min_run_time / 2), Section(settings, settings.min_run_time / 2)
    conv_rows = _bench_head_to_head(conv, "conv2d", _QUICK_CONV_SHAPES if settings.quick else _CONV_SHAPES)
    linear_rows = _bench_head_to_head(linear, "linear", _QUICK_LINEAR_SHAPES if settings.quick else _LINEAR_SHAPES)
    tiny_rows = _bench_overhead(tiny)
    floor_rows = _bench_floor(floor)
    fc_row = _bench_fc_floor(fc, _LINEAR_SHAPES[0])

    failures = _failures(conv_rows + linear_rows, floor_rows, args.max_ratio, args.max_floor_ratio)
    verdict = (
        f"**FAIL**: above its bar at: {', '.join(failures)}."
        if failures
        else f"**PASS**: every oplib/torch fwd+bwd ratio is <= {args.max_ratio:g} and every oplib/bare custom_op "
        f"ratio <= {args.max_floor_ratio:g}."
    )
    verdict += _harness.busy_note((conv, linear, tiny, floor, fc))
    peak_note = (
        "Peak: the highest resident memory above the inputs during one step, measured after the timings "
        "in a fresh process."
    )
    lines = [
        *_harness.header(
            settings,
            "Dense ops: oplib vs torch (CPU, float32)",
            f"- sections 3 and 4 time each candidate for >= {tiny.min_run_time:g} s per round",
        ),
        verdict,
        "",
        f"## 1. conv2d forward+backward (batch {_BATCH}, stride 1, 'same' padding, with bias)",
        "",
        "Input, weight and bias require grad; one step is `conv2d(...).backward(grad)` with a "
        "precomputed `grad`, then the gradients are set to None. " + peak_note,
        "",
        conv.load_line(),
        "",
        *_ratio_table(conv_rows, args.max_ratio),
        "",
        "## 2. linear forward+backward (with bias)",
        "",
        peak_note,
        "",
        linear.load_line(),
        "",
        *_ratio_table(linear_rows, args.max_ratio),
        "",
        "## 3. Per-call eager overhead (tiny tensors)",
        "",
        "Without grad: one forward call. With grad: forward, then `backward(grad)` with a "
        "precomputed `grad`, then the gradients set to None. `autograd.Function`: a Function whose "
        "forward is the torch op and whose setup_context and backward are the ones oplib's op "
        "registers, so it has the op's math and backward without the custom-op machinery and "
        "without oplib's argument checks.",
        "",
        tiny.load_line(),
        "",
        *_overhead_table(tiny_rows),
        "",
        "## 4. oplib's own cost over custom_op's (each registry op's first float32 sample)",
        "",
        "`bare custom_op`: a `torch.library.custom_op` defined in this script with the op's schema "
        "and the op's own `register_autograd` pair, whose kernel is the torch function the op wraps "
        "with no argument checks and no layout normalisation; for the involution ops it is the op's "
        "CPU backend writing the result the op allocates, without the op's argument rules. What is "
        "left in the ratio is what oplib adds per call.",
        "",
        floor.load_line(),
        "",
        *_floor_table(floor_rows, args.max_floor_ratio),
        "",
        f"### 4b. custom_op's share at {fc_row.name}",
        "",
        "Forward+backward of the same linear by torch, by the bare custom_op above and by oplib, "
        "interleaved: the bare custom_op's ratio to torch is what any custom op pays there.",
        "",
        fc.load_line(),
        "",
        *_fc_floor_table(fc_row),
    ]
    _harness.write_report(settings, lines)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
