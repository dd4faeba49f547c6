"""The sizes one involution call is computed for, and what every strategy derives from them."""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import torch
from torch import Tensor


class Geometry(NamedTuple):
    """The sizes of a call, each a (height, width) pair of ints: hashable, so that a strategy
    is built once per geometry and reused by every call, forward and backward."""

    input_size: tuple[int, int]
    kernel_size: tuple[int, int]
    output_size: tuple[int, int]
    stride: tuple[int, int]
    padding: tuple[int, int]
    dilation: tuple[int, int]

    @classmethod
    def of_call(cls, input_size: Sequence[int], weight_shape: Sequence[int], stride, padding, dilation) -> Geometry:
        """The geometry of an op's arguments; weight_shape: (N, G, KH, KW, Ho, Wo).

        >>> Geometry.of_call((14, 14), (8, 4, 7, 7, 7, 7), [2, 2], [3, 3], [1, 1]).output_size
        (7, 7)
        """
        sizes = (input_size, weight_shape[2:4], weight_shape[4:6], stride, padding, dilation)
        return cls(*(tuple(int(value) for value in pair) for pair in sizes))


class ScalarSizes:
    """Base of the strategies that compute with the geometry's sizes one by one: height and
    width of the input, kh, kw (kernel), out_h, out_w (output), sh, sw (stride), ph, pw
    (padding) and dh, dw (dilation)."""

    def __init__(self, geometry: Geometry):
        (self.height, self.width), (self.kh, self.kw) = geometry.input_size, geometry.kernel_size
        (self.out_h, self.out_w), (self.sh, self.sw) = geometry.output_size, geometry.stride
        (self.ph, self.pw), (self.dh, self.dw) = geometry.padding, geometry.dilation


def tap_reads(geometry: Geometry) -> tuple[Tensor, Tensor, Tensor]:
    """For tap (a, b) at output pixel (i, j): the image row (KH, 1, Ho, 1) and column
    (1, KW, 1, Wo) it reads, and whether that is inside the image (KH, KW, Ho, Wo)."""
    (height, width), (kh, kw), (out_h, out_w) = geometry.input_size, geometry.kernel_size, geometry.output_size
    (sh, sw), (ph, pw), (dh, dw) = geometry.stride, geometry.padding, geometry.dilation
    rows = torch.arange(out_h).view(1, 1, out_h, 1) * sh - ph + torch.arange(kh).view(kh, 1, 1, 1) * dh
    cols = torch.arange(out_w).view(1, 1, 1, out_w) * sw - pw + torch.arange(kw).view(1, kw, 1, 1) * dw
    inside = ((rows >= 0) & (rows < height) & (cols >= 0) & (cols < width)).expand(kh, kw, out_h, out_w)
    return rows, cols, inside


def item_chunks(items: int, bytes_per_item: int, chunk_bytes: int) -> list[slice]:
    """Consecutive slices of ``items`` of about ``chunk_bytes`` each (at least one item).

    >>> item_chunks(5, bytes_per_item=100, chunk_bytes=250)
    [slice(0, 2, None), slice(2, 4, None), slice(4, 5, None)]
    """
    step = max(1, chunk_bytes // max(1, bytes_per_item))
    return [slice(start, min(items, start + step)) for start in range(0, items, step)]
