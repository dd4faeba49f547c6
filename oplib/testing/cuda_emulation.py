"""Run oplib's CUDA kernels on the CPU: the very same ``.cu`` source, compiled by the host
C++ compiler against ``cuda_host_shim.h``, launched over the whole grid.

``EmulatedLauncher`` is a drop-in for ``oplib.kernels.CuPyLauncher``: the ops' dispatch code
(output allocation, argument order, dtype selection, launch configuration) runs unchanged on
CPU tensors. Built with ``sanitize=True`` the library is instrumented by AddressSanitizer, so
an out-of-bounds access (an illegal address on a GPU) aborts with a report; such a library
only loads into a process started with the ASan runtime preloaded (see ``asan_environment``).

A kernel whose threads cooperate (shared memory, barriers, warp shuffles: ``cooperative``)
runs each block's threads as fibers, in the launcher's run order (``ORDERS`` or
``INTERLEAVED``); a block that can never finish (a barrier some threads never reach) raises ``EmulationError`` saying where.
The shim's header comment tells how.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import re
import subprocess
import tempfile
import threading
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch
from torch import Tensor

from ..kernels.cuda_launch import LaunchConfig
from ..kernels.native import compiler_environment
from ..kernels.cuda_source import CTYPES, INCLUDE_DIR, KernelArg, KernelSource, name_expression

SHIM = Path(__file__).resolve().parent / "cuda_host_shim.h"
# The orders in which a block's warps, and the lanes of each, take turns (the shim's header
# comment): one after another, ascending or descending, each as far as it can before a block
# barrier, so that a missing barrier's race shows in one of the two.
ORDERS = ("ascending", "descending")
# A third order: the warps ascending in turns, each to its next wait, so that a warp sees what
# another wrote into its share of shared memory between two of its own collectives (a staging
# that runs past its share), which the two above never show. It shows fewer missing barriers.
INTERLEAVED = "interleaved"
_ORDER_CODES = {**{order: code for code, order in enumerate(ORDERS)}, INTERLEAVED: len(ORDERS)}  # enum Order
_CACHE_DIR = Path(os.environ.get("OPLIB_EMULATION_CACHE", Path(tempfile.gettempdir()) / "oplib-emulation"))


def cxx() -> str:
    return os.environ.get("CXX", "g++")


def asan_environment() -> dict[str, str]:
    """The environment a process needs to load a ``sanitize=True`` library."""
    runtime = subprocess.run([cxx(), "-print-file-name=libasan.so"], capture_output=True, text=True, check=True)
    env = dict(os.environ)
    env["LD_PRELOAD"] = runtime.stdout.strip()
    env["ASAN_OPTIONS"] = "detect_leaks=0:abort_on_error=0:halt_on_error=1"
    return env


def emulated_symbol(kernel: str, ctype: str, specialisation: tuple[str, ...] = ()) -> str:
    """The exported name of one instantiation's launcher in the emulation library."""
    return "__".join(["oplib_emulate", kernel, ctype, *specialisation]).replace(" ", "_")


class EmulationError(RuntimeError):
    """A kernel the emulation cannot run to its end, such as a block with a barrier that some
    of its threads never reach: on a GPU it would hang or compute garbage."""


# What makes a block's threads wait for each other, as a source spells it.
_COOPERATION = re.compile(r"\b(__syncthreads|__syncwarp|__shfl\w*_sync|__shared__|OPLIB_DYNAMIC_SHARED)\b")
_INCLUDE = re.compile(r'^\s*#\s*include\s*"([^"]+)"', re.MULTILINE)
_COMMENT = re.compile(r"//[^\n]*|/\*.*?\*/", re.DOTALL)


def cooperative(source: KernelSource) -> bool:
    """Whether the threads of ``source``'s blocks cooperate: shared memory, barriers or warp
    shuffles in its code or in the shared headers it includes (comments aside). Such a kernel
    runs its blocks' threads as fibers; any other one runs them one after another, faster."""
    seen, texts = set(), [source.text]
    while texts:
        code = _COMMENT.sub("", texts.pop())
        if _COOPERATION.search(code):
            return True
        for name in _INCLUDE.findall(code):
            header = INCLUDE_DIR / name
            if name not in seen and header.is_file():
                seen.add(name)
                texts.append(header.read_text())
    return False


# The exported count of the library's runs of `oplib-cold` blocks (the shim's cold_block_runs).
COLD_BLOCK_RUNS = "oplib_emulation_cold_block_runs"


def _launcher_source(source: KernelSource, kernel: str, dtype: torch.dtype) -> str:
    """A C++ file including the kernel source plus, per instantiation of ``kernel`` in ``dtype``
    (each specialisation), an exported ``extern "C"`` function that runs it over a grid, its
    threads in the order ``order`` says (the shim's enum Order), and returns nullptr or an error
    message."""
    launch = "launch_fibers" if cooperative(source) else "launch"
    lines = [f'#include "{SHIM}"', f'#include "{source.path}"', "",
             f'extern "C" long long {COLD_BLOCK_RUNS}() {{ return oplib_emulation::cold_block_runs.load(); }}', ""]
    signature, ctype = source.kernels[kernel], CTYPES[dtype]
    arg_names = ", ".join(name for _, name in signature.params)
    for specialisation in source.specialisations[kernel]:
        lines += [
            f'extern "C" const char* {emulated_symbol(kernel, ctype, specialisation)}(const unsigned int* grid, '
            f"const unsigned int* block, long long shared_bytes, int order, "
            f"{signature.instantiated_params(ctype)}) {{",
            f"    return oplib_emulation::{launch}(grid, block, shared_bytes, order, [&] {{ "
            f"{name_expression(kernel, dtype, specialisation)}({arg_names}); }});",
            "}",
            "",
        ]
    return "\n".join(lines)


def build(source: KernelSource, sanitize: bool = False) -> list[Path]:
    """Compile every emulation library of ``source`` (``build_kernel`` of each kernel in each
    dtype, two compiles at a time): where a test wants the source's compile errors at once."""
    with ThreadPoolExecutor(max(1, min(2, os.cpu_count() or 1))) as pool:
        return list(pool.map(lambda shard: build_kernel(source, *shard, sanitize=sanitize),
                             [(kernel, dtype) for kernel in source.kernels for dtype in CTYPES]))


@functools.cache
def build_kernel(source: KernelSource, kernel: str, dtype: torch.dtype, sanitize: bool = False) -> Path:
    """Compile the emulation library of ``kernel`` in ``dtype``, every specialisation of it (on
    disk, cached by content and flags; in the process, once per arguments). A library a kernel
    and dtype, not a source: a launch compiles only what it runs (a second of the compiler's for
    the shim and the source, then a tenth or so an instantiation), where involution.cu's 300
    instantiations at once took 39 s, paid again by each test that plants a bug in it."""
    # -O1: the CUDA tests' host emulation took 130 s here against -O2's 164 s (compiles a third
    # quicker, the emulated kernels barely slower) and -O0's 198 s (its kernels much slower).
    flags = ["-O1", "-std=c++17", "-shared", "-fPIC", "-fopenmp", f"-I{INCLUDE_DIR}"]
    # -Wno-unknown-pragmas: g++ has no `#pragma unroll` (an NVCC/NVRTC hint; it unrolls on its own).
    flags += ["-Wall", "-Wextra", "-Werror", "-Wno-unknown-pragmas"]
    # Shared memory is one array of bytes that kernels read and write through several types (a
    # word written as two 16-bit values, read as one 32-bit word), as CUDA allows there: no
    # optimisation may assume otherwise.
    flags += ["-fno-strict-aliasing"]
    # More flags for the host compiler, e.g. -DOPLIB_EMULATION_UCONTEXT: fibers switched by
    # POSIX's swapcontext, the shim's portable path, on x86-64 too.
    flags += os.environ.get("OPLIB_EMULATION_CXXFLAGS", "").split()
    if sanitize:
        flags += ["-fsanitize=address", "-fno-omit-frame-pointer", "-g1"]  # line tables, as native.SANITIZE_FLAGS
    code = _launcher_source(source, kernel, dtype)
    key = hashlib.sha256("\0".join([code, source.sha256, SHIM.read_text(), *flags]).encode()).hexdigest()[:16]
    library = _CACHE_DIR / f"{source.path.stem}-{kernel}-{CTYPES[dtype]}-{key}.so"
    if not library.exists():
        _CACHE_DIR.mkdir(parents=True, exist_ok=True)
        # Per process and thread, as the partial library: parallel test workers may build the same key.
        unique = f"{os.getpid()}-{threading.get_ident()}"
        launcher_cpp = library.with_suffix(f".{unique}.cpp")
        launcher_cpp.write_text(code)
        partial = library.with_suffix(f".{unique}.tmp")
        # Without ASan's runtime preloaded, where a process that loads sanitized libraries builds
        # one (the compiler would run under ASan's allocator, much slower).
        result = subprocess.run([cxx(), *flags, str(launcher_cpp), "-o", str(partial)], capture_output=True, text=True,
                                env=compiler_environment())
        if result.returncode != 0:
            raise RuntimeError(f"host compile of {source.path.name} ({kernel}<{CTYPES[dtype]}>) failed:\n{result.stderr}")
        partial.replace(library)  # atomic: concurrent builders never load a half-written file
    return library


@functools.cache
def _load(library: Path) -> ctypes.CDLL:
    return ctypes.CDLL(str(library))


class EmulatedLauncher:
    """Launches kernels of a ``KernelSource`` on CPU tensors, one host library per kernel and
    dtype; the threads of each block run in ``order`` (one of ``ORDERS``, or ``INTERLEAVED``)."""

    def __init__(self, sanitize: bool = False, order: str = "ascending"):
        if order not in _ORDER_CODES:
            raise ValueError(f"order must be one of {tuple(_ORDER_CODES)}, got {order!r}")
        self.sanitize = sanitize
        self.order = order
        # (kernel, dtype, blocks, threads per block, specialisation) of every launch, in order
        self.launches: list[tuple[str, torch.dtype, int, int, tuple[str, ...]]] = []
        # the threads' runs of `oplib-cold` blocks (OPLIB_COLD_BLOCK) over every launch: the code
        # of infs and nans, which a check on finite values requires none of
        self.cold_block_runs = 0

    def launch(self, source: KernelSource, kernel: str, dtype: torch.dtype, config: LaunchConfig,
               args: Sequence[KernelArg], specialisation: tuple[str, ...] = ()) -> None:
        signature = source.kernels[kernel]
        for (ctype, _), arg in zip(signature.params, args):
            # a pointer to scalar_t takes the launch's dtype; one to float (partial sums), float32;
            # a void one (a kernel's out in its dtype or in float, a template argument's choice) either
            expected = ((dtype, torch.float32) if "void" in ctype
                        else (torch.float32,) if "scalar_t" not in ctype and "float" in ctype else (dtype,))
            if isinstance(arg, Tensor) and (arg.device.type != "cpu" or arg.dtype not in expected):
                raise ValueError(f"emulated {kernel}<{CTYPES[dtype]}> got a {arg.dtype} tensor on {arg.device}")
        if specialisation not in source.specialisations[kernel]:
            raise ValueError(f"{kernel} has no instantiation {specialisation} in {source.path.name}")
        library = build_kernel(source, kernel, dtype, self.sanitize)
        function = getattr(_load(library), emulated_symbol(kernel, CTYPES[dtype], specialisation))
        config.check(kernel, signature)
        if len(args) != len(signature.params):
            raise ValueError(f"{kernel} takes {len(signature.params)} arguments, got {len(args)}")
        dim3 = ctypes.c_uint * 3
        c_args = [dim3(*config.grid), dim3(*config.block), ctypes.c_longlong(config.shared_bytes),
                  ctypes.c_int(_ORDER_CODES[self.order])]
        for (ctype, name), kind, arg in zip(signature.params, signature.param_ctypes, args):
            if kind is ctypes.c_void_p:
                if not isinstance(arg, Tensor):
                    raise TypeError(f"{kernel}: argument {name} is a pointer, got {type(arg).__name__}")
                c_args.append(ctypes.c_void_p(arg.data_ptr()))
            elif isinstance(arg, Tensor):
                raise TypeError(f"{kernel}: argument {name} is a {ctype}, got a tensor")
            else:
                c_args.append(kind(arg))
        blocks = config.grid[0] * config.grid[1] * config.grid[2]
        self.launches.append((kernel, dtype, blocks, config.threads_per_block, specialisation))
        function.restype = ctypes.c_char_p
        cold_runs = getattr(_load(library), COLD_BLOCK_RUNS)
        cold_runs.restype = ctypes.c_longlong
        cold_before = cold_runs()
        error = function(*c_args)
        self.cold_block_runs += cold_runs() - cold_before
        if error is not None:
            raise EmulationError(f"{kernel}<{CTYPES[dtype]}>: {error.decode()}")
