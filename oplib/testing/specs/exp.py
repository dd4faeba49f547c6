"""The spec of ``oplib::exp``."""

from __future__ import annotations

import math
from collections.abc import Iterator

import torch
from torch import Tensor

from ...ops._common import FLOATING_DTYPE
from ...registry import Draw, ErrorInput, SampleInput
from ._oplib import register_oplib_spec
from ..inputs import LAYOUTS, expect_message, make


def reference(x: Tensor) -> Tensor:
    return torch.pow(math.e, x)


def sample_inputs(device: str, dtype: torch.dtype, requires_grad: bool) -> Iterator[SampleInput]:
    for shape, layout in (
        ((), "contiguous"),
        ((7,), "contiguous"),
        ((1, 1, 1023), "contiguous"),
        ((3, 5), "transposed"),
        ((2, 3, 4), "noncontiguous"),
        ((2, 3, 4, 5), "channels_last"),
        ((0, 4), "contiguous"),
    ):
        x = make(shape, device, dtype, requires_grad, layout, low=-3, high=3)
        yield SampleInput((x,), f"{'x'.join(map(str, shape)) or 'scalar'}-{layout}")


def error_inputs(device: str) -> Iterator[ErrorInput]:
    ints = torch.arange(4, device=device)
    yield ErrorInput(
        SampleInput((ints,), "integer"), RuntimeError, expect_message(FLOATING_DTYPE, op="exp", name="x", dtype=torch.int64)
    )


def random_sample(draw: Draw, device: str, dtype: torch.dtype, requires_grad: bool) -> SampleInput:
    shape = [draw(0, 5) for _ in range(draw(0, 4))]
    x = make(shape, device, dtype, requires_grad, LAYOUTS[draw(0, 3)], low=-4, high=4)
    return SampleInput((x,), f"random-{shape}")


SPEC = register_oplib_spec("exp", reference, sample_inputs, error_inputs, random_sample, torch_equivalent=torch.exp)
