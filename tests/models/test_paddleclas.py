"""PaddleClas's RedNet weights (``.pdparams``, the copy of the paper's weights still served):
the mapping proven without a download, against a transcription of PaddleClas's model
(``tests/models/reference_paddleclas_rednet.py``) given random weights; reading without Paddle or
numpy, and refusing anything but arrays; strict loading with clear errors."""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch

import oplib.models
import reference_paddleclas_rednet as paddle_ref
from oplib import checkpoints
from oplib.models import BLOCK_COUNTS, PADDLECLAS_URLS, PRETRAINED_CFGS
from reference_rednet import with_consistent_statistics

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("depth", sorted(BLOCK_COUNTS))
def test_the_mapping_covers_every_key_of_every_depth(depth):
    with torch.device("meta"):
        reference, ours = paddle_ref.RedNet(depth), oplib.models.rednet(depth)
    paddle = paddle_ref.paddle_state_dict(reference)
    converted = checkpoints.convert_paddleclas_state_dict(paddle)
    expected = ours.state_dict()
    assert set(converted) == set(expected)
    for key, value in converted.items():
        assert value.shape == expected[key].shape, key


def _reference(depth: int, size: int = 96):
    torch.manual_seed(depth)
    x = torch.randn(2, 3, size, size, dtype=torch.float64, generator=torch.Generator().manual_seed(size))
    return with_consistent_statistics(paddle_ref.RedNet(depth).double(), x), x


@pytest.mark.parametrize("depth", [26, 50])
def test_a_pdparams_file_gives_the_reference_logits(tmp_path, depth):
    """Eval mode, float64: oplib's RedNet loaded from the .pdparams file gives PaddleClas's
    model's logits to 1e-10 of their scale."""
    reference, x = _reference(depth)
    path = paddle_ref.save_pdparams(paddle_ref.paddle_state_dict(reference), tmp_path / f"RedNet{depth}_pretrained.pdparams")
    ours = oplib.models.rednet(depth).double()
    oplib.models.load_weights(ours, path)
    with torch.no_grad():
        expected, got = reference(x), ours.eval()(x)
    scale = expected.abs().max()
    assert 0 < scale < 1e4
    assert (got - expected).abs().max() <= 1e-10 * scale, float((got - expected).abs().max() / scale)


def test_reading_needs_neither_paddle_nor_numpy(tmp_path):
    """The reader resolves numpy's constructors to its own stand-ins: a process where numpy
    cannot be imported reads the file to the same tensors."""
    reference = paddle_ref.RedNet(26)
    state = paddle_ref.paddle_state_dict(reference)
    path = paddle_ref.save_pdparams(state, tmp_path / "RedNet26_pretrained.pdparams")
    script = textwrap.dedent(
        """
        import sys
        sys.modules["numpy"] = None  # any import of numpy now fails
        import torch
        from oplib.checkpoints import read_pdparams
        loaded = read_pdparams(sys.argv[1])
        torch.save({k: v for k, v in loaded.items() if isinstance(v, torch.Tensor)}, sys.argv[2])
        print("read", len(loaded))
        """
    )
    result = subprocess.run([sys.executable, "-c", script, str(path), str(tmp_path / "read.pt")], capture_output=True,
                            text=True, cwd=ROOT, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    read = torch.load(tmp_path / "read.pt")
    assert read.keys() == state.keys()
    for key, value in state.items():
        assert torch.equal(read[key], value), key


@pytest.mark.parametrize(
    "array",
    [
        np.arange(24, dtype=">f4").reshape(2, 3, 4),
        np.asfortranarray(np.arange(24, dtype="<f8").reshape(2, 3, 4)),
        np.arange(6, dtype=np.int64),
        np.array(3.5, dtype=np.float32),
        np.float64(2.25),
        np.zeros((0, 3), dtype=np.float16),
        np.array([True, False]),
    ],
    ids=["big-endian", "fortran", "int64", "0-d", "scalar", "empty", "bool"],
)
def test_arrays_read_as_numpy_wrote_them(tmp_path, array):
    path = tmp_path / "a.pdparams"
    path.write_bytes(pickle.dumps({"a": array}, protocol=4))
    got = checkpoints.read_pdparams(path)["a"]
    expected = np.asarray(array).astype(array.dtype.newbyteorder("="), order="C")
    assert got.shape == expected.shape
    assert torch.equal(got, torch.from_numpy(expected))


class _Payload:
    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def test_a_pdparams_file_naming_any_other_global_is_refused_unrun(tmp_path):
    marker = tmp_path / "ran"
    path = tmp_path / "evil.pdparams"
    path.write_bytes(pickle.dumps({"fc.weight": np.zeros(2), "x": _Payload(marker)}, protocol=4))
    with pytest.raises(ValueError, match=r"names posix\.system, which a \.pdparams file of arrays never does"):
        checkpoints.read_pdparams(path)
    assert not marker.exists()
    objects = tmp_path / "objects.pdparams"
    objects.write_bytes(pickle.dumps({"a": np.array([object()], dtype=object)}, protocol=4))
    with pytest.raises(ValueError, match=r"cannot read .*objects\.pdparams"):
        checkpoints.read_pdparams(objects)


@pytest.fixture(scope="module")
def rednet26_file(tmp_path_factory) -> Path:
    reference = paddle_ref.RedNet(26)
    return paddle_ref.save_pdparams(paddle_ref.paddle_state_dict(reference), tmp_path_factory.mktemp("pd") / "RedNet26_pretrained.pdparams")


def test_another_depths_file_is_refused_naming_the_keys(rednet26_file):
    with pytest.raises(ValueError, match=r"RedNet-50: the checkpoint does not fit this model; missing: .*its keys fit RedNet-26"):
        oplib.models.rednet50(weights=rednet26_file)


def test_a_truncated_file_is_a_clear_error(rednet26_file, tmp_path):
    truncated = tmp_path / "RedNet26_pretrained.pdparams"
    truncated.write_bytes(rednet26_file.read_bytes()[: rednet26_file.stat().st_size // 2])
    with pytest.raises(ValueError, match=r"cannot read .* as a PaddlePaddle \.pdparams file \(truncated, or not a state dict\)"):
        oplib.models.rednet26(weights=truncated)


def test_the_format_is_recognised_by_content_too(rednet26_file, tmp_path):
    renamed = tmp_path / "weights.bin"
    renamed.write_bytes(rednet26_file.read_bytes())
    by_name, by_content = oplib.models.rednet26(weights=rednet26_file), oplib.models.rednet26(weights=renamed)
    for (key, a), b in zip(by_name.state_dict().items(), by_content.state_dict().values()):
        assert torch.equal(a, b), key


def test_pretrained_cfg_records_both_sources():
    for depth, cfg in PRETRAINED_CFGS.items():
        assert cfg["url"] == PADDLECLAS_URLS[depth] and cfg["url"].endswith(f"/RedNet{depth}_pretrained.pdparams")
        assert set(cfg["sources"]) == {"paddleclas", "mmcls"}
        assert cfg["sources"]["paddleclas"]["top1"] == cfg["sources"]["mmcls"]["top1"] == cfg["top1"]
