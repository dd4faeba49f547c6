"""The spec of ``example::swish``: everything oplib's generated checks need to know about it.

``SPECS`` is what ``python -m oplib check --import swish_spec`` and ``generated_tests`` read.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch
from torch import Tensor

from oplib.registry import FLOAT_DTYPES, Draw, ErrorInput, OpSpec, SampleInput
from oplib.testing import LAYOUTS, expect_message, make

import swish  # noqa: F401  (registers torch.ops.example.swish)


def reference(x: Tensor, beta: float) -> Tensor:
    """Plain torch, no sigmoid: x / (1 + e^(-beta x))."""
    return x / (1 + torch.exp(-beta * x))


def sample_inputs(device: str, dtype: torch.dtype, requires_grad: bool) -> Iterator[SampleInput]:
    for shape, layout, beta in (
        ((), "contiguous", 1.0),
        ((7,), "contiguous", 0.5),
        ((3, 5), "transposed", 1.0),
        ((2, 3, 4), "noncontiguous", 2.0),
        ((2, 3, 4, 5), "channels_last", 1.0),
        ((0, 4), "contiguous", 1.0),
    ):
        x = make(shape, device, dtype, requires_grad, layout, low=-4, high=4)
        yield SampleInput((x, beta), f"{list(shape)}-{layout}-beta{beta}")


def error_inputs(device: str) -> Iterator[ErrorInput]:
    yield ErrorInput(
        SampleInput((torch.arange(4, device=device), 1.0), "integer"),
        RuntimeError,
        expect_message(swish.FLOATING_DTYPE, dtype=torch.int64),
    )


def random_sample(draw: Draw, device: str, dtype: torch.dtype, requires_grad: bool) -> SampleInput:
    shape = [draw(0, 5) for _ in range(draw(0, 4))]
    beta = draw(1, 8) / 4
    x = make(shape, device, dtype, requires_grad, LAYOUTS[draw(0, 3)], low=-4, high=4)
    return SampleInput((x, beta), f"random-{shape}-beta{beta}")


SPECS = [
    OpSpec(
        name="swish",
        op=torch.ops.example.swish.default,
        reference=reference,
        sample_inputs=sample_inputs,
        error_inputs=error_inputs,
        random_sample=random_sample,
        dtypes={"cpu": FLOAT_DTYPES, "cuda": FLOAT_DTYPES},
    )
]
