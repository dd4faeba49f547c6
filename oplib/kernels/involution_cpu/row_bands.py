"""Medium maps: involution as one banded matrix product per output row."""

from __future__ import annotations

import math

import torch
from torch import Tensor

from .geometry import Geometry, ScalarSizes, tap_reads


def _block_margins(positions: Tensor, reads_image_column: Tensor, core: int):
    """(head, tail): the spare elements a block of ``core`` elements needs before and after
    it to hold every entry (``positions`` relative to the block); None when an entry of a tap
    that reads a padding column lands on one of a tap that reads the image."""
    on_image, off_image = positions[reads_image_column], positions[~reads_image_column]
    if bool(torch.isin(off_image, on_image).any()):
        return None
    return max(0, -int(positions.min())), max(0, int(positions.max()) - core + 1)


class RowBands(ScalarSizes):
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

    name = "bands"
    # A tap that reads a padding column writes its masked weight where that column would
    # wrap to, which may be a margin or spare column that no product reads: a non-finite
    # weight there can drop out instead of making the padded formulation's nan.
    drops_padding_taps = True

    def __init__(self, geometry: Geometry):
        super().__init__(geometry)
        width, out_w = self.width, self.out_w
        _, cols, inside = tap_reads(geometry)
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

    def forward(self, input: Tensor, weight: Tensor) -> Tensor:
        """input: (N, C, H, W), weight: (N, G, KH, KW, Ho, Wo) -> out: (N, C, Ho, Wo)."""
        (n, channels), groups = input.shape[:2], weight.shape[1]
        items, per_group = n * groups, channels // groups
        x = input.reshape(items, per_group, self.height * self.width)
        taps, mask = weight.reshape(items, *weight.shape[2:]), self.mask.to(x.dtype)
        maps = self._new_band_maps(items, x.dtype, x.device)
        rows = x.new_empty(self.out_h, items, per_group, self.out_w)
        for i in range(self.out_h):
            first, end, _ = self.row_spans[i]
            if end <= first:  # the whole row reads padding
                rows[i].zero_()
                continue
            self._fill_band_maps(maps, taps, mask, i)
            torch.bmm(x[:, :, first * self.width : end * self.width], self._band_maps(maps, items, i), out=rows[i])
        return rows.permute(1, 2, 0, 3).view(n, channels, self.out_h, self.out_w)

    def backward_input(self, grad_output: Tensor, weight: Tensor) -> Tensor:
        """grad_output: (N, C, Ho, Wo), weight: (N, G, KH, KW, Ho, Wo) -> grad_input: (N, C, H, W)."""
        (n, channels), groups = grad_output.shape[:2], weight.shape[1]
        items, per_group = n * groups, channels // groups
        # grad_output with its rows in reverse order, to match the maps' rows.
        g = grad_output.flip(2).reshape(items, per_group, self.out_h * self.out_w)
        taps, mask = weight.reshape(items, *weight.shape[2:]).contiguous(), self.mask.to(g.dtype)
        maps = self._new_gather_maps(items, g.dtype, g.device)
        gathered = g.new_empty(self.row_blocks, items, per_group, self.block_cols)
        for k in range(self.row_blocks):
            first, end, _ = self.gather_spans[k]
            if end <= first:  # no output row reads these image rows
                gathered[k].zero_()
                continue
            self._fill_gather_maps(maps, taps, mask, k)
            torch.bmm(g[:, :, first * self.out_w : end * self.out_w], self._gather_maps(maps, items, k), out=gathered[k])
        image = g.new_empty(n, channels, self.height, self.width)
        self._image_into(gathered, image.view(items, per_group, self.height, self.width))
        return image

    def backward_weight(self, grad_output: Tensor, input: Tensor, groups: int) -> Tensor:
        """grad_output: (N, C, Ho, Wo), input: (N, C, H, W) -> grad_weight: (N, G, KH, KW, Ho, Wo)."""
        (n, channels), width, out_w = input.shape[:2], self.width, self.out_w
        items, per_group = n * groups, channels // groups
        x = input.reshape(items, per_group, self.height * width)
        g = grad_output.reshape(items, per_group, self.out_h * out_w)
        products, by_row = self._new_products(items, x.dtype, x.device)
        for i in range(self.out_h):
            first, end, slab_row = self.row_spans[i]
            if end <= first:
                continue
            slab, grad_row = x[:, :, first * width : end * width].transpose(1, 2), g[:, :, i * out_w : (i + 1) * out_w]
            if end - first == self.slab_rows:
                torch.bmm(slab, grad_row, out=by_row[i])
            else:  # clipped at the image's edge: the rows outside it are masked out below
                by_row[i, :, slab_row * width : (slab_row + end - first) * width] = torch.bmm(slab, grad_row)
        return self._weight_of(products, items).view(n, groups, self.kh, self.kw, self.out_h, out_w)

    # Forward and weight gradient: one (slab_rows*W, Wo) matrix per output row.

    def _row_span(self, i: int) -> tuple[int, int, int]:
        """(first image row, end image row, first slab row) read by output row i."""
        top = i * self.sh - self.ph
        first, end = max(0, top), min(self.height, top + self.slab_rows)
        return first, end, first - top

    def _new_band_maps(self, items: int, dtype: torch.dtype, device) -> Tensor:
        """The zeroed flat buffer of one row's maps: (items, band_block), margins included."""
        return torch.zeros(items * self.band_block, dtype=dtype, device=device)

    def _fill_band_maps(self, maps: Tensor, weight: Tensor, mask: Tensor, i: int) -> None:
        """Writes output row i's taps: weight (items, KH, KW, Ho, Wo) times mask (KH, KW, Ho, Wo)."""
        (a, b, j), items = self.tap_strides, weight.shape[0]
        entries = maps.as_strided((items, self.kh, self.kw, self.out_w), (self.band_block, a, b, j), self.first_tap)
        torch.mul(weight[..., i, :], mask[..., i, :], out=entries)

    def _band_maps(self, maps: Tensor, items: int, i: int) -> Tensor:
        """The (items, rows*W, Wo) maps of output row i, for the image rows it reads."""
        first, end, slab_row = self.row_spans[i]
        start = self.band_head + slab_row * self.width * self.out_w
        return maps.as_strided((items, (end - first) * self.width, self.out_w), (self.band_block, self.out_w, 1), start)

    def _new_products(self, items: int, dtype: torch.dtype, device) -> tuple[Tensor, Tensor]:
        """A flat buffer for the weight gradient's products of all rows, and its (Ho, items,
        slab_rows*W, Wo) view: no margins between the blocks, so each row's product is one
        contiguous output (a margin only before the first and after the last)."""
        flat = torch.empty(self.band_head + self.out_h * items * self.band + self.band_tail, dtype=dtype, device=device)
        core = flat[self.band_head : self.band_head + self.out_h * items * self.band]
        return flat, core.view(self.out_h, items, self.slab_rows * self.width, self.out_w)

    def _weight_of(self, products: Tensor, items: int) -> Tensor:
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

    def _new_gather_maps(self, items: int, dtype: torch.dtype, device) -> Tensor:
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

    def _fill_gather_maps(self, maps: Tensor, weight: Tensor, mask: Tensor, k: int) -> None:
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

    def _gather_maps(self, maps: Tensor, items: int, k: int) -> Tensor:
        """The (items, rows*Wo, sh*W + spare) maps of block k, for the output rows that read it."""
        first, end, matrix_row = self.gather_spans[k]
        start = self.gather_head + matrix_row * self.out_w * self.block_cols
        return maps.as_strided((items, (end - first) * self.out_w, self.block_cols), (self.gather_block, self.block_cols, 1), start)

    def _image_into(self, gathered: Tensor, image: Tensor) -> None:
        """(row_blocks, items, C/G, sh*W + spare) -> image: (items, C/G, H, W)."""
        blocks = gathered[..., : self.sh * self.width].unflatten(-1, (self.sh, self.width))
        whole = self.height // self.sh
        image[:, :, : whole * self.sh].unflatten(2, (whole, self.sh)).copy_(blocks[:whole].permute(1, 2, 0, 3, 4))
        if whole < self.row_blocks:
            image[:, :, whole * self.sh :].copy_(blocks[whole, :, :, : self.height - whole * self.sh])

