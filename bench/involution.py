"""Involution at RedNet-50's shapes: oplib vs the unfold formulation of the paper's reference code.

    python bench/involution.py            # full run, writes bench/results/involution.md
    python bench/involution.py --quick    # two small shapes, short timings (smoke test)

CPU: forward and forward+backward time, peak extra memory of one forward+backward, and the
forward's distance from the memory floor: (bytes of input + weight + output) / (copy bandwidth
measured in this run). The bar: forward+backward at least 10x faster than unfold and at most
1/4 of its peak memory at every shape. A second CPU table times each of the three ops on
both CPU paths (native, where it builds, and plain PyTorch) against its depthwise yardstick
(a depthwise convolution of the same kernel): the depthwise forward for the forward and
grad_weight (the same multiply-adds), the depthwise input gradient for grad_input. With a GPU,
the CUDA stages of bench/_cuda.py follow (the kernels against their DRAM floor, unfold and a
depthwise F.conv2d of the same kernel; the Involution2d layer; the launch path; RedNet-50
against ResNet-50); ``--cuda-only`` runs them alone, ``--cuda-stage STAGE`` one of them into
its own file (tools/gpu_check.py, ``make gpu-check``, runs each so), and ``--dry`` runs them
on the CPU, the CUDA kernels emulated (a check that they run, not figures). With
``--baseline-rev REV``, a third CPU table times the native kernels of this tree against those
of git revision REV (built by REV's own oplib), every entry point, interleaved: the A/B of a
change to the native sources; ``--ab-only`` runs that table alone, with more rounds, into
``bench/results/native-ab.md``. The shapes, the candidates and
their interleaved timing come from oplib.benchmark (which ``python -m oplib bench`` runs for
users); load monitoring, peak memory and the report from bench/_harness.py. Beside the
markdown: the run's data (involution.json) and charts (involution-cpu.png, and
involution-cuda.png with a GPU).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from types import ModuleType
from typing import Optional

import torch

import _harness
from _harness import Section, megabytes
from oplib.benchmark import (
    OPLIB, REDNET50_SHAPES, UNFOLD, YARDSTICK, Involution, Shape, Timing, call, cpu_model, depthwise_stmts, ratio,
)
from oplib.kernels import native
from oplib.kernels.involution import cpu as involution_cpu

MIN_SPEEDUP = 10  # fwd+bwd time of unfold / oplib, at least
MAX_PEAK_RATIO = 0.25  # peak memory of oplib / unfold, at most

QUICK_SHAPES = [Shape("stage4 512@7 s1", 512, 7, 7, 1, batch=2), Shape("stage3 256@28 s2", 256, 28, 28, 2, batch=2)]

# The first CPU table: two candidates, each timed forward and forward+backward.
CANDIDATES = {candidate.name: candidate for candidate in (OPLIB, UNFOLD)}
MODES = ("forward", "forward+backward")


def _fwd_bwd_step(shape: Shape, label: str) -> Callable[[], None]:
    """One forward+backward of a candidate (for the peak, in a fresh process)."""
    return CANDIDATES[label].stmts(shape, shape.inputs(), ["forward+backward"])[label, "forward+backward"].run


def copy_bandwidth(section: Section) -> float:
    """Bytes per second read + written by a large tensor copy (256 MiB each way)."""
    src = torch.randn(64 << 20)
    dst = torch.empty_like(src)
    seconds = section.measure("copy 256 MiB", {"copy": call(dst.copy_, src)})["copy"].median
    return 2 * src.numel() * 4 / seconds


@dataclass
class _Row:
    shape: Shape
    times: dict[tuple[str, str], Timing]  # (candidate, mode)
    floor_seconds: float
    peaks: Optional[dict[str, int]] = None

    @property
    def speedup(self) -> float:
        return ratio(self.times["unfold", "forward+backward"], self.times["oplib", "forward+backward"])

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
        inputs = shape.inputs()
        stmts = {key: stmt for candidate in CANDIDATES.values() for key, stmt in candidate.stmts(shape, inputs, MODES).items()}
        rows.append(_Row(shape, section.measure(shape.name, stmts), shape.floor_bytes() / bandwidth))
    for row in rows:
        row.peaks = {label: _harness.peak_memory(_fwd_bwd_step, row.shape, label) for label in CANDIDATES}
    return rows


# The second CPU table: each op on each CPU path (the native one where it builds).
PER_OP = ("forward", "grad_input", "grad_weight")
PYTORCH = Involution(
    "pytorch",
    involution_cpu.pytorch_involution,
    involution_cpu.pytorch_involution_backward_input,
    involution_cpu.pytorch_involution_backward_weight,
)


def run_per_op(section: Section, shapes: list[Shape]) -> list[tuple[Shape, dict[tuple[str, str], Timing]]]:
    """Each op on each CPU path and its depthwise yardstick, interleaved per shape."""
    try:
        module = native.build()
    except Exception as error:  # noqa: BLE001  (the table says why the native column is empty)
        print(f"native CPU kernels not built: {error}", flush=True)
        module = None
    paths = [PYTORCH]
    if module is not None:
        kernels = (module.involution_forward, module.involution_backward_input, module.involution_backward_weight)
        paths.append(Involution("native", *kernels))
    rows = []
    for shape in shapes:
        inputs = shape.inputs()
        stmts = depthwise_stmts(shape, inputs, PER_OP)
        for path in paths:
            stmts |= path.stmts(shape, inputs, PER_OP)
        rows.append((shape, section.measure(f"per op {shape.name}", stmts)))
    return rows


# The layout table: the forward through the op with channels_last operands, against NCHW.
LAYOUTS = ("NCHW", "channels_last input", "channels_last input, pixel-major weight")


def run_layouts(section: Section, shapes: list[Shape]) -> list[tuple[Shape, dict]]:
    """torch.ops.oplib.involution on NCHW operands; on a channels_last input with the NCHW
    weight; and on a channels_last input with the pixel-major weight, (N, Ho, Wo, G, K, K)
    in memory, that a channels_last model's span convolution writes. Interleaved per shape."""
    rows = []
    for shape in shapes:
        inputs = shape.inputs()
        x, w = inputs.input, inputs.weight
        x_last = x.contiguous(memory_format=torch.channels_last)
        w_pixel_major = w.permute(0, 4, 5, 1, 2, 3).contiguous().permute(0, 3, 4, 5, 1, 2)
        operands = dict(zip(LAYOUTS, ((x, w), (x_last, w), (x_last, w_pixel_major))))
        stmts = {(layout, "forward"): call(torch.ops.oplib.involution, a, b, *shape.params) for layout, (a, b) in operands.items()}
        rows.append((shape, section.measure(f"layouts {shape.name}", stmts)))
    return rows


# RedNet-50 whole, NCHW against channels_last (model and images converted, as PyTorch's
# channels_last advice has it): eager inference under no_grad and an SGD training step.
MODEL_LAYOUTS = ("NCHW", "channels_last")


def run_model_layouts(section: Section, batch: int, size: int) -> dict:
    """RedNet-50's eager inference and training step in both layouts, interleaved."""
    from oplib.models import rednet50

    fmt = {"NCHW": torch.contiguous_format, "channels_last": torch.channels_last}
    stmts = {}
    for layout in MODEL_LAYOUTS:
        torch.manual_seed(0)
        model = rednet50().to(memory_format=fmt[layout])
        images = torch.randn(batch, 3, size, size).contiguous(memory_format=fmt[layout])
        labels = torch.randint(0, 1000, (batch,))
        optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)

        def infer(model=model, images=images):
            model.eval()
            with torch.no_grad():
                return model(images)

        def train(model=model, images=images, labels=labels, optimizer=optimizer):
            model.train()
            optimizer.zero_grad(set_to_none=True)
            torch.nn.functional.cross_entropy(model(images), labels).backward()
            optimizer.step()

        stmts[layout, "inference"], stmts[layout, "train"] = call(infer), call(train)
    return section.measure(f"RedNet-50 layouts, batch {batch}", stmts)


def _model_layout_table(times: dict, batch: int) -> list[str]:
    cells = []
    for mode in ("inference", "train"):
        base, last = times["NCHW", mode], times["channels_last", mode]
        cells.append([mode, str(batch), f"{batch / base.median:.2f}", f"{batch / last.median:.2f}",
                      f"{ratio(last, base):.2f}x"])
    return _harness.table(("RedNet-50, eager", "batch", "NCHW (img/s)", "channels_last (img/s)",
                           "channels_last time / NCHW"), "lrrrr", cells)


def _layout_table(rows: list[tuple[Shape, dict]]) -> list[str]:
    cells = []
    for shape, times in rows:
        base = times["NCHW", "forward"]
        row = [shape.name, f"{base.median * 1e3:.2f}"]
        for layout in LAYOUTS[1:]:
            timing = times[layout, "forward"]
            row.append(f"{timing.median * 1e3:.2f} ({ratio(timing, base):.2f}x)")
        cells.append(row)
    return _harness.table(("shape", "NCHW (ms)", *(f"{layout} (ms, / NCHW)" for layout in LAYOUTS[1:])), "lrrr", cells)


# The A/B table: every entry point of the native module, this tree's against a revision's.
NATIVE_OPS = ("forward", "grad_input", "grad_weight", "generated forward", "generated grad_input")


def baseline_module(rev: str) -> ModuleType:
    """The native module of git revision ``rev``, built by that revision's own oplib (in a
    subprocess, from ``git archive``) and imported here beside this tree's."""
    workdir = _harness.checkout(rev)
    script = "from oplib.kernels import native; print(native.involution().__file__)"
    env = dict(os.environ, PYTHONPATH=str(workdir), OPLIB_CPU_KERNELS="native")
    result = subprocess.run([sys.executable, "-c", script], cwd=workdir, env=env, capture_output=True, text=True, check=True)
    return native.load_module(Path(result.stdout.strip().splitlines()[-1]))


def _native_stmts(label: str, module: ModuleType, shape: Shape, inputs, generator) -> dict:
    x, w, grad = inputs.input, inputs.weight, inputs.grad_output
    kernel, params = [shape.kernel] * 2, shape.params
    size = [shape.height, shape.width]
    feature, span, bias = generator
    calls = {
        "forward": ("involution_forward", (x, w, *params)),
        "grad_input": ("involution_backward_input", (grad, w, size, *params)),
        "grad_weight": ("involution_backward_weight", (grad, x, kernel, *params, shape.groups)),
        "generated forward": ("involution_generated_forward", (x, feature, span, bias, kernel, *params)),
        "generated grad_input": ("involution_generated_backward_input", (grad, feature, span, bias, size, kernel, *params)),
    }
    # A revision from before an entry point has none: its pair is left out of the table.
    return {(label, op): call(getattr(module, name), *args) for op, (name, args) in calls.items() if hasattr(module, name)}


# The A/B compares two builds of the same code: each op's pair is timed back to back (short
# readings, many rounds), so that drift between readings seconds apart does not swamp a few
# per cent. Measured with the section-wide interleaving (1 s readings, 10 statements a round)
# the same binaries' ratios scattered from 0.7 to 1.3.
AB_ROUNDS, AB_MIN_RUN_TIME = 15, 0.2
# --ab-only: the A/B alone, long enough to tell a few per cent.
AB_LONG_ROUNDS = 41


def run_native_ab(settings, shapes: list[Shape], baseline: ModuleType, rounds: int = AB_ROUNDS) -> tuple[Section, list[tuple[Shape, dict]]]:
    """This tree's native entry points and the baseline's, each op's pair interleaved on its
    own (generation branch: C/4 reduced channels, as RedNet's)."""
    section = Section(settings, min_run_time=AB_MIN_RUN_TIME if not settings.quick else None,
                      rounds=rounds if not settings.quick else None)
    current = native.build()
    rows = []
    for shape in shapes:
        inputs = shape.inputs()
        n, _, out_h, out_w = inputs.grad_output.shape
        reduced = shape.channels // 4
        generator = (torch.randn(n, reduced, out_h, out_w), torch.randn(shape.groups * shape.kernel**2, reduced),
                     torch.randn(shape.groups * shape.kernel**2))
        mine = _native_stmts("this tree", current, shape, inputs, generator)
        theirs = _native_stmts("baseline", baseline, shape, inputs, generator)
        times = {}
        for op in NATIVE_OPS:
            pair = {key: stmts[key] for stmts, key in ((mine, ("this tree", op)), (theirs, ("baseline", op))) if key in stmts}
            if op == "grad_weight":  # its yardstick, timed in the same rounds
                pair |= depthwise_stmts(shape, inputs, ["forward"])
            if ("baseline", op) in pair:
                times |= section.measure(f"native A/B {shape.name} {op}", pair)
        rows.append((shape, times))
    return section, rows


def _ab_description(rev: str, rounds: int) -> str:
    return (
        f"Each entry point of the native module, called directly, in ms: this tree / revision {rev} (built by that "
        "revision's own oplib), and in brackets the median of the per-round ratios (below 1: this tree is faster). "
        f"Each op's pair is timed on its own, back to back, in {rounds} rounds of {AB_MIN_RUN_TIME:g} s readings. "
        "Generated ops: C/4 reduced channels; -: the revision has no such entry point. grad_weight / depthwise fwd: "
        "each build's grad_weight against the depthwise forward timed in the same rounds (its yardstick)."
    )


def _native_ab_table(rows: list[tuple[Shape, dict]]) -> list[str]:
    cells = []
    for shape, times in rows:
        row = [shape.name]
        for op in NATIVE_OPS:
            if ("baseline", op) not in times:
                row.append("-")
                continue
            mine, theirs = times["this tree", op], times["baseline", op]
            row.append(f"{mine.median * 1e3:.2f} / {theirs.median * 1e3:.2f} ({ratio(mine, theirs):.3f})")
        depthwise = times["depthwise", "forward"]
        row.append(" / ".join(f"{ratio(times[who, 'grad_weight'], depthwise):.2f}x" for who in ("this tree", "baseline")))
        cells.append(row)
    columns = ("shape", *NATIVE_OPS, "grad_weight / depthwise fwd")
    return _harness.table(columns, "l" + "r" * (len(columns) - 1), cells)


def _per_op_table(rows: list[tuple[Shape, dict[tuple[str, str], Timing]]]) -> list[str]:
    cells = []
    for shape, times in rows:
        row = [shape.name]
        for op in PER_OP:
            for path in ("native", "pytorch"):
                timing, yardstick = times.get((path, op)), times["depthwise", YARDSTICK[op]]
                row.append("-" if timing is None else f"{timing.median * 1e3:.2f} ({ratio(timing, yardstick):.1f}x)")
        row += [f"{times['depthwise', op].median * 1e3:.2f}" for op in ("forward", "grad_input")]
        cells.append(row)
    columns = ("shape", "forward native", "forward pytorch", "grad_input native", "grad_input pytorch",
               "grad_weight native", "grad_weight pytorch", "depthwise fwd (ms)", "depthwise grad_input (ms)")  # fmt: skip
    return _harness.table(columns, "lrrrrrrrr", cells)


def _cpu_table(rows: list[_Row]) -> list[str]:
    def ms(row: _Row, label: str, mode: str) -> str:
        return f"{row.times[label, mode].median * 1e3:.1f}"

    def kernels(shape: Shape) -> str:
        """The CPU path the ops took (OPLIB_CPU_KERNELS), with the plain-PyTorch strategy."""
        return "native" if native.involution() is not None else f"pytorch ({shape.cpu_strategy})"

    cells = [
        (
            row.shape.name, row.shape.batch, kernels(row.shape), ms(row, "oplib", "forward"), ms(row, "unfold", "forward"),
            ms(row, "oplib", "forward+backward"), ms(row, "unfold", "forward+backward"), f"**{row.speedup:.1f}x**",
            megabytes(row.peaks["oplib"]), megabytes(row.peaks["unfold"]), f"**{row.peak_ratio:.2f}**",
            f"{row.floor_seconds * 1e3:.2f}", f"{row.times['oplib', 'forward'].median / row.floor_seconds:.1f}x",
        )  # fmt: skip
        for row in rows
    ]
    columns = ("shape", "batch", "CPU kernels", "oplib fwd (ms)", "unfold fwd (ms)", "oplib fwd+bwd (ms)", "unfold fwd+bwd (ms)",
               "fwd+bwd speed-up", "oplib peak (MB)", "unfold peak (MB)", "peak ratio", "memory floor (ms)",
               "oplib fwd / floor")  # fmt: skip
    return _harness.table(columns, "lrlrrrrrrrrrr", cells)


def _cpu_report(settings, cpu: Section, cpu_rows, bandwidth: float, verdict: str) -> list[str]:
    return [
        *_harness.header(
            settings,
            "Involution: oplib vs the unfold formulation",
            f"- copy bandwidth measured in this run: {bandwidth / 1e9:.1f} GB/s (bytes read + written)",
            "- float32, K = 7 (the stem's 3), 16 channels per group, padding K // 2; speed-up = median of the "
            "per-round unfold / oplib fwd+bwd ratios; peak = highest resident memory above the inputs during one "
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


_LAYOUTS_DESCRIPTION = (
    "torch.ops.oplib.involution with a channels_last input (the result is channels_last, written in place "
    "by the kernel), with the NCHW weight and with the pixel-major weight a channels_last model's span "
    "convolution writes (read in place where the map's width is a multiple of 7), in ms and as a ratio to "
    "the NCHW call (the median of the per-round ratios)."
)
MODEL_BATCH = 8


def main(argv: Optional[list[str]] = None) -> int:
    parser = _harness.parser(__doc__, rounds=3, min_run_time=1.0)
    parser.add_argument(
        "--baseline-rev", metavar="REV",
        help="also time this tree's native CPU kernels against those of git revision REV (a third CPU table)",
    )
    parser.add_argument(
        "--ab-only", action="store_true",
        help="with --baseline-rev: only the native A/B, with --rounds rounds (default 41), to bench/results/native-ab.md",
    )
    parser.add_argument(
        "--layouts-only", action="store_true",
        help="only the channels_last tables (the op, and RedNet-50 whole), to bench/results/channels-last.md",
    )
    parser.add_argument(
        "--cuda-only", action="store_true",
        help="only the CUDA tables, written to bench/results/involution-cuda.md by default",
    )
    parser.add_argument(
        "--cuda-stage", choices=("all", *CUDA_STAGES), default="all",
        help="with --cuda-only: one CUDA stage alone, to bench/results/<its file> by default (make gpu-check runs "
             "each so): " + ", ".join(f"{stage} -> {name}" for stage, name in CUDA_STAGE_FILES.items()),
    )
    parser.add_argument(
        "--dry", action="store_true",
        help="with --cuda-only: run the CUDA stages on the CPU (kernels emulated, tiny sizes; tools/gpu_check.py "
             "--dry); needs an --output outside bench/results/",
    )
    parser.add_argument(
        "--cuda-models", choices=("all", "eager", "none"), default="all",
        help="the RedNet-50 vs ResNet-50 table on CUDA: eager and compiled (default), eager only, or none",
    )
    args = parser.parse_args(argv)
    if args.ab_only:
        if not args.baseline_rev:
            parser.error("--ab-only: name the revision to compare with, --baseline-rev REV")
        args.output = args.output or _harness.RESULTS / "native-ab.md"
        settings = _harness.start(args, __file__)
        rounds = args.rounds or AB_LONG_ROUNDS
        section, rows = run_native_ab(settings, REDNET50_SHAPES if not settings.quick else QUICK_SHAPES,
                                      baseline_module(args.baseline_rev), rounds)
        lines = [
            *_harness.header(settings, f"Native CPU kernels: this tree against revision {args.baseline_rev}"),
            _ab_description(args.baseline_rev, rounds),
            "",
            section.load_line(),
            "",
            *_native_ab_table(rows),
        ]
        _harness.write_report(settings, lines)
        return 0
    if args.layouts_only:
        args.output = args.output or _harness.RESULTS / "channels-last.md"
        settings = _harness.start(args, __file__)
        layouts = Section(settings)
        layout_rows = run_layouts(layouts, QUICK_SHAPES if settings.quick else REDNET50_SHAPES)
        models = Section(settings)
        batch, size = (2, 64) if settings.quick else (MODEL_BATCH, 224)
        model_times = run_model_layouts(models, batch, size)
        lines = [
            *_harness.header(settings, "Involution on CPU: channels_last against NCHW"),
            _LAYOUTS_DESCRIPTION,
            "",
            layouts.load_line(),
            "",
            *_layout_table(layout_rows),
            "",
            f"## RedNet-50 whole, eager, {size}x{size} RGB: channels_last against NCHW",
            "",
            "The model and the images converted to each layout (`model.to(memory_format=...)`); inference: eval "
            "mode under no_grad; train: forward, cross-entropy, backward and an SGD step. The last column is the "
            "median of the per-round ratios of the times (above 1: channels_last is slower). Involution's CPU "
            f"kernels: {native.status()}.",
            "",
            models.load_line(),
            "",
            *_model_layout_table(model_times, batch),
        ]
        _harness.write_report(settings, lines)
        return 0
    if args.dry and not args.cuda_only:
        parser.error("--dry: only with --cuda-only")
    if args.cuda_only:
        if args.dry:
            if args.output is None or _harness.RESULTS in args.output.resolve().parents:
                parser.error("--dry: its figures are the CPU's; name an --output outside bench/results/")
        elif not torch.cuda.is_available():
            parser.error("--cuda-only: no GPU (torch.cuda.is_available() is False)")
        name = CUDA_STAGE_FILES[args.cuda_stage]
        args.output = args.output or _harness.RESULTS / (name.replace(".md", "-quick.md") if args.quick else name)
        return run_cuda_only(_harness.start(args, __file__), args.cuda_models, args.cuda_stage, args.dry)
    settings = _harness.start(args, __file__)
    shapes = QUICK_SHAPES if settings.quick else REDNET50_SHAPES
    cpu = Section(settings)
    bandwidth = copy_bandwidth(cpu)
    print(f"copy bandwidth {bandwidth / 1e9:.1f} GB/s", flush=True)
    cpu_rows = run_cpu(cpu, shapes, bandwidth)
    per_op = Section(settings)
    per_op_rows = run_per_op(per_op, shapes)
    layouts = Section(settings)
    layout_rows = run_layouts(layouts, shapes)
    native_ab, ab_rows = (
        run_native_ab(settings, shapes, baseline_module(args.baseline_rev)) if args.baseline_rev else (None, [])
    )
    cuda = run_cuda(settings, args.cuda_models) if torch.cuda.is_available() else CudaResults()
    failures = [row.shape.name for row in cpu_rows if row.failed]
    verdict = "**met**." if not failures else f"**not met** at {', '.join(failures)}."
    lines = _cpu_report(settings, cpu, cpu_rows, bandwidth, verdict)
    lines += [
        "## CPU, per op: native and plain-PyTorch kernels vs a depthwise convolution",
        "",
        "Each op's time in ms and, in brackets, its ratio (median of the per-round ratios) to its "
        "yardstick: the depthwise forward for the forward and grad_weight, the depthwise input "
        "gradient for grad_input. The ops themselves take the native path (OPLIB_CPU_KERNELS=auto, "
        "the default) where it builds, as in the table above.",
        "",
        per_op.load_line(),
        "",
        *_per_op_table(per_op_rows),
        "",
    ]
    lines += [
        "## CPU, channels_last: the forward through the op against NCHW",
        "",
        _LAYOUTS_DESCRIPTION,
        "",
        layouts.load_line(),
        "",
        *_layout_table(layout_rows),
        "",
    ]
    if ab_rows:
        lines += [
            f"## CPU, native kernels: this tree against revision {args.baseline_rev}",
            "",
            _ab_description(args.baseline_rev, AB_ROUNDS),
            "",
            native_ab.load_line(),
            "",
            *_native_ab_table(ab_rows),
            "",
        ]
    if cuda.rows:
        lines += _cuda_sections(cuda, CUDA_STAGES, torch.cuda.get_device_name(), cuda_plan(settings, False), args.cuda_models)
    else:
        lines += ["## CUDA", "", "Not run: no GPU on this machine (torch.cuda.is_available() is False)."]
    _harness.write_report(settings, lines)
    _charts(settings, cpu_rows, per_op_rows, cuda.rows or [])
    return 1 if failures else 0


# The CUDA stages (bench/_cuda.py), in the order a run takes them, and the file each writes when
# run alone (--cuda-only --cuda-stage STAGE; tools/gpu_check.py runs each so, in a process of its
# own). "all" writes every section into involution-cuda.md.
CUDA_STAGES = ("kernels", "layer", "launch", "tuning", "models")
CUDA_STAGE_FILES = {"kernels": "involution-cuda.md", "layer": "involution-cuda-layer.md",
                    "launch": "involution-cuda-launch.md", "tuning": "involution-cuda-tuning.md",
                    "models": "involution-cuda-models.md", "all": "involution-cuda.md"}  # fmt: skip


@dataclass
class CudaResults:
    """What the CUDA stages measured so far (None: not run, or not yet)."""

    bandwidth: Optional[float] = None
    rows: Optional[list[dict]] = None
    layer: Optional[list[list[str]]] = None
    layer_load: str = ""
    tiny: Optional[dict[str, float]] = None
    models: Optional[list[list[str]]] = None
    model_profiles: Optional[list[list[str]]] = None  # the models' steps under torch.profiler
    tuning: Optional[list[list[str]]] = None  # RedNet-50 tuned and not, beside ResNet-50
    tuning_choices: Optional[list[list[str]]] = None  # what tuning chose, per op and signature
    dry: bool = False


def cuda_plan(settings, dry: bool):
    """The sizes: a dry run's, --quick's (two small shapes, the models small) or the GPU's."""
    import _cuda

    if dry:
        return _cuda.DRY
    if settings.quick:
        return replace(_cuda.GPU, shapes=tuple(QUICK_SHAPES), model_rows=tuple(
            (task, mode, 2) for task, mode, batch in _cuda.MODEL_ROWS if batch == _cuda.BATCH), image_size=64)
    return _cuda.GPU


def run_cuda(settings, models_choice: str, report: Callable[[CudaResults], object] = lambda results: None,
             stages: Sequence[str] = CUDA_STAGES, dry: bool = False) -> CudaResults:
    """The CUDA ``stages`` in order: the kernels, the layer, the launch path at a tiny shape,
    the models (their modes: ``--cuda-models``), after loading every kernel. ``report`` sees the
    results so far after each stage and each row of one. ``dry``: on the CPU (bench/_cuda.py)."""
    import _cuda

    target = _cuda.Target.dry() if dry else _cuda.Target.cuda()
    plan = cuda_plan(settings, dry)
    results = CudaResults(dry=dry)
    start = time.perf_counter()
    target.load_kernels()
    print(f"kernels loaded in {time.perf_counter() - start:.1f} s", flush=True)
    if "kernels" in stages:

        def kernel_rows(bandwidth: float, rows: list[dict]) -> None:
            results.bandwidth, results.rows = bandwidth, rows
            report(results)

        _cuda.run_kernels(plan.shapes, kernel_rows, target, plan)
    if "layer" in stages:
        section = Section(settings, min_run_time=plan.layer_min_run_time, rounds=plan.layer_rounds)

        def layer_rows(rows: list[list[str]]) -> None:
            results.layer, results.layer_load = rows, section.load_line()
            report(results)

        _cuda.run_layer(section, target, plan, layer_rows)
    if "launch" in stages:
        results.tiny = _cuda.run_tiny(target, plan)
        report(results)
    if "tuning" in stages:

        def tuning_rows(rows: list[list[str]], choices: list[list[str]]) -> None:
            results.tuning, results.tuning_choices = rows, choices
            report(results)

        results.tuning, results.tuning_choices = _cuda.run_tuning(target, plan, tuning_rows)
        report(results)
    if "models" in stages:

        def model_rows(rows: list[list[str]], profiles: list[list[str]]) -> None:
            results.models, results.model_profiles = rows, profiles
            report(results)

        results.models, results.model_profiles = _cuda.run_models(target, plan, _cuda.MODEL_MODES[models_choice],
                                                                  model_rows)
        report(results)
    return results


def run_cuda_only(settings, models_choice: str, stage: str = "all", dry: bool = False) -> int:
    """The CUDA tables alone: every stage (``stage`` "all"), or one (``make gpu-check`` runs
    each in a process of its own). The report is rewritten after each stage and each row, so a
    run cut short (a device lease ending) still leaves what it finished."""
    stages = CUDA_STAGES if stage == "all" else (stage,)
    target_name = f"dry run on the CPU ({cpu_model()}), the CUDA kernels emulated" if dry else torch.cuda.get_device_name()
    plan = cuda_plan(settings, dry)
    bullets = [f"- run with `--cuda-only{'' if stage == 'all' else f' --cuda-stage {stage}'}` (`make gpu-check`)"]
    if dry:
        bullets.append("- **`--dry`: CPU tensors, the CUDA kernels emulated on the host, perf_counter in place of CUDA "
                       "events, tiny sizes: a check that every stage runs, not GPU figures**")
    if stage in ("all", "kernels"):
        bullets.append("- the kernels' figures before the specialised kernels: `involution-cuda-before.md`")
    # Each stage times in its own way, which its section states; the settings' readings are not used.
    times = (f"the kernels by one replay of a CUDA graph of {plan.repeats} calls between CUDA events, {plan.rounds} "
             "interleaved rounds; the layer by `oplib.benchmark`'s CUDA clock (blocks of graph replays, readings of "
             f"{plan.layer_min_run_time:g} s, {plan.layer_rounds} interleaved rounds); the launch and the models in "
             "wall time, as their sections say")
    header = _harness.header(settings, _CUDA_TITLES[stage], *bullets, times=times)

    def write(results: CudaResults) -> None:
        _harness.write_report(settings, [*header, *_cuda_sections(results, stages, target_name, plan, models_choice)])

    results = run_cuda(settings, models_choice, write, stages, dry)
    write(results)
    if results.rows:
        _charts(settings, [], [], results.rows, target_name)
    return 0


_CUDA_TITLES = {
    "all": "Involution on CUDA: each kernel against its DRAM floor, the layer, the launch path and the models",
    "kernels": "Involution on CUDA: each kernel against its DRAM floor",
    "layer": "Involution on CUDA: the Involution2d layer against a depthwise convolution",
    "launch": "Involution on CUDA: the launch path at a tiny shape",
    "tuning": "Involution on CUDA: RedNet-50 with its kernels tuned",
    "models": "Involution on CUDA: RedNet-50 against ResNet-50",
}


def _cuda_report(bandwidth: float, rows: list[dict], tiny: Optional[dict[str, float]],
                 models: Optional[list[list[str]]], layer: Optional[list[list[str]]] = None) -> list[str]:
    """The CUDA sections of a GPU run (kernels, layer, launch path, models); a stage not run
    yet (None) says so."""
    import _cuda

    results = CudaResults(bandwidth, rows, layer, "", tiny, models)
    return _cuda_sections(results, CUDA_STAGES, torch.cuda.get_device_name(), _cuda.GPU, "all")


def _cuda_sections(results: CudaResults, stages: Sequence[str], target_name: str, plan, models_choice: str) -> list[str]:
    lines = []
    for stage in stages:
        lines += _CUDA_SECTIONS[stage](results, target_name, plan, models_choice)
    return lines


def _kernel_section(results: CudaResults, target_name: str, plan, models_choice: str) -> list[str]:
    import _cuda

    title = f"## CUDA: each kernel's device time against its DRAM floor ({target_name})"
    if not results.rows:
        return [title, "", "Not run: the run stopped first.", ""]
    rows = results.rows
    worst = max(row["over_floor"] for row in rows)
    columns, cells = _cuda.kernel_table(rows)
    return [
        title,
        "",
        f"Batch {rows[0]['batch']}, K = 7 (the stem's 3), 16 channels per group, padding K // 2. Device time: "
        f"{plan.repeats} calls in one "
        "CUDA graph, replayed between CUDA events (no host time); the median of "
        f"{plan.rounds} interleaved rounds. Floor: the bytes a kernel must read and write once over the "
        f"device-to-device copy bandwidth measured in this run, {results.bandwidth / 1e9:.0f} GB/s. Generic (before): the "
        "same call on the generic kernels; for the generated forward (involution_generated, a feature map of C/4 "
        "channels; floor: input, feature map and output), the path it replaces, the span conv writing the weight "
        "then the involution forward; for the generated grad_input (involution_generated_backward_input, through the "
        "span conv's map and involution's grad_input kernel; floor: grad_output, feature map and grad_input), its "
        "generic kernel, which forms the weights in registers; for the generator grads "
        "(involution_generated_backward_generator, the fused path's gradients of the feature, span_weight and "
        "span_bias; floor: grad_output, input, feature map and grad_feature), the map route (the float32 map by "
        "involution's grad_weight kernels, then cuBLAS's contractions), the op's CUDA path until the tensor-core "
        "kernel (its \"tensor cores\" column, bfloat16) becomes it. Wall: host seconds per call, many calls then one "
        "synchronise.",
        "",
        f"Bar: every kernel within 2x its floor: **{'met' if worst <= 2 else 'not met'}** (worst {worst:.2f}x).",
        "",
        *_harness.table(columns, "llll" + "r" * (len(columns) - 4), cells),
        "",
    ]


def _layer_section(results: CudaResults, target_name: str, plan, models_choice: str) -> list[str]:
    import _cuda

    title = f"## CUDA: the Involution2d layer against a depthwise convolution ({target_name})"
    if not results.layer:
        return [title, "", "Not run: the run stopped first.", ""]
    columns = _cuda.layer_columns()
    return [
        title,
        "",
        "`oplib.nn.Involution2d(C, 7, stride, group_channels=16)` with the weight generated inside the op "
        "(`fused=True`: involution_generated) and written by the span conv (`fused=False`: span conv + involution; "
        "\"unfused, LAST\": the same under the `LAST` launch policy, a lane a 16-byte vector of a group's channels in "
        "channels_last calls, not yet the ops' policy; \"fused, tuned\" and \"unfused, tuned\": each path with oplib's "
        "kernels tuned, `set_cuda_tuning`, the fastest candidate kept at each signature), "
        f"against `torch.nn.Conv2d(C, C, 7, stride, groups=C)`, batch {plan.shapes[0].batch}, each module and its "
        "input in the row's dtype and memory format. fwd: eval mode under no_grad; fwd+bwd: train mode, a fixed "
        "grad_output backpropagated to the input and every parameter. Device time in ms (`oplib.benchmark`'s CUDA "
        f"clock: the calls captured in a CUDA graph, replayed between events), the median of {plan.layer_rounds} "
        "interleaved rounds; a ratio is the median of the per-round ratios.",
        "",
        results.layer_load,
        "",
        *_harness.table(columns, "ll" + "r" * (len(columns) - 2), results.layer),
        "",
    ]


def _launch_section(results: CudaResults, target_name: str, plan, models_choice: str) -> list[str]:
    import _cuda

    title = f"## CUDA: the launch path at a tiny shape ({target_name})"
    if results.tiny is None:
        return [title, "", "Not run: the run stopped first.", ""]
    oplib_tiny, bare_tiny = results.tiny[_cuda.OPLIB_TINY], results.tiny[_cuda.BARE_TINY]
    return [
        title,
        "",
        f"Wall time per call at input {_cuda.TINY['input']}, weight {_cuda.TINY['weight']}, {plan.tiny_calls} calls "
        f"then one synchronise, the median of {plan.rounds} interleaved rounds: oplib's involution "
        f"{oplib_tiny * 1e6:.1f} us; a bare custom op of the same schema that allocates its result and launches an "
        f"empty kernel (compiled by CuPy's NVRTC) through the same launcher, prepared once, {bare_tiny * 1e6:.1f} us: "
        f"{oplib_tiny / bare_tiny:.2f}x (bar: 1.3x, **{'met' if oplib_tiny <= 1.3 * bare_tiny else 'not met'}**).",
        "",
        *_harness.table(("call", "wall per call (us)", "/ bare"), "lrr", [
            ["oplib involution", f"{oplib_tiny * 1e6:.1f}", f"{oplib_tiny / bare_tiny:.2f}x"],
            ["bare custom op, empty kernel", f"{bare_tiny * 1e6:.1f}", "1.00x"],
            *([name, f"{results.tiny[key] * 1e6:.1f}", f"{results.tiny[key] / bare_tiny:.2f}x"]
              for key, name in ((_cuda.KERNEL_TINY, "oplib's CUDA kernel alone: its launch plans, no dispatcher"),
                                (_cuda.UNPLANNED_TINY, "oplib's host path without plans: rules, allocation, policy, "
                                                       "launch"))
              if key in results.tiny)]),
        "",
        *_plan_line(results.tiny.get(_cuda.PLAN_HELD)),
        *_step_lines(results.tiny),
    ]


def _step_lines(tiny: dict) -> list[str]:
    """The training-step rows of the launch stage (a run before them has none): where a layer's
    host time goes in a step whose host sets the pace."""
    import _cuda

    if _cuda.STEP_LAYER not in tiny:
        return []
    direct, conv, channels = tiny[_cuda.STEP_DIRECT], tiny[_cuda.STEP_CONV], _cuda.TINY["input"][1]
    rows = [[name, f"{tiny[key] * 1e6:.1f}", f"{tiny[key] / conv:.2f}x"] for key, name in (
        (_cuda.STEP_DIRECT, "the op, direct calls"),
        (_cuda.STEP_DISPATCHER, "the op, through the dispatcher"),
        (_cuda.STEP_LAYER, f"Involution2d({channels}, 7), unfused: the generation branch, the span conv and the op"),
        (_cuda.STEP_CONV, f"torch.nn.Conv2d({channels}, {channels}, 3): a ResNet bottleneck's convolution in its place"))]
    return [
        f"Per training step at the same input (forward + backward under bf16 autocast, the modules' input "
        f"channels_last, {_cuda.STEP_CALLS_SHARE}x fewer calls a reading): the op with direct calls / through the dispatcher "
        f"{direct / tiny[_cuda.STEP_DISPATCHER]:.2f}x; the layer / the convolution "
        f"{tiny[_cuda.STEP_LAYER] / conv:.2f}x. In a step the host sets the pace, each of RedNet-50's 17 involution "
        "layers costs the host the layer's row where ResNet-50 pays the convolution's.",
        "",
        *_harness.table(("step", "wall per step (us)", "/ the convolution's"), "lrr", rows),
        "",
    ]


def _plan_line(held: Optional[float]) -> list[str]:
    """Whether the op held a launch plan for the tiny call after the timed calls (a run before
    the parts were timed has no such entry)."""
    if held is None:
        return []
    if held != held:  # NaN: the op ran its CPU kernel (a dry run)
        return ["The op's launch plan: not applicable (the op ran on the CPU).", ""]
    return [f"The op's launch plan for this call after the timed calls: **{'held' if held else 'not held'}** "
            "(not held: every call took the whole host path).", ""]


def _models_section(results: CudaResults, target_name: str, plan, models_choice: str) -> list[str]:
    import _cuda

    title = f"## CUDA: RedNet-50 vs ResNet-50 (torch.nn), bf16 autocast, channels_last ({target_name})"
    if not results.models:
        return [title, "", "Not run (`--cuda-models none`, or the run stopped first).", ""]
    measured = {(row[0], row[1]) for row in results.models}
    batches = sorted({batch for _, _, batch in plan.model_rows})
    missing = [f"{task}, {mode} (batch {batch})" for task, mode, batch in plan.model_rows
               if mode in _cuda.MODEL_MODES[models_choice] and (f"{task}, {mode}", str(batch)) not in measured]
    return [
        title,
        "",
        "Train: forward + cross-entropy + backward + SGD step; inference under no_grad. compiled: `torch.compile"
        "(dynamic=False)`; reduce-overhead: `torch.compile(mode=\"reduce-overhead\", dynamic=False)` (inductor's CUDA "
        "graph trees)" + (" (this dry run: both through aot_eager)" if results.dry else "") + ". Wall time of "
        + ", ".join(f"{plan.steps(b)} steps at batch {b}" for b in batches)
        + f", after 3 warm-up steps (the compile among them), median of {plan.model_rounds} rounds."
        + (f" Not measured in this run: {', '.join(missing)}." if missing else ""),
        "",
        *_harness.table(("mode", "batch", "RedNet-50 (img/s)", "ResNet-50 (img/s)", "RedNet-50 / ResNet-50"),
                        "lrrrr", results.models),
        "",
        *_profile_lines(results),
    ]


def _profile_lines(results: CudaResults) -> list[str]:
    """The models' steps under torch.profiler (``_cuda.profile_steps``): where a step's time goes."""
    import _cuda

    if not results.model_profiles:
        return []
    return [
        "### Where a step's time goes",
        "",
        f"Each row's {_cuda.PROFILED_STEPS} steps after its timing, under torch.profiler, per step: the wall time "
        "(the timing's), the device time of what ran on the GPU (kernels, copies and fills; its share of the wall "
        "time: well under 1, the host set the pace), that device time by kind (oplib's kernels by their names; "
        "the others by the words of their names: `_cuda.DEVICE_KINDS`), the host's kernel launches (the runtime's, "
        "the driver's, CUDA graph replays), the aten ops the host ran (those inside others included), the host time "
        "inside oplib's ops (their children included: layout copies, CuPy's launches), "
        "the three kernels with the most device time"
        + (" (this dry run: no device; the three CPU ops with the most self time)" if results.dry else "")
        + ", the three host events with the most self time (aten ops, the runtime's and the driver's calls, "
        "the autograd engine's nodes: where a step whose device time is well under its wall time spends it), and "
        "the host's calls that wait for the GPU (synchronisations, blocking copies: `_cuda.WAIT_CALLS`; the "
        "profile's own last synchronisation not counted) with the host time they took: at each, the host's and "
        "the device's work stop overlapping.",
        "",
        *_harness.table(("mode", "batch", "model", "wall (ms)", "device (ms)", "device / wall", "device by kind (ms)",
                         "launches", "aten ops", "in oplib's ops, host (ms)", "most device time (us)",
                         "most host time (us)", "waits for the GPU (ms)"), "lllrrrlrrrllr", results.model_profiles),
        "",
    ]


def _tuning_section(results: CudaResults, target_name: str, plan, models_choice: str) -> list[str]:
    import _cuda

    title = f"## CUDA: RedNet-50 with its kernels tuned, bf16 autocast, channels_last ({target_name})"
    if not results.tuning:
        return [title, "", "Not run (or the run stopped first).", ""]
    batch = _cuda.tuning_batch(plan, results.dry)
    return [
        title,
        "",
        "RedNet-50 on its default kernels, and tuned (`oplib.kernels.cuda_plan.set_cuda_tuning`: at each new call "
        "signature every candidate writer of the op timed on the GPU and the fastest kept) unfused and on the fused "
        "op, beside ResNet-50, interleaved (a tuned model's steps with tuning on, the others with it off: each mode "
        f"keeps plans of its own), batch {batch}: a training step and an inference (no_grad) in wall time "
        f"({plan.steps(batch)} steps, after 3 warm-up steps, tuning among them), and inference replayed from a CUDA "
        "graph of the eager forward (`capture_graph`; wall time of back-to-back replays: the GPU's time, as under "
        "reduce-overhead)"
        + (" (this dry run: no CUDA graph; the ops' CUDA host path over the host emulation, tuned by the host's "
           "time)" if results.dry else "") + f"; median of {plan.model_rounds} interleaved rounds.",
        "",
        *_harness.table(("task", "model", "step (ms)", "img/s", "/ ResNet-50"), "llrrr", results.tuning),
        "",
        "### What tuning chose",
        "",
        "Every call signature tuning met, per op: the call (its first operand), each timed "
        "candidate's device time per call in us (the op's choice first: what it runs with tuning off; "
        "`oplib.kernels.involution.cuda.TUNING_CANDIDATES`), the candidates skipped (they declined the call, or made "
        "the launches of one before them), the one kept (a candidate replaces the op's choice only below "
        "`TUNING_MARGIN` of its time) and its time over the op's choice's; each op's last row sums its signatures "
        "(each once, whatever its calls a step) and counts the signatures each writer was kept at.",
        "",
        *_harness.table(("op", "call", "candidates (us)", "skipped", "kept", "kept / the op's choice"), "lllllr",
                        results.tuning_choices or []),
        "",
    ]


_CUDA_SECTIONS = {"kernels": _kernel_section, "layer": _layer_section, "launch": _launch_section,
                  "tuning": _tuning_section, "models": _models_section}


def _charts(settings, cpu_rows: list[_Row], per_op_rows, cuda_rows, cuda_device: Optional[str] = None) -> None:
    """Per shape: each native op's time over its depthwise yardstick and the fwd+bwd speed-up
    over unfold (CPU); oplib's forward over its DRAM floor (CUDA, on ``cuda_device``: default
    the current GPU)."""
    plt = _harness.pyplot()
    if plt is None:
        return
    if per_op_rows and cpu_rows:
        figure, (by_op, against_unfold) = plt.subplots(1, 2, figsize=(13, 4.2))
        names = [shape.name for shape, _ in per_op_rows]
        for i, op in enumerate(PER_OP):
            ratios = [
                ratio(times[("native", op)], times["depthwise", YARDSTICK[op]]) if ("native", op) in times else 0.0
                for _, times in per_op_rows
            ]
            by_op.bar([x + (i - 1) * 0.27 for x in range(len(names))], ratios, width=0.27, label=f"{op} (native)")
        by_op.axhline(1.0, color="black", linewidth=0.8)
        by_op.set(title="CPU: oplib op time / depthwise yardstick (lower is better)", ylabel="ratio")
        against_unfold.bar(range(len(cpu_rows)), [row.speedup for row in cpu_rows], color="tab:green")
        against_unfold.set(title="CPU: forward+backward speed-up over unfold", ylabel="unfold / oplib")
        for axes, labels in ((by_op, names), (against_unfold, [row.shape.name for row in cpu_rows])):
            axes.set_xticks(range(len(labels)), labels, rotation=30, ha="right", fontsize=8)
        _harness.legend_in_headroom(by_op, ncols=len(PER_OP))
        _harness.write_chart(settings, "cpu", figure)
        plt.close(figure)
    if cuda_rows:
        figure, axes = plt.subplots(figsize=(9, 4.2))
        forward = [row for row in cuda_rows if row["kernel"] == "forward" and row["dtype"] == "float32"]
        for i, layout in enumerate(("NCHW", "channels_last")):
            values = [row["over_floor"] for row in forward if row["layout"] == layout]
            axes.bar([x + (i - 0.5) * 0.4 for x in range(len(values))], values, width=0.4, label=f"forward / floor, {layout}")
        names = [row["shape"] for row in forward if row["layout"] == "NCHW"]
        axes.axhline(2.0, color="black", linewidth=0.8, linestyle="--", label="bar: 2x the floor")
        axes.set(title=f"CUDA forward, float32 ({cuda_device or torch.cuda.get_device_name()})",
                 ylabel="device time / DRAM floor")
        axes.set_xticks(range(len(names)), names, rotation=30, ha="right", fontsize=8)
        _harness.legend_in_headroom(axes, ncols=3)
        _harness.write_chart(settings, "cuda", figure)
        plt.close(figure)

if __name__ == "__main__":
    sys.exit(main())
