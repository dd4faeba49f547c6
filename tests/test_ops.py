"""Correctness tests generated from the registry: every op, device and dtype it declares."""

from __future__ import annotations

import re
import warnings

import pytest
import torch
from hypothesis import HealthCheck, given, settings, strategies as st
from torch._subclasses.fake_tensor import FakeTensorMode

from oplib import registry
from oplib.ops._common import ARGUMENT_PREDICATES
from oplib.registry import SampleInput, cast_sample
from oplib.testing import assert_matches_reference, spec_dtype_params, spec_params, tensor_args

LOW_PRECISION = (torch.bfloat16, torch.float16)


@pytest.mark.parametrize("spec,device,dtype", spec_dtype_params())
def test_forward_matches_reference(spec, device, dtype):
    for sample in spec.sample_inputs(device, dtype, False):
        assert_matches_reference(spec, sample, spec.op(*sample.args), dtype)


@pytest.mark.parametrize("spec,device,dtype", spec_dtype_params())
def test_layout_does_not_change_values(spec, device, dtype):
    """Transposed, sliced and channels_last inputs give what their contiguous copies give
    (up to summation order: BLAS picks other kernels for other layouts)."""
    atol, rtol = spec.tolerance(dtype)
    for sample in spec.sample_inputs(device, dtype, False):
        contiguous = SampleInput(
            tuple(a.contiguous() if isinstance(a, torch.Tensor) else a for a in sample.args), sample.name
        )
        torch.testing.assert_close(spec.op(*sample.args), spec.op(*contiguous.args), atol=atol, rtol=rtol, msg=sample.name)


@pytest.mark.parametrize("spec,device", spec_params())
def test_gradcheck(spec, device):
    for sample in spec.sample_inputs(device, torch.float64, True):
        assert torch.autograd.gradcheck(spec.op, sample.args), sample.name


@pytest.mark.parametrize("spec,device", spec_params([s for s in registry.all_specs() if s.double_backward]))
def test_gradgradcheck(spec, device):
    for sample in spec.sample_inputs(device, torch.float64, True):
        assert torch.autograd.gradgradcheck(spec.op, sample.args, fast_mode=spec.fast_gradgradcheck), sample.name


@pytest.mark.parametrize("spec,device", spec_params())
def test_backward_computes_only_needed_gradients(spec, device):
    """Gradients of one input at a time equal those of a call where all require grad."""
    for sample in spec.sample_inputs(device, torch.float64, True):
        positions = tensor_args(sample)
        out = spec.op(*sample.args)
        grad_out = torch.randn_like(out)
        full = torch.autograd.grad(out, [sample.args[i] for i in positions], grad_out, allow_unused=True)
        for k, i in enumerate(positions):
            args = list(cast_sample(sample, torch.float64, requires_grad=False).args)
            args[i] = args[i].requires_grad_(True)
            (grad,) = torch.autograd.grad(spec.op(*args), args[i], grad_out)
            torch.testing.assert_close(grad, full[k], msg=f"{sample.name}: argument {i}")


@pytest.mark.parametrize("spec,device,dtype", spec_dtype_params(dtypes=(torch.float64, torch.float32)))
def test_opcheck(spec, device, dtype):
    for requires_grad in (False, True):
        for sample in spec.sample_inputs(device, dtype, requires_grad):
            torch.library.opcheck(spec.op, sample.args)


def _vmap_in_dims(sample: SampleInput, batched: list[int]) -> tuple:
    return tuple(0 if i in batched else None for i in range(len(sample.args)))


@pytest.mark.parametrize("spec,device", spec_params())
def test_vmap_matches_loop(spec, device):
    batch = 3
    for sample in spec.sample_inputs(device, torch.float64, False):
        positions = tensor_args(sample)
        for batched in ([positions[0]], positions[1:], positions):
            if not batched:
                continue
            stacked = [
                torch.stack([torch.randn_like(a) for _ in range(batch)]) if i in batched else a
                for i, a in enumerate(sample.args)
            ]
            with warnings.catch_warnings():
                warnings.filterwarnings("error", message=".*performance drop.*")
                out = torch.vmap(spec.op, in_dims=_vmap_in_dims(sample, batched))(*stacked)
            expected = torch.stack(
                [spec.op(*(a[b] if i in batched else a for i, a in enumerate(stacked))) for b in range(batch)]
            )
            torch.testing.assert_close(out, expected, msg=f"{sample.name}: vmap over arguments {batched}")


@pytest.mark.parametrize("spec,device", spec_params())
@pytest.mark.parametrize("autocast_dtype", LOW_PRECISION)
def test_autocast_policy(spec, device, autocast_dtype):
    """Under autocast, float32 inputs give the dtype of the spec's policy, which is the
    dtype the matching torch op gives."""
    policy = spec.autocast_policy.get(device)
    expected_dtype = {"lower_precision": autocast_dtype, "fp32": torch.float32, None: torch.float32}[policy]
    for sample in spec.sample_inputs(device, torch.float32, False):
        with torch.autocast(device, dtype=autocast_dtype):
            out = spec.op(*sample.args)
            torch_out = spec.torch_equivalent(*sample.args) if spec.torch_equivalent else None
        assert out.dtype == expected_dtype, f"{sample.name}: {out.dtype}, policy {policy} says {expected_dtype}"
        if torch_out is not None:
            assert torch_out.dtype == out.dtype, f"{sample.name}: {out.dtype} vs torch's {torch_out.dtype}"
        # The op ran in expected_dtype: it matches the reference on inputs rounded to it.
        assert_matches_reference(spec, cast_sample(sample, expected_dtype), out, expected_dtype)


def _check_raises(spec, error, call):
    with pytest.raises(error.error_type) as info:
        call()
    assert re.search(error.match, str(info.value)), f"{error.sample.name}: {info.value}"


@pytest.mark.parametrize("spec,device", spec_params())
def test_error_inputs_eager(spec, device):
    for error in spec.error_inputs(device):
        _check_raises(spec, error, lambda: spec.op(*error.sample.args))


@pytest.mark.parametrize("spec,device", spec_params())
def test_error_inputs_fake(spec, device):
    for error in spec.error_inputs(device):
        with FakeTensorMode() as mode:
            args = [mode.from_tensor(a) if isinstance(a, torch.Tensor) else a for a in error.sample.args]
            _check_raises(spec, error, lambda: spec.op(*args))


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


@pytest.mark.parametrize("spec", registry.all_specs(), ids=lambda s: s.name)
@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_property_random_shapes(spec, data):
    """Random shapes and parameters: forward and every input gradient match the reference."""
    draw = lambda low, high: data.draw(st.integers(low, high))  # noqa: E731
    sample = spec.random_sample(draw, "cpu", torch.float64, True)
    out = spec.op(*sample.args)
    assert_matches_reference(spec, sample, out, torch.float64)
    positions = tensor_args(sample)
    if out.numel() == 0:
        return
    grad_out = torch.randn_like(out)
    grads = torch.autograd.grad(out, [sample.args[i] for i in positions], grad_out)
    expected = torch.autograd.grad(spec.reference(*sample.args), [sample.args[i] for i in positions], grad_out)
    for i, got, want in zip(positions, grads, expected):
        torch.testing.assert_close(got, want, msg=f"{sample.name}: gradient of argument {i}")
