"""The README's table of ops, checked against the registry, so that the copy a reader sees on
the project page cannot drift from the ops themselves: a new op of oplib adds its row."""

from __future__ import annotations

import re
from pathlib import Path

import torch

from oplib import registry

README = Path(__file__).resolve().parents[1] / "README.md"

# The autocast column's words for the policies of ``OpSpec.autocast_policy``.
POLICY_WORDS = {"autocast dtype": "lower_precision", "float32": "fp32"}


def _ops_section() -> str:
    text = README.read_text()
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


def test_every_op_supports_the_dtypes_the_readme_names():
    assert "All support float64, float32, bfloat16 and float16 on CPU and CUDA." in " ".join(_ops_section().split())
    everything = {torch.float64, torch.float32, torch.bfloat16, torch.float16}
    for spec in _oplib_specs():
        assert {device: set(dtypes) for device, dtypes in spec.dtypes.items()} == {"cpu": everything, "cuda": everything}, spec.name
