"""oplib's private torch entry points (``oplib/_torch_private.py``): each still exists on the
torch under test (``make test`` runs the pinned release, ``make test-oldest`` the declared
minimum), and no other Python file of the project (package, tests, benchmarks, tools,
examples) reaches into torch's private namespaces."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import oplib
from oplib import _torch_private, registry

PACKAGE = Path(oplib.__file__).parent
ROOT = Path(__file__).resolve().parents[2]  # the checkout the tests run from
# Underscored names torch documents as its public API (the torch._check family).
DOCUMENTED = {f"torch._check{suffix}" for suffix in ("", "_value", "_index", "_type", "_is_size", "_with", "_not_implemented")}


@pytest.mark.parametrize("name", _torch_private.SYMBOLS)
def test_each_private_symbol_still_exists(name):
    symbol = _torch_private.SYMBOLS[name]
    try:
        _torch_private.resolve(symbol.path)
    except (ImportError, AttributeError) as error:
        pytest.fail(f"{symbol.path} ({name}) is gone from this torch: {error}; without it, {symbol.without}")
    assert hasattr(_torch_private, name), f"oplib._torch_private does not export {name}"
    assert symbol.why and symbol.without and len(symbol.checked) == 2


@pytest.mark.parametrize("attribute", _torch_private.OPDEF_ATTRIBUTES)
def test_the_custom_op_attributes_oplib_reads_exist(attribute):
    missing = [spec.name for spec in registry.all_specs() if not hasattr(spec._opdef(), attribute)]
    assert not missing, f"CustomOpDef.{attribute} is gone from this torch (ops: {missing})"


def _private_names(tree: ast.AST) -> list[tuple[int, str]]:
    """(line, dotted name) of each torch module or attribute with an underscored part (dunders
    such as ``torch.__version__`` aside), once per line and name."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            names = [node.module] + [f"{node.module}.{alias.name}" for alias in node.names]
        elif isinstance(node, ast.Attribute):
            parts, inner = [node.attr], node.value
            while isinstance(inner, ast.Attribute):
                parts.append(inner.attr)
                inner = inner.value
            if not (isinstance(inner, ast.Name) and inner.id == "torch"):
                continue
            names = [".".join(["torch", *reversed(parts)])]
        else:
            continue
        for name in names:
            parts = name.split(".")
            if parts[0] != "torch":
                continue
            for cut in range(2, len(parts) + 1):
                part = parts[cut - 1]
                if part.startswith("_") and not part.endswith("__") and ".".join(parts[:cut]) not in DOCUMENTED:
                    found.add((node.lineno, ".".join(parts[:cut])))
                    break
    return sorted(found)


def _project_sources() -> list[Path]:
    """Every Python file of the project (the package under test, and the checkout's tests,
    benchmarks, tools and examples) but the private-API module itself."""
    folders = [PACKAGE, *(ROOT / name for name in ("tests", "compile_tests", "bench", "tools", "examples"))]
    files = [path for folder in folders for path in folder.rglob("*.py")] + sorted(ROOT.glob("*.py"))
    return sorted(set(files) - {PACKAGE / "_torch_private.py"})


def _shown(path: Path) -> str:
    return str(path.relative_to(PACKAGE.parent if path.is_relative_to(PACKAGE) else ROOT))


def test_no_other_module_reaches_into_private_torch():
    offenders = []
    for path in _project_sources():
        for line, name in _private_names(ast.parse(path.read_text())):
            offenders.append(f"{_shown(path)}:{line}: {name}")
    assert not offenders, "private torch names outside oplib/_torch_private.py:\n" + "\n".join(sorted(set(offenders)))


def test_the_scan_covers_the_tests_and_benchmarks():
    names = {_shown(path) for path in _project_sources()}
    assert {"oplib/ops/involution.py", "tests/project/test_torch_private.py", "compile_tests/ops/test_compile.py", "bench/rednet.py", "conftest.py"} <= names
    assert "oplib/_torch_private.py" not in names


def test_the_scan_finds_a_private_name():
    tree = ast.parse("import torch\nfrom torch._C import _foo\nx = torch._C._bar\ny = torch.nn.Linear\ntorch._check(True)\n")
    assert _private_names(tree) == [(2, "torch._C"), (3, "torch._C")]


def test_a_missing_symbol_is_reported():
    with pytest.raises(AttributeError):
        _torch_private.resolve("torch._C._no_such_symbol")
