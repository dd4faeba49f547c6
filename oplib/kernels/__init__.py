"""CUDA kernels shipped as ``.cu`` files, and the CuPy launcher that runs them.

Every kernel is a ``template <typename scalar_t, ...> __global__ void name(...)`` whose
arguments are pointers and ``index_t`` (64-bit) integers. A kernel templated on more than the
storage type lists the values of its other template parameters in ``// oplib-template:``
comment lines of its source, so that every instantiation a host may launch is known here
(``instantiations``) and compiled by the NVRTC tests. A launcher runs one instantiation by
name, dtype and those template arguments: ``CuPyLauncher`` on a GPU;
``oplib.testing.cuda_emulation.EmulatedLauncher`` compiles the same file for the host in the
tests. The op files hold the dispatch code (output allocation, argument order, the choice of
instantiation, launch configuration), shared by both.
"""

from __future__ import annotations

import functools
import ctypes
import hashlib
import itertools
import re
import threading
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


def name_expression(kernel: str, dtype: torch.dtype, specialisation: Sequence[str] = ()) -> str:
    """The C++ name of one instantiation of ``kernel``: ``involution_forward<float>``, or with
    the template arguments after the storage type, ``involution_forward_tiled<float, int, 7, 1, false>``."""
    return f"{kernel}<{', '.join((CTYPES[dtype], *specialisation))}>"


_KERNEL_PATTERN = re.compile(r"template\s*<([^>]*)>\s*__global__\s+void\s+(\w+)\s*\(([^)]*)\)")
# A source lists the template arguments of its specialised kernels in comment lines (see
# involution.cu): which kernels, then one line per template parameter after scalar_t.
_INSTANTIATE_PATTERN = re.compile(r"^// oplib-instantiate:(.*)$", re.MULTILINE)
_TEMPLATE_PATTERN = re.compile(r"^// oplib-template:\s*(\w+)\s*=(.*)$", re.MULTILINE)

KernelArg = Union[Tensor, int]


@dataclass(frozen=True)
class KernelSignature:
    name: str
    template_params: tuple[str, ...]  # the parameters after scalar_t, e.g. ("offset_t", "KERNEL")
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
            template = [" ".join(p.split()) for p in match.group(1).split(",")]
            if template[0] != "typename scalar_t":
                raise ValueError(f"{self.path.name}: {match.group(2)}'s first template parameter must be scalar_t")
            params = []
            for param in " ".join(match.group(3).split()).split(","):
                *type_words, name = param.strip().split(" ")
                params.append((" ".join(type_words), name))
            template_params = tuple(p.split(" ")[-1] for p in template[1:])
            signatures[match.group(2)] = KernelSignature(match.group(2), template_params, tuple(params))
        return signatures

    @functools.cached_property
    def specialisations(self) -> dict[str, tuple[tuple[str, ...], ...]]:
        """Kernel -> every tuple of template arguments after scalar_t that a host may launch
        (``()`` alone for a kernel templated on scalar_t only)."""
        values = {m.group(1): tuple(v.strip() for v in m.group(2).split("|")) for m in _TEMPLATE_PATTERN.finditer(self.text)}
        listed = {k.strip() for m in _INSTANTIATE_PATTERN.finditer(self.text) for k in m.group(1).split(",")}
        result = {}
        for name, signature in self.kernels.items():
            if not signature.template_params:
                result[name] = ((),)
                continue
            if name not in listed or any(p not in values for p in signature.template_params):
                raise ValueError(f"{self.path.name}: {name}'s template arguments are not all listed (oplib-template)")
            result[name] = tuple(itertools.product(*(values[p] for p in signature.template_params)))
        return result


@functools.cache
def load_source(filename: str) -> KernelSource:
    path = KERNEL_DIR / filename
    return KernelSource(path, path.read_text())


def instantiations(source: KernelSource) -> list[tuple[str, torch.dtype, tuple[str, ...]]]:
    """(kernel, dtype, specialisation) of every instantiation a host may launch from ``source``."""
    return [
        (kernel, dtype, specialisation)
        for kernel, specialisations in source.specialisations.items()
        for specialisation in specialisations
        for dtype in CTYPES
    ]


def name_expressions(source: KernelSource) -> list[str]:
    """Every instantiation of ``source`` (every kernel, dtype and specialisation): what the
    NVRTC tests compile. A GPU compiles only those it launches (CuPyLauncher)."""
    return [name_expression(*instantiation) for instantiation in instantiations(source)]


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
        self,
        source: KernelSource,
        kernel: str,
        dtype: torch.dtype,
        grid: int,
        block: int,
        args: Sequence[KernelArg],
        specialisation: tuple[str, ...] = (),
    ) -> None: ...


BLOCK_SIZE = 256
# Grid-stride loops cover any size; more blocks than this only add scheduling work.
MAX_BLOCKS = 1 << 16


def launch_elementwise(
    launcher: Launcher,
    source: KernelSource,
    kernel: str,
    out: Tensor,
    args: Sequence[KernelArg],
    threads: int | None = None,
    specialisation: tuple[str, ...] = (),
) -> None:
    """Launch ``kernel`` over ``threads`` work items (default: one per element of ``out``),
    as a grid-stride loop."""
    total = out.numel() if threads is None else threads
    if total == 0:
        return
    grid = min(MAX_BLOCKS, (total + BLOCK_SIZE - 1) // BLOCK_SIZE)
    launcher.launch(source, kernel, out.dtype, grid, BLOCK_SIZE, args, specialisation)


class CuPyLauncher:
    """Compiles each kernel instantiation the first time a device launches it (CuPy's NVRTC,
    cached on disk by CuPy) and launches it on PyTorch's current stream of the tensors' device.

    A launch costs a dictionary lookup, the arguments written into a reused parameter block
    and one cuLaunchKernel: no CuPy stream wrapper, no numpy scalars, and a device switch only
    when the calling thread's current context is not the tensors' device's.
    """

    def __init__(self):
        try:
            import cupy
            from cupy_backends.cuda.api import driver
        except ImportError as error:
            raise RuntimeError(
                "oplib's CUDA kernels need CuPy: pip install 'torch-oplib[cuda12]' or 'torch-oplib[cuda13]' "
                "(the extra matching your CUDA major version)"
            ) from error
        self._cupy = cupy
        self._driver = driver
        self._modules: list[object] = []
        # (source hash, kernel, dtype, specialisation, device) -> the kernel's CUfunction handle
        self._functions: dict[tuple, int] = {}
        self._contexts: dict[int, int] = {}  # device -> its primary context, where the modules load
        self._parameters = threading.local()

    def load(self, source: KernelSource, device: int, which: Sequence[tuple] | None = None) -> None:
        """Compile the instantiations ``which`` ((kernel, dtype, specialisation) tuples; default:
        every one of ``source``) in one module for ``device``, and load it there."""
        which = tuple(instantiations(source) if which is None else which)
        names = [name_expression(*instantiation) for instantiation in which]
        with self._cupy.cuda.Device(device):
            module = self._cupy.RawModule(code=source.text, options=NVRTC_OPTIONS, name_expressions=names)
            module.compile()
            self._contexts[device] = self._driver.ctxGetCurrent()
        self._modules.append(module)  # a module's functions live as long as it does
        for (kernel, dtype, specialisation), name in zip(which, names):
            key = (source.sha256, kernel, dtype, specialisation, device)
            self._functions[key] = module.get_function(name).ptr

    def function(self, source: KernelSource, kernel: str, dtype: torch.dtype, specialisation: tuple[str, ...],
                 device: int) -> int:
        """The CUfunction of one instantiation on ``device``, compiled on first use."""
        key = (source.sha256, kernel, dtype, specialisation, device)
        handle = self._functions.get(key)
        if handle is None:
            self.load(source, device, [(kernel, dtype, specialisation)])
            handle = self._functions[key]
        return handle

    def launch(self, source, kernel, dtype, grid, block, args, specialisation=()) -> None:
        device = next(a.device for a in args if isinstance(a, Tensor)).index
        function = self.function(source, kernel, dtype, specialisation, device)
        values, pointers = self._parameter_block(len(args))
        # Every kernel parameter is 8 bytes: a pointer or an index_t (long long).
        values[:] = [a.data_ptr() if isinstance(a, Tensor) else a for a in args]
        stream = torch.cuda.current_stream(device).cuda_stream
        if self._driver.ctxGetCurrent() == self._contexts[device]:
            self._driver.launchKernel(function, grid, 1, 1, block, 1, 1, 0, stream, ctypes.addressof(pointers), 0)
        else:
            with self._cupy.cuda.Device(device):
                self._driver.launchKernel(function, grid, 1, 1, block, 1, 1, 0, stream, ctypes.addressof(pointers), 0)

    def _parameter_block(self, count: int):
        """This thread's argument values (``count`` int64) and the array of pointers to them that
        cuLaunchKernel reads; the driver copies the values at the launch, so the block is reused."""
        blocks = self._parameters.__dict__.setdefault("blocks", {})
        block = blocks.get(count)
        if block is None:
            values = (ctypes.c_int64 * count)()
            base = ctypes.addressof(values)
            pointers = (ctypes.c_void_p * count)(*(base + 8 * i for i in range(count)))
            block = blocks[count] = (values, pointers)
        return block


@functools.cache
def cupy_launcher() -> CuPyLauncher:
    return CuPyLauncher()


def load(device: Union[torch.device, str, int, None] = None) -> None:
    """Compile and load every op's CUDA kernels on ``device`` (default: the current CUDA
    device) now, every dtype and specialisation in one NVRTC compile, rather than each at its
    first call. A first call inside a CUDA graph capture
    works without it (the module loads during the capture; tests/test_cuda_streams.py), but
    compiling takes seconds on a cold cache (CuPy keeps the results on disk), which this moves
    out of timed or latency-bound code. ``load("cpu")`` builds the native CPU kernels of involution
    (unless ``OPLIB_CPU_KERNELS=pytorch``; ``oplib.kernels.native``): about a minute, once
    per machine, compiler and torch, as ``python -m oplib build`` does."""
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
