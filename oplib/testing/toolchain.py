"""Which C++ compilers this machine has, for the checks that need one.

Two checks compile C++ besides oplib's own native kernels (``oplib.kernels.native``, which
fall back to plain PyTorch without one): the host emulation of the CUDA kernels
(``cuda_emulation``, the compiler ``$CXX`` or ``g++``) and ``torch.compile`` on CPU, whose
inductor backend generates and compiles C++ (a torch requirement: without a compiler it
raises ``InvalidCxxCompiler``). Where a compiler is missing, these checks do not apply; every
other check still runs.
"""

from __future__ import annotations

import functools
import shutil
from typing import Optional

from .cuda_emulation import cxx


def missing_host_compiler() -> Optional[str]:
    """Why the CUDA kernels' host emulation cannot be built here, or None where it can."""
    if shutil.which(cxx()) is None:
        return f"no C++ compiler ({cxx()!r}) on the PATH to build the CUDA kernels' host emulation"
    return None


@functools.cache
def missing_inductor_compiler() -> Optional[str]:
    """Why torch.compile cannot generate CPU code here (inductor finds no C++ compiler), or
    None where it can."""
    from .. import _torch_private

    try:
        _torch_private.get_cpp_compiler()
    except Exception as error:  # InvalidCxxCompiler, whose module path differs across torch versions
        return f"torch.compile's CPU code generation (inductor) needs a C++ compiler: {type(error).__name__}: {error}"
    return None


def require_host_compiler() -> None:
    """Skip the calling test where the host emulation cannot be built."""
    _skip_if(missing_host_compiler())


def require_inductor_compiler(device: str) -> None:
    """Skip the calling test where torch.compile cannot generate code for ``device``."""
    _skip_if(missing_inductor_compiler() if device == "cpu" else None)


def _skip_if(reason: Optional[str]) -> None:
    if reason is not None:
        import pytest

        pytest.skip(reason)
