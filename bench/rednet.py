"""RedNet-26 throughput on CPU: images/second of training and inference, eager vs torch.compile,
and inference in ONNX Runtime.

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
"""

from __future__ import annotations

import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import torch
import torch.nn.functional as F

import _harness
from _harness import Section
from oplib.benchmark import call, ratio
from oplib.models import rednet26


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
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)
    compiled = torch.compile(model)

    def train_step(forward):
        model.train()
        optimizer.zero_grad(set_to_none=True)
        F.cross_entropy(forward(images), labels).backward()
        optimizer.step()

    @torch.no_grad()
    def infer(forward):
        model.eval()
        forward(images)

    return {
        ("train", "eager"): lambda: train_step(model),
        ("train", "compiled"): lambda: train_step(compiled),
        ("inference", "eager"): lambda: infer(model),
        ("inference", "compiled"): lambda: infer(compiled),
    }


def _eager_step(config: Config, batch: int, mode: str) -> Callable[[], None]:
    """An eager train or inference step (for the peak, in a fresh process)."""
    return _candidates(config, batch)[mode, "eager"]


def run(section: Section, config: Config, batch: int) -> list[list[str]]:
    """The table rows of one model: train and inference, eager vs compiled."""
    # A fresh dynamo per model: otherwise the second model's compile is a recompile of the same
    # forward code, which dynamo then makes shape-generic (and much slower to compile).
    torch._dynamo.reset()
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

    torch._dynamo.reset()
    torch.manual_seed(0)
    model = rednet26().eval()
    compiled = torch.compile(model)
    folder = Path(tempfile.mkdtemp())
    example = torch.randn(2, 3, size, size)
    start = time.perf_counter()
    program = torch.export.export(model, (example,), dynamic_shapes=dynamic_shapes())
    torch.export.save(program, folder / "rednet26.pt2")
    exported = torch.export.load(folder / "rednet26.pt2").module()
    torch._inductor.aoti_compile_and_package(program, package_path=str(folder / "rednet26-aoti.pt2"))
    aoti = torch._inductor.aoti_load_package(str(folder / "rednet26-aoti.pt2"))
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


def main(argv: Optional[list[str]] = None) -> int:
    parser = _harness.parser(__doc__, rounds=3, min_run_time=2.0)
    settings = _harness.start(parser.parse_args(argv), __file__)
    throughput, deploy = Section(settings), Section(settings)
    rows = []
    for config in CONFIGS:
        rows += run(throughput, config, max(2, config.batch // 4) if settings.quick else config.batch)
    deploy_size = 64 if settings.quick else DEPLOY_SIZE
    deploy_rows = run_deployment(deploy, (1, 2) if settings.quick else DEPLOY_BATCHES, deploy_size)
    lines = [
        *_harness.header(
            settings,
            "RedNet-26 throughput on CPU: eager vs torch.compile, and ONNX Runtime",
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
    ]
    _harness.write_report(settings, lines)
    return 0


if __name__ == "__main__":
    sys.exit(main())
