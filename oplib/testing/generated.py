"""The checks every op gets, as a pytest test class generated for a list of specs.

In a test module of your own, for specs of your own ops (see docs/adding-an-op.md):

    from oplib.testing import generated_tests
    from my_package.specs import MY_SPECS

    TestMyOps = generated_tests(MY_SPECS)

pytest then collects, per op, device and (where it applies) dtype: eager against the float64
reference in every layout, gradcheck and gradgradcheck, gradients computed one input at a
time, ``torch.library.opcheck``, vmap against a loop, the autocast policy, error inputs in
eager mode and under fake tensors, random shapes (with hypothesis installed), and, with
``tracing=True``, torch.compile against eager, error inputs while tracing, the torch.export
save/load round trip and error inputs while exporting. Needs pytest (oplib itself does not).

opcheck runs on each layout class of samples and torch.compile / torch.export on the first
sample; the rest of those sweeps are tests of their own marked ``integration`` (oplib's
``make test`` leaves them out, ``make test-all`` runs them; register the mark in your
conftest.py to use it).
"""

from __future__ import annotations

import re
import warnings
from collections.abc import Iterator, Sequence

import pytest
import torch

from .. import _torch_private as private
from ..registry import OpSpec, SampleInput, cast_sample
from . import checks, toolchain
from .helpers import (OpCall, assert_matches_reference, like_result, outputs, representative_samples, shaped_like,
                      spec_dtype_params, spec_params, tensor_args)

LOW_PRECISION = (torch.bfloat16, torch.float16)
# The unit tier compiles and exports each op's first sample; the integration tier the others.
FIRST_SAMPLE, OTHER_SAMPLES = slice(0, 1), slice(1, None)


def _check_raises(error, call):
    with pytest.raises(error.error_type) as info:
        call()
    assert re.search(error.match, str(info.value)), f"{error.sample.name}: {info.value}"


def _vmap_placements(sample: SampleInput, batched: list[int]) -> list[tuple[dict[int, int], int]]:
    """Where to put the vmapped dimension: ``({argument: its dimension}, out_dims)`` pairs.

    First every batched argument at dimension 0 with ``out_dims=0``; then each at a non-zero
    dimension where it has one (after its first dimension for the first batched argument,
    last for the others, so two arguments batched at different places are covered too) with
    ``out_dims=-1``. A rule that ignores ``in_dims``, or reports the wrong output dimension,
    passes the first placement and fails the second."""
    front = {i: 0 for i in batched}
    moved = {i: (0 if sample.args[i].dim() == 0 else 1 if k == 0 else -1) for k, i in enumerate(batched)}
    return [(front, 0), (moved, -1)]


OPCHECK_DTYPES = (torch.float64, torch.float32)


def _opcheck_samples(spec: OpSpec, device: str, representative: bool) -> Iterator[SampleInput]:
    """The calls opcheck checks: every sample in ``OPCHECK_DTYPES``, with and without
    requires_grad. ``representative=True`` gives the unit tier's share, each layout class of
    samples (``representative_samples``) requiring grad, in each dtype; False, the rest."""
    for dtype in OPCHECK_DTYPES:
        if dtype not in spec.dtypes[device]:
            continue
        for requires_grad in (True, False):
            samples = list(spec.sample_inputs(device, dtype, requires_grad))
            picked = {id(s) for s in representative_samples(samples)} if requires_grad else set()
            yield from (s for s in samples if (id(s) in picked) == representative)


def _property_test(specs: Sequence[OpSpec]):
    """Random shapes and parameters from each spec's ``random_sample``, drawn by hypothesis
    (so failures shrink): forward and every input gradient match the reference."""
    random_specs = [spec for spec in specs if spec.random_sample is not None]
    try:
        from hypothesis import HealthCheck, given, settings, strategies as st
    except ImportError:
        @pytest.mark.parametrize("spec", random_specs, ids=lambda s: s.name)
        def test_property_random_shapes(self, spec):
            pytest.skip("hypothesis is not installed")

        return test_property_random_shapes

    @pytest.mark.parametrize("spec", random_specs, ids=lambda s: s.name)
    @settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
    @given(data=st.data())
    def test_property_random_shapes(self, spec, data):
        draw = lambda low, high: data.draw(st.integers(low, high))  # noqa: E731
        sample = spec.random_sample(draw, "cpu", torch.float64, True)
        out = spec.op(*sample.args)
        assert_matches_reference(spec, sample, out, torch.float64)
        positions = tensor_args(sample)
        if all(t.numel() == 0 for t in outputs(out)):
            return
        grad_out = like_result(out, torch.randn_like)
        grads = torch.autograd.grad(out, [sample.args[i] for i in positions], grad_out)
        expected = torch.autograd.grad(spec.reference(*sample.args), [sample.args[i] for i in positions], grad_out)
        for i, got, want in zip(positions, grads, expected):
            torch.testing.assert_close(got, want, msg=f"{sample.name}: gradient of argument {i}")

    return test_property_random_shapes


def generated_tests(specs: Sequence[OpSpec], *, eager: bool = True, tracing: bool = True) -> type:
    """A test class (assign it to a ``Test*`` name in a test module) checking ``specs``.

    ``eager``: the checks that run the op directly; ``tracing``: torch.compile and
    torch.export (each compiles, so they take seconds per sample)."""
    specs = list(specs)
    by_device = spec_params(specs)
    by_dtype = spec_dtype_params(specs)
    namespace: dict = {"__doc__": f"Generated checks of {', '.join(s.name for s in specs)}."}

    if eager:

        @pytest.mark.parametrize("spec,device,dtype", by_dtype)
        def test_forward_matches_reference(self, spec, device, dtype):
            for sample in spec.sample_inputs(device, dtype, False):
                assert_matches_reference(spec, sample, spec.op(*sample.args), dtype)

        @pytest.mark.parametrize("spec,device,dtype", by_dtype)
        def test_layout_does_not_change_values(self, spec, device, dtype):
            """Transposed, sliced and channels_last inputs give what their contiguous copies
            give (up to summation order: BLAS picks other kernels for other layouts)."""
            atol, rtol = spec.tolerance(dtype)
            for sample in spec.sample_inputs(device, dtype, False):
                contiguous = tuple(a.contiguous() if isinstance(a, torch.Tensor) else a for a in sample.args)
                torch.testing.assert_close(
                    spec.op(*sample.args), spec.op(*contiguous), atol=atol, rtol=rtol, msg=sample.name
                )

        @pytest.mark.parametrize("spec,device", by_device)
        def test_gradcheck(self, spec, device):
            for sample in spec.sample_inputs(device, torch.float64, True):
                assert torch.autograd.gradcheck(spec.op, sample.args, nondet_tol=spec.gradcheck_nondet_tol), sample.name

        @pytest.mark.parametrize("spec,device", by_device)
        def test_gradgradcheck(self, spec, device):
            for sample in spec.sample_inputs(device, torch.float64, True):
                assert torch.autograd.gradgradcheck(
                    spec.op, sample.args, fast_mode=spec.fast_gradgradcheck, nondet_tol=spec.gradcheck_nondet_tol
                ), sample.name

        @pytest.mark.parametrize("spec,device", by_device)
        def test_backward_computes_only_needed_gradients(self, spec, device):
            """Gradients of one input at a time equal those of a call where all require grad."""
            for sample in spec.sample_inputs(device, torch.float64, True):
                positions = tensor_args(sample)
                out = spec.op(*sample.args)
                grad_out = like_result(out, torch.randn_like)
                full = torch.autograd.grad(out, [sample.args[i] for i in positions], grad_out, allow_unused=True)
                for k, i in enumerate(positions):
                    args = list(cast_sample(sample, torch.float64, requires_grad=False).args)
                    args[i] = args[i].requires_grad_(True)
                    (grad,) = torch.autograd.grad(spec.op(*args), args[i], grad_out)
                    torch.testing.assert_close(grad, full[k], msg=f"{sample.name}: argument {i}")

        @pytest.mark.parametrize("spec,device", by_device)
        def test_opcheck(self, spec, device):
            """``torch.library.opcheck`` on each layout class of samples, in each dtype class
            (``_opcheck_samples``); the other combinations are the integration tier's."""
            for sample in _opcheck_samples(spec, device, representative=True):
                torch.library.opcheck(spec.op, sample.args)

        @pytest.mark.integration
        @pytest.mark.parametrize("spec,device", by_device)
        def test_opcheck_remaining_samples(self, spec, device):
            """opcheck on every sample x dtype x requires_grad that ``test_opcheck`` leaves out."""
            for sample in _opcheck_samples(spec, device, representative=False):
                torch.library.opcheck(spec.op, sample.args)

        @pytest.mark.parametrize("spec,device", by_device)
        def test_vmap_matches_loop(self, spec, device):
            """vmap over the first tensor argument, over the others (the first unbatched:
            ``in_dims`` None), and over all, each with the vmapped dimension first and
            elsewhere (``_vmap_placements``): equal to a loop over the batch."""
            batch = 3
            for sample in spec.sample_inputs(device, torch.float64, False):
                positions = tensor_args(sample)
                for batched in ([positions[0]], positions[1:], positions):
                    if not batched:
                        continue
                    for dims, out_dim in _vmap_placements(sample, batched):
                        stacked = [
                            torch.stack([torch.randn_like(a) for _ in range(batch)], dim=dims[i]) if i in dims else a
                            for i, a in enumerate(sample.args)
                        ]
                        in_dims = tuple(dims.get(i) for i in range(len(sample.args)))
                        with warnings.catch_warnings():
                            warnings.filterwarnings("error", message=".*performance drop.*")
                            out = torch.vmap(spec.op, in_dims=in_dims, out_dims=out_dim)(*stacked)
                        looped = [
                            outputs(spec.op(*(a.select(dims[i], b) if i in dims else a for i, a in enumerate(stacked))))
                            for b in range(batch)
                        ]
                        expected = shaped_like((torch.stack(list(parts), dim=out_dim) for parts in zip(*looped)), out)
                        torch.testing.assert_close(
                            out, expected, msg=f"{sample.name}: vmap with in_dims {in_dims}, out_dims {out_dim}"
                        )

        @pytest.mark.parametrize("spec", specs, ids=lambda s: s.name)
        def test_autocast_policy_is_registered(self, spec):
            """The devices whose policy the spec reads are those with an autocast kernel."""
            assert set(spec.autocast_policy) == set(spec.autocast_devices())

        @pytest.mark.parametrize("spec,device", by_device)
        @pytest.mark.parametrize("autocast_dtype", LOW_PRECISION)
        def test_autocast_policy(self, spec, device, autocast_dtype):
            """Under autocast, float32 inputs give the dtype of the op's policy, which is the
            dtype the matching torch op gives."""
            policy = spec.autocast_policy.get(device)
            expected_dtype = {"lower_precision": autocast_dtype, "fp32": torch.float32, None: torch.float32}[policy]
            for sample in spec.sample_inputs(device, torch.float32, False):
                with torch.autocast(device, dtype=autocast_dtype):
                    out = spec.op(*sample.args)
                    torch_out = spec.torch_equivalent(*sample.args) if spec.torch_equivalent else None
                for value in outputs(out):
                    assert value.dtype == expected_dtype, f"{sample.name}: {value.dtype}, policy {policy} says {expected_dtype}"
                if torch_out is not None:
                    assert torch_out.dtype == out.dtype, f"{sample.name}: {out.dtype} vs torch's {torch_out.dtype}"
                # The op ran in expected_dtype: it matches the reference on inputs rounded to it.
                assert_matches_reference(spec, cast_sample(sample, expected_dtype), out, expected_dtype)

        @pytest.mark.parametrize("spec,device", by_device)
        def test_error_inputs_eager(self, spec, device):
            for error in spec.error_inputs(device):
                _check_raises(error, lambda: spec.op(*error.sample.args))

        @pytest.mark.parametrize("spec,device", by_device)
        def test_error_inputs_fake(self, spec, device):
            for error in spec.error_inputs(device):
                with private.FakeTensorMode() as mode:
                    args = [mode.from_tensor(a) if isinstance(a, torch.Tensor) else a for a in error.sample.args]
                    _check_raises(error, lambda: spec.op(*args))

        namespace["test_property_random_shapes"] = _property_test(specs)

    if tracing:

        @pytest.mark.parametrize("spec,device", by_device)
        def test_compiled_forward_and_backward_match_eager(self, spec, device):
            """The first sample compiled (the others: the integration tier's next test)."""
            toolchain.require_inductor_compiler(device)
            checks.check_compile(spec, device, FIRST_SAMPLE)

        @pytest.mark.integration
        @pytest.mark.parametrize("spec,device", by_device)
        def test_compiled_forward_and_backward_match_eager_other_samples(self, spec, device):
            toolchain.require_inductor_compiler(device)
            checks.check_compile(spec, device, OTHER_SAMPLES)

        @pytest.mark.parametrize("spec,device", by_device)
        def test_error_inputs_while_tracing(self, spec, device):
            """The eager error (type and message) is what tracing reports as the cause."""
            for error in spec.error_inputs(device):
                torch.compiler.reset()
                compiled = torch.compile(spec.op, fullgraph=True, dynamic=False, backend="eager")
                with pytest.raises(RuntimeError) as info:
                    compiled(*error.sample.args)
                message = str(info.value)
                assert f"{error.error_type.__name__}(" in message, f"{error.sample.name}: {message}"
                assert re.search(error.match, message), f"{error.sample.name}: {message}"

        @pytest.mark.parametrize("spec,device", by_device)
        def test_export_save_load_round_trip(self, spec, device):
            """The first sample exported (the others: the integration tier's next test)."""
            checks.check_export(spec, device, FIRST_SAMPLE)

        @pytest.mark.integration
        @pytest.mark.parametrize("spec,device", by_device)
        def test_export_save_load_round_trip_other_samples(self, spec, device):
            checks.check_export(spec, device, OTHER_SAMPLES)

        @pytest.mark.parametrize("spec,device", by_device)
        def test_error_inputs_while_exporting(self, spec, device):
            """torch.export raises the eager error itself: same type, same message."""
            for error in spec.error_inputs(device):
                tensors = tuple(a for a in error.sample.args if isinstance(a, torch.Tensor))
                with pytest.raises(error.error_type, match=error.match):
                    torch.export.export(OpCall(spec.op, error.sample), tensors)

    # Every test_* function defined above, in whichever of the two halves was asked for.
    namespace.update({name: value for name, value in locals().items() if name.startswith("test_")})
    return type("GeneratedOpTests", (), namespace)
