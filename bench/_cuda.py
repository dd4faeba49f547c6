"""The CUDA half of bench/involution.py (``--cuda-only``; ``make gpu-check`` runs each stage in
a process of its own through tools/gpu_check.py). Its stages:

- ``kernels``: per kernel (forward, grad_input, grad_weight, the generated forward and
  grad_input) at
  RedNet-50's eight shapes, batch 32, float32 and bfloat16, NCHW and channels_last:
    - device time: ``REPEATS`` calls captured in one CUDA graph and replayed between CUDA
      events, so the GPU runs them back to back and no host time is in the reading;
    - wall time per call: ``time.perf_counter`` around many calls, synchronised once at the end
      (the host's cost when it is the slower side);
    - the DRAM floor: the bytes the kernel must read and write once (``Shape.floor_bytes``), over
      the device-to-device copy bandwidth measured in the same run, and the ratio to it;
    - "generic (before)": the same call forced onto the generic kernels of involution.cu (the
      kernels every geometry took before the specialised ones), timed in the same rounds;
    - yardsticks: the depthwise convolution of the same kernel (its forward for the forward and
      grad_weight, its input gradient for grad_input) and, for the forward, the unfold formulation.
  "generated forward" is ``involution_generated`` (the weight formed inside the kernel from a
  feature map of C/4 channels and the span matrix): its floor is the input, the feature map and
  the output (the weight is never touched), and its "generic (before)" column is the path it
  replaces, the span 1x1 conv writing the weight, then oplib's involution forward; its "tiled"
  column the tiled fused kernel of span_tile.cu (``involution_generated_tile``) and its "tensor
  cores" column generated_mma.cu's (``involution_generated_mma``, 16-bit dtypes), timed beside it
  until it becomes the op's default; the "tensor cores" column of grad_input is generated_mma.cu's
  grad_input of ``involution_generated`` (``involution_generated_mma_backward_input``: the weights
  formed inside it, where the row's oplib kernel reads the span conv's map), and its "staged"
  column the other (``involution_generated_mma_backward_input_staged``: a kernel row's weights
  formed on tensor cores into shared memory, summed by FMAs), where it serves the call, as the
  generated forward's "staged" column is ``involution_generated_mma_staged`` (a tile's weights of
  all its taps formed so, then summed with the input staged beside them; both staged kernels'
  float32 ways in 3xTF32, timed in the float32 rows too), and its "dense window" column
  ``involution_generated_dense_window`` (16-bit, maps a block holds whole: a (sample, group) a
  block, the window a dense matrix and the aggregation a tensor-core product), grad_input's
  ``involution_generated_dense_window_backward_input`` (the matrix's transpose times
  grad_output), and grad_weight's ``involution_dense_window_backward_weight`` (the products of
  grad_output and the input on tensor cores, gathered at the taps, a small map whole and a
  larger one in bands of output rows: the ``dense_window`` policy's grad_weight); where the op runs
  involution_vectors.cu's NCHW kernel (a vector of pixels a lane: the forward, stride-1
  grad_input and grad_weight at widths a multiple of the vector), the "chunked" column is the
  chunked kernel that serves the call without it (the ``CHUNKED`` policy), timed beside it (the
  sixth H200 draw, before the vectors kernels became the ops', timed them in a "vectors" column
  beside the chunked kernels), and the forward's "vectors, narrow" and "vectors, wide" columns
  the vectors forward at a thread's channels (``VECTORS_NARROW``) and at twice as many (its WIDE
  instantiations, ``VECTORS_WIDE``; the op takes them where the GPU's build of them does not
  spill nor cost a resident block, ``vectors_wide``), the one the op's call does not take; the
  "lanes on channels" column of a channels_last row is the
  call under the ``LAST`` policy (a lane a 16-byte vector of a group's channels, DCNv4's
  mapping: involution_last.cu's kernels, the forward's and grad_weight's two pixels a lane
  (``LAST_PAIRS``), grad_input's a block a segment of a band of rows, grad_weight's group summed
  by shuffles; the "a pixel a lane" column, the forward's and grad_weight's with one pixel a
  lane (``LAST_ONE_PIXEL``), which the host takes where pairs leave the GPU short of a wave of
  blocks; the "vector a thread" column, grad_input's other candidate under it, the chunked kernel
  at one vector a thread), timed beside the op's call until a draw has measured it, where it
  launches something else; "generated grad_input" is ``involution_generated_backward_input``,
  which goes through the weight map (the span conv, then involution's grad_input kernel), its
  floor grad_output, the feature map and grad_input, and its "generic (before)" column its
  generic kernel (``involution_generated_backward_input_generic``, the weights formed in
  registers), the op's CUDA kernel before the map route; "generator grads" is
  ``involution_generated_backward_generator`` (the fused path's gradients of the feature,
  span_weight and span_bias), its floor grad_output, the input, the feature map and grad_feature;
  its "generic (before)" column the map route (``generator_grads_through_map``: the map in float32
  by involution's grad_weight kernels, then cuBLAS's contractions), the op's CUDA path while
  ``GENERATOR_ON_TENSOR_CORES`` is off, and its "tensor cores" column (bfloat16) the op's writer
  with generated_mma.cu's tensor-core kernel (the map never written, its partial sums added up by
  torch), and its "dense window" column the route through the map written in float32 by the
  dense window's grad_weight kernel from the 16-bit operands (``generator_grads_through_dense_map``,
  the ``dense_window`` policy's);
- ``layer``: the whole ``oplib.nn.Involution2d`` layer, fused (``fused=True``) and unfused
  (``fused=False``; and unfused under the ``LAST`` launch policy, ``launch_policy``), against a
  depthwise ``torch.nn.Conv2d`` of the same kernel, at the same shapes, bfloat16
  channels_last and float32 NCHW, forward (eval, no_grad) and forward+backward (train), device
  time (``oplib.benchmark``'s CUDA clock: graph replays between events);
- ``launch``: the host's time per call at a tiny shape, oplib's involution against a bare
  custom op of the same schema (two tensors, three int lists) that allocates its result and
  launches an empty kernel through the same launcher; and per training step (forward +
  backward under autocast), the op with direct calls and through the dispatcher, and the
  Involution2d layer against the 3x3 convolution a ResNet bottleneck has in its place;
- ``tuning``: RedNet-50 with oplib's kernels tuned (``oplib.kernels.cuda_plan.set_cuda_tuning``:
  at each new call signature every candidate writer of the op timed on the GPU, the fastest
  kept), unfused and fused, beside RedNet-50 on its default kernels and ResNet-50, batch 32,
  bf16 autocast, channels_last: eager training and inference steps in wall time, and inference
  replayed from a CUDA graph of the eager forward (device time: what reduce-overhead gives
  without inductor); and every signature tuning met, each candidate's device time and the one
  kept (``tuning_choices``);
- ``models``: RedNet-50 against a torch.nn ResNet-50 (bench/rednet.py's; no torchvision
  needed), bf16 autocast and channels_last, training step and inference, batch 32 and 128,
  eager, ``torch.compile`` and ``torch.compile(mode="reduce-overhead")``, in images per second,
  the rows in the order of ``MODEL_ROWS`` (each compiled row compiles both models: minutes).

Each runs on a ``Target``: the GPU, or a dry run (``Target.dry()``, ``--dry``) on the CPU with
the sizes of ``DRY``: CPU tensors, the CUDA kernels through the host emulation where a launcher
is named (``oplib.testing.cuda_emulation``), ``time.perf_counter`` in place of CUDA events,
aot_eager in place of inductor: the same code end to end, so that a broken stage shows here,
not on a GPU lease. Its figures are not GPU figures.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import functools
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from statistics import median
from typing import Any, Optional

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from oplib.benchmark import REDNET50_SHAPES, Shape, call, capture_graph, cpu_model, device_copy_bandwidth, ratio, unfold_involution
from oplib.kernels import CUDA_DISPATCH, KernelSource, Launcher, cupy_launcher, linear_config
from oplib.kernels.involution import cuda as involution_cuda
from oplib.kernels.involution.cpu import generated_weight, generator_grads_through_map
from oplib.kernels.involution.layouts import is_channels_last, result_like, weight_result
from oplib.ops.involution_generated import _generator_grads_result as generator_grads_result
from oplib.testing.device_model import RecordingLauncher

BATCH = 32
DTYPES = (torch.float32, torch.bfloat16)
LAYOUTS = ("NCHW", "channels_last")
KERNELS = ("forward", "grad_input", "grad_weight", "generated forward", "generated grad_input", "generator grads")
REPEATS = 20  # calls per captured graph
ROUNDS = 5  # interleaved rounds; a time is the median over them

# The launch policy with no chunked kernel: every call runs involution.cu's generic kernels.
GENERIC = dataclasses.replace(involution_cuda.POLICY, kernel_sizes=())

# The models table, most wanted first: its report is rewritten after each row, so a run cut
# short keeps the rows it finished. (task, mode, batch); a compiled row compiles both models.
MODEL_ROWS = tuple(
    [(task, "eager", batch) for batch in (32, 128) for task in ("train", "inference")]
    + [(task, mode, batch) for batch in (32, 128) for mode in ("compiled", "reduce-overhead")
       for task in ("inference", "train")]
)  # fmt: skip
# --cuda-models: which of the model table's modes run
MODEL_MODES = {"all": ("eager", "compiled", "reduce-overhead"), "eager": ("eager",), "none": ()}


@dataclass(frozen=True)
class Plan:
    """The sizes of a run of the stages: the GPU's (``GPU``) or a dry run's (``DRY``)."""

    shapes: tuple[Shape, ...]  # the kernel and layer tables
    repeats: int = REPEATS
    rounds: int = ROUNDS
    wall_calls: int = 200
    layer_rounds: int = 3
    layer_min_run_time: float = 0.05  # seconds per statement per round
    tiny_calls: int = 2000
    model_rows: tuple[tuple[str, str, int], ...] = MODEL_ROWS
    model_rounds: int = 3
    image_size: int = 224
    images_per_reading: int = 320  # steps per reading: this over the batch, at least 3
    rednet_options: tuple[tuple[str, Any], ...] = ()  # rednet50's keyword arguments

    def steps(self, batch: int) -> int:
        return max(3, self.images_per_reading // batch)


GPU = Plan(shapes=tuple(replace(s, batch=BATCH) for s in REDNET50_SHAPES))
# Tiny: two geometries the specialised kernels serve (stride 1 and 2), batch 2, and the stem's
# 3 x 3 kernel on a map the pixel-vector kernels take (a width of 12); RedNet-50 at a quarter
# of its width; each task and each mode of the model rows once, at a batch of 2 (every row of
# batch 32 compiled both models with inductor on the CPU: most of the dry run's time).
DRY = Plan(
    shapes=(Shape("dry 32@9 s1", 32, 9, 9, 1, batch=2), Shape("dry 32@9 s2", 32, 9, 9, 2, batch=2),
            Shape("dry 32@12 k3 s1", 32, 12, 12, 1, batch=2, kernel=3)),
    repeats=2, rounds=2, wall_calls=2, layer_rounds=1, layer_min_run_time=0.001, tiny_calls=20,
    model_rows=(("train", "eager", 2), ("inference", "compiled", 2), ("train", "reduce-overhead", 2)),
    model_rounds=1, image_size=32, images_per_reading=2, rednet_options=(("width", 16), ("group_channels", 8)),
)  # fmt: skip


@dataclass(frozen=True)
class Target:
    """Where the stages run: ``cuda()``, the current GPU with CuPy's launcher; ``dry()``, the
    CPU with the CUDA kernels emulated on the host."""

    device: str
    launcher: Launcher
    name: str  # the device, for the reports

    @classmethod
    def cuda(cls) -> Target:
        return cls("cuda", cupy_launcher(), torch.cuda.get_device_name())

    @classmethod
    def dry(cls) -> Target:
        from oplib.testing.cuda_emulation import EmulatedLauncher

        return cls("cpu", EmulatedLauncher(), f"dry run on the CPU ({cpu_model()}), CUDA kernels emulated")

    @property
    def is_dry(self) -> bool:
        return self.device == "cpu"

    def synchronize(self) -> None:
        if not self.is_dry:
            torch.cuda.synchronize()

    def load_kernels(self) -> None:
        """Every CUDA kernel loaded before anything is timed (``oplib.kernels.load``; a dry
        run builds the host emulation of each source)."""
        if self.is_dry:
            from oplib.kernels.cuda_source import cuda_sources, load_source
            from oplib.testing.cuda_emulation import build

            for name in cuda_sources():
                build(load_source(name))
        else:
            from oplib.kernels import load

            load()

    def timer(self, fn: Callable[[], object], repeats: int) -> Callable[[], float]:
        """Seconds per call of ``fn``: on the GPU, ``repeats`` calls captured in one CUDA graph
        and replayed between CUDA events; dry, ``repeats`` calls between perf_counter readings."""
        if not self.is_dry:
            return DeviceTimer(fn, repeats).read
        fn()

        def read() -> float:
            start = time.perf_counter()
            for _ in range(repeats):
                fn()
            return (time.perf_counter() - start) / repeats

        return read

    def copy_bandwidth(self) -> float:
        """Bytes per second read + written by a large device copy (dry: 64 MiB on the CPU)."""
        if not self.is_dry:
            return device_copy_bandwidth()
        src = torch.randn(1 << 24)
        dst = torch.empty_like(src)
        seconds = min(self.timer(lambda: dst.copy_(src), 3)() for _ in range(3))
        return 2 * src.numel() * src.element_size() / seconds

    def autocast(self) -> torch.autocast:
        return torch.autocast(self.device, dtype=torch.bfloat16)

    def compile(self, module: nn.Module, mode: str) -> Callable[..., Tensor]:
        """``module`` as the models table runs it in ``mode``: eager, ``torch.compile``, or
        ``torch.compile(mode="reduce-overhead")``; dry, both compiled modes through aot_eager
        (inductor's CPU compile of the two models would take the dry run ten minutes)."""
        if mode == "eager":
            return module
        if self.is_dry:
            return torch.compile(module, backend="aot_eager", dynamic=False)
        return torch.compile(module, mode=None if mode == "compiled" else mode, dynamic=False)


class DeviceTimer:
    """A call captured ``repeats`` times into a CUDA graph (``oplib.benchmark.capture_graph``):
    ``read()`` replays it between CUDA events and returns seconds per call."""

    def __init__(self, fn: Callable[[], object], repeats: int = REPEATS):
        self.repeats = repeats
        self.graph = capture_graph(fn, repeats)
        self.start, self.end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)

    def read(self) -> float:
        torch.cuda.synchronize()
        self.graph.replay()  # warm
        self.start.record()
        self.graph.replay()
        self.end.record()
        self.end.synchronize()
        return self.start.elapsed_time(self.end) / 1e3 / self.repeats


def wall_time(fn: Callable[[], object], calls: int = 200, target: Optional[Target] = None) -> float:
    """Seconds per call on the host: ``calls`` calls, then one synchronise."""
    synchronize = torch.cuda.synchronize if target is None else target.synchronize
    fn()
    synchronize()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    synchronize()
    return (time.perf_counter() - start) / calls


# ---------------------------------------------------------------------------------------
# kernels
# ---------------------------------------------------------------------------------------


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
    and output instead: its weight is never read or written (the generated grad_input: grad_input,
    the feature map and grad_output, the same sizes; the generator grads: grad_output, the input,
    the feature map and grad_feature, span_weight's gradients a few KB)."""
    if kernel not in ("generated forward", "generated grad_input", "generator grads"):
        return shape.floor_bytes(dtype)
    out_h, out_w = shape.out_size
    input_ = shape.batch * shape.channels * shape.height * shape.width
    feature = shape.batch * max(1, shape.channels // 4) * out_h * out_w
    features = 2 * feature if kernel == "generator grads" else feature
    return (input_ + features + shape.batch * shape.channels * out_h * out_w) * dtype.itemsize


def _oplib_ops(x: Tensor, launcher: Optional[Launcher]) -> dict[str, Callable[..., Tensor]]:
    """The four ops as a GPU runs them: the registered ops on CUDA tensors (or on CPU tensors
    with no launcher: the CPU kernels); on CPU tensors with ``launcher``, each op's CUDA
    dispatch (``oplib.kernels.CUDA_DISPATCH``) over it, the CUDA kernels emulated."""
    names = {"forward": "involution", "grad_input": "involution_backward_input",
             "grad_weight": "involution_backward_weight", "generated forward": "involution_generated",
             "generated grad_input": "involution_generated_backward_input"}  # fmt: skip
    if x.is_cuda or launcher is None:
        return {key: getattr(torch.ops.oplib, name) for key, name in names.items()}
    return {key: functools.partial(_dispatch, CUDA_DISPATCH[f"oplib::{name}"], launcher) for key, name in names.items()}


def _dispatch(dispatch, launcher: Launcher, *args) -> Tensor:
    return dispatch(*args, launcher)


def launched(launches: Sequence[Any]) -> list[tuple]:
    """What recorded launches (``oplib.testing.device_model.Launch``) launched: each kernel with
    its template and scalar arguments, what two policies' launches of one call are compared by."""
    return [(launch.kernel, launch.specialisation, launch.scalars) for launch in launches]


class _Probe(RecordingLauncher):
    """A launcher that records the op's launches instead of making them (a launch here would be a
    kernel of no call in Nsight Compute's list), answering the host's questions of the GPU's build
    (``local_bytes`` and ``occupancy``: the vectors forward's width) through ``launcher`` where it
    can, so that it records what the op's call launches there."""

    def __init__(self, launcher: Optional[Launcher]):
        super().__init__()
        self._local_bytes = getattr(launcher, "local_bytes", None)
        self._occupancy = getattr(launcher, "occupancy", None)

    def local_bytes(self, *question):
        return None if self._local_bytes is None else self._local_bytes(*question)

    def occupancy(self, *question):
        return None if self._occupancy is None else self._occupancy(*question)


def kernel_calls(o: dict, launcher: Optional[Launcher] = None) -> dict[tuple[str, str], Callable[[], object]]:
    """(candidate, kernel) -> a call, for oplib, its generic kernels, and the yardsticks. On
    CUDA tensors the launches go through CuPy's launcher; on CPU tensors through ``launcher``
    (a dry run's emulation), or with none, the CPU path stands in for both oplib and generic."""
    shape, x, w, g, depthwise = o["shape"], o["input"], o["weight"], o["grad_output"], o["depthwise"]
    stride, padding, dilation = shape.params
    ops = _oplib_ops(x, launcher)
    size, kernel_size = [shape.height, shape.width], [shape.kernel] * 2
    oplib_calls = {
        "forward": lambda: ops["forward"](x, w, stride, padding, dilation),
        "grad_input": lambda: ops["grad_input"](g, w, size, stride, padding, dilation),
        "grad_weight": lambda: ops["grad_weight"](g, x, kernel_size, stride, padding, dilation, shape.groups),
    }
    calls = {("oplib", k): call for k, call in oplib_calls.items()}
    launcher = cupy_launcher() if x.is_cuda else launcher
    if launcher is not None:  # the same launches under the GENERIC policy
        calls["generic", "forward"] = lambda: involution_cuda.launch_involution(x, w, stride, padding, dilation,
                                                                              launcher, GENERIC)
        calls["generic", "grad_input"] = lambda: involution_cuda.launch_involution_backward_input(
            g, w, size, stride, padding, dilation, launcher, GENERIC)
        calls["generic", "grad_weight"] = lambda: involution_cuda.launch_involution_backward_weight(
            g, x, kernel_size, stride, padding, dilation, shape.groups, launcher, GENERIC)
    else:
        calls |= {("generic", k): call for k, call in oplib_calls.items()}
    f, s, b = o["feature"], o["span_weight"], o["span_bias"]
    calls["oplib", "generated forward"] = lambda: ops["generated forward"](x, f, s, b, kernel_size, stride, padding, dilation)
    if launcher is not None:  # each fused kernel on its own (the op takes the first that serves the call)
        calls["tiled", "generated forward"] = lambda: involution_cuda.involution_generated_tile(
            x, f, s, b, kernel_size, stride, padding, dilation, result_like(x, f.shape[2:]), launcher)
        if x.dtype in involution_cuda.GENERATED_MMA_DTYPES:
            calls["tensor cores", "generated forward"] = lambda: involution_cuda.involution_generated_mma(
                x, f, s, b, kernel_size, stride, padding, dilation, result_like(x, f.shape[2:]), launcher)
            # grad_input with the weights formed inside (the grad_input row's oplib reads the map)
            calls["tensor cores", "grad_input"] = lambda: involution_cuda.involution_generated_mma_backward_input(
                g, f, s, b, size, kernel_size, stride, padding, dilation, result_like(g, size), launcher)
        # the staged kernels: 16-bit on tensor cores, float32 in 3xTF32
        source = involution_cuda.load_source(involution_cuda.GENERATED_MMA_SOURCE)
        if involution_cuda.generated_mma_staged_config(source, x.dtype, shape.batch, shape.channels, shape.groups,
                                                       size, kernel_size, stride, dilation, f.shape[1]) is not None:
            calls["staged", "grad_input"] = lambda: involution_cuda.involution_generated_mma_backward_input_staged(
                g, f, s, b, size, kernel_size, stride, padding, dilation, result_like(g, size), launcher)
        if involution_cuda.generated_mma_staged_forward_config(source, x.dtype, shape.batch, shape.channels,
                                                               shape.groups, f.shape[2:], kernel_size, stride,
                                                               dilation, f.shape[1]) is not None:
            calls["staged", "generated forward"] = lambda: involution_cuda.involution_generated_mma_staged(
                x, f, s, b, kernel_size, stride, padding, dilation, result_like(x, f.shape[2:]), launcher)
        # the dense window forward (16-bit, maps a block holds whole)
        if involution_cuda.dense_window_config(involution_cuda.load_source(involution_cuda.DENSE_WINDOW_SOURCE), x.dtype,
                                               shape.batch, shape.groups, size, f.shape[2:], kernel_size, f.shape[1],
                                               is_channels_last(x), dilation=dilation) is not None:
            calls["dense window", "generated forward"] = lambda: involution_cuda.involution_generated_dense_window(
                x, f, s, b, kernel_size, stride, padding, dilation, result_like(x, f.shape[2:]), launcher)
            calls["dense window", "grad_input"] = (
                lambda: involution_cuda.involution_generated_dense_window_backward_input(
                    g, f, s, b, size, kernel_size, stride, padding, dilation, result_like(g, size), launcher))
        # involution's grad_weight on tensor cores (16-bit; small maps whole, larger ones in bands of rows)
        if involution_cuda.dense_weight_config(involution_cuda.load_source(involution_cuda.DENSE_WINDOW_SOURCE), x.dtype,
                                               shape.batch, shape.groups, size, g.shape[2:], kernel_size, stride,
                                               is_channels_last(x), dilation=dilation) is not None:
            weight_shape = (shape.batch, shape.groups, *kernel_size, *g.shape[2:])
            calls["dense window", "grad_weight"] = lambda: involution_cuda.involution_dense_window_backward_weight(
                g, x, kernel_size, stride, padding, dilation, shape.groups,
                weight_result(g, weight_shape, is_channels_last(x)), launcher)
    if launcher is not None:  # the chunked kernel beside the op's call where the op takes involution_vectors.cu's
        dispatches = {
            "forward": lambda run, policy=None: involution_cuda.launch_involution(x, w, stride, padding, dilation, run,
                                                                                 policy),
            "grad_input": lambda run, policy=None: involution_cuda.launch_involution_backward_input(
                g, w, size, stride, padding, dilation, run, policy),
            "grad_weight": lambda run, policy=None: involution_cuda.launch_involution_backward_weight(
                g, x, kernel_size, stride, padding, dilation, shape.groups, run, policy),
        }
        for kernel, dispatch in dispatches.items():
            # which kernel the op's dispatch takes, asked of a launcher that records instead of
            # launching: a launch here would be a kernel of no call in Nsight Compute's list (the
            # sixth draw's were)
            probe = _Probe(launcher)
            dispatch(probe)
            if probe.launches and probe.launches[0].kernel.endswith("_vectors"):
                calls["chunked", kernel] = functools.partial(dispatch, launcher, involution_cuda.CHUNKED)
                # the vectors forward at a thread's channels and at twice as many (its WIDE
                # instantiations, which the host takes where the GPU's build neither spills nor
                # costs a resident block): the one the op's call does not take, beside it
                for width, policy in (("narrow", involution_cuda.VECTORS_NARROW), ("wide", involution_cuda.VECTORS_WIDE)):
                    other = RecordingLauncher()
                    dispatch(other, policy)
                    if launched(other.launches) != launched(probe.launches):
                        calls[f"vectors {width}", kernel] = functools.partial(dispatch, launcher, policy)
            # a lane a vector of a group's channels (the ``LAST`` policy; the forward's and
            # grad_weight's lanes two pixels each, whatever the GPU) where that launches something
            # else than the op's policy: beside the op's call, not yet its kernels; and beside it
            # the same kernels with a pixel a lane (the host's choice where pairs would leave the
            # GPU short of a wave, ``last_pixels``)
            lanes_on_channels = RecordingLauncher()
            dispatch(lanes_on_channels, involution_cuda.LAST_PAIRS)
            if launched(lanes_on_channels.launches) != launched(probe.launches):
                calls["lanes on channels", kernel] = functools.partial(dispatch, launcher, involution_cuda.LAST_PAIRS)
            one_pixel = RecordingLauncher()
            dispatch(one_pixel, involution_cuda.LAST_ONE_PIXEL)
            if launched(one_pixel.launches) not in (launched(probe.launches), launched(lanes_on_channels.launches)):
                calls["a pixel a lane", kernel] = functools.partial(dispatch, launcher, involution_cuda.LAST_ONE_PIXEL)
            if kernel != "grad_input":
                continue
            # grad_input's other candidate under it: the chunked kernel at a vector a thread
            vector = RecordingLauncher()
            dispatch(vector, involution_cuda.LAST_VECTOR_GRAD_INPUT)
            if launched(vector.launches) not in (launched(probe.launches), launched(lanes_on_channels.launches)):
                calls["vector a thread", kernel] = functools.partial(dispatch, launcher,
                                                                     involution_cuda.LAST_VECTOR_GRAD_INPUT)
    # span conv + involution as Involution2d's unfused path runs them: its span conv is cuDNN's
    calls["generic", "generated forward"] = lambda: ops["forward"](
        x, generated_weight(f, s, b, kernel_size, by_matmul=False), stride, padding, dilation
    )
    calls["oplib", "generated grad_input"] = lambda: ops["generated grad_input"](g, f, s, b, size, kernel_size, stride,
                                                                               padding, dilation)
    if launcher is not None:  # the generic kernel, the op's before the map route
        calls["generic", "generated grad_input"] = lambda: involution_cuda.involution_generated_backward_input_generic(
            g, f, s, b, size, kernel_size, stride, padding, dilation, result_like(g, size), launcher)
    else:
        calls["generic", "generated grad_input"] = calls["oplib", "generated grad_input"]
    generator = (g, f, s, x, kernel_size, stride, padding, dilation)
    if x.is_cuda or launcher is None:  # the op (the CPU's where the dry run has no launcher)
        calls["oplib", "generator grads"] = lambda: torch.ops.oplib.involution_generated_backward_generator(*generator)
    else:  # its CUDA writer over the dry run's emulation
        calls["oplib", "generator grads"] = lambda: involution_cuda.involution_generated_backward_generator(
            *generator, generator_grads_result(*generator), launcher)
    # the map route, the op's CUDA path before the tensor-core kernel (while that is not the
    # default, the op's path too)
    calls["generic", "generator grads"] = lambda: generator_grads_through_map(*generator,
                                                                              generator_grads_result(*generator))
    if launcher is not None and x.dtype in involution_cuda.GENERATED_MMA_GENERATOR_DTYPES:
        # the op's writer with the tensor-core kernel: the kernel and torch's sum of its partials
        calls["tensor cores", "generator grads"] = lambda: involution_cuda.involution_generated_backward_generator(
            *generator, generator_grads_result(*generator), launcher, tensor_cores=True)
    if launcher is not None and ("dense window", "grad_weight") in calls:
        # the dense map route: the map in float32 by the dense window's grad_weight, then contracted
        calls["dense window", "generator grads"] = lambda: involution_cuda.generator_grads_through_dense_map(
            *generator, generator_grads_result(*generator), launcher)
    conv = (stride, padding, dilation, shape.channels)
    calls["depthwise", "forward"] = lambda: F.conv2d(x, depthwise, None, *conv)
    calls["depthwise", "grad_input"] = lambda: torch.nn.grad.conv2d_input(x.shape, depthwise, g, *conv)
    calls["unfold", "forward"] = lambda: unfold_involution(x, w, stride, padding, dilation)
    return calls


# The shape Nsight Compute profiles each kernel at (tools/gpu_check.py, stage ncu): mid-network,
# where the kernel table's device time is furthest from the floor relative to its size.
NCU_SHAPE = replace(REDNET50_SHAPES[1], batch=BATCH)


def profiled_calls(o: dict, launcher: Optional[Launcher] = None) -> dict[str, Callable[[], object]]:
    """Each of oplib's kernels once: the five ops as they run (``kernel_calls``' oplib calls; the
    generated grad_input's span conv is cuBLAS's, which ncu leaves out), the three involution ops
    forced onto the generic kernels and the generated grad_input's generic kernel (its generic
    calls), the fused and chunked kernels timed beside them; no yardstick (ncu profiles only
    kernels named involution*)."""
    calls = kernel_calls(o, launcher)
    profiled = {f"{candidate} {kernel}": calls[candidate, kernel]
                for candidate in ("oplib", "generic") for kernel in KERNELS if (candidate, kernel) != ("generic", "generated forward")}
    for candidate in ("tiled", "tensor cores", "staged", "dense window"):
        if (candidate, "generated forward") in calls:
            profiled[f"{candidate} generated forward"] = calls[candidate, "generated forward"]
    if ("tensor cores", "grad_input") in calls:
        profiled["tensor cores generated grad_input"] = calls["tensor cores", "grad_input"]
    if ("staged", "grad_input") in calls:
        profiled["staged generated grad_input"] = calls["staged", "grad_input"]
    if ("dense window", "grad_input") in calls:
        profiled["dense window generated grad_input"] = calls["dense window", "grad_input"]
    if ("tensor cores", "generator grads") in calls:
        profiled["tensor cores generator grads"] = calls["tensor cores", "generator grads"]
    for kernel in ("forward", "grad_input", "grad_weight"):
        if ("chunked", kernel) in calls:
            profiled[f"chunked {kernel}"] = calls["chunked", kernel]
        if ("lanes on channels", kernel) in calls:
            profiled[f"lanes on channels {kernel}"] = calls["lanes on channels", kernel]
        if ("a pixel a lane", kernel) in calls:
            profiled[f"a pixel a lane {kernel}"] = calls["a pixel a lane", kernel]
        for width in ("narrow", "wide"):
            if (f"vectors {width}", kernel) in calls:
                profiled[f"vectors {width} {kernel}"] = calls[f"vectors {width}", kernel]
        if ("vector a thread", kernel) in calls:
            profiled[f"vector a thread {kernel}"] = calls["vector a thread", kernel]
    return profiled


def run_kernels(shapes: Sequence[Shape], on_rows: Optional[Callable[[float, list[dict]], object]] = None,
                target: Optional[Target] = None, plan: Plan = GPU) -> tuple[float, list[dict]]:
    """Every (shape, dtype, layout): device and wall times of every candidate, interleaved over
    ``plan.rounds`` rounds. Returns the copy bandwidth and one row per (shape, dtype, layout,
    kernel); ``on_rows`` sees the bandwidth and the rows so far after each (shape, dtype, layout)."""
    target = target or Target.cuda()
    bandwidth = target.copy_bandwidth()
    print(f"device copy bandwidth {bandwidth / 1e9:.0f} GB/s", flush=True)
    rows = []
    for shape in shapes:
        for dtype in DTYPES:
            for layout in LAYOUTS:
                o = operands_on(shape, dtype, layout, target.device)
                calls = kernel_calls(o, target.launcher)
                timers = {key: target.timer(call, plan.repeats) for key, call in calls.items()}
                readings: dict = {key: [] for key in calls}
                keys = list(calls)
                for r in range(plan.rounds):
                    for k in range(len(keys)):
                        key = keys[(r + k) % len(keys)]
                        readings[key].append(timers[key]())
                device = {key: median(values) for key, values in readings.items()}
                walls = {key: wall_time(calls[key], plan.wall_calls, target) for key in calls if key[0] == "oplib"}
                for kernel in KERNELS:
                    floor = floor_bytes(shape, dtype, kernel) / bandwidth
                    yardstick = ("depthwise", "grad_input" if kernel.endswith("grad_input") else "forward")
                    rows.append({
                        "shape": shape.name, "batch": shape.batch, "dtype": str(dtype).removeprefix("torch."), "layout": layout,
                        "kernel": kernel, "device_ms": device["oplib", kernel] * 1e3,
                        "generic_ms": device["generic", kernel] * 1e3, "floor_ms": floor * 1e3,
                        "over_floor": device["oplib", kernel] / floor, "wall_ms": walls["oplib", kernel] * 1e3,
                        "depthwise_ms": device[yardstick] * 1e3,
                        "unfold_ms": device["unfold", "forward"] * 1e3 if kernel == "forward" else None,
                        "tiled_ms": device["tiled", kernel] * 1e3 if ("tiled", kernel) in device else None,
                        "tensor_cores_ms": device["tensor cores", kernel] * 1e3 if ("tensor cores", kernel) in device else None,
                        "chunked_ms": device["chunked", kernel] * 1e3 if ("chunked", kernel) in device else None,
                        "lanes_on_channels_ms": (device["lanes on channels", kernel] * 1e3
                                                 if ("lanes on channels", kernel) in device else None),
                        "a_pixel_a_lane_ms": (device["a pixel a lane", kernel] * 1e3
                                              if ("a pixel a lane", kernel) in device else None),
                        "vectors_narrow_ms": (device["vectors narrow", kernel] * 1e3
                                              if ("vectors narrow", kernel) in device else None),
                        "vectors_wide_ms": (device["vectors wide", kernel] * 1e3
                                            if ("vectors wide", kernel) in device else None),
                        "vector_a_thread_ms": (device["vector a thread", kernel] * 1e3
                                               if ("vector a thread", kernel) in device else None),
                        "staged_ms": device["staged", kernel] * 1e3 if ("staged", kernel) in device else None,
                        "dense_window_ms": (device["dense window", kernel] * 1e3
                                            if ("dense window", kernel) in device else None),
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
               "generic (before, ms)", "wall per call (ms)", "depthwise (ms)", "unfold (ms)", "tiled (ms)",
               "tensor cores (ms)", "chunked (ms)", "lanes on channels (ms)", "vector a thread (ms)",
               "staged (ms)", "dense window (ms)", "a pixel a lane (ms)", "vectors, narrow (ms)",
               "vectors, wide (ms)"]  # fmt: skip
    cells = [
        [row["shape"], row["dtype"], row["layout"], row["kernel"], f"{row['device_ms']:.4f}", f"{row['floor_ms']:.4f}",
         f"{row['over_floor']:.2f}x", f"{row['generic_ms']:.4f}", f"{row['wall_ms']:.4f}", f"{row['depthwise_ms']:.4f}",
         "-" if row["unfold_ms"] is None else f"{row['unfold_ms']:.4f}",
         "-" if row.get("tiled_ms") is None else f"{row['tiled_ms']:.4f}",
         "-" if row.get("tensor_cores_ms") is None else f"{row['tensor_cores_ms']:.4f}",
         "-" if row.get("chunked_ms") is None else f"{row['chunked_ms']:.4f}",
         "-" if row.get("lanes_on_channels_ms") is None else f"{row['lanes_on_channels_ms']:.4f}",
         "-" if row.get("vector_a_thread_ms") is None else f"{row['vector_a_thread_ms']:.4f}",
         "-" if row.get("staged_ms") is None else f"{row['staged_ms']:.4f}",
         "-" if row.get("dense_window_ms") is None else f"{row['dense_window_ms']:.4f}",
         "-" if row.get("a_pixel_a_lane_ms") is None else f"{row['a_pixel_a_lane_ms']:.4f}",
         "-" if row.get("vectors_narrow_ms") is None else f"{row['vectors_narrow_ms']:.4f}",
         "-" if row.get("vectors_wide_ms") is None else f"{row['vectors_wide_ms']:.4f}"]
        for row in rows
    ]  # fmt: skip
    return columns, cells


# ---------------------------------------------------------------------------------------
# layer
# ---------------------------------------------------------------------------------------

# "unfused, LAST": the unfused layer (RedNet's path on CUDA) with involution's kernels under the
# ``LAST`` launch policy (``launch_policy``), its A/B at the layer level.
UNFUSED_LAST = "unfused, LAST"
# The layer with oplib's kernels tuned (``tuned``), each path: which of the two is the faster at
# each shape with the fastest kernels there are.
TUNED_CASES = ("fused, tuned", "unfused, tuned")
LAYER_CASES = ("fused", "unfused", UNFUSED_LAST, *TUNED_CASES, "depthwise")
LAYER_MODES = ("forward", "forward+backward")
# (dtype, memory format): the training setting (bf16 autocast's dtype, channels_last) and float32 NCHW
LAYER_PRECISIONS = (("bfloat16", "channels_last"), ("float32", "NCHW"))


@contextlib.contextmanager
def launch_policy(policy: involution_cuda.LaunchPolicy):
    """involution's CUDA calls inside run under ``policy`` instead of the ops' ``POLICY``: the
    module's default swapped, and the launch plans of involution's ops (each recorded under the
    policy it was made with) dropped on the way in and out. A process-wide switch, for the
    benches' A/B of a policy on whole layers."""
    from oplib.ops._rules import CUDA_KERNELS

    def drop_plans() -> None:
        for qualname in ("oplib::involution", "oplib::involution_backward_input", "oplib::involution_backward_weight"):
            CUDA_KERNELS[qualname].plans.clear()

    saved = involution_cuda.POLICY
    involution_cuda.POLICY = policy
    drop_plans()
    try:
        yield
    finally:
        involution_cuda.POLICY = saved
        drop_plans()


def _under(policy: Optional[involution_cuda.LaunchPolicy], fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` with its calls under ``policy`` (``launch_policy``), or ``fn`` itself for None."""
    if policy is None:
        return fn

    def run(*args: Any) -> Any:
        with launch_policy(policy):
            return fn(*args)

    return run


def tuned(fn: Callable[..., Any], enabled: bool = True) -> Callable[..., Any]:
    """``fn`` with oplib's kernel tuning ``enabled`` (``oplib.kernels.cuda_tuning``) during its calls."""
    from oplib.kernels import cuda_tuning

    def run(*args: Any) -> Any:
        with cuda_tuning(enabled):
            return fn(*args)

    return run


def _layer_module(case: str, shape: Shape) -> nn.Module:
    torch.manual_seed(0)
    if case == "depthwise":
        return nn.Conv2d(shape.channels, shape.channels, shape.kernel, shape.stride, shape.kernel // 2,
                         groups=shape.channels, bias=False)
    from oplib.nn import Involution2d

    return Involution2d(shape.channels, shape.kernel, shape.stride, group_channels=shape.group_channels,
                        fused=case.startswith("fused"))  # the unfused cases: fused=False


def layer_stmts(shape: Shape, dtype: torch.dtype, layout: str, device: str) -> dict:
    """(case, mode) -> a statement: each layer in eval mode under no_grad ("forward"), and in
    train mode with a fixed grad_output backpropagated to the input and every parameter, the
    gradients then dropped ("forward+backward"); the tuned cases' calls with oplib's kernel
    tuning on (their first call tunes each signature; a CUDA graph then replays the kept
    kernels), the others' with it off."""
    fmt = torch.channels_last if layout == "channels_last" else torch.contiguous_format
    inputs = shape.inputs(device, dtype)
    x = inputs.input.contiguous(memory_format=fmt)
    grad = inputs.grad_output.contiguous(memory_format=fmt)
    stmts = {}
    for case in LAYER_CASES:
        layer = _layer_module(case, shape).to(device=device, dtype=dtype, memory_format=fmt)
        inference, training, x_grad = copy.deepcopy(layer).eval(), layer.train(), x.detach().requires_grad_()

        def forward_backward(training=training, x_grad=x_grad) -> None:
            training(x_grad).backward(grad)
            x_grad.grad = None
            training.zero_grad(set_to_none=True)

        policy = involution_cuda.LAST if case == UNFUSED_LAST else None
        tuning = case in TUNED_CASES  # the others with tuning off, whatever the process's setting
        stmts[case, "forward"] = call(tuned(_under(policy, torch.no_grad()(inference)), tuning), x)
        stmts[case, "forward+backward"] = call(tuned(_under(policy, forward_backward), tuning))
    return stmts


def run_layer(section: Any, target: Target, plan: Plan, on_rows: Optional[Callable[[list[list[str]]], object]] = None
              ) -> list[list[str]]:
    """The layer table's rows: per shape and precision, each case's device time (ms) in both
    modes and the two involutions' ratios to the depthwise convolution (``section``:
    bench/_harness.Section, its rounds and reading length set by the caller)."""
    rows = []
    for shape in plan.shapes:
        for dtype_name, layout in LAYER_PRECISIONS:
            began = time.perf_counter()
            stmts = layer_stmts(shape, getattr(torch, dtype_name), layout, target.device)
            built = time.perf_counter()
            times = section.measure(f"layer {shape.name} {dtype_name} {layout}", stmts, device=target.device)
            # The stage's budget is sized from these (the draws' logs: rows of 20-25 s before the
            # CUDA clock's readings kept to their min_run_time).
            print(f"  (row's wall time: {built - began:.1f} s building the layers, "
                  f"{time.perf_counter() - built:.1f} s capturing and timing them)", flush=True)
            row = [shape.name, f"{dtype_name}, {layout}"]
            for mode in LAYER_MODES:
                row += [f"{times[case, mode].median * 1e3:.3f}" for case in LAYER_CASES]
                row += [f"{ratio(times[case, mode], times['depthwise', mode]):.2f}x" for case in INVOLUTION_CASES]
            rows.append(row)
            if on_rows is not None:
                on_rows(rows)
    return rows


INVOLUTION_CASES = tuple(case for case in LAYER_CASES if case != "depthwise")


def layer_columns() -> list[str]:
    columns = ["shape", "precision"]
    for mode in ("fwd", "fwd+bwd"):
        columns += [f"{mode} {case} (ms)" for case in LAYER_CASES]
        columns += [f"{mode} {case} / dw" for case in INVOLUTION_CASES]
    return columns


# ---------------------------------------------------------------------------------------
# launch
# ---------------------------------------------------------------------------------------

# The tiny shape of the launch-path bar: where the host's cost is all there is.
TINY = dict(input=(1, 16, 8, 8), weight=(1, 1, 3, 3, 8, 8), window=([1, 1], [1, 1], [1, 1]))
# The keys of run_tiny's result: the op, the bare custom op, and where the op's time goes: its
# CUDA kernel called without the dispatcher (its launch plans), the host path without plans (the
# rules, the allocation, the launch policy on every call), and whether the op held a plan for
# the call after the timed calls (1.0 or 0.0; NaN where the op did not run its CUDA kernel).
OPLIB_TINY, BARE_TINY = "oplib involution", "custom_op + empty CuPy kernel"
KERNEL_TINY, UNPLANNED_TINY = "oplib's CUDA kernel alone (its launch plans)", "oplib's host path without plans"
PLAN_HELD = "plan held"
# ... and, in a training step (forward + backward under bf16 autocast), per step: the op with
# oplib's direct calls and through the dispatcher (``oplib.ops._common.DIRECT_CALLS``), the whole
# Involution2d layer (7 x 7, the generation branch and all, unfused) and a ResNet bottleneck's
# 3 x 3 convolution in its place, at the tiny input; 1 / STEP_CALLS_SHARE of the calls each.
STEP_DIRECT, STEP_DISPATCHER = "op step, direct calls", "op step, through the dispatcher"
STEP_LAYER, STEP_CONV = "Involution2d step", "Conv2d 3x3 step"
STEP_CALLS_SHARE = 10

# element.cuh defines the storage types every instantiation names (oplib_half, oplib_bfloat16).
_EMPTY_KERNEL = ('#include "element.cuh"\n\n'
                 "template <typename scalar_t>\n__global__ void oplib_bench_empty(scalar_t* out) { (void)out; }\n")


@functools.cache
def _empty_source() -> KernelSource:
    """A source with one empty kernel, written to a file (the host emulation includes it)."""
    path = Path(tempfile.mkdtemp(prefix="oplib-bench-")) / "oplib_bench_empty.cu"
    path.write_text(_EMPTY_KERNEL)
    return KernelSource(path, _EMPTY_KERNEL)


@functools.cache
def bare_op(launcher: Launcher) -> Callable[..., Tensor]:
    """A bare custom op of involution's schema (input, weight, stride, padding, dilation) whose
    kernel allocates its result and launches an empty kernel on it through ``launcher``
    (prepared once per dtype and device where the launcher can: the config checked and the
    kernel found ahead, as a launch plan does), deciding nothing: the floor of a custom op that
    launches a kernel from Python."""
    source, config, prepared = _empty_source(), linear_config(1, 32), {}

    def launch(out: Tensor) -> None:
        key = (out.dtype, out.device)
        if key not in prepared:
            if hasattr(launcher, "prepare"):
                prepared[key] = launcher.prepare(source, "oplib_bench_empty", out.dtype, config, (), out.device.index)
            else:
                prepared[key] = functools.partial(launcher.launch, source, "oplib_bench_empty", out.dtype, config)
        prepared[key]((out,))

    @torch.library.custom_op(f"oplib_bench::empty_kernel_{id(launcher)}", mutates_args=())
    def empty_kernel(input: Tensor, weight: Tensor, stride: list[int], padding: list[int], dilation: list[int]) -> Tensor:
        out = input.new_empty(input.shape[0], input.shape[1], *weight.shape[4:])
        launch(out)
        return out

    return empty_kernel


STEP_NAMES = (STEP_DIRECT, STEP_DISPATCHER, STEP_LAYER, STEP_CONV)


def _training_steps(target: Target, args: tuple) -> dict[str, Callable[[], None]]:
    """A training step's calls at the tiny input, each forward + backward under ``target``'s
    autocast (bfloat16): the op (``STEP_DIRECT``, ``STEP_DISPATCHER``), the Involution2d layer
    unfused and the 3 x 3 convolution (``STEP_LAYER``, ``STEP_CONV``), modules in train mode,
    channels_last, gradients accumulated (never read)."""
    from oplib.nn import Involution2d
    from oplib.ops import _common

    x, w, *window = args
    x, w = x.detach().requires_grad_(), w.detach().requires_grad_()
    image = x.detach().contiguous(memory_format=torch.channels_last).requires_grad_()
    channels = image.shape[1]
    layer = Involution2d(channels, 7, group_channels=channels, fused=False).to(image.device, memory_format=torch.channels_last)
    conv = nn.Conv2d(channels, channels, 3, padding=1, bias=False).to(image.device, memory_format=torch.channels_last)

    def op_step(direct: bool) -> Callable[[], None]:
        def step() -> None:
            previous, _common.DIRECT_CALLS = _common.DIRECT_CALLS, direct
            try:
                with target.autocast():
                    out = torch.ops.oplib.involution(x, w, *window)
                out.float().sum().backward()
            finally:
                _common.DIRECT_CALLS = previous

        return step

    def module_step(module: nn.Module) -> Callable[[], None]:
        def step() -> None:
            with target.autocast():
                out = module(image)
            out.float().sum().backward()

        return step

    return {STEP_DIRECT: op_step(True), STEP_DISPATCHER: op_step(False), STEP_LAYER: module_step(layer),
            STEP_CONV: module_step(conv)}


def run_tiny(target: Optional[Target] = None, plan: Plan = GPU) -> dict[str, float]:
    """Wall seconds per call, interleaved over ``plan.rounds`` rounds: oplib's involution at the
    tiny shape, the bare custom op (``bare_op``) on the same arguments, and the two parts of the
    op's path (``KERNEL_TINY``, ``UNPLANNED_TINY``); per training step, the op, the layer and a
    3 x 3 convolution (``_training_steps``); and whether the op held a launch plan for the call
    (``PLAN_HELD``)."""
    from oplib.kernels.cuda_plan import plan_key
    from oplib.ops._rules import CONTRACTS, CUDA_KERNELS, cuda_kernel

    target = target or Target.cuda()
    x = torch.randn(*TINY["input"], device=target.device)
    w = torch.randn(*TINY["weight"], device=target.device)
    args = (x, w, *TINY["window"])
    empty = bare_op(target.launcher)
    contract = CONTRACTS["oplib::involution"]
    alone = cuda_kernel(contract, lambda: target.launcher)

    def unplanned() -> Tensor:
        contract.rules.enforce(*args)
        return contract.writers["cuda"](*args, contract.result(*args), target.launcher)

    calls = {OPLIB_TINY: lambda: torch.ops.oplib.involution(*args), BARE_TINY: lambda: empty(*args),
             KERNEL_TINY: lambda: alone(*args), UNPLANNED_TINY: unplanned, **_training_steps(target, args)}
    readings: dict = {name: [] for name in calls}
    names = list(calls)
    for r in range(plan.rounds):
        for name in names[r % len(names):] + names[: r % len(names)]:
            count = plan.tiny_calls if name not in STEP_NAMES else max(2, plan.tiny_calls // STEP_CALLS_SHARE)
            readings[name].append(wall_time(calls[name], count, target))
    result = {name: median(values) for name, values in readings.items()}
    plans = CUDA_KERNELS["oplib::involution"].plans if x.is_cuda else {}
    result[PLAN_HELD] = float("nan") if not plans else float(plans.get(plan_key(args)) is not None)
    return result


# ---------------------------------------------------------------------------------------
# models
# ---------------------------------------------------------------------------------------


def _model_step(target: Target, model: nn.Module, forward: Callable[..., Tensor], task: str, mode: str,
                images: Tensor, labels: Tensor) -> Callable[[], None]:
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)
    model.train(task == "train")

    def step() -> None:
        if mode == "reduce-overhead":
            torch.compiler.cudagraph_mark_step_begin()  # each step a new iteration of the CUDA graph trees
        with target.autocast():
            if task == "train":
                optimizer.zero_grad(set_to_none=True)
                F.cross_entropy(forward(images), labels).backward()
                optimizer.step()
            else:
                with torch.no_grad():
                    forward(images)

    return step


# Steps profiled after each model row's timing (``profile_steps``): where a step's time goes.
PROFILED_STEPS = 2
# The host's calls that launch a kernel: the runtime's (torch, cuBLAS, cuDNN), the driver's
# (CuPy, Triton) and a CUDA graph's replay (reduce-overhead), as torch.profiler names them.
LAUNCH_CALLS = ("cudaLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernel", "cuLaunchKernelEx", "cudaGraphLaunch")
# The host's calls that wait for the GPU, the runtime's and the driver's: a synchronisation, or a
# copy to or from host memory that returns once the GPU has made it. A step that makes one waits
# there for every kernel it has launched, so its host and device times add up instead of
# overlapping. ``profile_steps`` ends with one ``cudaDeviceSynchronize`` of its own, not counted.
WAIT_CALLS = ("cudaDeviceSynchronize", "cudaStreamSynchronize", "cudaEventSynchronize", "cudaMemcpy",
              "cuCtxSynchronize", "cuStreamSynchronize", "cuEventSynchronize", "cuMemcpyDtoH_v2", "cuMemcpyHtoD_v2")
# What a device event's name says it is, the first kind whose words it holds (its case kept):
# a step's device time by kind (``device_kinds``), to tell a model's steps apart where their
# heaviest kernels alone do not (a layout transpose cuDNN inserts, casts, a BatchNorm's kernels).
# oplib's own kernels go by their names in its CUDA sources (``oplib_kernel_names``), first.
DEVICE_KINDS = (
    ("layout", ("nchwToNhwc", "nhwcToNchw", "ransposeKernel")),
    ("inductor", ("triton_",)),
    ("convolution", ("fprop", "dgrad", "wgrad", "conv", "Conv")),
    ("matmul", ("gemm", "Gemm", "nvjet")),
    ("batch norm", ("batch_norm", "bn_fw", "bn_bw", "welford")),
    ("optimizer", ("multi_tensor_apply",)),
    ("pooling", ("pool",)),
    ("copy", ("Memcpy", "Memset", "copy")),
    ("reduction", ("reduce_kernel",)),
    ("elementwise", ("elementwise",)),
)


@functools.cache
def oplib_kernel_names() -> tuple[str, ...]:
    """The names of every kernel in oplib's CUDA sources."""
    from oplib.kernels.cuda_source import cuda_sources, load_source

    return tuple(sorted({kernel for name in cuda_sources() for kernel in load_source(name).kernels}))


def device_kind(name: str) -> str:
    """The kind of the device event ``name`` (``DEVICE_KINDS``; "oplib" for oplib's kernels,
    "other" where no kind's words occur)."""
    if any(kernel in name for kernel in oplib_kernel_names()):
        return "oplib"
    return next((kind for kind, words in DEVICE_KINDS if any(word in name for word in words)), "other")


def device_kinds(events: Sequence[tuple[str, float]]) -> list[tuple[str, float]]:
    """(name, device time) events summed by ``device_kind``, the largest first."""
    sums: dict[str, float] = {}
    for name, time_us in events:
        kind = device_kind(name)
        sums[kind] = sums.get(kind, 0.0) + time_us
    return sorted(sums.items(), key=lambda item: item[1], reverse=True)


def host_waits(events: Sequence[tuple[str, float, float]], steps: int) -> tuple[float, float]:
    """Per step, the host's calls that wait for the GPU (``WAIT_CALLS``) among ``events``, each
    (name, start, self microseconds) as torch.profiler records them, and the host time they
    took: the last synchronisation to start, the profile's own after its steps, left out."""
    waits = sorted((start, name, us) for name, start, us in events if name in WAIT_CALLS)
    if waits and waits[-1][1] in ("cudaDeviceSynchronize", "cuCtxSynchronize"):
        waits.pop()
    return len(waits) / steps, sum(us for _, _, us in waits) / steps


def profile_steps(step: Callable[[], None], steps: int, target: Target) -> dict[str, Any]:
    """``steps`` calls of ``step`` under torch.profiler, per step: the device time of what ran
    on the GPU (kernels, copies, fills; None in a dry run) and the same by kind
    (``device_kinds``: empty in a dry run), the host's launch calls (``LAUNCH_CALLS``), the aten
    ops the host ran (every ``aten::`` event, those inside others included), the host time
    inside oplib's ops (``oplib::`` events, their children included), the three kernels taking
    the most device time (a dry run: the three CPU ops taking the most self time), and the three
    host events taking the most self time (aten ops, the runtime's and the driver's calls, the
    autograd engine's nodes), each ``(name, microseconds)``; and the host's calls that wait for
    the GPU (``WAIT_CALLS``, the profile's own final synchronisation left out) and their time. A
    step that is mostly host time shows a device time well under its wall time, and its host
    events and aten ops say where the host spends it; one that waits for the GPU shows it there."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([] if target.is_dry else [ProfilerActivity.CUDA])
    target.synchronize()
    with profile(activities=activities) as recorded:
        for _ in range(steps):
            step()
        target.synchronize()
    events = recorded.key_averages()
    device = [e for e in events if e.device_type != DeviceType.CPU]
    host = sorted((e for e in events if e.device_type == DeviceType.CPU), key=lambda e: e.self_cpu_time_total,
                  reverse=True)
    ranked = sorted(device, key=lambda e: e.self_device_time_total, reverse=True) if not target.is_dry else host
    waits, wait_us = (None, None) if target.is_dry else host_waits(
        [(e.name, e.time_range.start, e.self_cpu_time_total) for e in recorded.events()], steps)
    return {
        "device_us": None if target.is_dry else sum(e.self_device_time_total for e in device) / steps,
        "device_kinds": device_kinds([(e.key, e.self_device_time_total / steps) for e in device]),
        "launches": sum(e.count for e in events if e.key in LAUNCH_CALLS) / steps,
        "aten_ops": sum(e.count for e in events if e.device_type == DeviceType.CPU and e.key.startswith("aten::")) / steps,
        "oplib_host_us": sum(e.cpu_time_total for e in events if e.key.startswith("oplib::")) / steps,
        "top": [(e.key, (e.self_cpu_time_total if target.is_dry else e.self_device_time_total) / steps)
                for e in ranked[:3]],
        "host_top": [(e.key, e.self_cpu_time_total / steps) for e in host[:3]],
        "waits": waits,
        "wait_us": wait_us,
    }


def _profile_row(task: str, mode: str, batch: int, name: str, seconds: float, profiled: dict[str, Any]) -> list[str]:
    device = profiled["device_us"]
    top, host_top = ("; ".join(f"`{key[:60]}` {us:.0f}" for key, us in profiled[part]) for part in ("top", "host_top"))
    kinds = "; ".join(f"{kind} {us / 1e3:.2f}" for kind, us in profiled["device_kinds"]) or "-"
    return [f"{task}, {mode}", str(batch), name, f"{seconds * 1e3:.2f}", "-" if device is None else f"{device / 1e3:.2f}",
            "-" if device is None else f"{device / 1e6 / seconds:.2f}", kinds, f"{profiled['launches']:.0f}",
            f"{profiled['aten_ops']:.0f}", f"{profiled['oplib_host_us'] / 1e3:.2f}", top, host_top,
            "-" if profiled.get("waits") is None else f"{profiled['waits']:.0f} ({profiled['wait_us'] / 1e3:.2f})"]


def run_models(target: Optional[Target] = None, plan: Plan = GPU, modes: Sequence[str] = MODEL_MODES["all"],
               on_row: Optional[Callable[[list[list[str]], list[list[str]]], object]] = None
               ) -> tuple[list[list[str]], list[list[str]]]:
    """RedNet-50 vs ResNet-50: img/s of a training step (bf16 autocast, channels_last, SGD)
    and of inference, for each row of ``plan.model_rows`` whose mode is in ``modes``; and for
    each row and model, ``PROFILED_STEPS`` steps profiled after the timing (``profile_steps``).
    ``on_row`` sees the rows and the profiles so far after each row (the caller's report is
    kept current)."""
    from oplib.models import rednet50
    from rednet import resnet50

    target = target or Target.cuda()
    builds = {"RedNet-50": lambda: rednet50(**dict(plan.rednet_options)), "ResNet-50": resnet50}
    rows, profiles = [], []
    for task, mode, batch in plan.model_rows:
        if mode not in modes:
            continue
        images = torch.randn(batch, 3, plan.image_size, plan.image_size, device=target.device)
        images = images.contiguous(memory_format=torch.channels_last)
        labels = torch.randint(0, 1000, (batch,), device=target.device)
        seconds = {}
        for name, build in builds.items():
            torch.manual_seed(0)
            model = build().to(target.device).to(memory_format=torch.channels_last)
            step = _model_step(target, model, target.compile(model, mode), task, mode, images, labels)
            for _ in range(3):
                step()  # compiles, records the CUDA graphs, warms cuDNN's and oplib's caches
            seconds[name] = median(wall_time(step, plan.steps(batch), target) for _ in range(plan.model_rounds))
            try:
                profiled = profile_steps(step, PROFILED_STEPS, target)
            except Exception as error:  # a diagnostic: its failure is its row's, not the timed table's
                profiled = {"device_us": None, "device_kinds": [], "launches": float("nan"), "aten_ops": float("nan"),
                            "oplib_host_us": float("nan"),
                            "top": [(f"profile failed: {type(error).__name__}: {error}", float("nan"))], "host_top": []}
            profiles.append(_profile_row(task, mode, batch, name, seconds[name], profiled))
            del model, step
            torch.compiler.reset()
            if not target.is_dry:
                torch.cuda.empty_cache()
        rows.append([
            f"{task}, {mode}", str(batch), f"{batch / seconds['RedNet-50']:.0f}", f"{batch / seconds['ResNet-50']:.0f}",
            f"{seconds['ResNet-50'] / seconds['RedNet-50']:.2f}x",
        ])  # fmt: skip
        print(" | ".join(rows[-1]), flush=True)
        for profiled in profiles[-len(builds):]:
            print(" | ".join(profiled), flush=True)
        if on_row is not None:
            on_row(rows, profiles)
    return rows, profiles


# ---------------------------------------------------------------------------------------
# tuning
# ---------------------------------------------------------------------------------------

# The tuning stage's models, interleaved in each round: RedNet-50 on its default kernels and
# tuned (unfused, and on the fused op), and ResNet-50. Each step of a tuned one runs with tuning
# on (``tuned``), the others with it off: the two modes keep plans of their own.
TUNING_MODELS = ("RedNet-50", "RedNet-50, tuned", "RedNet-50, fused, tuned", "ResNet-50")
TUNING_TASKS = (("train", "eager"), ("inference", "eager"), ("inference", "CUDA graph"))


class HostTimedEmulation:
    """A dry run's launcher for the tuning stage: the host emulation's, with a clock
    (``time_calls``) that reads the host's time of each call, the least of two."""

    def __init__(self):
        from oplib.testing.cuda_emulation import EmulatedLauncher

        self.emulation = EmulatedLauncher()

    def launch(self, *args, **kwargs) -> None:
        self.emulation.launch(*args, **kwargs)

    def time_calls(self, calls: Sequence[Callable[[], object]], device: Optional[int]) -> list[float]:
        def seconds(run: Callable[[], object]) -> float:
            start = time.perf_counter()
            run()
            return time.perf_counter() - start

        return [min(seconds(run) for _ in range(2)) for run in calls]


def cuda_kernels_on_cpu(launcher: Launcher) -> dict[str, Any]:
    """Every op's CUDA kernel (its launch plans, candidates and all) over ``launcher``,
    registered on the CPU key as oplib registers them on CUDA's, so that CPU calls of the ops
    take the CUDA host path; by qualname."""
    from oplib.kernels.cuda_plan import LaunchPlans
    from oplib.ops._common import register_device_kernel
    from oplib.ops._rules import CONTRACTS, cuda_kernel
    from oplib.ops.involution_generated import BACKWARD_GENERATOR_CUDA

    kernels = {qualname: cuda_kernel(CONTRACTS[qualname], lambda: launcher) for qualname in CUDA_DISPATCH
               if "cuda" in CONTRACTS[qualname].writers}
    generator = BACKWARD_GENERATOR_CUDA
    kernels["oplib::involution_generated_backward_generator"] = LaunchPlans(
        generator.enforce, generator.result, generator.writer, lambda: launcher, generator.candidates)
    for qualname, kernel in kernels.items():
        register_device_kernel(qualname, "cpu", kernel)
    return kernels


def cuda_kernels() -> dict[str, Any]:
    """Every op's registered CUDA kernel (its launch plans), by qualname."""
    from oplib.ops._rules import CUDA_KERNELS
    from oplib.ops.involution_generated import BACKWARD_GENERATOR_CUDA

    return {**CUDA_KERNELS, "oplib::involution_generated_backward_generator": BACKWARD_GENERATOR_CUDA}


def _graphed_inference(target: Target, model: nn.Module, images: Tensor) -> Callable[[], None]:
    """Inference replayed from a CUDA graph of the eager forward (bf16 autocast, no_grad),
    captured after the warm-up calls ``capture_graph`` makes (tuning among them)."""
    model.eval()

    def forward() -> None:
        with target.autocast(), torch.no_grad():
            model(images)

    return capture_graph(forward, 1).replay


def _tuning_model(name: str, plan: Plan) -> nn.Module:
    from oplib.models import rednet50
    from oplib.nn import Involution2d
    from rednet import resnet50

    torch.manual_seed(0)
    if name == "ResNet-50":
        model = resnet50(**({"width": dict(plan.rednet_options)["width"]} if plan.rednet_options else {}))
    else:
        model = rednet50(**dict(plan.rednet_options))
        for module in model.modules():
            if isinstance(module, Involution2d):
                module.fused = "fused" in name
    return model


def tuning_choices(kernels: dict[str, Any]) -> list[list[str]]:
    """Per op and call signature that tuning met (``kernels``: qualname -> launch plans), the
    call (its first operand's shape, dtype and layout), each candidate's device time per call
    (those skipped: declined, or the launches of one before them), the one kept, and its time
    over the op's choice's; then per op, the sums over its signatures and how often each
    writer was kept."""
    rows, sums, counts = [], {}, {}
    for qualname, kernel in kernels.items():
        op = qualname.split("::")[1]
        for key, found in kernel.tuned.items():
            shape, stride, dtype = key[0][:3]
            meta = torch.empty_strided(shape, stride, device="meta")
            last = meta.dim() == 4 and meta.is_contiguous(memory_format=torch.channels_last)
            layout = {(True, True): "NCHW = channels_last", (True, False): "NCHW", (False, True): "channels_last",
                      (False, False): "strided"}[meta.is_contiguous(), last]
            mine, kept = found.seconds["the op's choice"], found.seconds[found.chosen]
            total = sums.setdefault(op, [0.0, 0.0, 0])
            total[0], total[1], total[2] = total[0] + mine, total[1] + kept, total[2] + 1
            kept_by = counts.setdefault(op, {})
            kept_by[found.chosen] = kept_by.get(found.chosen, 0) + 1
            rows.append([op, f"{tuple(shape)} {str(dtype).removeprefix('torch.')} {layout}",
                         "; ".join(f"{name} {us * 1e6:.1f}" for name, us in found.seconds.items()),
                         ", ".join(found.skipped) or "-", found.chosen,
                         f"{kept / mine:.2f}x" if mine else "-"])
    for op, (mine, kept, count) in sums.items():
        chosen = ", ".join(f"{name} x{times}" for name, times in sorted(counts[op].items(), key=lambda c: -c[1]))
        rows.append([f"**{op}**", f"{count} signatures", f"the op's choice {mine * 1e6:.1f} in all", "-",
                     f"{chosen}: {kept * 1e6:.1f} in all", f"**{kept / mine:.2f}x**" if mine else "-"])
    return rows


def tuning_batch(plan: Plan, dry: bool) -> int:
    """The tuning stage's batch: ``BATCH``, or a dry run's model batch."""
    return min(b for _, _, b in plan.model_rows) if dry else BATCH


def run_tuning(target: Optional[Target] = None, plan: Plan = GPU,
               on_rows: Optional[Callable[[list[list[str]], list[list[str]]], object]] = None
               ) -> tuple[list[list[str]], list[list[str]]]:
    """The tuning stage: per task of ``TUNING_TASKS``, the steps of ``TUNING_MODELS`` at
    ``BATCH`` (a dry run: the plan's sizes, CPU calls of the ops through their CUDA kernels over
    the host emulation, no CUDA graph) in interleaved rounds: (task, model, step ms, img/s,
    / ResNet-50); then ``tuning_choices``. ``on_rows`` sees both after each task."""
    target = target or Target.cuda()
    kernels = cuda_kernels_on_cpu(HostTimedEmulation()) if target.is_dry else cuda_kernels()
    batch = tuning_batch(plan, target.is_dry)
    images = torch.randn(batch, 3, plan.image_size, plan.image_size, device=target.device)
    images = images.contiguous(memory_format=torch.channels_last)
    labels = torch.randint(0, 1000, (batch,), device=target.device)
    rows: list[list[str]] = []
    for task, mode in TUNING_TASKS:
        if mode == "CUDA graph" and target.is_dry:
            continue
        steps = {}
        for name in TUNING_MODELS:
            model = _tuning_model(name, plan).to(target.device).to(memory_format=torch.channels_last)
            if mode == "CUDA graph":
                step = tuned(lambda model=model: _graphed_inference(target, model, images), "tuned" in name)()
            else:
                step = tuned(_model_step(target, model, model, task, "eager", images, labels), "tuned" in name)
                for _ in range(3):
                    step()  # tuning, cuDNN's and oplib's caches, the optimizer's state
            steps[name] = step
        seconds = {name: [] for name in TUNING_MODELS}
        for _ in range(plan.model_rounds):
            for name, step in steps.items():
                seconds[name].append(wall_time(step, plan.steps(batch), target))
        medians = {name: median(values) for name, values in seconds.items()}
        for name in TUNING_MODELS:
            rows.append([f"{task}, {mode}", name, f"{medians[name] * 1e3:.2f}", f"{batch / medians[name]:.0f}",
                         f"{medians['ResNet-50'] / medians[name]:.2f}x"])
            print(" | ".join(rows[-1]), flush=True)
        del steps
        if not target.is_dry:
            torch.cuda.empty_cache()
        if on_rows is not None:
            on_rows(rows, tuning_choices(kernels))
    return rows, tuning_choices(kernels)
