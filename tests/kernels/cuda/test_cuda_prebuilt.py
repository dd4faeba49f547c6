"""Kernels compiled ahead of time (oplib.kernels.cuda_prebuilt, oplib.testing.cuda_prebuild):
the manifest's checks, each failing on its own; CuPy's launcher taking the cubin only when all
of them pass (a stand-in CuPy with the real one's shape), NVRTC otherwise; and a real build."""

from __future__ import annotations

import json
import sys
import types
import warnings

import pytest
import torch

from oplib.kernels import CuPyLauncher, KernelSource, cuda_prebuilt, instantiations, load_source, name_expression
from oplib.kernels.involution import cuda as involution_cuda

ARCH = "sm_90"


def _write_folder(directory, source: KernelSource, arch: str = ARCH):
    """A prebuilt folder for ``source`` with made-up cubin bytes and lowered names (what the
    checks read; the driver never sees these)."""
    directory.mkdir(exist_ok=True)
    cubin = directory / cuda_prebuilt.cubin_name(source)
    cubin.write_bytes(b"\x7fELF not a real cubin")
    lowered = {name_expression(*i): f"_mangled_{n}" for n, i in enumerate(instantiations(source))}
    modules = {source.sha256: {"source": source.path.name, "cubin": cubin.name,
                               "cubin_sha256": cuda_prebuilt.file_sha256(cubin), "lowered_names": lowered}}
    cuda_prebuilt.write_manifest(directory, arch, "13.5", ["-arch=" + arch], modules)
    return lowered


@pytest.fixture
def generated():
    return load_source(involution_cuda.GENERATED_SOURCE)


def _edit_manifest(directory, edit):
    path = directory / cuda_prebuilt.MANIFEST
    manifest = json.loads(path.read_text())
    edit(manifest)
    path.write_text(json.dumps(manifest))


def test_a_matching_folder_gives_the_cubin_and_every_lowered_name(tmp_path, generated):
    lowered = _write_folder(tmp_path, generated)
    found = cuda_prebuilt.lookup(generated, ARCH, tmp_path)
    assert found.cubin == tmp_path / cuda_prebuilt.cubin_name(generated) and found.lowered_names == lowered
    manifest = json.loads((tmp_path / cuda_prebuilt.MANIFEST).read_text())
    # the include folder is written as a mark: a folder built in one checkout serves another
    assert manifest["launcher_options"] == ["--std=c++17", "-I<oplib/kernels/csrc/cuda>"]


@pytest.mark.parametrize("case, reason", [
    ("edited source", "no cubin of involution_generated.cu with this source's hash"),
    ("other architecture", "built for sm_90, the GPU is sm_80"),
    ("cubin changed after the build", "not the file the manifest hashed"),
    ("cubin missing", "not the file the manifest hashed"),
    ("instantiation missing", "1 instantiations of involution_generated.cu missing"),
    ("launcher options changed", "built with options"),
    ("format changed", "manifest format 0"),
    ("no manifest", "no manifest.json"),
])  # fmt: skip
def test_each_check_alone_refuses_the_cubin(tmp_path, generated, monkeypatch, case, reason):
    """A stale cubin must never load: each check fails on its own, saying which."""
    _write_folder(tmp_path, generated)
    source, arch = generated, ARCH
    cubin = tmp_path / cuda_prebuilt.cubin_name(generated)
    if case == "edited source":
        source = KernelSource(generated.path, generated.text + "\n// one more line\n")
    elif case == "other architecture":
        arch = "sm_80"
    elif case == "cubin changed after the build":
        cubin.write_bytes(cubin.read_bytes() + b"\0")
    elif case == "cubin missing":
        cubin.unlink()
    elif case == "instantiation missing":
        _edit_manifest(tmp_path, lambda m: m["modules"][generated.sha256]["lowered_names"].popitem())
    elif case == "launcher options changed":
        monkeypatch.setattr(cuda_prebuilt, "NVRTC_OPTIONS", ("--std=c++20",))
    elif case == "format changed":
        _edit_manifest(tmp_path, lambda m: m.update(format=0))
    elif case == "no manifest":
        (tmp_path / cuda_prebuilt.MANIFEST).unlink()
    found = cuda_prebuilt.lookup(source, arch, tmp_path)
    assert found.cubin is None and reason in found.reason


def test_without_the_variable_nothing_is_looked_up(generated, monkeypatch):
    monkeypatch.delenv(cuda_prebuilt.ENVIRONMENT, raising=False)
    assert cuda_prebuilt.lookup(generated, ARCH).reason == "OPLIB_CUDA_PREBUILT is not set"
    assert cuda_prebuilt.load_functions(object(), generated, 0) is None  # CuPy not even touched


class _StandInCupy:
    """The parts of cupy that the launcher's load uses, recording them: RawModule from code
    (compiled) or from a path (a cubin), get_function(name).kernel.ptr, and Device with its
    compute_capability. ``refuse``: loading a cubin raises, as the driver does for one it rejects."""

    def __init__(self, compute_capability: str = "90", refuse: bool = False):
        self.modules: list[tuple[str, object]] = []  # ("code", name expressions) or ("path", path)
        self.functions: list[str] = []
        fake = self

        class RawModule:
            def __init__(self, *, code=None, path=None, options=(), name_expressions=None):
                fake.modules.append(("code", tuple(name_expressions)) if path is None else ("path", path))
                self.path = path

            def compile(self):
                pass

            def get_function(self, name):
                if self.path is not None and refuse:
                    raise RuntimeError("CUDA_ERROR_INVALID_IMAGE")
                fake.functions.append(name)
                return types.SimpleNamespace(kernel=types.SimpleNamespace(ptr=hash(name)))

        class Device:
            def __init__(self, index):
                self.compute_capability = compute_capability

            def __enter__(self):
                return self

            def __exit__(self, *exc):
                return False

        self.RawModule = RawModule
        self.cuda = types.SimpleNamespace(Device=Device)


def _launcher(monkeypatch, cupy: _StandInCupy) -> CuPyLauncher:
    driver = types.SimpleNamespace(ctxGetCurrent=lambda: 7)
    monkeypatch.setitem(sys.modules, "cupy", cupy)
    monkeypatch.setitem(sys.modules, "cupy_backends.cuda.api", types.SimpleNamespace(driver=driver))
    return CuPyLauncher()


def _first_use(launcher: CuPyLauncher, source: KernelSource) -> int:
    """The handle of one instantiation, loaded on first use as a launch loads it."""
    return launcher.function(source, "involution_generated_forward", torch.float32, (), 0)


def test_the_launcher_loads_every_instantiation_from_a_matching_cubin(tmp_path, generated, monkeypatch):
    lowered = _write_folder(tmp_path, generated)
    monkeypatch.setenv(cuda_prebuilt.ENVIRONMENT, str(tmp_path))
    cupy = _StandInCupy()
    launcher = _launcher(monkeypatch, cupy)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        handle = _first_use(launcher, generated)
    assert cupy.modules == [("path", str(tmp_path / cuda_prebuilt.cubin_name(generated)))]  # nothing compiled
    assert handle == hash(lowered["involution_generated_forward<float>"])
    assert sorted(cupy.functions) == sorted(lowered.values())  # every instantiation, by its lowered name
    # the other instantiations came with the first: no second load
    launcher.function(generated, "involution_generated_backward_input", torch.bfloat16, (), 0)
    assert len(cupy.modules) == 1


@pytest.mark.parametrize("case", ["stale source", "other GPU", "driver refuses the cubin"])
def test_the_launcher_compiles_with_nvrtc_unless_everything_matches(tmp_path, generated, monkeypatch, case):
    _write_folder(tmp_path, generated)
    monkeypatch.setenv(cuda_prebuilt.ENVIRONMENT, str(tmp_path))
    cupy = _StandInCupy(compute_capability="80" if case == "other GPU" else "90", refuse=case == "driver refuses the cubin")
    launcher = _launcher(monkeypatch, cupy)
    source = KernelSource(generated.path, generated.text + "\n// edited after the build\n") if case == "stale source" else generated
    with pytest.warns(UserWarning, match="compiling involution_generated.cu with NVRTC"):
        _first_use(launcher, source)
    assert cupy.modules[-1] == ("code", ("involution_generated_forward<float>",))
    assert cupy.functions[-1] == "involution_generated_forward<float>"


def test_without_the_variable_the_launcher_compiles_as_before(generated, monkeypatch):
    monkeypatch.delenv(cuda_prebuilt.ENVIRONMENT, raising=False)
    cupy = _StandInCupy()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _first_use(_launcher(monkeypatch, cupy), generated)
    assert cupy.modules == [("code", ("involution_generated_forward<float>",))]


def test_the_stand_in_has_the_real_cupys_shape():
    """The load from a cubin uses RawModule(path=...) (lazy: no GPU needed to make one) and
    Device.compute_capability; the stand-in above must not offer what CuPy lacks."""
    cupy = pytest.importorskip("cupy")
    module = cupy.RawModule(path="/nonexistent/involution.cubin")
    assert callable(module.get_function)
    assert "compute_capability" in dir(cupy.cuda.Device)


# involution_generated.cu: generic kernels only; span_tile.cu: a kernel whose instantiations
# are listed pairs of template arguments (its specialised windows and the runtime one), a whole
# compile of 16 s here: in the integration tier, beside test_cuda_compile.py's whole compiles.
@pytest.mark.parametrize("filename", [involution_cuda.GENERATED_SOURCE,
                                      pytest.param(involution_cuda.SPAN_TILE_SOURCE, marks=pytest.mark.integration)])
def test_a_real_build_holds_a_cubin_with_every_lowered_name(tmp_path, filename):
    """NVRTC (no GPU) compiles one source for sm_90 into a folder whose lookup passes: an ELF
    cubin holding every instantiation's mangled name."""
    pytest.importorskip("cuda.bindings.nvrtc")
    from oplib.testing import cuda_prebuild

    source = load_source(filename)
    manifest = json.loads(cuda_prebuild.build(tmp_path, ARCH, [source]).read_text())
    assert manifest["arch"] == ARCH and manifest["nvrtc"].startswith("13.")
    assert "-arch=sm_90" in manifest["nvrtc_options"] and "-ftz=true" in manifest["nvrtc_options"]
    found = cuda_prebuilt.lookup(source, ARCH, tmp_path)
    assert found.cubin is not None, found.reason
    cubin = found.cubin.read_bytes()
    assert cubin[:4] == b"\x7fELF"
    assert set(found.lowered_names) == {name_expression(*i) for i in instantiations(source)}
    assert all(mangled.encode() in cubin for mangled in found.lowered_names.values())
