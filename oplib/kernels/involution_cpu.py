"""CPU kernels of involution and its two backward ops, in plain PyTorch (no ``unfold``).

    out[n, c, i, j] = sum_{a, b} weight[n, c // (C/G), a, b, i, j] * input[n, c, i*sh - ph + a*dh, j*sw - pw + b*dw]

Three strategies, chosen per call by the size of the map (``strategy``):

- Small maps (H*W at most ``DENSE_MAP_MAX_PIXELS_PER_TAP`` times KH*KW per stride phase, e.g.
  RedNet's 7x7 stage and its 14x14 -> 7x7 involution): the op is a matrix product. For one
  (sample, group) the weight is a sparse (H*W, Ho*Wo) matrix M with at most KH*KW entries
  per column (``DenseMap``); then
  out = x @ M, grad_input = grad @ M^T and grad_weight is (x^T @ grad) read back at M's
  entries. Written out densely, M is at most that factor times the weight's size, and the
  products run as ``bmm`` calls over slices of the N*G (sample, group) pairs, about
  ``DENSE_CHUNK_BYTES`` of matrices each: a few large calls instead of K*K small ones, where
  the per-call cost would dominate.
- Medium maps (an output row's band of image rows at most ``ROW_BANDS_MAX_WORK`` times the
  stride_w times KH*KW elements, e.g. RedNet's 14x14 stage and its 28x28 -> 14x14
  involution): the same products one output row at a time, over the band of image rows
  that row reads (``RowBands``): Ho ``bmm`` calls whose matrices hold that factor times the
  weight's elements.
- Larger maps: K*K elementwise passes, each over one shifted view of the input (split into
  stride phases, without padding) for all samples, groups and channels at once, with the
  weight of the taps that would read the padding multiplied by zero (``TapLayout``).

All three skip the zero padding, so a non-finite value can meet a zero it would not have met
in the padded formulation (inf * 0 is nan). With finite inputs the results are exact; the
matrix strategies send non-finite inputs, and the taps a non-finite result, to the plain
padded formulation (``_padded_*``), which gives the reference's nan and inf pattern.

Every result is a fresh contiguous tensor of the input's dtype; 16-bit inputs accumulate in
float32. No atomics and no reduction whose order depends on threads: results are
deterministic.
"""

from __future__ import annotations

import functools
import math
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor

# A map is "small" when its pixels are at most this many times the kernel's taps per stride
# phase (sh*sw phases): the dense matrix then holds at most that many times the weight's
# elements. The tap passes pay for their buffers once per phase, so strided maps stay dense
# up to larger sizes. Measured on RedNet-50's shapes (bench/involution.py): the matrices are
# 2.5x faster at 7x7 and 1.3x at 14x14 stride 2, the taps 1.2x faster at 14x14 stride 1.
DENSE_MAP_MAX_PIXELS_PER_TAP = 2

# A map is "medium" when the band of image rows one output row reads, (KH-1)*dh + 1 rows of W
# pixels, is at most this many times KH*KW times the column stride: each band matrix then does
# that many times the multiply-adds the taps need, at matrix-product speed. Measured on
# RedNet-50's shapes (paired runs, forward+backward): the bands are 1.45x faster than the
# taps at 28x28 -> 14x14 (4x the work) and even at 14x14 stride 1 (2x), and 2-4x slower at
# 28x28 stride 1 (4x) and 56x56 stride 2 (8x): the taps lose most to the stride phases.
ROW_BANDS_MAX_WORK = 2

# The dense matrices are built and multiplied this many bytes of them at a time, in one
# zeroed buffer that stays in cache: all of them at once is a fresh multi-megabyte allocation
# per call, whose page faults cost more than the products (paired forward+backward runs:
# 1.24-1.27x at 14x14 -> 7x7, even at 7x7).
DENSE_CHUNK_BYTES = 1 << 20

# The elementwise passes work on slices of the N*G items whose accumulator is about this
# many bytes: big enough that a call's fixed cost is small against its work, small enough
# that the slice stays in cache across the K*K passes.
CHUNK_BYTES = 1 << 21
# The weight gradient's slices are larger: it makes one call per (channel, tap class) rather
# than per tap, over K*K values per pixel, and fewer, longer calls measured 1.05-1.14x
# faster on RedNet-50's shapes at 8 MB than at 2 MB.
WEIGHT_GRAD_CHUNK_BYTES = 1 << 23


def accumulation_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


def _geometry_of(input_size, weight_shape, stride, padding, dilation):
    """The DenseMap, RowBands or TapLayout the three kernels compute this geometry with
    (weight_shape: (N, G, KH, KW, Ho, Wo))."""
    (height, width), (kh, kw) = input_size, weight_shape[2:4]
    geometry = (input_size, weight_shape, stride, padding, dilation)
    if height * width <= DENSE_MAP_MAX_PIXELS_PER_TAP * kh * kw * stride[0] * stride[1]:
        return _geometry_for(DenseMap, *geometry)
    band = ((kh - 1) * dilation[0] + 1) * width
    if band <= ROW_BANDS_MAX_WORK * kh * kw * stride[1]:
        bands = _geometry_for(RowBands, *geometry)
        if bands.fits:
            return bands
    return _geometry_for(TapLayout, *geometry)


def strategy(input_size, weight_shape, stride, padding, dilation) -> str:
    """"dense", "bands" or "taps": how the three kernels compute this geometry."""
    kind = type(_geometry_of(input_size, weight_shape, stride, padding, dilation))
    return {DenseMap: "dense", RowBands: "bands", TapLayout: "taps"}[kind]


def _slices(items: int, bytes_per_item: int, chunk_bytes: int | None = None):
    step = max(1, (chunk_bytes or CHUNK_BYTES) // max(1, bytes_per_item))
    return [slice(start, min(items, start + step)) for start in range(0, items, step)]


def _finite(*tensors: Tensor) -> bool:
    """True when no element is inf or nan (a sum is non-finite if any element is; one that
    overflows only sends a call to the exact path)."""
    return all(math.isfinite(t.sum(dtype=accumulation_dtype(t.dtype)).item()) for t in tensors)


def _tap_reads(input_size, kernel_size, output_size, stride, padding, dilation):
    """For tap (a, b) at output pixel (i, j): the image row (KH, 1, Ho, 1) and column
    (1, KW, 1, Wo) it reads, and whether that is inside the image (KH, KW, Ho, Wo)."""
    (height, width), (kh, kw), (out_h, out_w) = input_size, kernel_size, output_size
    (sh, sw), (ph, pw), (dh, dw) = stride, padding, dilation
    rows = torch.arange(out_h).view(1, 1, out_h, 1) * sh - ph + torch.arange(kh).view(kh, 1, 1, 1) * dh
    cols = torch.arange(out_w).view(1, 1, 1, out_w) * sw - pw + torch.arange(kw).view(1, kw, 1, 1) * dw
    inside = ((rows >= 0) & (rows < height) & (cols >= 0) & (cols < width)).expand(kh, kw, out_h, out_w)
    return rows, cols, inside


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
        rows, cols, inside = _tap_reads(input_size, kernel_size, output_size, stride, padding, dilation)
        output_pixel = torch.arange(out_h * out_w).view(1, 1, out_h, out_w)
        entry = ((rows * width + cols) * (out_h * out_w) + output_pixel).expand(kh, kw, out_h, out_w)
        self.inputs, self.outputs = height * width, out_h * out_w
        self.weight_numel = kh * kw * out_h * out_w
        # Positions in the flattened (KH, KW, Ho, Wo) weight that read inside the image ...
        self.taps = inside.reshape(-1).nonzero().squeeze(1)
        # ... and their positions in the flattened (H*W, Ho*Wo) matrix.
        self.entries = entry.reshape(-1)[self.taps]

    def slices(self, items: int, dtype: torch.dtype) -> list[slice]:
        """Slices of the items whose matrices take about DENSE_CHUNK_BYTES."""
        return _slices(items, self.inputs * self.outputs * torch.finfo(dtype).bits // 8, DENSE_CHUNK_BYTES)

    def new_matrices(self, chunks: list[slice], dtype: torch.dtype, device, zeros: bool = True) -> Tensor:
        """Room for the matrices of the largest of ``chunks``: (items, H*W, Ho*Wo), zeroed
        unless ``zeros`` is False. Every item's entries sit at the same positions, so
        refilling it for other items keeps the zeros."""
        items = chunks[0].stop - chunks[0].start if chunks else 0
        return (torch.zeros if zeros else torch.empty)(items, self.inputs, self.outputs, dtype=dtype, device=device)

    def fill(self, matrices: Tensor, weight: Tensor) -> Tensor:
        """weight: (n, KH*KW*Ho*Wo) -> the first n of ``matrices`` (n, H*W, Ho*Wo) holding it."""
        matrix = matrices[: weight.shape[0]]
        matrix.view(weight.shape[0], -1).index_copy_(1, self.entries, weight.index_select(1, self.taps).to(matrix.dtype))
        return matrix

    def weight_into(self, matrix: Tensor, weight: Tensor) -> None:
        """The adjoint of ``fill``: matrix (n, H*W, Ho*Wo) -> weight (n, KH*KW*Ho*Wo), whose
        entries for taps that read padding are left as they are (zero)."""
        weight.index_copy_(1, self.taps, matrix.reshape(matrix.shape[0], -1).index_select(1, self.entries))


@functools.lru_cache(maxsize=64)
def _geometry(kind, input_size, kernel_size, output_size, stride, padding, dilation):
    return kind(input_size, kernel_size, output_size, stride, padding, dilation)


def _geometry_for(kind, input_size, weight_shape, stride, padding, dilation):
    """``kind`` (DenseMap, RowBands or TapLayout) for these sizes, built once per distinct
    geometry."""
    sizes = (input_size, weight_shape[2:4], weight_shape[4:6], stride, padding, dilation)
    return _geometry(kind, *(tuple(map(int, values)) for values in sizes))


# ---------------------------------------------------------------------------------------
# Medium maps: one banded matrix per output row
# ---------------------------------------------------------------------------------------


def _block_margins(positions: Tensor, reads_image_column: Tensor, core: int):
    """(head, tail): the spare elements a block of ``core`` elements needs before and after
    it to hold every entry (``positions`` relative to the block); None when an entry of a tap
    that reads a padding column lands on one of a tap that reads the image."""
    on_image, off_image = positions[reads_image_column], positions[~reads_image_column]
    if bool(torch.isin(off_image, on_image).any()):
        return None
    return max(0, -int(positions.min())), max(0, int(positions.max()) - core + 1)


class RowBands:
    """Involution as one matrix product per output row, for all N*G (sample, group) items in
    one ``bmm``.

    Forward and weight gradient: output row i reads the ``slab_rows`` = (KH-1)*dh + 1 image
    rows from i*sh - ph on (clipped to the image), a contiguous (C/G, slab_rows*W) slice of
    an item's input. Its map is the (slab_rows*W, Wo) matrix holding weight[a, b, i, j] at
    row a*dh*W + c, column j, where c = j*sw - pw + b*dw is the image column the tap reads:
    out[:, :, i] = slice @ map, and the weight gradient of row i is slice^T @ grad[:, :, i]
    read back at those entries.

    Input gradient: scattering row i's slice back would add overlapping slices, so each
    block of sh image rows [k*sh, (k+1)*sh) gathers from the T output rows that read it,
    i = k - ka for the tap rows' ka = floor((a*dh - ph) / sh); their (T*Wo, sh*W + spare)
    matrix holds weight[a, b, i, j] at row (ka - ka_min)*Wo + j, column
    ((a*dh - ph) mod sh)*W + c, and grad_input[:, :, rows of k] = grad[:, :, those i] @ map.

    The entries of every row's (or block's) map sit at the same positions, so the forward
    and the input gradient fill one zeroed buffer per call: each row writes its
    mask-multiplied weights over the previous row's and is multiplied while the buffer is in
    cache. No padding is needed: a tap that reads a padding column writes its zero where that
    column would wrap to -- the row before or after in the matrix, a margin (``*_head`` /
    ``*_tail``) or the spare columns -- never onto a real entry. ``fits`` is False when it
    would (a kernel about as wide as the image); those geometries take the tap passes.
    """

    def __init__(self, input_size, kernel_size, output_size, stride, padding, dilation):
        (self.height, self.width), (self.kh, self.kw) = input_size, kernel_size
        (self.out_h, self.out_w), (self.sh, self.sw) = output_size, stride
        (self.ph, self.pw), (self.dh, self.dw) = padding, dilation
        width, out_w = self.width, self.out_w
        _, cols, inside = _tap_reads(input_size, kernel_size, output_size, stride, padding, dilation)
        self.mask = inside.contiguous()
        reads_image_column = ((cols >= 0) & (cols < width)).expand(self.kh, self.kw, 1, out_w).reshape(-1)
        tap_row = torch.arange(self.kh).view(self.kh, 1, 1, 1)
        out_col = torch.arange(out_w).view(1, 1, 1, out_w)

        self.slab_rows = (self.kh - 1) * self.dh + 1
        self.band = self.slab_rows * width * out_w
        band_entries = ((tap_row * self.dh * width + cols) * out_w + out_col).expand(self.kh, self.kw, 1, out_w)
        band_margins = _block_margins(band_entries.reshape(-1), reads_image_column, self.band)

        reach = [a * self.dh - self.ph for a in range(self.kh)]
        self.steps_down = [r // self.sh for r in reach]
        self.phase_row = [r % self.sh for r in reach]
        self.gather_rows = max(self.steps_down) - min(self.steps_down) + 1
        self.spare = max(self.pw, int(cols.max()) - (width - 1), 0)
        self.block_cols = self.sh * width + self.spare
        self.row_blocks = -(-self.height // self.sh)
        steps_down, phase_row = torch.tensor(self.steps_down).view(-1, 1, 1, 1), torch.tensor(self.phase_row).view(-1, 1, 1, 1)
        gather_entries = ((steps_down - min(self.steps_down)) * out_w + out_col) * self.block_cols + phase_row * width + cols
        self.gather = self.gather_rows * out_w * self.block_cols
        gather_margins = _block_margins(gather_entries.expand(self.kh, self.kw, 1, out_w).reshape(-1), reads_image_column, self.gather)
        self.fits = band_margins is not None and gather_margins is not None
        if not self.fits:
            return
        self.band_head, self.band_tail = band_margins
        self.band_block = self.band_head + self.band + self.band_tail
        # Where tap (a, b) of output column j sits in a row's band matrix: a*dh*W*Wo +
        # b*dw*Wo + j*(sw*Wo + 1) past first_tap (after the head margin).
        self.tap_strides = (self.dh * width * out_w, self.dw * out_w, self.sw * out_w + 1)
        self.first_tap = self.band_head - self.pw * out_w
        self.gather_head, gather_tail = gather_margins
        self.gather_block = self.gather_head + self.gather + gather_tail
        # Tap rows a0, a0 + m, a0 + 2m, ... (m = sh / gcd(sh, dh)) share a phase row and step
        # down by the same number of blocks: each such class fills a block's maps through one
        # strided view, stepping these many elements per tap row, then per column tap and per
        # output column.
        self.class_every = self.sh // math.gcd(self.sh, self.dh)
        self.class_blocks = self.class_every * self.dh // self.sh
        self.gather_fill_strides = (self.class_blocks * out_w * self.block_cols, self.dw, self.block_cols + self.sw)
        # Spans and fill plans per row and block, computed once: each call walks them all.
        self.row_spans = [self._row_span(i) for i in range(self.out_h)]
        self.gather_spans = [self._gather_span(k) for k in range(self.row_blocks)]
        self.gather_fills = [self._gather_fills(k) for k in range(self.row_blocks)]

    # Forward and weight gradient: one (slab_rows*W, Wo) matrix per output row.

    def _row_span(self, i: int) -> tuple[int, int, int]:
        """(first image row, end image row, first slab row) read by output row i."""
        top = i * self.sh - self.ph
        first, end = max(0, top), min(self.height, top + self.slab_rows)
        return first, end, first - top

    def new_band_maps(self, items: int, dtype: torch.dtype, device) -> Tensor:
        """The zeroed flat buffer of one row's maps: (items, band_block), margins included."""
        return torch.zeros(items * self.band_block, dtype=dtype, device=device)

    def fill_band_maps(self, maps: Tensor, weight: Tensor, mask: Tensor, i: int) -> None:
        """Writes output row i's taps: weight (items, KH, KW, Ho, Wo) times mask (KH, KW, Ho, Wo)."""
        (a, b, j), items = self.tap_strides, weight.shape[0]
        entries = maps.as_strided((items, self.kh, self.kw, self.out_w), (self.band_block, a, b, j), self.first_tap)
        torch.mul(weight[..., i, :], mask[..., i, :], out=entries)

    def band_maps(self, maps: Tensor, items: int, i: int) -> Tensor:
        """The (items, rows*W, Wo) maps of output row i, for the image rows it reads."""
        first, end, slab_row = self.row_spans[i]
        start = self.band_head + slab_row * self.width * self.out_w
        return maps.as_strided((items, (end - first) * self.width, self.out_w), (self.band_block, self.out_w, 1), start)

    def new_products(self, items: int, dtype: torch.dtype, device) -> tuple[Tensor, Tensor]:
        """A flat buffer for the weight gradient's products of all rows, and its (Ho, items,
        slab_rows*W, Wo) view: no margins between the blocks, so each row's product is one
        contiguous output (a margin only before the first and after the last)."""
        flat = torch.empty(self.band_head + self.out_h * items * self.band + self.band_tail, dtype=dtype, device=device)
        core = flat[self.band_head : self.band_head + self.out_h * items * self.band]
        return flat, core.view(self.out_h, items, self.slab_rows * self.width, self.out_w)

    def weight_of(self, products: Tensor, items: int) -> Tensor:
        """The flat products -> (items, KH, KW, Ho, Wo): each tap's entry, 0 where it reads
        padding (whatever the buffer holds there)."""
        (a, b, j), sizes = self.tap_strides, (items, self.kh, self.kw, self.out_h, self.out_w)
        entries = products.as_strided(sizes, (self.band, a, b, items * self.band, j), self.first_tap)
        # (into a contiguous tensor: by itself, where would follow the strided view's layout)
        out = torch.empty(sizes, dtype=products.dtype, device=products.device)
        return torch.where(self.mask, entries, torch.zeros((), dtype=products.dtype), out=out)

    # Input gradient: one (T*Wo, sh*W + spare) matrix per block of sh image rows.

    def _gather_span(self, k: int) -> tuple[int, int, int]:
        """(first, end) row of the row-flipped grad_output that block k gathers from, and the
        first matrix row / Wo they meet. Matrix row t holds output row i = k - ka_min - t:
        rows in descending i, so that the tap rows' entries step forward through both the
        matrix and the weight."""
        low, high = max(min(self.steps_down), k - self.out_h + 1), min(k, max(self.steps_down)) + 1  # valid ka
        flipped = self.out_h - 1 - k
        return flipped + low, flipped + high, low - min(self.steps_down)

    def new_gather_maps(self, items: int, dtype: torch.dtype, device) -> Tensor:
        """The zeroed flat buffer of one block's maps: (items, gather_block), margins included."""
        return torch.zeros(items * self.gather_block, dtype=dtype, device=device)

    def _gather_fills(self, k: int) -> list[tuple[int, int, int, int]]:
        """How block k's taps are written: per class of tap rows, the (start in the block,
        number of rows, start in a contiguous (KH, KW, Ho, Wo) weight, step between rows
        there) of one strided view."""
        every, block_step = self.class_every, self.class_blocks
        fills = []
        for a0 in range(min(every, self.kh)):
            rows = [a for a in range(a0, self.kh, every) if 0 <= k - self.steps_down[a] < self.out_h]
            if not rows:
                continue
            a, i = rows[0], k - self.steps_down[rows[0]]
            start = (
                self.gather_head
                + (self.steps_down[a] - min(self.steps_down)) * self.out_w * self.block_cols
                + self.phase_row[a] * self.width
                - self.pw
            )
            # The step is negative only if KW*Ho*m < block_step, and then no two tap rows of
            # the class read the same block; as_strided rejects it even on a size-1 dimension.
            step = every * self.kw * self.out_h * self.out_w - block_step * self.out_w if len(rows) > 1 else 0
            fills.append((start, len(rows), (a * self.kw * self.out_h + i) * self.out_w, step))
        return fills

    def fill_gather_maps(self, maps: Tensor, weight: Tensor, mask: Tensor, k: int) -> None:
        """Writes the taps that read block k: weight (items, KH, KW, Ho, Wo) times mask
        (KH, KW, Ho, Wo), both contiguous."""
        items = weight.shape[0]
        for start, rows, taps, step in self.gather_fills[k]:
            sizes, strides = (rows, self.kw, self.out_w), (step, self.out_h * self.out_w, 1)
            torch.mul(
                weight.as_strided((items, *sizes), (weight.stride(0), *strides), weight.storage_offset() + taps),
                mask.as_strided(sizes, strides, mask.storage_offset() + taps),
                out=maps.as_strided((items, *sizes), (self.gather_block, *self.gather_fill_strides), start),
            )

    def gather_maps(self, maps: Tensor, items: int, k: int) -> Tensor:
        """The (items, rows*Wo, sh*W + spare) maps of block k, for the output rows that read it."""
        first, end, matrix_row = self.gather_spans[k]
        start = self.gather_head + matrix_row * self.out_w * self.block_cols
        return maps.as_strided((items, (end - first) * self.out_w, self.block_cols), (self.gather_block, self.block_cols, 1), start)

    def image_into(self, gathered: Tensor, image: Tensor) -> None:
        """(row_blocks, items, C/G, sh*W + spare) -> image: (items, C/G, H, W)."""
        blocks = gathered[..., : self.sh * self.width].unflatten(-1, (self.sh, self.width))
        whole = self.height // self.sh
        image[:, :, : whole * self.sh].unflatten(2, (whole, self.sh)).copy_(blocks[:whole].permute(1, 2, 0, 3, 4))
        if whole < self.row_blocks:
            image[:, :, whole * self.sh :].copy_(blocks[whole, :, :, : self.height - whole * self.sh])


# ---------------------------------------------------------------------------------------
# Larger maps: K*K passes over shifted views of the unpadded input
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

    def __init__(self, input_size, kernel_size, output_size, stride, padding, dilation):
        (self.height, self.width), (self.ph, self.pw) = input_size, padding
        (self.kh, self.kw), (self.out_h, self.out_w) = kernel_size, output_size
        (self.sh, self.sw), (self.dh, self.dw) = stride, dilation
        self.phases = self.sh * self.sw
        self.item_rows = max(-(-self.height // self.sh), self.out_h)
        self.row = max(-(-self.width // self.sw), self.out_w)
        self.pitch = self.item_rows * self.row
        self.tight = self.pitch == self.out_h * self.out_w
        shifts = [self._shift(a, b) for a in range(self.kh) for b in range(self.kw)]
        self.head = max(0, -min(offset for _, offset in shifts))
        self.tail = max(0, max(offset for _, offset in shifts))
        self.taps = [(phase, self.head + offset) for phase, offset in shifts]
        inside = _tap_reads(input_size, kernel_size, output_size, stride, padding, dilation)[2]
        self.mask = inside.reshape(-1, self.out_h, self.out_w)
        # When the phases fill their blocks exactly (H, W multiples of the stride, output no
        # bigger than a phase), the buffer is a permutation of each image's pixels: one
        # permuting copy (a plain copy at stride 1), much faster than a copy per phase; back
        # to the image, a gather of each pixel's position in the buffer is faster still.
        self.fills_blocks = self.pitch * self.phases == self.height * self.width
        if self.fills_blocks and self.phases > 1:
            positions = torch.arange(self.height * self.width).view(self.sh, self.sw, self.item_rows, self.row)
            self.image_order = positions.permute(2, 0, 3, 1).reshape(-1)

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

    def new_buffer(self, images: int, dtype: torch.dtype, device, zeros: bool = False) -> Tensor:
        """A flat buffer (head + images*phases*pitch + tail) for ``images`` (sample, channel) pairs."""
        numel = self.head + images * self.phases * self.pitch + self.tail
        return (torch.zeros if zeros else torch.empty)(numel, dtype=dtype, device=device)

    def buffer(self, input: Tensor, dtype: torch.dtype) -> Tensor:
        """(N, C, H, W) -> the flat buffer (head + N*C*phases*pitch + tail) in ``dtype``."""
        images = input.shape[0] * input.shape[1]
        flat = self.new_buffer(images, dtype, input.device)
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

    def image_into(self, flat: Tensor, out: Tensor) -> None:
        """The adjoint of ``buffer``: buffer -> out (N, C, H, W), contiguous."""
        images = out.shape[0] * out.shape[1]
        body = self._body(flat, images)
        if self.fills_blocks:
            pixels = out.view(images, self.height * self.width)
            if self.phases == 1:
                pixels.copy_(body.view(images, self.height * self.width))
            elif body.dtype == out.dtype:
                torch.index_select(body.view(images, self.height * self.width), 1, self.image_order, out=pixels)
            else:
                pixels.copy_(body.view(images, self.height * self.width).index_select(1, self.image_order))
            return
        image = out.view(images, self.height, self.width)
        blocks = body.view(images, self.phases, self.item_rows, self.row)
        for phase, row0, col0 in self._phase_blocks():
            pixels = image[:, row0 :: self.sh, col0 :: self.sw]
            pixels.copy_(blocks[:, phase, : pixels.shape[1], : pixels.shape[2]])

    def tap_views(self, flat: Tensor, items: slice, per_group: int) -> list[Tensor]:
        """For each tap, the (len(items), C/G, pitch) view of the buffer it reads for
        ``items`` (built in one go: per-view Python overhead adds up over K*K passes)."""
        item_stride = per_group * self.phases * self.pitch
        size, stride = (items.stop - items.start, per_group, self.pitch), (item_stride, self.phases * self.pitch, 1)
        first = flat.storage_offset() + items.start * item_stride
        return [flat.as_strided(size, stride, first + phase * self.pitch + offset) for phase, offset in self.taps]

    def taps_read(self, flat: Tensor, taps: TapClass, items: slice, per_group: int) -> list[Tensor]:
        """For each channel of the group, the (len(items), rows, cols, pitch) view of what a
        class of taps reads from it for ``items``."""
        item_stride = per_group * self.phases * self.pitch
        size, stride = (items.stop - items.start, *taps.counts, self.pitch), (item_stride, *taps.steps, 1)
        first = flat.storage_offset() + items.start * item_stride + taps.phase * self.pitch + taps.offset
        return [flat.as_strided(size, stride, first + c * self.phases * self.pitch) for c in range(per_group)]

    def tap_classes(self) -> list[TapClass]:
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

    def on_grid(self, per_pixel: Tensor, dtype: torch.dtype, masked: bool = False) -> Tensor:
        """(items, D, Ho, Wo) -> (items, D, pitch) in ``dtype``, zeros off the output pixels
        (``per_pixel`` itself when that is already the layout); ``masked``: D = KH*KW taps,
        each multiplied by ``mask``."""
        items, depth = per_pixel.shape[:2]
        if self.tight and not masked and per_pixel.dtype == dtype and per_pixel.is_contiguous():
            return per_pixel.view(items, depth, self.pitch)
        grid = (torch.empty if self.tight else torch.zeros)((items, depth, self.pitch), dtype=dtype, device=per_pixel.device)
        pixels = self.off_grid(grid)
        if masked:
            torch.mul(per_pixel, self.mask.to(dtype), out=pixels)
        else:
            pixels.copy_(per_pixel)
        return grid

    def off_grid(self, on_grid: Tensor) -> Tensor:
        """(items, D, pitch) -> the (items, D, Ho, Wo) view of the output pixels."""
        return on_grid.unflatten(-1, (self.item_rows, self.row))[..., : self.out_h, : self.out_w]


# ---------------------------------------------------------------------------------------
# Exact padded formulation, for non-finite values
# ---------------------------------------------------------------------------------------


def _window(padded: Tensor, a: int, b: int, output_size, stride, dilation) -> Tensor:
    """The (..., Ho, Wo) view of a padded image (..., H + 2ph, W + 2pw) read by tap (a, b)."""
    (out_h, out_w), (sh, sw), (dh, dw) = output_size, stride, dilation
    return padded[..., a * dh : a * dh + (out_h - 1) * sh + 1 : sh, b * dw : b * dw + (out_w - 1) * sw + 1 : sw]


def _padded_groups(input: Tensor, groups: int, padding, dtype: torch.dtype) -> Tensor:
    """(N, C, H, W) -> (N, G, C/G, H + 2ph, W + 2pw) in ``dtype``, zero-padded."""
    n, channels, height, width = input.shape
    grouped = input.to(dtype).view(n, groups, channels // groups, height, width)
    return F.pad(grouped, (padding[1], padding[1], padding[0], padding[0]))


def _padded_involution(input, weight, stride, padding, dilation) -> Tensor:
    n, channels = input.shape[:2]
    groups, kh, kw, out_h, out_w = weight.shape[1:]
    acc = accumulation_dtype(input.dtype)
    x = _padded_groups(input, groups, padding, acc)
    out = torch.zeros(n, groups, channels // groups, out_h, out_w, dtype=acc, device=input.device)
    for a in range(kh):
        for b in range(kw):
            out.addcmul_(_window(x, a, b, (out_h, out_w), stride, dilation), weight[:, :, None, a, b].to(acc))
    return out.to(input.dtype).view(n, channels, out_h, out_w)


def _padded_backward_input(grad_output, weight, input_size, stride, padding, dilation) -> Tensor:
    n, channels, out_h, out_w = grad_output.shape
    groups, kh, kw = weight.shape[1:4]
    (height, width), (ph, pw) = input_size, padding
    acc = accumulation_dtype(grad_output.dtype)
    g = grad_output.to(acc).view(n, groups, channels // groups, out_h, out_w)
    grad = torch.zeros(n, groups, channels // groups, height + 2 * ph, width + 2 * pw, dtype=acc, device=g.device)
    for a in range(kh):
        for b in range(kw):
            _window(grad, a, b, (out_h, out_w), stride, dilation).addcmul_(g, weight[:, :, None, a, b].to(acc))
    return grad[..., ph : ph + height, pw : pw + width].to(grad_output.dtype).reshape(n, channels, height, width).contiguous()


def _padded_backward_weight(grad_output, input, kernel_size, stride, padding, dilation, groups) -> Tensor:
    n, channels, out_h, out_w = grad_output.shape
    acc = accumulation_dtype(input.dtype)
    x = _padded_groups(input, groups, padding, acc)
    g = grad_output.to(acc).view(n, groups, channels // groups, out_h, out_w)
    grad = torch.empty(n, groups, *kernel_size, out_h, out_w, dtype=acc, device=g.device)
    for a in range(kernel_size[0]):
        for b in range(kernel_size[1]):
            torch.sum(g * _window(x, a, b, (out_h, out_w), stride, dilation), dim=2, out=grad[:, :, a, b])
    return grad.to(input.dtype)


# ---------------------------------------------------------------------------------------
# The three kernels
# ---------------------------------------------------------------------------------------


def involution(input: Tensor, weight: Tensor, stride, padding, dilation) -> Tensor:
    """input: (N, C, H, W), weight: (N, G, KH, KW, Ho, Wo) -> (N, C, Ho, Wo)."""
    n, channels, height, width = input.shape
    groups, out_h, out_w = weight.shape[1], weight.shape[4], weight.shape[5]
    items, per_group = n * groups, channels // groups
    acc = accumulation_dtype(input.dtype)
    geometry = _geometry_of((height, width), weight.shape, stride, padding, dilation)
    if not isinstance(geometry, TapLayout) and not _finite(input, weight):
        return _padded_involution(input, weight, stride, padding, dilation)
    if isinstance(geometry, DenseMap):
        dense = geometry
        x, w = input.reshape(items, per_group, dense.inputs).to(acc), weight.reshape(items, dense.weight_numel)
        chunks = dense.slices(items, acc)
        matrices = dense.new_matrices(chunks, acc, input.device)
        out = torch.empty(items, per_group, dense.outputs, dtype=acc, device=input.device)
        for chunk in chunks:
            torch.bmm(x[chunk], dense.fill(matrices, w[chunk]), out=out[chunk])
        return out.to(input.dtype).view(n, channels, out_h, out_w)
    if isinstance(geometry, RowBands):
        bands = geometry
        x = input.to(acc).reshape(items, per_group, height * width)
        taps, mask = weight.reshape(items, *weight.shape[2:]), bands.mask.to(acc)
        maps = bands.new_band_maps(items, acc, input.device)
        rows = torch.empty(out_h, items, per_group, out_w, dtype=acc, device=input.device)
        for i in range(out_h):
            first, end, _ = bands.row_spans[i]
            if end <= first:  # the whole row reads padding
                rows[i].zero_()
                continue
            bands.fill_band_maps(maps, taps, mask, i)
            torch.bmm(x[:, :, first * width : end * width], bands.band_maps(maps, items, i), out=rows[i])
        result = torch.empty(n, channels, out_h, out_w, dtype=input.dtype, device=input.device)
        result.view(items, per_group, out_h, out_w).copy_(rows.permute(1, 2, 0, 3))
        return result

    layout = geometry
    x = layout.buffer(input, acc)
    # (N*G, K*K, pitch): one kernel per pixel, shared by the channels of a group.
    w = layout.on_grid(weight.reshape(items, layout.kh * layout.kw, out_h, out_w), acc, masked=True)
    result = torch.empty(n, channels, out_h, out_w, dtype=input.dtype, device=input.device)
    in_place = layout.tight and acc == input.dtype
    if in_place:
        out = result.view(items, per_group, layout.pitch)
    else:
        out = torch.empty(items, per_group, layout.pitch, dtype=acc, device=input.device)
    for chunk in _slices(items, per_group * layout.pitch * out.element_size()):
        out_chunk = out[chunk]
        reads, tap_weights = layout.tap_views(x, chunk, per_group), w[chunk].split(1, dim=1)
        torch.mul(reads[0], tap_weights[0], out=out_chunk)
        for read, tap_weight in zip(reads[1:], tap_weights[1:]):
            out_chunk.addcmul_(read, tap_weight)
    if not in_place:
        result.view(items, per_group, out_h, out_w).copy_(layout.off_grid(out))
    if not _finite(result):
        return _padded_involution(input, weight, stride, padding, dilation)
    return result


def involution_backward_input(grad_output: Tensor, weight: Tensor, input_size, stride, padding, dilation) -> Tensor:
    """grad_output: (N, C, Ho, Wo), weight: (N, G, KH, KW, Ho, Wo) -> grad_input: (N, C, H, W)."""
    n, channels, out_h, out_w = grad_output.shape
    groups = weight.shape[1]
    items, per_group = n * groups, channels // groups
    acc = accumulation_dtype(grad_output.dtype)
    geometry = _geometry_of(input_size, weight.shape, stride, padding, dilation)
    if not isinstance(geometry, TapLayout) and not _finite(grad_output, weight):
        return _padded_backward_input(grad_output, weight, input_size, stride, padding, dilation)
    if isinstance(geometry, DenseMap):
        dense = geometry
        g, w = grad_output.reshape(items, per_group, dense.outputs).to(acc), weight.reshape(items, dense.weight_numel)
        chunks = dense.slices(items, acc)
        matrices = dense.new_matrices(chunks, acc, g.device)
        grad = torch.empty(items, per_group, dense.inputs, dtype=acc, device=g.device)
        for chunk in chunks:
            torch.bmm(g[chunk], dense.fill(matrices, w[chunk]).transpose(1, 2), out=grad[chunk])
        return grad.to(grad_output.dtype).view(n, channels, *input_size)
    if isinstance(geometry, RowBands):
        bands = geometry
        # grad_output with its rows in reverse order, to match the maps' rows.
        g = grad_output.to(acc).flip(2).reshape(items, per_group, out_h * out_w)
        taps, mask = weight.reshape(items, *weight.shape[2:]).contiguous(), bands.mask.to(acc)
        maps = bands.new_gather_maps(items, acc, g.device)
        gathered = torch.empty(bands.row_blocks, items, per_group, bands.block_cols, dtype=acc, device=g.device)
        for k in range(bands.row_blocks):
            first, end, _ = bands.gather_spans[k]
            if end <= first:  # no output row reads these image rows
                gathered[k].zero_()
                continue
            bands.fill_gather_maps(maps, taps, mask, k)
            torch.bmm(g[:, :, first * out_w : end * out_w], bands.gather_maps(maps, items, k), out=gathered[k])
        result = torch.empty(n, channels, *input_size, dtype=grad_output.dtype, device=g.device)
        bands.image_into(gathered, result.view(items, per_group, *input_size))
        return result

    layout = geometry
    g = layout.on_grid(grad_output.reshape(items, per_group, out_h, out_w), acc)
    w = layout.on_grid(weight.reshape(items, layout.kh * layout.kw, out_h, out_w), acc, masked=True)
    grad = layout.new_buffer(n * channels, acc, g.device, zeros=True)
    for chunk in _slices(items, per_group * layout.pitch * grad.element_size()):
        g_chunk = g[chunk]
        for write, tap_weight in zip(layout.tap_views(grad, chunk, per_group), w[chunk].split(1, dim=1)):
            # Adjoint of the forward's read: add g * w back where the tap read from.
            write.addcmul_(g_chunk, tap_weight)
    result = torch.empty(n, channels, *input_size, dtype=grad_output.dtype, device=g.device)
    layout.image_into(grad, result)
    if not _finite(result):
        return _padded_backward_input(grad_output, weight, input_size, stride, padding, dilation)
    return result


def involution_backward_weight(grad_output: Tensor, input: Tensor, kernel_size, stride, padding, dilation, groups) -> Tensor:
    """grad_output: (N, C, Ho, Wo), input: (N, C, H, W) -> grad_weight: (N, G, KH, KW, Ho, Wo)."""
    n, channels, out_h, out_w = grad_output.shape
    items, per_group = n * groups, channels // groups
    weight_shape = (n, groups, *kernel_size, out_h, out_w)
    acc = accumulation_dtype(input.dtype)
    geometry = _geometry_of(input.shape[2:], weight_shape, stride, padding, dilation)
    if not isinstance(geometry, TapLayout) and not _finite(grad_output, input):
        return _padded_backward_weight(grad_output, input, kernel_size, stride, padding, dilation, groups)
    if isinstance(geometry, DenseMap):
        dense = geometry
        x = input.reshape(items, per_group, dense.inputs).to(acc)
        g = grad_output.reshape(items, per_group, dense.outputs).to(acc)
        chunks = dense.slices(items, acc)
        products = dense.new_matrices(chunks, acc, g.device, zeros=False)
        grad = torch.zeros(items, dense.weight_numel, dtype=acc, device=g.device)
        for chunk in chunks:
            count = chunk.stop - chunk.start
            torch.bmm(x[chunk].transpose(1, 2), g[chunk], out=products[:count])
            dense.weight_into(products[:count], grad[chunk])
        return grad.to(input.dtype).view(weight_shape)
    if isinstance(geometry, RowBands):
        bands = geometry
        height, width = input.shape[2:]
        x = input.to(acc).reshape(items, per_group, height * width)
        g = grad_output.to(acc).reshape(items, per_group, out_h * out_w)
        products, by_row = bands.new_products(items, acc, g.device)
        for i in range(out_h):
            first, end, slab_row = bands.row_spans[i]
            if end <= first:
                continue
            slab, grad_row = x[:, :, first * width : end * width].transpose(1, 2), g[:, :, i * out_w : (i + 1) * out_w]
            if end - first == bands.slab_rows:
                torch.bmm(slab, grad_row, out=by_row[i])
            else:  # clipped at the image's edge: the rows outside it are masked out below
                by_row[i, :, slab_row * width : (slab_row + end - first) * width] = torch.bmm(slab, grad_row)
        return bands.weight_of(products, items).to(input.dtype).view(weight_shape)

    layout = geometry
    x = layout.buffer(input, acc)
    g = layout.on_grid(grad_output.reshape(items, per_group, out_h, out_w), acc)
    taps = layout.kh * layout.kw
    result = torch.empty(weight_shape, dtype=input.dtype, device=g.device)
    in_place = layout.tight and acc == input.dtype
    if in_place:
        grad = result.view(items, taps, layout.pitch)
    else:
        grad = torch.empty(items, taps, layout.pitch, dtype=acc, device=g.device)
    # dw[n, g, a, b, pixel] = sum over the group's channels c of g[c, pixel] * (what tap (a, b)
    # read from channel c): one pass per channel and tap class, each over all of its taps at
    # once through a strided view of the buffer.
    tap_classes = layout.tap_classes()
    grad_by_tap = grad.view(items, layout.kh, layout.kw, layout.pitch)
    for chunk in _slices(items, taps * layout.pitch * grad.element_size(), WEIGHT_GRAD_CHUNK_BYTES):
        g_channels = g[chunk, :, None, None, :].unbind(1)
        for taps_of in tap_classes:
            grad_taps = grad_by_tap[chunk, taps_of.rows, taps_of.cols]
            reads = layout.taps_read(x, taps_of, chunk, per_group)
            torch.mul(reads[0], g_channels[0], out=grad_taps)
            for read, g_channel in zip(reads[1:], g_channels[1:]):
                grad_taps.addcmul_(read, g_channel)
    # Taps that read the padding have no gradient: the mask zeroes what they read instead.
    if in_place:
        grad.view(items, taps, out_h, out_w).mul_(layout.mask.to(acc))
    else:
        torch.mul(layout.off_grid(grad), layout.mask.to(acc), out=result.view(items, taps, out_h, out_w))
    if not _finite(result):
        return _padded_backward_weight(grad_output, input, kernel_size, stride, padding, dilation, groups)
    return result
