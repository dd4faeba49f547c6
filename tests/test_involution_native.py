"""The native CPU kernels of involution (``oplib/kernels/involution.cpp``): every registry
sample of the three ops in every dtype against the float64 reference through the ops
themselves; the generated checks of the three ops once more on the native path; and what
happens where they cannot be built (a fallback with one warning, or a clear error)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import pytest
import torch

from oplib import registry
from oplib.kernels import native
from oplib.testing import assert_matches_reference
from oplib.testing.native import force_native

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
    missing = native._missing_tool()
    if missing is not None:
        pytest.skip(f"the native CPU kernels cannot be built here: {missing}")
    env = dict(os.environ, OPLIB_CPU_KERNELS="native")
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/test_ops.py", "-k", "involution"],
        cwd=ROOT, capture_output=True, text=True, env=env, timeout=1800,
    )
    assert result.returncode == 0, result.stdout[-5000:]
    assert " passed" in result.stdout and " failed" not in result.stdout
