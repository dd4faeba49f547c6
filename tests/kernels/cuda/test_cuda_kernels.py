"""The CUDA kernels, proven without a GPU: nvcc compiles every instantiation for every
target; NVRTC compiles every source as CuPy does on a GPU (same options, same name
expressions), within a register budget and without spills; and the same source compiled for
the host runs the ops' real dispatch code on CPU tensors (under AddressSanitizer too). With a
GPU, the CuPy path is compared with the CPU path."""

from __future__ import annotations

import dataclasses
import itertools
import random
import re
import shutil
import subprocess
import sys
import textwrap
import types
from pathlib import Path

import pytest
import torch

import oplib.kernels
from oplib.kernels import cuda_launch
from oplib import registry
from oplib._memory_format import is_channels_last
from oplib._torch_private import FakeTensorMode, maybe_get_opdef
from oplib.kernels.involution import cuda as involution_cuda
from oplib.kernels import (
    CTYPES,
    CUDA_DISPATCH,
    KERNEL_DIR,
    NVRTC_OPTIONS,
    KernelSource,
    instantiations,
    load_source,
    name_expression,
    name_expressions,
)
from oplib.testing import assert_matches_reference, nvrtc
from oplib.testing.cuda_emulation import EmulatedLauncher, asan_environment, build
from oplib.testing.toolchain import require_host_compiler
from oplib.testing.nvrtc import ARCHITECTURES, CUDA_SOURCES

RESOURCE_TABLE = Path(__file__).resolve().parents[3] / "bench" / "results" / "cuda-resources.md"
_PLANTED_PATH = Path(__file__).parent / "cuda_sources" / "planted_overrun.cu"
PLANTED = KernelSource(_PLANTED_PATH, _PLANTED_PATH.read_text())

# spec name -> its CUDA dispatch (oplib.kernels.CudaDispatch): the function its CUDA kernel
# registration calls with a launcher last, the .cu file and the kernels it launches
# The unit tier compiles for the H100's architecture (the GPU make gpu-check ran on), the
# integration tier for every other target.
UNIT_ARCH = "sm_90"
ARCH_PARAMS = [arch if arch == UNIT_ARCH else pytest.param(arch, marks=pytest.mark.integration) for arch in ARCHITECTURES]
# nvcc's compile of every instantiation, every target, in the integration tier only: the unit
# tier's NVRTC compile for sm_90 (what CuPy runs) already proves the sources compile, and
# nvcc's -Werror pass over involution.cu took 83 s of the unit tier's 8 minutes.
NVCC_ARCH_PARAMS = [pytest.param(arch, marks=pytest.mark.integration) for arch in ARCHITECTURES]

LAUNCHES = {spec.name: CUDA_DISPATCH[spec.qualname] for spec in registry.all_specs() if spec.qualname in CUDA_DISPATCH}


def _instantiations(source: KernelSource) -> str:
    """A translation unit that explicitly instantiates every kernel for every dtype and
    specialisation."""
    lines = [f'#include "{source.path}"']
    for kernel, dtype, specialisation in instantiations(source):
        params = source.kernels[kernel].instantiated_params(CTYPES[dtype])
        lines.append(f"template __global__ void {name_expression(kernel, dtype, specialisation)}({params});")
    return "\n".join(lines) + "\n"


def _nvcc(source: KernelSource, arch: str, tmp_path: Path, instantiate: bool = True) -> subprocess.CompletedProcess:
    """nvcc on a unit of ``source`` and, with ``instantiate``, every instantiation of its kernels."""
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        pytest.skip("nvcc is not on the PATH (CUDA 13's nvcc is on the development machines and CI)")
    unit = tmp_path / "instantiate.cu"
    unit.write_text(_instantiations(source) if instantiate else f'#include "{source.path}"\n')
    return subprocess.run(
        [nvcc, f"-arch={arch}", "-std=c++17", f"-I{KERNEL_DIR}", "-Werror", "all-warnings", "-Xcompiler", "-Wall",
         "-c", str(unit), "-o", str(tmp_path / "instantiate.o")],
        capture_output=True, text=True, timeout=600,
    )


@pytest.mark.parametrize("arch", NVCC_ARCH_PARAMS)
@pytest.mark.parametrize("filename", CUDA_SOURCES)
def test_nvcc_compiles_every_instantiation(filename, arch, tmp_path):
    source = load_source(filename)
    assert source.kernels, f"no kernels found in {filename}"
    result = _nvcc(source, arch, tmp_path)
    assert result.returncode == 0, result.stderr


@pytest.mark.parametrize("arch", ARCH_PARAMS)
@pytest.mark.parametrize("filename", CUDA_SOURCES)
def test_nvrtc_compiles_what_cupy_compiles(filename, arch):
    """The compile a GPU user's first launch does: CuPy's NVRTC options, every name
    expression the launcher asks for resolved to a kernel, and no warning."""
    source = load_source(filename)
    compiled = nvrtc.compile_source(source, arch)
    assert set(compiled.lowered_names) == set(name_expressions(source))
    assert "warning" not in compiled.log, compiled.log
    # CuPy's -ftz=true flushes float32 subnormals in every .ftz instruction; the kernels keep
    # them, as torch does, by naming the IEEE instructions (element.cuh). Only a float-to-integer
    # conversion may flush: a subnormal converts to the integer 0 either way.
    flushing = set(re.findall(r"\b[a-z]+(?:\.[a-z0-9]+)*\.ftz(?:\.[a-z0-9]+)*", compiled.ptx))
    assert flushing <= {"cvt.rzi.ftz.u32.f32", "cvt.rzi.ftz.s32.f32"}, flushing


@pytest.mark.parametrize("arch", ARCH_PARAMS)
def test_cupy_hands_nvrtc_the_options_the_nvrtc_tests_use(arch, monkeypatch):
    """What CuPy's RawModule passes to NVRTC for the launcher's source, options and name
    expressions, recorded at the NVRTC call: it must be ``nvrtc.cupy_options(arch)`` plus only
    CuPy's and CUDA's include directories. CuPy cannot get this far without a driver (it asks
    the device for its architecture), so its per-device memoisation of that question is
    bypassed with the unmemoised function, and the recording stops before the real compile.
    This goes through CuPy internals on purpose: it fails when a CuPy release changes what
    it compiles with."""
    import cupy.cuda.compiler
    from cupy._core import core

    source = load_source(CUDA_SOURCES[0])
    recorded = []

    class Recorded(Exception):
        pass

    class RecordingProgram(cupy.cuda.compiler._NVRTCProgram):
        def compile(self, options=(), log_stream=None):
            if self.src == "":  # CuPy's probe of the compiler version: an empty file, really compiled
                return super().compile(options, log_stream)
            recorded.append((self.src, tuple(options), tuple(self.name_expressions)))
            raise Recorded

    monkeypatch.setenv("CUPY_CACHE_IN_MEMORY", "1")  # no kernel-cache lookup on disk
    monkeypatch.setattr(cupy.cuda.compiler, "_NVRTCProgram", RecordingProgram)
    monkeypatch.setattr(cupy.cuda.compiler, "_get_arch_for_options_for_nvrtc",
                        cupy.cuda.compiler._get_arch_for_options_for_nvrtc.__wrapped__)
    with pytest.raises(Recorded):
        # What RawModule(code=..., options=..., name_expressions=...).compile() calls.
        core.compile_with_cache(source.text, NVRTC_OPTIONS, arch=arch.removeprefix("sm_"),
                                prepend_cupy_headers=False, backend="nvrtc", name_expressions=name_expressions(source))
    (text, options, names), = recorded
    assert text == source.text
    assert sorted(names) == sorted(name_expressions(source))
    own = f"-I{KERNEL_DIR}"
    includes = [o for o in options if o.startswith("-I") and o != own]
    assert [o for o in options if o not in includes] == list(nvrtc.cupy_options(arch))
    assert all(Path(o[2:]).is_absolute() for o in includes), includes


@pytest.mark.parametrize("arch", ARCH_PARAMS)
@pytest.mark.parametrize("filename", CUDA_SOURCES)
def test_kernels_stay_within_the_register_budget(filename, arch):
    """No spills, and at most nvrtc.REGISTER_BUDGET registers a thread, so that two blocks of
    the launch size stay resident on an SM of every target (see oplib/testing/nvrtc.py)."""
    source = load_source(filename)
    usage = nvrtc.resource_usage(source, arch)
    assert len(usage) == len(name_expressions(source))
    for u in usage:
        where = f"{u.kernel} {u.dtype} {arch}"
        assert u.spill_stores == 0 and u.spill_loads == 0, f"{where} spills: {u}"
        assert u.registers <= nvrtc.REGISTER_BUDGET, f"{where} uses {u.registers} registers"


def _written_resource_table() -> str:
    written = RESOURCE_TABLE.read_text()
    if f"NVRTC {nvrtc.nvrtc_version()}," not in written:
        pytest.skip(f"the table was written by another NVRTC than this one ({nvrtc.nvrtc_version()})")
    return written


@pytest.mark.parametrize("arch", ARCH_PARAMS)
def test_resource_table_rows_are_current(arch):
    """Each target's rows of bench/results/cuda-resources.md are what bench/cuda_resources.py
    writes from these sources, wherever the NVRTC that wrote it is the one installed here."""
    written = _written_resource_table()
    usage = [u for filename in CUDA_SOURCES for u in nvrtc.resource_usage(load_source(filename), arch)]

    def rows(table: str) -> list[str]:
        return [line for line in table.splitlines() if f"| {arch} |" in line]

    assert rows(written) and rows(written) == rows(nvrtc.resource_table(usage)), "run: python bench/cuda_resources.py"


@pytest.mark.integration
def test_resource_table_is_current():
    """The whole table, its summary lines too (every target compiled: minutes)."""
    written = _written_resource_table()
    assert written == nvrtc.resource_table(nvrtc.all_resource_usage()), "run: python bench/cuda_resources.py"


def test_nvrtc_rejects_a_host_header_that_nvcc_accepts(tmp_path):
    """NVRTC has no host C++ headers: a kernel including <cstdio> must fail NVRTC's compile,
    as it would on a user's GPU, with NVRTC's own message, while nvcc accepts it; the nvcc
    test alone would let it through."""
    original = load_source(CUDA_SOURCES[0])
    path = tmp_path / original.path.name
    path.write_text("#include <cstdio>\n" + original.text)
    planted = KernelSource(path, path.read_text())
    with pytest.raises(nvrtc.NvrtcError, match=r'cannot open source file "cstdio"') as error:
        nvrtc.compile_source(planted, "sm_80")
    assert f"NVRTC cannot compile {path.name} for sm_80" in str(error.value)
    # the header is the point, not the kernels: no instantiation (a minute of nvcc here)
    result = _nvcc(planted, "sm_80", tmp_path, instantiate=False)
    assert result.returncode == 0, result.stderr


def _random_samples(spec, dtype, count, seed):
    """``count`` random samples, or none for a spec without ``random_sample``."""
    if spec.random_sample is None:
        return []
    rng = random.Random(seed)
    return [spec.random_sample(rng.randint, "cpu", dtype, False) for _ in range(count)]


@pytest.mark.parametrize("dtype", registry.FLOAT_DTYPES, ids=str)
@pytest.mark.parametrize("name", list(LAUNCHES))
def test_emulated_kernels_match_reference(name, dtype):
    """Registry samples plus random shapes, through the dispatch code the CUDA registration
    uses; only the kernels the dispatch declares are launched."""
    require_host_compiler()
    spec = registry.get(name)
    launcher = EmulatedLauncher()
    samples = [*spec.sample_inputs("cpu", dtype, False), *_random_samples(spec, dtype, 40, seed=hash(name) % 1000)]
    for sample in samples:
        out = LAUNCHES[name](*sample.args, launcher)
        assert_matches_reference(spec, sample, out, dtype)
    launched = {launch[0] for launch in launcher.launches}
    assert launched and launched <= set(LAUNCHES[name].kernels), launched


@pytest.mark.parametrize("name", list(LAUNCHES))
def test_grid_stride_loops_cover_tensors_larger_than_the_grid(monkeypatch, name):
    require_host_compiler()
    monkeypatch.setattr(cuda_launch, "MAX_BLOCKS", 2)
    spec = registry.get(name)
    launcher = EmulatedLauncher()
    samples = _random_samples(spec, torch.float64, 10, seed=7)
    if not samples:
        pytest.skip(f"{name}'s spec has no random_sample, whose shapes outgrow a two-block grid")
    for sample in samples:
        assert_matches_reference(spec, sample, LAUNCHES[name](*sample.args, launcher), torch.float64)
    assert launcher.launches and all(launch[2] <= 2 for launch in launcher.launches)


@pytest.fixture
def emulated_cpu_kernels():
    """Route every op with CUDA kernels through its CUDA dispatch on CPU tensors, with the
    host emulation's launcher in place of CuPy's."""
    require_host_compiler()
    launcher = EmulatedLauncher()
    opdefs = [maybe_get_opdef(qualname) for qualname in CUDA_DISPATCH]
    for opdef, dispatch in zip(opdefs, CUDA_DISPATCH.values()):
        opdef.register_kernel("cpu")(lambda *args, dispatch=dispatch: dispatch(*args, launcher))
    yield launcher
    # Back to each op's own CPU kernel: the function custom_op was given (what torch itself
    # falls back to when a device kernel is disabled). Without this the emulated kernels stay
    # registered for the rest of the session; they skip the argument checks and return
    # tensors over the emulation's buffers.
    for opdef in opdefs:
        opdef.register_kernel("cpu")(opdef._init_fn)


@pytest.mark.parametrize("name", list(LAUNCHES))
def test_gradcheck_through_emulated_kernels(name, emulated_cpu_kernels):
    spec = registry.get(name)
    # Three samples: the full Jacobians take thousands of kernel launches each.
    for sample in list(spec.sample_inputs("cpu", torch.float64, True))[1:4]:
        assert torch.autograd.gradcheck(spec.op, sample.args), sample.name
        assert torch.autograd.gradgradcheck(spec.op, sample.args, fast_mode=True), sample.name
    launched = {launch[0] for launch in emulated_cpu_kernels.launches}
    assert set(LAUNCHES[name].kernels) <= launched, launched


_ASAN_SCRIPT = textwrap.dedent(
    """
    import dataclasses, random, sys, torch
    from oplib import registry
    from oplib.kernels import CUDA_DISPATCH
    from oplib.testing import assert_matches_reference
    from oplib.testing.cuda_emulation import EmulatedLauncher
    launcher = EmulatedLauncher(sanitize=True)
    rng = random.Random(0)
    for spec in registry.all_specs():
        dispatch = CUDA_DISPATCH.get(spec.qualname)
        if dispatch is None:
            continue
        for dtype in registry.FLOAT_DTYPES:
            samples = list(spec.sample_inputs("cpu", dtype, False))
            if spec.random_sample is not None:
                samples += [spec.random_sample(rng.randint, "cpu", dtype, False) for _ in range(15)]
            for sample in samples:
                assert_matches_reference(spec, sample, dispatch(*sample.args, launcher), dtype)
    # The specialised kernels: each kernel size, stride and layout, 32- and 64-bit offsets.
    from oplib.kernels.involution import cuda as ops
    for limit in (ops.POLICY.index32_limit, 0):
        policy = dataclasses.replace(ops.POLICY, index32_limit=limit)
        for kernel in (3, 5, 7):
            for stride in (1, 2):
                for channels_last in (False, True):
                    for dtype in registry.FLOAT_DTYPES:
                        groups, per_group = rng.choice([1, 2]), rng.choice([1, 4, 8, 16, 32])
                        pad = [rng.randint(0, kernel - 1), rng.randint(0, kernel - 1)]
                        height = max(rng.randint(1, 11), kernel - 2 * pad[0])
                        width = max(rng.randint(1, 11), kernel - 2 * pad[1])
                        out_h, out_w = (height + 2 * pad[0] - kernel) // stride + 1, (width + 2 * pad[1] - kernel) // stride + 1
                        x = torch.randn(2, groups * per_group, height, width).to(dtype)
                        w = torch.randn(2, groups, kernel, kernel, out_h, out_w).to(dtype)
                        g = torch.randn(2, groups * per_group, out_h, out_w).to(dtype)
                        if channels_last:
                            x = x.contiguous(memory_format=torch.channels_last)
                            g = g.contiguous(memory_format=torch.channels_last)
                            w = w.permute(0, 4, 5, 1, 2, 3).contiguous().permute(0, 3, 4, 5, 1, 2)
                        window = ([stride, stride], pad, [1, 1])
                        ops.launch_involution(x, w, *window, launcher, policy)
                        ops.launch_involution_backward_input(g, w, [height, width], *window, launcher, policy)
                        ops.launch_involution_backward_weight(g, x, [kernel, kernel], *window, groups, launcher, policy)
    tiled = {launch[4] for launch in launcher.launches if launch[0].endswith("_tiled")}
    assert len(tiled) == 24, sorted(tiled)
    print("asan: clean,", len(launcher.launches), "launches")
    """
)


def _run_under_asan(script: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, env=asan_environment(), timeout=900
    )


def test_kernels_are_clean_under_address_sanitizer():
    require_host_compiler()
    for filename in CUDA_SOURCES:
        build(load_source(filename), sanitize=True)  # compile errors surface here, not as an ASan abort
    result = _run_under_asan(_ASAN_SCRIPT)
    assert result.returncode == 0, result.stderr[-5000:]
    assert "asan: clean" in result.stdout


def test_address_sanitizer_catches_a_planted_off_by_one():
    """Proof the harness would catch an illegal address: a kernel reading one element past
    the end of a torch tensor must abort with a heap-buffer-overflow report."""
    require_host_compiler()
    build(PLANTED, sanitize=True)
    script = textwrap.dedent(
        f"""
        import torch
        from pathlib import Path
        from oplib.kernels import KernelSource
        from oplib.testing.cuda_emulation import EmulatedLauncher
        path = Path({str(PLANTED.path)!r})
        source = KernelSource(path, path.read_text())
        x = torch.randn(1000)
        out = torch.empty(1000)
        EmulatedLauncher(sanitize=True).launch(source, "copy_next", torch.float32, 4, 256, (x, out, 1000))
        print("no error reported")
        """
    )
    result = _run_under_asan(script)
    assert result.returncode != 0
    assert "heap-buffer-overflow" in result.stderr
    assert "no error reported" not in result.stdout


def test_cuda_tensors_without_cupy_name_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "cupy", None)  # makes `import cupy` raise ImportError
    with pytest.raises(RuntimeError, match=r"pip install 'torch-oplib\[cuda12\]' or 'torch-oplib\[cuda13\]'"):
        oplib.kernels.CuPyLauncher()


class _FakeDriver:
    """cupy_backends' driver module, as far as CuPyLauncher uses it, recording launches."""

    def __init__(self):
        self.context = 7
        self.launches = []

    def ctxGetCurrent(self):
        return self.context

    def launchKernel(self, function, gx, gy, gz, bx, by, bz, shared, stream, params, extra):
        import ctypes

        count = len(self.expected_arguments)
        pointers = (ctypes.c_void_p * count).from_address(params)
        values = [ctypes.c_int64.from_address(pointer).value for pointer in pointers]
        self.launches.append((function, (gx, gy, gz), (bx, by, bz), shared, stream, values, extra, self.context))


class _FakeCupy:
    """The parts of cupy that CuPyLauncher uses: RawModule (recording what it compiles) and Device."""

    def __init__(self, driver: _FakeDriver):
        self.compiled: list[list[str]] = []
        self.devices_entered: list[int] = []
        fake = self

        class RawModule:
            def __init__(self, code, options, name_expressions):
                self.names = list(name_expressions)
                assert tuple(options) == NVRTC_OPTIONS and code == load_source("involution.cu").text

            def compile(self):
                fake.compiled.append(self.names)

            def get_function(self, name):
                return types.SimpleNamespace(ptr=1000 + self.names.index(name) + 100 * len(fake.compiled))

        class Device:
            def __init__(self, index):
                self.index = index

            def __enter__(self):
                fake.devices_entered.append(self.index)
                driver.context = 7  # the device's primary context becomes current

            def __exit__(self, *exc):
                return False

        self.RawModule = RawModule
        self.cuda = types.SimpleNamespace(Device=Device)


def test_cupy_launcher_compiles_each_instantiation_once_and_packs_its_arguments(monkeypatch):
    """The launch path without a GPU, against a recording driver: each instantiation compiles
    on its first launch only (as its own module), the arguments reach cuLaunchKernel as the
    8-byte values the kernel's parameters are (pointers and index_t), on PyTorch's current
    stream, and the device is entered only when the thread's current context is not its own."""
    driver = _FakeDriver()
    fake_cupy = _FakeCupy(driver)
    monkeypatch.setitem(sys.modules, "cupy", fake_cupy)
    monkeypatch.setitem(sys.modules, "cupy_backends.cuda.api", types.SimpleNamespace(driver=driver))
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device: types.SimpleNamespace(cuda_stream=4242))
    launcher = oplib.kernels.CuPyLauncher()
    x, w = torch.randn(1, 16, 9, 9), torch.randn(1, 1, 7, 7, 9, 9)
    out = torch.empty(1, 16, 9, 9)
    source = load_source("involution.cu")
    args = (x, w, out, 81, 16, 9, 9, 1, 9, 9, 3, 3, 16)
    driver.expected_arguments = args
    specialisation = ("int", "7", "1", "false")
    for _ in range(3):
        launcher.launch(source, "involution_forward_tiled", torch.float32, 1, 256, args, specialisation)
    assert fake_cupy.compiled == [["involution_forward_tiled<float, int, 7, 1, false>"]]
    assert fake_cupy.devices_entered == [None]  # the compile; the launches found the context current
    (function, grid, block, shared, stream, values, extra, context), *rest = driver.launches
    assert len(rest) == 2 and all(launch == driver.launches[0] for launch in rest)
    assert (grid, block, shared, stream, extra) == ((1, 1, 1), (256, 1, 1), 0, 4242, 0)
    assert values == [x.data_ptr(), w.data_ptr(), out.data_ptr(), 81, 16, 9, 9, 1, 9, 9, 3, 3, 16]
    # Another thread's context (another device current): the launch enters the tensors' device.
    driver.context = 99
    launcher.launch(source, "involution_forward_tiled", torch.float32, 1, 256, args, specialisation)
    assert fake_cupy.devices_entered == [None, None] and driver.launches[-1][-1] == 7
    # Another dtype is another instantiation: compiled on its first launch.
    args = (x.double(), w.double(), out.double(), *args[3:])
    driver.expected_arguments = args
    launcher.launch(source, "involution_forward_tiled", torch.float64, 1, 256, args, specialisation)
    assert fake_cupy.compiled[-1] == ["involution_forward_tiled<double, int, 7, 1, false>"]


@pytest.mark.needs_cuda
@pytest.mark.parametrize("dtype", registry.FLOAT_DTYPES, ids=str)
@pytest.mark.parametrize("name", list(LAUNCHES))
def test_cupy_kernels_match_the_cpu_path(name, dtype):
    spec = registry.get(name)
    for sample in [*spec.sample_inputs("cuda", dtype, False), *_random_samples(spec, dtype, 20, seed=3)]:
        args = [a.cuda() if isinstance(a, torch.Tensor) else a for a in sample.args]
        cpu_args = [a.cpu() if isinstance(a, torch.Tensor) else a for a in sample.args]
        atol, rtol = spec.tolerance(dtype)
        torch.testing.assert_close(spec.op(*args).cpu(), spec.op(*cpu_args), atol=atol, rtol=rtol, msg=sample.name)


# ---------------------------------------------------------------------------------------
# The specialised involution kernels (involution_*_tiled in involution.cu)
# ---------------------------------------------------------------------------------------

INVOLUTION_SPECS = [registry.get(name) for name in ("involution", "involution_backward_input", "involution_backward_weight")]


def _tiled_case(rng: random.Random, kernel: int, stride: int, dtype: torch.dtype, channels_last: bool):
    """Random involution operands of one specialised geometry: (input, weight, grad_output,
    stride, padding, groups), in the layout a channels_last model hands the kernels or in
    contiguous NCHW."""
    groups = rng.choice([1, 2, 3])
    per_group = rng.choice([1, 2, 3, 4, 8, 16, 24, 32])
    n, height, width = rng.choice([1, 2]), rng.randint(1, 12), rng.randint(1, 12)
    pad = [rng.randint(0, kernel - 1), rng.randint(0, kernel - 1)]
    height, width = max(height, kernel - 2 * pad[0]), max(width, kernel - 2 * pad[1])
    out_h, out_w = (height + 2 * pad[0] - kernel) // stride + 1, (width + 2 * pad[1] - kernel) // stride + 1
    channels = groups * per_group
    x = torch.randn(n, channels, height, width, dtype=torch.float64).to(dtype)
    w = torch.randn(n, groups, kernel, kernel, out_h, out_w, dtype=torch.float64).to(dtype)
    g = torch.randn(n, channels, out_h, out_w, dtype=torch.float64).to(dtype)
    if channels_last:
        x, g = x.contiguous(memory_format=torch.channels_last), g.contiguous(memory_format=torch.channels_last)
        w = w.permute(0, 4, 5, 1, 2, 3).contiguous().permute(0, 3, 4, 5, 1, 2)
    return x, w, g, [stride, stride], pad, groups


def _three_ops(x, w, g, stride, pad, groups, launcher, policy=None):
    """The three involution ops through their CUDA dispatch code, with ``launcher`` and ``policy``
    (default: the source's)."""
    kernel, (height, width) = w.shape[2], x.shape[2:]
    return (
        involution_cuda.launch_involution(x, w, stride, pad, [1, 1], launcher, policy),
        involution_cuda.launch_involution_backward_input(g, w, [height, width], stride, pad, [1, 1], launcher, policy),
        involution_cuda.launch_involution_backward_weight(g, x, [kernel, kernel], stride, pad, [1, 1], groups, launcher,
                                                          policy),
    )


def _check_tiled_against_reference(launcher, cases: int, seed: int, policy=None) -> set:
    """``cases`` random specialised geometries per (kernel, stride, layout), every dtype,
    against the float64 reference; returns the specialisations launched."""
    rng = random.Random(seed)
    for kernel, stride, channels_last in itertools.product((3, 5, 7), (1, 2), (False, True)):
        for case in range(cases):
            dtype = registry.FLOAT_DTYPES[case % len(registry.FLOAT_DTYPES)]
            x, w, g, stride_pair, pad, groups = _tiled_case(rng, kernel, stride, dtype, channels_last)
            outs = _three_ops(x, w, g, stride_pair, pad, groups, launcher, policy)
            args = ((x, w, stride_pair, pad, [1, 1]),
                    (g, w, list(x.shape[2:]), stride_pair, pad, [1, 1]),
                    (g, x, [kernel, kernel], stride_pair, pad, [1, 1], groups))
            for spec, sample_args, out in zip(INVOLUTION_SPECS, args, outs):
                sample = registry.SampleInput(sample_args, f"k{kernel}-s{stride}-cl{channels_last}-{dtype}-{case}")
                assert_matches_reference(spec, sample, out, dtype)
    return {(launch[0], launch[4]) for launch in launcher.launches}


def test_every_specialised_kernel_matches_the_reference():
    """Every kernel size, stride and layout the specialised kernels cover, all four dtypes,
    random sizes, groups, channels per group and padding, against the float64 reference; every
    32-bit instantiation of the three kernels is launched."""
    require_host_compiler()
    launched = _check_tiled_against_reference(EmulatedLauncher(), cases=8, seed=11)
    for kernel in ("involution_forward_tiled", "involution_backward_input_tiled", "involution_backward_weight_tiled"):
        for specialisation in load_source("involution.cu").specialisations[kernel]:
            if specialisation[0] == "int":
                assert (kernel, specialisation) in launched, (kernel, specialisation)


def test_the_64_bit_instantiations_match_the_reference():
    """With the 32-bit limit at zero every launch takes the long long instantiations, which
    tensors past 2^31 elements get on a GPU."""
    require_host_compiler()
    policy = dataclasses.replace(involution_cuda.POLICY, index32_limit=0)
    launched = _check_tiled_against_reference(EmulatedLauncher(), cases=2, seed=12, policy=policy)
    assert launched and all(specialisation[0] == "long long" for _, specialisation in launched if specialisation)


def test_huge_tensors_take_the_64_bit_instantiations():
    """Meta tensors of 2^31 elements and more (no memory) choose long long offsets; one
    element fewer than the limit still chooses int."""
    policy = involution_cuda.POLICY
    limit = policy.index32_limit
    small = torch.empty(limit, device="meta")
    big = torch.empty(limit + 1, device="meta")
    huge = torch.empty(2**31 + 5, device="meta")
    window = ((7, 7), (2, 2), (1, 1))
    assert policy.specialisation(*window, False, small)[0] == "int"
    assert policy.specialisation(*window, True, small, big)[0] == "long long"
    assert policy.specialisation(*window, False, huge)[0] == "long long"
    # And the limit leaves a whole grid of room below 2^31, so a grid-stride index never wraps.
    assert limit + oplib.kernels.MAX_BLOCKS * oplib.kernels.BLOCK_SIZE <= 2**31 - 1


def test_the_launch_policy_is_read_from_the_source(tmp_path):
    """The policy's facts come from involution.cu's own lines (its oplib-template lists and
    constexpr constants, and element.cuh's VECTOR_BYTES): a source that says otherwise gives
    another policy, and the tiled kernels then serve only what it lists."""
    source = load_source("involution.cu")
    policy = involution_cuda.LaunchPolicy.from_source(source)
    assert (policy.kernel_sizes, policy.strides) == ((3, 5, 7), (1, 2))
    assert (policy.max_channels, policy.max_channels_8_byte, policy.vector_bytes) == (16, 8, 16)
    assert policy.lanes(torch.float16) == 8 and policy.lanes(torch.float64) == 2
    changed = source.text.replace("// oplib-template: KERNEL = 3 | 5 | 7", "// oplib-template: KERNEL = 3 | 7")
    changed = changed.replace("constexpr int TILE_MAX_CHANNELS = 16;", "constexpr int TILE_MAX_CHANNELS = 12;")
    assert changed.count("KERNEL = 3 | 7") == 1 and changed.count("TILE_MAX_CHANNELS = 12;") == 1, "update the test"
    other = involution_cuda.LaunchPolicy.from_source(KernelSource(tmp_path / "involution.cu", changed))
    assert other.kernel_sizes == (3, 7) and other.max_channels == 12
    tensor = torch.empty(8)
    assert other.specialisation((5, 5), (1, 1), (1, 1), False, tensor) is None
    assert policy.specialisation((5, 5), (1, 1), (1, 1), False, tensor) == ("int", "5", "1", "false")
    assert dataclasses.replace(other, target_threads=1).channels_per_thread(24, 1, torch.float32, 1) == 12


def test_specialised_kernels_give_the_generic_kernels_bits():
    """Each sum adds its terms in the generic kernel's order, so the specialised kernels'
    results are bit-identical to the generic ones, in every dtype and both layouts."""
    require_host_compiler()
    rng = random.Random(13)
    tiled, generic = EmulatedLauncher(), EmulatedLauncher()
    for case in range(36):
        kernel, stride, channels_last = rng.choice((3, 5, 7)), rng.choice((1, 2)), case % 2 == 1
        dtype = registry.FLOAT_DTYPES[case % len(registry.FLOAT_DTYPES)]
        x, w, g, stride_pair, pad, groups = _tiled_case(rng, kernel, stride, dtype, channels_last)
        fast = _three_ops(x, w, g, stride_pair, pad, groups, tiled)
        generic_only = dataclasses.replace(involution_cuda.POLICY, kernel_sizes=())
        slow = _three_ops(x, w, g, stride_pair, pad, groups, generic, generic_only)
        for a, b in zip(fast, slow):
            assert torch.equal(a, b), (kernel, stride, channels_last, dtype)
    assert all(launch[0].endswith("_tiled") for launch in tiled.launches)
    assert not any(launch[0].endswith("_tiled") for launch in generic.launches)


class _RecordingLauncher(EmulatedLauncher):
    """The emulation, also keeping each launch's tensor arguments."""

    def __init__(self):
        super().__init__()
        self.tensors: list[list[torch.Tensor]] = []

    def launch(self, source, kernel, dtype, grid, block, args, specialisation=()):
        self.tensors.append([a for a in args if isinstance(a, torch.Tensor)])
        super().launch(source, kernel, dtype, grid, block, args, specialisation)


def test_channels_last_operands_are_read_in_place_and_results_keep_the_layout():
    """A channels_last model's operands (activations channels_last, the weight pixel-major, as a
    channels_last convolution's output views into it) go to the channels_last kernels as they
    are, no copy, and every result comes back in the same layout, as the fakes say."""
    require_host_compiler()
    launcher = _RecordingLauncher()
    x = torch.randn(2, 32, 14, 14).contiguous(memory_format=torch.channels_last)
    # RedNet's weight: a channels_last convolution's (N, G*K*K, Ho, Wo) output, viewed.
    w = torch.randn(2, 2 * 49, 7, 7).contiguous(memory_format=torch.channels_last).view(2, 2, 7, 7, 7, 7)
    g = torch.randn(2, 32, 7, 7).contiguous(memory_format=torch.channels_last)
    out, grad_input, grad_weight = _three_ops(x, w, g, [2, 2], [3, 3], 2, launcher)
    assert [launch[4][3] for launch in launcher.launches] == ["true"] * 3
    reads = [{t.data_ptr() for t in tensors} for tensors in launcher.tensors]
    assert {x.data_ptr(), w.data_ptr()} <= reads[0]
    assert {g.data_ptr(), w.data_ptr()} <= reads[1]
    assert {g.data_ptr(), x.data_ptr()} <= reads[2]
    assert out.is_contiguous(memory_format=torch.channels_last) and not out.is_contiguous()
    assert grad_input.is_contiguous(memory_format=torch.channels_last) and not grad_input.is_contiguous()
    assert grad_weight.permute(0, 4, 5, 1, 2, 3).is_contiguous() and grad_weight.stride() == w.stride()
    for op, args, result in (
        (torch.ops.oplib.involution, (x, w, [2, 2], [3, 3], [1, 1]), out),
        (torch.ops.oplib.involution_backward_input, (g, w, [14, 14], [2, 2], [3, 3], [1, 1]), grad_input),
        (torch.ops.oplib.involution_backward_weight, (g, x, [7, 7], [2, 2], [3, 3], [1, 1], 2), grad_weight),
    ):
        cpu = op(*args)
        with FakeTensorMode() as mode:
            fake = op(*(mode.from_tensor(a) if isinstance(a, torch.Tensor) else a for a in args))
        assert cpu.stride() == fake.stride() == result.stride(), op
        torch.testing.assert_close(result, cpu, atol=1e-4, rtol=1e-4)


def test_misaligned_channels_last_takes_the_contiguous_kernels():
    """The channels_last kernels move 16-byte vectors; an input whose data does not start on a
    16-byte boundary (a view at an odd offset into a buffer) goes to the contiguous layout's
    kernels instead, and the result is still right and still channels_last."""
    require_host_compiler()
    launcher = EmulatedLauncher()
    buffer = torch.randn(32 * 9 * 9 + 1)
    x = buffer[1:].view(1, 9, 9, 32).permute(0, 3, 1, 2)  # channels_last, one float past an aligned address
    assert is_channels_last(x) and x.data_ptr() % 16 != 0
    w = torch.randn(1, 2, 7, 7, 9, 9)
    out = involution_cuda.launch_involution(x, w, [1, 1], [3, 3], [1, 1], launcher)
    assert launcher.launches[-1][4][3] == "false"
    assert out.is_contiguous(memory_format=torch.channels_last)
    torch.testing.assert_close(out, torch.ops.oplib.involution(x.contiguous(), w, [1, 1], [3, 3], [1, 1]),
                               atol=1e-4, rtol=1e-4)


# The planted bug: one tap too many at the bottom and right edges of the image (the end of the
# valid tap range, computed once per thread, off by one), in every specialised kernel.
_TAP_BOUND = "*end = room >= KERNEL ? KERNEL : (room > 0 ? (int)room : 0);"
_TAP_BOUND_OFF_BY_ONE = "*end = room >= KERNEL ? KERNEL : (room > 0 ? (int)room + 1 : 0);"


def _planted_tap_bound(tmp_path: Path) -> KernelSource:
    original = load_source("involution.cu")
    assert original.text.count(_TAP_BOUND) == 1, "the planted bug no longer applies: update _TAP_BOUND"
    path = tmp_path / "involution.cu"
    path.write_text(original.text.replace(_TAP_BOUND, _TAP_BOUND_OFF_BY_ONE))
    return KernelSource(path, path.read_text())


def test_a_planted_off_by_one_tap_bound_fails_the_reference_check(tmp_path, monkeypatch):
    require_host_compiler()
    monkeypatch.setattr(involution_cuda, "load_source", lambda filename: _planted_tap_bound(tmp_path))
    with pytest.raises(AssertionError, match="Tensor-likes are not close"):
        _check_tiled_against_reference(EmulatedLauncher(), cases=2, seed=15)


def test_address_sanitizer_catches_a_planted_off_by_one_tap_bound(tmp_path):
    """The same planted bug, where the extra tap reads past the end of the tensor: the last
    pixel of the last sample's last row reads one element beyond the input."""
    require_host_compiler()
    planted = _planted_tap_bound(tmp_path)
    build(planted, sanitize=True)
    script = textwrap.dedent(
        f"""
        import torch
        from pathlib import Path
        from oplib.kernels import KernelSource
        from oplib.kernels.involution import cuda as ops
        from oplib.testing.cuda_emulation import EmulatedLauncher
        path = Path({str(planted.path)!r})
        ops.load_source = lambda filename: KernelSource(path, path.read_text())
        x, w = torch.randn(1, 4, 8, 8), torch.randn(1, 1, 3, 3, 8, 8)
        ops.launch_involution(x, w, [1, 1], [1, 1], [1, 1], EmulatedLauncher(sanitize=True))
        print("no error reported")
        """
    )
    result = _run_under_asan(script)
    assert result.returncode != 0
    assert "heap-buffer-overflow" in result.stderr
    assert "no error reported" not in result.stdout


# involution_generated.cu's forward with its column bound off by one: the tap one column past
# a row's end is taken (the next row's first value, or past the tensor at the last one).
_GENERATED_COLUMN_BOUND = "if (x < 0 || x >= width) continue;"
_GENERATED_COLUMN_BOUND_OFF_BY_ONE = "if (x < 0 || x > width) continue;"


def _planted_generated_column_bound(tmp_path: Path) -> KernelSource:
    original = load_source("involution_generated.cu")
    assert original.text.count(_GENERATED_COLUMN_BOUND) == 1, "the planted bug no longer applies: update it"
    path = tmp_path / "involution_generated.cu"
    path.write_text(original.text.replace(_GENERATED_COLUMN_BOUND, _GENERATED_COLUMN_BOUND_OFF_BY_ONE))
    return KernelSource(path, path.read_text())


def test_a_planted_off_by_one_in_the_generated_kernels_fails_the_reference_check(tmp_path, monkeypatch):
    require_host_compiler()
    planted = _planted_generated_column_bound(tmp_path)
    monkeypatch.setattr(involution_cuda, "load_source", lambda filename: planted)
    spec = registry.get("involution_generated")
    launch = LAUNCHES["involution_generated"]
    with pytest.raises(AssertionError, match="Tensor-likes are not close"):
        for sample in spec.sample_inputs("cpu", torch.float64, False):
            assert_matches_reference(spec, sample, launch(*sample.args, EmulatedLauncher()), torch.float64)


def test_address_sanitizer_catches_a_planted_off_by_one_in_the_generated_kernels(tmp_path):
    """The same planted bug: the last pixel of the last sample's last row reads one element
    beyond the input."""
    require_host_compiler()
    planted = _planted_generated_column_bound(tmp_path)
    build(planted, sanitize=True)
    script = textwrap.dedent(
        f"""
        import torch
        from pathlib import Path
        from oplib.kernels import KernelSource
        from oplib.kernels.involution import cuda as ops
        from oplib.testing.cuda_emulation import EmulatedLauncher
        path = Path({str(planted.path)!r})
        ops.load_source = lambda filename: KernelSource(path, path.read_text())
        x, f, s = torch.randn(1, 4, 8, 8), torch.randn(1, 2, 8, 8), torch.randn(9, 2)
        ops.launch_involution_generated(x, f, s, None, [3, 3], [1, 1], [1, 1], [1, 1], EmulatedLauncher(sanitize=True))
        print("no error reported")
        """
    )
    result = _run_under_asan(script)
    assert result.returncode != 0
    assert "heap-buffer-overflow" in result.stderr
    assert "no error reported" not in result.stdout


def _ptx_entries(ptx: str) -> dict[str, str]:
    """Each kernel's mangled name -> its PTX body."""
    entries = re.split(r"\n(?=\.weak \.entry |\.visible \.entry )", ptx)
    return {re.match(r"\.\w+ \.entry (\w+)", entry).group(1): entry for entry in entries if ".entry " in entry[:30]}


def test_specialised_kernels_vectorise_and_never_divide_in_64_bits():
    """In the PTX a GPU runs: every channels_last instantiation loads and stores 16-byte vectors,
    and the 32-bit instantiations hold no 64-bit division or remainder (a 64-bit division is a
    long software routine; the 32-bit ones decode each thread's index once, outside the loops)."""
    source = load_source("involution.cu")
    compiled = nvrtc.compile_source(source, UNIT_ARCH)
    entries = _ptx_entries(compiled.ptx)
    checked = 0
    for kernel, dtype, specialisation in instantiations(source):
        if not specialisation:
            continue
        body = entries[compiled.lowered_names[name_expression(kernel, dtype, specialisation)]]
        if specialisation[3] == "true":
            assert re.search(r"ld\.global(\.nc)?(\.v[24])\.", body), (kernel, dtype, specialisation)
            if not kernel.startswith("involution_backward_weight"):
                assert re.search(r"st\.global\.v[24]\.", body), (kernel, dtype, specialisation)
        if specialisation[0] == "int":
            assert not re.search(r"\b(div|rem)\.[su]64\b", body), (kernel, dtype, specialisation)
        checked += 1
    assert checked == 4 * 3 * 24
