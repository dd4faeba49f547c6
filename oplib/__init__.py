"""oplib: PyTorch custom operators that behave the same in eager mode, under
torch.compile, in torch.export graphs and AOTInductor packages.

Importing oplib registers ``torch.ops.oplib.*``. The submodules with optional dependencies or
a longer import (``oplib.models``, ``oplib.onnx``, ``oplib.testing``, ...) are imported on
first use as attributes: ``oplib.models.rednet50()`` works after a plain ``import oplib``.
"""

import importlib

from . import ops  # noqa: F401  (registers the ops before anything uses them)
from . import nn, registry
from .functional import conv2d, exp, involution, involution_generated, linear

__all__ = ["conv2d", "exp", "involution", "involution_generated", "linear", "nn", "registry"]
__version__ = "0.1.0"

# Imported on first access (PEP 562): what `import oplib` does not need, it does not load.
_LAZY_SUBMODULES = ("benchmark", "checkpoints", "deploy", "imagenet", "models", "onnx", "testing", "train")


def __getattr__(name: str):
    if name in _LAZY_SUBMODULES:
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY_SUBMODULES})
