"""The native CPU kernels' build (``oplib.kernels.native``) and their entry points' guards: a
build that speaks, survives a SIGKILL and builds once for concurrent first calls; builds with
clang, for AVX2 only and for baseline x86-64, each checked against the float64 reference; an
aarch64 compile; the entry points' TORCH_CHECKs; torch's own error for another device type."""

from __future__ import annotations

import os
import platform
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch

from oplib import _torch_private
from oplib.kernels import native
from oplib.testing.native import force_native, require_native_build

ROOT = Path(__file__).resolve().parents[3]
IS_X86_64 = platform.machine() in ("x86_64", "AMD64")
INVOLUTION_OPS = ("involution", "involution_backward_input", "involution_backward_weight", "involution_generated",
                  "involution_generated_backward_input")


# ---- Messages -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "log, expected",
    [
        ("$ c++ -c a.cpp\nIn file included from a.cpp:1:\na.h:3:10: fatal error: omp.h: No such file or directory\n"
         "compilation terminated.\nb.cpp:9:1: error: later", "a.h:3:10: fatal error: omp.h: No such file or directory"),
        ("a.cpp:4:5: warning: unused\na.cpp:7:3: error: use of undeclared identifier '__builtin_shuffle'\n1 error generated.",
         "a.cpp:7:3: error: use of undeclared identifier '__builtin_shuffle'"),
        ("/usr/bin/ld: cannot find -ltorch_python: No such file or directory\ncollect2: error: ld returned 1 exit status",
         "collect2: error: ld returned 1 exit status"),
        ("broken compiler\n", "broken compiler"),
    ],
)
def test_the_first_error_line_is_the_compilers_own(log, expected):
    assert native.first_error_line(log) == expected


def test_the_longest_units_compile_first():
    """The parallel compiles start with the longest units (LONGEST_UNITS, by bench/build.py's
    measured times), so that they end together; every name listed is a unit."""
    names = [unit.name for unit in native.units()]
    assert names[: len(native.LONGEST_UNITS)] == list(native.LONGEST_UNITS)
    assert names[len(native.LONGEST_UNITS):] == sorted(names[len(native.LONGEST_UNITS):])


def test_only_gcc_gets_the_low_memory_parameters_and_only_for_the_bindings(tmp_path):
    """GCC's --param names are GCC's: clang (which defines __GNUC__ too) and a missing compiler
    get none, and the other units none either. The bindings unit (no compute loop) compiles at
    -O1 with any compiler, the kernel units at the build's -O3."""
    bindings = [native.BINDINGS_OPTIMIZATION]
    if native._missing_tool() is None and native._is_gcc(native.compiler_command()):
        assert native.Target(native.compiler_command()).unit_flags("bindings.cpp") == [
            *bindings, *native.GCC_LOW_MEMORY_FLAGS]
    assert native.Target(native.compiler_command()).unit_flags("forward.cpp") == []
    assert native.Target(str(tmp_path / "no-such-c++")).unit_flags("bindings.cpp") == bindings
    if shutil.which("clang++"):
        assert not native._is_gcc("clang++") and native.Target("clang++").unit_flags("bindings.cpp") == bindings


def test_the_build_reports_each_unit_on_a_terminal(tmp_path, capsys):
    """A line per compiled unit (with progress=True, what build() passes on a terminal), the
    count and the elapsed time in it; none without."""
    if native._missing_tool() is not None:
        pytest.skip(native._missing_tool())
    sources = []
    for name in ("first.cpp", "second.cpp"):
        (tmp_path / name).write_text(f"int {name.split('.')[0]}_unit() {{ return 1; }}\n")
        sources.append(tmp_path / name)
    target = native.Target(native.compiler_command())
    for progress in (True, False):
        workdir = tmp_path / f"work-{progress}"
        workdir.mkdir()
        native._compile(target, "oplib_cpu_progress", sources, workdir, progress=progress)
        lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith("oplib:   [")]
        if progress:
            assert sorted(line.split("] ")[1].split(" (")[0] for line in lines) == ["compiled first.cpp", "compiled second.cpp"]
            assert {line.split("]")[0] for line in lines} == {"oplib:   [1/2", "oplib:   [2/2"}
        else:
            assert lines == []


def test_a_unit_whose_object_is_kept_is_not_compiled_again(tmp_path, capsys):
    """Objects kept by what they are compiled from: a tree that differs from a built one in one
    unit compiles that unit and reuses the other's object (the planted-bug builds under
    AddressSanitizer, 8 whole builds of 2-3 minutes each before); a changed header, flag or
    module name of the bindings unit compiles what depends on it; the module still runs."""
    if native._missing_tool() is not None:
        pytest.skip(native._missing_tool())
    target = native.Target(native.compiler_command())
    objects = tmp_path / "objects"

    def build(tree: str, texts: dict[str, str], name: str = "oplib_cpu_kept") -> dict[str, str]:
        source_dir = tmp_path / tree
        source_dir.mkdir()
        for filename, text in texts.items():
            (source_dir / filename).write_text(text)
        workdir = tmp_path / f"work-{tree}"
        workdir.mkdir()
        library = native._compile(target, name, native.units(source_dir), workdir, progress=True, objects_dir=objects)
        assert library.exists()
        lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith("oplib:   [")]
        return dict(reversed(line.split("] ")[1].split(" (")[0].split(" ")) for line in lines)

    header = "inline int base() { return 1; }\n"
    first = '#include "base.h"\nint first_unit() { return base(); }\n'
    second = '#include "base.h"\nint second_unit() { return base() + 1; }\n'
    bindings = "#define STR(x) #x\n#define XSTR(x) STR(x)\nint module_unit() { return sizeof(XSTR(TORCH_EXTENSION_NAME)); }\n"
    texts = {"base.h": header, "first.cpp": first, "second.cpp": second, native.MODULE_UNIT: bindings}
    assert build("a", texts) == {"first.cpp": "compiled", "second.cpp": "compiled", native.MODULE_UNIT: "compiled"}
    assert build("b", {**texts, "second.cpp": second.replace("+ 1", "+ 2")}) == {
        "first.cpp": "kept", "second.cpp": "compiled", native.MODULE_UNIT: "kept"}
    # a header counts for the units that include it, also through another header
    texts["first.cpp"] = '#include "outer.h"\nint first_unit() { return outer(); }\n'
    texts["outer.h"] = '#pragma once\n#include "base.h"\ninline int outer() { return base(); }\n'
    assert build("c", texts)["first.cpp"] == "compiled"
    assert build("c2", {**texts, "base.h": header.replace("1", "3")}) == {
        "first.cpp": "compiled", "second.cpp": "compiled", native.MODULE_UNIT: "kept"}
    assert native.local_includes(tmp_path / "c2" / "first.cpp") == {tmp_path / "c2" / "outer.h", tmp_path / "c2" / "base.h"}
    assert build("d", texts, name="oplib_cpu_other") == {
        "first.cpp": "kept", "second.cpp": "kept", native.MODULE_UNIT: "compiled"}
    assert build("e", texts) == {"first.cpp": "kept", "second.cpp": "kept", native.MODULE_UNIT: "kept"}
    assert not [path for path in objects.iterdir() if not path.name.endswith(".o")]  # no partial file left


@pytest.mark.parametrize("terminal", [True, False])
def test_build_shows_progress_only_on_a_terminal(terminal, tmp_path, monkeypatch):
    seen = []

    def compile_stub(target, name, sources, workdir, progress=False, objects_dir=None):
        seen.append(progress)
        (workdir / "build.log").write_text("stopped here")
        raise native.NativeBuildError("stopped here", workdir / "build.log")

    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    monkeypatch.setattr(native, "_compile", compile_stub)
    monkeypatch.setattr(sys.stderr, "isatty", lambda: terminal)
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "a.cpp").write_text("")
    with pytest.raises(native.NativeBuildError):
        native.build(tmp_path / "src")
    assert seen == [terminal]


def test_max_jobs_caps_the_parallel_compiles(monkeypatch):
    monkeypatch.setenv(native.JOBS_ENV, "1")
    assert native._jobs(9) == 1
    monkeypatch.delenv(native.JOBS_ENV)
    assert 1 <= native._jobs(9) <= 9


def test_a_different_target_is_a_different_module():
    compiler = native.compiler_command()
    names = {native.module_name(native.SOURCE_DIR, native.Target(compiler, march)) for march in ("native", "x86-64")}
    names.add(native.module_name(native.SOURCE_DIR, native.Target(compiler, "native", sanitize=True)))
    assert len(names) == 3


# ---- The entry points' guards -----------------------------------------------------------


def _module(monkeypatch):
    force_native(monkeypatch)
    return native.involution()


def test_the_entry_points_refuse_a_tensor_on_another_device(monkeypatch):
    module = _module(monkeypatch)
    x, weight = torch.randn(2, 4, 5, 5, device="meta"), torch.randn(2, 1, 3, 3, 5, 5)
    with pytest.raises(RuntimeError, match=r"input is on meta; expected a CPU tensor"):
        module.involution_forward(x, weight, [1, 1], [1, 1], [1, 1])


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda a: {**a, "weight": a["weight"].double()}, r"weight has dtype Double but input has Float"),
        (lambda a: {**a, "input": a["input"].int()}, r"input has dtype Int; expected float32"),
        (lambda a: {**a, "weight": a["weight"][0]}, r"weight has 5 dimensions; expected 6"),
        (lambda a: {**a, "weight": a["weight"][:, :, :, :, :4]}, r"the output is 4x5 but a 3x3 window on the 5x5 input gives 5x5"),
        (lambda a: {**a, "input": a["input"][:, :3]}, r"2 groups do not divide 3 channels"),
        (lambda a: {**a, "stride": [0, 1]}, r"stride is \[0, 1\]; each value must be at least 1"),
        (lambda a: {**a, "padding": [1]}, r"padding has 1 values; expected 2"),
        (lambda a: {**a, "input": a["input"].to_sparse()}, r"input has layout Sparse; expected a strided"),
    ],
)
def test_the_forward_entry_point_checks_its_tensors(monkeypatch, change, message):
    module = _module(monkeypatch)
    args = dict(input=torch.randn(2, 4, 5, 5), weight=torch.randn(2, 2, 3, 3, 5, 5), stride=[1, 1], padding=[1, 1], dilation=[1, 1])
    with pytest.raises(RuntimeError, match=message):
        module.involution_forward(*change(args).values())


def test_the_generated_entry_points_check_the_generator(monkeypatch):
    module = _module(monkeypatch)
    x, feature = torch.randn(2, 4, 5, 5), torch.randn(2, 3, 5, 5)
    span, bias = torch.randn(2 * 9, 3), torch.randn(2 * 9)
    params = ([3, 3], [1, 1], [1, 1], [1, 1])
    with pytest.raises(RuntimeError, match=r"span_weight takes 2 reduced channels but the feature map has 3"):
        module.involution_generated_forward(x, feature, span[:, :2], bias, *params)
    with pytest.raises(RuntimeError, match=r"span_weight has 17 rows; expected groups \* 9"):
        module.involution_generated_forward(x, feature, span[:17], None, *params)
    with pytest.raises(RuntimeError, match=r"span_bias has 9 values but span_weight has 18 rows"):
        module.involution_generated_forward(x, feature, span, bias[:9], *params)
    with pytest.raises(RuntimeError, match=r"grad_output is \[2, 4, 4, 5\] but the feature map is 5x5"):
        module.involution_generated_backward_input(x[:, :, :4], feature, span, bias, [5, 5], *params)
    with pytest.raises(RuntimeError, match=r"the feature map's batch 1 differs from input's 2"):
        module.involution_generated_forward(x, feature[:1], span, bias, *params)
    # the generator's gradients: grad_output, feature, span_weight, input
    with pytest.raises(RuntimeError, match=r"grad_output is \[2, 4, 5, 5\] but input is \[1, 4, 5, 5\]"):
        module.involution_generated_backward_generator(x, feature, span, x[:1], *params)
    with pytest.raises(RuntimeError, match=r"grad_output is \[2, 4, 4, 5\] but the feature map is 5x5"):
        module.involution_generated_backward_generator(x[:, :, :4], feature, span, x, *params)
    with pytest.raises(RuntimeError, match=r"span_weight takes 2 reduced channels but the feature map has 3"):
        module.involution_generated_backward_generator(x, feature, span[:, :2], x, *params)
    with pytest.raises(RuntimeError, match=r"out is \[18, 2\]; expected \[18, 3\]"):
        module.involution_generated_backward_generator(x, feature, span, x, *params, None, torch.empty(18, 2))
    with pytest.raises(RuntimeError, match=r"(unsupported operation|overlap)"):
        module.involution_generated_backward_generator(x, feature, span, x, *params, feature)


@pytest.mark.parametrize("channels_last", [False, True], ids=["nchw", "channels_last"])
def test_the_entry_points_write_into_the_result_the_op_allocated(monkeypatch, channels_last):
    """The forward and grad_input write into ``out`` in its own layout (channels_last where
    the op's fake says so) and return that very tensor, equal to the float64 reference."""
    from oplib import registry

    module = _module(monkeypatch)
    fmt = torch.channels_last if channels_last else torch.contiguous_format
    torch.manual_seed(0)
    x = torch.randn(2, 32, 9, 11).contiguous(memory_format=fmt)
    weight, grad = torch.randn(2, 2, 7, 7, 9, 11), torch.randn(2, 32, 9, 11).contiguous(memory_format=fmt)
    feature, span = torch.randn(2, 8, 9, 11), torch.randn(2 * 49, 8)
    params = ([1, 1], [3, 3], [1, 1])
    calls = {
        "involution": (module.involution_forward, (x, weight, *params)),
        "involution_backward_input": (module.involution_backward_input, (grad, weight, [9, 11], *params)),
        "involution_generated": (module.involution_generated_forward, (x, feature, span, None, [7, 7], *params)),
        "involution_generated_backward_input": (
            module.involution_generated_backward_input, (grad, feature, span, None, [9, 11], [7, 7], *params)),
    }  # fmt: skip
    for name, (call, args) in calls.items():
        out = torch.full((2, 32, 9, 11), float("nan")).contiguous(memory_format=fmt)
        assert call(*args, out=out) is out
        assert out.is_contiguous(memory_format=fmt)
        expected = registry.get(name).reference(*[a.double() if isinstance(a, torch.Tensor) else a for a in args])
        torch.testing.assert_close(out.double(), expected, atol=1e-4, rtol=1e-4)
    strided = torch.empty(2, 32, 9, 22)[..., ::2]  # neither layout: the generic store
    module.involution_forward(x, weight, *params, out=strided)
    torch.testing.assert_close(strided.double(), registry.get("involution").reference(x.double(), weight.double(), *params),
                               atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("pixel_major", [False, True], ids=["contiguous", "pixel_major"])
def test_grad_weight_writes_into_the_result_the_op_allocated(monkeypatch, pixel_major):
    """grad_weight into ``out``: a contiguous one written in place, a pixel-major one (what the
    op allocates for a channels_last input) filled by a copy; either way ``out`` itself comes
    back, equal to the float64 reference, and a wrong shape is refused."""
    from oplib import registry
    from oplib.kernels.involution.layouts import is_pixel_major, weight_result

    module = _module(monkeypatch)
    torch.manual_seed(0)
    x, grad = torch.randn(2, 32, 9, 11), torch.randn(2, 32, 9, 11)
    args = (grad, x, [7, 7], [1, 1], [3, 3], [1, 1], 2)
    out = weight_result(x, (2, 2, 7, 7, 9, 11), pixel_major).fill_(float("nan"))
    address = out.data_ptr()
    assert module.involution_backward_weight(*args, out=out) is out
    assert out.data_ptr() == address and is_pixel_major(out) == pixel_major
    expected = registry.get("involution_backward_weight").reference(grad.double(), x.double(), *args[2:])
    torch.testing.assert_close(out.double(), expected, atol=1e-4, rtol=1e-4)
    with pytest.raises(RuntimeError, match=r"out is \[2, 2, 7, 7, 9, 10\]; expected \[2, 2, 7, 7, 9, 11\]"):
        module.involution_backward_weight(*args, out=torch.empty(2, 2, 7, 7, 9, 10))


def test_the_result_given_must_fit_and_not_overlap(monkeypatch):
    module = _module(monkeypatch)
    x, weight = torch.randn(2, 16, 5, 5), torch.randn(2, 1, 3, 3, 5, 5)
    params = ([1, 1], [1, 1], [1, 1])
    with pytest.raises(RuntimeError, match=r"out is \[2, 16, 5, 4\]; expected \[2, 16, 5, 5\]"):
        module.involution_forward(x, weight, *params, out=torch.empty(2, 16, 5, 4))
    with pytest.raises(RuntimeError, match=r"out has dtype Double but input has Float"):
        module.involution_forward(x, weight, *params, out=torch.empty(2, 16, 5, 5, dtype=torch.float64))
    with pytest.raises(RuntimeError, match=r"unsupported operation: some elements of the input tensor and the written-to tensor refer to a single memory location"):
        module.involution_forward(x, weight, *params, out=x)
    with pytest.raises(RuntimeError, match=r"unsupported operation: more than one element of the written-to tensor refers to a single memory location"):
        module.involution_forward(x, weight, *params, out=torch.empty(2, 16, 5, 1).expand(2, 16, 5, 5))


class _OnDevice(torch.Tensor):
    """A tensor of another device type, holding no data: its ops are sent past Python's
    dispatch straight to that device type's kernel (no such device is on this machine)."""

    @staticmethod
    def __new__(cls, shape, device):
        return _torch_private.make_wrapper_subclass(cls, shape, dtype=torch.float32, device=device)

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        device = next(a.device for a in args if isinstance(a, torch.Tensor))
        keys = _torch_private.DispatchKeySet(getattr(_torch_private.DispatchKey, device.type.upper()))
        return func.redispatch(keys, *args, **(kwargs or {}))


@pytest.mark.parametrize("device", ["xpu", "mtia"])
@pytest.mark.parametrize("name", INVOLUTION_OPS)
def test_another_device_type_gets_torchs_no_kernel_error(name, device):
    """The ops are registered for CPU and CUDA only: before, the CPU kernel was every device's
    default and a tensor of another type reached it."""
    from oplib import registry

    sample = next(iter(registry.get(name).sample_inputs("cpu", torch.float32, False)))
    args = [_OnDevice(a.shape, device) if isinstance(a, torch.Tensor) else a for a in sample.args]
    with pytest.raises(NotImplementedError, match=rf"Could not run 'oplib::{name}' with arguments from the '{device.upper()}' backend"):
        getattr(torch.ops.oplib, name)(*args)


# ---- Builds in a fresh cache (integration tier) ---------------------------------------------

# One involution call on the native path (OPLIB_CPU_KERNELS=native), then the path's status.
FIRST_CALL = textwrap.dedent(
    """
    import torch, oplib
    from oplib import registry
    from oplib.kernels import native
    x, w = torch.randn(2, 16, 9, 9), torch.randn(2, 1, 7, 7, 9, 9)
    out = torch.ops.oplib.involution(x, w, [1, 1], [3, 3], [1, 1])
    expected = registry.get("involution").reference(x.double(), w.double(), [1, 1], [3, 3], [1, 1])
    torch.testing.assert_close(out.double(), expected, atol=1e-4, rtol=1e-4)
    print("status:", native.status())
    """
)


def _fresh_env(tmp_path: Path) -> dict[str, str]:
    return dict(os.environ, TORCH_EXTENSIONS_DIR=str(tmp_path / "cache"), OPLIB_CPU_KERNELS="native")


def _first_call(env: dict[str, str], **kwargs) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", FIRST_CALL], env=env, cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, **kwargs)


@pytest.mark.integration
def test_a_build_killed_mid_way_leaves_the_next_call_native(tmp_path):
    """SIGKILL to the building process group once its first units are compiled: the lock dies
    with it, so the next call builds at once (it never waits), says so, runs natively and
    clears the killed build's directory."""
    require_native_build()
    env = _fresh_env(tmp_path)
    first = _first_call(env, start_new_session=True)
    cache = tmp_path / "cache" / "oplib"
    deadline = time.monotonic() + 300
    while not list(cache.glob("*.build-*/*.o")):
        assert first.poll() is None and time.monotonic() < deadline, "the build ended before it could be killed"
        time.sleep(0.2)
    os.killpg(first.pid, signal.SIGKILL)
    first.wait()
    assert not list(cache.glob("*.so")) and list(cache.glob("*.build-*"))
    second = _first_call(env)
    stdout, stderr = second.communicate(timeout=600)
    assert second.returncode == 0, stdout + stderr
    assert "status: native" in stdout
    assert "waiting" not in stderr
    assert "oplib: building the native CPU kernels once for this machine" in stderr
    assert "oplib: built the native CPU kernels in" in stderr
    assert len(list(cache.glob("*.so"))) == 1 and not list(cache.glob("*.build-*"))


@pytest.mark.integration
def test_three_first_calls_at_once_build_once_and_all_run_natively(tmp_path):
    require_native_build()
    env = _fresh_env(tmp_path)
    calls = [_first_call(env) for _ in range(3)]
    outputs = [call.communicate(timeout=900) for call in calls]
    for call, (stdout, stderr) in zip(calls, outputs):
        assert call.returncode == 0, stdout + stderr
        assert "status: native" in stdout
    stderr = "".join(err for _, err in outputs)
    assert stderr.count("oplib: building the native CPU kernels") == 1, stderr
    assert stderr.count("oplib: built the native CPU kernels in") == 1, stderr
    assert len(list((tmp_path / "cache" / "oplib").glob("*.so"))) == 1


CHECK_BUILD = textwrap.dedent(
    """
    import sys
    from oplib.kernels import native
    from oplib.testing.native import check_module
    module = native.build(march=sys.argv[1], compiler=sys.argv[2], quiet=True)
    print("checked:", check_module(module), "calls")
    """
)

TARGETS = {
    # The AVX2-only build (x86-64-v3: AVX2, FMA, no AVX-512) and the baseline (SSE2): the
    # generic paths beside every AVX-512 block.
    "gcc-x86-64-v3": ("x86-64-v3", "g++"),
    "gcc-x86-64": ("x86-64", "g++"),
    # clang with its OpenMP (Debian's clang and libomp-dev): the vector layer without GCC's builtins.
    "clang-native": ("native", "clang++"),
}


@pytest.mark.integration
@pytest.mark.parametrize("target", TARGETS)
def test_a_build_for_another_target_or_compiler_matches_the_reference(tmp_path, target):
    march, compiler = TARGETS[target]
    if march.startswith("x86-64") and not IS_X86_64:
        pytest.skip(f"{march} is an x86-64 target; this machine is {platform.machine()}")
    if shutil.which(compiler) is None:
        pytest.skip(f"{compiler} is not installed (`make toolchains` installs clang, libomp-dev and the aarch64 cross compiler)")
    env = dict(os.environ, TORCH_EXTENSIONS_DIR=str(tmp_path / "cache"))
    result = subprocess.run([sys.executable, "-c", CHECK_BUILD, march, compiler], env=env, cwd=ROOT, capture_output=True,
                            text=True, timeout=1200)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-5000:]
    assert "checked:" in result.stdout


AARCH64_COMPILER = "aarch64-linux-gnu-g++"


@pytest.mark.integration
def test_every_unit_compiles_for_aarch64(tmp_path):
    """Each unit, bindings included, compiled for aarch64 (NEON) against this torch's headers:
    a compile check; running needs an aarch64 torch, which tests may not download."""
    if shutil.which(AARCH64_COMPILER) is None:
        pytest.skip(f"{AARCH64_COMPILER} is not installed (`make toolchains` installs it)")
    flags = native.Target(AARCH64_COMPILER, "armv8-a").compile_flags("oplib_cpu_aarch64")
    procs = {
        unit: subprocess.Popen([AARCH64_COMPILER, *flags, "-c", str(unit), "-o", str(tmp_path / f"{unit.stem}.o")],
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        for unit in native.units()
    }
    for unit, proc in procs.items():
        output = proc.communicate(timeout=900)[0]
        assert proc.returncode == 0, f"{unit.name}: {native.first_error_line(output)}"
        header = (tmp_path / f"{unit.stem}.o").read_bytes()[:20]
        assert header[:4] == b"\x7fELF" and int.from_bytes(header[18:20], "little") == 183, unit  # EM_AARCH64


@pytest.mark.parametrize("preload, kept", [
    ("/usr/lib/gcc/x86_64-linux-gnu/12/libasan.so", None),
    ("/usr/lib/libasan.so.8:/opt/libfoo.so", "/opt/libfoo.so"),
    ("/opt/libfoo.so", "/opt/libfoo.so"),
    (None, None),
])
def test_the_compilers_run_without_the_address_sanitizer_runtime(monkeypatch, preload, kept):
    """A sanitized build from a process that has ASan's runtime preloaded (the tests' runs of a
    sanitized module) runs its compilers without it, whatever else LD_PRELOAD holds: under
    ASan's allocator the build took 138 s where it takes 102."""
    if preload is None:
        monkeypatch.delenv("LD_PRELOAD", raising=False)
    else:
        monkeypatch.setenv("LD_PRELOAD", preload)
    env = native.compiler_environment()
    assert env.get("LD_PRELOAD") == kept
    assert env["PATH"] == os.environ["PATH"]
