"""The native CPU kernels of involution (``oplib/kernels/involution.cpp``): every registry
sample of the three ops in every dtype against the float64 reference through the ops
themselves; the generated checks of the three ops once more on the native path; and what
happens where they cannot be built (a fallback with one warning, or a clear error)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from oplib import registry
from oplib.kernels import native
from oplib.testing import assert_matches_reference
from oplib.testing.native import force_native, require_native_build

ROOT = Path(__file__).resolve().parents[1]
INVOLUTION_OPS = ("involution", "involution_backward_input", "involution_backward_weight")


@pytest.mark.parametrize("dtype", registry.FLOAT_DTYPES, ids=str)
@pytest.mark.parametrize("name", INVOLUTION_OPS)
def test_registry_samples_match_the_reference(monkeypatch, name, dtype):
    force_native(monkeypatch)
    spec = registry.get(name)
    for sample in spec.sample_inputs("cpu", dtype, False):
        assert_matches_reference(spec, sample, spec.op(*sample.args), dtype)


def test_auto_without_a_compiler_falls_back_with_one_warning(monkeypatch):
    monkeypatch.setenv("CXX", "/nonexistent/c++")
    with pytest.warns(native.NativeBuildWarning, match=r"no C\+\+ compiler \('/nonexistent/c\+\+'\) on the PATH"):
        assert native._load.__wrapped__("auto") is None


def test_native_without_a_compiler_is_a_clear_error(monkeypatch):
    monkeypatch.setenv("CXX", "/nonexistent/c++")
    with pytest.raises(RuntimeError, match=r"OPLIB_CPU_KERNELS=native, but the native CPU kernels are unavailable: no C\+\+"):
        native._load.__wrapped__("native")


def test_an_unknown_choice_is_refused(monkeypatch):
    monkeypatch.setenv(native.ENV, "fast")
    with pytest.raises(ValueError, match=r"OPLIB_CPU_KERNELS='fast': expected one of pytorch, auto, native"):
        native.involution()


def test_a_broken_compiler_falls_back_to_correct_results(tmp_path):
    """A compiler on the PATH that fails every build (and an empty build cache): the ops warn
    once, naming the failed build, and give the reference's results."""
    compiler = tmp_path / "c++"
    compiler.write_text("#!/bin/sh\necho 'broken compiler' >&2\nexit 1\n")
    compiler.chmod(0o755)
    script = textwrap.dedent(
        """
        import warnings, torch
        from oplib import registry
        from oplib.testing import assert_matches_reference
        spec = registry.get("involution")
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            for sample in spec.sample_inputs("cpu", torch.float32, False):
                assert_matches_reference(spec, sample, spec.op(*sample.args), torch.float32)
        messages = [str(w.message) for w in caught if "plain-PyTorch CPU kernels" in str(w.message)]
        assert len(messages) == 1, messages
        print(messages[0])
        """
    )
    env = dict(os.environ, CXX=str(compiler), OPLIB_CPU_KERNELS="auto", TORCH_EXTENSIONS_DIR=str(tmp_path / "cache"))
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "building involution.cpp failed" in result.stdout, result.stdout


@pytest.mark.integration
def test_generated_checks_of_the_involution_ops_pass_on_the_native_path():
    """tests/test_ops.py's checks of the three ops (eager, layouts, gradcheck, gradgradcheck,
    opcheck, vmap, autocast, error inputs, random shapes) with OPLIB_CPU_KERNELS=native."""
    require_native_build()
    env = dict(os.environ, OPLIB_CPU_KERNELS="native")
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/test_ops.py", "-k", "involution"],
        cwd=ROOT, capture_output=True, text=True, env=env, timeout=1800,
    )
    assert result.returncode == 0, result.stdout[-5000:]
    assert " passed" in result.stdout and " failed" not in result.stdout


_ASAN_SCRIPT = textwrap.dedent(
    """
    import random, sys, torch
    from pathlib import Path
    from oplib import registry
    from oplib.kernels import native
    from oplib.testing import assert_matches_reference

    module = native.build(Path(sys.argv[1]), sanitize=True)
    calls = {
        "involution": module.involution_forward,
        "involution_backward_input": module.involution_backward_input,
        "involution_backward_weight": module.involution_backward_weight,
    }
    rng = random.Random(0)
    count = 0
    for name, call in calls.items():
        spec = registry.get(name)
        for dtype in registry.FLOAT_DTYPES:
            samples = list(spec.sample_inputs("cpu", dtype, False))
            samples += [spec.random_sample(rng.randint, "cpu", dtype, False) for _ in range(15)]
            for sample in samples:
                assert_matches_reference(spec, sample, call(*sample.args), dtype)
                count += 1
    print("asan: clean,", count, "calls")
    """
)


def _run_under_asan(source: Path, tmp_path: Path) -> subprocess.CompletedProcess:
    from oplib.testing.cuda_emulation import asan_environment

    env = dict(asan_environment(), TORCH_EXTENSIONS_DIR=str(tmp_path / "cache"))
    return subprocess.run(
        [sys.executable, "-c", _ASAN_SCRIPT, str(source)], capture_output=True, text=True, env=env, timeout=1200
    )


@pytest.mark.integration
def test_native_kernels_are_clean_under_address_sanitizer(tmp_path):
    """Every registry sample and 15 random geometries per op and dtype, through the kernels
    built with AddressSanitizer: no invalid access, and the reference's results."""
    require_native_build()
    result = _run_under_asan(native.SOURCE, tmp_path)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-5000:]
    assert "asan: clean" in result.stdout


@pytest.mark.integration
def test_address_sanitizer_catches_a_planted_off_by_one_in_the_native_kernels(tmp_path):
    """The same run over a copy of the source whose grad_output rows are read one element too
    far: the read past the last row of a tensor must abort with a heap-buffer-overflow."""
    require_native_build()
    text = native.SOURCE.read_text()
    exact = "convert(at(n, c, h), stride_w, width, dst);"
    assert text.count(exact) == 1
    planted = tmp_path / "involution.cpp"
    planted.write_text(text.replace(exact, "convert(at(n, c, h), stride_w, width + 1, dst);"))
    result = _run_under_asan(planted, tmp_path)
    assert result.returncode != 0
    assert "heap-buffer-overflow" in result.stderr, result.stderr[-3000:]
    assert "asan: clean" not in result.stdout
