"""The memory of a RedNet-50 training step, with and without activation checkpointing
(RedNet-50's default recomputes the stem and its max pool; ``set_stem_checkpointing(False)``:
nothing; ``set_generation_checkpointing``: also the involutions' generation branches;
``set_grad_checkpointing``: whole bottlenecks), and with the involutions unfused (the span
conv writing the weight map, as before ``involution_generated``), against a torch.nn
ResNet-50 (bench/rednet.py's), and what each costs in step time; then what recomputing the
stem would cost the step of bench/rednet.py's small models.

    python bench/backbone.py            # writes bench/results/backbone.md
    python bench/backbone.py --quick    # 64x64, batch 2, one round (smoke test)

A step is forward, cross-entropy, backward and an SGD step, eager, in train mode, 224x224 RGB
at batch 8. Saved activations: the bytes of the distinct storages autograd saves for the
backward pass (``torch.autograd.graph.saved_tensors_hooks``), parameters left out; with
bottleneck checkpointing, each bottleneck saves only its input, and recomputes the rest in the
backward pass. Peak: the highest resident memory above the model and optimizer state during a step,
in a fresh process (``_harness.peak_memory``). Step times: the steps in one process,
interleaved.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Optional

import torch
import torch.nn.functional as F
from torch import nn

import _harness
from _harness import Section
from oplib.benchmark import call, describe_machine, ratio
from oplib.kernels import native
from oplib.models import rednet26, rednet50
from oplib.nn import Involution2d
from rednet import CONFIGS as SMALL_MODELS
from rednet import _ResNetBottleneck, _train_step, resnet50

BATCH, SIZE = 8, 224
_BLOCK_TYPES = (_ResNetBottleneck,)


def _unfused(model: nn.Module) -> None:
    for module in model.modules():
        if isinstance(module, Involution2d):
            module.fused = False


def _nothing_recomputed(model: nn.Module) -> None:
    model.set_stem_checkpointing(False)


DEFAULT, PLAIN, RESNET = ("RedNet-50 (default: stem recomputed)", "RedNet-50, nothing recomputed", "ResNet-50 (torch.nn)")
# case: (builder, what to set on the built model)
CASES = {
    DEFAULT: (rednet50, None),
    PLAIN: (rednet50, _nothing_recomputed),
    "RedNet-50, stem and generation recomputed": (rednet50, lambda model: model.set_generation_checkpointing(True)),
    "RedNet-50, checkpointed": (rednet50, lambda model: model.set_grad_checkpointing(True)),
    "RedNet-50, unfused (span conv + involution)": (rednet50, _unfused),
    RESNET: (resnet50, None),
}


def _model(case: str) -> nn.Module:
    build, configure = CASES[case]
    torch.manual_seed(0)
    model = build()
    if configure is not None:
        configure(model)
    return model


def _inputs(batch: int, size: int) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.randn(batch, 3, size, size), torch.randint(0, 1000, (batch,))


def _step(case: str, batch: int, size: int) -> Callable[[], None]:
    """A training step of ``case`` (for the peak, in a fresh process)."""
    model = _model(case)
    return _train_step(model, model, *_inputs(batch, size))


def saved_activations(model: nn.Module, images: torch.Tensor, labels: torch.Tensor) -> dict[str, int]:
    """Bytes of the distinct non-parameter storages autograd saves during one training step
    ("total"), split by where each storage was first saved: "stem" (the
    modules before the first residual block: RedNet's stem and pool, ResNet-50's conv, BatchNorm,
    ReLU and max-pool), "blocks" (of which "in involutions": first saved inside an Involution2d,
    its generation branch and the feature map the fused op keeps; its input was saved before it,
    by the block's ReLU) and "head" (the rest, the loss included)."""
    parameters = {p.untyped_storage().data_ptr() for p in model.parameters()}
    names = {module: name for name, module in model.named_modules()}
    active: list[nn.Module] = []
    parts: dict[int, tuple[str, bool, int]] = {}

    def part() -> str:
        top = names[active[1]].split(".")[0] if len(active) > 1 else ""
        if top in ("stem", "pool") or (top.isdigit() and int(top) < 4):
            return "stem"
        return "blocks" if top == "stages" or top.isdigit() and isinstance(active[1], _BLOCK_TYPES) else "head"

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        storage = tensor.untyped_storage()
        pointer = storage.data_ptr()
        if pointer not in parameters:
            where, in_involution, _ = parts.get(pointer) or (part(), any(isinstance(m, Involution2d) for m in active), 0)
            parts[pointer] = (where, in_involution, storage.nbytes())
        return tensor

    def enter(module: nn.Module, args) -> None:
        active.append(module)

    def leave(module: nn.Module, args, output) -> None:
        active.pop()

    hooks = [h for m in model.modules() for h in (m.register_forward_pre_hook(enter), m.register_forward_hook(leave))]
    model.train()
    try:
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
            F.cross_entropy(model(images), labels).backward()
    finally:
        for hook in hooks:
            hook.remove()
    model.zero_grad(set_to_none=True)
    totals = {"stem": 0, "blocks": 0, "in involutions": 0, "head": 0}
    for where, in_involution, nbytes in parts.values():
        totals[where] += nbytes
        totals["in involutions"] += nbytes if in_involution else 0
    totals["total"] = totals["stem"] + totals["blocks"] + totals["head"]
    return totals


def main(argv: Optional[list[str]] = None) -> int:
    parser = _harness.parser(__doc__, rounds=3, min_run_time=2.0)
    settings = _harness.start(parser.parse_args(argv), __file__)
    batch, size = (2, 64) if settings.quick else (BATCH, SIZE)
    images, labels = _inputs(batch, size)
    parts = {case: saved_activations(_model(case), images, labels) for case in CASES}
    saved = {case: totals["total"] for case, totals in parts.items()}
    steps = {}
    for case in CASES:
        model = _model(case)
        steps[case,] = _train_step(model, model, images, labels)
    section = Section(settings)
    times = section.measure("train step", {key: call(step) for key, step in steps.items()})
    plain = times[DEFAULT,]
    rows = []
    for case in CASES:
        rows.append([
            case, _harness.megabytes(saved[case]), f"{saved[case] / saved[RESNET]:.2f}x",
            _harness.megabytes(_harness.peak_memory(_step, case, batch, size)),
            f"{times[case,].median * 1e3:.0f}", f"{ratio(times[case,], plain):.2f}x",
        ])  # fmt: skip
    lines = [
        *_harness.header(
            settings,
            "RedNet-50 training memory: fused and unfused involutions, activation checkpointing, vs ResNet-50",
            f"- float32, eager, train mode, {size}x{size} RGB, batch {batch}, 1000 classes; step = forward + "
            "cross-entropy + backward + SGD step (momentum 0.9)",
            "- saved activations: distinct storages autograd saves for the backward pass, parameters left out; "
            "peak: highest resident memory above the model and optimizer state during a step (fresh process)",
            f"- involution's CPU kernels: {native.status()}",
        ),
        section.load_line(),
        "",
        *_harness.table(
            ("model", "saved activations (MB)", "/ ResNet-50", "step peak (MB)", "step (ms)", "step / the default's"),
            "lrrrrr",
            rows,
        ),
    ]
    lines += [
        "",
        "## Where the saved activations are",
        "",
        "The saved activations of a step (as above) by where each storage was first saved: the stem (RedNet-50's "
        "stem and pool; ResNet-50's conv, BatchNorm, ReLU and max-pool), the residual blocks (of which inside the "
        "involution layers: each layer's generation branch and the feature map the fused op keeps) and the "
        "head with the loss. A storage counts where it was first saved: an involution's input, saved first by the "
        "block's ReLU before it, is not in the involutions' column.",
        "",
        *_harness.table(
            ("model", "stem (MB)", "blocks (MB)", "of which in involutions (MB)", "head (MB)", "total (MB)"), "lrrrrr",
            [[case, *(_harness.megabytes(bytes_) for bytes_ in parts[case].values())]
             for case in (DEFAULT, PLAIN, RESNET)],
        ),
    ]
    lines += _small_models(settings)
    _harness.write_report(settings, lines)
    _chart(settings, rows)
    return 0


def _small_models(settings) -> list[str]:
    """The step time of bench/rednet.py's small models (``SMALL_MODELS``, where a step's fixed
    costs weigh more), recomputing nothing (their default) and recomputing the stem, interleaved."""
    plain, recomputed = "recomputing nothing", "recomputing the stem"
    steps, batches = {}, {}
    for config in SMALL_MODELS:
        batches[config.name] = batch = 2 if settings.quick else config.batch
        images = torch.randn(batch, config.in_channels, config.image_size, config.image_size)
        labels = torch.randint(0, 10, (batch,))
        for mode in (plain, recomputed):
            torch.manual_seed(0)
            model = rednet26(width=config.width, group_channels=config.group_channels, in_channels=config.in_channels,
                             num_classes=10)
            model.set_stem_checkpointing(mode == recomputed)
            steps[config.name, mode] = _train_step(model, model, images, labels)
    section = Section(settings)
    times = section.measure("small models' train step", {key: call(step) for key, step in steps.items()})
    rows = [[f"{name}, batch {batch}", f"{times[name, plain].median * 1e3:.1f}",
             f"{times[name, recomputed].median * 1e3:.1f}", f"{ratio(times[name, recomputed], times[name, plain]):.2f}x"]
            for name, batch in batches.items()]
    return [
        "",
        "## Recomputation on small models",
        "",
        "A training step (as above) of bench/rednet.py's small models (RedNet-26s), recomputing nothing (their "
        "default) and recomputing the stem and its max pool (`set_stem_checkpointing()`, RedNet-50's default), "
        "interleaved.",
        "",
        section.load_line(),
        "",
        *_harness.table(("model", "step, nothing recomputed (ms)", "step, stem recomputed (ms)", "stem recomputed / nothing"),
                        "lrrr", rows),
    ]


def _chart(settings, rows: list[list[str]]) -> None:
    """The table's memory and time columns, one panel each, a bar per model."""
    plt = _harness.pyplot()
    if plt is None:
        return
    panels = ((1, "saved activations (MB)"), (3, "step peak (MB)"), (4, "step (ms)"))
    figure, axes = plt.subplots(1, len(panels), figsize=(12, 2.8), sharey=True)
    models = [row[0] for row in rows]
    for panel, (column, title) in zip(axes, panels):
        panel.barh(range(len(models)), [float(row[column]) for row in rows], color=[f"C{i}" for i in range(len(models))])
        panel.set(title=title)
        panel.title.set_fontsize(9)
    axes[0].set_yticks(range(len(models)), models, fontsize=8)
    axes[0].invert_yaxis()
    figure.suptitle(f"RedNet-50 training step, with and without checkpointing, vs ResNet-50 ({describe_machine()})", fontsize=9)
    figure.tight_layout()
    _harness.write_chart(settings, "memory", figure)
    plt.close(figure)


if __name__ == "__main__":
    sys.exit(main())
