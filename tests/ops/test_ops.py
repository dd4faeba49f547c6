"""Correctness tests generated from the registry: every op, device and dtype it declares
(the tracing half of the generated checks runs in compile_tests/)."""

from __future__ import annotations

import pytest

from oplib import registry
from oplib.ops._common import ARGUMENT_PREDICATES
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
