"""The whole involution layer (``oplib.nn.Involution2d``: kernel generation and involution)
with the weight generated inside the op (``fused=True``, the default) and with the span conv
writing the weight map (``fused=False``), against a depthwise 7x7 convolution of the same
input, at RedNet-50's four stride-1 shapes.

    python bench/layer.py            # writes bench/results/layer.md
    python bench/layer.py --quick    # small shapes, one round (smoke test)

float32, NCHW, batch 8, 7x7 kernel, 16 channels per group, reduction ratio 4. Inference:
eval mode under ``torch.no_grad``. Forward+backward: train mode, the output's sum
backpropagated to the input and every parameter (the depthwise convolution's input and
weight). The cases of one shape run interleaved in one section.

A second table bounds what any implementation of the layer could reach on this machine: the
layer's multiply-adds per inference (reduce 1x1 conv C -> C/4, span 1x1 conv C/4 -> G*K*K,
the K*K-tap aggregation of C channels) at the float32 matrix-multiply rate measured in the
same run (a 1024-square ``torch.mm``, the best case for any of these products), as a
multiple of the depthwise convolution's time.

A third table times each fused op's CPU entry point through its fused kernel and through the
small-map route, at every involution shape of RedNet-50 (the stride-2 ones too) and at the tiny
maps of RedNet-26 on 64x64 images; the ops' ``SMALL_MAP_PIXELS`` come from it.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Optional

import torch
from torch import nn

import _harness
from _harness import Section
from oplib.benchmark import call, ratio
from oplib.kernels import native
from oplib.nn import Involution2d

BATCH, KERNEL = 8, 7
SHAPES = ((64, 56), (128, 28), (256, 14), (512, 7))
QUICK_SHAPES = ((32, 14), (64, 7))
# Every involution of RedNet-50 (C@HxW, stride): the four stages and the three stride-2 blocks;
# then the tiny maps of RedNet-26 on 64x64 images (bench/rednet.py's model), the last two stages.
ROUTE_SHAPES = ((64, 56, 1), (128, 28, 1), (256, 14, 1), (512, 7, 1), (128, 56, 2), (256, 28, 2), (512, 14, 2),
                (128, 8, 1), (256, 4, 1), (512, 2, 1))
QUICK_ROUTE_SHAPES = ((32, 14, 1), (64, 14, 2))
CASES = ("fused", "unfused", "depthwise 7x7")
# The generation branch before the fused op (reduce conv, BatchNorm, ReLU): torch's own ops.
BRANCH = "branch"


def _module(case: str, channels: int) -> nn.Module:
    torch.manual_seed(0)
    if case == BRANCH:
        return _Branch(Involution2d(channels, KERNEL, group_channels=16))
    if case == "depthwise 7x7":
        return nn.Conv2d(channels, channels, KERNEL, padding=KERNEL // 2, groups=channels, bias=False)
    return Involution2d(channels, KERNEL, group_channels=16, fused=case == "fused")


class _Branch(nn.Module):
    """The part of ``layer`` that runs as torch ops before the fused op: (N, C, H, W) -> the
    (N, R, H, W) feature."""

    def __init__(self, layer: Involution2d):
        super().__init__()
        self.layer = layer

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layer._feature(x)


def _inference(module: nn.Module, x: torch.Tensor) -> Callable[[], None]:
    module.eval()

    def run() -> None:
        with torch.no_grad():
            module(x)

    return run


def _forward_backward(module: nn.Module, x: torch.Tensor) -> Callable[[], None]:
    module.train()
    x = x.detach().requires_grad_()

    def run() -> None:
        module(x).sum().backward()
        x.grad = None
        module.zero_grad(set_to_none=True)

    return run


GEMM_SIZE = 1024
REDUCTION, GROUP_CHANNELS = 4, 16
# A training step's multiply-adds as a multiple of the forward's.
TRAINING_FACTOR = 3
# Issue 45's bars for the layer against its floor.
INFERENCE_BAR, TRAINING_BAR = 1.3, 2.0


def multiply_adds_per_pixel(channels: int, reduced: int, groups: int, taps: int) -> int:
    """Multiply-adds of an Involution2d per output pixel: reduce 1x1, span 1x1, aggregation
    (BatchNorm, ReLU and pooling aside)."""
    return channels * reduced + reduced * groups * taps + channels * taps


def layer_multiply_adds(batch: int, channels: int, size: int) -> int:
    """Multiply-adds of one Involution2d inference at stride 1 (BatchNorm and ReLU aside)."""
    per_pixel = multiply_adds_per_pixel(channels, channels // REDUCTION, channels // GROUP_CHANNELS, KERNEL * KERNEL)
    return batch * size * size * per_pixel


def _share(floor: float, budget: float) -> str:
    """The GEMM-rate share a part whose floor is ``floor`` needs to fit ``budget`` seconds."""
    return f"{floor / budget:.0%}" if budget > 0 else "out of reach"


def gemm_rate(section: Section) -> float:
    """float32 multiply-adds per second of a GEMM_SIZE-square torch.mm on this run's threads."""
    a, b = torch.randn(GEMM_SIZE, GEMM_SIZE), torch.randn(GEMM_SIZE, GEMM_SIZE)
    seconds = section.measure("gemm", {"mm": call(torch.mm, a, b)})["mm"].median
    return GEMM_SIZE**3 / seconds


def main(argv: Optional[list[str]] = None) -> int:
    parser = _harness.parser(__doc__, rounds=5, min_run_time=1.0)
    settings = _harness.start(parser.parse_args(argv), __file__)
    batch, shapes = (2, QUICK_SHAPES) if settings.quick else (BATCH, SHAPES)
    section = Section(settings)
    rate = gemm_rate(section)
    rows, floors, reach = [], [], []
    for channels, size in shapes:
        x = torch.randn(batch, channels, size, size)
        times = {}
        for mode, make in (("inference", _inference), ("forward+backward", _forward_backward)):
            stmts = {(case, mode): call(make(_module(case, channels), x)) for case in (*CASES, BRANCH)}
            times.update(section.measure(f"{channels}@{size} {mode}", stmts))
        row = [f"{channels}@{size}"]
        for mode in ("inference", "forward+backward"):
            depthwise = times["depthwise 7x7", mode]
            for case in ("fused", "unfused"):
                row.append(f"{times[case, mode].median * 1e3:.2f}")
            row.append(f"{depthwise.median * 1e3:.2f}")
            row.append(f"{ratio(times['fused', mode], depthwise):.2f}x")
            row.append(f"{ratio(times['unfused', mode], depthwise):.2f}x")
        rows.append(row)
        macs = layer_multiply_adds(batch, channels, size)
        floor = macs / rate
        depthwise = times["depthwise 7x7", "inference"].median
        training_floor = TRAINING_FACTOR * floor
        floors.append([f"{channels}@{size}", f"{macs / 1e6:.0f}", f"{floor * 1e3:.2f}", f"{depthwise * 1e3:.2f}",
                       f"{floor / depthwise:.2f}x", f"{times['fused', 'inference'].median / floor:.2f}x",
                       f"{training_floor * 1e3:.2f}", f"{times['fused', 'forward+backward'].median / training_floor:.2f}x",
                       f"{times['unfused', 'forward+backward'].median / training_floor:.2f}x"])
        # What is left of the bars for the op once torch's branch has run, against the op's own
        # floor (span and aggregation multiply-adds at the GEMM rate).
        reduced = channels // REDUCTION
        op_floor = (macs - batch * size * size * channels * reduced) / rate
        branch = {mode: times[BRANCH, mode].median for mode in ("inference", "forward+backward")}
        # The op's share of each bar: the rate of the GEMM it must keep.
        op_share = {"inference": INFERENCE_BAR * floor - branch["inference"],
                    "forward+backward": TRAINING_BAR * training_floor - branch["forward+backward"]}
        reach.append([f"{channels}@{size}", f"{branch['inference'] * 1e3:.2f}", f"{op_floor * 1e3:.2f}",
                      f"{(branch['inference'] + op_floor) / floor:.2f}x", _share(op_floor, op_share["inference"]),
                      f"{branch['forward+backward'] * 1e3:.2f}", f"{TRAINING_FACTOR * op_floor * 1e3:.2f}",
                      f"{(branch['forward+backward'] + TRAINING_FACTOR * op_floor) / training_floor:.2f}x",
                      _share(TRAINING_FACTOR * op_floor, op_share["forward+backward"])])
    columns = ["shape (C@HxW)"]
    for mode in ("inference", "fwd+bwd"):
        columns += [f"{mode} fused (ms)", f"{mode} unfused (ms)", f"{mode} depthwise (ms)", f"{mode} fused / dw",
                    f"{mode} unfused / dw"]
    lines = [
        *_harness.header(
            settings,
            "The involution layer, weight generated inside the op vs written by the span conv, against a depthwise 7x7 convolution",
            f"- oplib.nn.Involution2d(C, 7, group_channels=16), float32, NCHW, batch {batch}; fused: "
            "torch.ops.oplib.involution_generated, unfused: span conv + torch.ops.oplib.involution",
            "- inference: eval mode, no_grad; fwd+bwd: train mode, sum of the output backpropagated to the input and "
            "every parameter",
            f"- involution's CPU kernels: {native.status()}",
        ),
        section.load_line(),
        "",
        *_harness.table(columns, "l" + "r" * (len(columns) - 1), rows),
        "",
        "## The compute floor",
        "",
        f"The layer's multiply-adds per inference at this run's float32 `torch.mm` rate ({GEMM_SIZE}-square: "
        f"{rate / 1e9:.1f} G multiply-adds/s on {settings.threads} threads): no implementation of the layer runs "
        "faster than this floor here. Floor / dw above 2.5x means the bar of issue 34 (inference at most 2.5x the "
        "depthwise convolution) is out of reach on this machine at that shape. Forward+backward: "
        f"{TRAINING_FACTOR}x the forward's multiply-adds (each product's two gradients are products of the same size).",
        "",
        *_harness.table(("shape (C@HxW)", "multiply-adds (M)", "floor (ms)", "depthwise (ms)", "floor / dw", "fused / floor",
                         "fwd+bwd floor (ms)", "fwd+bwd fused / floor", "fwd+bwd unfused / floor"),
                        "lrrrrrrrr", floors),
        "",
        "## What the op has left",
        "",
        "The generation branch before the fused op (reduce 1x1 conv, BatchNorm, ReLU: `Involution2d._feature`, torch's "
        "own ops) timed in the same rounds, in inference and forward+backward (its output's sum backpropagated), beside "
        "the fused op's own floor (span and aggregation multiply-adds at the GEMM rate; 3x for forward+backward). "
        "(branch + op floor) / floor is the least the layer can measure against its floor while the branch runs as "
        f"torch ops: above the issue's bars ({INFERENCE_BAR}x inference, {TRAINING_BAR}x forward+backward), no kernel "
        "for the op alone reaches them; the branch itself would have to run inside the op. \"Share of the GEMM rate\": "
        "the rate, as a share of the run's GEMM rate, at which the op's multiply-adds must run for the layer to meet the "
        "bar beside this branch (above 100%: out of reach while the branch runs as torch ops).",
        "",
        *_harness.table(("shape (C@HxW)", "branch (ms)", "op floor (ms)", "(branch + op floor) / floor",
                         f"op at {INFERENCE_BAR}x: share of the GEMM rate", "branch fwd+bwd (ms)", "op fwd+bwd floor (ms)",
                         "(branch + op floor) / floor, fwd+bwd", f"op at {TRAINING_BAR}x: share of the GEMM rate"),
                        "lrrrrrrrr", reach),
    ]
    lines += ["", *routes(section, batch, QUICK_ROUTE_SHAPES if settings.quick else ROUTE_SHAPES)]
    _harness.write_report(settings, lines)
    return 0


def _routed(entry: Callable, op: str, route: str) -> Callable:
    """``entry`` (a CPU entry point of the fused ops) with ``op`` forced through ``route``:
    "fused" (the fused native kernel) or "map" (the small-map route), whatever the map's size."""
    from oplib.kernels.involution import cpu

    limits = dict(cpu.SMALL_MAP_PIXELS, **{op: (0, 0) if route == "fused" else (0, 10**9)})

    def run(*args):
        default, cpu.SMALL_MAP_PIXELS = cpu.SMALL_MAP_PIXELS, limits
        try:
            return entry(*args)
        finally:
            cpu.SMALL_MAP_PIXELS = default

    return run


def routes(section: Section, batch: int, shapes) -> list[str]:
    """Each fused op's CPU entry point through its fused native kernel and through the small-map
    route (the span conv forms the map, involution's native kernels take it), interleaved, at
    ``shapes`` (C, H, stride), with the route the op takes by default."""
    from oplib.kernels.involution import cpu
    from oplib.ops.involution_generated import _generator_grads_result

    rows, slower = [], []
    for channels, size, stride in shapes:
        reduced, groups = channels // REDUCTION, channels // GROUP_CHANNELS
        out_size = (size + 2 * (KERNEL // 2) - KERNEL) // stride + 1
        torch.manual_seed(0)
        x, grad = torch.randn(batch, channels, size, size), torch.randn(batch, channels, out_size, out_size)
        feature, span = torch.randn(batch, reduced, out_size, out_size), torch.randn(groups * KERNEL**2, reduced) / 8
        bias = torch.randn(groups * KERNEL**2)
        window = ([KERNEL] * 2, [stride] * 2, [KERNEL // 2] * 2, [1, 1])
        generator_args = (grad, feature, span, x, *window)
        calls = {
            "forward": (cpu.involution_generated, (x, feature, span, bias, *window), lambda: torch.empty_like(grad)),
            "backward_input": (cpu.involution_generated_backward_input,
                               (grad, feature, span, bias, [size, size], *window), lambda: torch.empty_like(x)),
            "backward_generator": (cpu.involution_generated_backward_generator, generator_args,
                                   lambda: _generator_grads_result(*generator_args)),
        }  # fmt: skip
        shape = f"{channels}@{size}" + (f" s{stride}" if stride > 1 else "")
        for op, (entry, args, result) in calls.items():
            times = section.measure(f"{shape} {op}", {
                route: call(_routed(entry, op, route), *args, result()) for route in ("fused", "map")
            })  # fmt: skip
            default = "map" if cpu.through_small_map(op, feature) else "fused"
            if times[default].median > min(t.median for t in times.values()):
                slower.append(f"{shape} {op}")
            rows.append([shape, f"{out_size}x{out_size}", op, f"{times['fused'].median * 1e3:.2f}",
                         f"{times['map'].median * 1e3:.2f}", f"{ratio(times['fused'], times['map']):.2f}x", default])
    verdict = ("The default is the faster route in every row." if not slower else
               "**The default is the slower route in:** " + ", ".join(slower) + ".")
    return [
        "## The fused kernels against the small-map route",
        "",
        "Each fused op's CPU entry point forced through its fused native kernel and through the small-map route "
        "(`oplib/kernels/involution/cpu.py`: the span conv forms the weights of a chunk of samples as one BLAS product, "
        "involution's native kernels take the map; the generator's gradients through `involution_backward_weight` and the "
        f"span conv's backward), float32, batch {batch}, interleaved; default: the route the op takes "
        "(`SMALL_MAP_PIXELS`, set from this table). " + verdict,
        "",
        *_harness.table(("shape (C@HxW)", "output", "op", "fused (ms)", "map (ms)", "fused / map", "default"), "lllrrrl",
                        rows),
    ]


if __name__ == "__main__":
    sys.exit(main())
