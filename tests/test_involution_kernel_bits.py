"""Involution's CUDA kernel, bit by bit: its 16-bit loads and stores round as torch does
(run through the host emulation of oplib.testing)."""

from __future__ import annotations

import pytest
import torch

from oplib.ops import involution as involution_ops
from oplib.testing.cuda_emulation import EmulatedLauncher


@pytest.mark.parametrize("dtype,bits", [(torch.float16, torch.int16), (torch.bfloat16, torch.int16)], ids=str)
def test_16_bit_conversions_are_bit_exact(dtype, bits):
    """A 1x1 involution computes store(load(w) * load(x)): over every 16-bit pattern of x it
    must round exactly as torch does (nearest even, subnormals, inf and nan included)."""
    x = torch.arange(-(2**15), 2**15, dtype=torch.int32).to(bits).view(dtype).reshape(1, 1, 256, 256)
    for scale in (1.0, 1 / 3, 3.0, 1e-3):
        w = torch.full((1, 1, 1, 1, 256, 256), scale, dtype=dtype)
        out = involution_ops.launch_involution(x, w, [1, 1], [0, 0], [1, 1], EmulatedLauncher())
        # The kernels accumulate from +0, so a -0 product sums to +0, as in torch's reductions.
        expected = (0.0 + x.float() * w.float()).to(dtype)
        same = (out.view(bits) == expected.view(bits)) | (out.isnan() & expected.isnan())
        assert bool(same.all()), f"scale {scale}: {int((~same).sum())} patterns differ"
