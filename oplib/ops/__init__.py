"""One module per custom op; importing this package registers ``torch.ops.oplib.*``."""

from . import conv2d, exp, involution, linear  # noqa: F401
