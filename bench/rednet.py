"""RedNet-26 throughput on CPU: images/second of training and inference, eager vs torch.compile,
and inference in ONNX Runtime.

    python bench/rednet.py            # writes bench/results/rednet.md
    python bench/rednet.py --quick    # smaller batches, one round (smoke test)

Two models: RedNet-26 at the paper's width (64) on 64x64 images, and the narrow RedNet-26 that
``python -m oplib train`` fits to the 32x32 digits. A training step is forward, cross-entropy,
backward and an SGD step; inference is a forward pass in eval mode under no_grad. Eager and
compiled are timed in the same run, interleaved (torch.utils.benchmark medians; the median of
the rounds is kept). Compile time (the first call) is reported separately.

The deployment table: the paper's RedNet-26 (width 64, 1000 classes) at 224x224, inference at
batch 1 and 16 in eager mode, compiled, and from the three files ``python -m oplib export``
writes (dynamic batch and size): the torch.export program loaded back, the AOTInductor
package, and the ONNX file in ONNX Runtime's CPU provider with as many intra-op threads as
torch has.
"""

from __future__ import annotations

import argparse
import datetime
import os
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.utils.benchmark import Timer

from oplib.models import rednet26

from machine import describe

RESULTS = Path(__file__).resolve().parent / "results"


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


def run(config: Config, batch: int, rounds: int, min_run_time: float):
    # A fresh dynamo per model: otherwise the second model's compile is a recompile of the same
    # forward code, which dynamo then makes shape-generic (and much slower to compile).
    torch._dynamo.reset()
    steps = _candidates(config, batch)
    compile_seconds = {}
    for key in (("train", "compiled"), ("inference", "compiled")):
        start = time.perf_counter()
        steps[key]()
        compile_seconds[key[0]] = time.perf_counter() - start
    samples = {key: [] for key in steps}
    for _ in range(rounds):
        for key, step in steps.items():
            timer = Timer("step()", globals={"step": step}, num_threads=torch.get_num_threads())
            samples[key].append(timer.blocked_autorange(min_run_time=min_run_time).median)
    seconds = {key: statistics.median(values) for key, values in samples.items()}
    for mode in ("train", "inference"):
        print(
            f"{config.name} {mode}: eager {batch / seconds[mode, 'eager']:.1f} img/s, "
            f"compiled {batch / seconds[mode, 'compiled']:.1f} img/s (compile {compile_seconds[mode]:.0f} s)",
            flush=True,
        )
    return seconds, compile_seconds


DEPLOY_SIZE = 224
DEPLOY_BATCHES = (1, 16)


def run_deployment(batches, size: int, rounds: int, min_run_time: float) -> dict:
    """img/s of RedNet-26 inference per (batch, runtime): eager, compiled, ONNX Runtime."""
    import tempfile

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
    results = {}
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
        samples = {name: [] for name in steps}
        for _ in range(rounds):
            for name, step in steps.items():
                timer = Timer("step()", globals={"step": step}, num_threads=torch.get_num_threads())
                samples[name].append(timer.blocked_autorange(min_run_time=min_run_time).median)
        results[batch] = {name: batch / statistics.median(values) for name, values in samples.items()}
        print(f"batch {batch}: " + ", ".join(f"{k} {v:.1f} img/s" for k, v in results[batch].items()), flush=True)
    return results


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--threads", type=int, default=os.cpu_count())
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--output", type=Path, default=None)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    rounds, min_run_time = (1, 0.2) if args.quick else (args.rounds, 2.0)
    lines = [
        "# RedNet-26 throughput on CPU: eager vs torch.compile, and ONNX Runtime",
        "",
        f"Written by `python bench/rednet.py{' --quick' if args.quick else ''}` on {datetime.date.today()}.",
        "",
        f"- machine: {describe()}",
        f"- float32; times: median over {rounds} interleaved round(s) of torch.utils.benchmark blocked_autorange medians",
        "- train step = forward + cross-entropy + backward + SGD step (BatchNorm in training mode);"
        " inference = eval-mode forward under no_grad; compile = wall time of the first compiled call",
        "",
        "| model | batch | mode | eager (img/s) | compiled (img/s) | compiled / eager | compile (s) |",
        "|---|---:|---|---:|---:|---:|---:|",
    ]
    print(describe(), flush=True)
    for config in CONFIGS:
        batch = max(2, config.batch // 4) if args.quick else config.batch
        seconds, compile_seconds = run(config, batch, rounds, min_run_time)
        for mode in ("train", "inference"):
            eager, compiled = batch / seconds[mode, "eager"], batch / seconds[mode, "compiled"]
            lines.append(
                f"| {config.name} | {batch} | {mode} | {eager:.1f} | {compiled:.1f} | {compiled / eager:.2f}x | "
                f"{compile_seconds[mode]:.0f} |"
            )
    deploy_batches = (1, 2) if args.quick else DEPLOY_BATCHES
    deploy_size = 64 if args.quick else DEPLOY_SIZE
    deployment = run_deployment(deploy_batches, deploy_size, rounds, min_run_time)
    lines += [
        "",
        f"## Inference by runtime: RedNet-26 (width 64, 1000 classes), {deploy_size}x{deploy_size} RGB",
        "",
        "The files `python -m oplib export` writes (dynamic batch and size): the torch.export program loaded "
        "back (`torch.export.load(...).module()`), the AOTInductor package (`aoti_load_package`), and the "
        "standard ONNX file in ONNX Runtime (CPU provider, intra-op threads = torch's). img/s, and / eager.",
        "",
        "| batch | eager | compiled | torch.export | AOTInductor | ONNX Runtime |",
        "|---:|---:|---:|---:|---:|---:|",
    ]
    for batch, speeds in deployment.items():
        cells = [f"{speeds[k]:.1f} ({speeds[k] / speeds['eager']:.2f}x)" for k in ("compiled", "torch.export", "AOTInductor", "ONNX Runtime")]
        lines.append(f"| {batch} | {speeds['eager']:.1f} | " + " | ".join(cells) + " |")
    report = "\n".join(lines) + "\n"
    output = args.output or RESULTS / ("rednet-quick.md" if args.quick else "rednet.md")
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(report)
    print(report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
