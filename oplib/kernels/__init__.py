"""oplib's kernels: one folder per op, each op's device code beside its device, in the same
shape on both sides, over the machinery all ops share.

- ``involution/``: involution's backends, each writing into a result the op allocated in
  its fake's layout: ``cpu.py`` (the native kernels, or the plain-PyTorch strategies of
  ``pytorch/``), ``cuda.py`` (the launch policy and launches of ``csrc/cuda/*.cu``),
  ``layouts.py`` (the memory formats both share with the fakes), ``csrc/cpu/`` (the native
  C++ kernels) and ``csrc/cuda/`` (the CUDA kernels);
- ``csrc/cuda/``: the headers every CUDA source includes (``element.cuh``, ``warp.cuh``);
- ``native``: the build of the native CPU kernels (first use, or ``python -m oplib build``);
- ``cuda_source``: the CUDA sources as the host reads them (signatures, template values,
  constants, launch bounds); ``cuda_launch``: the launch contract and CuPy's launcher (on
  a GPU; ``oplib.testing.cuda_emulation`` runs the same launches on the host in the tests);
  ``cuda_plan``: each op's CUDA host path done once per call signature, and tuning among its
  candidate kernels (``set_cuda_tuning``).

This file only hands on the names most callers want.
"""

from .cuda_launch import (
    BLOCK_SIZE,
    CUDA_DISPATCH,
    MAX_BLOCKS,
    CudaDispatch,
    CuPyLauncher,
    LaunchConfig,
    Launcher,
    cuda_dispatch,
    cupy_launcher,
    launch_elementwise,
    linear_config,
    load,
)
from .cuda_plan import cuda_tuning, cuda_tuning_enabled, set_cuda_tuning
from .cuda_source import (
    CTYPES,
    INCLUDE_DIR,
    KERNEL_DIR,
    NVRTC_OPTIONS,
    KernelArg,
    KernelSignature,
    KernelSource,
    covering_instantiations,
    instantiations,
    load_source,
    name_expression,
    name_expressions,
)

__all__ = [
    "BLOCK_SIZE",
    "CTYPES",
    "CUDA_DISPATCH",
    "INCLUDE_DIR",
    "KERNEL_DIR",
    "MAX_BLOCKS",
    "NVRTC_OPTIONS",
    "CuPyLauncher",
    "CudaDispatch",
    "LaunchConfig",
    "KernelArg",
    "KernelSignature",
    "KernelSource",
    "Launcher",
    "cuda_dispatch",
    "cuda_tuning",
    "cuda_tuning_enabled",
    "covering_instantiations",
    "cupy_launcher",
    "instantiations",
    "launch_elementwise",
    "linear_config",
    "load",
    "load_source",
    "name_expression",
    "name_expressions",
    "set_cuda_tuning",
]
