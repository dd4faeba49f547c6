"""Pretrained RedNets without a download: a transcription of the paper's reference model
(tests/models/reference_rednet.py) with random weights, saved as an mmcls checkpoint, loads through
``weights=`` and gives the reference's outputs; the checkpoint errors; the ImageNet
preprocessing against a hand computation; ``evaluate`` and ``predict`` end to end."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

import oplib.models
from oplib import checkpoints, imagenet
from oplib.models import BLOCK_COUNTS

import reference_rednet

ROOT = Path(__file__).resolve().parents[2]


def _save_mmcls(model: reference_rednet.ImageClassifier, path: Path, **meta) -> Path:
    """``model`` as mmcls saves a checkpoint: ``meta`` beside ``state_dict``."""
    torch.save({"meta": {"epoch": 130, "CLASSES": ["tench", "goldfish"], **meta}, "state_dict": model.state_dict()}, path)
    return path


@pytest.mark.parametrize("depth", sorted(BLOCK_COUNTS))
def test_official_keys_map_one_to_one(depth):
    """Every key of the reference model renames to a key of oplib's, with the same shape."""
    with torch.device("meta"):
        official = reference_rednet.ImageClassifier(depth).state_dict()
        ours = getattr(oplib.models, f"rednet{depth}")().state_dict()
    converted = checkpoints.convert_official_state_dict(official)
    assert len(converted) == len(official)
    assert set(converted) == set(ours)
    for key, value in converted.items():
        assert value.shape == ours[key].shape, key


@pytest.fixture(scope="module", params=[(26, 224), (26, 223), (50, 224), (50, 223)], ids=lambda p: f"rednet{p[0]}-{p[1]}px")
def reference_checkpoint(request, tmp_path_factory):
    """(depth, reference model in float64, its mmcls checkpoint, the input its BatchNorm
    statistics come from). 223 px is odd and still runs in the reference: every stride-2
    involution sees an even size there."""
    depth, size = request.param
    torch.manual_seed(depth)
    x = torch.randn(2, 3, size, size, dtype=torch.float64, generator=torch.Generator().manual_seed(size))
    model = reference_rednet.with_consistent_statistics(reference_rednet.ImageClassifier(depth).double(), x)
    path = _save_mmcls(model, tmp_path_factory.mktemp("ckpt") / f"rednet{depth}.pth")
    return depth, model, path, x


@pytest.mark.integration
@pytest.mark.parametrize("dtype,rtol", [(torch.float64, 1e-10), (torch.float32, 1e-5)], ids=["float64", "float32"])
def test_pretrained_weights_give_the_reference_outputs(reference_checkpoint, dtype, rtol):
    """Eval mode, the same weights: oplib's logits equal the reference's."""
    depth, reference, path, x = reference_checkpoint
    # Built in the dtype first: loading a float64 checkpoint into float32 parameters rounds it.
    ours = oplib.models.load_weights(getattr(oplib.models, f"rednet{depth}")().to(dtype), path).eval()
    reference = reference.to(dtype)
    with torch.no_grad():
        expected, got = reference(x.to(dtype)), ours(x.to(dtype))
    reference.double()
    scale = expected.abs().max()
    assert 0 < scale < 1e4
    assert (got - expected).abs().max() <= rtol * scale, float((got - expected).abs().max() / scale)


@pytest.mark.integration
def test_odd_sizes_the_reference_cannot_run(reference_checkpoint):
    """At 225 px the reference's stride-2 involution pools to floor(H / 2) rows while its
    unfold yields ceil(H / 2): it fails; oplib runs (docs/models.md: "Pretrained models")."""
    depth, reference, path, _ = reference_checkpoint
    x = torch.randn(1, 3, 225, 225, dtype=torch.float64)
    with pytest.raises(RuntimeError):
        with torch.no_grad():
            reference(x)
    ours = getattr(oplib.models, f"rednet{depth}")(weights=path).double().eval()
    with torch.no_grad():
        assert ours(x).shape == (1, 1000)


def test_checkpoint_forms_all_load_the_same_weights(tmp_path):
    """The mmcls file, its bare state dict, without the backbone. prefix (fc. for the head),
    an oplib state dict, and a file whose meta holds objects weights_only refuses."""
    torch.manual_seed(0)
    official = reference_rednet.ImageClassifier(26).state_dict()
    expected = oplib.models.rednet26(weights={"state_dict": official}).state_dict()
    stripped = {k.removeprefix("backbone.").removeprefix("head."): v for k, v in official.items()}
    torch.save(official, tmp_path / "bare.pth")
    torch.save({"state_dict": official, "meta": {"numpy": np.float64(0.5), "array": np.zeros(2)}}, tmp_path / "numpy.pth")
    torch.save(expected, tmp_path / "oplib.pth")
    for weights in (official, stripped, tmp_path / "bare.pth", tmp_path / "numpy.pth", tmp_path / "oplib.pth", str(tmp_path / "oplib.pth")):
        loaded = oplib.models.rednet26(weights=weights).state_dict()
        assert loaded.keys() == expected.keys()
        assert all(torch.equal(loaded[k], expected[k]) for k in expected)


def test_safe_loading_runs_no_code_from_the_file(tmp_path):
    marker = tmp_path / "ran"

    class Payload:
        def __reduce__(self):
            return (Path.touch, (marker,))

    official = reference_rednet.ImageClassifier(26).state_dict()
    torch.save({"state_dict": official, "meta": {"payload": Payload()}}, tmp_path / "payload.pth")
    oplib.models.rednet26(weights=tmp_path / "payload.pth")
    assert not marker.exists()


def test_checkpoint_errors_are_clear(tmp_path):
    official = reference_rednet.ImageClassifier(26).state_dict()
    with pytest.raises(ValueError, match=r"RedNet-50: the checkpoint does not fit this model; missing: .*its keys fit RedNet-26"):
        oplib.models.rednet50(weights={"state_dict": official})
    path = _save_mmcls(reference_rednet.ImageClassifier(26), tmp_path / "full.pth")
    (tmp_path / "truncated.pth").write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    with pytest.raises(ValueError, match=r"truncated\.pth as a PyTorch checkpoint \(truncated or not a checkpoint\)"):
        oplib.models.rednet26(weights=tmp_path / "truncated.pth")
    with pytest.raises(ValueError, match=r"missing: stages\.0\.0\.expand\.weight, .* more; unexpected: conv1\.weight, fc\.weight$"):
        oplib.models.rednet26(weights={"conv1.weight": torch.zeros(64, 3, 7, 7), "fc.weight": torch.zeros(1000, 2048)})
    with pytest.raises(ValueError, match=r"unexpected: extra.weight"):
        oplib.models.rednet26(weights={**official, "extra.weight": torch.zeros(1)})
    backbone_only = {k: v for k, v in official.items() if not k.startswith("head.")}
    with pytest.raises(ValueError, match=r"the checkpoint has no classifier; build the model with num_classes=N"):
        oplib.models.rednet26(weights=backbone_only)
    head = oplib.models.rednet26(weights=backbone_only, num_classes=10).classifier
    assert head.out_features == 10
    with pytest.raises(TypeError, match=r"weights: got a value of type list; expected None or False"):
        oplib.models.rednet26(weights=[1, 2])
    torch.save([1, 2], tmp_path / "list.pth")
    with pytest.raises(ValueError, match=r"expected a checkpoint dict or a state dict, got list"):
        oplib.models.rednet26(weights=tmp_path / "list.pth")


def _bilinear_by_hand(image: torch.Tensor, height: int, width: int) -> torch.Tensor:
    """OpenCV's INTER_LINEAR written out pixel by pixel: source coordinate (i + 0.5) * scale
    - 0.5, clamped at the borders, weights from the fractional part."""
    channels, in_h, in_w = image.shape
    out = torch.empty(channels, height, width, dtype=torch.float64)
    for i in range(height):
        y = max((i + 0.5) * in_h / height - 0.5, 0.0)
        y0 = min(int(math.floor(y)), in_h - 1)
        y1, fy = min(y0 + 1, in_h - 1), y - math.floor(y)
        for j in range(width):
            x = max((j + 0.5) * in_w / width - 0.5, 0.0)
            x0 = min(int(math.floor(x)), in_w - 1)
            x1, fx = min(x0 + 1, in_w - 1), x - math.floor(x)
            for c in range(channels):
                p = image[c].double()
                top = p[y0, x0] * (1 - fx) + p[y0, x1] * fx
                bottom = p[y1, x0] * (1 - fx) + p[y1, x1] * fx
                out[c, i, j] = top * (1 - fy) + bottom * fy
    return out


def test_preprocessing_matches_a_hand_computation():
    """A 5x7 image, short side resized to 3 (so 3x4), a centred 2x2 crop, normalised."""
    image = torch.randint(0, 256, (3, 5, 7), dtype=torch.uint8, generator=torch.Generator().manual_seed(0))
    resized = imagenet.resize_short_side(image, 3)
    assert resized.shape == (3, 3, 4)  # int(3 * 7 / 5) = 4
    expected = _bilinear_by_hand(image, 3, 4).round().clamp(0, 255)
    assert torch.equal(resized.double(), expected)
    # Crop offsets: round((3 - 2) / 2) = 0 rows, round((4 - 2) / 2) = 1 column.
    out = imagenet.preprocess(image, resize=3, crop=2)
    crop = expected[:, 0:2, 1:3]
    mean = torch.tensor([123.675, 116.28, 103.53], dtype=torch.float64).view(3, 1, 1)
    std = torch.tensor([58.395, 57.12, 57.375], dtype=torch.float64).view(3, 1, 1)
    torch.testing.assert_close(out.double(), (crop - mean) / std, rtol=0, atol=1e-6)
    # A short side already at the size is not resampled.
    assert imagenet.resize_short_side(image, 5) is image


def test_class_names_are_the_1000_sorted_wordnet_ids():
    names = imagenet.class_names()
    assert len(names) == 1000
    assert [w for w, _ in names] == sorted(w for w, _ in names)
    assert names[0] == ("n01440764", "tench, Tinca tinca") and names[999][0] == "n15075141"


# ---------------------------------------------------------------------------------------
# The commands, on a small ImageNet-style folder
# ---------------------------------------------------------------------------------------

# Classes of the folder: (WordNet ID, its ImageNet index).
_FOLDER_CLASSES = (("n01440764", 0), ("n02123045", 281), ("n09472597", 980))


def _photographs() -> list[Path]:
    import sklearn.datasets

    images = Path(sklearn.datasets.__file__).parent / "images"
    return [images / "china.jpg", images / "flower.jpg"]


@pytest.fixture(scope="module")
def image_folder(tmp_path_factory) -> Path:
    """Two real photographs (scikit-learn's) and generated images of other sizes and formats,
    spread over three classes."""
    root = tmp_path_factory.mktemp("val")
    generator = np.random.default_rng(0)
    photos = _photographs()
    for k, (wnid, _) in enumerate(_FOLDER_CLASSES):
        folder = root / wnid
        folder.mkdir()
        if k < len(photos):
            (folder / photos[k].name).write_bytes(photos[k].read_bytes())
        for m, (height, width) in enumerate([(300, 260), (180, 420)]):
            pixels = generator.integers(0, 256, (height, width, 3), dtype=np.uint8)
            Image.fromarray(pixels).save(folder / f"generated_{m}.{'png' if m else 'jpg'}")
        (folder / "notes.txt").write_text("not an image")
    return root


@pytest.fixture(scope="module")
def biased_checkpoint(tmp_path_factory) -> Path:
    """A RedNet-26 checkpoint whose head prefers ImageNet classes 281, then 0, then 980 on every
    input, so the folder's accuracies are known and not zero."""
    torch.manual_seed(0)
    model = reference_rednet.ImageClassifier(26)
    with torch.no_grad():
        model.head.fc.weight.mul_(1e-3)
        model.head.fc.bias.zero_()
        for rank, index in enumerate((281, 0, 980)):
            model.head.fc.bias[index] = 30.0 - rank
    return _save_mmcls(model, tmp_path_factory.mktemp("ckpt") / "biased.pth")


def _run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "oplib", *args], capture_output=True, text=True, timeout=900, cwd=ROOT)


@pytest.mark.integration
def test_evaluate_reports_the_accuracy_recomputed_here(image_folder, biased_checkpoint):
    result = _run_cli("evaluate", "--depth", "26", "--weights", str(biased_checkpoint), str(image_folder), "--workers", "2", "--batch-size", "4")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout.strip().splitlines()[-1])
    # Recomputed without the command: the model on each preprocessed image.
    model = oplib.models.rednet26(weights=biased_checkpoint).eval()
    top1 = top5 = count = 0
    for wnid, index in _FOLDER_CLASSES:
        for path in sorted((image_folder / wnid).iterdir()):
            if path.suffix == ".txt":
                continue
            with torch.no_grad():
                best = model(imagenet.preprocess(imagenet.load_image(path))[None])[0].topk(5).indices.tolist()
            top1 += best[0] == index
            top5 += index in best
            count += 1
    assert report["images"] == count == 8
    assert report["top1"] == pytest.approx(top1 / count) and report["top5"] == pytest.approx(top5 / count)
    assert 0 < report["top1"] < report["top5"]  # 281 first, 0 and 980 in the top five
    limited = _run_cli("evaluate", "--depth", "26", "--weights", str(biased_checkpoint), str(image_folder), "--limit", "3", "--quiet", "--workers", "0")
    assert json.loads(limited.stdout.strip().splitlines()[-1])["images"] == 3


@pytest.mark.integration
def test_predict_prints_five_classes_per_photograph(biased_checkpoint):
    photos = [str(p) for p in _photographs()]
    result = _run_cli("predict", "--depth", "26", "--weights", str(biased_checkpoint), *photos, "--json")
    assert result.returncode == 0, result.stderr
    lines = [json.loads(line) for line in result.stdout.strip().splitlines()]
    model = oplib.models.rednet26(weights=biased_checkpoint).eval()
    for line, photo in zip(lines, photos, strict=True):
        assert line["image"] == photo and len(line["top5"]) == 5
        with torch.no_grad():
            probabilities = model(imagenet.preprocess(imagenet.load_image(photo))[None])[0].softmax(0)
        for entry in line["top5"]:
            assert entry["probability"] == pytest.approx(float(probabilities[entry["index"]]), rel=1e-5)
            assert (entry["wnid"], entry["name"]) == imagenet.class_names()[entry["index"]]
        # The five listed and the 995 others sum to 1.
        others = float(probabilities.sum()) - float(probabilities[[e["index"] for e in line["top5"]]].sum())
        assert sum(e["probability"] for e in line["top5"]) + others == pytest.approx(1.0, abs=1e-6)
        assert others >= -1e-6
        assert [e["index"] for e in line["top5"]][:3] == [281, 0, 980]
    table = _run_cli("predict", "--depth", "26", "--weights", str(biased_checkpoint), photos[0])
    assert table.returncode == 0 and "n02123045  tabby, tabby cat" in table.stdout


def test_commands_reject_bad_arguments(tmp_path, image_folder, capsys):
    """In this process (the commands' exit codes through ``python -m oplib`` itself: the
    evaluate tests above)."""
    from oplib import __main__ as cli

    def usage_error(*args: str) -> str:
        with pytest.raises(SystemExit) as exited:
            cli.main(list(args))
        assert exited.value.code == 2
        return capsys.readouterr().err

    assert "--weights: no file at" in usage_error("evaluate", "--depth", "26", "--weights", str(tmp_path / "none.pth"),
                                                  str(image_folder))
    (tmp_path / "not-imagenet").mkdir()
    (tmp_path / "not-imagenet" / "cats").mkdir()
    torch.save({}, tmp_path / "empty.pth")
    assert "named by its WordNet ID" in usage_error("evaluate", "--depth", "26", "--weights", str(tmp_path / "empty.pth"),
                                                    str(tmp_path / "not-imagenet"))
    assert "invalid choice: 27" in usage_error("predict", "--depth", "27", "--weights", "x", "y.jpg")
