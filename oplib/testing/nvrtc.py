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
CUDA's headers happen to be installed. ``tests/kernels/cuda/test_cuda_compile.py`` checks the list
against what CuPy really passes. CuPy itself cannot compile without a driver (it asks the
device for its architecture first), so the compile goes through NVRTC's own bindings
(``cuda-bindings`` with the ``nvidia-cuda-nvrtc`` wheel), which need none.

``--ptxas-options=-v`` makes ptxas report each kernel's registers, spills and shared memory;
``resource_usage`` reads them, ``resident_blocks`` turns registers into occupancy, and
``resource_table`` is what ``bench/cuda_resources.py`` writes to
``bench/results/cuda-resources.md``. Every compile asks for that report (it changes no code), so
that one compile of a source for a target serves the compile checks, the resource reports and
the prebuilt cubins; and every compile is kept on disk by its inputs (``OPLIB_NVRTC_CACHE``,
else ``oplib-nvrtc`` in the temporary folder), so that the test processes of one run, and later
runs, compile each (source, target) once: a source with every instantiation takes NVRTC a
minute or more.
"""

from __future__ import annotations

import atexit
import concurrent.futures
import functools
import hashlib
import importlib.metadata
import multiprocessing
import os
import pickle
import re
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import torch

from ..kernels.cuda_launch import BLOCK_SIZE
from ..kernels.cuda_source import (
    KERNEL_DIR,
    INCLUDE_DIR,
    NVRTC_OPTIONS,
    KernelSource,
    cuda_sources,
    covering_instantiations,
    instantiations,
    load_source,
    name_expression,
    name_expressions,
)

CUDA_SOURCES = cuda_sources()
# The targets oplib's kernels are checked for: every architecture CUDA 13 still compiles, from
# Turing to Blackwell, datacenter (sm_100: its own blocks an SM in generated_mma.cu's launch
# bounds) and consumer (sm_120). Blackwell's other targets (sm_103, sm_110, sm_121) are left out.
ARCHITECTURES = ("sm_75", "sm_80", "sm_86", "sm_89", "sm_90", "sm_100", "sm_120")


def cupy_options(arch: str) -> tuple[str, ...]:
    """NVRTC's options when CuPy compiles an oplib source for a GPU of ``arch`` (e.g. ``sm_86``),
    less CuPy's include directories (see the module docstring)."""
    return (*NVRTC_OPTIONS, "-ftz=true", f"-arch={arch}", "--device-as-default-execution-space")


class NvrtcError(RuntimeError):
    """NVRTC rejected a source, or a kernel instantiation has no lowered name."""


@dataclass(frozen=True)
class Compiled:
    lowered_names: dict[str, str]  # name expression -> mangled name in the cubin
    log: str  # NVRTC's warnings, and ptxas's report when asked for
    ptx: str  # the PTX the cubin was assembled from
    cubin: bytes  # what a GPU of the arch loads (oplib.testing.cuda_prebuild keeps it)


@functools.cache
def _child() -> concurrent.futures.ProcessPoolExecutor:
    executor = concurrent.futures.ProcessPoolExecutor(max_workers=1, mp_context=multiprocessing.get_context("spawn"))
    atexit.register(executor.shutdown)  # before interpreter teardown, or its callback fails then
    return executor


def _in_child(function, *args):
    """``function(*args)`` in a spawned child process. Once NVRTC's library is loaded into a
    process, checkpoints that torch.save writes there no longer load ("record size ... does
    not match expected size"; seen with torch 2.13 and nvidia-cuda-nvrtc 13.5 in a full test
    run), so NVRTC never runs in the caller's process."""
    return _child().submit(function, *args).result()


def _check(result: tuple, call: str) -> tuple:
    from cuda.bindings import nvrtc

    error, *values = result
    if error != nvrtc.nvrtcResult.NVRTC_SUCCESS:
        raise NvrtcError(f"{call} failed: {nvrtc.nvrtcGetErrorString(error)[1].decode()}")
    return tuple(values)


# ptxas's report of each kernel's resources, asked for by every compile (see the module docstring).
PTXAS_REPORT = ("--ptxas-options=-v",)
_CACHE_DIR = Path(os.environ.get("OPLIB_NVRTC_CACHE", Path(tempfile.gettempdir()) / "oplib-nvrtc"))


@functools.cache
def compile_source(source: KernelSource, arch: str, extra_options: tuple[str, ...] = (),
                   names: Optional[tuple[str, ...]] = None) -> Compiled:
    """Compile ``source`` with ``cupy_options(arch)``, ``PTXAS_REPORT`` and ``extra_options`` and
    resolve the name expressions ``names`` (default: every one the launcher may ask for); raises
    ``NvrtcError`` with NVRTC's log. Runs in a child process (``_in_child``); a compile of the
    same inputs (the source's text, the shared headers', the options, the names, NVRTC's
    version) is read back from the disk cache instead."""
    options = (*PTXAS_REPORT, *(o for o in extra_options if o not in PTXAS_REPORT))
    names = name_expressions(source) if names is None else tuple(names)
    key = hashlib.sha256(repr((source.text, _header_texts(), cupy_options(arch), options, names,
                               _compiler_packages())).encode()).hexdigest()[:24]
    cached = _CACHE_DIR / f"{source.path.stem}-{arch}-{key}.pickle"
    if cached.exists():
        return pickle.loads(cached.read_bytes())
    compiled = _in_child(_compile_source, source, arch, options, names)
    _CACHE_DIR.mkdir(parents=True, exist_ok=True)
    partial = cached.with_suffix(f".{os.getpid()}.tmp")  # then renamed: a reader never sees half a file
    partial.write_bytes(pickle.dumps(compiled))
    partial.replace(cached)
    return compiled


@functools.cache
def _compiler_packages() -> tuple[tuple[str, str], ...]:
    """(name, version) of the installed packages that compile (NVRTC's wheel, its bindings): read
    from their metadata, where NVRTC's own version would take a child process to ask."""
    return tuple(sorted((d.metadata["Name"].lower(), d.version) for d in importlib.metadata.distributions()
                        if d.metadata["Name"].lower().startswith(("cuda-bindings", "nvidia-cuda-nvrtc"))))


@functools.cache
def _header_texts() -> tuple[tuple[str, str], ...]:
    """(name, text) of each shared header a source may include."""
    return tuple((header.name, header.read_text()) for header in sorted(INCLUDE_DIR.glob("*.cuh")))


def _compile_source(source: KernelSource, arch: str, extra_options: tuple[str, ...],
                    names: tuple[str, ...]) -> Compiled:
    from cuda.bindings import nvrtc

    options = (*cupy_options(arch), *extra_options)
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
        (size,) = _check(nvrtc.nvrtcGetPTXSize(program), "nvrtcGetPTXSize")
        buffer = b" " * size
        _check(nvrtc.nvrtcGetPTX(program, buffer), "nvrtcGetPTX")
        (size,) = _check(nvrtc.nvrtcGetCUBINSize(program), "nvrtcGetCUBINSize")
        cubin = b" " * size
        _check(nvrtc.nvrtcGetCUBIN(program, cubin), "nvrtcGetCUBIN")
        return Compiled(lowered, log, buffer.rstrip(b"\0").decode(), cubin)
    finally:
        nvrtc.nvrtcDestroyProgram(program)


@functools.cache
def nvrtc_version() -> str:
    return _in_child(_nvrtc_version)


def _nvrtc_version() -> str:
    from cuda.bindings import nvrtc

    major, minor = _check(nvrtc.nvrtcVersion(), "nvrtcVersion")
    return f"{major}.{minor}"


@dataclass(frozen=True)
class KernelResources:
    kernel: str
    dtype: torch.dtype
    specialisation: tuple[str, ...]  # template arguments after scalar_t; () for a generic kernel
    arch: str
    registers: int
    spill_stores: int  # bytes
    spill_loads: int  # bytes
    shared_memory: int  # bytes, static


_ENTRY = re.compile(r"Compiling entry function '(\w+)' for '\w+'(.*?)(?=Compiling entry function|\Z)", re.DOTALL)


def _number(pattern: str, text: str, default: int | None = None) -> int:
    match = re.search(pattern, text)
    if match is None:
        if default is None:
            raise NvrtcError(f"ptxas reported no {pattern!r} in:\n{text}")
        return default
    return int(match.group(1))


def unit_names(source: KernelSource) -> tuple[str, ...]:
    """The name expressions of ``source``'s covering instantiations (``covering_instantiations``):
    what the unit tier compiles, each kernel in every dtype and every template choice; the
    integration tier compiles every instantiation."""
    return tuple(name_expression(*instantiation) for instantiation in covering_instantiations(source))


@functools.cache
def resource_usage(source: KernelSource, arch: str, covering: bool = False) -> tuple[KernelResources, ...]:
    """Registers, spills and shared memory of every instantiation (kernel, dtype,
    specialisation) of ``source`` on ``arch``, as ptxas reports them when CuPy's options
    compile it; with ``covering``, of the covering instantiations only (compiled alone)."""
    compiled = compile_source(source, arch, names=unit_names(source) if covering else None)
    reported = {match.group(1): match.group(2) for match in _ENTRY.finditer(compiled.log)}
    usage = []
    for kernel, dtype, specialisation in covering_instantiations(source) if covering else instantiations(source):
        name = name_expression(kernel, dtype, specialisation)
        report = reported.get(compiled.lowered_names[name])
        if report is None:
            raise NvrtcError(f"ptxas reported nothing for {name} on {arch}")
        usage.append(KernelResources(
            kernel, dtype, specialisation, arch,
            registers=_number(r"Used (\d+) registers", report),
            spill_stores=_number(r"(\d+) bytes spill stores", report),
            spill_loads=_number(r"(\d+) bytes spill loads", report),
            shared_memory=_number(r"(\d+) bytes smem", report, default=0),  # absent when 0
        ))
    return tuple(usage)


# Per SM: resident threads, resident blocks (CUDA Programming Guide, "Technical
# Specifications per Compute Capability"); every one of these has 64K 32-bit registers.
_SM_LIMITS = {
    "sm_75": (1024, 16),
    "sm_80": (2048, 32),
    "sm_86": (1536, 16),
    "sm_89": (1536, 24),
    "sm_90": (2048, 32),
    "sm_100": (2048, 32),
    "sm_120": (1536, 24),
}
_REGISTERS_PER_SM = 65536
_SUB_PARTITIONS = 4  # the register file is split among 4 schedulers, each allocating to whole warps
_WARP_ALLOCATION = 256  # registers are given to a warp in multiples of 256


def resident_blocks(registers: int, arch: str, block_size: int = BLOCK_SIZE) -> int:
    """How many blocks of ``block_size`` threads using ``registers`` each fit on one SM of
    ``arch`` (the occupancy calculator's rule; no shared memory, as oplib's kernels use none)."""
    max_threads, max_blocks = _SM_LIMITS[arch]
    warps_per_block = -(-block_size // 32)
    per_warp = -(-registers * 32 // _WARP_ALLOCATION) * _WARP_ALLOCATION
    warps_by_registers = _SUB_PARTITIONS * (_REGISTERS_PER_SM // _SUB_PARTITIONS // per_warp)
    return min(max_blocks, max_threads // block_size, warps_by_registers // warps_per_block)


# The kernels are memory-bound (one multiply-add per two loads): an SM hides load latency only
# by running other warps meanwhile. Above this register count some target fits just one block
# of BLOCK_SIZE threads per SM (8 warps, 1/8 of what an sm_80/sm_90 SM holds), too few to keep
# its memory busy; at or below it, two or more fit on every target. Whether fewer registers
# (three or four blocks) would pay is for a GPU to measure; the resource table shows each
# kernel's blocks per SM.
MIN_RESIDENT_BLOCKS = 2
REGISTER_BUDGET = max(
    r for r in range(1, 256) if all(resident_blocks(r, arch) >= MIN_RESIDENT_BLOCKS for arch in ARCHITECTURES)
)  # 128 for 256-thread blocks


def all_resource_usage() -> list[KernelResources]:
    """``resource_usage`` of every source on every target, by instantiation, then target."""
    usage = []
    for filename in CUDA_SOURCES:
        per_arch = [resource_usage(load_source(filename), arch) for arch in ARCHITECTURES]
        usage += [rows[i] for i in range(len(per_arch[0])) for rows in per_arch]
    return usage


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def resource_table(usage: list[KernelResources]) -> str:
    """The markdown of ``bench/results/cuda-resources.md``."""
    spills = sum(u.spill_stores + u.spill_loads for u in usage)
    options = " ".join(cupy_options("sm_XY")).replace(str(KERNEL_DIR), "oplib/kernels")  # the same in every checkout
    lines = [
        "# CUDA kernels: registers, spills and shared memory",
        "",
        f"Written by `python bench/cuda_resources.py` from NVRTC {nvrtc_version()}, with the options CuPy compiles",
        f"with on a GPU (`{options}`; its include directories left out) plus `--ptxas-options=-v`.",
        f"Blocks per SM: resident blocks of {BLOCK_SIZE} threads (the launch size) that the registers",
        "allow; occupancy: their threads over the SM's maximum.",
        "",
        f"- register budget: {REGISTER_BUDGET} per thread, the most at which {MIN_RESIDENT_BLOCKS} blocks stay resident on",
        "  an SM of every target; `tests/kernels/cuda/test_cuda_compile.py` requires every kernel within it, with no spills",
        "  but in instantiations the host takes only where the GPU's build uses no local memory (involution_vectors.cu's",
        "  WIDE forward, `oplib.kernels.involution.cuda.vectors_wide`): their spills are summed in its rows below",
        f"- most registers: {max(u.registers for u in usage)}; spilled bytes in all: {spills}; "
        f"most static shared memory: {max(u.shared_memory for u in usage)} B",
        "",
        "One row per kernel, dtype and target: a specialised kernel's row gives the most any of its",
        "instantiations uses (the template arguments after the dtype of that one), and their spills summed.",
        "",
        "| kernel | dtype | arch | instantiations | registers | most at | spill stores (B) | spill loads (B) "
        "| shared memory (B) | blocks per SM | occupancy |",
        "|---|---|---|---:|---:|---|---:|---:|---:|---:|---:|",
    ]
    rows: dict[tuple, list[KernelResources]] = {}
    for u in usage:
        rows.setdefault((u.kernel, u.dtype, u.arch), []).append(u)
    for (kernel, dtype, arch), group in rows.items():
        worst = max(group, key=lambda u: u.registers)
        blocks = resident_blocks(worst.registers, arch)
        occupancy = blocks * BLOCK_SIZE / _SM_LIMITS[arch][0]
        at = ", ".join(worst.specialisation) or "-"
        lines.append(
            f"| {kernel} | {_dtype_name(dtype)} | {arch} | {len(group)} | {worst.registers} | {at} "
            f"| {sum(u.spill_stores for u in group)} | {sum(u.spill_loads for u in group)} "
            f"| {max(u.shared_memory for u in group)} | {blocks} | {occupancy:.0%} |"
        )
    return "\n".join(lines) + "\n"
