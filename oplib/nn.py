"""Modules over oplib ops, drop-in for their torch.nn counterparts: same constructor
arguments, parameter names and initialisation, so state dicts move both ways."""

from __future__ import annotations

import torch
from torch import Tensor

from . import functional as F


class Exp(torch.nn.Module):
    """y = e^x. input: any shape."""

    def forward(self, input: Tensor) -> Tensor:
        return F.exp(input)


class Linear(torch.nn.Linear):
    """``torch.nn.Linear`` computed by ``torch.ops.oplib.linear``. input: (*, in_features)."""

    def forward(self, input: Tensor) -> Tensor:
        return F.linear(input, self.weight, self.bias)


class Conv2d(torch.nn.Conv2d):
    """``torch.nn.Conv2d`` computed by ``torch.ops.oplib.conv2d``.
    input: (N, C, H, W) or (C, H, W)."""

    def forward(self, input: Tensor) -> Tensor:
        if self.padding_mode != "zeros":
            input = torch.nn.functional.pad(input, self._reversed_padding_repeated_twice, mode=self.padding_mode)
            return F.conv2d(input, self.weight, self.bias, self.stride, 0, self.dilation, self.groups)
        return F.conv2d(input, self.weight, self.bias, self.stride, self.padding, self.dilation, self.groups)


__all__ = ["Conv2d", "Exp", "Linear"]
