"""Loading RedNet weights: the paper's released checkpoints and oplib's own state dicts.

The paper's checkpoints (d-li14/involution, trained with mmclassification) are mmcls
checkpoints: a dict whose ``state_dict`` entry holds an ``ImageClassifier``'s weights, with
``meta`` beside it. Their keys follow the reference code's module names (mmcv's
``ConvModule`` -> ``.conv``/``.bn``, stages ``layer1``..``layer4``, a block's
``conv1/bn1/conv2/bn2/conv3/bn3/downsample``, an involution's ``conv1.conv``, ``conv1.bn``,
``conv2.conv``, the head ``head.fc``). ``convert_official_state_dict`` renames them to
oplib's, one to one and without touching a tensor.

PaddleClas's port of the same weights (``RedNet{26,38,50,101,152}_pretrained.pdparams``, the
copy still served) is a pickled dict of parameter names to numpy arrays, written by
``paddle.save``. Its model (``ppcls/arch/backbone/model_zoo/rednet.py``, the paper's
architecture on ``paddle.vision.models.resnet``) names its modules as the reference code does,
without the ``backbone.`` and ``head.`` prefixes; what differs is Paddle's: BatchNorm's
``_mean`` and ``_variance`` (and no ``num_batches_tracked``), and the linear head's weight
stored ``[in, out]``. ``read_pdparams`` reads such a file without Paddle and without numpy,
resolving only numpy's array and dtype constructors (to inert stand-ins) and refusing every
other global; ``convert_paddleclas_state_dict`` maps it.

What ``weights=`` accepts, the same in every entry point (``oplib.models.rednet*``,
``python -m oplib evaluate/predict/export --weights``, timm's ``pretrained=True``), is decided
by ``resolve_weights``, which reads and downloads nothing, so that a command refuses a bad
value before it builds a model or fetches a file.
"""

from __future__ import annotations

import argparse
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


# ---- PaddleClas's .pdparams ----------------------------------------------------------------

# paddle.save's bookkeeping entry beside the parameters: structured name -> Paddle's own name.
PADDLE_NAME_TABLE = "StructuredToParameterName@@"

# numpy's dtype codes (kind + item size) in a pickled array -> torch's dtype.
_NUMPY_DTYPES = {
    "f2": torch.float16, "f4": torch.float32, "f8": torch.float64, "i1": torch.int8, "i2": torch.int16,
    "i4": torch.int32, "i8": torch.int64, "u1": torch.uint8, "b1": torch.bool,
}  # fmt: skip


class _PickledDType:
    """Stands for ``numpy.dtype(spec, align, copy)``: keeps the code and, from its state, the byte order."""

    def __init__(self, spec, align=False, copy=True):
        self.code, self.byteorder = str(spec), "="

    def __setstate__(self, state):
        if not isinstance(state, tuple) or len(state) < 2 or state[2:5] != (None, None, None):
            raise pickle.UnpicklingError(f"a numpy dtype with fields or a subarray ({self.code}): not a parameter array")
        self.byteorder = state[1]


class _NdarrayType:
    """Stands for ``numpy.ndarray``, the class argument of ``_reconstruct``."""


class _PickledArray:
    """Stands for ``numpy.core.multiarray._reconstruct(ndarray, shape, typecode)``; its state
    (version, shape, dtype, fortran order, raw bytes) becomes a tensor in ``tensor()``."""

    def __init__(self, cls=None, shape=(0,), typecode=b"b"):
        if cls is not _NdarrayType:
            raise pickle.UnpicklingError("numpy's _reconstruct called with another class than ndarray")
        self.state = None

    def __setstate__(self, state):
        self.state = state

    def tensor(self) -> Tensor:
        if not isinstance(self.state, tuple) or len(self.state) != 5:
            raise pickle.UnpicklingError("a numpy array without the state of a plain array")
        _, shape, dtype, fortran, data = self.state
        if not isinstance(dtype, _PickledDType) or not isinstance(data, (bytes, bytearray)):
            raise pickle.UnpicklingError("a numpy array of objects, not of numbers")
        code = dtype.code.lstrip("<>=|")
        if code not in _NUMPY_DTYPES:
            raise pickle.UnpicklingError(f"a numpy array of dtype {dtype.code!r}, which oplib does not read")
        target = _NUMPY_DTYPES[code]
        raw = torch.frombuffer(bytearray(data), dtype=torch.uint8) if data else torch.empty(0, dtype=torch.uint8)
        size = torch.empty(0, dtype=target).element_size()
        if raw.numel() != size * int(torch.Size(shape).numel()):
            raise pickle.UnpicklingError(f"a numpy array of shape {tuple(shape)} with {raw.numel()} bytes of data")
        if dtype.byteorder == ">" and size > 1:  # stored big-endian: reverse each value's bytes
            raw = raw.view(-1, size).flip(1).reshape(-1)
        values = raw.view(target)
        if fortran:
            return values.reshape(tuple(reversed(shape))).permute(*reversed(range(len(shape)))).contiguous()
        return values.reshape(tuple(shape))


def _pickled_scalar(dtype: _PickledDType, data: bytes) -> _PickledArray:
    """Stands for ``numpy.core.multiarray.scalar(dtype, raw bytes)``: a 0-d array."""
    scalar = _PickledArray(_NdarrayType)
    scalar.__setstate__((1, (), dtype, False, data))
    return scalar


# The only globals a .pdparams pickle may name: numpy's array, scalar and dtype constructors
# (numpy 1 and 2 spell their module differently) and OrderedDict. Anything else is refused.
_PDPARAMS_GLOBALS = {
    "numpy.core.multiarray._reconstruct": _PickledArray,
    "numpy._core.multiarray._reconstruct": _PickledArray,
    "numpy.core.multiarray.scalar": _pickled_scalar,
    "numpy._core.multiarray.scalar": _pickled_scalar,
    "numpy.ndarray": _NdarrayType,
    "numpy.dtype": _PickledDType,
    "collections.OrderedDict": dict,
}


class _PdparamsUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str):
        found = _PDPARAMS_GLOBALS.get(f"{module}.{name}")
        if found is None:
            raise pickle.UnpicklingError(f"the file names {module}.{name}, which a .pdparams file of arrays never does")
        return found


def _tensors_of(value):
    """value with every array stand-in made a tensor (paddle.save may store a parameter as a
    (name, array) pair)."""
    if isinstance(value, _PickledArray):
        return value.tensor()
    if isinstance(value, dict):
        return {k: _tensors_of(v) for k, v in value.items()}
    if isinstance(value, tuple) and len(value) == 2 and isinstance(value[0], str) and isinstance(value[1], _PickledArray):
        return value[1].tensor()
    if isinstance(value, (list, tuple)):
        return type(value)(_tensors_of(v) for v in value)
    return value


def read_pdparams(path: Union[str, os.PathLike]) -> dict:
    """A ``.pdparams`` file (``paddle.save`` of a state dict) as a dict of tensors, without
    Paddle or numpy and without running code from the file: only numpy's array and dtype
    constructors resolve, to stand-ins that build tensors from the raw bytes. Anything else,
    a truncated file or one that is no pickle, raises ``ValueError``."""
    path = Path(path)
    try:
        with open(path, "rb") as f:
            loaded = _PdparamsUnpickler(f).load()
    except (pickle.UnpicklingError, EOFError, OSError, ValueError, TypeError, AttributeError, IndexError, KeyError) as error:
        raise ValueError(f"cannot read {path} as a PaddlePaddle .pdparams file (truncated, or not a state dict): {error}") from None
    if not isinstance(loaded, dict):
        raise ValueError(f"{path}: a .pdparams file holds a dict of parameters, this one a {type(loaded).__name__}")
    try:
        return _tensors_of(loaded)
    except pickle.UnpicklingError as error:
        raise ValueError(f"cannot read {path} as a PaddlePaddle .pdparams file: {error}") from None


def is_paddleclas_state_dict(state_dict: Mapping) -> bool:
    """Whether ``state_dict`` has Paddle's names (BatchNorm's ``_mean``/``_variance``, or
    paddle.save's name table)."""
    return PADDLE_NAME_TABLE in state_dict or any(key.endswith(("._mean", "._variance")) for key in state_dict)


def convert_paddleclas_state_dict(state_dict: Mapping) -> dict[str, Tensor]:
    """PaddleClas's RedNet weights under oplib's key names: Paddle's BatchNorm statistics
    renamed (``num_batches_tracked`` added as 0, which Paddle does not keep), the linear
    head's ``[in, out]`` weight transposed, then the reference code's module names mapped as
    ``convert_official_state_dict`` maps them.

        >>> sorted(convert_paddleclas_state_dict({"layer1.0.bn1._mean": torch.zeros(2)}))
        ['stages.0.0.reduce.1.num_batches_tracked', 'stages.0.0.reduce.1.running_mean']
    """
    torch_names: dict[str, Tensor] = {}
    for key, value in state_dict.items():
        if key == PADDLE_NAME_TABLE:
            continue
        if not isinstance(value, Tensor):
            raise ValueError(f"PaddleClas weights: {key!r} holds a {type(value).__name__}, not an array")
        if key.endswith("._mean"):
            key = key.removesuffix("._mean") + ".running_mean"
            torch_names[key.removesuffix("running_mean") + "num_batches_tracked"] = torch.tensor(0)
        elif key.endswith("._variance"):
            key = key.removesuffix("._variance") + ".running_var"
        elif key == "fc.weight":
            value = value.t().contiguous()  # Paddle's Linear: [in_features, out_features]
        torch_names[key] = value
    return convert_official_state_dict(torch_names)


def _read_weights_file(path: Path) -> dict:
    """A .pdparams file by its name; else a PyTorch checkpoint, where a file that is no
    PyTorch zip is first tried as a .pdparams pickle (which refuses a legacy PyTorch file's
    globals, so that file then goes to torch.load)."""
    if path.suffix == ".pdparams":
        return read_pdparams(path)
    try:
        with open(path, "rb") as f:
            is_zip = f.read(2) == b"PK"
    except OSError as error:
        raise ValueError(f"cannot read {path}: {error}") from None
    if not is_zip:
        try:
            return read_pdparams(path)
        except ValueError:
            pass
    return read_checkpoint(path)


def state_dict_of(weights: Weights) -> dict[str, Tensor]:
    """The model weights in ``weights``: a checkpoint file's path or a loaded dict, an mmcls
    checkpoint (``state_dict`` and ``meta``), PaddleClas's ``.pdparams`` or a bare state
    dict, with the paper's key names, Paddle's or oplib's; returned under oplib's key names."""
    checkpoint = _read_weights_file(Path(weights)) if isinstance(weights, (str, os.PathLike)) else weights
    if not isinstance(checkpoint, Mapping):
        raise ValueError(f"expected a checkpoint dict or a state dict, got {type(checkpoint).__name__}")
    if is_paddleclas_state_dict(checkpoint):
        return convert_paddleclas_state_dict(checkpoint)
    state_dict = checkpoint.get("state_dict", checkpoint)
    if not isinstance(state_dict, Mapping) or not all(isinstance(v, Tensor) for v in state_dict.values()):
        raise ValueError("expected a state dict (names to tensors), or a checkpoint with one under 'state_dict'")
    return convert_official_state_dict(state_dict) if is_official_state_dict(state_dict) else dict(state_dict)


# ---- What weights= accepts ------------------------------------------------------------------

# The named source: PaddleClas's ImageNet weights for the model's depth, downloaded once
# (oplib.models.PADDLECLAS_URLS). Its aliases are the idioms users bring from elsewhere:
# "imagenet" (Keras's weights="imagenet") and, from Python, True (torchvision's old and timm's
# pretrained=True). A name wins over a file of the same name, which loads as ./paddleclas.
PADDLECLAS = "paddleclas"
PRETRAINED_NAMES = (PADDLECLAS, "imagenet")


def accepted_weights(command_line: bool = False) -> str:
    """The values ``weights=`` accepts, as the error messages list them; ``command_line``: only
    those a command's ``--weights`` can spell (its text)."""
    spellings = [repr(name) for name in PRETRAINED_NAMES] + ([] if command_line else ["True"])
    accepted = [
        f"{', '.join(spellings[:-1])} or {spellings[-1]} (PaddleClas's ImageNet weights for the model's depth, downloaded once)",
        "the path of an existing file (a PaddleClas .pdparams, the paper's mmcls .pth checkpoint or an oplib state dict)",
    ]
    if not command_line:
        accepted = ["None or False (random initialisation)", *accepted, "a loaded state dict or checkpoint dict"]
    return "expected " + "; ".join(accepted)


def _resolve(weights, command_line: bool) -> Union[None, str, Path, Mapping]:
    """``resolve_weights``, its refusals listing ``accepted_weights(command_line)``."""
    if weights is None or weights is False:
        return None
    if weights is True or (isinstance(weights, str) and weights in PRETRAINED_NAMES):
        return PADDLECLAS
    if isinstance(weights, (str, os.PathLike)):
        path = Path(weights)
        if path.is_file():
            return path
        problem = f"{path} is a directory, not a file" if path.is_dir() else f"no file at {path}"
        raise FileNotFoundError(f"{problem}; {accepted_weights(command_line)}")
    if isinstance(weights, Mapping):
        return weights
    raise TypeError(f"weights: got a value of type {type(weights).__name__}; {accepted_weights(command_line)}")


def resolve_weights(weights) -> Union[None, str, Path, Mapping]:
    """What a ``weights=`` value stands for, without reading or downloading anything:

    - ``None`` or ``False`` -> ``None`` (random initialisation);
    - ``"paddleclas"``, ``"imagenet"`` or ``True`` -> ``PADDLECLAS`` (PaddleClas's ImageNet
      weights, which the model builder downloads once for its depth);
    - a path (``str`` or ``os.PathLike``) of an existing file -> that ``Path`` (a ``.pdparams``,
      the paper's mmcls ``.pth`` checkpoint or an oplib state dict: ``state_dict_of`` reads it);
    - a ``Mapping`` (a state dict or a checkpoint dict) -> itself (its content is checked when
      it loads).

    A path with no file raises ``FileNotFoundError``, any other type ``TypeError``, each
    message listing the accepted values (``accepted_weights()``). A resolved value resolves to
    itself."""
    return _resolve(weights, command_line=False)


def weights_argument(text: str) -> Union[str, Path]:
    """An argparse ``type`` for a command's ``--weights``: ``resolve_weights(text)``, refused
    with a one-line message listing what the command line accepts, so that the parser exits
    before any model is built or file fetched."""
    try:
        return _resolve(text, command_line=True)
    except FileNotFoundError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


__all__ = [
    "PADDLECLAS",
    "PRETRAINED_NAMES",
    "accepted_weights",
    "convert_official_state_dict",
    "is_official_state_dict",
    "read_checkpoint",
    "resolve_weights",
    "state_dict_of",
    "weights_argument",
]
