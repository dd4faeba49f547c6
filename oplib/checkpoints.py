"""Loading RedNet weights: the paper's released checkpoints and oplib's own state dicts.

The paper's checkpoints (d-li14/involution, trained with mmclassification) are mmcls
checkpoints: a dict whose ``state_dict`` entry holds an ``ImageClassifier``'s weights, with
``meta`` beside it. Their keys follow the reference code's module names (mmcv's
``ConvModule`` -> ``.conv``/``.bn``, stages ``layer1``..``layer4``, a block's
``conv1/bn1/conv2/bn2/conv3/bn3/downsample``, an involution's ``conv1.conv``, ``conv1.bn``,
``conv2.conv``, the head ``head.fc``). ``convert_official_state_dict`` renames them to
oplib's, one to one and without touching a tensor.
"""

from __future__ import annotations

import os
import pickle
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Union

import torch
from torch import Tensor

StateDict = Mapping[str, Tensor]
Weights = Union[str, os.PathLike, StateDict]

# Applied in order to every key of the paper's checkpoints (after ``backbone.`` is dropped).
_OFFICIAL_RENAMES = (
    (r"^(head\.)?fc\.", "classifier."),
    (r"^layer(\d)\.", lambda m: f"stages.{int(m.group(1)) - 1}."),
    # the stem's ConvModules (conv -> BN -> ReLU) and its involution
    (r"^stem\.(0|4)\.conv\.", r"stem.\1.0."),
    (r"^stem\.(0|4)\.bn\.", r"stem.\1.1."),
    (r"^stem\.1\.conv1\.conv\.", "stem.1.reduce."),
    (r"^stem\.1\.conv1\.bn\.", "stem.1.norm."),
    (r"^stem\.1\.conv2\.conv\.", "stem.1.span."),
    # a bottleneck's involution, then its other parts
    (r"^(stages\.\d\.\d+)\.conv2\.conv1\.conv\.", r"\1.involution.reduce."),
    (r"^(stages\.\d\.\d+)\.conv2\.conv1\.bn\.", r"\1.involution.norm."),
    (r"^(stages\.\d\.\d+)\.conv2\.conv2\.conv\.", r"\1.involution.span."),
    (r"^(stages\.\d\.\d+)\.conv1\.", r"\1.reduce.0."),
    (r"^(stages\.\d\.\d+)\.bn1\.", r"\1.reduce.1."),
    (r"^(stages\.\d\.\d+)\.bn2\.", r"\1.involution_norm."),
    (r"^(stages\.\d\.\d+)\.conv3\.", r"\1.expand."),
    (r"^(stages\.\d\.\d+)\.bn3\.", r"\1.expand_norm."),
    (r"^(stages\.\d\.\d+)\.downsample\.", r"\1.shortcut."),
)
_COMPILED_RENAMES = tuple((re.compile(pattern), replacement) for pattern, replacement in _OFFICIAL_RENAMES)


def is_official_state_dict(state_dict: StateDict) -> bool:
    """Whether ``state_dict`` has the reference code's key names (prefixed or not)."""
    return any(re.match(r"^(backbone\.)?(layer\d|stem\.\d\.conv)", key) for key in state_dict)


def convert_official_state_dict(state_dict: StateDict) -> dict[str, Tensor]:
    """The paper's RedNet weights (mmcls key names, with or without the ``backbone.`` and
    ``head.`` prefixes) under oplib's key names, tensors untouched and in the same order.

        >>> convert_official_state_dict({"backbone.layer2.0.conv2.conv1.bn.weight": torch.ones(1)}).keys()
        dict_keys(['stages.1.0.involution.norm.weight'])
    """
    converted = {}
    for key, value in state_dict.items():
        new = key.removeprefix("backbone.")
        for pattern, replacement in _COMPILED_RENAMES:
            new = pattern.sub(replacement, new, count=1)
        if new in converted:
            raise ValueError(f"convert_official_state_dict: two keys map to {new!r} (the second is {key!r})")
        converted[new] = value
    return converted


def read_checkpoint(path: Union[str, os.PathLike]) -> dict:
    """Load a checkpoint file without running code from it: ``torch.load(weights_only=True)``,
    and where that refuses an object (an mmcls checkpoint's ``meta`` may hold, say, numpy
    values), a second load whose unpickler resolves only the globals weights_only allows and
    turns every other one into an inert placeholder; entries holding a placeholder are left
    out, the tensors kept. A file that is not a checkpoint raises ``ValueError``."""
    path = Path(path)
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as error:
        refused = error
    except (RuntimeError, EOFError, OSError, ValueError) as error:
        raise ValueError(f"cannot read {path} as a PyTorch checkpoint (truncated or not a checkpoint): {error}") from None
    try:
        checkpoint = torch.load(path, map_location="cpu", weights_only=False, pickle_module=_restricted_pickle)
    except Exception as error:  # noqa: BLE001  (reported with weights_only's refusal)
        raise ValueError(f"cannot read {path} safely ({error}); torch.load(weights_only=True) said: {refused}") from None
    return _drop_placeholders(checkpoint)


class _Placeholder:
    """Stands for a global that weights_only does not allow, and for whatever the pickle builds
    from it: calling it, giving it state or items, or asking it for an attribute does nothing
    but return another placeholder."""

    def __init__(self, *args, **kwargs):
        pass

    def __call__(self, *args, **kwargs):
        return _Placeholder()

    def __getattr__(self, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        return _Placeholder()

    def __setstate__(self, state):
        pass

    def __setitem__(self, key, value):
        pass


class _RestrictedUnpickler(pickle.Unpickler):
    """The standard unpickler with globals restricted to torch's weights_only allowlist (the
    "restricting globals" pattern of Python's pickle documentation)."""

    def find_class(self, module: str, name: str):
        from . import _torch_private

        return _torch_private.get_allowed_globals().get(f"{module}.{name}", _Placeholder)


class _restricted_pickle:  # noqa: N801  (stands in for the pickle module in torch.load)
    Unpickler = _RestrictedUnpickler
    __name__ = "oplib.checkpoints._restricted_pickle"

    @staticmethod
    def load(file, **kwargs):
        return _RestrictedUnpickler(file, **kwargs).load()


def _drop_placeholders(value):
    """``value`` without the dict entries that hold a placeholder."""
    if isinstance(value, dict):
        return {k: _drop_placeholders(v) for k, v in value.items() if not _holds_placeholder(v)}
    return value


def _holds_placeholder(value) -> bool:
    if isinstance(value, _Placeholder):
        return True
    if isinstance(value, (list, tuple)):
        return any(_holds_placeholder(v) for v in value)
    return False


def state_dict_of(weights: Weights) -> dict[str, Tensor]:
    """The model weights in ``weights``: a checkpoint file's path or a loaded dict, an mmcls
    checkpoint (``state_dict`` and ``meta``) or a bare state dict, with the paper's key names
    or oplib's; returned under oplib's key names."""
    checkpoint = read_checkpoint(weights) if isinstance(weights, (str, os.PathLike)) else weights
    if not isinstance(checkpoint, Mapping):
        raise ValueError(f"expected a checkpoint dict or a state dict, got {type(checkpoint).__name__}")
    state_dict = checkpoint.get("state_dict", checkpoint)
    if not isinstance(state_dict, Mapping) or not all(isinstance(v, Tensor) for v in state_dict.values()):
        raise ValueError("expected a state dict (names to tensors), or a checkpoint with one under 'state_dict'")
    return convert_official_state_dict(state_dict) if is_official_state_dict(state_dict) else dict(state_dict)


__all__ = ["convert_official_state_dict", "is_official_state_dict", "read_checkpoint", "state_dict_of"]
