"""oplib: PyTorch custom operators that behave the same in eager mode, under
torch.compile, in torch.export graphs and AOTInductor packages.

Importing oplib registers ``torch.ops.oplib.*``.
"""

from . import ops  # noqa: F401  (registers the ops before anything uses them)
from . import nn, registry
from .functional import conv2d, exp, involution, involution_generated, linear

__all__ = ["conv2d", "exp", "involution", "involution_generated", "linear", "nn", "registry"]
__version__ = "0.1.0"
