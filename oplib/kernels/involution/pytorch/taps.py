"""Larger maps: involution as K*K elementwise passes over shifted views of the unpadded input."""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
from torch import Tensor

from .geometry import Geometry, ScalarSizes, item_chunks, tap_reads

# The forward and the input gradient work on slices of the N*G items whose accumulator is
# about this many bytes: big enough that a call's fixed cost is small against its work,
# small enough that the slice stays in cache across the K*K passes.
CHUNK_BYTES = 1 << 21
# The weight gradient's slices are larger: it makes one call per (channel, tap class) rather
# than per tap, over K*K values per pixel, and fewer, longer calls were faster at RedNet-50's
# shapes (compared by timing it at 2 MB and 8 MB).
WEIGHT_GRAD_CHUNK_BYTES = 1 << 23


class TapClass(NamedTuple):
    """Taps weight[rows, cols] (slices of (KH, KW)), read from one phase of the buffer at
    ``offset`` + k * steps[0] + l * steps[1] for the (k, l)-th tap of the class."""

    rows: slice
    cols: slice
    phase: int
    offset: int
    counts: tuple[int, int]
    steps: tuple[int, int]


class TapLayout(ScalarSizes):
    """How the elementwise passes see the input: for every kernel tap (a, b), one strided
    view of a buffer holding, at each output pixel's position, the input value that tap
    reads -- for all N*G (sample, group) items and all channels of a group at once.

    Each (sample, channel) image is split into stride_h x stride_w phases (phase (p, q) holds
    rows p, p + sh, ... and columns q, q + sw, ...), each stored at the top left of an
    item_rows x row block of ``pitch`` elements; the blocks follow the input's own (N, C)
    order, with ``head`` zeros in front and ``tail`` zeros after. Output pixel (i, j) sits at
    i * row + j of a block, and tap (a, b), reading image row i*sh + a*dh - ph and column
    j*sw + b*dw - pw, finds it in phase ((a*dh - ph) % sh, (b*dw - pw) % sw) at that
    position plus the offset ((a*dh - ph) // sh) * row + (b*dw - pw) // sw. A pass is one
    ``addcmul_`` over (items, C/G, pitch) with the tap's weight broadcast over the channels of
    a group. When the blocks are exactly the output (pitch = Ho*Wo, as in RedNet) the
    output, grad_output and weight are used in their own layout, without copies.

    There is no padding: a tap that would read it reads a neighbouring pixel, row, phase or
    image instead, and ``mask`` (1 where the tap reads the image, 0 where it reads padding)
    zeroes its weight.
    """

    name = "taps"
    # Every tap's product is computed (one that reads padding with its weight times zero), so
    # a non-finite value that meets that zero makes a nan in the result: it never drops out.
    drops_padding_taps = False

    def __init__(self, geometry: Geometry):
        super().__init__(geometry)
        self.phases = self.sh * self.sw
        self.item_rows = max(-(-self.height // self.sh), self.out_h)
        self.row = max(-(-self.width // self.sw), self.out_w)
        self.pitch = self.item_rows * self.row
        self.tight = self.pitch == self.out_h * self.out_w
        shifts = [self._shift(a, b) for a in range(self.kh) for b in range(self.kw)]
        self.head = max(0, -min(offset for _, offset in shifts))
        self.tail = max(0, max(offset for _, offset in shifts))
        self.taps = [(phase, self.head + offset) for phase, offset in shifts]
        inside = tap_reads(geometry)[2]
        self.mask = inside.reshape(-1, self.out_h, self.out_w)
        # When the phases fill their blocks exactly (H, W multiples of the stride, output no
        # bigger than a phase), the buffer is a permutation of each image's pixels: one
        # permuting copy (a plain copy at stride 1), much faster than a copy per phase; back
        # to the image, a gather of each pixel's position in the buffer is faster still.
        self.fills_blocks = self.pitch * self.phases == self.height * self.width
        if self.fills_blocks and self.phases > 1:
            positions = torch.arange(self.height * self.width).view(self.sh, self.sw, self.item_rows, self.row)
            self.image_order = positions.permute(2, 0, 3, 1).reshape(-1)

    def forward(self, input: Tensor, weight: Tensor) -> Tensor:
        """input: (N, C, H, W), weight: (N, G, KH, KW, Ho, Wo) -> out: (N, C, Ho, Wo)."""
        n, channels = input.shape[:2]
        items = n * weight.shape[1]
        per_group = channels // weight.shape[1]
        x = self._buffer(input)
        # (N*G, K*K, pitch): one kernel per pixel, shared by the channels of a group.
        w = self._to_grid(weight.reshape(items, self.kh * self.kw, self.out_h, self.out_w), masked=True)
        out = x.new_empty(items, per_group, self.pitch)
        for chunk in item_chunks(items, per_group * self.pitch * out.element_size(), CHUNK_BYTES):
            out_chunk = out[chunk]
            reads, tap_weights = self._tap_views(x, chunk, per_group), w[chunk].split(1, dim=1)
            torch.mul(reads[0], tap_weights[0], out=out_chunk)
            for read, tap_weight in zip(reads[1:], tap_weights[1:]):
                out_chunk.addcmul_(read, tap_weight)
        return self._output_pixels(out).view(n, channels, self.out_h, self.out_w)

    def backward_input(self, grad_output: Tensor, weight: Tensor) -> Tensor:
        """grad_output: (N, C, Ho, Wo), weight: (N, G, KH, KW, Ho, Wo) -> grad_input: (N, C, H, W)."""
        n, channels = grad_output.shape[:2]
        items = n * weight.shape[1]
        per_group = channels // weight.shape[1]
        g = self._to_grid(grad_output.reshape(items, per_group, self.out_h, self.out_w))
        w = self._to_grid(weight.reshape(items, self.kh * self.kw, self.out_h, self.out_w), masked=True)
        grad = self._new_buffer(n * channels, g.dtype, g.device, zeros=True)
        for chunk in item_chunks(items, per_group * self.pitch * grad.element_size(), CHUNK_BYTES):
            g_chunk = g[chunk]
            for write, tap_weight in zip(self._tap_views(grad, chunk, per_group), w[chunk].split(1, dim=1)):
                # Adjoint of the forward's read: add g * w back where the tap read from.
                write.addcmul_(g_chunk, tap_weight)
        image = g.new_empty(n, channels, self.height, self.width)
        self._image_into(grad, image)
        return image

    def backward_weight(self, grad_output: Tensor, input: Tensor, groups: int) -> Tensor:
        """grad_output: (N, C, Ho, Wo), input: (N, C, H, W) -> grad_weight: (N, G, KH, KW, Ho, Wo)."""
        n, channels = input.shape[:2]
        items, per_group, taps = n * groups, channels // groups, self.kh * self.kw
        x = self._buffer(input)
        g = self._to_grid(grad_output.reshape(items, per_group, self.out_h, self.out_w))
        grad = x.new_empty(items, taps, self.pitch)
        # dw[n, g, a, b, pixel] = sum over the group's channels c of g[c, pixel] * (what tap (a, b)
        # read from channel c): one pass per channel and tap class, each over all of its taps at
        # once through a strided view of the buffer.
        tap_classes = self._tap_classes()
        grad_by_tap = grad.view(items, self.kh, self.kw, self.pitch)
        for chunk in item_chunks(items, taps * self.pitch * grad.element_size(), WEIGHT_GRAD_CHUNK_BYTES):
            g_channels = g[chunk, :, None, None, :].unbind(1)
            for taps_of in tap_classes:
                grad_taps = grad_by_tap[chunk, taps_of.rows, taps_of.cols]
                reads = self._taps_read(x, taps_of, chunk, per_group)
                torch.mul(reads[0], g_channels[0], out=grad_taps)
                for read, g_channel in zip(reads[1:], g_channels[1:]):
                    grad_taps.addcmul_(read, g_channel)
        # Taps that read the padding have no gradient: the mask zeroes what they read instead.
        grad_pixels = self._output_pixels(grad).mul_(self.mask.to(grad.dtype))
        return grad_pixels.view(n, groups, self.kh, self.kw, self.out_h, self.out_w)

    def _shift(self, a: int, b: int) -> tuple[int, int]:
        """(phase, offset from the output position) of tap (a, b)."""
        row, col = a * self.dh - self.ph, b * self.dw - self.pw
        return (row % self.sh) * self.sw + col % self.sw, (row // self.sh) * self.row + col // self.sw

    def _phase_blocks(self):
        """For each phase that holds pixels: (phase, its first image row, first column)."""
        for p in range(min(self.sh, self.height)):
            for q in range(min(self.sw, self.width)):
                yield p * self.sw + q, p, q

    def _body(self, flat: Tensor, images: int) -> Tensor:
        """The (images, phases, pitch) view of a buffer, between its head and tail."""
        return flat[self.head : self.head + images * self.phases * self.pitch].view(images, self.phases, self.pitch)

    def _new_buffer(self, images: int, dtype: torch.dtype, device, zeros: bool = False) -> Tensor:
        """A flat buffer (head + images*phases*pitch + tail) for ``images`` (sample, channel) pairs."""
        numel = self.head + images * self.phases * self.pitch + self.tail
        return (torch.zeros if zeros else torch.empty)(numel, dtype=dtype, device=device)

    def _buffer(self, input: Tensor) -> Tensor:
        """(N, C, H, W) -> the flat buffer (head + N*C*phases*pitch + tail)."""
        images = input.shape[0] * input.shape[1]
        flat = self._new_buffer(images, input.dtype, input.device)
        body = self._body(flat, images)
        if self.fills_blocks:
            flat[: self.head].zero_()
            flat[self.head + body.numel() :].zero_()
            image = input.reshape(images, self.item_rows, self.sh, self.row, self.sw)
            body.view(images, self.sh, self.sw, self.item_rows, self.row).copy_(image.permute(0, 2, 4, 1, 3))
            return flat
        flat.zero_()
        image = input.reshape(images, self.height, self.width)
        blocks = body.view(images, self.phases, self.item_rows, self.row)
        for phase, row0, col0 in self._phase_blocks():
            pixels = image[:, row0 :: self.sh, col0 :: self.sw]
            blocks[:, phase, : pixels.shape[1], : pixels.shape[2]].copy_(pixels)
        return flat

    def _image_into(self, flat: Tensor, out: Tensor) -> None:
        """The adjoint of ``_buffer``: buffer -> out (N, C, H, W), contiguous."""
        images = out.shape[0] * out.shape[1]
        body = self._body(flat, images)
        if self.fills_blocks:
            pixels = out.view(images, self.height * self.width)
            if self.phases == 1:
                pixels.copy_(body.view(images, self.height * self.width))
            else:
                torch.index_select(body.view(images, self.height * self.width), 1, self.image_order, out=pixels)
            return
        image = out.view(images, self.height, self.width)
        blocks = body.view(images, self.phases, self.item_rows, self.row)
        for phase, row0, col0 in self._phase_blocks():
            pixels = image[:, row0 :: self.sh, col0 :: self.sw]
            pixels.copy_(blocks[:, phase, : pixels.shape[1], : pixels.shape[2]])

    def _tap_views(self, flat: Tensor, items: slice, per_group: int) -> list[Tensor]:
        """For each tap, the (len(items), C/G, pitch) view of the buffer it reads for
        ``items`` (built in one go: per-view Python overhead adds up over K*K passes)."""
        item_stride = per_group * self.phases * self.pitch
        size, stride = (items.stop - items.start, per_group, self.pitch), (item_stride, self.phases * self.pitch, 1)
        first = flat.storage_offset() + items.start * item_stride
        return [flat.as_strided(size, stride, first + phase * self.pitch + offset) for phase, offset in self.taps]

    def _taps_read(self, flat: Tensor, taps: TapClass, items: slice, per_group: int) -> list[Tensor]:
        """For each channel of the group, the (len(items), rows, cols, pitch) view of what a
        class of taps reads from it for ``items``."""
        item_stride = per_group * self.phases * self.pitch
        size, stride = (items.stop - items.start, *taps.counts, self.pitch), (item_stride, *taps.steps, 1)
        first = flat.storage_offset() + items.start * item_stride + taps.phase * self.pitch + taps.offset
        return [flat.as_strided(size, stride, first + c * self.phases * self.pitch) for c in range(per_group)]

    def _tap_classes(self) -> list[TapClass]:
        """The taps grouped so that each group is one strided view of one phase: taps
        (a0 + k*mh, b0 + l*mw) with m = s / gcd(s, d) share a phase and their offsets grow by
        fixed steps. A single group at stride 1."""
        mh, mw = self.sh // math.gcd(self.sh, self.dh), self.sw // math.gcd(self.sw, self.dw)
        return [
            TapClass(
                rows=slice(a0, None, mh),
                cols=slice(b0, None, mw),
                phase=self.taps[a0 * self.kw + b0][0],
                offset=self.taps[a0 * self.kw + b0][1],
                counts=(len(range(a0, self.kh, mh)), len(range(b0, self.kw, mw))),
                steps=((mh * self.dh // self.sh) * self.row, mw * self.dw // self.sw),
            )
            for a0 in range(min(mh, self.kh))
            for b0 in range(min(mw, self.kw))
        ]

    def _to_grid(self, per_pixel: Tensor, masked: bool = False) -> Tensor:
        """(items, D, Ho, Wo) -> (items, D, pitch): each output pixel at its place in a block,
        zeros between (``per_pixel`` itself when that is already the layout); ``masked``:
        D = KH*KW taps, each multiplied by ``mask``."""
        items, depth = per_pixel.shape[:2]
        if self.tight and not masked and per_pixel.is_contiguous():
            return per_pixel.view(items, depth, self.pitch)
        grid = (torch.empty if self.tight else torch.zeros)((items, depth, self.pitch), dtype=per_pixel.dtype, device=per_pixel.device)
        pixels = self._output_pixels(grid)
        if masked:
            torch.mul(per_pixel, self.mask.to(per_pixel.dtype), out=pixels)
        else:
            pixels.copy_(per_pixel)
        return grid

    def _output_pixels(self, grid: Tensor) -> Tensor:
        """The adjoint of ``_to_grid``: (items, D, pitch) -> the (items, D, Ho, Wo) view of its
        output pixels."""
        return grid.unflatten(-1, (self.item_rows, self.row))[..., : self.out_h, : self.out_w]

