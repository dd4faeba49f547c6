"""RedNet throughput on CPU: images/second of RedNet-26 training and inference, eager vs
torch.compile, and inference in ONNX Runtime; RedNet-50 against a torch.nn ResNet-50.

    python bench/rednet.py            # writes bench/results/rednet.md
    python bench/rednet.py --quick    # smaller batches, one round (smoke test)

Two models: RedNet-26 at the paper's width (64) on 64x64 images, and the narrow RedNet-26 that
``python -m oplib train`` fits to the 32x32 digits. A training step is forward, cross-entropy,
backward and an SGD step; inference is a forward pass in eval mode under no_grad. Eager and
compiled are timed in the same run, interleaved, by bench/_harness.py; compile time (the first
call) is reported separately, and the peak memory of an eager step.

The deployment table: the paper's RedNet-26 (width 64, 1000 classes) at 224x224, inference at
batch 1 and 16 in eager mode, compiled, and from the three files ``python -m oplib export``
writes (dynamic batch and size): the torch.export program loaded back, the AOTInductor
package, and the ONNX file in ONNX Runtime's CPU provider with as many intra-op threads as
torch has.

The ResNet table: RedNet-50 against a plain torch.nn ResNet-50 (torchvision's architecture,
written here: torchvision is not a dependency), 224x224 RGB, 1000 classes, in one process,
interleaved: inference at batch 1 and 8 in eager mode, compiled, and compiled with inductor's
freezing (``torch._inductor.config.freezing``: BatchNorm folded into the convolutions, weights
prepacked), and a training step at batch 8, eager and compiled. In the same rounds, the
ceiling: RedNet-50 with its involution layers costing nothing (each replaced by its input,
strided where the layer is), alone and with the layers' compute floor added (their
multiply-adds at the run's GEMM rate, as bench/layer.py's): how far any involution kernel
could take RedNet-50 against ResNet-50. The report names the CPU kernels involution ran
(``oplib.kernels.native.status()``). ``--quick`` runs it at 64x64,
inference at batch 1 and a training step at batch 2.
"""

from __future__ import annotations

import functools
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor, nn

import _harness
from _harness import Section
from layer import GEMM_SIZE, TRAINING_FACTOR, gemm_rate, multiply_adds_per_pixel
from oplib import _torch_private as private
from oplib.benchmark import Timing, call, describe_machine, ratio
from oplib.kernels import native
from oplib.models import rednet26, rednet50
from oplib.nn import Involution2d


@dataclass(frozen=True)
class Config:
    name: str
    width: int
    group_channels: int
    in_channels: int
    image_size: int
    batch: int


CONFIGS = [
    Config("RedNet-26, width 64 (paper), 64x64 RGB", 64, 16, 3, 64, 16),
    Config("RedNet-26, width 16 (digits model), 32x32 gray", 16, 8, 1, 32, 64),
]


def _candidates(config: Config, batch: int):
    torch.manual_seed(0)
    model = rednet26(num_classes=10, in_channels=config.in_channels, width=config.width, group_channels=config.group_channels)
    images = torch.randn(batch, config.in_channels, config.image_size, config.image_size)
    labels = torch.randint(0, 10, (batch,))
    compiled = torch.compile(model)

    @torch.no_grad()
    def infer(forward):
        model.eval()
        forward(images)

    return {
        ("train", "eager"): _train_step(model, model, images, labels),
        ("train", "compiled"): _train_step(model, compiled, images, labels),
        ("inference", "eager"): lambda: infer(model),
        ("inference", "compiled"): lambda: infer(compiled),
    }


def _train_step(model: nn.Module, forward: Callable[[Tensor], Tensor], images: Tensor, labels: Tensor) -> Callable[[], None]:
    """A step of ``model`` in train mode: ``forward(images)`` (the model or its compiled
    form), cross-entropy against ``labels``, backward and an SGD step (momentum 0.9)."""
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)

    def step() -> None:
        model.train()
        optimizer.zero_grad(set_to_none=True)
        F.cross_entropy(forward(images), labels).backward()
        optimizer.step()

    return step


def _eager_step(config: Config, batch: int, mode: str) -> Callable[[], None]:
    """An eager train or inference step (for the peak, in a fresh process)."""
    return _candidates(config, batch)[mode, "eager"]


def run(section: Section, config: Config, batch: int) -> list[list[str]]:
    """The table rows of one model: train and inference, eager vs compiled."""
    # A fresh dynamo per model: otherwise the second model's compile is a recompile of the same
    # forward code, which dynamo then makes shape-generic (and much slower to compile).
    torch.compiler.reset()
    steps = _candidates(config, batch)
    compile_seconds = {}
    for mode in ("train", "inference"):
        start = time.perf_counter()
        steps[mode, "compiled"]()
        compile_seconds[mode] = time.perf_counter() - start
    times = section.measure(config.name, {key: call(step) for key, step in steps.items()})
    rows = []
    for mode in ("train", "inference"):
        eager, compiled = times[mode, "eager"], times[mode, "compiled"]
        rows.append([
            config.name, str(batch), mode, f"{batch / eager.median:.1f}", f"{batch / compiled.median:.1f}",
            f"{ratio(eager, compiled):.2f}x", f"{compile_seconds[mode]:.0f}",
            _harness.megabytes(_harness.peak_memory(_eager_step, config, batch, mode)),
        ])  # fmt: skip
    return rows


DEPLOY_SIZE = 224
DEPLOY_BATCHES = (1, 16)
RUNTIMES = ("eager", "compiled", "torch.export", "AOTInductor", "ONNX Runtime")


def run_deployment(section: Section, batches: tuple[int, ...], size: int) -> list[list[str]]:
    """The table rows: img/s of RedNet-26 inference per batch and runtime, and / eager."""
    import onnxruntime

    import oplib.onnx
    from oplib.deploy import dynamic_shapes

    torch.compiler.reset()
    torch.manual_seed(0)
    model = rednet26().eval()
    compiled = torch.compile(model)
    folder = Path(tempfile.mkdtemp())
    example = torch.randn(2, 3, size, size)
    start = time.perf_counter()
    program = torch.export.export(model, (example,), dynamic_shapes=dynamic_shapes())
    torch.export.save(program, folder / "rednet26.pt2")
    exported = torch.export.load(folder / "rednet26.pt2").module()
    private.aoti_compile_and_package(program, package_path=str(folder / "rednet26-aoti.pt2"))
    aoti = private.aoti_load_package(str(folder / "rednet26-aoti.pt2"))
    path = folder / "rednet26.onnx"
    oplib.onnx.export(model, (example,), path, dynamic_shapes=dynamic_shapes())
    print(f"exports {time.perf_counter() - start:.0f} s", flush=True)
    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = torch.get_num_threads()
    session = onnxruntime.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    rows = []
    for batch in batches:
        images = torch.randn(batch, 3, size, size)
        feed = {session.get_inputs()[0].name: images.numpy()}

        @torch.no_grad()
        def infer(forward):
            return forward(images)

        steps = {
            "eager": lambda: infer(model),
            "compiled": lambda: infer(compiled),
            "torch.export": lambda: infer(exported),
            "AOTInductor": lambda: infer(aoti),
            "ONNX Runtime": lambda: session.run(None, feed),
        }
        steps["compiled"]()  # compile outside the timing
        times = section.measure(f"batch {batch}", {name: call(step) for name, step in steps.items()})
        eager = times["eager"]
        cells = [f"{batch / times[k].median:.1f} ({ratio(eager, times[k]):.2f}x)" for k in RUNTIMES[1:]]
        rows.append([str(batch), f"{batch / eager.median:.1f}", *cells])
    return rows


class _ResNetBottleneck(nn.Module):
    """torchvision's ResNet bottleneck (v1.5: the stride on the 3x3 conv): 1x1 -> 3x3 -> 1x1
    convs with BatchNorm, ReLU between, a 1x1 conv + BN shortcut where the shape changes.
    input: (N, in_channels, H, W) -> (N, out_channels, Ho, Wo)."""

    def __init__(self, in_channels: int, out_channels: int, stride: int):
        super().__init__()
        mid = out_channels // 4
        self.branch = nn.Sequential(
            nn.Conv2d(in_channels, mid, 1, bias=False), nn.BatchNorm2d(mid), nn.ReLU(inplace=True),
            nn.Conv2d(mid, mid, 3, stride, 1, bias=False), nn.BatchNorm2d(mid), nn.ReLU(inplace=True),
            nn.Conv2d(mid, out_channels, 1, bias=False), nn.BatchNorm2d(out_channels),
        )  # fmt: skip
        self.shortcut = nn.Identity()
        if stride != 1 or in_channels != out_channels:
            self.shortcut = nn.Sequential(nn.Conv2d(in_channels, out_channels, 1, stride, bias=False), nn.BatchNorm2d(out_channels))

    def forward(self, x: Tensor) -> Tensor:
        return torch.relu(self.branch(x) + self.shortcut(x))


def resnet50(num_classes: int = 1000, width: int = 64) -> nn.Sequential:
    """ResNet-50 (He et al., 2016, as torchvision builds it; 25.56 M parameters) from torch.nn,
    torch's default initialisation; ``width`` the stem's channels and the first stage's
    bottleneck width, as RedNet's (64: torchvision's). input: (N, 3, H, W) -> logits (N, num_classes)."""
    layers: list[nn.Module] = [
        nn.Conv2d(3, width, 7, 2, 3, bias=False), nn.BatchNorm2d(width), nn.ReLU(inplace=True), nn.MaxPool2d(3, 2, 1),
    ]  # fmt: skip
    channels = width
    for index, count in enumerate((3, 4, 6, 3)):
        out_channels = 4 * width * 2**index
        for block in range(count):
            layers.append(_ResNetBottleneck(channels, out_channels, 2 if index > 0 and block == 0 else 1))
            channels = out_channels
    return nn.Sequential(*layers, nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(channels, num_classes))


class _FreeInvolution(nn.Module):
    """Stands in for an Involution2d at no cost: the input itself, or at a stride its strided
    view (N, C, Ho, Wo), the shape the layer gives (for the default padding and even sizes)."""

    def __init__(self, stride: tuple[int, int]):
        super().__init__()
        self.stride = stride

    def forward(self, x: Tensor) -> Tensor:
        return x if self.stride == (1, 1) else x[:, :, :: self.stride[0], :: self.stride[1]]


def rednet50_free_involutions(**kwargs) -> nn.Module:
    """RedNet-50 (``rednet50(**kwargs)``) with every involution layer (generation branch and
    all) costing nothing: what RedNet-50 could at most reach against ResNet-50, whatever the
    involution kernels."""
    model = rednet50(**kwargs)
    for parent in list(model.modules()):
        for name, child in parent.named_children():
            if isinstance(child, Involution2d):
                setattr(parent, name, _FreeInvolution(child.stride))
    return model


def involution_multiply_adds(size: int) -> int:
    """Multiply-adds of RedNet-50's involution layers in one inference of one size x size
    image (bench/layer.py's count per pixel)."""
    total = 0

    def count(module: Involution2d, args, output: Tensor) -> None:
        nonlocal total
        _, channels, out_h, out_w = output.shape
        taps = module.kernel_size[0] * module.kernel_size[1]
        total += out_h * out_w * multiply_adds_per_pixel(channels, module.reduce.out_channels, module.groups, taps)

    model = rednet50().eval()
    for module in model.modules():
        if isinstance(module, Involution2d):
            module.register_forward_hook(count)
    with torch.no_grad():
        model(torch.randn(1, 3, size, size))
    return total


RESNET_SIZE = 224
RESNET_BATCHES = (1, 8)
TRAIN_BATCH = 8
FREE = "RedNet-50, involutions free"
MODELS = {"RedNet-50": rednet50, "ResNet-50": resnet50, FREE: rednet50_free_involutions}
INFERENCE_MODES = ("eager", "compiled", "frozen")


def _inference_forwards(model: nn.Module) -> dict[str, Callable[[Tensor], Tensor]]:
    """The forward of each inference mode. The frozen one is a torch.compile of its own (another
    backend, so that dynamo keeps its cache entries apart from the compiled one's), and its
    first calls must run with ``torch._inductor.config.freezing`` set (``_first_calls`` sets
    it): dynamo reads the flag while tracing, to keep the parameters as graph constants, and
    ``options`` reaches only inductor."""
    return {
        "eager": model,
        "compiled": torch.compile(model, dynamic=False),
        "frozen": torch.compile(model, dynamic=False, options={"freezing": True}),
    }


@torch.no_grad()
def _infer(forward: Callable[[Tensor], Tensor], images: Tensor) -> Tensor:
    return forward(images)


def _first_calls(steps: dict[tuple[str, str], Callable[[], object]]) -> dict[tuple[str, str], float]:
    """Call every (model, mode) step once, compiling the compiled ones: seconds per step."""
    seconds = {}
    for (name, mode), step in steps.items():
        start = time.perf_counter()
        with private.inductor_config.patch(freezing=mode == "frozen"):
            step()
        seconds[name, mode] = time.perf_counter() - start
    return seconds


def _resnet_row(
    label: str, batch: int, times: dict[tuple[str, str], Timing], seconds: dict[tuple[str, str], float], mode: str,
    floor: float,
) -> list[str]:
    """img/s of both models in ``mode``, RedNet-50 / ResNet-50 (throughput), first-call
    seconds, and the ceilings: ResNet-50's time over RedNet-50's with free involutions, and
    with them at ``floor`` seconds (their multiply-adds at the run's GEMM rate), each the
    median of the per-round ratios."""
    rednet, resnet, free = times["RedNet-50", mode], times["ResNet-50", mode], times[FREE, mode]
    first = "-" if mode == "eager" else f"{seconds['RedNet-50', mode]:.0f} / {seconds['ResNet-50', mode]:.0f}"
    return [
        label, str(batch), f"{batch / rednet.median:.1f}", f"{batch / resnet.median:.1f}", f"{ratio(resnet, rednet):.2f}x", first,
        f"{ratio(resnet, free):.2f}x", f"{ratio(resnet, Timing(tuple(seconds + floor for seconds in free.rounds))):.2f}x",
    ]  # fmt: skip


def run_resnet(section: Section, batches: tuple[int, ...], train_batch: int, size: int) -> tuple[list[list[str]], float]:
    """The table rows: inference per batch and mode, then the training step, eager and
    compiled; and the run's GEMM rate (multiply-adds per second)."""
    rate = gemm_rate(section)
    floor_per_image = involution_multiply_adds(size) / rate  # seconds per image of the layers at the floor
    torch.compiler.reset()
    forwards = {}
    for name, build in MODELS.items():
        torch.manual_seed(0)
        forwards[name] = _inference_forwards(build().eval())
    rows = []
    for batch in batches:
        images = torch.randn(batch, 3, size, size)
        steps = {
            (name, mode): functools.partial(_infer, forward, images)
            for name, modes in forwards.items() for mode, forward in modes.items()
        }  # fmt: skip
        seconds = _first_calls(steps)
        times = section.measure(f"inference, batch {batch}", {key: call(step) for key, step in steps.items()})
        rows += [_resnet_row(f"inference, {mode}", batch, times, seconds, mode, batch * floor_per_image)
                 for mode in INFERENCE_MODES]
    images, labels = torch.randn(train_batch, 3, size, size), torch.randint(0, 1000, (train_batch,))
    steps = {}
    for name, build in MODELS.items():
        torch.manual_seed(0)
        model = build()
        steps[name, "eager"] = _train_step(model, model, images, labels)
        steps[name, "compiled"] = _train_step(model, torch.compile(model, dynamic=False), images, labels)
    seconds = _first_calls(steps)
    times = section.measure(f"train, batch {train_batch}", {key: call(step) for key, step in steps.items()})
    floor = TRAINING_FACTOR * train_batch * floor_per_image
    rows += [_resnet_row(f"train, {mode}", train_batch, times, seconds, mode, floor) for mode in ("eager", "compiled")]
    return rows, rate


def main(argv: Optional[list[str]] = None) -> int:
    parser = _harness.parser(__doc__, rounds=3, min_run_time=2.0)
    settings = _harness.start(parser.parse_args(argv), __file__)
    throughput, deploy, resnet = Section(settings), Section(settings), Section(settings)
    rows = []
    for config in CONFIGS:
        rows += run(throughput, config, max(2, config.batch // 4) if settings.quick else config.batch)
    deploy_size = 64 if settings.quick else DEPLOY_SIZE
    deploy_rows = run_deployment(deploy, (1, 2) if settings.quick else DEPLOY_BATCHES, deploy_size)
    resnet_size, resnet_batches, train_batch = (64, (1,), 2) if settings.quick else (RESNET_SIZE, RESNET_BATCHES, TRAIN_BATCH)
    resnet_rows, rate = run_resnet(resnet, resnet_batches, train_batch, resnet_size)
    lines = [
        *_harness.header(
            settings,
            "RedNet throughput on CPU: RedNet-26 eager vs torch.compile and ONNX Runtime, RedNet-50 vs ResNet-50",
            "- float32; train step = forward + cross-entropy + backward + SGD step (BatchNorm in training mode);"
            " inference = eval-mode forward under no_grad; compile = wall time of the first compiled call;"
            " eager peak = highest resident memory above the model and optimizer state during one eager step"
            " (after the timings, in a fresh process)",
        ),
        throughput.load_line(),
        "",
        *_harness.table(
            ("model", "batch", "mode", "eager (img/s)", "compiled (img/s)", "compiled / eager", "compile (s)", "eager peak (MB)"),
            "lrlrrrrr",
            rows,
        ),
        "",
        f"## Inference by runtime: RedNet-26 (width 64, 1000 classes), {deploy_size}x{deploy_size} RGB",
        "",
        "The files `python -m oplib export` writes (dynamic batch and size): the torch.export program loaded "
        "back (`torch.export.load(...).module()`), the AOTInductor package (`aoti_load_package`), and the "
        "standard ONNX file in ONNX Runtime (CPU provider, intra-op threads = torch's). img/s, and / eager.",
        "",
        deploy.load_line(),
        "",
        *_harness.table(("batch", *RUNTIMES), "rrrrrr", deploy_rows),
        "",
        f"## RedNet-50 vs ResNet-50 (torch.nn), {resnet_size}x{resnet_size} RGB, 1000 classes",
        "",
        "Both models in one process, their candidates interleaved; ResNet-50 is torchvision's architecture in "
        "torch.nn. inference: eval mode under no_grad, eager, compiled (`torch.compile(model, dynamic=False)`) or "
        "frozen (compiled with `torch._inductor.config.freezing`: BatchNorm folded into the convolutions, weights "
        "prepacked); train: forward + cross-entropy + backward + SGD step. RedNet-50 / ResNet-50: the ratio of their "
        "img/s (above 1: RedNet-50 is faster); first call: seconds of the first (compiling) call. "
        f"Involution's CPU kernels: {native.status()}.",
        "",
        "The ceilings, timed in the same rounds: *free involutions* is RedNet-50 with every involution layer "
        "(generation branch included) replaced by its input, strided where the layer is: no implementation of "
        "the layers can bring RedNet-50 past it. *At the floor*: that model's time plus the layers' multiply-adds "
        f"at this run's float32 GEMM rate ({GEMM_SIZE}-square `torch.mm`: {rate / 1e9:.1f} G multiply-adds/s; "
        f"a training step {TRAINING_FACTOR}x the forward's), as bench/layer.py's compute floor.",
        "",
        resnet.load_line(),
        "",
        *_harness.table(
            ("mode", "batch", "RedNet-50 (img/s)", "ResNet-50 (img/s)", "RedNet-50 / ResNet-50", "first call (s): RedNet-50 / ResNet-50",
             "ceiling: free involutions / ResNet-50", "ceiling: involutions at the floor / ResNet-50"),
            "lrrrrrrr",
            resnet_rows,
        ),
    ]
    _harness.write_report(settings, lines)
    _resnet_chart(settings, resnet_rows)
    return 0


def _resnet_chart(settings, resnet_rows: list[list[str]]) -> None:
    """RedNet-50's and ResNet-50's img/s in each mode and batch of the last table, side by side."""
    plt = _harness.pyplot()
    if plt is None:
        return
    labels = [f"{mode}, batch {batch}" for mode, batch, *_ in resnet_rows]
    figure, axes = plt.subplots(figsize=(8, 0.45 * len(labels) + 1.2))
    for offset, column, name in ((-0.2, 2, "RedNet-50"), (0.2, 3, "ResNet-50 (torch.nn)")):
        axes.barh([y + offset for y in range(len(labels))], [float(row[column]) for row in resnet_rows], height=0.4, label=name)
    axes.set_yticks(range(len(labels)), labels, fontsize=8)
    axes.invert_yaxis()
    axes.set(title=f"RedNet-50 vs ResNet-50 on CPU ({describe_machine()})", xlabel="img/s (higher is better)")
    axes.title.set_fontsize(9)
    axes.legend(fontsize=8)
    _harness.write_chart(settings, "resnet", figure)
    plt.close(figure)


if __name__ == "__main__":
    sys.exit(main())
