"""PaddleClas's RedNet (``ppcls/arch/backbone/model_zoo/rednet.py``: the paper's architecture on
``paddle.vision.models.resnet``), transcribed to plain torch.nn for the PaddleClas-weights
tests, with Paddle's module names, so that ``paddle_state_dict()`` gives the keys, BatchNorm
names and layouts of a ``.pdparams`` file. It imports nothing from oplib.

What the transcription keeps of Paddle's model: the stem (Sequential of a conv/bn/activate
Sequential, an involution, BatchNorm2D, ReLU, another conv/bn/activate Sequential);
``resnet.BottleneckBlock`` (conv1/bn1, conv2 replaced by the involution, which carries the
stride, bn2, conv3/bn3, downsample = Sequential(1x1 conv with the stride, BN)); the involution
(conv1 = Sequential(conv, bn, activate), conv2 = Sequential(conv with bias), AvgPool2D(stride,
stride) before them where the stride is 2, ``unfold`` with padding (K - 1) // 2); a 3x3 max pool
(stride 2, padding 1), adaptive average pooling and ``fc``, whose weight Paddle stores [in, out].
"""

from __future__ import annotations

import pickle
from collections import OrderedDict
from pathlib import Path

import torch
from torch import Tensor, nn

LAYERS = {26: (1, 2, 4, 1), 38: (2, 3, 5, 2), 50: (3, 4, 6, 3), 101: (3, 4, 23, 3), 152: (3, 8, 36, 3)}


class Involution(nn.Module):
    def __init__(self, channels: int, kernel_size: int, stride: int):
        super().__init__()
        self.kernel_size, self.stride, self.channels = kernel_size, stride, channels
        self.group_channels = 16
        self.groups = channels // self.group_channels
        self.conv1 = nn.Sequential(OrderedDict(
            conv=nn.Conv2d(channels, channels // 4, 1, bias=False), bn=nn.BatchNorm2d(channels // 4), activate=nn.ReLU()
        ))  # fmt: skip
        self.conv2 = nn.Sequential(OrderedDict(conv=nn.Conv2d(channels // 4, kernel_size**2 * self.groups, 1)))
        if stride > 1:
            self.avgpool = nn.AvgPool2d(stride, stride)

    def forward(self, x: Tensor) -> Tensor:
        weight = self.conv2(self.conv1(x if self.stride == 1 else self.avgpool(x)))
        b, _, h, w = weight.shape
        weight = weight.reshape(b, self.groups, self.kernel_size**2, h, w).unsqueeze(2)
        out = nn.functional.unfold(x, self.kernel_size, 1, (self.kernel_size - 1) // 2, self.stride)
        out = out.reshape(b, self.groups, self.group_channels, self.kernel_size**2, h, w)
        return (weight * out).sum(dim=3).reshape(b, self.channels, h, w)


class BottleneckBlock(nn.Module):
    expansion = 4

    def __init__(self, inplanes: int, planes: int, stride: int = 1, downsample: nn.Module | None = None):
        super().__init__()
        width = planes
        self.conv1 = nn.Conv2d(inplanes, width, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.conv2 = Involution(width, 7, stride)
        self.bn2 = nn.BatchNorm2d(width)
        self.conv3 = nn.Conv2d(width, planes * self.expansion, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(planes * self.expansion)
        self.relu = nn.ReLU()
        self.downsample = downsample

    def forward(self, x: Tensor) -> Tensor:
        identity = x
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        if self.downsample is not None:
            identity = self.downsample(x)
        return self.relu(out + identity)


class RedNet(nn.Module):
    def __init__(self, depth: int, class_num: int = 1000):
        super().__init__()
        self.inplanes = 64
        self.stem = nn.Sequential(
            nn.Sequential(OrderedDict(conv=nn.Conv2d(3, 32, 3, 2, 1, bias=False), bn=nn.BatchNorm2d(32), activate=nn.ReLU())),
            Involution(32, 3, 1),
            nn.BatchNorm2d(32),
            nn.ReLU(),
            nn.Sequential(OrderedDict(conv=nn.Conv2d(32, 64, 3, 1, 1, bias=False), bn=nn.BatchNorm2d(64), activate=nn.ReLU())),
        )
        self.maxpool = nn.MaxPool2d(3, 2, 1)
        layers = LAYERS[depth]
        self.layer1 = self._make_layer(64, layers[0])
        self.layer2 = self._make_layer(128, layers[1], stride=2)
        self.layer3 = self._make_layer(256, layers[2], stride=2)
        self.layer4 = self._make_layer(512, layers[3], stride=2)
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.fc = nn.Linear(512 * BottleneckBlock.expansion, class_num)

    def _make_layer(self, planes: int, blocks: int, stride: int = 1) -> nn.Sequential:
        downsample = None
        if stride != 1 or self.inplanes != planes * BottleneckBlock.expansion:
            downsample = nn.Sequential(
                nn.Conv2d(self.inplanes, planes * BottleneckBlock.expansion, 1, stride=stride, bias=False),
                nn.BatchNorm2d(planes * BottleneckBlock.expansion),
            )
        layers = [BottleneckBlock(self.inplanes, planes, stride, downsample)]
        self.inplanes = planes * BottleneckBlock.expansion
        layers += [BottleneckBlock(self.inplanes, planes) for _ in range(1, blocks)]
        return nn.Sequential(*layers)

    def forward(self, x: Tensor) -> Tensor:
        x = self.maxpool(self.stem(x))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(torch.flatten(self.avgpool(x), 1))


def paddle_state_dict(model: RedNet) -> dict[str, Tensor]:
    """The model's parameters as Paddle names them: BatchNorm's ``_mean`` and ``_variance``, no
    ``num_batches_tracked``, the linear weight [in, out]."""
    named = {}
    for key, value in model.state_dict().items():
        if key.endswith("num_batches_tracked"):
            continue
        key = key.replace(".running_mean", "._mean").replace(".running_var", "._variance")
        named[key] = value.t() if key == "fc.weight" else value
    return named


def save_pdparams(state_dict: dict[str, Tensor], path: Path) -> Path:
    """``state_dict`` as ``paddle.save`` writes one: a protocol-4 pickle of names to numpy
    arrays, with Paddle's name table beside them."""
    saved = {key: value.detach().numpy().copy() for key, value in state_dict.items()}
    saved["StructuredToParameterName@@"] = {key: f"param_{i}" for i, key in enumerate(state_dict)}
    with open(path, "wb") as f:
        pickle.dump(saved, f, protocol=4)
    return path
