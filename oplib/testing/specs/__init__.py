"""oplib's own op specs, one module per op file of ``oplib/ops/``; imported by the first read
of the registry (``oplib.registry.BUILTIN_SPEC_MODULES``), never by ``import oplib``. Every
module here is imported, so a new op's spec needs no import added here."""

import importlib
import pkgutil

for _module in pkgutil.iter_modules(__path__):
    importlib.import_module(f"{__name__}.{_module.name}")
