"""The spec of ``oplib::linear``."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor

from ...ops._common import BIAS_SIZE, DIM, FLOATING_DTYPE, SAME_DTYPE
from ...ops.linear import IN_FEATURES, INPUT_LAYOUT, WEIGHT_LAYOUT
from ...registry import Draw, ErrorInput, SampleInput
from ._oplib import register_oplib_spec
from ..inputs import LAYOUTS, expect_message, make


def reference(input: Tensor, weight: Tensor, bias: Optional[Tensor]) -> Tensor:
    out = (input.unsqueeze(-2) * weight).sum(-1)  # (*, 1, in) * (out, in) summed over in
    return out if bias is None else out + bias


def sample_inputs(device: str, dtype: torch.dtype, requires_grad: bool) -> Iterator[SampleInput]:
    in_features, out_features = 5, 3
    for leading, layout, with_bias, weight_layout in (
        ((4,), "contiguous", True, "contiguous"),
        ((), "contiguous", True, "contiguous"),
        ((2, 3), "contiguous", False, "contiguous"),
        ((4,), "transposed", True, "noncontiguous"),
        ((2, 3), "noncontiguous", True, "transposed"),
        ((0,), "contiguous", True, "contiguous"),
        ((2, 0, 3), "contiguous", False, "contiguous"),
    ):
        input = make((*leading, in_features), device, dtype, requires_grad, layout)
        weight = make((out_features, in_features), device, dtype, requires_grad, weight_layout)
        bias = make((out_features,), device, dtype, requires_grad) if with_bias else None
        name = f"{list(leading)}-{layout}-weight_{weight_layout}-{'bias' if with_bias else 'nobias'}"
        yield SampleInput((input, weight, bias), name)


def error_inputs(device: str) -> Iterator[ErrorInput]:
    f32 = dict(device=device, dtype=torch.float32)
    w = torch.randn(3, 5, **f32)
    x = torch.randn(4, 5, **f32)
    op = dict(op="linear")
    cases = (
        ((torch.randn((), **f32), w, None), "scalar-input",
         expect_message(DIM, **op, name="input", layout=INPUT_LAYOUT, dim=0, size=[])),
        ((x, torch.randn(15, **f32), None), "1d-weight",
         expect_message(DIM, **op, name="weight", layout=WEIGHT_LAYOUT, dim=1, size=[15])),
        ((torch.randn(4, 6, **f32), w, None), "in-features",
         expect_message(IN_FEATURES, input_size=[4, 6], weight_size=[3, 5])),
        ((x, w, torch.randn(4, **f32)), "bias-size",
         expect_message(BIAS_SIZE, **op, size=3, dim_name="out_features", bias_size=[4])),
        ((x, w.double(), None), "dtype-mismatch",
         expect_message(SAME_DTYPE, **op, name="weight", reference_name="input", dtype=torch.float64,
                        reference_dtype=torch.float32)),
        ((x.long(), w.long(), None), "integer", expect_message(FLOATING_DTYPE, **op, name="input", dtype=torch.int64)),
    )
    for args, name, match in cases:
        yield ErrorInput(SampleInput(args, name), RuntimeError, match)


def random_sample(draw: Draw, device: str, dtype: torch.dtype, requires_grad: bool) -> SampleInput:
    leading = [draw(0, 4) for _ in range(draw(0, 3))]
    in_features, out_features = draw(1, 9), draw(1, 9)
    input = make((*leading, in_features), device, dtype, requires_grad, LAYOUTS[draw(0, 2)])
    weight = make((out_features, in_features), device, dtype, requires_grad, LAYOUTS[draw(0, 2)])
    bias = make((out_features,), device, dtype, requires_grad) if draw(0, 1) else None
    return SampleInput((input, weight, bias), f"random-{leading}-{in_features}-{out_features}")


SPEC = register_oplib_spec("linear", reference, sample_inputs, error_inputs, random_sample, torch_equivalent=F.linear)
