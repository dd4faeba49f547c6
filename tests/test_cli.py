"""The main job, ``python -m oplib``."""

import subprocess
import sys

from oplib import __main__ as cli
from oplib import registry, selfcheck


def test_list_prints_every_registered_op():
    result = subprocess.run([sys.executable, "-m", "oplib", "list"], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    for spec in registry.all_specs():
        assert spec.schema in result.stdout


def test_check_passes_and_prints_the_matrix(capsys):
    assert cli.main(["check", "--op", "linear", "--device", "cpu"]) == 0
    out = capsys.readouterr().out
    assert "5 passed, 0 failed" in out
    assert all(name in out for name in selfcheck.CHECKS)


def test_a_failing_check_gives_a_nonzero_exit_code(monkeypatch, capsys):
    def broken(spec, device):
        raise AssertionError("planted failure")

    monkeypatch.setitem(selfcheck.CHECKS, "eager vs reference", broken)
    assert cli.main(["check", "--op", "exp"]) == 1
    captured = capsys.readouterr()
    assert "FAIL" in captured.out and "planted failure" in captured.err
