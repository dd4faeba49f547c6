"""The generated checks can fail: a user's op with a planted bug is caught by the check meant
for it, and the same op without the bug passes it (so the failure is the bug's)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch
from torch import Tensor

from oplib.registry import OpSpec, SampleInput
from oplib.testing import generated_tests, make


def _doubling_op(name: str, vmap_reports_in_dims: bool):
    """``oplib_planted::<name>(x) = 2 x``, whose vmap rule reports the vmapped dimension of
    the output as the input's (right) or always as 0 (a rule that ignores ``in_dims``)."""

    @torch.library.custom_op(f"oplib_planted::{name}", mutates_args=())
    def double(x: Tensor) -> Tensor:
        return x * 2

    double.register_fake(lambda x: torch.empty_like(x))

    def vmap_rule(info, in_dims, x):
        return double(x), in_dims[0] if vmap_reports_in_dims else 0

    double.register_vmap(vmap_rule)
    return double._opoverload


def _samples(device: str, dtype: torch.dtype, requires_grad: bool) -> Iterator[SampleInput]:
    # (3, 4) first: batched at dimension 1 it keeps a leading 3, so the wrong rule gives a
    # wrong value (an AssertionError) rather than a batch-size error from vmap itself.
    for shape in ((3, 4), (5,), (2, 3, 4)):
        yield SampleInput((make(shape, device, dtype, requires_grad),), f"{list(shape)}")


def _spec(op) -> OpSpec:
    return OpSpec(name=op.name(), op=op, reference=lambda x: x * 2, sample_inputs=_samples, dtypes={"cpu": (torch.float64,)})


RIGHT = _spec(_doubling_op("double_right_vmap", vmap_reports_in_dims=True))
IGNORES_IN_DIMS = _spec(_doubling_op("double_ignores_in_dims", vmap_reports_in_dims=False))


def test_vmap_check_passes_a_right_rule():
    generated_tests([RIGHT], tracing=False)().test_vmap_matches_loop(RIGHT, "cpu")


def test_vmap_check_catches_a_rule_that_ignores_in_dims():
    """Before: the check batched every argument at dimension 0 only, where this rule is right."""
    with pytest.raises(AssertionError, match=r"in_dims \(1,\), out_dims -1"):
        generated_tests([IGNORES_IN_DIMS], tracing=False)().test_vmap_matches_loop(IGNORES_IN_DIMS, "cpu")
