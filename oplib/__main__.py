"""``python -m oplib``: the op table and a self-check of every op on every device.

    python -m oplib              # table, then the self-check (exit code 1 on any failure)
    python -m oplib list         # the table only
    python -m oplib check --op conv2d --device cpu
    python -m oplib check --import my_specs   # also your ops: the OpSpec list my_specs.SPECS
    python -m oplib train --help  # train a RedNet on scikit-learn's digits (oplib.train)
    python -m oplib evaluate --depth 50 --weights FILE DATA_DIR   # ImageNet accuracy (oplib.imagenet)
    python -m oplib predict --depth 50 --weights FILE IMAGE...    # top-5 classes per image
    python -m oplib export --depth 26 --format onnx|pt2|aoti OUT   # a deployable file (oplib.deploy)
    python -m oplib export --features-only --depth 50 --format onnx OUT   # the backbone: its feature maps
    python -m oplib bench --help  # time involution here against a depthwise conv and unfold (oplib.benchmark)
    python -m oplib build         # build the native CPU kernels now, not at first use (oplib.kernels.native)
    python -m oplib --version
"""

from __future__ import annotations

import argparse
import importlib
import sys
import time
from collections.abc import Iterable

import torch

from . import __version__, registry, selfcheck
from .kernels import native


def _parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m oplib", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=f"torch-oplib {__version__}")
    commands = parser.add_subparsers(dest="command")
    commands.add_parser("list", help="print the registry as a table")
    # Parsed by their own modules (main() hands them the rest of the command line); listed here for --help.
    commands.add_parser("train", help="train a RedNet on scikit-learn's digits (python -m oplib train --help)")
    commands.add_parser("evaluate", help="ImageNet top-1/top-5 of a pretrained RedNet (python -m oplib evaluate --help)")
    commands.add_parser("predict", help="the top-5 ImageNet classes of images (python -m oplib predict --help)")
    commands.add_parser("export", help="a RedNet (or its backbone) as ONNX, torch.export or AOTInductor file (python -m oplib export --help)")
    commands.add_parser(
        "bench", help="time involution against a depthwise convolution and unfold on this machine (python -m oplib bench --help)"
    )
    commands.add_parser("build", help="build the native CPU kernels ahead of first use (python -m oplib build --help)")
    check = commands.add_parser("check", help="print the table, then self-check every op (the default)")
    for p in (parser, check):
        p.add_argument(
            "--import", dest="imports", action="append", default=[], metavar="MODULE",
            help="import MODULE and list and check the specs in its SPECS too (repeatable)",
        )
        p.add_argument("--op", action="append", help="only this op (repeatable)")
        p.add_argument("--device", action="append", help="only this device (repeatable)")
    return parser.parse_args(argv)


def _check(args: argparse.Namespace) -> int:
    specs = [s for s in registry.all_specs() if not args.op or s.name in args.op]
    devices = [d for d in registry.available_devices() if not args.device or d in args.device]
    if not specs or not devices:
        print(f"nothing to check: ops {args.op}, devices {args.device}", file=sys.stderr)
        return 2
    print(f"self-check on {', '.join(devices)} (torch {torch.__version__}, {torch.get_num_threads()} threads)")
    print(f"involution's CPU kernels: {native.status()}")

    def report(result: selfcheck.CheckResult) -> None:
        note = f"  ({result.detail})" if not result.applicable else ""
        print(f"  {result.op:<10} {result.device:<5} {result.check:<20} {result.status} {result.seconds:6.1f}s{note}", flush=True)

    start = time.perf_counter()
    results = selfcheck.run(specs, devices, report)
    print()
    print(selfcheck.results_matrix(results))
    failures = [r for r in results if not r.passed]
    for r in failures:
        print(f"\n--- {r.op} on {r.device}: {r.check} failed ---\n{r.detail}", file=sys.stderr)
    passed = sum(r.passed and r.applicable for r in results)
    skipped = sum(not r.applicable for r in results)
    print(f"\n{passed} passed, {len(failures)} failed, {skipped} not applicable in {time.perf_counter() - start:.1f}s")
    return 1 if failures else 0


def _specs_of(module) -> Iterable[registry.OpSpec]:
    specs = getattr(module, "SPECS", None)
    if specs is None:
        raise SystemExit(f"python -m oplib: --import {module.__name__}: the module has no SPECS (a list of OpSpec)")
    return specs


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["train"]:
        from . import train

        return train.main(argv[1:])
    if argv[:1] in (["evaluate"], ["predict"]):
        from . import imagenet

        return (imagenet.evaluate_main if argv[0] == "evaluate" else imagenet.predict_main)(argv[1:])
    if argv[:1] == ["export"]:
        from . import deploy

        return deploy.main(argv[1:])
    if argv[:1] == ["bench"]:
        from . import benchmark

        return benchmark.main(argv[1:])
    if argv[:1] == ["build"]:
        return native.main(argv[1:])
    args = _parse_args(argv)
    for module in args.imports:
        for spec in _specs_of(importlib.import_module(module)):
            registry.register(spec)
    print(selfcheck.registry_table(registry.all_specs()))
    print()
    if args.command == "list":
        return 0
    return _check(args)


if __name__ == "__main__":
    sys.exit(main())
