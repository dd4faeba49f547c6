"""The README's statements about the ops, checked against the registry, so that the copy a
reader sees on the project page cannot drift from the ops themselves."""

from __future__ import annotations

import re
from pathlib import Path

import torch

from oplib import registry

README = Path(__file__).resolve().parents[1] / "README.md"


def _ops_section() -> str:
    text = README.read_text()
    return text[text.index("\n## Ops\n") : text.index("\n## ", text.index("\n## Ops\n") + 1)]


def _ops_table() -> dict[str, str]:
    """op name -> schema, from the rows of the table under "## Ops"."""
    rows = re.findall(r"^\| `(\w+)` \| `([^`]+)` \|", _ops_section(), flags=re.MULTILINE)
    return dict(rows)


def _oplib_specs() -> list[registry.OpSpec]:
    return [spec for spec in registry.all_specs() if spec.qualname.startswith("oplib::")]


def test_ops_table_lists_every_op_with_its_schema():
    assert _ops_table() == {spec.name: spec.schema for spec in _oplib_specs()}


def test_every_op_supports_the_dtypes_the_readme_names():
    assert "All support float64, float32, bfloat16 and float16 on CPU and CUDA." in " ".join(_ops_section().split())
    everything = {torch.float64, torch.float32, torch.bfloat16, torch.float16}
    for spec in _oplib_specs():
        assert {device: set(dtypes) for device, dtypes in spec.dtypes.items()} == {"cpu": everything, "cuda": everything}, spec.name


def test_autocast_sentence_matches_the_policies():
    """"Autocast: `linear`, `conv2d` and the involution ops run in the autocast dtype (CPU and
    CUDA); `exp` runs in float32 under CUDA autocast and keeps its dtype under CPU autocast"."""
    section = " ".join(_ops_section().split())
    assert "Autocast: `linear`, `conv2d` and the involution ops run in the autocast dtype (CPU and CUDA);" in section
    assert "`exp` runs in float32 under CUDA autocast and keeps its dtype under CPU autocast" in section
    both = {"cpu": "lower_precision", "cuda": "lower_precision"}
    expected = {name: both for name in ("linear", "conv2d")}
    expected |= {spec.name: both for spec in _oplib_specs() if spec.name.startswith("involution")}
    expected["exp"] = {"cuda": "fp32"}
    assert {spec.name: dict(spec.autocast_policy) for spec in _oplib_specs()} == expected
