"""The paper's RedNets (``rednets``: the architecture, its builders and weight loading) and,
where timm is installed, their entries in timm's model registry (``_timm``), registered when
this package is imported. ``_timm`` builds through ``rednets``; nothing imports back here."""

from __future__ import annotations

import importlib.util
import warnings

from .rednets import *  # noqa: F403 (the public names: rednets.__all__, re-exported as ours)
from .rednets import __all__  # noqa: F401


def _register_with_timm() -> None:
    """The RedNets in timm's registry where timm is installed (``oplib.models._timm``)."""
    if importlib.util.find_spec("timm") is None:
        return
    try:
        from . import _timm  # noqa: F401
    except Exception as error:  # timm present but broken, e.g. a torchvision built for another torch
        warnings.warn(f"oplib: timm is installed but does not import ({type(error).__name__}: {error}); "
                      "the RedNets are not registered with it", stacklevel=2)


_register_with_timm()
