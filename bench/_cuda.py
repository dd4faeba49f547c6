"""The CUDA half of bench/involution.py (``--cuda-only``, which ``make gpu-check`` runs).

Per kernel (forward, grad_input, grad_weight) at RedNet-50's seven shapes, batch 32, float32
and bfloat16, NCHW and channels_last:

- device time: ``REPEATS`` calls captured in one CUDA graph and replayed between CUDA events,
  so the GPU runs them back to back and no host time is in the reading;
- wall time per call: ``time.perf_counter`` around many calls, synchronised once at the end
  (the host's cost when it is the slower side);
- the DRAM floor: the bytes the kernel must read and write once (``Shape.floor_bytes``), over
  the device-to-device copy bandwidth measured in the same run, and the ratio to it;
- "generic (before)": the same call forced onto the generic kernels of involution.cu (the
  kernels every geometry took before the specialised ones), timed in the same rounds;
- yardsticks: the depthwise 7x7 convolution (its forward for the forward and grad_weight, its
  input gradient for grad_input) and, for the forward, the unfold formulation.

"generated forward" is ``involution_generated`` (the weight formed inside the kernel from a
feature map of C/4 channels and the span matrix): its floor is the input, the feature map and
the output (the weight is never touched), and its "generic (before)" column is the path it
replaces, the span 1x1 conv writing the weight, then oplib's involution forward.

Then the tiny-shape wall time against a bare custom op that launches an empty CuPy kernel, and
RedNet-50 against a torch.nn ResNet-50 (bf16 autocast, channels_last), training step and
inference, eager and compiled, in images per second.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from statistics import median
from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor

from oplib.benchmark import Shape, capture_graph, device_copy_bandwidth, unfold_involution
from oplib.kernels import cupy_launcher
from oplib.kernels.involution import cuda as involution_cuda
from oplib.kernels.involution.cpu import generated_weight

BATCH = 32
DTYPES = (torch.float32, torch.bfloat16)
LAYOUTS = ("NCHW", "channels_last")
KERNELS = ("forward", "grad_input", "grad_weight", "generated forward")
REPEATS = 20  # calls per captured graph
ROUNDS = 5  # interleaved rounds; a time is the median over them


# The launch policy with no chunked kernel: every call runs involution.cu's generic kernels.
GENERIC = dataclasses.replace(involution_cuda.POLICY, kernel_sizes=())


class DeviceTimer:
    """A call captured ``REPEATS`` times into a CUDA graph (``oplib.benchmark.capture_graph``):
    ``read()`` replays it between CUDA events and returns seconds per call."""

    def __init__(self, fn: Callable[[], object]):
        self.graph = capture_graph(fn, REPEATS)
        self.start, self.end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)

    def read(self) -> float:
        torch.cuda.synchronize()
        self.graph.replay()  # warm
        self.start.record()
        self.graph.replay()
        self.end.record()
        self.end.synchronize()
        return self.start.elapsed_time(self.end) / 1e3 / REPEATS


def wall_time(fn: Callable[[], object], calls: int = 200) -> float:
    """Seconds per call on the host: ``calls`` calls, then one synchronise."""
    fn()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - start) / calls


def operands_on(shape: Shape, dtype: torch.dtype, layout: str, device: str = "cuda") -> dict:
    """input, weight, grad_output and the depthwise weight, in ``layout``; the channels_last
    weight is pixel-major, as a channels_last convolution's output viewed as the weight is."""
    inputs = shape.inputs(device, dtype)
    x, w, g, depthwise = inputs.input, inputs.weight, inputs.grad_output, inputs.depthwise_weight
    # involution_generated's generator, as Involution2d's (reduction ratio 4)
    generator = torch.Generator(device).manual_seed(1)
    reduced, rows = max(1, shape.channels // 4), shape.groups * shape.kernel**2
    feature = torch.randn(shape.batch, reduced, *shape.out_size, generator=generator, device=device, dtype=dtype).relu()
    span = torch.randn(rows, reduced, generator=generator, device=device, dtype=dtype) / reduced**0.5
    bias = torch.randn(rows, generator=generator, device=device, dtype=dtype)
    if layout == "channels_last":
        x = x.contiguous(memory_format=torch.channels_last)
        g = g.contiguous(memory_format=torch.channels_last)
        w = w.permute(0, 4, 5, 1, 2, 3).contiguous().permute(0, 3, 4, 5, 1, 2)
        depthwise = depthwise.contiguous(memory_format=torch.channels_last)
        feature = feature.contiguous(memory_format=torch.channels_last)
    return {"input": x, "weight": w, "grad_output": g, "depthwise": depthwise, "shape": shape,
            "feature": feature, "span_weight": span, "span_bias": bias}  # fmt: skip


def floor_bytes(shape: Shape, dtype: torch.dtype, kernel: str) -> int:
    """``Shape.floor_bytes``; for the generated forward, the input, feature map (C/4 channels)
    and output instead: its weight is never read or written."""
    if kernel != "generated forward":
        return shape.floor_bytes(dtype)
    out_h, out_w = shape.out_size
    input_ = shape.batch * shape.channels * shape.height * shape.width
    feature = shape.batch * max(1, shape.channels // 4) * out_h * out_w
    return (input_ + feature + shape.batch * shape.channels * out_h * out_w) * dtype.itemsize


def kernel_calls(o: dict) -> dict[tuple[str, str], Callable[[], object]]:
    """(candidate, kernel) -> a call, for oplib, its generic kernels, and the yardsticks."""
    shape, x, w, g, depthwise = o["shape"], o["input"], o["weight"], o["grad_output"], o["depthwise"]
    stride, padding, dilation = shape.params
    ops = torch.ops.oplib
    oplib_calls = {
        "forward": lambda: ops.involution(x, w, stride, padding, dilation),
        "grad_input": lambda: ops.involution_backward_input(g, w, [shape.height, shape.width], stride, padding, dilation),
        "grad_weight": lambda: ops.involution_backward_weight(
            g, x, [shape.kernel] * 2, stride, padding, dilation, shape.groups
        ),
    }

    calls = {("oplib", k): call for k, call in oplib_calls.items()}
    if x.is_cuda:  # the same launches under the GENERIC policy (the CPU has no chunked kernels)
        launcher = cupy_launcher()
        calls["generic", "forward"] = lambda: involution_cuda.launch_involution(x, w, stride, padding, dilation,
                                                                              launcher, GENERIC)
        calls["generic", "grad_input"] = lambda: involution_cuda.launch_involution_backward_input(
            g, w, [shape.height, shape.width], stride, padding, dilation, launcher, GENERIC)
        calls["generic", "grad_weight"] = lambda: involution_cuda.launch_involution_backward_weight(
            g, x, [shape.kernel] * 2, stride, padding, dilation, shape.groups, launcher, GENERIC)
    else:
        calls |= {("generic", k): call for k, call in oplib_calls.items()}
    f, s, b, kernel_size = o["feature"], o["span_weight"], o["span_bias"], [shape.kernel] * 2
    calls["oplib", "generated forward"] = lambda: ops.involution_generated(x, f, s, b, kernel_size, stride, padding, dilation)
    calls["generic", "generated forward"] = lambda: ops.involution(
        x, generated_weight(f, s, b, kernel_size), stride, padding, dilation
    )
    conv = (stride, padding, dilation, shape.channels)
    calls["depthwise", "forward"] = lambda: F.conv2d(x, depthwise, None, *conv)
    calls["depthwise", "grad_input"] = lambda: torch.nn.grad.conv2d_input(x.shape, depthwise, g, *conv)
    calls["unfold", "forward"] = lambda: unfold_involution(x, w, stride, padding, dilation)
    return calls


def run_kernels(shapes: list[Shape], on_rows: Optional[Callable[[float, list[dict]], object]] = None) -> tuple[float, list[dict]]:
    """Every (shape, dtype, layout): device and wall times of every candidate, interleaved over
    ROUNDS rounds. Returns the copy bandwidth and one row per (shape, dtype, layout, kernel);
    ``on_rows`` sees the bandwidth and the rows so far after each (shape, dtype, layout)."""
    bandwidth = device_copy_bandwidth()
    print(f"device copy bandwidth {bandwidth / 1e9:.0f} GB/s", flush=True)
    rows = []
    for shape in shapes:
        for dtype in DTYPES:
            for layout in LAYOUTS:
                o = operands_on(shape, dtype, layout)
                calls = kernel_calls(o)
                timers = {key: DeviceTimer(call) for key, call in calls.items()}
                readings: dict = {key: [] for key in calls}
                keys = list(calls)
                for r in range(ROUNDS):
                    for k in range(len(keys)):
                        key = keys[(r + k) % len(keys)]
                        readings[key].append(timers[key].read())
                device = {key: median(values) for key, values in readings.items()}
                walls = {key: wall_time(calls[key]) for key in calls if key[0] == "oplib"}
                for kernel in KERNELS:
                    floor = floor_bytes(shape, dtype, kernel) / bandwidth
                    yardstick = ("depthwise", "grad_input" if kernel == "grad_input" else "forward")
                    rows.append({
                        "shape": shape.name, "batch": shape.batch, "dtype": str(dtype).removeprefix("torch."), "layout": layout,
                        "kernel": kernel, "device_ms": device["oplib", kernel] * 1e3,
                        "generic_ms": device["generic", kernel] * 1e3, "floor_ms": floor * 1e3,
                        "over_floor": device["oplib", kernel] / floor, "wall_ms": walls["oplib", kernel] * 1e3,
                        "depthwise_ms": device[yardstick] * 1e3,
                        "unfold_ms": device["unfold", "forward"] * 1e3 if kernel == "forward" else None,
                    })
                print(f"{shape.name} {dtype} {layout}: " + ", ".join(
                    f"{row['kernel']} {row['device_ms']:.3f} ms ({row['over_floor']:.1f}x floor)" for row in rows[-len(KERNELS):]
                ), flush=True)
                del timers
                if on_rows is not None:
                    on_rows(bandwidth, rows)
    return bandwidth, rows


def kernel_table(rows: list[dict]) -> tuple[list[str], list[list[str]]]:
    columns = ["shape", "dtype", "layout", "kernel", "device (ms)", "floor (ms)", "device / floor",
               "generic (before, ms)", "wall per call (ms)", "depthwise 7x7 (ms)", "unfold (ms)"]  # fmt: skip
    cells = [
        [row["shape"], row["dtype"], row["layout"], row["kernel"], f"{row['device_ms']:.4f}", f"{row['floor_ms']:.4f}",
         f"{row['over_floor']:.2f}x", f"{row['generic_ms']:.4f}", f"{row['wall_ms']:.4f}", f"{row['depthwise_ms']:.4f}",
         "-" if row["unfold_ms"] is None else f"{row['unfold_ms']:.4f}"]
        for row in rows
    ]  # fmt: skip
    return columns, cells


# The tiny shape of the launch-path bar: where the host's cost is all there is.
TINY = dict(input=(1, 16, 8, 8), weight=(1, 1, 3, 3, 8, 8), window=([1, 1], [1, 1], [1, 1]))


def _empty_kernel_op():
    """A bare custom op: allocate the output and launch an empty CuPy kernel on it."""
    import cupy

    kernel = cupy.RawKernel('extern "C" __global__ void oplib_bench_empty(float* out) {}', "oplib_bench_empty")

    @torch.library.custom_op("oplib_bench::empty_kernel", mutates_args=())
    def empty_kernel(x: Tensor) -> Tensor:
        out = torch.empty_like(x)
        kernel((1,), (32,), (out.data_ptr(),))  # CuPy's null stream: PyTorch's default stream too
        return out

    return empty_kernel


def run_tiny() -> dict[str, float]:
    """Wall seconds per call, interleaved over ROUNDS rounds: oplib's involution at the tiny
    shape and the bare custom op launching an empty kernel on a tensor of the same size."""
    x = torch.randn(*TINY["input"], device="cuda")
    w = torch.randn(*TINY["weight"], device="cuda")
    empty = _empty_kernel_op()
    calls = {
        "oplib involution": lambda: torch.ops.oplib.involution(x, w, *TINY["window"]),
        "custom_op + empty CuPy kernel": lambda: empty(x),
    }
    readings: dict = {name: [] for name in calls}
    for r in range(ROUNDS):
        for name in list(calls)[r % 2:] + list(calls)[: r % 2]:
            readings[name].append(wall_time(calls[name], calls=2000))
    return {name: median(values) for name, values in readings.items()}


# --cuda-models: which of the model table's modes run (compiling the two models is minutes)
MODEL_MODES = {"all": ("eager", "compiled"), "eager": ("eager",), "none": ()}


def run_models(batch: int = BATCH, size: int = 224, modes: tuple[str, ...] = ("eager", "compiled"),
               on_row: Optional[Callable[[list[list[str]]], object]] = None) -> list[list[str]]:
    """RedNet-50 vs ResNet-50: img/s of a training step (bf16 autocast, channels_last, SGD)
    and of inference, in each of ``modes`` ("eager", "compiled": torch.compile), on the GPU.
    ``on_row`` sees the rows so far after each one (the caller's report is kept current)."""
    from oplib.models import rednet50
    from rednet import resnet50

    rows = []
    images = torch.randn(batch, 3, size, size, device="cuda").contiguous(memory_format=torch.channels_last)
    labels = torch.randint(0, 1000, (batch,), device="cuda")
    for mode in modes:
        for task in ("train", "inference"):
            seconds = {}
            for name, build in (("RedNet-50", rednet50), ("ResNet-50", resnet50)):
                torch.manual_seed(0)
                model = build().cuda().to(memory_format=torch.channels_last)
                forward = torch.compile(model) if mode == "compiled" else model
                optimizer = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)

                def step(model=model, forward=forward, optimizer=optimizer):
                    with torch.autocast("cuda", dtype=torch.bfloat16):
                        if task == "train":
                            model.train()
                            optimizer.zero_grad(set_to_none=True)
                            F.cross_entropy(forward(images), labels).backward()
                            optimizer.step()
                        else:
                            model.eval()
                            with torch.no_grad():
                                forward(images)

                for _ in range(3):
                    step()  # compiles, warms cuDNN's and oplib's caches
                seconds[name] = median(wall_time(step, calls=10) for _ in range(ROUNDS))
                del model, forward, optimizer
                torch.cuda.empty_cache()
            rows.append([
                f"{task}, {mode}", str(batch), f"{batch / seconds['RedNet-50']:.0f}", f"{batch / seconds['ResNet-50']:.0f}",
                f"{seconds['ResNet-50'] / seconds['RedNet-50']:.2f}x",
            ])  # fmt: skip
            print(" | ".join(rows[-1]), flush=True)
            if on_row is not None:
                on_row(rows)
    return rows
