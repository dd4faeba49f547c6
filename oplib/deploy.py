"""``python -m oplib export``: a deployable file from a RedNet, checked by running it once.

    python -m oplib export --depth 26 [--weights paddleclas|FILE] --format onnx|pt2|aoti OUT
    python -m oplib export --features-only [--out-indices 1,2,3,4] --depth 26 --format onnx|pt2|aoti OUT

The model (random weights, or ``--weights``: ``paddleclas`` for PaddleClas's ImageNet
weights, downloaded once, or a ``.pdparams``, mmcls or oplib checkpoint file, as
``oplib.checkpoints.weights_argument`` accepts them for every command) is exported in eval
mode with a dynamic batch and a dynamic image size (33 px and up a side: five stride-2 steps
must leave a pixel), then loaded back the way a deployment would load it and run once on a
``--size`` image batch against eager. The classifier returns the logits; ``--features-only``
exports the backbone (``RedNet.as_features``), which returns the maps of ``--out-indices``
(0: the stem's, stride 2; 1-4: the stages', strides 4-32) as a list, in ONNX one output per
map, named ``features_<level>``; a classifier's checkpoint loads into it (the head is left
out).

- ``onnx``: standard ONNX (``oplib.onnx``), run in ONNX Runtime; needs neither torch nor oplib.
- ``pt2``: a ``torch.export`` program (``torch.export.save``); loading needs torch and
  ``import oplib`` (the ops run as oplib's kernels).
- ``aoti``: an AOTInductor package (``torch._inductor.aoti_compile_and_package``); loading
  needs torch and ``import oplib`` (the custom ops are called from the compiled code).
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Optional, Union

import torch
from torch import Tensor
from torch.export import Dim

from . import _torch_private as private
from ._cli import parser as cli_parser, require_extra
from .checkpoints import accepted_weights, weights_argument
from .download import DownloadError
from .models import BLOCK_COUNTS, RedNetFeatures, rednet
from .models.rednets import _take_indices

FORMATS = ("onnx", "pt2", "aoti")


def dynamic_shapes() -> dict:
    """A dynamic batch and image size for a RedNet's input ``x``."""
    return {"x": {0: Dim("batch", max=4096), 2: Dim("height", min=33, max=4096), 3: Dim("width", min=33, max=4096)}}


def output_names(model: torch.nn.Module) -> Optional[list[str]]:
    """The names of ``model``'s outputs in an ONNX file: ``features_<level>`` for each map of a
    ``RedNetFeatures`` backbone; None for other models (torch.onnx's own names)."""
    if isinstance(model, RedNetFeatures):
        return [f"features_{level}" for level in model.out_indices]
    return None


def _tensors(outputs: Union[Tensor, Sequence[Tensor]]) -> list[Tensor]:
    """A model's output as a list: a classifier's one tensor, or a backbone's maps."""
    return [outputs] if isinstance(outputs, Tensor) else list(outputs)


def export(model: torch.nn.Module, example: torch.Tensor, format: str, out: Path) -> dict:
    """Export ``model`` (eval mode) to ``out`` in ``format``, load it back, run it on
    ``example`` and compare with eager. ``model`` returns one tensor (a classifier) or a list
    of them (a ``RedNetFeatures`` backbone; the exported model returns them all, in ONNX as
    the outputs ``output_names(model)``). Returns a summary; raises if any output differs by
    more than 1e-4 of its largest magnitude."""
    model = model.eval()
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    names = output_names(model)
    start = time.perf_counter()
    if format == "onnx":
        from . import onnx as oplib_onnx

        oplib_onnx.export(model, (example,), out, dynamic_shapes=dynamic_shapes(), check=False, output_names=names)
        run = lambda x: oplib_onnx.run(out, (x,))  # noqa: E731
    else:
        program = torch.export.export(model, (example,), dynamic_shapes=dynamic_shapes())
        if format == "pt2":
            torch.export.save(program, out)
            loaded = torch.export.load(out).module()
        else:
            private.aoti_compile_and_package(program, package_path=str(out))
            loaded = private.aoti_load_package(str(out))
        run = lambda x: loaded(x)  # noqa: E731
    seconds = time.perf_counter() - start
    with torch.no_grad():
        expected, got = _tensors(model(example)), _tensors(run(example))
    if [g.shape for g in got] != [e.shape for e in expected]:
        raise RuntimeError(
            f"the exported {format} model returns shapes {[list(g.shape) for g in got]}, eager "
            f"{[list(e.shape) for e in expected]}"
        )
    errors = [float((g - e).abs().max()) / max(float(e.abs().max()), 1e-30) for g, e in zip(got, expected)]
    for index, error in enumerate(errors):
        if not error <= 1e-4:  # NaN included
            what = f"{format} model's {names[index]}" if names else f"{format} model"
            raise RuntimeError(f"the exported {what} differs from eager by {error:.3g} (relative)")
    return {
        "format": format,
        "path": str(out),
        "megabytes": round(out.stat().st_size / 1e6, 2),
        "export_seconds": round(seconds, 1),
        "relative_error": max(errors),
        "output_shapes": [list(e.shape) for e in expected],
    }


def _out_indices(text: str) -> tuple[int, ...]:
    """An argparse ``type``: comma-separated feature levels, as ``RedNet.as_features`` takes
    them (negative ones count from the end), returned as levels 0-4."""
    try:
        indices = [int(part) for part in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected comma-separated feature levels (0: the stem, 1-4: the stages), got {text!r}"
        ) from None
    try:
        return tuple(_take_indices(indices, "levels"))
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error).removeprefix("RedNet: ")) from None


def main(argv: list[str]) -> int:
    parser = cli_parser("python -m oplib export", __doc__)
    parser.add_argument("--depth", type=int, choices=sorted(BLOCK_COUNTS), required=True, help="RedNet depth")
    parser.add_argument(
        "--weights", type=weights_argument, default=None,
        help=f"default: random; {accepted_weights(command_line=True).removeprefix('expected ')}",
    )
    parser.add_argument(
        "--format", choices=FORMATS, required=True,
        help="onnx: standard ONNX (needs the onnx extra); pt2: a torch.export program; aoti: an AOTInductor package",
    )  # fmt: skip
    parser.add_argument("--size", type=int, default=224, help="image size of the check run (default 224)")
    parser.add_argument("--num-classes", type=int, default=None, help="the classifier's classes (default 1000)")
    parser.add_argument(
        "--features-only", action="store_true", help="export the backbone, which returns feature maps instead of logits"
    )
    parser.add_argument(
        "--out-indices", type=_out_indices, default=None, metavar="LEVELS",
        help="with --features-only: the maps it returns, comma-separated levels, 0: the stem (stride 2), 1-4: the "
        "stages (strides 4-32) (default 1,2,3,4)",
    )
    parser.add_argument("out", type=Path, help="the file to write (aoti: a name ending in .pt2)")
    args = parser.parse_args(argv)
    if args.format == "onnx":
        require_extra(parser, "onnx")
    if args.out_indices is not None and not args.features_only:
        parser.error("--out-indices: only with --features-only (the maps a backbone returns)")
    if args.features_only and args.num_classes is not None:
        parser.error("--num-classes: a --features-only backbone has no classifier")
    if args.format == "aoti" and args.out.suffix != ".pt2":
        parser.error(f"OUT: an AOTInductor package's name must end in .pt2, got {args.out.name}")
    if args.size < 33:
        parser.error(f"--size: expected at least 33 (five stride-2 steps), got {args.size}")
    kwargs = dict(num_classes=1000 if args.num_classes is None else args.num_classes)
    if args.features_only:
        kwargs = dict(features_only=True)
        if args.out_indices is not None:
            kwargs["out_indices"] = args.out_indices
    try:
        model = rednet(args.depth, weights=args.weights, **kwargs)
    except (ValueError, DownloadError) as error:
        parser.error(str(error))
    example = torch.randn(2, 3, args.size, args.size, generator=torch.Generator().manual_seed(0))
    print(json.dumps(export(model, example, args.format, args.out)))
    return 0


__all__ = ["FORMATS", "dynamic_shapes", "export", "main", "output_names"]
