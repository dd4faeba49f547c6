"""Involution at RedNet-50's shapes: oplib vs the unfold formulation of the paper's reference code.

    python bench/involution.py            # full run, writes bench/results/involution.md
    python bench/involution.py --quick    # two small shapes, short timings (smoke test)

CPU: forward and forward+backward time (torch.utils.benchmark, both candidates timed in the
same run, interleaved), peak extra memory of one forward+backward, and the forward's distance
from the memory floor: (bytes of input + weight + output) / (copy bandwidth measured in this
run). The bar: forward+backward at least 10x faster than unfold and at most 1/4 of its peak
memory at every shape. With a GPU, the CuPy kernels are also timed against unfold and against
a depthwise 7x7 F.conv2d of the same size.
"""

from __future__ import annotations

import argparse
import ctypes
import datetime
import os
import statistics
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.utils.benchmark import Timer

import oplib
from oplib import registry

from machine import describe

RESULTS = Path(__file__).resolve().parent / "results"


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

    def tensors(self, device: str, requires_grad: bool):
        groups = self.channels // self.group_channels
        x = torch.randn(self.batch, self.channels, self.size, self.size, device=device, requires_grad=requires_grad)
        w = torch.randn(
            self.batch, groups, self.kernel, self.kernel, self.out_size, self.out_size,
            device=device, requires_grad=requires_grad,
        )
        return x, w

    @property
    def params(self):
        return [self.stride] * 2, [self.kernel // 2] * 2, [1, 1]

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


def _oplib(x, w, shape):
    return oplib.involution(x, w, *shape.params)


def _unfold_involution(x, w, shape):
    return _unfold(x, w, *shape.params)


def _depthwise(x, w, shape):
    return F.conv2d(x, w, None, shape.stride, shape.kernel // 2, 1, shape.channels)


CANDIDATES = (("oplib", _oplib), ("unfold", _unfold_involution))


def _cpu_inputs(shape: Shape):
    """The same (input, weight, grad_output) for every candidate and measurement of a shape."""
    torch.manual_seed(0)
    x, w = shape.tensors("cpu", requires_grad=True)
    return x, w, torch.randn(shape.batch, shape.channels, shape.out_size, shape.out_size)


def _fwd_bwd(fn, x, w, shape, grad):
    fn(x, w, shape).backward(grad)
    x.grad = w.grad = None


def _median_time(stmt, fn, x, w, shape, grad, min_run_time):
    env = dict(stmt=stmt, fn=fn, x=x, w=w, shape=shape, grad=grad, _fwd_bwd=_fwd_bwd)
    timer = Timer(stmt, globals=env, num_threads=torch.get_num_threads())
    return timer.blocked_autorange(min_run_time=min_run_time).median


def _limit_malloc_caching() -> None:
    """Large blocks go straight to mmap and back to the OS on free, so the resident set
    tracks the live tensors and its high-water mark measures peak memory. Only effective
    before the process has freed large blocks: malloc reuses free heap memory first."""
    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.mallopt(-3, 1 << 16)  # M_MMAP_THRESHOLD
        libc.mallopt(-1, 0)  # M_TRIM_THRESHOLD
    except OSError:
        pass


def _status_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"{field} not in /proc/self/status")


def _peak_extra_bytes(fn) -> int:
    """Peak resident memory above the current level while ``fn`` runs (Linux). The kernel
    counts resident pages per CPU in batches, so readings move by a few hundred KB: a
    peak below that can read as slightly negative, and counts as 0."""
    Path("/proc/self/clear_refs").write_text("5")  # resets VmHWM to the current VmRSS
    before = _status_kib("VmRSS")
    fn()
    return max(0, 1024 * (_status_kib("VmHWM") - before))


def _measure_peak(shape_name: str, batch: str, label: str, threads: int) -> int:
    """In a fresh process (``--peak``): peak extra memory of one forward+backward, after one
    warm-up call (whose one-time caches are then resident)."""
    _limit_malloc_caching()
    torch.set_num_threads(threads)
    shape = next(s for s in SHAPES + QUICK_SHAPES if s.name == shape_name and s.batch == int(batch))
    fn = dict(CANDIDATES)[label]
    x, w, grad = _cpu_inputs(shape)
    _fwd_bwd(fn, x, w, shape, grad)
    return _peak_extra_bytes(lambda: _fwd_bwd(fn, x, w, shape, grad))


def peak_memory(shape: Shape, label: str) -> int:
    """Peak extra bytes of one forward+backward, measured in a fresh process: in this one,
    the timings have left freed memory in malloc's heap, which later calls reuse without
    the resident set growing, so a peak read here would be too low."""
    result = subprocess.run(
        [sys.executable, __file__, "--peak", shape.name, str(shape.batch), label, "--threads", str(torch.get_num_threads())],
        check=True, capture_output=True, text=True,
    )
    return int(result.stdout.split()[-1])


def copy_bandwidth() -> float:
    """Bytes per second read + written by a large tensor copy (256 MiB each way)."""
    src = torch.randn(64 << 20)
    dst = torch.empty_like(src)
    seconds = Timer("dst.copy_(src)", globals=dict(src=src, dst=dst), num_threads=torch.get_num_threads())
    return 2 * src.numel() * 4 / seconds.blocked_autorange(min_run_time=1.0).median


def run_cpu(shapes, min_run_time: float, bandwidth: float, rounds: int):
    """Times every (candidate, mode) in ``rounds`` interleaved rounds and keeps the median,
    so a burst of load from elsewhere skews one round, not a whole row. Peak memory is
    measured afterwards, each in a fresh process with malloc told to return large blocks
    (which slows allocation, so never while timing)."""
    rows = []
    for shape in shapes:
        x, w, grad = _cpu_inputs(shape)
        samples = {}
        for _ in range(rounds):
            for label, fn in CANDIDATES:
                with torch.no_grad():
                    samples.setdefault((label, "fwd"), []).append(
                        _median_time("fn(x, w, shape)", fn, x, w, shape, grad, min_run_time)
                    )
                samples.setdefault((label, "fwd+bwd"), []).append(
                    _median_time("_fwd_bwd(fn, x, w, shape, grad)", fn, x, w, shape, grad, min_run_time)
                )
        times = {key: statistics.median(values) for key, values in samples.items()}
        rows.append((shape, times, shape.floor_bytes() / bandwidth))
        print(f"{shape.name}: oplib fwd {times['oplib', 'fwd'] * 1e3:.1f} ms, fwd+bwd {times['oplib', 'fwd+bwd'] * 1e3:.1f} ms; "
              f"unfold fwd {times['unfold', 'fwd'] * 1e3:.1f} ms, fwd+bwd {times['unfold', 'fwd+bwd'] * 1e3:.1f} ms", flush=True)
    for shape, times, _ in rows:
        for label, _ in CANDIDATES:
            times[label, "peak"] = peak_memory(shape, label)
    return rows


def run_cuda(shapes, min_run_time: float):
    rows = []
    for shape in shapes:
        torch.manual_seed(0)
        x, w = shape.tensors("cuda", requires_grad=False)
        depthwise_weight = torch.randn(shape.channels, 1, shape.kernel, shape.kernel, device="cuda")
        times = {}
        for label, fn, weight in (("oplib", _oplib, w), ("unfold", _unfold_involution, w), ("depthwise conv", _depthwise, depthwise_weight)):
            env = dict(fn=fn, x=x, w=weight, shape=shape)
            times[label] = Timer("fn(x, w, shape)", globals=env).blocked_autorange(min_run_time=min_run_time).median
        rows.append((shape, times))
    return rows


def _markdown(cpu_rows, cuda_rows, bandwidth, failures, args) -> str:
    lines = [
        "# Involution: oplib vs the unfold formulation",
        "",
        f"Written by `python bench/involution.py{' --quick' if args.quick else ''}` on {datetime.date.today()}.",
        "",
        f"- machine: {describe()}",
        f"- copy bandwidth measured in this run: {bandwidth / 1e9:.1f} GB/s (bytes read + written)",
        f"- float32, K = 7, 16 channels per group, padding 3; times: median over {1 if args.quick else args.rounds} interleaved rounds",
        "  of torch.utils.benchmark blocked_autorange medians; peak = highest resident memory above the",
        "  inputs during one forward+backward (measured after the timings, each in a fresh process)",
        "",
        "## CPU",
        "",
        "| shape | batch | oplib fwd (ms) | unfold fwd (ms) | oplib fwd+bwd (ms) | unfold fwd+bwd (ms) | fwd+bwd speed-up | oplib peak (MB) | unfold peak (MB) | peak ratio | memory floor (ms) | oplib fwd / floor |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for shape, t, floor in cpu_rows:
        speedup = t["unfold", "fwd+bwd"] / t["oplib", "fwd+bwd"]
        peak_ratio = t["oplib", "peak"] / max(1, t["unfold", "peak"])
        lines.append(
            f"| {shape.name} | {shape.batch} | {t['oplib', 'fwd'] * 1e3:.1f} | {t['unfold', 'fwd'] * 1e3:.1f} | "
            f"{t['oplib', 'fwd+bwd'] * 1e3:.1f} | {t['unfold', 'fwd+bwd'] * 1e3:.1f} | **{speedup:.1f}x** | "
            f"{t['oplib', 'peak'] / 1e6:.0f} | {t['unfold', 'peak'] / 1e6:.0f} | **{peak_ratio:.2f}** | "
            f"{floor * 1e3:.2f} | {t['oplib', 'fwd'] / floor:.1f}x |"
        )
    lines += ["", "Bar: fwd+bwd speed-up >= 10x and peak ratio <= 0.25 at every shape: "
              + ("**met**." if not failures else f"**not met** at {', '.join(failures)}."), ""]
    if cuda_rows:
        lines += ["## CUDA (forward)", "", "| shape | oplib (ms) | unfold (ms) | depthwise 7x7 conv (ms) |", "|---|---:|---:|---:|"]
        for shape, t in cuda_rows:
            lines.append(f"| {shape.name} | {t['oplib'] * 1e3:.3f} | {t['unfold'] * 1e3:.3f} | {t['depthwise conv'] * 1e3:.3f} |")
    else:
        lines += ["## CUDA", "", "Not run: no GPU on this machine (torch.cuda.is_available() is False)."]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="two small shapes, short timings")
    parser.add_argument("--threads", type=int, default=os.cpu_count())
    parser.add_argument("--rounds", type=int, default=3, help="interleaved timing rounds (median kept)")
    parser.add_argument("--output", type=Path, default=None, help="markdown file (default bench/results/involution[-quick].md)")
    parser.add_argument("--peak", nargs=3, metavar=("SHAPE", "BATCH", "CANDIDATE"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.peak:
        print(_measure_peak(*args.peak, args.threads))
        return 0
    torch.set_num_threads(args.threads)
    shapes = QUICK_SHAPES if args.quick else SHAPES
    min_run_time = 0.2 if args.quick else 1.0
    bandwidth = copy_bandwidth()
    print(f"{describe()}\ncopy bandwidth {bandwidth / 1e9:.1f} GB/s", flush=True)
    cpu_rows = run_cpu(shapes, min_run_time, bandwidth, 1 if args.quick else args.rounds)
    cuda_rows = run_cuda(shapes, min_run_time) if torch.cuda.is_available() else []
    failures = [
        shape.name
        for shape, t, _ in cpu_rows
        if t["unfold", "fwd+bwd"] / t["oplib", "fwd+bwd"] < 10 or t["oplib", "peak"] > t["unfold", "peak"] / 4
    ]
    report = _markdown(cpu_rows, cuda_rows, bandwidth, failures, args)
    output = args.output or RESULTS / ("involution-quick.md" if args.quick else "involution.md")
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(report)
    print(report)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
