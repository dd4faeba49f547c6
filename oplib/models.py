"""RedNet (Li et al., CVPR 2021): ResNet-shaped backbones whose 3x3 convolutions are 7x7
involutions: oplib's ``Involution2d`` between torch.nn's convolutions, BatchNorms and linear head.

The architecture follows the paper's reference code (its mmcls ``RedNet`` with a
``GlobalAveragePooling`` neck and a linear head): the involution stem (3x3 conv stride 2 ->
3x3 involution -> BN -> ReLU -> 3x3 conv), a 3x3 max pool stride 2, four stages of
bottlenecks (1x1 conv -> 7x7 involution, stride on the involution -> 1x1 conv, expansion 4,
a 1x1 conv + BN shortcut where the shape changes), global average pooling and a linear
classifier. Initialisation as there: Kaiming normal (fan_out) for convolutions, BN weights 1
and the last BN of every bottleneck 0, the classifier N(0, 0.01).

The plain layers are torch.nn's, not ``oplib.nn.Conv2d``/``Linear`` (the same parameters, so
the same state dicts): under ``torch.compile`` with ``torch._inductor.config.freezing``,
inductor folds each BatchNorm into the convolution before it and the ReLU or residual add
after it into the convolution's kernel, which it cannot do through a custom op. The
involutions are oplib's op.

    input: (N, in_channels, H, W), any H, W >= 1 -> logits: (N, num_classes)

``rednet26(weights=...)`` and the other depths load weights: the paper's released ImageNet
checkpoints (mmcls files, renamed by ``oplib.checkpoints.convert_official_state_dict``) or an
oplib RedNet's ``state_dict()``.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor, nn

from ._compat import pooling_sizes_without_parity_guard
from .checkpoints import Weights, convert_official_state_dict, state_dict_of
from .nn import Involution2d

# The stem's max pool exports with a dynamic image size on every supported torch.
pooling_sizes_without_parity_guard()

BLOCK_COUNTS = {
    26: (1, 2, 4, 1),
    38: (2, 3, 5, 2),
    50: (3, 4, 6, 3),
    101: (3, 4, 23, 3),
    152: (3, 8, 36, 3),
}


def _conv_bn_relu(in_channels: int, out_channels: int, kernel_size: int, stride: int = 1) -> nn.Sequential:
    return nn.Sequential(
        nn.Conv2d(in_channels, out_channels, kernel_size, stride, kernel_size // 2, bias=False),
        nn.BatchNorm2d(out_channels),
        nn.ReLU(inplace=True),
    )


class Bottleneck(nn.Module):
    """1x1 conv -> BN -> ReLU -> KxK involution (carrying the stride) -> BN -> ReLU -> 1x1 conv
    -> BN, plus the shortcut, -> ReLU. input: (N, in_channels, H, W) -> (N, out_channels, Ho, Wo)."""

    expansion = 4

    def __init__(self, in_channels: int, out_channels: int, stride: int = 1, kernel_size: int = 7, group_channels: int = 16):
        super().__init__()
        mid = out_channels // self.expansion
        self.reduce = _conv_bn_relu(in_channels, mid, 1)
        self.involution = Involution2d(mid, kernel_size, stride, group_channels=group_channels)
        self.involution_norm = nn.BatchNorm2d(mid)
        self.expand = nn.Conv2d(mid, out_channels, 1, bias=False)
        self.expand_norm = nn.BatchNorm2d(out_channels)
        self.shortcut = None
        if stride != 1 or in_channels != out_channels:
            self.shortcut = nn.Sequential(nn.Conv2d(in_channels, out_channels, 1, stride, bias=False), nn.BatchNorm2d(out_channels))

    def forward(self, x: Tensor) -> Tensor:
        out = torch.relu(self.involution_norm(self.involution(self.reduce(x))))
        out = self.expand_norm(self.expand(out))
        identity = x if self.shortcut is None else self.shortcut(x)
        return torch.relu(out + identity)


class RedNet(nn.Module):
    """RedNet with ``block_counts`` bottlenecks in its four stages.

    width: the stem's output channels and the first stage's bottleneck width (64 in the
    paper); stage i has width * 2**i bottleneck channels and 4x that many outputs.
    group_channels: channels sharing one involution kernel (16 in the paper; narrow models
    need it to divide every involution's channels, the stem's width // 2 included).
    input: (N, in_channels, H, W) -> logits (N, num_classes).
    """

    def __init__(
        self,
        block_counts: Sequence[int],
        num_classes: int = 1000,
        in_channels: int = 3,
        width: int = 64,
        group_channels: int = 16,
        kernel_size: int = 7,
    ):
        super().__init__()
        if len(block_counts) != 4 or min(block_counts) < 1:
            raise ValueError(f"RedNet: expected four positive block counts, got {list(block_counts)}")
        if width % 2 or (width // 2) % group_channels:
            raise ValueError(
                f"RedNet: the stem's involution has width // 2 = {width // 2} channels, which group_channels "
                f"({group_channels}) must divide"
            )
        self.block_counts = tuple(block_counts)
        self.stem = nn.Sequential(
            _conv_bn_relu(in_channels, width // 2, 3, stride=2),
            Involution2d(width // 2, 3, 1, group_channels=group_channels),
            nn.BatchNorm2d(width // 2),
            nn.ReLU(inplace=True),
            _conv_bn_relu(width // 2, width, 3),
        )
        self.pool = nn.MaxPool2d(kernel_size=3, stride=2, padding=1)
        stages, channels = [], width
        for index, count in enumerate(block_counts):
            out_channels = width * 2**index * Bottleneck.expansion
            blocks = []
            for block in range(count):
                stride = 2 if index > 0 and block == 0 else 1
                blocks.append(Bottleneck(channels, out_channels, stride, kernel_size, group_channels))
                channels = out_channels
            stages.append(nn.Sequential(*blocks))
        self.stages = nn.Sequential(*stages)
        self.features = channels
        self.classifier = nn.Linear(channels, num_classes)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        for module in self.modules():
            if isinstance(module, nn.Conv2d):
                nn.init.kaiming_normal_(module.weight, mode="fan_out", nonlinearity="relu")
                if module.bias is not None:
                    nn.init.zeros_(module.bias)
            elif isinstance(module, nn.BatchNorm2d):
                nn.init.ones_(module.weight)
                nn.init.zeros_(module.bias)
        for module in self.modules():
            if isinstance(module, Bottleneck):
                # Every residual branch starts as zero, so each block starts as its shortcut.
                nn.init.zeros_(module.expand_norm.weight)
        nn.init.normal_(self.classifier.weight, std=0.01)
        nn.init.zeros_(self.classifier.bias)

    def forward_features(self, x: Tensor) -> Tensor:
        """(N, in_channels, H, W) -> pooled features (N, self.features)."""
        x = self.stages(self.pool(self.stem(x)))
        return x.mean(dim=(2, 3))

    def forward(self, x: Tensor) -> Tensor:
        return self.classifier(self.forward_features(x))


def _block_counts_of(state_dict) -> tuple[int, ...]:
    """The bottlenecks per stage that an oplib-named RedNet state dict holds."""
    counts = [0, 0, 0, 0]
    for key in state_dict:
        parts = key.split(".")
        if parts[0] == "stages" and len(parts) > 2 and parts[1].isdigit() and parts[2].isdigit() and int(parts[1]) < 4:
            counts[int(parts[1])] = max(counts[int(parts[1])], int(parts[2]) + 1)
    return tuple(counts)


def _first(keys, count: int = 3) -> str:
    keys = sorted(keys)
    shown = ", ".join(keys[:count])
    return shown + (f" and {len(keys) - count} more" if len(keys) > count else "")


def load_weights(model: RedNet, weights: Weights, name: str = "RedNet") -> RedNet:
    """Load ``weights`` (see ``oplib.checkpoints.state_dict_of``) into ``model``, strictly:
    every backbone tensor must be there with its shape, and nothing else. The classifier is
    loaded when the checkpoint has one of the model's size; a checkpoint without a head (a
    backbone-only one) or with another number of classes loads only into a model built with
    ``num_classes`` other than 1000, whose new head keeps its initialisation."""
    state_dict = state_dict_of(weights)
    expected = model.state_dict()
    head = {key for key in expected if key.startswith("classifier.")}
    missing, unexpected = set(expected) - head - set(state_dict), set(state_dict) - set(expected)
    if missing or unexpected:
        message = f"{name}: the checkpoint does not fit this model"
        if missing:
            message += f"; missing: {_first(missing)}"
        if unexpected:
            message += f"; unexpected: {_first(unexpected)}"
        fits = [depth for depth, counts in BLOCK_COUNTS.items() if counts == _block_counts_of(state_dict)]
        if fits:
            message += f"; its keys fit RedNet-{fits[0]}"
        raise ValueError(message)
    head_fits = all(key in state_dict and state_dict[key].shape == expected[key].shape for key in head)
    if not head_fits:
        if model.classifier.out_features == 1000:
            found = state_dict.get("classifier.weight")
            what = "no classifier" if found is None else f"a classifier of {found.shape[0]} classes"
            raise ValueError(
                f"{name}: the checkpoint has {what}; build the model with num_classes=N (N != 1000) to load "
                "its backbone under a new, freshly initialised head"
            )
        state_dict = {k: v for k, v in state_dict.items() if not k.startswith("classifier.")}
    try:
        model.load_state_dict(state_dict, strict=head_fits)
    except RuntimeError as error:  # shapes: another width, or another number of input channels
        raise ValueError(f"{name}: {error}") from None
    return model


def _rednet(depth: int, weights: Weights | None, kwargs) -> RedNet:
    model = RedNet(BLOCK_COUNTS[depth], **kwargs)
    return model if weights is None else load_weights(model, weights, f"RedNet-{depth}")


def rednet26(weights: Weights | None = None, **kwargs) -> RedNet:
    """RedNet-26: block counts (1, 2, 4, 1). ``weights``: a checkpoint path or a loaded dict
    (see ``load_weights``); keyword arguments go to ``RedNet``."""
    return _rednet(26, weights, kwargs)


def rednet38(weights: Weights | None = None, **kwargs) -> RedNet:
    """RedNet-38: block counts (2, 3, 5, 2). Arguments as ``rednet26``."""
    return _rednet(38, weights, kwargs)


def rednet50(weights: Weights | None = None, **kwargs) -> RedNet:
    """RedNet-50: block counts (3, 4, 6, 3). Arguments as ``rednet26``."""
    return _rednet(50, weights, kwargs)


def rednet101(weights: Weights | None = None, **kwargs) -> RedNet:
    """RedNet-101: block counts (3, 4, 23, 3). Arguments as ``rednet26``."""
    return _rednet(101, weights, kwargs)


def rednet152(weights: Weights | None = None, **kwargs) -> RedNet:
    """RedNet-152: block counts (3, 8, 36, 3). Arguments as ``rednet26``."""
    return _rednet(152, weights, kwargs)


def rednet(depth: int, weights: Weights | None = None, **kwargs) -> RedNet:
    """The RedNet of ``depth`` (26, 38, 50, 101 or 152); arguments as ``rednet26``."""
    if depth not in BLOCK_COUNTS:
        raise ValueError(f"RedNet: expected a depth in {sorted(BLOCK_COUNTS)}, got {depth}")
    return _rednet(depth, weights, kwargs)


__all__ = [
    "BLOCK_COUNTS",
    "Bottleneck",
    "RedNet",
    "convert_official_state_dict",
    "load_weights",
    "rednet",
    "rednet26",
    "rednet38",
    "rednet50",
    "rednet101",
    "rednet152",
]
