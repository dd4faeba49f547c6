"""What oplib's runtime paths load: ``import oplib`` and the ONNX translation table carry no
test data (``oplib.testing``, the spec modules) and no test dependency."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

TEST_MODULES = ("oplib.testing", "oplib.testing.specs", "hypothesis", "expecttest", "pytest")
MARKER = "loaded test modules: "


def _loaded_after(code: str) -> set[str]:
    """The modules of TEST_MODULES that a fresh interpreter has loaded after running ``code``."""
    script = f"import json, sys\n{code}\nprint({MARKER!r} + json.dumps([m for m in {TEST_MODULES!r} if m in sys.modules]))"
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    reports = [line.removeprefix(MARKER) for line in result.stdout.splitlines() if line.startswith(MARKER)]
    assert result.returncode == 0 and len(reports) == 1, f"stdout:\n{result.stdout}\nstderr:\n{result.stderr}"
    return set(json.loads(reports[0]))


@pytest.mark.parametrize(
    "code",
    [
        # An op call after the import: what it loads includes what the import loads.
        "import oplib, torch; torch.ops.oplib.involution(torch.randn(1, 4, 5, 5), torch.randn(1, 1, 3, 3, 5, 5), [1, 1], [1, 1], [1, 1])",
        "import oplib.onnx; oplib.onnx.translation_table()",
    ],
    ids=["import and op call", "onnx translation table"],
)
def test_runtime_paths_load_no_test_data(code):
    assert _loaded_after(code) == set()


def test_the_check_can_fail():
    """The registry loads the specs on its first read: the check above sees that."""
    assert _loaded_after("import oplib; oplib.registry.all_specs()") >= {"oplib.testing", "oplib.testing.specs"}


def test_submodules_are_attributes_of_oplib_imported_on_first_use():
    """Before: ``oplib.models`` and ``oplib.onnx`` raised AttributeError after ``import oplib``
    until imported explicitly. They load on first access, not at the import. Nor does dynamo
    (before: 2 s of every ``import oplib``, for the CUDA kernels' dynamo-disable wrappers;
    torch's own custom_op kernels import it at their first call, as oplib's do now)."""
    script = (
        "import sys, oplib\n"
        "before = [m for m in ('oplib.models', 'oplib.onnx', 'oplib.testing', 'torch._dynamo') if m in sys.modules]\n"
        "assert before == [], before\n"
        "assert callable(oplib.models.rednet26) and callable(oplib.onnx.translation_table)\n"
        "assert 'models' in dir(oplib) and oplib.testing.make is not None\n"
        "try:\n"
        "    oplib.no_such_thing\n"
        "except AttributeError as error:\n"
        "    assert str(error) == \"module 'oplib' has no attribute 'no_such_thing'\", error\n"
        "else:\n"
        "    raise AssertionError('no AttributeError')\n"
        "print('ok')\n"
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0 and result.stdout.strip() == "ok", result.stdout + result.stderr


def test_the_package_declares_its_annotations():
    """py.typed (PEP 561): type checkers read oplib's annotations."""
    from importlib import resources

    assert resources.files("oplib").joinpath("py.typed").is_file()
