"""CUDA kernels shipped as ``.cu`` files, and the CuPy launcher that runs them.

Every kernel is a ``template <typename scalar_t> __global__ void name(...)`` whose arguments
are pointers and ``index_t`` (64-bit) integers. A launcher runs one by name for one dtype:
``CuPyLauncher`` on a GPU; ``oplib.testing.cuda_emulation.EmulatedLauncher`` compiles the
same file for the host in the tests. The op files hold the dispatch code (output
allocation, argument order, launch configuration), shared by both.
"""

from __future__ import annotations

import functools
import hashlib
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, Union

import torch
from torch import Tensor

KERNEL_DIR = Path(__file__).resolve().parent

# The C++ storage type of each dtype, as the templates are instantiated.
CTYPES: dict[torch.dtype, str] = {
    torch.float32: "float",
    torch.float64: "double",
    torch.float16: "oplib_half",
    torch.bfloat16: "oplib_bfloat16",
}

# What CuPyLauncher hands NVRTC besides the source; the NVRTC tests compile with the same.
NVRTC_OPTIONS: tuple[str, ...] = ("--std=c++17", f"-I{KERNEL_DIR}")


def name_expression(kernel: str, dtype: torch.dtype) -> str:
    """The C++ name of ``kernel``'s instantiation for ``dtype``, e.g. ``involution_forward<float>``."""
    return f"{kernel}<{CTYPES[dtype]}>"

_KERNEL_PATTERN = re.compile(r"template\s*<\s*typename\s+scalar_t\s*>\s*__global__\s+void\s+(\w+)\s*\(([^)]*)\)")

KernelArg = Union[Tensor, int]


@dataclass(frozen=True)
class KernelSignature:
    name: str
    params: tuple[tuple[str, str], ...]  # (C++ type, name), as written with scalar_t

    def instantiated_params(self, ctype: str) -> str:
        return ", ".join(f"{t.replace('scalar_t', ctype)} {n}" for t, n in self.params)


@dataclass(frozen=True)
class KernelSource:
    path: Path
    text: str

    @functools.cached_property
    def sha256(self) -> str:
        """Hash of the source and of the shared headers it may include (read once: the
        launchers key their caches by it on every launch)."""
        digest = hashlib.sha256(self.text.encode())
        for header in sorted(KERNEL_DIR.glob("*.cuh")):
            digest.update(header.read_bytes())
        return digest.hexdigest()

    @functools.cached_property
    def kernels(self) -> dict[str, KernelSignature]:
        signatures = {}
        for match in _KERNEL_PATTERN.finditer(self.text):
            params = []
            for param in " ".join(match.group(2).split()).split(","):
                *type_words, name = param.strip().split(" ")
                params.append((" ".join(type_words), name))
            signatures[match.group(1)] = KernelSignature(match.group(1), tuple(params))
        return signatures


@functools.cache
def load_source(filename: str) -> KernelSource:
    path = KERNEL_DIR / filename
    return KernelSource(path, path.read_text())


def name_expressions(source: KernelSource) -> list[str]:
    """Every kernel of ``source`` for every dtype: the instantiations a module compiles."""
    return [name_expression(kernel, dtype) for kernel in source.kernels for dtype in CTYPES]


# qualname -> the dispatch function the op's CUDA kernel registration calls, which takes the
# op's arguments and a launcher last; the self-check and the tests run it with the host
# emulation's launcher.
CUDA_DISPATCH: dict[str, Callable[..., Tensor]] = {}


def cuda_dispatch(qualname: str):
    """Register the decorated function as ``qualname``'s CUDA dispatch (see CUDA_DISPATCH)."""

    def register(function: Callable[..., Tensor]) -> Callable[..., Tensor]:
        CUDA_DISPATCH[qualname] = function
        return function

    return register


class Launcher(Protocol):
    def launch(
        self, source: KernelSource, kernel: str, dtype: torch.dtype, grid: int, block: int, args: Sequence[KernelArg]
    ) -> None: ...


BLOCK_SIZE = 256
# Grid-stride loops cover any size; more blocks than this only add scheduling work.
MAX_BLOCKS = 1 << 16


def launch_elementwise(
    launcher: Launcher, source: KernelSource, kernel: str, out: Tensor, args: Sequence[KernelArg]
) -> None:
    """Launch ``kernel`` with one thread per element of ``out`` (a grid-stride loop)."""
    total = out.numel()
    if total == 0:
        return
    grid = min(MAX_BLOCKS, (total + BLOCK_SIZE - 1) // BLOCK_SIZE)
    launcher.launch(source, kernel, out.dtype, grid, BLOCK_SIZE, args)


class CuPyLauncher:
    """Compiles each ``.cu`` file once per device with NVRTC (every kernel, every dtype) and
    launches on PyTorch's current stream of the tensors' device."""

    def __init__(self):
        try:
            import cupy
        except ImportError as error:
            raise RuntimeError(
                "oplib's CUDA kernels need CuPy: pip install 'torch-oplib[cuda12]' or 'torch-oplib[cuda13]' "
                "(the extra matching your CUDA major version)"
            ) from error
        self._cupy = cupy
        self._modules: dict[tuple[str, int], object] = {}

    def _function(self, source: KernelSource, kernel: str, dtype: torch.dtype, device: int):
        key = (source.sha256, device)
        module = self._modules.get(key)
        if module is None:
            with self._cupy.cuda.Device(device):
                module = self._cupy.RawModule(
                    code=source.text, options=NVRTC_OPTIONS, name_expressions=name_expressions(source)
                )
                module.compile()
            self._modules[key] = module
        return module.get_function(name_expression(kernel, dtype))

    def launch(self, source, kernel, dtype, grid, block, args) -> None:
        import numpy

        device = next(a.device for a in args if isinstance(a, Tensor))
        function = self._function(source, kernel, dtype, device.index)
        # Pointers go as 64-bit integers: the kernel parameters are 8-byte pointers and index_t.
        packed = tuple(numpy.uint64(a.data_ptr()) if isinstance(a, Tensor) else numpy.int64(a) for a in args)
        stream = self._cupy.cuda.ExternalStream(torch.cuda.current_stream(device).cuda_stream, device_id=device.index)
        with self._cupy.cuda.Device(device.index), stream:
            function((grid,), (block,), packed)


@functools.cache
def cupy_launcher() -> CuPyLauncher:
    return CuPyLauncher()
