"""Small maps: involution as one matrix product per (sample, group)."""

from __future__ import annotations

from collections.abc import Iterator

import torch
from torch import Tensor

from .geometry import Geometry, item_chunks, tap_reads

# The matrices are built and multiplied this many bytes of them at a time, in one zeroed
# buffer that stays in cache: building all of them at once is a fresh multi-megabyte
# allocation per call, whose page faults cost more than the products (compared by timing
# forward+backward both ways at RedNet's 7x7 and 14x14 -> 7x7 shapes).
CHUNK_BYTES = 1 << 20


class DenseMap:
    """For one (sample, group) item, the weight as a sparse (H*W, Ho*Wo) matrix M, written
    out densely: weight[a, b, i, j] multiplies input pixel q = r*W + c (r = i*sh - ph + a*dh,
    c = j*sw - pw + b*dw) into output pixel p = i*Wo + j, so it is M[q, p]. Taps that read
    the zero padding have no entry. No two taps share an entry, so filling M is a plain copy
    (a ``scatter_`` whose indices are distinct: well defined and deterministic).

    Then out = x @ M, grad_input = grad @ M^T, and grad_weight is x^T @ grad read back at M's
    entries, as ``bmm`` calls over slices of the N*G items of about ``CHUNK_BYTES`` of
    matrices each.
    """

    name = "dense"
    # A tap that reads padding has no entry in M: a non-finite weight there drops out
    # instead of making the padded formulation's nan.
    drops_padding_taps = True

    def __init__(self, geometry: Geometry):
        self.input_size, self.kernel_size, self.output_size = geometry.input_size, geometry.kernel_size, geometry.output_size
        (height, width), (kh, kw), (out_h, out_w) = self.input_size, self.kernel_size, self.output_size
        rows, cols, inside = tap_reads(geometry)
        output_pixel = torch.arange(out_h * out_w).view(1, 1, out_h, out_w)
        entry = ((rows * width + cols) * (out_h * out_w) + output_pixel).expand(kh, kw, out_h, out_w)
        self.inputs, self.outputs = height * width, out_h * out_w
        self.weight_numel = kh * kw * out_h * out_w
        # Positions in the flattened (KH, KW, Ho, Wo) weight that read inside the image ...
        self.taps = inside.reshape(-1).nonzero().squeeze(1)
        # ... and their positions in the flattened (H*W, Ho*Wo) matrix.
        self.entries = entry.reshape(-1)[self.taps]

    def forward(self, input: Tensor, weight: Tensor) -> Tensor:
        """input: (N, C, H, W), weight: (N, G, KH, KW, Ho, Wo) -> out: (N, C, Ho, Wo)."""
        (n, channels), groups = input.shape[:2], weight.shape[1]
        x = input.reshape(n * groups, channels // groups, self.inputs)
        out = x.new_empty(n * groups, channels // groups, self.outputs)
        for chunk, matrices in self._matrices(weight):
            torch.bmm(x[chunk], matrices, out=out[chunk])
        return out.view(n, channels, *self.output_size)

    def backward_input(self, grad_output: Tensor, weight: Tensor) -> Tensor:
        """grad_output: (N, C, Ho, Wo), weight: (N, G, KH, KW, Ho, Wo) -> grad_input: (N, C, H, W)."""
        (n, channels), groups = grad_output.shape[:2], weight.shape[1]
        g = grad_output.reshape(n * groups, channels // groups, self.outputs)
        grad = g.new_empty(n * groups, channels // groups, self.inputs)
        for chunk, matrices in self._matrices(weight):
            torch.bmm(g[chunk], matrices.transpose(1, 2), out=grad[chunk])
        return grad.view(n, channels, *self.input_size)

    def backward_weight(self, grad_output: Tensor, input: Tensor, groups: int) -> Tensor:
        """grad_output: (N, C, Ho, Wo), input: (N, C, H, W) -> grad_weight: (N, G, KH, KW, Ho, Wo)."""
        n, channels = input.shape[:2]
        x = input.reshape(n * groups, channels // groups, self.inputs)
        g = grad_output.reshape(n * groups, channels // groups, self.outputs)
        chunks = item_chunks(n * groups, self._matrix_bytes(x.dtype), CHUNK_BYTES)
        products = self._new_matrices(chunks, x.dtype, x.device, zeros=False)
        # Taps that read padding keep their zero.
        grad = x.new_zeros(n * groups, self.weight_numel)
        for chunk in chunks:
            count = chunk.stop - chunk.start
            torch.bmm(x[chunk].transpose(1, 2), g[chunk], out=products[:count])
            # Along rows, scatter_ and index_select: index_copy_ along the last dimension makes
            # one strided pass over the rows per index, which cost as much as the products.
            entries = products[:count].view(count, -1).index_select(1, self.entries)
            grad[chunk].scatter_(1, self.taps.expand(count, -1), entries)
        return grad.view(n, groups, *self.kernel_size, *self.output_size)

    def _matrix_bytes(self, dtype: torch.dtype) -> int:
        return self.inputs * self.outputs * torch.finfo(dtype).bits // 8

    def _new_matrices(self, chunks: list[slice], dtype: torch.dtype, device, zeros: bool) -> Tensor:
        """Room for the matrices of the largest of ``chunks`` (the first): (items, H*W, Ho*Wo)."""
        items = chunks[0].stop - chunks[0].start if chunks else 0
        return (torch.zeros if zeros else torch.empty)(items, self.inputs, self.outputs, dtype=dtype, device=device)

    def _matrices(self, weight: Tensor) -> Iterator[tuple[slice, Tensor]]:
        """(chunk, M of its items: (len(chunk), H*W, Ho*Wo)) for consecutive chunks of the N*G
        items of weight (N, G, KH, KW, Ho, Wo), each filled into the same buffer: every item's
        entries sit at the same positions, so refilling it keeps the zeros."""
        w = weight.reshape(weight.shape[0] * weight.shape[1], self.weight_numel)
        chunks = item_chunks(w.shape[0], self._matrix_bytes(w.dtype), CHUNK_BYTES)
        buffer = self._new_matrices(chunks, w.dtype, w.device, zeros=True)
        for chunk in chunks:
            count = chunk.stop - chunk.start
            matrices = buffer[:count]
            # scatter_ along rows, not index_copy_ (see backward_weight).
            matrices.view(count, -1).scatter_(1, self.entries.expand(count, -1), w[chunk].index_select(1, self.taps))
            yield chunk, matrices
