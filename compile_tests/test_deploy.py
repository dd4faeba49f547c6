"""``python -m oplib export``: each format is written, loaded back as a deployment would load
it, and checked against eager by the command itself; here the file is loaded once more in a
fresh process."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import oplib.models
import oplib.onnx

ROOT = Path(__file__).resolve().parents[1]


def _export(fmt: str, out: Path, *extra: str) -> dict:
    result = subprocess.run(
        [sys.executable, "-m", "oplib", "export", "--depth", "26", "--format", fmt, "--size", "64", *extra, str(out)],
        capture_output=True, text=True, timeout=1800, cwd=ROOT,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


@pytest.mark.integration
@pytest.mark.parametrize("fmt", ["pt2", pytest.param("aoti", marks=pytest.mark.needs_compiler), "onnx"])
def test_export_command_writes_a_checked_file(fmt, tmp_path):
    torch.manual_seed(0)
    weights = tmp_path / "weights.pth"
    model = oplib.models.rednet26().eval()
    torch.save(model.state_dict(), weights)
    out = tmp_path / ("rednet26-aoti.pt2" if fmt == "aoti" else f"rednet26.{fmt}")
    summary = _export(fmt, out, "--weights", str(weights))
    assert summary["format"] == fmt and out.is_file() and summary["relative_error"] <= 1e-4
    # Loaded again elsewhere, at another size and batch (dynamic): the same logits as eager.
    x = torch.randn(3, 3, 71, 90)
    with torch.no_grad():
        expected = model(x)
    if fmt == "onnx":
        got = oplib.onnx.run(out, (x,))[0]
    elif fmt == "aoti":
        got = torch._inductor.aoti_load_package(str(out))(x)
    else:
        got = torch.export.load(out).module()(x)
    assert float((got - expected).abs().max()) <= 1e-4 * float(expected.abs().max())


def test_export_command_rejects_bad_arguments(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "oplib", "export", "--depth", "26", "--format", "onnx", "--size", "16", str(tmp_path / "x.onnx")],
        capture_output=True, text=True, timeout=300, cwd=ROOT,
    )
    assert result.returncode == 2 and "--size: expected at least 33" in result.stderr
    result = subprocess.run(
        [sys.executable, "-m", "oplib", "export", "--depth", "26", "--format", "aoti", str(tmp_path / "x.aoti")],
        capture_output=True, text=True, timeout=300, cwd=ROOT,
    )
    assert result.returncode == 2 and "must end in .pt2" in result.stderr
