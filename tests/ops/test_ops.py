"""Correctness tests generated from the registry: every op, device and dtype it declares
(the tracing half of the generated checks runs in compile_tests/)."""

from __future__ import annotations

import pytest
import torch

from oplib import registry
from oplib.ops._rules import ARGUMENT_PREDICATES
from oplib.testing import generated_tests, spec_params

TestOps = generated_tests(registry.all_specs(), tracing=False)


@pytest.mark.parametrize("spec,device", spec_params())
def test_argument_predicate_agrees_with_checks(spec, device):
    """The eager fast path in front of each op's argument checks accepts every sample input and
    rejects every error input, so an invalid call always reaches the check that names it."""
    predicate = ARGUMENT_PREDICATES[spec.qualname]
    for dtype in spec.dtypes[device]:
        for sample in spec.sample_inputs(device, dtype, False):
            assert predicate(*sample.args), f"{sample.name}: valid input refused by the fast path"
    for error in spec.error_inputs(device):
        assert not predicate(*error.sample.args), f"{error.sample.name}: invalid input accepted by the fast path"


def test_rules_remember_a_passing_call_by_everything_they_read():
    """Rules.enforce skips the rules for a call whose tensors' shapes, dtypes and devices and
    whose other arguments equal those of a call that passed; a call that differs in any of them
    (a dtype, a parameter, a size) is checked again and still raises."""
    from oplib.ops import involution as involution_ops

    rules = involution_ops._INVOLUTION_RULES
    x, w = torch.randn(1, 4, 6, 6), torch.randn(1, 2, 3, 3, 6, 6)
    window = ([1, 1], [1, 1], [1, 1])
    rules.enforce(x, w, *window)
    rules.enforce(x, w, *window)
    with pytest.raises(RuntimeError, match="floating-point dtype"):
        rules.enforce(x.int(), w, *window)
    with pytest.raises(ValueError, match="stride to be positive"):
        rules.enforce(x, w, [0, 1], [1, 1], [1, 1])
    with pytest.raises(RuntimeError, match="output size"):
        rules.enforce(x, w, [1, 1], [0, 0], [1, 1])
    with pytest.raises(RuntimeError, match="output size"):
        rules.enforce(torch.randn(1, 4, 7, 6), w, *window)
