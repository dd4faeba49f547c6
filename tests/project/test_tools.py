"""The project's tools stay in step with the code they edit."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def test_every_planted_bug_still_finds_its_text():
    """tools/plant_bugs.py plants each bug by replacing a text of an op file; a text that an edit
    of the op removed (or made ambiguous) would make that bug unplantable. Found when the move
    of the involution ops to Rules and _bilinear left all 15 of their bugs unplantable."""
    spec = importlib.util.spec_from_file_location("plant_bugs", ROOT / "tools" / "plant_bugs.py")
    plant_bugs = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(plant_bugs)
    assert len(plant_bugs.BUGS) >= 30
    assert plant_bugs.check_bug_texts() == []


@pytest.mark.integration
def test_the_layer_phase_tool_runs_here_and_times_every_statement(tmp_path):
    """tools/cuda_layer_phases.py is run on a lent GPU with a minute to spare: here (the CPU,
    the kernels emulated) it must run end to end and time each of the layer table's statements
    (30 s: the integration tier's, as gpu-check's dry run is)."""
    import os
    import subprocess
    import sys

    result = subprocess.run([sys.executable, str(ROOT / "tools" / "cuda_layer_phases.py")], cwd=ROOT, capture_output=True,
                            text=True, env=dict(os.environ, OUT=str(tmp_path)), timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    lines = (tmp_path / "phases.txt").read_text().splitlines()
    sys.path.insert(0, str(ROOT / "bench"))
    import _cuda

    statements = len(_cuda.LAYER_CASES) * len(_cuda.LAYER_MODES) * len(_cuda.LAYER_PRECISIONS)
    assert sum("clock (capture)" in line for line in lines) == statements == 24, lines
