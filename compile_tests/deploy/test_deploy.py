"""``python -m oplib export``: the file is written, loaded back as a deployment would load it,
and checked against eager by the command itself; here it is loaded once more, at other batches
and sizes. ``--features-only`` (a backbone returning a list of maps) in each format, the
classifier in pt2 and ONNX, and ``oplib.deploy.export`` of a narrow backbone in the unit tier.
These are also the RedNet-26 ONNX round trips of the suite (tests/deploy/test_onnx.py exports
the ops and a layer): the command's export is ``oplib.onnx.export`` with a dynamic batch and
size, and a second export of the same network there took 100 s of the integration tier."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import oplib.deploy
import oplib.models
import oplib.onnx
from oplib._torch_private import aoti_load_package
from oplib.models import RedNetFeatures
from oplib.testing import with_batch_norm_statistics

ROOT = Path(__file__).resolve().parents[2]
FORMATS = ["pt2", pytest.param("aoti", marks=pytest.mark.needs_compiler), "onnx"]


def _export(fmt: str, out: Path, *extra: str) -> dict:
    result = subprocess.run(
        [sys.executable, "-m", "oplib", "export", "--depth", "26", "--format", fmt, "--size", "64", *extra, str(out)],
        capture_output=True, text=True, timeout=1800, cwd=ROOT,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


def _run_exported(fmt: str, path: Path, x: torch.Tensor) -> list[torch.Tensor]:
    """The file at ``path`` loaded as a deployment would load it, run on ``x``: its outputs."""
    if fmt == "onnx":
        return oplib.onnx.run(path, (x,))
    with torch.no_grad():
        if fmt == "aoti":
            got = aoti_load_package(str(path))(x)
        else:
            got = torch.export.load(path).module()(x)
    return [got] if isinstance(got, torch.Tensor) else list(got)


def _assert_close_to(got: list[torch.Tensor], expected: list[torch.Tensor]) -> None:
    """Each output within 1e-4 of its largest magnitude, as the command checks."""
    assert [g.shape for g in got] == [e.shape for e in expected]
    for g, e in zip(got, expected):
        assert float((g - e).abs().max()) <= 1e-4 * float(e.abs().max())


def _assert_matches_eager(fmt: str, path: Path, forward, shapes) -> None:
    """The file at ``path`` run on a random input of each of ``shapes`` (a dynamic batch and
    size): its outputs close to eager's ``forward`` (a tensor or a list of them)."""
    for shape in shapes:
        x = torch.randn(shape)
        with torch.no_grad():
            expected = forward(x)
        _assert_close_to(_run_exported(fmt, path, x), [expected] if isinstance(expected, torch.Tensor) else expected)


@pytest.mark.integration
@pytest.mark.parametrize("fmt", ["pt2", "onnx"])
def test_export_command_writes_a_checked_file(fmt, tmp_path):
    """The classifier in pt2 and ONNX. Its AOTInductor package is left to the backbone's test
    below: the command's aoti branch is the same code for both (export, package, load, compare),
    the backbone's list of maps is the harder output, and each AOTInductor build of RedNet-26
    took 3-4 minutes of the integration tier's CPU time here."""
    torch.manual_seed(0)
    weights = tmp_path / "weights.pth"
    model = oplib.models.rednet26().eval()
    torch.save(model.state_dict(), weights)
    out = tmp_path / ("rednet26-aoti.pt2" if fmt == "aoti" else f"rednet26.{fmt}")
    summary = _export(fmt, out, "--weights", str(weights))
    assert summary["format"] == fmt and out.is_file() and summary["relative_error"] <= 1e-4
    # Loaded again elsewhere, at other sizes and batches (dynamic; odd sides, whose stride-2
    # layers leave a last cell half outside, and a wide one): the same logits as eager.
    _assert_matches_eager(fmt, out, model, [(3, 3, 71, 90), (1, 3, 64, 64), (3, 3, 97, 81), (2, 3, 45, 224)])


@pytest.mark.integration
@pytest.mark.parametrize("fmt", FORMATS)
def test_export_command_writes_a_checked_backbone(fmt, tmp_path):
    """``--features-only --out-indices 0,2,4`` from a classifier's checkpoint (its head left
    out): the stem's, the second stage's and the last stage's maps, named ``features_<level>``
    in ONNX with a symbolic batch and size each, equal to eager's at other batches and sizes."""
    weights = tmp_path / "weights.pth"
    # Non-trivial BatchNorms: a fresh RedNet's blocks compute their shortcut alone in eval mode.
    model = with_batch_norm_statistics(oplib.models.rednet26()).eval()
    torch.save(model.state_dict(), weights)
    out = tmp_path / ("backbone-aoti.pt2" if fmt == "aoti" else f"backbone.{fmt}")
    summary = _export(fmt, out, "--weights", str(weights), "--features-only", "--out-indices", "0,2,4")
    assert summary["format"] == fmt and out.is_file() and summary["relative_error"] <= 1e-4
    assert summary["output_shapes"] == [[2, 64, 32, 32], [2, 512, 8, 8], [2, 2048, 2, 2]]
    if fmt == "onnx":
        import onnx

        outputs = onnx.load(out).graph.output
        assert [output.name for output in outputs] == ["features_0", "features_2", "features_4"]
        for output in outputs:
            batch, _, height, width = output.type.tensor_type.shape.dim
            assert batch.dim_param and height.dim_param and width.dim_param, output  # not fixed sizes
    # (1, 3, 33, 47): the smallest size the export allows, odd sides
    _assert_matches_eager(fmt, out, model.as_features((0, 2, 4)), [(3, 3, 71, 90), (1, 3, 33, 47)])


def test_backbone_exports_with_dynamic_batch_and_size(tmp_path):
    """A narrow features_only RedNet-26 through ``oplib.deploy.export`` (torch.export with a
    dynamic batch and image size, saved, loaded and checked once), loaded again: its four maps
    equal eager's at an odd size and an even one, other batches."""
    torch.manual_seed(0)
    model = with_batch_norm_statistics(oplib.models.rednet26(width=16, group_channels=8, features_only=True)).eval()
    path = tmp_path / "backbone.pt2"
    summary = oplib.deploy.export(model, torch.randn(2, 3, 48, 48), "pt2", path)
    assert summary["output_shapes"] == [[2, 64, 12, 12], [2, 128, 6, 6], [2, 256, 3, 3], [2, 512, 2, 2]]
    loaded = torch.export.load(path).module()
    for shape in [(1, 3, 33, 47), (3, 3, 64, 64)]:
        x = torch.randn(shape)
        with torch.no_grad():
            expected = model(x)
        got = loaded(x)
        assert [g.shape[1] for g in got] == model.feature_info.channels()
        torch.testing.assert_close(got, expected)


@pytest.mark.parametrize(
    "args,message",
    [(["--format", "onnx", "--size", "16", "x.onnx"], "--size: expected at least 33"),
     (["--format", "aoti", "x.aoti"], "must end in .pt2")],
)
def test_export_command_rejects_bad_arguments(args, message, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as exited:
        oplib.deploy.main(["--depth", "26", *args])
    assert exited.value.code == 2 and message in capsys.readouterr().err
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize(
    "args,message",
    [
        (["--features-only", "--out-indices", "1,5"], "argument --out-indices: levels must lie in [0, 5) (0: the stem"),
        (["--features-only", "--out-indices", "3,1"], "argument --out-indices: levels must be increasing, without repeats"),
        (["--features-only", "--out-indices", "2,2"], "argument --out-indices: levels must be increasing, without repeats"),
        (["--features-only", "--out-indices", "1,,2"], "argument --out-indices: expected comma-separated feature levels"),
        (["--features-only", "--out-indices", "stages"], "argument --out-indices: expected comma-separated feature levels"),
        (["--out-indices", "1,2"], "--out-indices: only with --features-only"),
        (["--features-only", "--num-classes", "10"], "--num-classes: a --features-only backbone has no classifier"),
    ],
)
def test_export_command_rejects_bad_backbone_arguments(args, message, tmp_path, capsys):
    out = tmp_path / "x.onnx"
    with pytest.raises(SystemExit) as exited:
        oplib.deploy.main(["--depth", "26", "--format", "onnx", *args, str(out)])
    assert exited.value.code == 2 and message in capsys.readouterr().err
    assert not out.exists()


def test_export_command_builds_the_backbone_asked_for(tmp_path, monkeypatch, capsys):
    """``--features-only`` hands ``export`` a RedNetFeatures of the levels asked for, with the
    classifier checkpoint's backbone loaded (the export itself: the integration tier)."""
    weights = tmp_path / "weights.pth"
    classifier = with_batch_norm_statistics(oplib.models.rednet26())
    torch.save(classifier.state_dict(), weights)
    exported = []
    monkeypatch.setattr(oplib.deploy, "export", lambda model, example, fmt, out: exported.append(model) or {"format": fmt})
    argv = ["--depth", "26", "--format", "pt2", "--weights", str(weights), "--features-only", "--out-indices", "1,-1"]
    assert oplib.deploy.main([*argv, str(tmp_path / "x.pt2")]) == 0
    (model,) = exported
    assert isinstance(model, RedNetFeatures) and model.out_indices == (1, 4) and len(model.stages) == 4
    backbone = {key: value for key, value in classifier.state_dict().items() if not key.startswith("classifier.")}
    torch.testing.assert_close(model.state_dict(), backbone, rtol=0, atol=0)
    assert json.loads(capsys.readouterr().out) == {"format": "pt2"}
