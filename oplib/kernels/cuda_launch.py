"""Running the kernels of ``oplib/kernels/<op>/csrc/cuda/*.cu``: the launch contract
(``LaunchConfig``: grid and block as dim3, dynamic shared memory; scalars passed as the types
the kernel's signature declares; ``__launch_bounds__`` respected), the launcher protocol, the
grid-stride launch of the elementwise kernels, CuPy's launcher (NVRTC, compiled on first use)
and each op's CUDA dispatch. ``oplib.testing.cuda_emulation.EmulatedLauncher`` implements the
same protocol by compiling the sources for the host, so the dispatch code (output allocation,
argument order, choice of instantiation, launch configuration) runs unchanged in the tests.
"""

from __future__ import annotations

import ctypes
import functools
import math
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Optional, Protocol, Union

import torch
from torch import Tensor

from .. import _torch_private
from . import cuda_prebuilt
from .cuda_source import NVRTC_OPTIONS, KernelArg, KernelSignature, KernelSource, instantiations, load_source, name_expression

@dataclass(frozen=True)
class CudaDispatch:
    """An op's CUDA dispatch: ``launch(*op_args, launcher)`` allocates the output and launches
    one of ``kernels``, found in the ``.cu`` files ``sources``. The op's CUDA kernel registration
    calls it with CuPy's launcher; the self-check and the tests call it with the host emulation's."""

    qualname: str
    launch: Callable[..., Tensor]
    sources: tuple[str, ...]
    kernels: tuple[str, ...]

    def __call__(self, *args) -> Tensor:
        return self.launch(*args)


# qualname -> its CUDA dispatch, for every op with CUDA kernels of its own.
CUDA_DISPATCH: dict[str, CudaDispatch] = {}


def cuda_dispatch(qualname: str, sources: Union[str, Sequence[str]], kernels: Sequence[str]):
    """Register the decorated launch function as ``qualname``'s CUDA dispatch, which launches
    ``kernels`` from the file or files ``sources`` in this folder (see CudaDispatch)."""
    sources = (sources,) if isinstance(sources, str) else tuple(sources)

    def register(launch: Callable[..., Tensor]) -> Callable[..., Tensor]:
        CUDA_DISPATCH[qualname] = CudaDispatch(qualname, launch, sources, tuple(kernels))
        return launch

    return register


BLOCK_SIZE = 256
# Grid-stride loops cover any size; more blocks than this only add scheduling work.
MAX_BLOCKS = 1 << 16
# CUDA's limits on every GPU oplib targets (sm_75 and newer): threads per block, grid size per
# axis, and the dynamic shared memory a kernel gets without opting in (above it, up to the
# device's opt-in limit, the launcher sets the kernel's attribute first).
MAX_THREADS_PER_BLOCK = 1024
MAX_GRID = (2**31 - 1, 65535, 65535)
MAX_BLOCK = (1024, 1024, 64)
SHARED_BYTES_WITHOUT_OPT_IN = 48 * 1024
# cudaFuncAttributeMaxDynamicSharedMemorySize (CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES)
_MAX_DYNAMIC_SHARED_ATTRIBUTE = 8
# CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES: a kernel's local memory a thread (``local_bytes``).
_LOCAL_SIZE_ATTRIBUTE = 3
# CuPyLauncher.time_calls: rounds, calls a round, and the spin (GPU cycles, about a millisecond)
# each run waits behind, longer than the host takes to queue a run of the slowest writer.
TIMING_ROUNDS = 3
TIMING_REPEATS = 5
TIMING_SPIN_CYCLES = 2_000_000


def _dim3(value: int | Sequence[int]) -> tuple[int, int, int]:
    values = (value,) if isinstance(value, int) else tuple(value)
    if not 1 <= len(values) <= 3:
        raise ValueError(f"a dim3 has 1 to 3 sizes, got {value!r}")
    return (*values, *(1,) * (3 - len(values)))


@dataclass(frozen=True)
class LaunchConfig:
    """How one kernel is launched: ``grid`` blocks of ``block`` threads, each a CUDA dim3
    (x, y, z; an int is (x, 1, 1)), and ``shared_bytes`` of dynamic shared memory per block
    (``extern __shared__``; above 48 KiB the launcher opts the kernel in)."""

    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    shared_bytes: int = 0

    def __init__(self, grid: int | Sequence[int], block: int | Sequence[int], shared_bytes: int = 0):
        object.__setattr__(self, "grid", _dim3(grid))
        object.__setattr__(self, "block", _dim3(block))
        object.__setattr__(self, "shared_bytes", int(shared_bytes))

    @property
    def threads_per_block(self) -> int:
        return self.block[0] * self.block[1] * self.block[2]

    def check(self, kernel: str, signature: KernelSignature) -> None:
        """Refuse what a GPU would refuse at the launch, with a message naming the limit:
        every size at least 1 and within CUDA's, the block within the kernel's
        ``__launch_bounds__``."""
        if min(self.grid + self.block) < 1 or any(g > m for g, m in zip(self.grid, MAX_GRID)):
            raise ValueError(f"{kernel}: grid {self.grid} is outside CUDA's 1..{MAX_GRID}")
        if any(b > m for b, m in zip(self.block, MAX_BLOCK)) or self.threads_per_block > MAX_THREADS_PER_BLOCK:
            raise ValueError(f"{kernel}: block {self.block} is outside CUDA's {MAX_BLOCK}, "
                             f"{MAX_THREADS_PER_BLOCK} threads in all")
        if signature.max_threads is not None and self.threads_per_block > signature.max_threads:
            raise ValueError(f"{kernel}: block {self.block} has {self.threads_per_block} threads, more than its "
                             f"__launch_bounds__({signature.max_threads})")
        if self.shared_bytes < 0:
            raise ValueError(f"{kernel}: shared_bytes must be >= 0, got {self.shared_bytes}")


def linear_config(blocks: int, threads: int = BLOCK_SIZE, shared_bytes: int = 0) -> LaunchConfig:
    """A 1-D launch of ``blocks`` blocks of ``threads`` threads."""
    return LaunchConfig((blocks, 1, 1), (threads, 1, 1), shared_bytes)


class Launcher(Protocol):
    def launch(
        self,
        source: KernelSource,
        kernel: str,
        dtype: torch.dtype,
        config: LaunchConfig,
        args: Sequence[KernelArg],
        specialisation: tuple[str, ...] = (),
    ) -> None: ...


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
    launcher.launch(source, kernel, out.dtype, linear_config(grid), args, specialisation)


def launch_device(kernel: str, args: Sequence[KernelArg]) -> int:
    """The one CUDA device every tensor of a launch lies on. A kernel handed a CPU tensor's
    pointer reads host memory as if it were the device's (an illegal address, or garbage where
    the GPU can map it): refused here instead, as torch's own ops refuse mixed devices."""
    devices = {a.device for a in args if isinstance(a, Tensor)}
    device = next(iter(devices), None)
    if len(devices) != 1 or device.type != "cuda":
        raise ValueError(f"{kernel}: every tensor must be on one CUDA device, got {sorted(map(str, devices))}")
    return device.index


class CuPyLauncher:
    """Compiles each kernel instantiation the first time a device launches it (CuPy's NVRTC,
    cached on disk by CuPy) and launches it on PyTorch's current stream of the tensors' device.

    A launch costs a dictionary lookup, the arguments written into a reused parameter block
    (each as the type the kernel declares) and one cuLaunchKernel with the config's grid, block
    and dynamic shared memory: no CuPy stream wrapper, no numpy scalars, and a device switch
    only when the calling thread's current context is not the tensors' device's.
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
        self._opted_in: dict[int, int] = {}  # CUfunction -> the dynamic shared memory it may take
        self._parameters = threading.local()

    def load(self, source: KernelSource, device: int, which: Sequence[tuple] | None = None) -> None:
        """Compile the instantiations ``which`` ((kernel, dtype, specialisation) tuples; default:
        every one of ``source``) in one module for ``device``, and load it there. Where
        ``OPLIB_CUDA_PREBUILT`` names a folder with a cubin of this very source for this GPU
        (``cuda_prebuilt``), every instantiation is loaded from it instead, nothing compiled."""
        with self._cupy.cuda.Device(device):
            prebuilt = cuda_prebuilt.load_functions(self._cupy, source, device)
            if prebuilt is not None:
                module, functions = prebuilt
            else:
                which = tuple(instantiations(source) if which is None else which)
                names = [name_expression(*instantiation) for instantiation in which]
                module = self._cupy.RawModule(code=source.text, options=NVRTC_OPTIONS, name_expressions=names)
                module.compile()
                # get_function gives a RawKernel; its `kernel` (the cupy.cuda.function.Function
                # of the current device, hence inside the device's scope) holds the CUfunction.
                functions = {instantiation: module.get_function(name).kernel.ptr
                             for instantiation, name in zip(which, names)}
            self._contexts[device] = self._driver.ctxGetCurrent()
            for (kernel, dtype, specialisation), handle in functions.items():
                self._functions[source.sha256, kernel, dtype, specialisation, device] = handle
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

    def launch(self, source, kernel, dtype, config, args, specialisation=()) -> None:
        self.prepare(source, kernel, dtype, config, specialisation, self._device(kernel, args))(args)

    def _device(self, kernel: str, args: Sequence[KernelArg]) -> int:
        return launch_device(kernel, args)

    def prepare(self, source: KernelSource, kernel: str, dtype: torch.dtype, config: LaunchConfig,
                specialisation: tuple[str, ...], device: int) -> Callable[[Sequence[KernelArg]], None]:
        """``kernel``'s launch with ``config`` on ``device``, all but the argument values decided
        (the config checked, the kernel compiled or found, shared memory opted into): what a
        ``LaunchPlan`` keeps and calls with each call's pointers."""
        signature = source.kernels[kernel]
        config.check(kernel, signature)
        function = self.function(source, kernel, dtype, specialisation, device)
        if config.shared_bytes > SHARED_BYTES_WITHOUT_OPT_IN:
            self._opt_in(function, config.shared_bytes, device, kernel)
        kinds = signature.param_ctypes
        geometry = (*config.grid, *config.block, config.shared_bytes)

        def launch(args: Sequence[KernelArg]) -> None:
            values, pointers = self._parameter_block(kinds)
            if len(args) != len(values):
                raise ValueError(f"{kernel} takes {len(values)} arguments, got {len(args)}")
            for value, arg in zip(values, args):
                value.value = arg.data_ptr() if isinstance(arg, Tensor) else arg
            self._launch(function, geometry, device, pointers)

        return launch

    def _launch(self, function: int, geometry: tuple, device: int, pointers) -> None:
        self._in_context(device, self._driver.launchKernel, function, *geometry, self._stream(device),
                         ctypes.addressof(pointers), 0)

    def _in_context(self, device: int, call: Callable, *arguments):
        """``call(*arguments)`` (a driver call) with ``device``'s primary context current."""
        context, current = self._contexts[device], self._driver.ctxGetCurrent()
        if current == context:
            return call(*arguments)
        # Another device's context, or none: a thread that never touched CUDA, such as autograd's
        # backward thread, where cupy.cuda.Device would see device 0 "current" and set nothing.
        self._driver.ctxSetCurrent(context)
        try:
            return call(*arguments)
        finally:
            self._driver.ctxSetCurrent(current)

    def occupancy(self, source: KernelSource, kernel: str, dtype: torch.dtype, specialisation: tuple[str, ...],
                  device: torch.device, threads: int, shared_bytes: int) -> Optional[tuple[int, int]]:
        """(the blocks of ``threads`` threads an SM of ``device`` holds at once of ``kernel``'s
        instantiation with ``shared_bytes`` of dynamic shared memory, by the driver's occupancy
        calculator (its registers, static shared memory and launch bounds, the GPU's limits),
        the GPU's SMs): what a launch policy that chooses among tile shapes weighs; None for a
        device that is no GPU. Compiles the instantiation if it must (its first launch would)."""
        if device.type != "cuda":
            return None
        index = torch.cuda.current_device() if device.index is None else device.index
        function = self.function(source, kernel, dtype, specialisation, index)
        if shared_bytes > SHARED_BYTES_WITHOUT_OPT_IN:
            self._opt_in(function, shared_bytes, index, kernel)
        blocks = self._in_context(index, self._driver.occupancyMaxActiveBlocksPerMultiprocessor, function, threads,
                                  shared_bytes)
        return blocks, torch.cuda.get_device_properties(index).multi_processor_count

    def local_bytes(self, source: KernelSource, kernel: str, dtype: torch.dtype, specialisation: tuple[str, ...],
                    device: torch.device) -> Optional[int]:
        """The local memory a thread of ``kernel``'s instantiation takes on ``device``, by the
        driver (``CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES``: what ptxas spilled, and arrays it kept out
        of registers): what a launch policy that takes a wider instantiation only where it did
        not spill weighs (``vectors_wide``); None for a device that is no GPU. Compiles the
        instantiation if it must."""
        if device.type != "cuda":
            return None
        index = torch.cuda.current_device() if device.index is None else device.index
        function = self.function(source, kernel, dtype, specialisation, index)
        return self._in_context(index, self._driver.funcGetAttribute, _LOCAL_SIZE_ATTRIBUTE, function)

    def time_calls(self, calls: Sequence[Callable[[], object]], device: Optional[int]) -> Optional[list[float]]:
        """Each of ``calls``' device time per call in seconds on ``device``'s current stream, for
        tuning (``oplib.kernels.cuda_plan``): each called once first (its kernels loaded, its
        shared memory opted into, the ops it calls tuned themselves), then ``TIMING_ROUNDS``
        interleaved rounds of ``TIMING_REPEATS`` calls of each between two CUDA events, each run
        queued behind a spin of ``TIMING_SPIN_CYCLES`` so that the GPU waits for none of the
        host's launches and the events read device time; the least of a call's rounds. None
        while the stream is capturing a CUDA graph."""
        if torch.cuda.is_current_stream_capturing():
            return None
        with torch.cuda.device(device):
            for call in calls:
                call()
            best = [math.inf] * len(calls)
            for _ in range(TIMING_ROUNDS):
                events = []
                for call in calls:
                    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                    _torch_private.cuda_sleep(TIMING_SPIN_CYCLES)
                    start.record()
                    for _ in range(TIMING_REPEATS):
                        call()
                    end.record()
                    events.append((start, end))
                events[-1][1].synchronize()
                for index, (start, end) in enumerate(events):
                    best[index] = min(best[index], start.elapsed_time(end) / 1e3 / TIMING_REPEATS)
        return best

    def _stream(self, device: int) -> int:
        """PyTorch's current stream on ``device``, read at each launch (so streams and graph
        captures work)."""
        return torch.cuda.current_stream(device).cuda_stream

    def _opt_in(self, function: int, shared_bytes: int, device: int, kernel: str) -> None:
        """Let ``function`` take ``shared_bytes`` of dynamic shared memory (above 48 KiB a kernel
        must ask; the device's opt-in limit is 99-227 KiB by architecture)."""
        if self._opted_in.get(function, 0) >= shared_bytes:
            return
        limit = self._shared_memory_limit(device)
        if shared_bytes > limit:
            raise ValueError(f"{kernel}: {shared_bytes} bytes of shared memory per block; this GPU allows {limit}")
        self._driver.funcSetAttribute(function, _MAX_DYNAMIC_SHARED_ATTRIBUTE, shared_bytes)
        self._opted_in[function] = shared_bytes

    def _shared_memory_limit(self, device: int) -> int:
        """The most dynamic shared memory a block of ``device`` may opt into."""
        return torch.cuda.get_device_properties(device).shared_memory_per_block_optin

    def _parameter_block(self, kinds: tuple[type, ...]):
        """This thread's argument values (one ctypes object per parameter, of its declared type)
        and the array of pointers to them that cuLaunchKernel reads; the driver copies the values
        at the launch, so the block is reused."""
        blocks = self._parameters.__dict__.setdefault("blocks", {})
        block = blocks.get(kinds)
        if block is None:
            values = [kind() for kind in kinds]
            pointers = (ctypes.c_void_p * len(kinds))(*(ctypes.addressof(v) for v in values))
            block = blocks[kinds] = (values, pointers)
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
    for filename in sorted({source for dispatch in CUDA_DISPATCH.values() for source in dispatch.sources}):
        launcher.load(load_source(filename), index)
