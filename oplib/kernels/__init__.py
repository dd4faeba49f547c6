"""oplib's kernels, one folder per kind, each op's device code beside its device:

- ``involution/``: involution's backends, each writing into a result the op allocated in
  its fake's layout: ``cpu`` (the native kernels or the plain-PyTorch strategies),
  ``cuda`` (the launch policy and launches of ``involution.cu`` and
  ``involution_generated.cu``), ``layouts`` (the memory formats both share with the fakes);
- ``cpu/``: the C++ sources of the native CPU kernels, built on first use by ``native``;
- ``*.cu``: the CUDA sources, read by ``cuda_source`` and run by ``cuda_launch`` (CuPy on
  a GPU; ``oplib.testing.cuda_emulation`` on the host in the tests).

This file only hands on the names most callers want.
"""

from .cuda_launch import (
    BLOCK_SIZE,
    CUDA_DISPATCH,
    MAX_BLOCKS,
    CudaDispatch,
    CuPyLauncher,
    Launcher,
    cuda_dispatch,
    cupy_launcher,
    launch_elementwise,
    load,
)
from .cuda_source import (
    CTYPES,
    KERNEL_DIR,
    NVRTC_OPTIONS,
    KernelArg,
    KernelSignature,
    KernelSource,
    instantiations,
    load_source,
    name_expression,
    name_expressions,
)

__all__ = [
    "BLOCK_SIZE",
    "CTYPES",
    "CUDA_DISPATCH",
    "KERNEL_DIR",
    "MAX_BLOCKS",
    "NVRTC_OPTIONS",
    "CuPyLauncher",
    "CudaDispatch",
    "KernelArg",
    "KernelSignature",
    "KernelSource",
    "Launcher",
    "cuda_dispatch",
    "cupy_launcher",
    "instantiations",
    "launch_elementwise",
    "load",
    "load_source",
    "name_expression",
    "name_expressions",
]
