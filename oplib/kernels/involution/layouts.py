"""The memory formats of involution's results, the same on every device and in the fakes.

The output of the forward is channels_last when its input is, grad_input when grad_output
is, and grad_weight pixel-major, (N, Ho, Wo, G, KH, KW) in memory, when the input is
channels_last (the layout of a channels_last convolution's output viewed as the weight), so
that a channels_last model never copies. The ops allocate their results here, the fakes
return the same, and the backends write into them.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from ..._memory_format import is_channels_last


def result_like(activation: Tensor, size: Sequence[int]) -> Tensor:
    """An uninitialised (N, C, *size) result in ``activation``'s layout (channels_last where it
    is): what the fakes return and the kernels write into."""
    memory_format = torch.channels_last if is_channels_last(activation) else torch.contiguous_format
    shape = (activation.shape[0], activation.shape[1], *size)
    return torch.empty(shape, dtype=activation.dtype, device=activation.device, memory_format=memory_format)


def weight_result(like: Tensor, shape: Sequence[int], pixel_major: bool) -> Tensor:
    """An uninitialised (N, G, KH, KW, Ho, Wo) tensor, pixel-major in memory if asked."""
    if not pixel_major:
        return like.new_empty(shape)
    n, groups, kh, kw, out_h, out_w = shape
    return like.new_empty((n, out_h, out_w, groups, kh, kw)).permute(0, 3, 4, 5, 1, 2)


def is_pixel_major(weight: Tensor) -> bool:
    return weight.permute(0, 4, 5, 1, 2, 3).is_contiguous()


def as_pixel_major(weight: Tensor) -> Tensor:
    return weight if is_pixel_major(weight) else weight.permute(0, 4, 5, 1, 2, 3).contiguous().permute(0, 3, 4, 5, 1, 2)


def activation_in(activation: Tensor, channels_last: bool) -> Tensor:
    """``activation`` channels_last or contiguous, copied only where it is not already."""
    return activation.contiguous(memory_format=torch.channels_last) if channels_last else activation.contiguous()


def weight_in(weight: Tensor, pixel_major: bool) -> Tensor:
    """``weight`` pixel-major or contiguous, copied only where it is not already."""
    return as_pixel_major(weight) if pixel_major else weight.contiguous()
