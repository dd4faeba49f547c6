"""What ``weights=`` accepts, through every entry point: the Python builders
(``oplib.models.rednet26(weights=...)``, ``rednet(26, weights=...)``, ``load_weights``), the
commands' ``--weights``
(``python -m oplib evaluate``, ``predict``, ``export``, called as ``main(argv)``) and timm's
``pretrained=True``. Each accepted value loads the weights it names; each bad one is refused with
a message listing the accepted values, by a command before it builds a model or downloads.

Nothing is downloaded: ``oplib.download.cached_download`` is faked to hand back a local
``.pdparams`` file (written from the transcription of PaddleClas's model) and to record each URL
asked for. The commands' model builder is wrapped to keep the model it built and stop the command
there: what follows (evaluating, predicting, exporting) is tested elsewhere."""

from __future__ import annotations

import importlib.util
import re
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple, Optional

import numpy as np
import pytest
import torch
from PIL import Image

import oplib.models
import reference_paddleclas_rednet as paddle_ref
import reference_rednet
from oplib import deploy, download, imagenet
from oplib.checkpoints import accepted_weights
from oplib.download import DownloadError
from oplib.models import PADDLECLAS_URLS, rednets

DEPTH = 26
# oplib's name of the tensor that tells the sources apart (each source has its own seed).
FINGERPRINT = "stem.0.0.weight"


class Sources(NamedTuple):
    """The files and dicts the values point at, and the stem weight each one loads."""

    folder: Path
    served: Path  # what the faked download of weights="paddleclas" returns
    pdparams: Path  # a PaddleClas file passed by its path
    mmcls: Path  # the paper's mmcls checkpoint
    oplib: Path  # an oplib state dict
    mmcls_checkpoint: dict
    oplib_state_dict: dict
    fingerprints: dict[str, torch.Tensor]  # source name -> its FINGERPRINT tensor


@pytest.fixture(scope="module")
def sources(tmp_path_factory) -> Sources:
    folder = tmp_path_factory.mktemp("weights")
    torch.manual_seed(1)
    served = paddle_ref.RedNet(DEPTH)
    torch.manual_seed(2)
    local = paddle_ref.RedNet(DEPTH)
    torch.manual_seed(3)
    official = reference_rednet.ImageClassifier(DEPTH)
    torch.manual_seed(4)
    ours = oplib.models.rednet(DEPTH)
    mmcls_checkpoint = {"meta": {"epoch": 130}, "state_dict": official.state_dict()}
    torch.save(mmcls_checkpoint, folder / "rednet26.pth")
    torch.save(ours.state_dict(), folder / "oplib-rednet26.pth")
    (folder / "cache").mkdir()
    return Sources(
        folder=folder,
        served=paddle_ref.save_pdparams(paddle_ref.paddle_state_dict(served), folder / "cache" / "RedNet26_pretrained.pdparams"),
        pdparams=paddle_ref.save_pdparams(paddle_ref.paddle_state_dict(local), folder / "local.pdparams"),
        mmcls=folder / "rednet26.pth",
        oplib=folder / "oplib-rednet26.pth",
        mmcls_checkpoint=mmcls_checkpoint,
        oplib_state_dict=ours.state_dict(),
        fingerprints={
            "paddleclas": served.stem[0].conv.weight.detach(),
            "pdparams": local.stem[0].conv.weight.detach(),
            "mmcls": official.backbone.stem[0].conv.weight.detach(),
            "oplib": ours.stem[0][0].weight.detach(),
        },
    )


@pytest.fixture
def downloads(sources, monkeypatch) -> list[str]:
    """The URLs ``cached_download`` was asked for; each answered with ``sources.served``."""
    asked: list[str] = []

    def fake(url, *args, **kwargs):
        asked.append(url)
        return sources.served

    monkeypatch.setattr(download, "cached_download", fake)
    return asked


class Accepted(NamedTuple):
    name: str
    value: Callable[[Sources], object]  # the weights= value
    text: Optional[Callable[[Sources], str]]  # its --weights spelling; None: Python only
    loads: Optional[str]  # the source whose weights load (a key of Sources.fingerprints); None: random

    def urls(self) -> list[str]:
        """The downloads it asks for: the named source's file for the depth, once."""
        return [PADDLECLAS_URLS[DEPTH]] if self.loads == "paddleclas" else []


ACCEPTED = [
    Accepted("None", lambda s: None, None, None),
    Accepted("False", lambda s: False, None, None),
    Accepted("paddleclas", lambda s: "paddleclas", lambda s: "paddleclas", "paddleclas"),
    Accepted("imagenet", lambda s: "imagenet", lambda s: "imagenet", "paddleclas"),
    Accepted("True", lambda s: True, None, "paddleclas"),
    Accepted("pdparams-str", lambda s: str(s.pdparams), lambda s: str(s.pdparams), "pdparams"),
    Accepted("pdparams-Path", lambda s: s.pdparams, None, "pdparams"),
    Accepted("mmcls-file", lambda s: s.mmcls, lambda s: str(s.mmcls), "mmcls"),
    Accepted("oplib-file", lambda s: str(s.oplib), lambda s: str(s.oplib), "oplib"),
    Accepted("checkpoint-dict", lambda s: s.mmcls_checkpoint, None, "mmcls"),
    Accepted("state-dict", lambda s: s.oplib_state_dict, None, "oplib"),
]


class Refused(NamedTuple):
    name: str
    value: Callable[[Sources], object]
    text: Optional[Callable[[Sources], str]]
    error: type[Exception]
    message: str  # a regular expression for the start of the message


REFUSED = [
    Refused("missing-file", lambda s: s.folder / "missing.pth", lambda s: str(s.folder / "missing.pth"),
            FileNotFoundError, r"no file at .*missing\.pth; "),
    Refused("misspelt-name", lambda s: "paddleclass", lambda s: "paddleclass", FileNotFoundError, r"no file at paddleclass; "),
    Refused("other-name", lambda s: "resnet50", lambda s: "resnet50", FileNotFoundError, r"no file at resnet50; "),
    Refused("directory", lambda s: s.folder, lambda s: str(s.folder), FileNotFoundError, r".* is a directory, not a file; "),
    Refused("int", lambda s: 1, None, TypeError, r"weights: got a value of type int; "),
    Refused("list", lambda s: [1, 2], None, TypeError, r"weights: got a value of type list; "),
    Refused("bytes", lambda s: b"paddleclas", None, TypeError, r"weights: got a value of type bytes; "),
    Refused("tensor", lambda s: torch.zeros(1), None, TypeError, r"weights: got a value of type Tensor; "),
]


def _check_loaded(model: torch.nn.Module, sources: Sources, loads: Optional[str]) -> None:
    got = model.state_dict()[FINGERPRINT]
    matches = [name for name, fingerprint in sources.fingerprints.items() if torch.equal(got, fingerprint)]
    assert matches == ([loads] if loads else []), f"expected {loads or 'random'} weights, got {matches or 'random'}"


def _check_lists_the_accepted_values(message: str, command_line: bool) -> None:
    assert message.endswith(accepted_weights(command_line)), message
    # The list itself, spelt out: both names, files, and from Python the other kinds.
    for word in ("'paddleclas'", "'imagenet'", "path of an existing file", ".pdparams", "mmcls"):
        assert word in message
    for word in ("None or False", "True", "loaded state dict"):
        assert (word in message) != command_line, word


# ---- The Python API --------------------------------------------------------------------------

# name -> (weights, a RedNet-26 built beforehand, for load_weights) -> the model with the weights.
BUILDERS = {
    "rednet26": lambda weights, built: oplib.models.rednet26(weights=weights),
    "rednet(26)": lambda weights, built: oplib.models.rednet(DEPTH, weights=weights),
    "load_weights": lambda weights, built: oplib.models.load_weights(built, weights),
}


def _built_beforehand(builder: str) -> Optional[torch.nn.Module]:
    return oplib.models.rednet(DEPTH) if builder == "load_weights" else None


@pytest.mark.parametrize("builder", BUILDERS)
@pytest.mark.parametrize("case", ACCEPTED, ids=lambda c: c.name)
def test_the_builders_load_every_accepted_value(builder, case, sources, downloads):
    model = BUILDERS[builder](case.value(sources), _built_beforehand(builder))
    _check_loaded(model, sources, case.loads)
    assert downloads == case.urls()


@pytest.mark.parametrize("builder", BUILDERS)
@pytest.mark.parametrize("case", REFUSED, ids=lambda c: c.name)
def test_the_builders_refuse_a_bad_value_listing_the_accepted_ones(builder, case, sources, downloads, monkeypatch):
    def build(*args, **kwargs):
        raise AssertionError("a model was built for a bad weights value")

    built = _built_beforehand(builder)
    monkeypatch.setattr(rednets.RedNet, "__init__", build)
    with pytest.raises(case.error, match=case.message) as refused:
        BUILDERS[builder](case.value(sources), built)
    _check_lists_the_accepted_values(str(refused.value), command_line=False)
    assert downloads == []


def test_the_named_source_needs_a_published_depth(downloads):
    """"paddleclas" names a file per depth of the paper: a RedNet of other block counts has none."""
    model = oplib.models.RedNet((1, 1, 1, 1), width=16, group_channels=8)
    with pytest.raises(ValueError, match=r"weights=True: PaddleClas publishes weights for the paper's depths \[26, 38, 50, 101, 152\], not for block counts \[1, 1, 1, 1\]"):
        oplib.models.load_weights(model, True)
    assert downloads == []


# ---- The commands ----------------------------------------------------------------------------


class _Built(Exception):
    """Raised by the wrapped model builder once a command has built its model."""


class Command(NamedTuple):
    name: str
    main: Callable[[list[str]], int]
    module: object  # where the command looks up ``rednet``
    argv: Callable[[Path, list[str]], list[str]]  # (a folder of inputs, the --weights arguments) -> argv


COMMANDS = [
    Command("evaluate", imagenet.evaluate_main, imagenet,
            lambda inputs, weights: ["--depth", str(DEPTH), *weights, str(inputs / "val")]),
    Command("predict", imagenet.predict_main, imagenet,
            lambda inputs, weights: ["--depth", str(DEPTH), *weights, str(inputs / "val" / "n01440764" / "fish.png")]),
    Command("export", deploy.main, deploy,
            lambda inputs, weights: ["--depth", str(DEPTH), *weights, "--format", "pt2", str(inputs / "rednet26.pt2")]),
]


@pytest.fixture(scope="module")
def inputs(tmp_path_factory) -> Path:
    """An ImageNet-style folder of one class and one image (evaluate's and predict's input)."""
    root = tmp_path_factory.mktemp("inputs")
    (root / "val" / "n01440764").mkdir(parents=True)
    pixels = np.random.default_rng(0).integers(0, 256, (40, 48, 3), dtype=np.uint8)
    Image.fromarray(pixels).save(root / "val" / "n01440764" / "fish.png")
    return root


@pytest.fixture
def built(monkeypatch) -> list[torch.nn.Module]:
    """The models the commands build: their ``rednet`` wrapped to record the model and stop."""
    models: list[torch.nn.Module] = []

    def record(*args, **kwargs):
        models.append(oplib.models.rednet(*args, **kwargs))
        raise _Built

    for command in COMMANDS:
        monkeypatch.setattr(command.module, "rednet", record)
    return models


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: c.name)
@pytest.mark.parametrize("case", [c for c in ACCEPTED if c.text is not None], ids=lambda c: c.name)
def test_the_commands_load_every_value_they_can_spell(command, case, sources, inputs, downloads, built):
    with pytest.raises(_Built):
        command.main(command.argv(inputs, ["--weights", case.text(sources)]))
    (model,) = built
    _check_loaded(model, sources, case.loads)
    assert downloads == case.urls()


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: c.name)
@pytest.mark.parametrize("case", [c for c in REFUSED if c.text is not None], ids=lambda c: c.name)
def test_the_commands_refuse_a_bad_value_before_building_or_downloading(command, case, sources, inputs, downloads, built, capsys):
    with pytest.raises(SystemExit) as exited:
        command.main(command.argv(inputs, ["--weights", case.text(sources)]))
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    prefix = f"python -m oplib {command.name}: error: argument --weights: "
    (line,) = [line for line in err.splitlines() if line.startswith(prefix)]
    assert line == err.rstrip("\n").splitlines()[-1]  # one line, the last
    message = line.removeprefix(prefix)
    assert re.match(case.message, message), message
    _check_lists_the_accepted_values(message, command_line=True)
    assert built == [] and downloads == []


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: c.name)
def test_the_commands_report_a_failed_download_in_one_line(command, inputs, monkeypatch, capsys):
    def offline(url, *args, **kwargs):
        raise DownloadError(f"cannot reach {url} (refused). Fetch {url} by hand")

    monkeypatch.setattr(download, "cached_download", offline)
    with pytest.raises(SystemExit) as exited:
        command.main(command.argv(inputs, ["--weights", "imagenet"]))
    err = capsys.readouterr().err
    assert exited.value.code == 2 and "Traceback" not in err
    assert err.splitlines()[-1].endswith(f"error: cannot reach {PADDLECLAS_URLS[DEPTH]} (refused). Fetch {PADDLECLAS_URLS[DEPTH]} by hand")


def test_export_without_weights_is_random(sources, inputs, downloads, built):
    with pytest.raises(_Built):
        deploy.main(COMMANDS[2].argv(inputs, []))
    (model,) = built
    _check_loaded(model, sources, None)
    assert downloads == []


def test_evaluate_and_predict_require_weights(inputs, capsys):
    for command in COMMANDS[:2]:
        with pytest.raises(SystemExit) as exited:
            command.main(command.argv(inputs, []))
        assert exited.value.code == 2 and "the following arguments are required: --weights" in capsys.readouterr().err


# ---- timm ------------------------------------------------------------------------------------


def _timm_or_skip():
    if importlib.util.find_spec("timm") is None:
        pytest.skip("timm is not installed (the 'timm' extra): its pretrained=True is not testable here")
    try:
        import timm
    except Exception as error:  # present but broken, e.g. a torchvision built for another torch
        pytest.skip(f"timm does not import here ({type(error).__name__}: {error})")
    return timm


def test_timm_pretrained_takes_the_same_values(sources, downloads):
    timm = _timm_or_skip()
    _check_loaded(timm.create_model("rednet26", pretrained=True), sources, "paddleclas")
    assert downloads == [PADDLECLAS_URLS[DEPTH]]
    _check_loaded(timm.create_model("rednet26", pretrained=False), sources, None)
    for path, loads in ((sources.mmcls, "mmcls"), (sources.pdparams, "pdparams"), (sources.oplib, "oplib")):
        model = timm.create_model("rednet26", pretrained=True, pretrained_cfg_overlay=dict(file=str(path)))
        _check_loaded(model, sources, loads)
    assert len(downloads) == 1
    with pytest.raises(FileNotFoundError, match=r"no file at .*missing\.pth; ") as refused:
        timm.create_model("rednet26", pretrained=True, pretrained_cfg_overlay=dict(file=str(sources.folder / "missing.pth")))
    _check_lists_the_accepted_values(str(refused.value), command_line=False)
