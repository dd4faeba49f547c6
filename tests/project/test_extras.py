"""The optional dependencies: each path that needs an extra names it when it is missing (the
extra hidden from import here), and the command line says so in one line, before any work.
Before: bare ModuleNotFoundErrors (onnx, sklearn, PIL, pytest)."""

from __future__ import annotations

import re
import sys

import pytest
import torch

from oplib import __main__ as cli
from oplib import _extras

HINT = r"pip install 'torch-oplib\[{extra}\]' \(from a checkout of the unreleased 0\.1\.0: pip install '\.\[{extra}\]'\)"


def _hide(monkeypatch, *modules: str) -> None:
    """Imports of ``modules`` fail as where they are not installed."""
    for name in list(sys.modules):
        if name.split(".")[0] in modules:
            monkeypatch.delitem(sys.modules, name)
    for module in modules:
        monkeypatch.setitem(sys.modules, module, None)


def test_require_names_the_extra(monkeypatch):
    _hide(monkeypatch, "onnx")
    with pytest.raises(ModuleNotFoundError, match="ONNX export needs onnx, which is not installed: it comes with the 'onnx' extra, "
                       + HINT.format(extra="onnx")) as error:
        _extras.require("onnx", "onnx", "ONNX export")
    assert isinstance(error.value, _extras.MissingExtraError) and error.value.name == "onnx"


def test_an_error_inside_an_installed_package_is_not_called_missing(monkeypatch, tmp_path):
    """Only an absent package is a missing extra: a package that fails while importing keeps
    its own error."""
    (tmp_path / "broken_extra_pkg.py").write_text("import no_such_module_anywhere\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ModuleNotFoundError) as error:
        _extras.require("broken_extra_pkg", "onnx", "a test")
    assert not isinstance(error.value, _extras.MissingExtraError) and error.value.name == "no_such_module_anywhere"


def test_every_extra_is_one_of_pyprojects():
    import tomllib
    from pathlib import Path

    declared = tomllib.loads((Path(__file__).resolve().parents[2] / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert set(_extras.EXTRAS) <= set(declared)
    assert set(_extras.DISTRIBUTIONS) <= set(declared)


@pytest.mark.parametrize(
    "hidden,argv,extra",
    [
        ("onnx", ["export", "--depth", "26", "--format", "onnx", "{tmp}/model.onnx"], "onnx"),
        ("onnxscript", ["export", "--depth", "26", "--format", "onnx", "{tmp}/model.onnx"], "onnx"),
        ("sklearn", ["train", "--out", "{tmp}/run"], "train"),
        ("matplotlib", ["train", "--out", "{tmp}/run"], "train"),
        ("PIL", ["predict", "--depth", "26", "--weights", "paddleclas", "{tmp}/cat.jpg"], "models"),
        ("PIL", ["evaluate", "--depth", "26", "--weights", "paddleclas", "{tmp}"], "models"),
    ],
    ids=["export-onnx", "export-onnxscript", "train-sklearn", "train-matplotlib", "predict-PIL", "evaluate-PIL"],
)
def test_a_command_without_its_extra_says_which_in_one_line(hidden, argv, extra, monkeypatch, capsys, tmp_path):
    _hide(monkeypatch, hidden)
    built = []
    import oplib.models

    monkeypatch.setattr(oplib.models.RedNet, "__init__", lambda *a, **k: built.append(a) or 1 / 0)
    (tmp_path / "cat.jpg").write_bytes(b"")
    with pytest.raises(SystemExit) as exit_info:
        cli.main([a.format(tmp=tmp_path) for a in argv])
    assert exit_info.value.code == 1
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1, err
    assert err.startswith(f"python -m oplib {argv[0]}: ") and re.search(HINT.format(extra=extra), err), err
    assert not built, "the model was built before the missing extra was reported"


def test_the_generated_tests_without_pytest_name_the_testing_extra(monkeypatch):
    import oplib.testing

    _hide(monkeypatch, "pytest")
    with pytest.raises(_extras.MissingExtraError, match="oplib.testing.generated_tests needs pytest.*" + HINT.format(extra="testing")):
        oplib.testing.generated_tests  # noqa: B018


@pytest.mark.parametrize("hidden", ["onnx", "onnxscript", "onnxruntime"])
def test_onnx_export_without_its_extra_names_it(hidden, monkeypatch, tmp_path):
    import oplib.onnx

    _hide(monkeypatch, hidden)
    with pytest.raises(_extras.MissingExtraError, match=f"needs {hidden}, which is not installed.*" + HINT.format(extra="onnx")):
        oplib.onnx.export(torch.nn.ReLU(), (torch.randn(2),), tmp_path / "m.onnx")


def test_the_installed_extras_are_reported(monkeypatch):
    assert _extras.installed()["onnx"] is True  # the test environment installs it
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "onnxruntime" else real(name, *a))
    assert _extras.installed()["onnx"] is False


def test_the_parametrisation_helpers_without_pytest_name_the_testing_extra(monkeypatch):
    from oplib import testing

    _hide(monkeypatch, "pytest")
    with pytest.raises(_extras.MissingExtraError, match=HINT.format(extra="testing")):
        testing.spec_params()
