"""oplib's pytest plugin (the pytest11 entry point): in a project of a user's, outside oplib's
tree, the marks of oplib.testing's generated tests are known (no unknown-mark warning, even
with --strict-markers) and the tests a machine cannot run are skipped with the reason."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

TEST_FILE = '''
import pytest

@pytest.mark.integration
def test_long():
    pass

@pytest.mark.needs_cuda
def test_on_a_gpu():
    import torch
    assert torch.cuda.is_available()
'''


def _pytest(tmp_path, *flags: str) -> subprocess.CompletedProcess:
    (tmp_path / "test_user.py").write_text(TEST_FILE)
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", "--strict-markers", *flags,
                           "test_user.py"], cwd=tmp_path, capture_output=True, text=True, timeout=300)  # fmt: skip


def test_the_marks_are_registered_and_skips_say_why(tmp_path):
    """One session (a fresh interpreter each costs 7 s): --strict-markers accepts both marks,
    ``-m "not integration"`` deselects by one, and the GPU test skips saying why."""
    result = _pytest(tmp_path, "-m", "not integration")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "1 deselected" in result.stdout, result.stdout
    if not torch.cuda.is_available():
        assert "1 skipped, 1 deselected" in result.stdout and "needs a CUDA GPU" in result.stdout, result.stdout
    assert "PytestUnknownMarkWarning" not in result.stdout + result.stderr


def test_without_the_plugin_the_marks_are_unknown(tmp_path):
    """The check can fail: with the plugin turned off, --strict-markers refuses the marks."""
    result = _pytest(tmp_path, "-p", "no:oplib")
    assert result.returncode != 0 and "'integration' not found in `markers`" in result.stdout + result.stderr


@pytest.mark.integration  # three pytest sessions in fresh interpreters; the plugin's own tests stay in the unit tier
def test_oplib_suite_takes_the_plugin_by_name_where_no_entry_point_is_installed():
    """A lent GPU machine's `pip install -e .` left no pytest11 entry point (fourth H200 draw), and
    the suite's conftest refused to run: the plugin named with -p (what tools/gpu_check.py adds
    then) is accepted, and without either the refusal still names both ways."""
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    quick = "tests/project/test_extras.py"

    def run(*flags: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:oplib", *flags,
                               quick, "-k", "every_extra"], cwd=root, capture_output=True, text=True, timeout=300)  # fmt: skip

    named = run("-p", "oplib.testing.plugin")
    assert named.returncode == 0 and "passed" in named.stdout, named.stdout + named.stderr
    refused = run()
    assert refused.returncode != 0 and "-p oplib.testing.plugin" in refused.stdout + refused.stderr


def test_only_the_marks_a_session_holds_are_probed(monkeypatch):
    """Before: every session with a marked test probed inductor's C++ compiler (importing
    inductor: 3.5 s of each user's pytest run), though none of its tests needed one."""
    import pytest

    from oplib.testing import plugin, toolchain

    probes = []
    monkeypatch.setattr(toolchain, "missing_inductor_compiler", lambda: probes.append(1) or "no compiler")

    class Item:
        def __init__(self, *marks: str):
            self.keywords, self.added = dict.fromkeys(marks, True), []

        def add_marker(self, mark):
            self.added.append(mark)

    gpu_only = Item("needs_cuda")
    plugin.pytest_collection_modifyitems(None, [gpu_only, Item()])
    assert probes == [] and len(gpu_only.added) == (0 if torch.cuda.is_available() else 1)
    compiled = Item("needs_compiler")
    plugin.pytest_collection_modifyitems(None, [gpu_only, compiled])
    assert probes == [1] and compiled.added == [pytest.mark.skip(reason="no compiler")]
