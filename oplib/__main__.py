"""``python -m oplib``: the commands of oplib. A bare ``python -m oplib`` prints this help.

    python -m oplib info          # the environment, for bug reports
    python -m oplib list          # every op: schema, devices, dtypes, what it registers
    python -m oplib check         # the self-check of every op on every device
    python -m oplib check --op conv2d --device cpu
    python -m oplib check --import my_specs   # also your ops: the OpSpec list my_specs.SPECS
    python -m oplib build         # build the native CPU kernels now, not at first use
    python -m oplib train         # train a RedNet on scikit-learn's digits
    python -m oplib evaluate --depth 50 --weights paddleclas DATA_DIR   # ImageNet accuracy
    python -m oplib predict --depth 50 --weights paddleclas IMAGE...    # top-5 classes per image
    python -m oplib export --depth 26 --format onnx|pt2|aoti OUT        # a deployable file
    python -m oplib bench         # time involution here against a depthwise conv and unfold
    python -m oplib -V            # the version

Each command's ``--help`` says more.
"""

from __future__ import annotations

import argparse
import importlib
import shutil
import sys
import time
from collections.abc import Iterable

import torch

from . import __version__, registry, selfcheck
from ._cli import parser as cli_parser
from ._extras import MissingExtraError
from .kernels import native


# The commands their own modules parse (main() hands them the rest of the command line):
# name -> (module, function, help).
DELEGATED = {
    "info": ("oplib.info", "main", "the environment: versions, native kernels, CUDA, extras (for bug reports)"),
    "build": ("oplib.kernels.native", "main", "build the native CPU kernels ahead of first use"),
    "train": ("oplib.train", "main", "train a RedNet on scikit-learn's digits"),
    "evaluate": ("oplib.imagenet", "evaluate_main", "ImageNet top-1/top-5 of a pretrained RedNet"),
    "predict": ("oplib.imagenet", "predict_main", "the top-5 ImageNet classes of images"),
    "export": ("oplib.deploy", "main", "a RedNet (or its backbone) as an ONNX, torch.export or AOTInductor file"),
    "bench": ("oplib.benchmark", "main", "time involution against a depthwise convolution and unfold here"),
}


def _parser() -> argparse.ArgumentParser:
    parser = cli_parser("python -m oplib", __doc__)
    parser.add_argument("-V", "--version", action="version", version=f"torch-oplib {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    listing = commands.add_parser("list", help="every op: its schema, devices, dtypes and what it registers")
    check = commands.add_parser("check", help="self-check every op on every device (exit code 1 on any failure)")
    for name, (_, _, text) in DELEGATED.items():
        commands.add_parser(name, help=text, add_help=False)
    for p in (listing, check):
        p.add_argument(
            "--import", dest="imports", action="append", default=[], metavar="MODULE",
            help="import MODULE and list and check the specs in its SPECS too (repeatable)",
        )  # fmt: skip
    for p in (listing, check):
        p.add_argument("--op", action="append", help="only this op (repeatable)")
    check.add_argument("--device", action="append", help="only this device (repeatable)")
    return parser


def _check(args: argparse.Namespace) -> int:
    specs = [s for s in registry.all_specs() if not args.op or s.name in args.op]
    devices = [d for d in registry.available_devices() if not args.device or d in args.device]
    if not specs or not devices:
        print(f"nothing to check: ops {args.op}, devices {args.device}", file=sys.stderr)
        return 2
    print(f"self-check on {', '.join(devices)} (torch {torch.__version__}, {torch.get_num_threads()} threads)")
    print(f"involution's CPU kernels: {native.status()}")
    width = max(len(spec.name) for spec in specs)

    def report(result: selfcheck.CheckResult) -> None:
        note = f"  ({result.detail})" if not result.applicable else ""
        print(f"  {result.op:<{width}} {result.device:<5} {result.check:<18} {result.status:<4} {result.seconds:6.1f}s{note}",
              flush=True)  # fmt: skip

    start = time.perf_counter()
    results = selfcheck.run(specs, devices, report)
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
    try:
        if argv[:1] and argv[0] in DELEGATED:
            module, function, _ = DELEGATED[argv[0]]
            return getattr(importlib.import_module(module), function)(argv[1:])
        parser = _parser()
        args = parser.parse_args(argv)
        if args.command is None:
            parser.print_help()
            return 0
        for module in args.imports:
            for spec in _specs_of(importlib.import_module(module)):
                registry.register(spec)
        if args.command == "list":
            specs = [s for s in registry.all_specs() if not args.op or s.name in args.op]
            print(selfcheck.registry_listing(specs, min(100, shutil.get_terminal_size().columns)))
            return 0
        return _check(args)
    except MissingExtraError as error:
        command = f" {argv[0]}" if argv[:1] and not argv[0].startswith("-") else ""
        print(f"python -m oplib{command}: {error}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
