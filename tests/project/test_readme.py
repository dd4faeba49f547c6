"""The table of ops in the documentation (docs/ops.md, under "## Ops"), checked against the
registry, so that the copy a reader sees cannot drift from the ops themselves: a new op of
oplib adds its row. And the README stays what a newcomer reads in five minutes, its
package-index install line marked as for after the first release. (tests/project/test_docs.py runs
the README's code; tests/project/test_package.py runs its install from a checkout.)"""

from __future__ import annotations

import re
from pathlib import Path

import torch

from oplib import registry

ROOT = Path(__file__).resolve().parents[2]
OPS_PAGE = ROOT / "docs" / "ops.md"
README = ROOT / "README.md"
# About five minutes of reading; the rest belongs in docs/.
README_MAX_LINES = 150

# The autocast column's words for the policies of ``OpSpec.autocast_policy``.
POLICY_WORDS = {"autocast dtype": "lower_precision", "float32": "fp32"}


def _ops_section() -> str:
    text = OPS_PAGE.read_text()
    start = text.index("\n## Ops\n")
    return text[start : text.index("\n## ", start + 1)]


def _ops_table() -> list[tuple[str, str, str]]:
    """(op name, schema, autocast cell) of each row of the table under "## Ops"."""
    return re.findall(r"^\| `(\w+)` \| `([^`]+)` \| ([^|]+) \|", _ops_section(), flags=re.MULTILINE)


def _policy(cell: str) -> dict[str, str]:
    """"CPU, CUDA: autocast dtype" -> {"cpu": "lower_precision", "cuda": "lower_precision"}; "none" -> {}."""
    if cell.strip() == "none":
        return {}
    devices, words = cell.split(":")
    return {device.strip().lower(): POLICY_WORDS[words.strip()] for device in devices.split(",")}


def _oplib_specs() -> list[registry.OpSpec]:
    return [spec for spec in registry.all_specs() if spec.qualname.startswith("oplib::")]


def test_ops_table_has_one_row_per_op_with_its_schema():
    rows = _ops_table()
    assert len(rows) == len({name for name, _, _ in rows}), "an op has two rows"
    assert {name: schema for name, schema, _ in rows} == {spec.name: spec.schema for spec in _oplib_specs()}


def test_ops_table_gives_each_autocast_policy():
    policies = {name: _policy(cell) for name, _, cell in _ops_table()}
    assert policies == {spec.name: dict(spec.autocast_policy) for spec in _oplib_specs()}


def test_every_op_supports_the_dtypes_the_page_names():
    assert "All support float64, float32, bfloat16 and float16 on CPU and CUDA." in " ".join(_ops_section().split())
    everything = {torch.float64, torch.float32, torch.bfloat16, torch.float16}
    for spec in _oplib_specs():
        assert {device: set(dtypes) for device, dtypes in spec.dtypes.items()} == {"cpu": everything, "cuda": everything}, spec.name


def test_readme_is_short():
    lines = len(README.read_text().splitlines())
    assert lines <= README_MAX_LINES, f"README.md has {lines} lines: move the detail into a page of docs/"


def test_readme_marks_the_package_index_install_as_after_the_first_release():
    """Nothing is on the package index yet: a ``pip install torch-oplib`` in the README stands
    in a paragraph that says it is for after the first release."""
    text = README.read_text()
    install = text[text.index("\n## Install\n") :]
    install = install[: install.index("\n## ", 1)]
    paragraphs = [p for p in install.split("\n\n") if "pip install torch-oplib" in p or "pip install 'torch-oplib" in p]
    assert paragraphs, "the README no longer gives the package-index install line"
    for paragraph in paragraphs:
        assert "after the first release" in paragraph.lower(), paragraph
