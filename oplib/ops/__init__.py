"""One module per custom op; importing this package registers ``torch.ops.oplib.*``.

Every module here that does not start with an underscore is an op file and is imported, so a
new op's file needs no import added here. ``register_autocast_policy`` is public: any custom
op, in any namespace, can follow one of torch's autocast policies with it.
"""

import importlib
import pkgutil

from ._common import register_autocast_policy  # noqa: F401  (public)

for _module in pkgutil.iter_modules(__path__):
    if not _module.name.startswith("_"):
        importlib.import_module(f"{__name__}.{_module.name}")
