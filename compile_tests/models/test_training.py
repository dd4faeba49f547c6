"""The training command: a compiled run writes everything it promises, resuming continues the
same run, and a 2-process torchrun (DistributedDataParallel on gloo) ends with the same
parameters as one process running the same global batches."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from oplib import train

TINY = ["--width", "8", "--group-channels", "4", "--blocks", "1,1,1,1", "--batch-size", "32", "--quiet"]


def _run(*args: str, launcher: list[str] | None = None, timeout: int = 600) -> subprocess.CompletedProcess:
    command = (launcher or [sys.executable, "-m"]) + ["oplib", "train", *args]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    result = subprocess.run(command, capture_output=True, text=True, timeout=timeout, env=env)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-5000:]
    return result


def _parameters(out: Path) -> dict[str, torch.Tensor]:
    state = torch.load(out / "checkpoint.pt", weights_only=False)["model"]
    return {name: value for name, value in state.items() if "running" not in name and "num_batches" not in name}


@pytest.mark.integration
def test_compiled_run_writes_checkpoint_curve_and_exported_program(tmp_path):
    result = _run("--out", str(tmp_path), "--epochs", "2", "--steps", "12", *TINY)
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["steps"] == 12
    assert summary["exported_test_accuracy"] == summary["test_accuracy"]
    assert (tmp_path / "curve.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    loaded = torch.export.load(tmp_path / "model.pt2").module()
    assert loaded(torch.randn(3, 1, 32, 32)).shape == (3, 10)
    assert "held-out accuracy" in result.stdout


def test_resume_continues_the_same_run(tmp_path):
    straight, split = tmp_path / "straight", tmp_path / "split"
    common = ["--epochs", "2", "--no-compile", "--no-export", *TINY]
    train.train(train.parse_args(["--out", str(straight), *common]))
    # 1437 // 32 = 44 steps per epoch: stop inside the second epoch, then resume.
    train.train(train.parse_args(["--out", str(split), *common, "--steps", "60"]))
    stopped = torch.load(split / "checkpoint.pt", weights_only=False)
    assert stopped["step"] == 60 and [h["epoch"] for h in stopped["history"]] == [1]
    train.train(train.parse_args(["--out", str(split), *common, "--resume"]))
    resumed = torch.load(split / "checkpoint.pt", weights_only=False)
    reference = torch.load(straight / "checkpoint.pt", weights_only=False)
    assert resumed["step"] == reference["step"] == 88
    assert [h["epoch"] for h in resumed["history"]] == [1, 2]
    for name, value in _parameters(straight).items():
        torch.testing.assert_close(_parameters(split)[name], value, rtol=0, atol=0)
    assert resumed["optimizer"]["state"].keys() == reference["optimizer"]["state"].keys()


@pytest.mark.integration
@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
def test_torchrun_ddp_matches_one_process_over_the_same_global_batches(tmp_path, compiled):
    # A few steps at a small learning rate: this tiny model's last stages normalise 1x1 maps
    # over 16 images, where BatchNorm of a near-constant channel multiplies float32 rounding
    # differences (compiled vs eager) by up to 1/sqrt(eps); the comparison stays in the regime
    # where such differences stay at rounding level.
    common = ["--epochs", "1", "--steps", "3", "--lr", "0.02", "--no-export", *TINY]
    mode = [] if compiled else ["--no-compile"]
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2", "-m"]
    _run("--out", str(tmp_path / "ddp"), *common, *mode, launcher=torchrun)
    # One process, eager, running each global batch as the two processes' shares.
    train.train(train.parse_args(["--out", str(tmp_path / "one"), *common, "--no-compile", "--emulate-world-size", "2"]))
    assert json.loads((tmp_path / "ddp" / "summary.json").read_text())["world_size"] == 2
    distributed, single = _parameters(tmp_path / "ddp"), _parameters(tmp_path / "one")
    assert distributed.keys() == single.keys()
    for name, value in single.items():
        torch.testing.assert_close(distributed[name], value, rtol=1e-4, atol=1e-5)
    # The runs really trained: the parameters moved away from their initial values.
    initial = train.build_model(train.parse_args(common)).state_dict()
    assert any(not torch.equal(initial[name], value) for name, value in single.items())
