"""The native CPU kernels (``involution.cpp``), compiled on first use by torch's own JIT
build (``torch.utils.cpp_extension.load``: ninja, the host C++ compiler, a cache directory
keyed here by the source, the flags and this CPU's instruction sets).

``OPLIB_CPU_KERNELS`` picks the path, read at each call:

- ``auto`` (the default): the native kernels, built on first use; where there is no compiler
  or ninja, or the build fails, the plain-PyTorch kernels, with one warning saying why and
  what to do. The native kernels are faster at every RedNet shape
  (``bench/results/involution.md`` compares the two).
- ``native``: the native kernels, and an error where they cannot be built.
- ``pytorch``: the plain-PyTorch kernels of ``involution_cpu``.

``involution()`` returns the built module, or None where the plain-PyTorch kernels run.
"""

from __future__ import annotations

import functools
import hashlib
import os
import platform
import shutil
import warnings
from pathlib import Path
from types import ModuleType
from typing import Optional

KERNEL_DIR = Path(__file__).resolve().parent
SOURCE = KERNEL_DIR / "involution.cpp"
ENV = "OPLIB_CPU_KERNELS"
CHOICES = ("pytorch", "auto", "native")
DEFAULT = "auto"
# -march=native: the build runs on the machine that runs it (the cache key holds its CPU).
# -fopenmp: at::parallel_for is inline in torch's headers, an OpenMP region; without the flag
# it runs on one thread.
CFLAGS = ("-O3", "-march=native", "-fopenmp")
LDFLAGS = ("-fopenmp",)


class NativeBuildWarning(UserWarning):
    """The native CPU kernels could not be built; the plain-PyTorch kernels run instead."""


def requested() -> str:
    choice = os.environ.get(ENV, DEFAULT).strip().lower() or DEFAULT
    if choice not in CHOICES:
        raise ValueError(f"{ENV}={choice!r}: expected one of {', '.join(CHOICES)}")
    return choice


def _cpu_identity() -> str:
    """What -march=native compiles for: the CPU's model and instruction-set flags."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return platform.processor() or platform.machine()
    keep = [line for line in lines if line.startswith(("model name", "flags", "Features"))]
    return "\n".join(dict.fromkeys(keep))


# AddressSanitizer builds (the tests): such a module loads only into a process started with
# the ASan runtime preloaded (oplib.testing.cuda_emulation.asan_environment). -O1, ASan's own
# advice, replaces CFLAGS' -O3 (gcc keeps the last -O): the kernels' vector code is written
# with intrinsics, so the accesses checked are the same, and at -O3 the sanitized build takes
# more than twice as long (the integration tier makes four).
SANITIZE_FLAGS = ("-fsanitize=address", "-fno-omit-frame-pointer", "-g", "-O1")


def build(source: Path = SOURCE, sanitize: bool = False) -> ModuleType:
    """Build (or find in the cache) and import the module of ``source``; raises on failure."""
    import torch
    from torch.utils import cpp_extension

    cflags, ldflags = list(CFLAGS), list(LDFLAGS)
    if sanitize:
        cflags, ldflags = cflags + list(SANITIZE_FLAGS), ldflags + ["-fsanitize=address"]
    # The module is built against this torch's headers and library: a cache entry is kept per torch.
    key = [source.read_text(), *cflags, *ldflags, _cpu_identity(), torch.__version__]
    digest = hashlib.sha256("\0".join(key).encode())
    name = f"oplib_involution_cpu_{digest.hexdigest()[:16]}"
    return cpp_extension.load(name=name, sources=[str(source)], extra_cflags=cflags, extra_ldflags=ldflags)


def _missing_tool() -> Optional[str]:
    from torch.utils import cpp_extension

    compiler = os.environ.get("CXX", "c++")
    if shutil.which(compiler) is None:
        return f"no C++ compiler ({compiler!r}) on the PATH"
    if not cpp_extension.is_ninja_available():
        return "ninja is not installed (pip install ninja)"
    return None


def involution() -> Optional[ModuleType]:
    """The built module, or None where the plain-PyTorch kernels run (see the module docstring)."""
    return _load(requested())


@functools.cache
def _load(choice: str) -> Optional[ModuleType]:
    """Built once per process and choice; a fallback warns once."""
    if choice == "pytorch":
        return None
    reason = _missing_tool()
    if reason is None:
        try:
            return build()
        except Exception as error:  # noqa: BLE001  (any build failure falls back, with its reason)
            lines = str(error).strip().splitlines() or [repr(error)]
            reason = f"building {SOURCE.name} failed: {lines[-1]}"
    if choice == "native":
        raise RuntimeError(f"{ENV}=native, but the native CPU kernels are unavailable: {reason}")
    warnings.warn(
        f"oplib: involution runs its plain-PyTorch CPU kernels (slower): {reason}. A C++ compiler and ninja "
        f"give the native kernels, built once on first use; {ENV}=pytorch silences this.",
        NativeBuildWarning,
        stacklevel=3,
    )
    return None


def status() -> str:
    """One line for ``python -m oplib``: which CPU path involution takes here, and why."""
    choice = requested()
    module = involution()
    if module is not None:
        default = "" if ENV in os.environ else ", the default"
        return f"native ({ENV}={choice}{default}; built in {Path(module.__file__).parent})"
    if choice == "pytorch":
        return f"plain PyTorch ({ENV}=pytorch)"
    return f"plain PyTorch ({_missing_tool() or 'the native build failed'})"
