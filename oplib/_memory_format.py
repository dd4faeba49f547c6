"""The one test of a channels_last activation, shared by the ops and their kernels."""

from __future__ import annotations

import torch
from torch import Tensor


def is_channels_last(tensor: Tensor) -> bool:
    """Whether a 4-D tensor is laid out (N, H, W, C) and not also (N, C, H, W) (as when C == 1
    or H == W == 1, which then counts as contiguous)."""
    return tensor.dim() == 4 and not tensor.is_contiguous() and tensor.is_contiguous(memory_format=torch.channels_last)
