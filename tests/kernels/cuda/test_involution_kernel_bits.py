"""Involution's CUDA kernel, bit by bit: its 16-bit loads and stores round as torch does and
float32 subnormals survive (CuPy compiles with -ftz=true; the kernels must not flush), through
the host emulation everywhere and through CuPy where a GPU is present."""

from __future__ import annotations

import pytest
import torch

from oplib.kernels.involution import cuda as involution_cuda
from oplib.testing import cpu_and_cuda
from oplib.testing.cuda_emulation import EmulatedLauncher
from oplib.testing.toolchain import require_host_compiler


def _one_by_one_involution(x: torch.Tensor, w: torch.Tensor, device: str) -> torch.Tensor:
    """store(load(w) * load(x)) per pixel: a 1x1 involution, by the emulated or the real kernel."""
    args = ([1, 1], [0, 0], [1, 1])
    if device == "cpu":
        require_host_compiler()
        return involution_cuda.launch_involution(x, w, *args, EmulatedLauncher())
    return torch.ops.oplib.involution(x.cuda(), w.cuda(), *args).cpu()


def _patterns(dtype: torch.dtype) -> torch.Tensor:
    """Every 16-bit pattern; for float32, every 64th subnormal pattern of both signs and the
    normals around the smallest one."""
    if dtype in (torch.float16, torch.bfloat16):
        bits = torch.arange(-(2**15), 2**15, dtype=torch.int32).to(torch.int16)
    else:
        positive = torch.cat([torch.arange(0, 2**23, 64, dtype=torch.int32), torch.arange(2**23, 2**23 + 4096)])
        bits = torch.cat([positive, positive | torch.tensor(-(2**31), dtype=torch.int32)])
        bits = bits[: (bits.numel() // 256) * 256]
    return bits.view(dtype).reshape(1, 1, 256, -1)


@pytest.mark.parametrize("device", cpu_and_cuda())
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32], ids=str)
def test_conversions_and_products_are_bit_exact(dtype, device):
    """Over every pattern of x, the kernel must round exactly as torch does (nearest even,
    subnormals, inf and nan included)."""
    x = _patterns(dtype)
    int_type = torch.int16 if dtype.itemsize == 2 else torch.int32
    scales = (1.0, 1 / 3, 3.0, 1e-3) if dtype.itemsize == 2 else (1.0, 0.75, 3.0)
    for scale in scales:
        w = torch.full((1, 1, 1, 1, *x.shape[2:]), scale, dtype=dtype)
        out = _one_by_one_involution(x, w, device)
        # The kernels accumulate from +0, so a -0 product sums to +0, as in torch's reductions.
        expected = (0.0 + x.float() * w.float()).to(dtype)
        same = (out.view(int_type) == expected.view(int_type)) | (out.isnan() & expected.isnan())
        assert bool(same.all()), f"scale {scale}: {int((~same).sum())} patterns differ"
