"""Compile oplib's ``.cu`` files as CuPy compiles them on a GPU, with NVRTC and no GPU.

On a user's GPU, ``CuPyLauncher`` hands ``cupy.RawModule`` the source, ``NVRTC_OPTIONS`` and
``name_expressions(source)``; CuPy 14 (``cupy._core.core.compile_with_cache`` and
``cupy/cuda/compiler.py``) then adds, in its default configuration:

- ``-I`` directories of its own headers (bundled CCCL, ``cupy/_core/include``) before and
  after the user's options, and ``-I<CUDA path>/include``;
- ``-ftz=true`` (float32 denormals flushed to zero);
- ``-arch=sm_XY`` for the device's compute capability (a cubin, not PTX);
- ``--device-as-default-execution-space``.

``cupy_options`` is that list without the include directories: they depend on where CuPy
and CUDA are installed, and oplib's sources include no header but their own
(``element.cuh``), so a source that needs one fails here instead of compiling only where
CUDA's headers happen to be installed. ``tests/test_cuda_kernels.py`` checks the list
against what CuPy really passes. CuPy itself cannot compile without a driver (it asks the
device for its architecture first), so the compile goes through NVRTC's own bindings
(``cuda-bindings`` with the ``nvidia-cuda-nvrtc`` wheel), which need none.
"""

from __future__ import annotations

from dataclasses import dataclass

from cuda.bindings import nvrtc

from ..kernels import KERNEL_DIR, NVRTC_OPTIONS, KernelSource, name_expressions

CUDA_SOURCES = sorted(path.name for path in KERNEL_DIR.glob("*.cu"))
# The targets oplib's kernels are checked for: every architecture CUDA 13 still compiles,
# from Turing to consumer Blackwell.
ARCHITECTURES = ("sm_75", "sm_80", "sm_86", "sm_89", "sm_90", "sm_120")


def cupy_options(arch: str) -> tuple[str, ...]:
    """NVRTC's options when CuPy compiles an oplib source for a GPU of ``arch`` (e.g. ``sm_86``),
    less CuPy's include directories (see the module docstring)."""
    return (*NVRTC_OPTIONS, "-ftz=true", f"-arch={arch}", "--device-as-default-execution-space")


class NvrtcError(RuntimeError):
    """NVRTC rejected a source, or a kernel instantiation has no lowered name."""


@dataclass(frozen=True)
class Compiled:
    lowered_names: dict[str, str]  # name expression -> mangled name in the cubin
    log: str  # NVRTC's warnings


def _check(result: tuple, call: str) -> tuple:
    error, *values = result
    if error != nvrtc.nvrtcResult.NVRTC_SUCCESS:
        raise NvrtcError(f"{call} failed: {nvrtc.nvrtcGetErrorString(error)[1].decode()}")
    return tuple(values)


def compile_source(source: KernelSource, arch: str, extra_options: tuple[str, ...] = ()) -> Compiled:
    """Compile ``source`` with ``cupy_options(arch)`` plus ``extra_options`` and resolve every
    name expression the launcher asks for; raises ``NvrtcError`` with NVRTC's log."""
    options = (*cupy_options(arch), *extra_options)
    names = name_expressions(source)
    # The program is named by the file's name only, as CuPy names it by a file in a temporary
    # folder: quoted includes resolve through -I, never through the source's own folder.
    (program,) = _check(nvrtc.nvrtcCreateProgram(source.text.encode(), source.path.name.encode(), 0, [], []),
                        "nvrtcCreateProgram")
    try:
        for name in names:
            _check(nvrtc.nvrtcAddNameExpression(program, name.encode()), "nvrtcAddNameExpression")
        encoded = [option.encode() for option in options]
        (status,) = nvrtc.nvrtcCompileProgram(program, len(encoded), encoded)
        (size,) = _check(nvrtc.nvrtcGetProgramLogSize(program), "nvrtcGetProgramLogSize")
        buffer = b" " * size
        _check(nvrtc.nvrtcGetProgramLog(program, buffer), "nvrtcGetProgramLog")
        log = buffer.rstrip(b"\0").decode()
        if status != nvrtc.nvrtcResult.NVRTC_SUCCESS:
            raise NvrtcError(f"NVRTC cannot compile {source.path.name} for {arch} with {' '.join(options)}:\n{log}")
        lowered = {}
        for name in names:
            error, mangled = nvrtc.nvrtcGetLoweredName(program, name.encode())
            if error != nvrtc.nvrtcResult.NVRTC_SUCCESS:
                raise NvrtcError(f"{source.path.name} for {arch}: no lowered name for {name} ({error.name})")
            lowered[name] = mangled.decode()
        return Compiled(lowered, log)
    finally:
        nvrtc.nvrtcDestroyProgram(program)
