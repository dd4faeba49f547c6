"""CPU kernels of involution and its two backward ops, in plain PyTorch (no ``unfold``).

    out[n, c, i, j] = sum_{a, b} weight[n, c // (C/G), a, b, i, j] * input[n, c, i*sh - ph + a*dh, j*sw - pw + b*dw]

Two strategies, chosen per call by the size of the map (``uses_dense_map``):

- Small maps (H*W at most ``DENSE_MAP_MAX_PIXELS_PER_TAP`` times KH*KW, e.g. RedNet's 7x7 and
  14x14 stages): the op is a matrix product. For one (sample, group) the weight is a sparse
  (H*W, Ho*Wo) matrix M with at most KH*KW entries per column (``DenseMap``); then
  out = x @ M, grad_input = grad @ M^T and grad_weight is (x^T @ grad) read back at M's
  entries. Written out densely, M is at most that factor times the weight's size, and the
  products run as one ``bmm`` over the N*G (sample, group) pairs: a few large calls instead
  of K*K small ones, where the per-call cost would dominate.
- Larger maps: K*K elementwise passes over contiguous shifts of the padded input
  (``TapLayout``), on slices of the N*G pairs small enough to stay in cache.

Every result is a fresh contiguous tensor of the input's dtype; 16-bit inputs accumulate in
float32. No atomics and no reduction whose order depends on threads: results are
deterministic.
"""

from __future__ import annotations

import functools
import math
from typing import NamedTuple

import torch
from torch import Tensor

# A map is "small" when its pixels are at most this many times the kernel's taps: the dense
# matrix then holds at most this many times the weight's elements.
DENSE_MAP_MAX_PIXELS_PER_TAP = 4

# The elementwise passes work on slices of the N*G pairs of about this many bytes: big
# enough that each pass is one long loop, small enough to stay in the 1-2 MB L2.
CHUNK_BYTES = 1 << 21


def accumulation_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


def uses_dense_map(input_size, kernel_size) -> bool:
    return input_size[0] * input_size[1] <= DENSE_MAP_MAX_PIXELS_PER_TAP * kernel_size[0] * kernel_size[1]


def _slices(items: int, bytes_per_item: int):
    step = max(1, CHUNK_BYTES // max(1, bytes_per_item))
    return [slice(start, min(items, start + step)) for start in range(0, items, step)]


# ---------------------------------------------------------------------------------------
# Small maps: one matrix per (sample, group)
# ---------------------------------------------------------------------------------------


class DenseMap:
    """Where each weight element sits in the (H*W, Ho*Wo) matrix M of one (sample, group):
    weight[a, b, i, j] multiplies input pixel q = r*W + c (r = i*sh - ph + a*dh,
    c = j*sw - pw + b*dw) into output pixel p = i*Wo + j, so it is M[q, p]. Taps that read
    the zero padding have no entry. No two taps share an entry, so filling M is a plain copy.
    """

    def __init__(self, input_size, kernel_size, output_size, stride, padding, dilation):
        (height, width), (kh, kw), (out_h, out_w) = input_size, kernel_size, output_size
        (sh, sw), (ph, pw), (dh, dw) = stride, padding, dilation
        rows = torch.arange(out_h).view(1, 1, out_h, 1) * sh - ph + torch.arange(kh).view(kh, 1, 1, 1) * dh
        cols = torch.arange(out_w).view(1, 1, 1, out_w) * sw - pw + torch.arange(kw).view(1, kw, 1, 1) * dw
        inside = ((rows >= 0) & (rows < height) & (cols >= 0) & (cols < width)).expand(kh, kw, out_h, out_w)
        output_pixel = torch.arange(out_h * out_w).view(1, 1, out_h, out_w)
        entry = ((rows * width + cols) * (out_h * out_w) + output_pixel).expand(kh, kw, out_h, out_w)
        self.inputs, self.outputs = height * width, out_h * out_w
        self.weight_numel = kh * kw * out_h * out_w
        # Positions in the flattened (KH, KW, Ho, Wo) weight that read inside the image ...
        self.taps = inside.reshape(-1).nonzero().squeeze(1)
        # ... and their positions in the flattened (H*W, Ho*Wo) matrix.
        self.entries = entry.reshape(-1)[self.taps]

    def matrices(self, weight: Tensor) -> Tensor:
        """weight: (items, KH*KW*Ho*Wo) -> M: (items, H*W, Ho*Wo)."""
        matrix = weight.new_zeros(weight.shape[0], self.inputs * self.outputs)
        matrix.index_copy_(1, self.entries, weight.index_select(1, self.taps))
        return matrix.view(-1, self.inputs, self.outputs)

    def weight_of(self, matrix: Tensor) -> Tensor:
        """The adjoint of ``matrices``: M: (items, H*W, Ho*Wo) -> (items, KH*KW*Ho*Wo)."""
        matrix = matrix.reshape(matrix.shape[0], self.inputs * self.outputs)
        weight = matrix.new_zeros(matrix.shape[0], self.weight_numel)
        weight.index_copy_(1, self.taps, matrix.index_select(1, self.entries))
        return weight


@functools.lru_cache(maxsize=64)
def _dense_map(input_size, kernel_size, output_size, stride, padding, dilation) -> DenseMap:
    return DenseMap(input_size, kernel_size, output_size, stride, padding, dilation)


def _dense_map_for(input_size, weight_shape, stride, padding, dilation) -> DenseMap:
    as_ints = lambda values: tuple(int(v) for v in values)  # noqa: E731
    return _dense_map(
        as_ints(input_size),
        as_ints(weight_shape[2:4]),
        as_ints(weight_shape[4:6]),
        as_ints(stride),
        as_ints(padding),
        as_ints(dilation),
    )


# ---------------------------------------------------------------------------------------
# Larger maps: K*K passes over contiguous shifts
# ---------------------------------------------------------------------------------------


class TapClass(NamedTuple):
    """Taps weight[rows, cols] (slices of (KH, KW)), read from one phase of the buffer at
    ``offset`` + k * steps[0] + l * steps[1] for the (k, l)-th tap of the class."""

    rows: slice
    cols: slice
    phase: int
    offset: int
    counts: tuple[int, int]
    steps: tuple[int, int]


class TapLayout:
    """How the elementwise kernels see the zero-padded input: one view per kernel tap (a, b)
    holding, for every output pixel, the input value that tap reads, as a contiguous 1-D shift.

    The padded image is split into stride_h x stride_w phases (phase (p, q) holds the pixels
    at rows p, p + sh, ... and columns q, q + sw, ...), each flattened row by row with rows
    ``row`` long. Tap (a, b) reads phase (a*dh % sh, b*dw % sw) shifted by
    (a*dh // sh, b*dw // sw), so output m = i*row + j reads element m + offset of one phase:
    every pass is a long vectorised 1-D loop, at any stride. Outputs are computed on a grid
    ``row`` wide; its columns past Wo are discarded (row - Wo is at most about (K - 1) * d / s).
    """

    def __init__(self, input_size, weight_shape, stride, padding, dilation):
        (self.height, self.width), (self.ph, self.pw) = input_size, padding
        _, _, self.kh, self.kw, self.out_h, self.out_w = weight_shape
        (self.sh, self.sw), (self.dh, self.dw) = stride, dilation
        # The padded image, extended with zeros to whole phases.
        self.padded_h = -(-(self.height + 2 * self.ph) // self.sh) * self.sh
        self.padded_w = -(-(self.width + 2 * self.pw) // self.sw) * self.sw
        self.row = self.padded_w // self.sw
        self.length = self.out_h * self.row
        self.phase_rows = self.padded_h // self.sh
        self.taps = [
            (self._phase(a, b), (a * self.dh // self.sh) * self.row + b * self.dw // self.sw)
            for a in range(self.kh)
            for b in range(self.kw)
        ]
        # Rows of each phase buffer: the phase image plus what the largest shift reads past
        # it on the discarded columns.
        self.rows = max(self.phase_rows, -(-(max(offset for _, offset in self.taps) + self.length) // self.row))

    def _phase(self, a: int, b: int) -> int:
        return (a * self.dh % self.sh) * self.sw + b * self.dw % self.sw

    def _phase_blocks(self):
        """For each phase: (phase, first input row, first input column, its row and column
        in the phase buffer), for the phases that hold input pixels."""
        for p in range(self.sh):
            first_row = (p - self.ph) % self.sh
            for q in range(self.sw):
                first_col = (q - self.pw) % self.sw
                if first_row < self.height and first_col < self.width:
                    yield (
                        p * self.sw + q,
                        first_row,
                        first_col,
                        (first_row + self.ph) // self.sh,
                        (first_col + self.pw) // self.sw,
                    )

    def padded_input(self, input: Tensor, groups: int, dtype: torch.dtype) -> Tensor:
        """(N, C, H, W) -> the phase buffer (N*G, C/G, sh*sw, rows*row) in ``dtype``."""
        n, channels = input.shape[:2]
        image = input.reshape(n * groups, channels // groups, self.height, self.width)
        phases = image.new_zeros((n * groups, channels // groups, self.sh * self.sw, self.rows, self.row), dtype=dtype)
        for phase, row0, col0, buffer_row, buffer_col in self._phase_blocks():
            pixels = image[:, :, row0 :: self.sh, col0 :: self.sw]
            phases[:, :, phase, buffer_row : buffer_row + pixels.shape[2], buffer_col : buffer_col + pixels.shape[3]].copy_(pixels)
        return phases.view(n * groups, channels // groups, self.sh * self.sw, self.rows * self.row)

    def unpadded_into(self, phases: Tensor, out: Tensor) -> None:
        """The adjoint of ``padded_input``: phase buffer -> out (items, C/G, H, W)."""
        phases = phases.view(*phases.shape[:3], self.rows, self.row)
        for phase, row0, col0, buffer_row, buffer_col in self._phase_blocks():
            pixels = out[:, :, row0 :: self.sh, col0 :: self.sw]
            pixels.copy_(phases[:, :, phase, buffer_row : buffer_row + pixels.shape[2], buffer_col : buffer_col + pixels.shape[3]])

    def tap(self, phases: Tensor, t: int) -> Tensor:
        """The (items, C/G, length) view of the phase buffer that tap t reads."""
        phase, offset = self.taps[t]
        return phases[:, :, phase, offset : offset + self.length]

    def tap_classes(self) -> list[TapClass]:
        """The taps grouped so that each group is one strided view of one phase: taps
        (a0 + k*mh, b0 + l*mw) with m = s / gcd(s, d) share a phase and their offsets grow by
        fixed steps. A single group at stride 1."""
        mh, mw = self.sh // math.gcd(self.sh, self.dh), self.sw // math.gcd(self.sw, self.dw)
        return [
            TapClass(
                rows=slice(a0, None, mh),
                cols=slice(b0, None, mw),
                phase=self._phase(a0, b0),
                offset=(a0 * self.dh // self.sh) * self.row + b0 * self.dw // self.sw,
                counts=(len(range(a0, self.kh, mh)), len(range(b0, self.kw, mw))),
                steps=((mh * self.dh // self.sh) * self.row, mw * self.dw // self.sw),
            )
            for a0 in range(min(mh, self.kh))
            for b0 in range(min(mw, self.kw))
        ]

    def on_grid(self, per_pixel: Tensor, dtype: torch.dtype) -> Tensor:
        """(..., Ho, Wo) -> (..., length) in ``dtype``, zeros on the discarded columns."""
        grid = per_pixel.new_zeros((*per_pixel.shape[:-2], self.out_h, self.row), dtype=dtype)
        grid[..., : self.out_w].copy_(per_pixel)
        return grid.flatten(-2)

    def off_grid(self, on_grid: Tensor) -> Tensor:
        """(..., length) -> the (..., Ho, Wo) view of the kept columns."""
        return on_grid.unflatten(-1, (self.out_h, self.row))[..., : self.out_w]


# ---------------------------------------------------------------------------------------
# The three kernels
# ---------------------------------------------------------------------------------------


def involution(input: Tensor, weight: Tensor, stride, padding, dilation) -> Tensor:
    """input: (N, C, H, W), weight: (N, G, KH, KW, Ho, Wo) -> (N, C, Ho, Wo)."""
    n, channels, height, width = input.shape
    groups, out_h, out_w = weight.shape[1], weight.shape[4], weight.shape[5]
    items, per_group = n * groups, channels // groups
    acc = accumulation_dtype(input.dtype)
    if uses_dense_map((height, width), weight.shape[2:4]):
        dense = _dense_map_for((height, width), weight.shape, stride, padding, dilation)
        matrices = dense.matrices(weight.reshape(items, dense.weight_numel).to(acc))
        out = torch.bmm(input.reshape(items, per_group, dense.inputs).to(acc), matrices)
        return out.to(input.dtype).view(n, channels, out_h, out_w)

    layout = TapLayout((height, width), weight.shape, stride, padding, dilation)
    x = layout.padded_input(input, groups, acc)
    # (N*G, 1, K*K, length): one kernel per pixel, shared by the channels of a group.
    w = layout.on_grid(weight.reshape(items, 1, layout.kh * layout.kw, out_h, out_w), acc)
    out = torch.empty(items, per_group, layout.length, dtype=acc, device=input.device)
    for chunk in _slices(items, out.shape[1:].numel() * out.element_size()):
        out_chunk, x_chunk, w_chunk = out[chunk], x[chunk], w[chunk]
        torch.mul(layout.tap(x_chunk, 0), w_chunk[:, :, 0], out=out_chunk)
        for t in range(1, len(layout.taps)):
            out_chunk.addcmul_(layout.tap(x_chunk, t), w_chunk[:, :, t])
    result = torch.empty(n, channels, out_h, out_w, dtype=input.dtype, device=input.device)
    result.view(items, per_group, out_h, out_w).copy_(layout.off_grid(out))
    return result


def involution_backward_input(grad_output: Tensor, weight: Tensor, input_size, stride, padding, dilation) -> Tensor:
    """grad_output: (N, C, Ho, Wo), weight: (N, G, KH, KW, Ho, Wo) -> grad_input: (N, C, H, W)."""
    n, channels, out_h, out_w = grad_output.shape
    groups = weight.shape[1]
    items, per_group = n * groups, channels // groups
    acc = accumulation_dtype(grad_output.dtype)
    if uses_dense_map(input_size, weight.shape[2:4]):
        dense = _dense_map_for(input_size, weight.shape, stride, padding, dilation)
        matrices = dense.matrices(weight.reshape(items, dense.weight_numel).to(acc))
        grad = torch.bmm(grad_output.reshape(items, per_group, dense.outputs).to(acc), matrices.transpose(1, 2))
        return grad.to(grad_output.dtype).view(n, channels, *input_size)

    layout = TapLayout(input_size, weight.shape, stride, padding, dilation)
    g = layout.on_grid(grad_output.reshape(items, per_group, out_h, out_w), acc)
    w = layout.on_grid(weight.reshape(items, 1, layout.kh * layout.kw, out_h, out_w), acc)
    grad = torch.zeros(items, per_group, layout.sh * layout.sw, layout.rows * layout.row, dtype=acc, device=g.device)
    for chunk in _slices(items, grad.shape[1:].numel() * grad.element_size()):
        grad_chunk, g_chunk, w_chunk = grad[chunk], g[chunk], w[chunk]
        for t in range(len(layout.taps)):
            # Adjoint of the forward's read: add g * w back where tap t read from.
            layout.tap(grad_chunk, t).addcmul_(g_chunk, w_chunk[:, :, t])
    result = torch.empty(n, channels, *input_size, dtype=grad_output.dtype, device=g.device)
    layout.unpadded_into(grad, result.view(items, per_group, *input_size))
    return result


def involution_backward_weight(grad_output: Tensor, input: Tensor, kernel_size, stride, padding, dilation, groups) -> Tensor:
    """grad_output: (N, C, Ho, Wo), input: (N, C, H, W) -> grad_weight: (N, G, KH, KW, Ho, Wo)."""
    n, channels, out_h, out_w = grad_output.shape
    items, per_group = n * groups, channels // groups
    weight_shape = (n, groups, *kernel_size, out_h, out_w)
    acc = accumulation_dtype(input.dtype)
    if uses_dense_map(input.shape[2:], kernel_size):
        dense = _dense_map_for(input.shape[2:], weight_shape, stride, padding, dilation)
        x = input.reshape(items, per_group, dense.inputs).to(acc)
        products = torch.bmm(x.transpose(1, 2), grad_output.reshape(items, per_group, dense.outputs).to(acc))
        return dense.weight_of(products).to(input.dtype).view(weight_shape)

    layout = TapLayout(input.shape[2:], weight_shape, stride, padding, dilation)
    x = layout.padded_input(input, groups, acc)
    g = layout.on_grid(grad_output.reshape(items, per_group, out_h, out_w), acc)
    grad = torch.zeros(items, layout.kh, layout.kw, layout.length, dtype=acc, device=g.device)
    # dw[n, g, a, b, pixel] = sum over the group's channels c of g[c, pixel] * (what tap (a, b)
    # read from channel c): one pass per channel and tap class, each over all of its taps at
    # once through a strided view of the phase buffer.
    x_strides, tap_classes = x.stride(), layout.tap_classes()
    for chunk in _slices(items, grad.shape[1:].numel() * grad.element_size()):
        count = chunk.stop - chunk.start
        for taps in tap_classes:
            grad_taps = grad[chunk, taps.rows, taps.cols]
            for c in range(per_group):
                read = x.as_strided(
                    (count, *taps.counts, layout.length),
                    (x_strides[0], *taps.steps, 1),
                    x.storage_offset()
                    + chunk.start * x_strides[0]
                    + c * x_strides[1]
                    + taps.phase * x_strides[2]
                    + taps.offset,
                )
                grad_taps.addcmul_(read, g[chunk, c, None, None, :])
    result = torch.empty(weight_shape, dtype=input.dtype, device=g.device)
    result.view(items, layout.kh, layout.kw, out_h, out_w).copy_(layout.off_grid(grad))
    return result
