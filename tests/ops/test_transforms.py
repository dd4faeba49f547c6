"""Forward-mode AD and the torch.func transforms, generated from the registry: every op's
tangents and Jacobians equal those of its plain-torch float64 reference, through
``torch.ops.oplib.*`` directly; a model of oplib modules gets correct per-sample gradients."""

from __future__ import annotations

import pytest
import torch
import torch.autograd.forward_ad as forward_ad
from torch.func import functional_call, grad, hessian, jacfwd, jacrev, jvp, vmap

import oplib
from oplib import registry
from oplib._torch_private import dispatch_get_all_op_names, dispatch_has_kernel_for_dispatch_key
from oplib.registry import SampleInput
from oplib.testing.helpers import like_result, outputs, spec_params, tensor_args


def _as_function(fn, sample: SampleInput):
    """``fn`` as a function of the sample's tensor arguments only (the rest held fixed)."""
    positions = tensor_args(sample)

    def call(*tensors):
        args = list(sample.args)
        for i, t in zip(positions, tensors):
            args[i] = t
        return fn(*args)

    return call, tuple(sample.args[i] for i in positions)


def _samples(spec, device, limit=None):
    samples = list(spec.sample_inputs(device, torch.float64, False))
    return samples[:limit] if limit else samples


@pytest.mark.parametrize("spec,device", spec_params())
def test_jvp_matches_reference(spec, device):
    """torch.func.jvp with a tangent on every tensor argument, then on each one alone."""
    for sample in _samples(spec, device):
        ours, primals = _as_function(spec.op, sample)
        theirs, _ = _as_function(spec.reference, sample)
        tangents = tuple(torch.randn_like(p) for p in primals)
        masks = [tuple(range(len(primals)))] + [(k,) for k in range(len(primals))]
        for mask in masks:
            masked = tuple(t if k in mask else torch.zeros_like(t) for k, t in enumerate(tangents))
            out, tangent = jvp(ours, primals, masked)
            expected_out, expected = jvp(theirs, primals, masked)
            torch.testing.assert_close(out, expected_out, msg=f"{sample.name}: primal")
            torch.testing.assert_close(tangent, expected, msg=f"{sample.name}: tangent of arguments {mask}")


@pytest.mark.parametrize("spec,device", spec_params())
def test_forward_ad_dual_tensors(spec, device):
    """torch.autograd.forward_ad: the output is a dual tensor with the reference's tangent,
    also when an argument both carries a tangent and requires grad."""
    for sample in _samples(spec, device):
        positions = tensor_args(sample)
        tangents = {i: torch.randn_like(sample.args[i]) for i in positions}
        _, expected = jvp(*_as_function(spec.reference, sample), tuple(tangents.values()))
        for requires_grad in (False, True):
            leaves = {i: sample.args[i].detach().requires_grad_(requires_grad) for i in positions}
            with forward_ad.dual_level():
                args = [forward_ad.make_dual(leaves[i], tangents[i]) if i in leaves else a for i, a in enumerate(sample.args)]
                out = spec.op(*args)
                tangent = like_result(out, lambda o: forward_ad.unpack_dual(o).tangent)
                assert all(t is not None for t in outputs(tangent)), f"{sample.name}: no tangent"
                torch.testing.assert_close(tangent, expected, msg=sample.name)
                if requires_grad:
                    # The reverse graph is there too.
                    total = sum(o.sum() for o in outputs(out))
                    grads = torch.autograd.grad(total, list(leaves.values()), allow_unused=True)
                    assert all(g is not None for g in grads), sample.name


def test_every_oplib_op_has_a_forward_rule():
    """No op in the namespace can fall back to custom_op's forward-AD behaviour (a silent
    zero tangent): each has the functorch and Autograd kernels of ``register_jvp``, and the
    registry lists every op."""
    names = sorted(n.removeprefix("oplib::") for n in dispatch_get_all_op_names() if n.startswith("oplib::"))
    assert names == sorted(spec.name for spec in registry.all_specs())
    for name in names:
        for key in ("FuncTorchDynamicLayerFrontMode", "Autograd"):
            assert dispatch_has_kernel_for_dispatch_key(f"oplib::{name}", key), (name, key)


@pytest.mark.parametrize("spec,device", spec_params())
def test_no_silent_zero_tangent(spec, device):
    """A non-zero tangent on any single argument gives a non-zero output tangent wherever the
    reference's is non-zero (the bug: zeros from jvp and jacfwd, None from forward_ad)."""
    for sample in _samples(spec, device):
        ours, primals = _as_function(spec.op, sample)
        theirs, _ = _as_function(spec.reference, sample)
        for k in range(len(primals)):
            tangents = tuple(torch.ones_like(p) if j == k else torch.zeros_like(p) for j, p in enumerate(primals))
            expected = outputs(jvp(theirs, primals, tangents)[1])
            got = outputs(jvp(ours, primals, tangents)[1])
            for m, (e, g) in enumerate(zip(expected, got)):
                if e.abs().sum() != 0:
                    assert g.abs().sum() > 0, f"{sample.name}: argument {k}, output {m}"


@pytest.mark.parametrize("spec,device", spec_params())
def test_jacobians_and_grad_agree_with_autograd(spec, device):
    """jacfwd and jacrev equal the reference's Jacobian; torch.func.grad equals
    torch.autograd.grad of the same scalar."""
    for sample in _samples(spec, device, limit=2):
        ours, primals = _as_function(spec.op, sample)
        theirs, _ = _as_function(spec.reference, sample)
        argnums = tuple(range(len(primals)))
        expected = jacrev(theirs, argnums=argnums)(*primals)
        for transform in (jacfwd, jacrev):
            got = transform(ours, argnums=argnums)(*primals)
            for k, (g, e) in enumerate(zip(got, expected)):
                torch.testing.assert_close(g, e, msg=f"{sample.name}: {transform.__name__} of argument {k}")
        weights = outputs(like_result(ours(*primals), torch.randn_like))
        scalar = lambda *ts: sum((o * w).sum() for o, w in zip(outputs(ours(*ts)), weights))  # noqa: E731
        got = grad(scalar, argnums=argnums)(*primals)
        leaves = [p.detach().requires_grad_() for p in primals]
        want = torch.autograd.grad(scalar(*leaves), leaves, allow_unused=True)
        for g, w in zip(got, want):
            torch.testing.assert_close(g, torch.zeros_like(g) if w is None else w, msg=sample.name)


@pytest.mark.parametrize("spec,device", spec_params())
def test_hessian_forward_over_reverse(spec, device):
    """torch.func.hessian (jacfwd over jacrev) of a scalar of the op's output equals the
    reference's, for the first tensor argument."""
    for sample in _samples(spec, device, limit=1):
        ours, primals = _as_function(spec.op, sample)
        theirs, _ = _as_function(spec.reference, sample)
        rest = primals[1:]
        weights = outputs(like_result(ours(*primals), torch.randn_like))

        def squares(fn):
            return lambda x: sum((o ** 2 * w).sum() for o, w in zip(outputs(fn(x, *rest)), weights))

        got = hessian(squares(ours))(primals[0])
        want = hessian(squares(theirs))(primals[0])
        torch.testing.assert_close(got, want, msg=sample.name)


def _tiny_model() -> torch.nn.Module:
    """Every oplib module, float64: (N, 3, 5, 5) -> (N, 4)."""
    return torch.nn.Sequential(
        oplib.nn.Conv2d(3, 8, 3, padding=1),
        oplib.nn.Involution2d(8, kernel_size=3, stride=2, group_channels=4, reduction_ratio=2),
        oplib.nn.Exp(),
        torch.nn.Flatten(),
        oplib.nn.Linear(8 * 3 * 3, 4),
    ).double()


def test_per_sample_gradients_vmap_grad_match_loop():
    """vmap(grad(functional_call)) of a model of oplib modules equals one autograd pass per sample."""
    torch.manual_seed(0)
    model = _tiny_model().eval()  # eval: BatchNorm uses running statistics per sample
    params = {k: v.detach() for k, v in model.named_parameters()}
    buffers = {k: v.detach() for k, v in model.named_buffers()}
    x = torch.randn(5, 3, 5, 5, dtype=torch.float64)
    target = torch.randint(0, 4, (5,))

    def loss(params, sample, label):
        out = functional_call(model, (params, buffers), (sample.unsqueeze(0),))
        return torch.nn.functional.cross_entropy(out, label.unsqueeze(0))

    per_sample = vmap(grad(loss), in_dims=(None, 0, 0))(params, x, target)
    for n in range(x.shape[0]):
        model.zero_grad()
        torch.nn.functional.cross_entropy(model(x[n : n + 1]), target[n : n + 1]).backward()
        for name, p in model.named_parameters():
            torch.testing.assert_close(per_sample[name][n], p.grad, msg=f"sample {n}, {name}")


def test_functional_call_grad_matches_torch_nn_twin():
    """grad over functional_call of oplib modules equals the same for their torch.nn twins."""
    def build(nn):
        torch.manual_seed(0)
        return torch.nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), torch.nn.Flatten(), nn.Linear(8 * 5 * 5, 4)).double()

    ours, theirs = build(oplib.nn), build(torch.nn)
    x = torch.randn(2, 3, 5, 5, dtype=torch.float64)

    def loss(module):
        return lambda params: functional_call(module, params, (x,)).square().sum()

    params = {k: v.detach() for k, v in theirs.named_parameters()}
    got, want = grad(loss(ours))(params), grad(loss(theirs))(params)
    for name in params:
        torch.testing.assert_close(got[name], want[name], msg=name)
    tangents = {k: torch.randn_like(v) for k, v in params.items()}
    torch.testing.assert_close(
        jvp(loss(ours), (params,), (tangents,))[1], jvp(loss(theirs), (params,), (tangents,))[1]
    )


def test_transforms_under_torch_compile():
    """torch.func.jvp and grad inside a compiled function give eager's tangents (torch has
    dropped autograd.Function jvp rules under compile before: pytorch/pytorch#192985)."""
    x, t = torch.randn(4, dtype=torch.float64), torch.randn(4, dtype=torch.float64)
    op = torch.ops.oplib.exp

    @torch.compile(fullgraph=True, backend="aot_eager")
    def tangent_and_grad(x, t):
        return jvp(op, (x,), (t,))[1], grad(lambda x: op(x).sum())(x)

    tangent, gradient = tangent_and_grad(x, t)
    torch.testing.assert_close(tangent, x.exp() * t)
    torch.testing.assert_close(gradient, x.exp())
