"""The CUDA kernels, proven without a GPU: nvcc compiles every instantiation for every
target; NVRTC compiles every source as CuPy does on a GPU (same options, same name
expressions), within a register budget and without spills; and the same source compiled for
the host runs the ops' real dispatch code on CPU tensors (under AddressSanitizer too). With a
GPU, the CuPy path is compared with the CPU path."""

from __future__ import annotations

import random
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

import oplib.kernels
from oplib import registry
from oplib.kernels import CTYPES, CUDA_DISPATCH, KERNEL_DIR, NVRTC_OPTIONS, KernelSource, load_source, name_expressions
from oplib.testing import assert_matches_reference, nvrtc
from oplib.testing.cuda_emulation import EmulatedLauncher, asan_environment, build
from oplib.testing.toolchain import require_host_compiler
from oplib.testing.nvrtc import ARCHITECTURES, CUDA_SOURCES

RESOURCE_TABLE = Path(__file__).resolve().parents[1] / "bench" / "results" / "cuda-resources.md"
_PLANTED_PATH = Path(__file__).parent / "cuda_sources" / "planted_overrun.cu"
PLANTED = KernelSource(_PLANTED_PATH, _PLANTED_PATH.read_text())

# spec name -> its CUDA dispatch (oplib.kernels.CudaDispatch): the function its CUDA kernel
# registration calls with a launcher last, the .cu file and the kernels it launches
# The unit tier compiles for the H100's architecture (the GPU make gpu-check ran on), the
# integration tier for every other target.
UNIT_ARCH = "sm_90"
ARCH_PARAMS = [arch if arch == UNIT_ARCH else pytest.param(arch, marks=pytest.mark.integration) for arch in ARCHITECTURES]

LAUNCHES = {spec.name: CUDA_DISPATCH[spec.qualname] for spec in registry.all_specs() if spec.qualname in CUDA_DISPATCH}


def _instantiations(source: KernelSource) -> str:
    """A translation unit that explicitly instantiates every kernel for every dtype."""
    lines = [f'#include "{source.path}"']
    for signature in source.kernels.values():
        for ctype in CTYPES.values():
            lines.append(
                f"template __global__ void {signature.name}<{ctype}>({signature.instantiated_params(ctype)});"
            )
    return "\n".join(lines) + "\n"


def _nvcc(source: KernelSource, arch: str, tmp_path: Path) -> subprocess.CompletedProcess:
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        pytest.skip("nvcc is not on the PATH (CUDA 13's nvcc is on the development machines and CI)")
    unit = tmp_path / "instantiate.cu"
    unit.write_text(_instantiations(source))
    return subprocess.run(
        [nvcc, f"-arch={arch}", "-std=c++17", f"-I{KERNEL_DIR}", "-Werror", "all-warnings", "-Xcompiler", "-Wall",
         "-c", str(unit), "-o", str(tmp_path / "instantiate.o")],
        capture_output=True, text=True, timeout=600,
    )


@pytest.mark.parametrize("arch", ARCH_PARAMS)
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


def test_resource_table_is_current():
    """bench/results/cuda-resources.md is what bench/cuda_resources.py writes from these
    sources, wherever the NVRTC that wrote it is the one installed here."""
    written = RESOURCE_TABLE.read_text()
    if f"NVRTC {nvrtc.nvrtc_version()}," not in written:
        pytest.skip(f"the table was written by another NVRTC than this one ({nvrtc.nvrtc_version()})")
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
    result = _nvcc(planted, "sm_80", tmp_path)
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
    monkeypatch.setattr(oplib.kernels, "MAX_BLOCKS", 2)
    spec = registry.get(name)
    launcher = EmulatedLauncher()
    samples = _random_samples(spec, torch.float64, 10, seed=7)
    if not samples:
        pytest.skip(f"{name}'s spec has no random_sample, whose shapes outgrow a two-block grid")
    for sample in samples:
        assert_matches_reference(spec, sample, LAUNCHES[name](*sample.args, launcher), torch.float64)
    assert launcher.launches and all(grid <= 2 for _, _, grid, _ in launcher.launches)


@pytest.fixture
def emulated_cpu_kernels():
    """Route every op with CUDA kernels through its CUDA dispatch on CPU tensors, with the
    host emulation's launcher in place of CuPy's."""
    require_host_compiler()
    launcher = EmulatedLauncher()
    opdefs = [torch._library.custom_ops._maybe_get_opdef(qualname) for qualname in CUDA_DISPATCH]
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
    import random, sys, torch
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
