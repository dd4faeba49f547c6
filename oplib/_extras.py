"""The optional dependencies (pyproject.toml's extras) and the one way oplib imports them.

A path that needs a package oplib does not install by default imports it through
``require``, which names the extra to install when the package is missing, instead of a bare
``ModuleNotFoundError``:

    >>> require("json", "train", "this example").__name__
    'json'
"""

from __future__ import annotations

import importlib
from types import ModuleType

DISTRIBUTION = "torch-oplib"

# extra -> (what it gives, the import names it brings); pyproject.toml's optional-dependencies.
EXTRAS: dict[str, tuple[str, tuple[str, ...]]] = {
    "cuda12": ("involution's CUDA kernels (CUDA 12)", ("cupy",)),
    "cuda13": ("involution's CUDA kernels (CUDA 13)", ("cupy",)),
    "train": ("python -m oplib train", ("sklearn", "matplotlib", "tqdm")),
    "models": ("python -m oplib evaluate / predict", ("PIL", "tqdm")),
    "timm": ("timm.create_model for oplib's RedNets", ("timm",)),
    "onnx": ("ONNX export (oplib.onnx, python -m oplib export --format onnx)", ("onnx", "onnxscript", "onnxruntime")),
    "testing": ("the generated checks of oplib.testing (oplib.testing.generated_tests)", ("pytest",)),
}


class MissingExtraError(ModuleNotFoundError):
    """An optional dependency is missing; the message names the extra that installs it."""


def install_hint(extra: str) -> str:
    """How to install ``extra``: from the package index once released, from a checkout now."""
    return f"pip install '{DISTRIBUTION}[{extra}]' (from a checkout of the unreleased 0.1.0: pip install '.[{extra}]')"


def require(module: str, extra: str, purpose: str) -> ModuleType:
    """``importlib.import_module(module)``, or a ``MissingExtraError`` saying that ``purpose``
    needs ``extra`` and how to install it."""
    if extra not in EXTRAS:
        raise ValueError(f"unknown extra {extra!r}: expected one of {', '.join(EXTRAS)}")
    try:
        return importlib.import_module(module)
    except ImportError as error:
        if not _is_missing(error, module):
            raise
        top = module.split(".")[0]
        raise MissingExtraError(
            f"{purpose} needs {top}, which is not installed: it comes with the '{extra}' extra, {install_hint(extra)}",
            name=top,
        ) from error


def _is_missing(error: ImportError, module: str) -> bool:
    """Whether ``error`` says ``module`` (or a package above it) is absent, not that it failed
    while importing."""
    name = getattr(error, "name", None)
    parts = module.split(".")
    return isinstance(error, ModuleNotFoundError) and (
        name is None or any(name == ".".join(parts[: i + 1]) for i in range(len(parts)))
    )


# The extras told apart by their distribution, not their import name (both bring `cupy`).
DISTRIBUTIONS = {"cuda12": "cupy-cuda12x", "cuda13": "cupy-cuda13x"}


def installed() -> dict[str, bool]:
    """Each extra: whether every package it brings can be found (without importing it)."""
    from importlib.metadata import PackageNotFoundError, version
    from importlib.util import find_spec

    def distributed(name: str) -> bool:
        try:
            return bool(version(name))
        except PackageNotFoundError:
            return False

    def found(name: str) -> bool:
        try:
            return find_spec(name) is not None
        except (ImportError, ValueError):
            return False

    return {
        extra: distributed(DISTRIBUTIONS[extra]) if extra in DISTRIBUTIONS else all(found(name) for name in names)
        for extra, (_, names) in EXTRAS.items()
    }
