"""Builders for specs: tensors in every memory layout, random sliding windows, and the
expected messages of error inputs."""

from __future__ import annotations

import re

import torch
from torch import Tensor

from ..registry import Draw

LAYOUTS = ("contiguous", "noncontiguous", "transposed", "channels_last")


def make(
    shape,
    device: str,
    dtype: torch.dtype,
    requires_grad: bool = False,
    layout: str = "contiguous",
    low: float = -2.0,
    high: float = 2.0,
) -> Tensor:
    """A random tensor of ``shape`` laid out as ``layout``; always a leaf.

    ``noncontiguous``: every other element of a larger buffer; ``transposed``: the last
    two dims swapped in memory; ``channels_last``: NHWC strides (4-D only).
    """
    shape = tuple(shape)
    if layout == "transposed" and len(shape) >= 2:
        swapped = (*shape[:-2], shape[-1], shape[-2])
        t = torch.testing.make_tensor(swapped, device=device, dtype=dtype, low=low, high=high).transpose(-1, -2)
    elif layout == "channels_last" and len(shape) == 4:
        t = torch.testing.make_tensor(shape, device=device, dtype=dtype, low=low, high=high)
        t = t.contiguous(memory_format=torch.channels_last)
    else:
        t = torch.testing.make_tensor(
            shape, device=device, dtype=dtype, low=low, high=high, noncontiguous=layout == "noncontiguous"
        )
    return t.detach().requires_grad_(requires_grad)


def draw_window(draw: Draw) -> tuple:
    """A random sliding window: kernel 1-4, stride 1-3, padding 0-2, dilation 1-2 per axis,
    and an input (H, W) of the smallest valid size plus a random margin, so every drawn
    case is a valid call. Returns (kernel, stride, padding, dilation, size), each a pair."""
    kernel = [draw(1, 4), draw(1, 4)]
    stride, padding, dilation = [draw(1, 3), draw(1, 3)], [draw(0, 2), draw(0, 2)], [draw(1, 2), draw(1, 2)]
    size = [max(1, dilation[a] * (kernel[a] - 1) + 1 - 2 * padding[a]) + draw(0, 6) for a in (0, 1)]
    return kernel, stride, padding, dilation, size


def expect_message(template: str, **fields) -> str:
    """A regex matching the whole message ``template`` (one of the ops' error templates)
    formats to with ``fields``, wherever it appears (tracing quotes it inside its own
    message): the wording is the op's, the values the test's."""
    return re.escape(template.format(**fields))
