"""Running the kernels of ``oplib/kernels/<op>/csrc/cuda/*.cu``: the launcher protocol, the grid-stride
launch every kernel uses, CuPy's launcher (NVRTC, compiled on first use) and each op's CUDA
dispatch. ``oplib.testing.cuda_emulation.EmulatedLauncher`` implements the same protocol by
compiling the sources for the host, so the dispatch code (output allocation, argument order,
choice of instantiation, launch configuration) runs unchanged in the tests.
"""

from __future__ import annotations

import ctypes
import functools
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol, Union

import torch
from torch import Tensor

from .cuda_source import NVRTC_OPTIONS, KernelArg, KernelSource, instantiations, load_source, name_expression

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
            for (kernel, dtype, specialisation), name in zip(which, names):
                key = (source.sha256, kernel, dtype, specialisation, device)
                # get_function gives a RawKernel; its `kernel` (the cupy.cuda.function.Function
                # of the current device, hence inside the device's scope) holds the CUfunction.
                self._functions[key] = module.get_function(name).kernel.ptr
        self._modules.append(module)  # a module's functions live as long as it does

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
        context, current = self._contexts[device], self._driver.ctxGetCurrent()
        if current == context:
            self._driver.launchKernel(function, grid, 1, 1, block, 1, 1, 0, stream, ctypes.addressof(pointers), 0)
            return
        # Another device's context, or none: a thread that never touched CUDA, such as autograd's
        # backward thread, where cupy.cuda.Device would see device 0 "current" and set nothing.
        self._driver.ctxSetCurrent(context)
        try:
            self._driver.launchKernel(function, grid, 1, 1, block, 1, 1, 0, stream, ctypes.addressof(pointers), 0)
        finally:
            self._driver.ctxSetCurrent(current)

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
    works without it (the module loads during the capture; tests/kernels/cuda/test_cuda_streams.py), but
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
