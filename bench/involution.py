"""Involution at RedNet-50's shapes: oplib vs the unfold formulation of the paper's reference code.

    python bench/involution.py            # full run, writes bench/results/involution.md
    python bench/involution.py --quick    # two small shapes, short timings (smoke test)

CPU: forward and forward+backward time, peak extra memory of one forward+backward, and the
forward's distance from the memory floor: (bytes of input + weight + output) / (copy bandwidth
measured in this run). The bar: forward+backward at least 10x faster than unfold and at most
1/4 of its peak memory at every shape. A second CPU table times each of the three ops on
both CPU paths (native, where it builds, and plain PyTorch) against its depthwise 7x7
yardstick: the depthwise forward for the forward and grad_weight (the same multiply-adds),
the depthwise input gradient for grad_input. With a GPU, the CuPy kernels are also timed against
unfold and against a depthwise 7x7 F.conv2d of the same size. Timing, load monitoring, peak
memory and the report come from bench/_harness.py.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor

import _harness
import oplib
from _harness import Section, call, fwd_bwd, megabytes, ratio
from oplib import registry
from oplib.kernels import involution_cpu, native

MIN_SPEEDUP = 10  # fwd+bwd time of unfold / oplib, at least
MAX_PEAK_RATIO = 0.25  # peak memory of oplib / unfold, at most


@dataclass(frozen=True)
class Shape:
    name: str
    channels: int
    size: int  # input height = width
    stride: int
    batch: int = 8
    kernel: int = 7
    group_channels: int = 16

    @property
    def out_size(self) -> int:
        return (self.size + 2 * (self.kernel // 2) - (self.kernel - 1) - 1) // self.stride + 1

    def tensors(self, device: str, requires_grad: bool) -> tuple[Tensor, Tensor]:
        groups = self.channels // self.group_channels
        x = torch.randn(self.batch, self.channels, self.size, self.size, device=device, requires_grad=requires_grad)
        w = torch.randn(
            self.batch, groups, self.kernel, self.kernel, self.out_size, self.out_size,
            device=device, requires_grad=requires_grad,
        )  # fmt: skip
        return x, w

    @property
    def params(self) -> tuple[list[int], list[int], list[int]]:
        return [self.stride] * 2, [self.kernel // 2] * 2, [1, 1]

    @property
    def cpu_strategy(self) -> str:
        """How oplib's CPU kernels compute this shape ("dense" or "taps")."""
        groups = self.channels // self.group_channels
        weight_shape = (self.batch, groups, self.kernel, self.kernel, self.out_size, self.out_size)
        return involution_cpu.strategy_name((self.size, self.size), weight_shape, *self.params)

    def floor_bytes(self) -> int:
        """Bytes the forward must move at least: read input and weight, write output (float32)."""
        groups = self.channels // self.group_channels
        input_ = self.batch * self.channels * self.size**2
        weight = self.batch * groups * self.kernel**2 * self.out_size**2
        output = self.batch * self.channels * self.out_size**2
        return 4 * (input_ + weight + output)


# RedNet-50: the stride-1 involution of each stage, and the stride-2 one that opens stages 2-4.
SHAPES = [
    Shape("stage1 64@56 s1", 64, 56, 1),
    Shape("stage2 128@28 s1", 128, 28, 1),
    Shape("stage3 256@14 s1", 256, 14, 1),
    Shape("stage4 512@7 s1", 512, 7, 1),
    Shape("stage2 128@56 s2", 128, 56, 2),
    Shape("stage3 256@28 s2", 256, 28, 2),
    Shape("stage4 512@14 s2", 512, 14, 2),
]
QUICK_SHAPES = [Shape("stage4 512@7 s1", 512, 7, 1, batch=2), Shape("stage3 256@28 s2", 256, 28, 2, batch=2)]

_unfold = registry.get("involution").reference


def _oplib(x: Tensor, w: Tensor, shape: Shape) -> Tensor:
    return oplib.involution(x, w, *shape.params)


def _unfold_involution(x: Tensor, w: Tensor, shape: Shape) -> Tensor:
    return _unfold(x, w, *shape.params)


def _depthwise(x: Tensor, w: Tensor, shape: Shape) -> Tensor:
    return F.conv2d(x, w, None, shape.stride, shape.kernel // 2, 1, shape.channels)


CANDIDATES: dict[str, Callable[[Tensor, Tensor, Shape], Tensor]] = {"oplib": _oplib, "unfold": _unfold_involution}


def _cpu_inputs(shape: Shape) -> tuple[Tensor, Tensor, Tensor]:
    """The same (input, weight, grad_output) for every candidate and measurement of a shape."""
    torch.manual_seed(0)
    x, w = shape.tensors("cpu", requires_grad=True)
    return x, w, torch.randn(shape.batch, shape.channels, shape.out_size, shape.out_size)


def _fwd_bwd_step(shape: Shape, label: str) -> Callable[[], None]:
    """One forward+backward of a candidate (for the peak, in a fresh process)."""
    x, w, grad = _cpu_inputs(shape)
    return _harness.fwd_bwd_step(CANDIDATES[label], (x, w, shape), grad)


def copy_bandwidth(section: Section) -> float:
    """Bytes per second read + written by a large tensor copy (256 MiB each way)."""
    src = torch.randn(64 << 20)
    dst = torch.empty_like(src)
    seconds = section.measure("copy 256 MiB", {"copy": call(dst.copy_, src)})["copy"].median
    return 2 * src.numel() * 4 / seconds


@dataclass
class _Row:
    shape: Shape
    times: dict[tuple[str, str], _harness.Timing]  # (candidate, "fwd" | "fwd+bwd")
    floor_seconds: float
    peaks: Optional[dict[str, int]] = None

    @property
    def speedup(self) -> float:
        return ratio(self.times["unfold", "fwd+bwd"], self.times["oplib", "fwd+bwd"])

    @property
    def peak_ratio(self) -> float:
        return self.peaks["oplib"] / max(1, self.peaks["unfold"])

    @property
    def failed(self) -> bool:
        return self.speedup < MIN_SPEEDUP or self.peak_ratio > MAX_PEAK_RATIO


def run_cpu(section: Section, shapes: list[Shape], bandwidth: float) -> list[_Row]:
    """Times every (candidate, mode) of a shape interleaved; then the peak memory of each
    candidate, in fresh processes (never while timing)."""
    rows = []
    for shape in shapes:
        x, w, grad = _cpu_inputs(shape)
        stmts = {}
        for label, fn in CANDIDATES.items():
            stmts[label, "fwd"] = call(fn, x.detach(), w.detach(), shape)
            stmts[label, "fwd+bwd"] = fwd_bwd(fn, (x, w, shape), grad)
        rows.append(_Row(shape, section.measure(shape.name, stmts), shape.floor_bytes() / bandwidth))
    for row in rows:
        row.peaks = {label: _harness.peak_memory(_fwd_bwd_step, row.shape, label) for label in CANDIDATES}
    return rows


# (op, CPU path) -> the statement timed, for a shape's (input, weight, grad_output).
PER_OP = ("forward", "grad_input", "grad_weight")


def run_per_op(section: Section, shapes: list[Shape]) -> list[tuple[Shape, dict[str, _harness.Timing]]]:
    """Each op on each CPU path and its depthwise yardstick, interleaved per shape."""
    try:
        module = native.build()
    except Exception as error:  # noqa: BLE001  (the table says why the native column is empty)
        print(f"native CPU kernels not built: {error}", flush=True)
        module = None
    rows = []
    for shape in shapes:
        x, w, grad = (t.detach() for t in _cpu_inputs(shape))
        stride, padding, dilation = shape.params
        groups, size, kernel = w.shape[1], [shape.size] * 2, [shape.kernel] * 2
        depthwise = torch.randn(shape.channels, 1, shape.kernel, shape.kernel)
        mask = [True, False, False]
        stmts = {
            "depthwise forward": call(_depthwise, x, depthwise, shape),
            "depthwise grad_input": call(
                torch.ops.aten.convolution_backward, grad, x, depthwise, None, stride, padding, dilation, False,
                [0, 0], shape.channels, mask,
            ),
            ("pytorch", "forward"): call(involution_cpu.involution, x, w, *shape.params),
            ("pytorch", "grad_input"): call(involution_cpu.involution_backward_input, grad, w, size, *shape.params),
            ("pytorch", "grad_weight"): call(involution_cpu.involution_backward_weight, grad, x, kernel, *shape.params, groups),
        }  # fmt: skip
        if module is not None:
            stmts["native", "forward"] = call(module.involution_forward, x, w, *shape.params)
            stmts["native", "grad_input"] = call(module.involution_backward_input, grad, w, size, *shape.params)
            stmts["native", "grad_weight"] = call(module.involution_backward_weight, grad, x, kernel, *shape.params, groups)
        rows.append((shape, section.measure(f"per op {shape.name}", stmts)))
    return rows


def _per_op_table(rows: list[tuple[Shape, dict]]) -> list[str]:
    yardstick = {"forward": "depthwise forward", "grad_input": "depthwise grad_input", "grad_weight": "depthwise forward"}
    cells = []
    for shape, times in rows:
        row = [shape.name]
        for op in PER_OP:
            for path in ("native", "pytorch"):
                timing = times.get((path, op))
                row.append("-" if timing is None else f"{timing.median * 1e3:.2f} ({ratio(timing, times[yardstick[op]]):.1f}x)")
        row += [f"{times[name].median * 1e3:.2f}" for name in ("depthwise forward", "depthwise grad_input")]
        cells.append(row)
    columns = ("shape", "forward native", "forward pytorch", "grad_input native", "grad_input pytorch",
               "grad_weight native", "grad_weight pytorch", "depthwise fwd (ms)", "depthwise grad_input (ms)")  # fmt: skip
    return _harness.table(columns, "lrrrrrrrr", cells)


def run_cuda(section: Section, shapes: list[Shape]) -> list[tuple[Shape, dict[str, _harness.Timing]]]:
    rows = []
    for shape in shapes:
        torch.manual_seed(0)
        x, w = shape.tensors("cuda", requires_grad=False)
        depthwise_weight = torch.randn(shape.channels, 1, shape.kernel, shape.kernel, device="cuda")
        stmts = {
            "oplib": call(_oplib, x, w, shape),
            "unfold": call(_unfold_involution, x, w, shape),
            "depthwise conv": call(_depthwise, x, depthwise_weight, shape),
        }
        rows.append((shape, section.measure(f"cuda {shape.name}", stmts)))
    return rows


def _cpu_table(rows: list[_Row]) -> list[str]:
    def ms(row: _Row, label: str, mode: str) -> str:
        return f"{row.times[label, mode].median * 1e3:.1f}"

    cells = [
        (
            row.shape.name, row.shape.batch, row.shape.cpu_strategy, ms(row, "oplib", "fwd"), ms(row, "unfold", "fwd"), ms(row, "oplib", "fwd+bwd"),
            ms(row, "unfold", "fwd+bwd"), f"**{row.speedup:.1f}x**", megabytes(row.peaks["oplib"]),
            megabytes(row.peaks["unfold"]), f"**{row.peak_ratio:.2f}**", f"{row.floor_seconds * 1e3:.2f}",
            f"{row.times['oplib', 'fwd'].median / row.floor_seconds:.1f}x",
        )  # fmt: skip
        for row in rows
    ]
    columns = ("shape", "batch", "CPU strategy", "oplib fwd (ms)", "unfold fwd (ms)", "oplib fwd+bwd (ms)", "unfold fwd+bwd (ms)",
               "fwd+bwd speed-up", "oplib peak (MB)", "unfold peak (MB)", "peak ratio", "memory floor (ms)",
               "oplib fwd / floor")  # fmt: skip
    return _harness.table(columns, "lrlrrrrrrrrrr", cells)


def _cpu_report(settings, cpu: Section, cpu_rows, bandwidth: float, verdict: str) -> list[str]:
    return [
        *_harness.header(
            settings,
            "Involution: oplib vs the unfold formulation",
            f"- copy bandwidth measured in this run: {bandwidth / 1e9:.1f} GB/s (bytes read + written)",
            "- float32, K = 7, 16 channels per group, padding 3; speed-up = median of the per-round "
            "unfold / oplib fwd+bwd ratios; peak = highest resident memory above the inputs during one "
            "forward+backward (measured after the timings, each in a fresh process)",
        ),
        "## CPU",
        "",
        cpu.load_line(),
        "",
        *_cpu_table(cpu_rows),
        "",
        f"Bar: fwd+bwd speed-up >= {MIN_SPEEDUP}x and peak ratio <= {MAX_PEAK_RATIO} at every shape: {verdict}"
        + _harness.busy_note([cpu]),
        "",
    ]


def main(argv: Optional[list[str]] = None) -> int:
    parser = _harness.parser(__doc__, rounds=3, min_run_time=1.0)
    parser.add_argument(
        "--cuda-only", action="store_true",
        help="only the CUDA table (make gpu-check), written to bench/results/involution-cuda.md by default",
    )
    args = parser.parse_args(argv)
    if args.cuda_only:
        if not torch.cuda.is_available():
            parser.error("--cuda-only: no GPU (torch.cuda.is_available() is False)")
        args.output = args.output or _harness.RESULTS / f"involution-cuda{'-quick' if args.quick else ''}.md"
    settings = _harness.start(args, __file__)
    shapes = QUICK_SHAPES if settings.quick else SHAPES
    cpu = Section(settings)
    bandwidth = 0.0 if args.cuda_only else copy_bandwidth(cpu)
    if not args.cuda_only:
        print(f"copy bandwidth {bandwidth / 1e9:.1f} GB/s", flush=True)
    cpu_rows = [] if args.cuda_only else run_cpu(cpu, shapes, bandwidth)
    per_op = Section(settings)
    per_op_rows = [] if args.cuda_only else run_per_op(per_op, shapes)
    cuda = Section(settings)
    cuda_rows = run_cuda(cuda, shapes) if torch.cuda.is_available() else []
    failures = [row.shape.name for row in cpu_rows if row.failed]
    verdict = "**met**." if not failures else f"**not met** at {', '.join(failures)}."
    if args.cuda_only:
        lines = [*_harness.header(settings, "Involution on CUDA: oplib vs the unfold formulation",
                                  "- run with `--cuda-only` (`make gpu-check`): the CUDA table alone",
                                  "- float32, K = 7, 16 channels per group, padding 3; forward only")]
    else:
        lines = _cpu_report(settings, cpu, cpu_rows, bandwidth, verdict)
        lines += [
            "## CPU, per op: native and plain-PyTorch kernels vs a depthwise 7x7 convolution",
            "",
            "Each op's time in ms and, in brackets, its ratio (median of the per-round ratios) to its "
            "yardstick: the depthwise forward for the forward and grad_weight, the depthwise input "
            "gradient for grad_input. oplib's ops take the plain-PyTorch path unless "
            "OPLIB_CPU_KERNELS asks for the native one.",
            "",
            per_op.load_line(),
            "",
            *_per_op_table(per_op_rows),
            "",
        ]
    if cuda_rows:
        lines += ["## CUDA (forward)", "", cuda.load_line(), ""]
        lines += _harness.table(
            ("shape", "oplib (ms)", "unfold (ms)", "depthwise 7x7 conv (ms)"),
            "lrrr",
            [(shape.name, *(f"{t[k].median * 1e3:.3f}" for k in ("oplib", "unfold", "depthwise conv"))) for shape, t in cuda_rows],
        )
    else:
        lines += ["## CUDA", "", "Not run: no GPU on this machine (torch.cuda.is_available() is False)."]
    _harness.write_report(settings, lines)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
