"""oplib's modules import one another without a cycle, counting the imports inside
functions too (a lazy ``__getattr__`` import hid the one this test was written for: the
self-check and the generated tests imported each other through ``oplib.testing``; their
shared checks now live in ``oplib.testing.checks``) and a package's ``__init__`` like any
other module (``oplib.testing.generated`` imported its helpers back from the package whose
``__init__`` imports it; they now live in ``oplib.testing.helpers``)."""

from __future__ import annotations

import ast
from pathlib import Path

import oplib

PACKAGE = Path(oplib.__file__).parent


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph() -> dict[str, set[str]]:
    """Each oplib module's oplib imports, anywhere in it: a ``from X import name`` counts as
    importing module X.name where that is a module, else X."""
    paths = {_module_name(p): p for p in PACKAGE.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in paths.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        deps: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                deps.update(alias.name for alias in node.names if alias.name in paths)
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package.split(".")[: len(package.split(".")) - node.level + 1]
                    target = ".".join(base + ([node.module] if node.module else []))
                else:
                    target = node.module or ""
                for alias in node.names:
                    submodule = f"{target}.{alias.name}"
                    deps.add(submodule if submodule in paths else target)
        graph[name] = {d for d in deps if d in paths and d != name}
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str]:
    """One import cycle as a list of modules (first repeated at the end), or []."""
    for start in sorted(graph):
        stack, seen = [(start, [start])], set()
        while stack:
            module, path = stack.pop()
            for dep in sorted(graph[module]):
                if dep == start:
                    return path + [dep]
                if dep not in seen:
                    seen.add(dep)
                    stack.append((dep, path + [dep]))
    return []


def test_oplib_has_no_import_cycle():
    cycle = find_cycle(import_graph())
    assert not cycle, "import cycle: " + " -> ".join(cycle)


def test_a_loop_through_a_package_init_counts():
    graph = import_graph()
    # the package hands on what a module defines; the module must not import it back
    assert "oplib.testing.helpers" in graph["oplib.testing"]
    assert "oplib.testing" not in graph["oplib.testing.generated"]
    assert find_cycle({"pkg": {"pkg.mod"}, "pkg.mod": {"pkg"}}) == ["pkg", "pkg.mod", "pkg"]


def test_a_cycle_is_found():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) == []
