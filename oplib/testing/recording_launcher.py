"""CuPy's launcher with the GPU taken out, to time the CUDA host path on any machine.

``RecordingCuPyLauncher`` is ``oplib.kernels.CuPyLauncher`` itself (its ``prepare``, its
parameter blocks, its context check and its ``_launch``) over a driver that counts launches
instead of making them, with kernel handles handed out instead of compiled and stream 0 in
place of PyTorch's current CUDA stream. An op's CUDA kernel (``oplib.ops._rules.cuda_kernel``)
built over it runs every line of the host path a GPU call runs, on CPU tensors, up to the
driver call: what ``bench/host_launch.py`` times against a bare op every session.
"""

from __future__ import annotations

import itertools
import threading

from torch import Tensor

from ..kernels.cuda_launch import CuPyLauncher
from ..kernels.cuda_source import instantiations


# cudaDevAttrMaxSharedMemoryPerBlockOptin of sm_90 (the CUDA C++ Programming Guide's table of
# compute capabilities: 227 KB).
SM90_SHARED_MEMORY_OPT_IN = 227 * 1024


class _CountingDriver:
    """The driver calls a launch makes: the current context (always the launcher's), the
    launch itself, counted, and (once a kernel, above 48 KiB of shared memory) the opt-in,
    counted."""

    def __init__(self):
        self.launches = 0
        self.opt_ins = 0

    def ctxGetCurrent(self) -> int:
        return 0

    def launchKernel(self, *arguments) -> None:
        self.launches += 1

    def funcSetAttribute(self, function, attribute, value) -> None:
        self.opt_ins += 1


class RecordingCuPyLauncher(CuPyLauncher):
    """CuPy's launcher on the host: ``launches`` counts the kernels it would have launched."""

    def __init__(self):  # no CuPy: nothing here touches it
        self._driver = _CountingDriver()
        self._modules = []
        self._functions = {}
        self._contexts = {}
        self._opted_in = {}
        self._parameters = threading.local()
        self._handles = itertools.count(1)

    # No GPU to ask: a launch policy that weighs the GPU's occupancy (the staged forward's
    # tiles) or its build's local memory (involution_vectors.cu's channels a thread) takes its
    # choice without it, as on any launcher that has neither.
    occupancy = None
    local_bytes = None

    @property
    def launches(self) -> int:
        return self._driver.launches

    def load(self, source, device, which=None) -> None:
        """A handle per instantiation, as a compiled module would give."""
        for kernel, dtype, specialisation in (instantiations(source) if which is None else which):
            self._functions[(source.sha256, kernel, dtype, specialisation, device)] = next(self._handles)
        self._contexts[device] = 0

    def _stream(self, device) -> int:
        return 0

    def _shared_memory_limit(self, device) -> int:
        """An H100's or H200's opt-in limit (sm_90: 227 KiB), the GPUs the tables are measured
        on, in place of asking a GPU this machine need not have (before: the tensor-core and
        tiled kernels' opt-in asked torch.cuda, and bench/host_launch.py failed on CPU)."""
        return SM90_SHARED_MEMORY_OPT_IN

    def _device(self, kernel, args):
        """CPU tensors stand in for a GPU's here (their pointers are only written into the
        parameter block), so the one-CUDA-device check is left out."""
        return next(a.device for a in args if isinstance(a, Tensor)).index
