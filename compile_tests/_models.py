"""Small models for the compile and export tests, each with a torch.nn twin."""

from __future__ import annotations

import torch
from torch import Tensor

import oplib


class _TorchExp(torch.nn.Module):
    def forward(self, x: Tensor) -> Tensor:
        return torch.exp(x)


class SmallNet(torch.nn.Module):
    """conv2d -> exp -> global mean -> linear. input: (N, 3, H, W) -> (N, 4).

    ``use_oplib=False`` builds the same network from torch.nn, with the same parameter
    names, so state dicts move between the two."""

    def __init__(self, use_oplib: bool = True):
        super().__init__()
        nn = oplib.nn if use_oplib else torch.nn
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.act = oplib.nn.Exp() if use_oplib else _TorchExp()
        self.fc = nn.Linear(8, 4)

    def forward(self, x: Tensor) -> Tensor:
        return self.fc(self.act(self.conv(x)).mean((-2, -1)))


class _PlainInvolution2d(oplib.nn.Involution2d):
    """The same layer with the unfold formulation: no oplib op (its 1x1 convs are torch.nn's)."""

    def forward(self, x: Tensor) -> Tensor:
        reference = oplib.registry.get("involution").reference
        return reference(x, self.kernel_weights(x), self.stride, self.padding, self.dilation)


class InvolutionNet(torch.nn.Module):
    """conv2d -> Involution2d (stride 2) -> global mean -> linear. input: (N, 3, H, W) -> (N, 4).

    ``use_oplib=False``: the same network from torch.nn and plain-torch involution."""

    def __init__(self, use_oplib: bool = True):
        super().__init__()
        nn = oplib.nn if use_oplib else torch.nn
        self.stem = nn.Conv2d(3, 16, 3, padding=1)
        involution = oplib.nn.Involution2d if use_oplib else _PlainInvolution2d
        self.involution = involution(16, kernel_size=3, stride=2, group_channels=4)
        self.fc = nn.Linear(16, 4)

    def forward(self, x: Tensor) -> Tensor:
        return self.fc(self.involution(self.stem(x)).mean((-2, -1)))
