"""``python -m oplib bench``: involution, and the whole ``Involution2d`` layer, timed on this
machine against a depthwise KxK convolution and the unfold formulation of the paper's reference
code, at RedNet-50's shapes or the shapes given; and the measuring code that
``bench/involution.py`` uses too.

    python -m oplib bench                                  # RedNet-50's eight shapes, CPU (and CUDA where present)
    python -m oplib bench --shape 8x64x56x56 --stride 2    # one shape: batch x channels x height x width
    python -m oplib bench --quick --no-unfold --json       # short timings, no unfold, machine-readable

Each op has its yardstick, the depthwise convolution of the same input (C groups, the same
kernel, stride and padding) doing the same multiply-adds with fewer bytes: the forward against
the depthwise forward, grad_input against the depthwise input gradient, grad_weight against
the depthwise forward (the depthwise weight gradient reduces over the batch and the image, a
different computation), forward+backward against the depthwise forward+backward; the layer
(``oplib.nn.Involution2d``, the kernel generation included) against the depthwise forward in
inference and its forward+backward in training. The unfold
formulation is timed for the forward and forward+backward. oplib's CPU ops take the kernels
``OPLIB_CPU_KERNELS`` picks (``oplib.kernels.native``); the report names them.

Timing: every candidate of a shape is timed in each of a few rounds, the order rotating from
round to round, all in one process, so that a change in the machine's load hits every candidate
alike. A reading is the median per-call time of blocks of calls (``torch.utils.benchmark``'s
blocked_autorange on CPU, CUDA events on a GPU, synchronised); a time is the median of its
rounds' readings, a ratio the median of the per-round ratios.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import dataclasses
import functools
import json
import os
import platform
import sys
import time
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from statistics import median
from typing import Any, NamedTuple, Optional, TypeVar

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.utils.benchmark import Timer

from . import __version__, registry
from ._cli import parser as cli_parser, positive
from .kernels import native
from .kernels.involution import cpu as involution_cpu
from .selfcheck import format_table

# ---------------------------------------------------------------------------------------
# Shapes and inputs
# ---------------------------------------------------------------------------------------


class Inputs(NamedTuple):
    """The tensors every candidate of a shape reads (none requires grad)."""

    input: Tensor  # (N, C, H, W)
    weight: Tensor  # (N, G, K, K, Ho, Wo)
    grad_output: Tensor  # (N, C, Ho, Wo)
    depthwise_weight: Tensor  # (C, 1, K, K)


@dataclass(frozen=True)
class Shape:
    """An involution: input (batch, channels, height, width), a kernel x kernel window at
    ``stride`` with padding kernel // 2, channels // group_channels groups."""

    name: str
    channels: int
    height: int
    width: int
    stride: int
    batch: int = 8
    kernel: int = 7
    group_channels: int = 16

    @property
    def groups(self) -> int:
        return self.channels // self.group_channels

    @property
    def out_size(self) -> tuple[int, int]:
        """(Ho, Wo)."""
        padding = self.kernel // 2
        return tuple((size + 2 * padding - (self.kernel - 1) - 1) // self.stride + 1 for size in (self.height, self.width))

    @property
    def params(self) -> tuple[list[int], list[int], list[int]]:
        """The ops' (stride, padding, dilation)."""
        return [self.stride] * 2, [self.kernel // 2] * 2, [1, 1]

    @property
    def weight_shape(self) -> tuple[int, ...]:
        return (self.batch, self.groups, self.kernel, self.kernel, *self.out_size)

    @property
    def cpu_strategy(self) -> str:
        """How oplib's plain-PyTorch CPU kernels compute this shape ("dense" or "taps")."""
        return involution_cpu.strategy_name((self.height, self.width), self.weight_shape, *self.params)

    def floor_bytes(self, dtype: torch.dtype = torch.float32) -> int:
        """Bytes one involution kernel must move at least: two of input, weight and output (or
        their gradients) read once, the third written once; the same for all three ops."""
        out_h, out_w = self.out_size
        input_ = self.batch * self.channels * self.height * self.width
        weight = self.batch * self.groups * self.kernel**2 * out_h * out_w
        output = self.batch * self.channels * out_h * out_w
        return (input_ + weight + output) * dtype.itemsize

    def inputs(self, device: str = "cpu", dtype: torch.dtype = torch.float32) -> Inputs:
        """Random inputs from a fixed seed, the same for every candidate and every call."""
        generator = torch.Generator(device).manual_seed(0)

        def randn(*size: int) -> Tensor:
            return torch.randn(*size, generator=generator, device=device, dtype=dtype)

        n, c, k = self.batch, self.channels, self.kernel
        return Inputs(
            randn(n, c, self.height, self.width), randn(*self.weight_shape), randn(n, c, *self.out_size), randn(c, 1, k, k)
        )


# RedNet-50's involutions at 224 px: the stride-1 one of each stage's bottlenecks, the stride-2
# one that opens stages 2-4, and the stem's (3 x 3 at half the input's resolution: the map
# with the most pixels, 2 groups of 16 channels).
REDNET50_SHAPES = [
    Shape("stage1 64@56 s1", 64, 56, 56, 1),
    Shape("stage2 128@28 s1", 128, 28, 28, 1),
    Shape("stage3 256@14 s1", 256, 14, 14, 1),
    Shape("stage4 512@7 s1", 512, 7, 7, 1),
    Shape("stage2 128@56 s2", 128, 56, 56, 2),
    Shape("stage3 256@28 s2", 256, 28, 28, 2),
    Shape("stage4 512@14 s2", 512, 14, 14, 2),
    Shape("stem 32@112 k3 s1", 32, 112, 112, 1, kernel=3),
]


# ---------------------------------------------------------------------------------------
# Statements: what is timed
# ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Stmt:
    """A timed call, ``fn(*args)``."""

    fn: Callable[..., Any]
    args: tuple[Any, ...] = ()

    def run(self) -> Any:
        return self.fn(*self.args)


def call(fn: Callable[..., Any], *args: Any) -> Stmt:
    """One call ``fn(*args)``."""
    return Stmt(fn, args)


def leaves(args: Sequence[Any]) -> list[Tensor]:
    """The arguments that receive gradients."""
    return [a for a in args if isinstance(a, Tensor) and a.requires_grad]


def fwd_bwd_step(fn: Callable[..., Tensor], args: Sequence[Any], grad: Tensor) -> Callable[[], None]:
    """A step: ``fn(*args).backward(grad)``, then every leaf's gradient set to None (as
    ``zero_grad(set_to_none=True)`` does), so that no step pays for accumulating into the last."""
    args, grad_leaves = tuple(args), leaves(args)

    def step() -> None:
        fn(*args).backward(grad)
        for leaf in grad_leaves:
            leaf.grad = None

    return step


def fwd_bwd(fn: Callable[..., Tensor], args: Sequence[Any], grad: Tensor) -> Stmt:
    """One ``fwd_bwd_step(fn, args, grad)``."""
    return Stmt(fwd_bwd_step(fn, args, grad))


OPS = ("forward", "grad_input", "grad_weight", "forward+backward", "layer", "layer+backward")
# The depthwise statement each op is compared with (the module docstring says why).
YARDSTICK = {
    "forward": "forward", "grad_input": "grad_input", "grad_weight": "forward", "forward+backward": "forward+backward",
    "layer": "forward", "layer+backward": "forward+backward",
}  # fmt: skip
# The whole Involution2d layer (kernel generation included), as a model runs it.
LAYER_OPS = ("layer", "layer+backward")


def _with_grad(t: Tensor) -> Tensor:
    return t.detach().requires_grad_()


@dataclass(frozen=True)
class Involution:
    """An implementation of involution, timed op by op. ``forward`` has the schema of
    ``oplib::involution`` (input, weight, stride, padding, dilation); ``grad_input`` and
    ``grad_weight``, where it has them, those of ``involution_backward_input`` and
    ``involution_backward_weight``; forward+backward is ``forward`` differentiated by autograd,
    where ``differentiable``."""

    name: str
    forward: Callable[..., Tensor]
    grad_input: Optional[Callable[..., Tensor]] = None
    grad_weight: Optional[Callable[..., Tensor]] = None
    differentiable: bool = False

    def stmts(self, shape: Shape, inputs: Inputs, ops: Iterable[str]) -> dict[tuple[str, str], Stmt]:
        """{(name, op): statement} for each op of ``ops`` this implementation has."""
        x, w, grad = inputs.input, inputs.weight, inputs.grad_output
        params = shape.params
        stmts = {"forward": call(self.forward, x, w, *params)}
        if self.grad_input is not None:
            stmts["grad_input"] = call(self.grad_input, grad, w, [shape.height, shape.width], *params)
        if self.grad_weight is not None:
            stmts["grad_weight"] = call(self.grad_weight, grad, x, [shape.kernel] * 2, *params, shape.groups)
        if self.differentiable:
            stmts["forward+backward"] = fwd_bwd(self.forward, (_with_grad(x), _with_grad(w), *params), grad)
        return {(self.name, op): stmts[op] for op in ops if op in stmts}


def layer_stmts(shape: Shape, inputs: Inputs, ops: Iterable[str]) -> dict[tuple[str, str], Stmt]:
    """{("oplib", op): statement} for the ops of ``LAYER_OPS`` in ``ops``: ``oplib.nn.Involution2d``
    (its default path, the weight generated inside the op) on the input: "layer" in eval mode
    under no_grad, "layer+backward" in train mode with ``grad_output`` backpropagated to the
    input and every parameter."""
    from .nn import Involution2d

    x, grad = inputs.input, inputs.grad_output
    layer = Involution2d(shape.channels, shape.kernel, shape.stride, group_channels=shape.group_channels)
    layer = layer.to(device=x.device, dtype=x.dtype)
    stmts = {}
    if "layer" in ops:
        inference = copy.deepcopy(layer).eval()
        stmts["oplib", "layer"] = Stmt(torch.no_grad()(inference), (x,))
    if "layer+backward" in ops:
        training, x_grad = copy.deepcopy(layer).train(), _with_grad(x)

        def step() -> None:
            training(x_grad).backward(grad)
            x_grad.grad = None
            training.zero_grad(set_to_none=True)

        stmts["oplib", "layer+backward"] = Stmt(step)
    return stmts


def unfold_involution(input: Tensor, weight: Tensor, stride: list[int], padding: list[int], dilation: list[int]) -> Tensor:
    """The unfold formulation of the paper's reference code (oplib.involution's reference in
    the registry): input (N, C, H, W), weight (N, G, KH, KW, Ho, Wo) -> (N, C, Ho, Wo)."""
    return registry.get("involution").reference(input, weight, stride, padding, dilation)


OPLIB = Involution(
    "oplib", torch.ops.oplib.involution, torch.ops.oplib.involution_backward_input,
    torch.ops.oplib.involution_backward_weight, differentiable=True,
)  # fmt: skip
UNFOLD = Involution("unfold", unfold_involution, differentiable=True)


def depthwise_stmts(shape: Shape, inputs: Inputs, ops: Iterable[str]) -> dict[tuple[str, str], Stmt]:
    """{("depthwise", yardstick): statement} for the yardstick of each op of ``ops``: a
    depthwise convolution of the input (C groups, weight (C, 1, K, K))."""
    x, w, grad = inputs.input, inputs.depthwise_weight, inputs.grad_output
    stride, padding, dilation = shape.params
    conv = (stride, padding, dilation, shape.channels)
    stmts = {
        "forward": call(F.conv2d, x, w, None, *conv),
        # Only the input's gradient: the mask skips the weight's, which grad_input does not compute.
        "grad_input": call(
            torch.ops.aten.convolution_backward, grad, x, w, None, stride, padding, dilation, False, [0, 0],
            shape.channels, [True, False, False],
        ),
        "forward+backward": fwd_bwd(F.conv2d, (_with_grad(x), _with_grad(w), None, *conv), grad),
    }  # fmt: skip
    return {("depthwise", YARDSTICK[op]): stmts[YARDSTICK[op]] for op in ops}


# ---------------------------------------------------------------------------------------
# Timing
# ---------------------------------------------------------------------------------------

# One reading of a statement: seconds per call.
Clock = Callable[[], float]
Key = TypeVar("Key", bound=Hashable)


def blocked(time_block: Callable[[int], float], min_run_time: float, calls_per_unit: int = 1) -> float:
    """The median per-call time of blocks of calls, as blocked_autorange measures:
    ``time_block(number)`` runs ``number`` units of ``calls_per_unit`` calls each (a replayed
    CUDA graph holds several) and returns their seconds. One unit warms up and is not kept;
    the block size then doubles until a block takes a tenth of ``min_run_time``, and blocks of
    that size run until the kept ones have taken it, in wall seconds whatever a unit holds."""
    time_block(1)
    number = 1
    while (seconds := time_block(number)) < min_run_time / 10:
        number *= 2
    per_call, total = [seconds / (number * calls_per_unit)], seconds
    while total < min_run_time:
        seconds = time_block(number)
        per_call.append(seconds / (number * calls_per_unit))
        total += seconds
    return median(per_call)


# Calls in one captured CUDA graph: enough that a replay's own launch cost is small against them.
GRAPH_CALLS = 20


def capture_graph(run: Callable[[], object], calls: int = GRAPH_CALLS) -> "torch.cuda.CUDAGraph":
    """``calls`` calls of ``run`` captured in one CUDA graph, after one call outside the capture
    (it compiles kernels and fills caches) and one on a side stream (as torch's documentation
    asks before a capture). Replaying it runs the calls back to back on the GPU, with no host
    time between them."""
    run()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        run()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(calls):
            run()
    return graph


def _cuda_clock(stmt: Stmt, min_run_time: float) -> Clock:
    """Device time per call: the statement's calls captured in a CUDA graph (``capture_graph``)
    and replayed in blocks between CUDA events. A statement that cannot be captured (one that
    synchronises with the host) is timed by events around plain calls, host gaps included."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    try:
        graph = capture_graph(stmt.run)
        run, per_run = graph.replay, GRAPH_CALLS
    except RuntimeError:
        run, per_run = stmt.run, 1

    def time_block(number: int) -> float:
        start.record()
        for _ in range(number):
            run()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / 1e3

    def reading() -> float:
        torch.cuda.synchronize()  # the previous candidate's work, outside this one's blocks
        return blocked(time_block, min_run_time, calls_per_unit=per_run)

    return reading


def device_copy_bandwidth(device: str = "cuda") -> float:
    """Bytes per second read + written by a 1 GiB device-to-device copy (device time)."""
    src = torch.empty(1 << 28, device=device)
    dst = torch.empty_like(src)
    read = _cuda_clock(Stmt(dst.copy_, (src,)), min_run_time=0.2)
    return 2 * src.numel() * src.element_size() / median(read() for _ in range(3))


def clock(stmt: Stmt, device: str, min_run_time: float) -> Clock:
    """Readings of ``stmt`` running on ``device``: CPU, blocked_autorange's median with
    torch's current thread count; CUDA, ``blocked`` over CUDA events."""
    if torch.device(device).type == "cuda":
        return _cuda_clock(stmt, min_run_time)
    timer = Timer("fn(*args)", globals={"fn": stmt.fn, "args": stmt.args}, num_threads=torch.get_num_threads())
    return lambda: timer.blocked_autorange(min_run_time=min_run_time).median


def run_round(clocks: Mapping[Key, Clock], first: int) -> dict[Key, float]:
    """One reading of every clock, starting with the ``first``-th (modulo their count) and
    going round in order."""
    names = list(clocks)
    readings = {}
    for k in range(len(names)):
        name = names[(first + k) % len(names)]
        readings[name] = clocks[name]()
    return readings


@dataclass(frozen=True)
class Timing:
    """One candidate's reading of each kept round, in seconds."""

    rounds: tuple[float, ...]

    @property
    def median(self) -> float:
        return median(self.rounds)


def interleave(
    clocks: Mapping[Key, Clock], rounds: int, one_round: Callable[[Mapping[Key, Clock], int], dict[Key, float]] = run_round
) -> dict[Key, Timing]:
    """Every clock read in each of ``rounds`` rounds, round r starting with the r-th clock,
    so that neither the order nor a drift in load favours one. ``one_round`` runs a round (a
    caller may wrap ``run_round``, e.g. to re-run a disturbed round)."""
    samples: dict[Key, list[float]] = {name: [] for name in clocks}
    for r in range(rounds):
        for name, reading in one_round(clocks, r).items():
            samples[name].append(reading)
    return {name: Timing(tuple(values)) for name, values in samples.items()}


def round_ratios(numerator: Timing, denominator: Timing) -> list[float]:
    """numerator / denominator of each round: readings taken seconds apart, so that a
    change in the machine's load between rounds cancels out."""
    return [n / d for n, d in zip(numerator.rounds, denominator.rounds, strict=True)]


def ratio(numerator: Timing, denominator: Timing) -> float:
    """The median of the per-round ratios."""
    return median(round_ratios(numerator, denominator))


# ---------------------------------------------------------------------------------------
# The machine
# ---------------------------------------------------------------------------------------


def cpu_model() -> str:
    """The CPU's model name from /proc/cpuinfo (platform.processor() elsewhere)."""
    with contextlib.suppress(OSError), open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown CPU"


def describe_machine() -> str:
    """One line: the GPU if there is one, CPU, cores, torch version, threads and mkldnn, Python, oplib."""
    mkldnn = "mkldnn on" if torch.backends.mkldnn.is_available() else "mkldnn off"
    gpu = f"{torch.cuda.get_device_name()}, " if torch.cuda.is_available() else ""
    return (
        f"{gpu}{cpu_model()}, {os.cpu_count()} cores, torch {torch.__version__} ({torch.get_num_threads()} threads, {mkldnn}), "
        f"Python {platform.python_version()}, oplib {__version__}"
    )


# ---------------------------------------------------------------------------------------
# python -m oplib bench
# ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Result:
    """One op at one shape on one device: oplib's time, its yardstick's, unfold's (where timed)."""

    device: str
    shape: Shape
    op: str
    oplib: Timing
    depthwise: Timing
    unfold: Optional[Timing]
    floor: Optional[float] = None  # seconds: the op's bytes over the device's copy bandwidth (CUDA)

    def as_dict(self) -> dict[str, Any]:
        """The JSON record: times in ms, ratios as in the table."""
        unfold = self.unfold
        return {
            "device": self.device,
            "shape": dataclasses.asdict(self.shape),
            "op": self.op,
            "oplib_ms": self.oplib.median * 1e3,
            "depthwise_ms": self.depthwise.median * 1e3,
            "oplib_over_depthwise": ratio(self.oplib, self.depthwise),
            "unfold_ms": None if unfold is None else unfold.median * 1e3,
            "unfold_over_oplib": None if unfold is None else ratio(unfold, self.oplib),
            "floor_ms": None if self.floor is None else self.floor * 1e3,
            "oplib_over_floor": None if self.floor is None else self.oplib.median / self.floor,
        }


def measure(
    shape: Shape, device: str, dtype: torch.dtype, ops: Sequence[str], unfold: bool, rounds: int, min_run_time: float
) -> list[Result]:
    """Every op of ``ops`` at ``shape``: oplib, the depthwise yardsticks and (if ``unfold``)
    the unfold formulation, all interleaved in the same rounds."""
    inputs = shape.inputs(device, dtype)
    stmts = {**OPLIB.stmts(shape, inputs, ops), **layer_stmts(shape, inputs, ops), **depthwise_stmts(shape, inputs, ops)}
    if unfold:
        stmts |= UNFOLD.stmts(shape, inputs, ops)
    times = interleave({key: clock(stmt, device, min_run_time) for key, stmt in stmts.items()}, rounds)
    bandwidth = _copy_bandwidth(torch.device(device).index or 0) if torch.device(device).type == "cuda" else None
    return [
        Result(
            device, shape, op, times["oplib", op], times["depthwise", YARDSTICK[op]], times.get(("unfold", op)),
            None if bandwidth is None or op not in SINGLE_KERNEL_OPS else shape.floor_bytes(dtype) / bandwidth,
        )
        for op in ops
    ]


# The ops that are one kernel each, with a DRAM floor (Shape.floor_bytes).
SINGLE_KERNEL_OPS = ("forward", "grad_input", "grad_weight")


@functools.cache
def _copy_bandwidth(index: int) -> float:
    return device_copy_bandwidth(f"cuda:{index}")


def _shape(text: str) -> tuple[int, int, int, int]:
    try:
        sizes = tuple(int(s) for s in text.lower().split("x"))
    except ValueError:
        sizes = ()
    if len(sizes) != 4 or min(sizes) < 1:
        raise argparse.ArgumentTypeError(f"expected NxCxHxW, four positive integers such as 8x64x56x56, got {text!r}")
    return sizes


def _ops(text: str) -> tuple[str, ...]:
    ops = tuple(dict.fromkeys(text.split(",")))
    if not set(ops) <= set(OPS):
        raise argparse.ArgumentTypeError(f"expected some of {','.join(OPS)} separated by commas, got {text!r}")
    return ops


_DTYPES = ("float32", "float64", "float16", "bfloat16")
# (rounds, seconds per candidate per round): by default, and with --quick.
_TIMING, _QUICK_TIMING = (3, 0.2), (1, 0.05)


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    """The flags, checked: a bad one exits with code 2 and a one-line message. Sets
    ``args.shapes`` (RedNet-50's or those of ``--shape``) and ``args.devices``."""
    positive_int, positive_float = positive(int), positive(float)
    parser = cli_parser("python -m oplib bench", __doc__)
    parser.add_argument(
        "--device", action="append", choices=("cpu", "cuda"),
        help="repeatable (default: cpu, and cuda where torch.cuda.is_available())",
    )  # fmt: skip
    parser.add_argument(
        "--shape", action="append", type=_shape, metavar="NxCxHxW",
        help="an input shape to time instead of RedNet-50's eight (repeatable)",
    )  # fmt: skip
    parser.add_argument("--kernel", type=positive_int, help="with --shape: the kernel size K (default: 7)")
    parser.add_argument("--stride", type=positive_int, help="with --shape: the stride (default: 1)")
    parser.add_argument("--group-channels", type=positive_int, help="with --shape: channels per group (default: 16)")
    parser.add_argument("--dtype", choices=_DTYPES, default="float32", help="the tensors' dtype (default float32)")
    parser.add_argument("--ops", type=_ops, default=OPS, help=f"comma-separated (default: {','.join(OPS)})")
    parser.add_argument(
        "--no-unfold", dest="unfold", action="store_false",
        help="skip the unfold formulation, by far the slowest candidate at RedNet's larger maps",
    )  # fmt: skip
    threads = torch.get_num_threads()
    parser.add_argument("--threads", type=positive_int, help=f"torch's CPU threads (default: torch's, {threads} here)")
    parser.add_argument("--quick", action="store_true", help="short timings, for a first look")
    parser.add_argument(
        "--rounds", type=positive_int, help=f"interleaved rounds (default: {_TIMING[0]}; --quick: {_QUICK_TIMING[0]})"
    )
    parser.add_argument(
        "--min-run-time", type=positive_float,
        help=f"seconds per candidate per round (default: {_TIMING[1]:g}; --quick: {_QUICK_TIMING[1]:g})",
    )  # fmt: skip
    parser.add_argument("--json", action="store_true", help="print the results as JSON instead of a table")
    args = parser.parse_args(argv)
    geometry = (args.kernel, args.stride, args.group_channels)
    if args.shape is None:
        if geometry != (None, None, None):
            parser.error("--kernel, --stride and --group-channels describe the shapes of --shape: give --shape too")
        args.shapes = REDNET50_SHAPES
    else:
        kernel, stride, group_channels = (given or default for given, default in zip(geometry, (7, 1, 16)))
        args.shapes = []
        for n, c, h, w in args.shape:
            if c % group_channels:
                parser.error(f"--shape {n}x{c}x{h}x{w}: {c} channels are not divisible by --group-channels {group_channels}")
            name = f"{c}@{h if h == w else f'{h}x{w}'} k{kernel} s{stride} g{group_channels}"
            args.shapes.append(Shape(name, c, h, w, stride, n, kernel, group_channels))
    args.devices = list(dict.fromkeys(args.device or ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])))
    if "cuda" in args.devices and not torch.cuda.is_available():
        parser.error("--device cuda: no GPU (torch.cuda.is_available() is False)")
    rounds, min_run_time = _QUICK_TIMING if args.quick else _TIMING
    args.rounds, args.min_run_time = args.rounds or rounds, args.min_run_time or min_run_time
    return args


def _ms(timing: Optional[Timing]) -> str:
    return "-" if timing is None else f"{timing.median * 1e3:.3f}"


def _report(args: argparse.Namespace, results: Sequence[Result], cpu_kernels: Optional[str]) -> str:
    """The table and the lines that say how it was measured."""
    lines = [
        f"involution vs a depthwise convolution and the unfold formulation, {args.dtype} (python -m oplib bench)",
        f"machine: {describe_machine()}",
        f"times: medians of {args.rounds} interleaved round(s) of >= {args.min_run_time:g} s per candidate; "
        "ratios: medians of the per-round ratios" + (" (--quick: short timings, not for conclusions)" if args.quick else ""),
        "yardsticks: the depthwise forward for forward and grad_weight, its input gradient for grad_input, "
        "its forward+backward for forward+backward",
    ]
    if cpu_kernels is not None:
        lines.append(f"involution's CPU kernels: {cpu_kernels}")
    unfold = any(r.unfold is not None for r in results)
    floor = any(r.floor is not None for r in results)
    if floor:
        lines.append(
            "floor (CUDA): the bytes the op's kernel must read and write once over this GPU's device-to-device copy "
            "bandwidth; CUDA times are device time (calls replayed from a CUDA graph)"
        )
    headers = ["device", "shape", "batch", "op", "oplib (ms)", "depthwise (ms)", "oplib/depthwise"]
    headers += ["unfold (ms)", "unfold/oplib"] if unfold else []
    headers += ["floor (ms)", "oplib/floor"] if floor else []
    rows = []
    for r in results:
        row = [r.device, r.shape.name, str(r.shape.batch), r.op, _ms(r.oplib), _ms(r.depthwise)]
        row.append(f"{ratio(r.oplib, r.depthwise):.2f}x")
        if unfold:
            row += [_ms(r.unfold), "-" if r.unfold is None else f"{ratio(r.unfold, r.oplib):.2f}x"]
        if floor:
            row += ["-", "-"] if r.floor is None else [f"{r.floor * 1e3:.3f}", f"{r.oplib.median / r.floor:.2f}x"]
        rows.append(row)
    return "\n".join([*lines, "", format_table(headers, rows)])


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    # Before any timing: with OPLIB_CPU_KERNELS=auto or native this builds the native kernels.
    cpu_kernels = native.status() if "cpu" in args.devices else None
    dtype = getattr(torch, args.dtype)
    results: list[Result] = []
    for device in args.devices:
        for shape in args.shapes:
            start = time.perf_counter()
            results += measure(shape, device, dtype, args.ops, args.unfold, args.rounds, args.min_run_time)
            print(f"{device} {shape.name}: timed in {time.perf_counter() - start:.1f} s", file=sys.stderr, flush=True)
    if args.json:
        summary = {
            "machine": describe_machine(), "torch": torch.__version__, "oplib": __version__,
            "threads": torch.get_num_threads(), "dtype": args.dtype, "rounds": args.rounds,
            "min_run_time": args.min_run_time, "cpu_kernels": cpu_kernels,
            "results": [r.as_dict() for r in results],
        }  # fmt: skip
        print(json.dumps(summary, indent=2))
    else:
        print(_report(args, results, cpu_kernels))
    return 0
