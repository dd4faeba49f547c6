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


@dataclass(frozen=True)
class CudaDispatch:
    """An op's CUDA dispatch: ``launch(*op_args, launcher)`` allocates the output and launches
    ``kernels`` of the ``.cu`` file ``source``. The op's CUDA kernel registration calls it with
    CuPy's launcher; the self-check and the tests call it with the host emulation's."""

    qualname: str
    launch: Callable[..., Tensor]
    source: str
    kernels: tuple[str, ...]

    def __call__(self, *args) -> Tensor:
        return self.launch(*args)


# qualname -> its CUDA dispatch, for every op with CUDA kernels of its own.
CUDA_DISPATCH: dict[str, CudaDispatch] = {}


def cuda_dispatch(qualname: str, source: str, kernels: Sequence[str]):
    """Register the decorated launch function as ``qualname``'s CUDA dispatch, which launches
    ``kernels`` from the file ``source`` in this folder (see CudaDispatch)."""

    def register(launch: Callable[..., Tensor]) -> Callable[..., Tensor]:
        CUDA_DISPATCH[qualname] = CudaDispatch(qualname, launch, source, tuple(kernels))
        return launch

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


class _StreamHandle:
    """A raw cudaStream_t in the CUDA stream protocol, which CuPy's Stream.from_external reads."""

    def __init__(self, handle: int):
        self.handle = handle

    def __cuda_stream__(self) -> tuple[int, int]:
        return (0, self.handle)


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

    def load(self, source: KernelSource, device: int):
        """Compile ``source`` for ``device`` and load it there, unless that was done before;
        returns the module."""
        key = (source.sha256, device)
        module = self._modules.get(key)
        if module is None:
            with self._cupy.cuda.Device(device):
                module = self._cupy.RawModule(
                    code=source.text, options=NVRTC_OPTIONS, name_expressions=name_expressions(source)
                )
                module.compile()
            self._modules[key] = module
        return module

    def launch(self, source, kernel, dtype, grid, block, args) -> None:
        import numpy

        device = next(a.device for a in args if isinstance(a, Tensor))
        function = self.load(source, device.index).get_function(name_expression(kernel, dtype))
        # Pointers go as 64-bit integers: the kernel parameters are 8-byte pointers and index_t.
        packed = tuple(numpy.uint64(a.data_ptr()) if isinstance(a, Tensor) else numpy.int64(a) for a in args)
        stream = self._stream(torch.cuda.current_stream(device).cuda_stream, device.index)
        with self._cupy.cuda.Device(device.index), stream:
            function((grid,), (block,), packed)

    def _stream(self, handle: int, device: int):
        """PyTorch's stream as a CuPy stream (ExternalStream before CuPy 14, which deprecates it)."""
        from_external = getattr(self._cupy.cuda.Stream, "from_external", None)
        if from_external is not None:
            return from_external(_StreamHandle(handle))
        return self._cupy.cuda.ExternalStream(handle, device_id=device)


@functools.cache
def cupy_launcher() -> CuPyLauncher:
    return CuPyLauncher()


def load(device: Union[torch.device, str, int, None] = None) -> None:
    """Compile and load every op's CUDA kernels on ``device`` (default: the current CUDA
    device) now, rather than at each op's first call. A first call inside a CUDA graph capture
    works without it (the module loads during the capture; tests/test_cuda_streams.py), but
    compiling takes seconds on a cold cache (CuPy keeps the results on disk), which this moves
    out of timed or latency-bound code. ``load("cpu")`` builds the native CPU kernels of involution
    (unless ``OPLIB_CPU_KERNELS=pytorch``; ``oplib.kernels.native``): a minute or two, once
    per machine and torch."""
    device = torch.device("cuda", device) if isinstance(device, int) else torch.device(device or "cuda")
    if device.type == "cpu":
        from . import native

        native.involution()
        return
    if device.type != "cuda":
        raise ValueError(f"oplib.kernels.load: expected a CPU or CUDA device, got {device}")
    index = torch.cuda.current_device() if device.index is None else device.index
    launcher = cupy_launcher()
    for filename in sorted({dispatch.source for dispatch in CUDA_DISPATCH.values()}):
        launcher.load(load_source(filename), index)
