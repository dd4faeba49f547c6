"""The CUDA sources compile as a GPU compiles them: nvcc builds every instantiation for every
target; NVRTC compiles every source as CuPy does on a GPU (same options, same name
expressions), within a register budget and without spills, into PTX that vectorises the
channels_last kernels; the resource table in bench/results/ is current."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from oplib.kernels import CTYPES, INCLUDE_DIR, NVRTC_OPTIONS, KernelSource, instantiations, load_source
from oplib.kernels import covering_instantiations
from oplib.kernels import name_expression, name_expressions
from oplib.kernels.involution import cuda as involution_cuda
from oplib.testing import nvrtc
from oplib.testing.nvrtc import ARCHITECTURES, CUDA_SOURCES


RESOURCE_TABLE = Path(__file__).resolve().parents[3] / "bench" / "results" / "cuda-resources.md"
# The unit tier compiles for the H100's architecture (the GPU make gpu-check ran on), the
# integration tier for every other target.
UNIT_ARCH = "sm_90"
ARCH_PARAMS = [arch if arch == UNIT_ARCH else pytest.param(arch, marks=pytest.mark.integration) for arch in ARCHITECTURES]
# (arch, covering): the unit tier compiles sm_90's covering instantiations (each kernel in every
# dtype and every template choice: 24 of involution.cu's 300, its compile 90 -> 11 s), the
# integration tier every instantiation for every target, sm_90's too.
SCOPE_PARAMS = [pytest.param(UNIT_ARCH, True, id=f"{UNIT_ARCH}-covering")] + [
    pytest.param(arch, False, id=arch, marks=pytest.mark.integration) for arch in ARCHITECTURES]
INTEGRATION_ARCH_PARAMS = [pytest.param(arch, marks=pytest.mark.integration) for arch in ARCHITECTURES]
# nvcc's compile of every instantiation, in the integration tier only: the unit tier's NVRTC
# compile for sm_90 (what CuPy runs) already proves the sources compile, and nvcc's -Werror
# pass over involution.cu took 83 s of the unit tier's 8 minutes. nvcc (-Werror, the host
# compiler's -Wall) for a target each side of each of the sources' architecture tests,
# __CUDA_ARCH__ >= 800, >= 900 and >= 1000 (the staged kernels' blocks an SM): every
# preprocessed path; the other targets differ in ptxas's code only, which NVRTC's compile with
# ptxas's report checks for every target (a minute or more of nvcc each for involution.cu).
# sm_75 and sm_120 lie on each side of all three (sm_90's code differs from sm_120's in launch
# bounds' numbers alone, and NVRTC compiles it in both tiers): sm_90's nvcc was 3-4 minutes of
# the integration tier's CPU time here, which went past its 60 minutes.
# nvcc embeds the PTX of each target (code=compute_XX) and stops there: ptxas, a third of its
# time (involution.cu for sm_75 44 -> 28 s, generated_mma.cu for sm_120 66 -> 48 s), runs for
# these targets in NVRTC's compile, whose log the NVRTC test requires free of warnings.
NVCC_ARCHITECTURES = ("sm_75", "sm_120")
NVCC_ARCH_PARAMS = [pytest.param(arch, marks=pytest.mark.integration) for arch in NVCC_ARCHITECTURES]


def _instantiations(source: KernelSource) -> str:
    """A translation unit that explicitly instantiates every kernel for every dtype and
    specialisation."""
    lines = [f'#include "{source.path}"']
    for kernel, dtype, specialisation in instantiations(source):
        params = source.kernels[kernel].instantiated_params(CTYPES[dtype])
        lines.append(f"template __global__ void {name_expression(kernel, dtype, specialisation)}({params});")
    return "\n".join(lines) + "\n"


def _nvcc(source: KernelSource, arch: str, tmp_path: Path, instantiate: bool = True) -> subprocess.CompletedProcess:
    """nvcc on a unit of ``source`` and, with ``instantiate``, every instantiation of its kernels:
    the host code and ``arch``'s PTX (NVRTC's compile runs ptxas for it)."""
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        pytest.skip("nvcc is not on the PATH (CUDA 13's nvcc is on the development machines and CI)")
    unit = tmp_path / "instantiate.cu"
    unit.write_text(_instantiations(source) if instantiate else f'#include "{source.path}"\n')
    return subprocess.run(
        [nvcc, f"-gencode=arch=compute_{arch[3:]},code=compute_{arch[3:]}", "-std=c++17", f"-I{INCLUDE_DIR}",
         "-Werror", "all-warnings", "-Xcompiler", "-Wall", "-c", str(unit), "-o", str(tmp_path / "instantiate.o")],
        capture_output=True, text=True, timeout=600,
    )


def test_nvcc_covers_every_architecture_test_of_the_sources():
    """NVCC_ARCHITECTURES holds a target on each side of every __CUDA_ARCH__ threshold the
    sources test: a new threshold (an sm_90-only path, say) asks for a target of its own."""
    tests = set()
    for path in [*(load_source(filename).path for filename in CUDA_SOURCES), *Path(INCLUDE_DIR).glob("*.cuh")]:
        text = Path(path).read_text()
        tests |= {int(v) for v in re.findall(r"__CUDA_ARCH__\s*>=\s*(\d+)", text)}
        assert not re.search(r"__CUDA_ARCH__\s*(<|<=|>|==)\s*\d", text), path
    assert tests, "no architecture test found: the scan reads nothing"
    for threshold in tests:
        sides = {int(arch[3:]) * 10 >= threshold for arch in NVCC_ARCHITECTURES}
        assert sides == {True, False}, threshold
    assert set(NVCC_ARCHITECTURES) <= set(ARCHITECTURES)


@pytest.mark.parametrize("arch", NVCC_ARCH_PARAMS)
@pytest.mark.parametrize("filename", CUDA_SOURCES)
def test_nvcc_compiles_every_instantiation(filename, arch, tmp_path):
    source = load_source(filename)
    assert source.kernels, f"no kernels found in {filename}"
    result = _nvcc(source, arch, tmp_path)
    assert result.returncode == 0, result.stderr


def _compiled(source: KernelSource, arch: str, covering: bool) -> nvrtc.Compiled:
    return nvrtc.compile_source(source, arch, names=nvrtc.unit_names(source) if covering else None)


def _compiled_instantiations(source: KernelSource, covering: bool) -> list:
    return covering_instantiations(source) if covering else instantiations(source)


def test_the_covering_instantiations_hold_every_dtype_and_template_choice():
    """Each kernel of every source in each storage type and each choice of each of its
    oplib-template lines, all of them instantiations a host may launch; fewer than all where a
    kernel has more than one line (the unit tier's compiles are that much shorter)."""
    for filename in CUDA_SOURCES:
        source = load_source(filename)
        every = set(instantiations(source))
        covering = covering_instantiations(source)
        assert set(covering) <= every and len(set(covering)) == len(covering), filename
        for kernel, specialisations in source.specialisations.items():
            mine = [(dtype, spec) for k, dtype, spec in covering if k == kernel]
            assert {dtype for dtype, _ in mine} == set(CTYPES), (filename, kernel)
            for position in range(len(specialisations[0])):
                assert {spec[position] for _, spec in mine} == {spec[position] for spec in specialisations}, (
                    filename, kernel, position)
    chunked = load_source(involution_cuda.SOURCE)
    assert len(covering_instantiations(chunked)) == 24 and len(instantiations(chunked)) == 300


@pytest.mark.parametrize("arch, covering", SCOPE_PARAMS)
@pytest.mark.parametrize("filename", CUDA_SOURCES)
def test_nvrtc_compiles_what_cupy_compiles(filename, arch, covering):
    """The compile a GPU user's first launch does: CuPy's NVRTC options, every name
    expression the launcher asks for resolved to a kernel, and no warning."""
    source = load_source(filename)
    compiled = _compiled(source, arch, covering)
    assert set(compiled.lowered_names) == set(nvrtc.unit_names(source) if covering else name_expressions(source))
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
    own = f"-I{INCLUDE_DIR}"
    includes = [o for o in options if o.startswith("-I") and o != own]
    assert [o for o in options if o not in includes] == list(nvrtc.cupy_options(arch))
    assert all(Path(o[2:]).is_absolute() for o in includes), includes


@pytest.mark.parametrize("arch, covering", SCOPE_PARAMS)
@pytest.mark.parametrize("filename", CUDA_SOURCES)
def test_kernels_stay_within_the_register_budget(filename, arch, covering):
    """No spills, and at most nvrtc.REGISTER_BUDGET registers a thread, so that two blocks of
    the launch size stay resident on an SM of every target (see oplib/testing/nvrtc.py); an
    instantiation the host takes only where the GPU's build keeps it in registers
    (``taken_without_spills``: involution_vectors.cu's WIDE forward) may spill, and on sm_90,
    the GPU the tables are measured on, keeps its stride-1 instantiations in registers."""
    source = load_source(filename)
    usage = nvrtc.resource_usage(source, arch, covering)
    assert len(usage) == len(_compiled_instantiations(source, covering))
    for u in usage:
        where = f"{u.kernel} {u.dtype} {arch}"
        checked = involution_cuda.taken_without_spills(filename, u.kernel, u.specialisation)
        if not checked or (arch == "sm_90" and u.specialisation[1] == "1"):
            assert u.spill_stores == 0 and u.spill_loads == 0, f"{where} spills: {u}"
        assert u.registers <= nvrtc.REGISTER_BUDGET, f"{where} uses {u.registers} registers"


def _written_resource_table() -> str:
    written = RESOURCE_TABLE.read_text()
    if f"NVRTC {nvrtc.nvrtc_version()}," not in written:
        pytest.skip(f"the table was written by another NVRTC than this one ({nvrtc.nvrtc_version()})")
    return written


@pytest.mark.parametrize("arch", INTEGRATION_ARCH_PARAMS)
def test_resource_table_rows_are_current(arch):
    """Each target's rows of bench/results/cuda-resources.md are what bench/cuda_resources.py
    writes from these sources, wherever the NVRTC that wrote it is the one installed here
    (every instantiation compiled: the integration tier's)."""
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


def _ptx_entries(ptx: str) -> dict[str, str]:
    """Each kernel's mangled name -> its PTX body."""
    entries = re.split(r"\n(?=\.weak \.entry |\.visible \.entry )", ptx)
    return {re.match(r"\.\w+ \.entry (\w+)", entry).group(1): entry for entry in entries if ".entry " in entry[:30]}


@pytest.mark.parametrize("covering", [True, pytest.param(False, marks=pytest.mark.integration)])
def test_specialised_kernels_vectorise_and_never_divide_in_64_bits(covering):
    """In the PTX a GPU runs: every channels_last instantiation loads and stores 16-byte vectors,
    and the 32-bit instantiations hold no 64-bit division or remainder (a 64-bit division is a
    long software routine; the 32-bit ones decode each thread's index once, outside the loops)."""
    source = load_source(involution_cuda.SOURCE)
    compiled = _compiled(source, UNIT_ARCH, covering)
    entries = _ptx_entries(compiled.ptx)
    checked = 0
    for kernel, dtype, specialisation in _compiled_instantiations(source, covering):
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
    assert checked == (3 * 4 if covering else 4 * 3 * 24)


@pytest.mark.parametrize("covering", [True, pytest.param(False, marks=pytest.mark.integration)],
                         ids=["covering", "all"])
def test_specialised_tile_divides_only_once_per_block(covering):
    """In the PTX a GPU runs: an involution_generated_tile instantiation that fixes its window
    divides by nothing of the window (its sizes are constants, its loops step through it); the
    only divisions left are by launch arguments, once per thread: the block's tile row and
    column (by the tiles a row) and the channels a group. The unit tier reads the covering
    instantiations (the compile the NVRTC test above already made), the integration tier all
    (the whole compile it shares with the prebuilt-cubin test of span_tile.cu there)."""
    source = load_source(involution_cuda.SPAN_TILE_SOURCE)
    compiled = _compiled(source, UNIT_ARCH, covering)
    entries = _ptx_entries(compiled.ptx)
    checked = set()
    for kernel, dtype, specialisation in _compiled_instantiations(source, covering):
        if kernel != "involution_generated_tile" or specialisation == involution_cuda.GENERATED_TILE_RUNTIME:
            continue
        body = entries[compiled.lowered_names[name_expression(kernel, dtype, specialisation)]]
        divisions = re.findall(r"\b(?:div|rem)\.[su]\d+\b", body)
        assert len(divisions) <= 3, (dtype, specialisation, divisions)
        checked.add((dtype, specialisation))
    specialised = {(dtype, spec) for kernel, dtype, spec in instantiations(source)
                   if kernel == "involution_generated_tile" and spec != involution_cuda.GENERATED_TILE_RUNTIME}
    assert len(specialised) == 6 * len(CTYPES)
    if not covering:
        assert checked == specialised
    else:  # every dtype, and every value of each template argument of the fixed windows
        assert {dtype for dtype, _ in checked} == {dtype for dtype, _ in specialised}
        for position in range(len(next(iter(specialised))[1])):
            assert {spec[position] for _, spec in checked} == {spec[position] for _, spec in specialised}, position


def test_a_compile_is_read_back_from_disk_only_for_the_same_inputs(tmp_path, monkeypatch):
    """The NVRTC disk cache: the same source, headers, target, options and names compile once
    (another process reads the file back); a changed source, header, target or option compiles
    again. (NVRTC itself is stood in for: the key is the point.)"""
    compiles = []

    def fake_compile(function, source, arch, options, names):
        compiles.append((source.text, arch, options))
        return nvrtc.Compiled({name: f"lowered{len(compiles)}" for name in names}, "log", "ptx", b"cubin")

    monkeypatch.setattr(nvrtc, "_CACHE_DIR", tmp_path)
    monkeypatch.setattr(nvrtc, "_in_child", fake_compile)
    compile_source = nvrtc.compile_source.__wrapped__  # past the per-process memo: as another process
    source = load_source(CUDA_SOURCES[0])
    first = compile_source(source, "sm_80")
    assert compile_source(source, "sm_80") == first and len(compiles) == 1
    assert compile_source(source, "sm_80", ("--ptxas-options=-v",)) == first and len(compiles) == 1  # always asked for
    assert compiles[0][2] == nvrtc.PTXAS_REPORT
    changed = KernelSource(source.path, source.text + "\n// changed\n")
    compile_source(changed, "sm_80")
    compile_source(source, "sm_86")
    compile_source(source, "sm_80", ("-lineinfo",))
    monkeypatch.setattr(nvrtc, "_header_texts", lambda: (("warp.cuh", "changed"),))
    compile_source(source, "sm_80")
    assert len(compiles) == 5
    assert len(list(tmp_path.glob("*.pickle"))) == 5 and not list(tmp_path.glob("*.tmp"))
