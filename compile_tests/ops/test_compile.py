"""torch.compile and torch.export of every op (generated from the registry: parity with eager,
errors while tracing, export round trip), recompilation counts of a small model against its
torch.nn twin, and one compile of a RedNet backbone over image sizes."""

from __future__ import annotations

import pytest
import torch

import oplib.models
from oplib import registry
from oplib._torch_private import dynamo_counters
from oplib.testing import generated_tests

from _models import InvolutionNet, SmallNet


# torch.compile and torch.export of every op: the tracing half of the generated checks.
TestTracedOps = generated_tests(registry.all_specs(), eager=False)


# (batch, height, width): a first shape, then five new ones. No size of the first repeats
# another (3 channels included), so duck sizing cannot tie two dimensions together.
SHAPES = [(2, 12, 14), (4, 15, 13), (5, 16, 20), (6, 9, 11), (7, 20, 14), (8, 13, 17)]


def _count_compiles(model: torch.nn.Module, train: bool, dynamic, shapes=SHAPES, backend: str = "inductor") -> int:
    """Graphs compiled over ``shapes``. Counted as dynamo's unique graphs: an analysis restart
    within one compile (e.g. BatchNorm's float arguments being specialised) is not a
    recompilation, though it calls the backend again."""
    torch.compiler.reset()
    dynamo_counters.clear()
    compiled = torch.compile(model, fullgraph=True, dynamic=dynamic, backend=backend)
    for batch, height, width in shapes:
        x = torch.randn(batch, 3, height, width)
        if train:
            compiled(x).sum().backward()
        else:
            with torch.no_grad():
                compiled(x)
    return dynamo_counters["stats"]["unique_graphs"]


@pytest.mark.integration
@pytest.mark.needs_compiler
@pytest.mark.parametrize("train,dynamic", [(True, None), (True, True), (False, None), (False, True)])
def test_recompiles_no_more_than_torch_nn(train, dynamic):
    oplib_model, torch_model = SmallNet(use_oplib=True), SmallNet(use_oplib=False)
    torch_model.load_state_dict(oplib_model.state_dict())
    for p in (*oplib_model.parameters(), *torch_model.parameters()):
        p.requires_grad_(train)
    oplib_count = _count_compiles(oplib_model, train, dynamic)
    torch_count = _count_compiles(torch_model, train, dynamic)
    assert oplib_count <= torch_count, f"oplib compiled {oplib_count} times, torch.nn {torch_count} times"
    if not train and dynamic:
        assert oplib_count == 1


@pytest.mark.integration
@pytest.mark.needs_compiler
def test_involution_net_compiles_fullgraph_and_matches_eager():
    """Training steps over odd and even sizes in one fullgraph compile: eager-equal results."""
    torch.manual_seed(0)
    model = InvolutionNet()
    compiled = torch.compile(model, fullgraph=True, dynamic=True)
    for batch, height, width in SHAPES[:3]:
        x = torch.randn(batch, 3, height, width)
        out, expected = compiled(x), model(x)
        torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)
        grads = torch.autograd.grad(out.sum(), list(model.parameters()))
        expected_grads = torch.autograd.grad(expected.sum(), list(model.parameters()))
        torch.testing.assert_close(grads, expected_grads, atol=1e-4, rtol=1e-4)


@pytest.mark.integration
@pytest.mark.needs_compiler
def test_involution_net_inference_compiles_once_like_plain_torch():
    oplib_model, torch_model = InvolutionNet(use_oplib=True), InvolutionNet(use_oplib=False)
    torch_model.load_state_dict(oplib_model.state_dict())
    for model in (oplib_model, torch_model):
        model.eval().requires_grad_(False)
    oplib_count = _count_compiles(oplib_model, False, True)
    assert oplib_count <= _count_compiles(torch_model, False, True)
    assert oplib_count == 1


# Odd and even image sizes, 33 px and up a side: five stride-2 steps leave 2 pixels or more,
# and a size of 1 is specialised (a new graph), as a batch of 1 is. Batches stay in 2-15: on
# CPU, torch's convolution picks its backend by batch size and dynamo guards that range (a
# plain nn.Conv2d too). The first shape has no two sizes alike (3 channels included), so duck
# sizing cannot tie the height to the width or the batch.
BACKBONE_SHAPES = [(2, 33, 47), (5, 64, 64), (3, 71, 40)]


@pytest.mark.integration
@pytest.mark.needs_compiler
def test_rednet_backbone_compiles_once_over_image_sizes():
    """A features_only RedNet-26 (a list of four maps) under fullgraph=True, dynamic=True: one
    inductor graph for three batch and image sizes (its AOTAutograd trace with dynamic shapes
    included: an aot_eager twin in the unit tier took 35 s of it, and the unit tier keeps the
    backbone's export with a dynamic batch and size)."""
    torch.manual_seed(0)
    model = oplib.models.rednet26(width=16, group_channels=8, features_only=True).eval().requires_grad_(False)
    assert _count_compiles(model, False, True, BACKBONE_SHAPES, "inductor") == 1
