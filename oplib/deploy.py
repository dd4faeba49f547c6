"""``python -m oplib export``: a deployable file from a RedNet, checked by running it once.

    python -m oplib export --depth 26 [--weights FILE] --format onnx|pt2|aoti OUT

The model (random weights, or ``--weights``: the paper's checkpoint or an oplib state dict)
is exported in eval mode with a dynamic batch and a dynamic image size (33 px and up a side:
five stride-2 steps must leave a pixel), then loaded back the way a deployment would load it
and run once on a ``--size`` image batch against eager:

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
from pathlib import Path

import torch
from torch.export import Dim

from .models import BLOCK_COUNTS, rednet

FORMATS = ("onnx", "pt2", "aoti")


def dynamic_shapes() -> dict:
    """A dynamic batch and image size for a RedNet's input ``x``."""
    return {"x": {0: Dim("batch", max=4096), 2: Dim("height", min=33, max=4096), 3: Dim("width", min=33, max=4096)}}


def export(model: torch.nn.Module, example: torch.Tensor, format: str, out: Path) -> dict:
    """Export ``model`` (eval mode) to ``out`` in ``format``, load it back, run it on
    ``example`` and compare with eager. Returns a summary; raises if the outputs differ by
    more than 1e-4 of their largest magnitude."""
    model = model.eval()
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    if format == "onnx":
        from . import onnx as oplib_onnx

        oplib_onnx.export(model, (example,), out, dynamic_shapes=dynamic_shapes(), check=False)
        run = lambda x: oplib_onnx.run(out, (x,))[0]  # noqa: E731
    else:
        program = torch.export.export(model, (example,), dynamic_shapes=dynamic_shapes())
        if format == "pt2":
            torch.export.save(program, out)
            loaded = torch.export.load(out).module()
        else:
            torch._inductor.aoti_compile_and_package(program, package_path=str(out))
            loaded = torch._inductor.aoti_load_package(str(out))
        run = lambda x: loaded(x)  # noqa: E731
    seconds = time.perf_counter() - start
    with torch.no_grad():
        expected, got = model(example), run(example)
    error = float((got - expected).abs().max()) / max(float(expected.abs().max()), 1e-30)
    if not error <= 1e-4:
        raise RuntimeError(f"the exported {format} model differs from eager by {error:.3g} (relative)")
    return {"format": format, "path": str(out), "megabytes": round(out.stat().st_size / 1e6, 2), "export_seconds": round(seconds, 1), "relative_error": error}


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m oplib export", description=__doc__.splitlines()[0])
    parser.add_argument("--depth", type=int, choices=sorted(BLOCK_COUNTS), required=True)
    parser.add_argument("--weights", type=Path, default=None, help="the paper's checkpoint or an oplib state dict (default: random)")
    parser.add_argument("--format", choices=FORMATS, required=True)
    parser.add_argument("--size", type=int, default=224, help="image size of the check run (default 224)")
    parser.add_argument("--num-classes", type=int, default=1000)
    parser.add_argument("out", type=Path)
    args = parser.parse_args(argv)
    if args.format == "aoti" and args.out.suffix != ".pt2":
        parser.error(f"OUT: an AOTInductor package's name must end in .pt2, got {args.out.name}")
    if args.size < 33:
        parser.error(f"--size: expected at least 33 (five stride-2 steps), got {args.size}")
    if args.weights is not None and not args.weights.is_file():
        parser.error(f"--weights: no file at {args.weights}")
    try:
        model = rednet(args.depth, weights=args.weights, num_classes=args.num_classes)
    except ValueError as error:
        parser.error(str(error))
    example = torch.randn(2, 3, args.size, args.size, generator=torch.Generator().manual_seed(0))
    print(json.dumps(export(model, example, args.format, args.out)))
    return 0


__all__ = ["FORMATS", "dynamic_shapes", "export", "main"]
