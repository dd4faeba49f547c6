"""The paper's reference RedNet (d-li14/involution: ``cls/mmcls/models/backbones/rednet.py``
under an mmcls ``ImageClassifier`` with a global-average-pooling neck and a linear head),
transcribed from plain torch.nn for the pretrained-weights tests. It follows the reference's
module names, so its ``state_dict()`` has a real checkpoint's keys, and its naive involution
(``nn.Unfold``, average pooling to floor(H / stride)): like the original it fails where a
stride-2 involution sees an odd size. It deliberately imports nothing from oplib.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

BLOCK_COUNTS = {26: (1, 2, 4, 1), 38: (2, 3, 5, 2), 50: (3, 4, 6, 3), 101: (3, 4, 23, 3), 152: (3, 8, 36, 3)}


class ConvModule(nn.Module):
    """mmcv's ConvModule as the reference configures it: conv (no bias when a norm follows)
    -> optional BatchNorm ``bn`` -> optional ReLU."""

    def __init__(self, in_channels, out_channels, kernel_size, stride=1, padding=0, norm=True, relu=True):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, kernel_size, stride, padding, bias=not norm)
        if norm:
            self.bn = nn.BatchNorm2d(out_channels)
        self.relu = nn.ReLU(inplace=True) if relu else None

    def forward(self, x: Tensor) -> Tensor:
        x = self.conv(x)
        if hasattr(self, "bn"):
            x = self.bn(x)
        return self.relu(x) if self.relu is not None else x


class NaiveInvolution(nn.Module):
    """The reference involution: kernels from (average-pooled) x through conv1 (1x1, BN, ReLU,
    C/4 channels) and conv2 (1x1 to G*K*K), applied to the K*K unfolded neighbourhoods; 16
    channels per group."""

    def __init__(self, channels: int, kernel_size: int, stride: int):
        super().__init__()
        self.channels, self.kernel_size, self.stride = channels, kernel_size, stride
        self.group_channels = 16
        self.groups = channels // self.group_channels
        self.conv1 = ConvModule(channels, channels // 4, 1)
        self.conv2 = ConvModule(channels // 4, kernel_size**2 * self.groups, 1, norm=False, relu=False)
        if stride > 1:
            self.avgpool = nn.AvgPool2d(stride, stride)
        self.unfold = nn.Unfold(kernel_size, 1, (kernel_size - 1) // 2, stride)

    def forward(self, x: Tensor) -> Tensor:
        weight = self.conv2(self.conv1(x if self.stride == 1 else self.avgpool(x)))
        n, _, height, width = weight.shape
        k2 = self.kernel_size**2
        weight = weight.view(n, self.groups, 1, k2, height, width)
        patches = self.unfold(x).view(n, self.groups, self.group_channels, k2, height, width)
        return (weight * patches).sum(dim=3).view(n, self.channels, height, width)


class Bottleneck(nn.Module):
    """conv1/bn1 (1x1) -> ReLU -> conv2 (7x7 involution, carrying the stride)/bn2 -> ReLU ->
    conv3/bn3 (1x1, 4x the width), + identity or downsample, -> ReLU."""

    def __init__(self, in_channels: int, out_channels: int, stride: int):
        super().__init__()
        mid = out_channels // 4
        self.conv1 = nn.Conv2d(in_channels, mid, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(mid)
        self.conv2 = NaiveInvolution(mid, 7, stride)
        self.bn2 = nn.BatchNorm2d(mid)
        self.conv3 = nn.Conv2d(mid, out_channels, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(out_channels)
        self.relu = nn.ReLU(inplace=True)
        self.downsample = None
        if stride != 1 or in_channels != out_channels:
            self.downsample = nn.Sequential(nn.Conv2d(in_channels, out_channels, 1, stride, bias=False), nn.BatchNorm2d(out_channels))

    def forward(self, x: Tensor) -> Tensor:
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        identity = x if self.downsample is None else self.downsample(x)
        return self.relu(out + identity)


class Backbone(nn.Module):
    """stem (3x3 s2 ConvModule, 3x3 involution, BN, ReLU, 3x3 ConvModule) -> 3x3 max pool s2 ->
    layer1..layer4 (first strides 1, 2, 2, 2)."""

    def __init__(self, depth: int):
        super().__init__()
        self.stem = nn.Sequential(
            ConvModule(3, 32, 3, 2, 1), NaiveInvolution(32, 3, 1), nn.BatchNorm2d(32), nn.ReLU(inplace=True), ConvModule(32, 64, 3, 1, 1)
        )
        self.maxpool = nn.MaxPool2d(3, 2, 1)
        channels = 64
        for index, count in enumerate(BLOCK_COUNTS[depth]):
            out_channels = 256 * 2**index
            blocks = []
            for block in range(count):
                blocks.append(Bottleneck(channels, out_channels, 2 if index > 0 and block == 0 else 1))
                channels = out_channels
            self.add_module(f"layer{index + 1}", nn.Sequential(*blocks))

    def forward(self, x: Tensor) -> Tensor:
        x = self.maxpool(self.stem(x))
        return self.layer4(self.layer3(self.layer2(self.layer1(x))))


class Head(nn.Module):
    def __init__(self, num_classes: int = 1000):
        super().__init__()
        self.fc = nn.Linear(2048, num_classes)


class ImageClassifier(nn.Module):
    """backbone -> global average pooling -> head.fc."""

    def __init__(self, depth: int):
        super().__init__()
        self.backbone = Backbone(depth)
        self.head = Head()

    def forward(self, x: Tensor) -> Tensor:
        return self.head.fc(self.backbone(x).mean(dim=(2, 3)))


def with_consistent_statistics(model: nn.Module, batch: Tensor, seed: int = 0) -> nn.Module:
    """Random BatchNorm affine parameters, and running statistics taken from ``batch``, so
    that in eval mode on that batch every layer sees inputs of about unit scale. (An
    involution is quadratic in its input: statistics from other inputs let the scale drift
    and compound from block to block.) Each residual branch's last BatchNorm scales by
    0.05-0.25, as in a trained RedNet, whose branches start at zero (zero_init_residual):
    with unit scales there, float32 rounding alone moves RedNet-50's logits by 1e-3."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, nn.BatchNorm2d):
                module.weight.uniform_(0.5, 1.5, generator=generator)
                module.bias.uniform_(-0.2, 0.2, generator=generator)
                module.momentum = 1.0  # the running statistics become the batch's
        for module in model.modules():  # the bottlenecks (PaddleClas's transcription's too)
            if isinstance(getattr(module, "bn3", None), nn.BatchNorm2d):
                module.bn3.weight.uniform_(0.05, 0.25, generator=generator)
        model.train()
        model(batch)
    return model.eval()
