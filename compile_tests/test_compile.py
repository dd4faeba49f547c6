"""torch.compile tests generated from the registry: parity with eager, errors while tracing,
and recompilation counts of a small model against its torch.nn twin."""

from __future__ import annotations

import re

import pytest
import torch
from torch._dynamo.utils import counters

from oplib import selfcheck
from oplib.testing import spec_params

from _models import InvolutionNet, SmallNet


@pytest.mark.parametrize("spec,device", spec_params())
def test_compiled_forward_and_backward_match_eager(spec, device):
    selfcheck.check_compile(spec, device)


@pytest.mark.parametrize("spec,device", spec_params())
def test_error_inputs_while_tracing(spec, device):
    """The eager error (type and message) is what tracing reports as the cause."""
    for error in spec.error_inputs(device):
        torch._dynamo.reset()
        compiled = torch.compile(spec.op, fullgraph=True, dynamic=False, backend="eager")
        with pytest.raises(RuntimeError) as info:
            compiled(*error.sample.args)
        message = str(info.value)
        assert f"{error.error_type.__name__}(" in message, f"{error.sample.name}: {message}"
        assert re.search(error.match, message), f"{error.sample.name}: {message}"


# (batch, height, width): a first shape, then five new ones. No size of the first repeats
# another (3 channels included), so duck sizing cannot tie two dimensions together.
SHAPES = [(2, 12, 14), (4, 15, 13), (5, 16, 20), (6, 9, 11), (7, 20, 14), (8, 13, 17)]


def _count_compiles(model: torch.nn.Module, train: bool, dynamic) -> int:
    """Graphs compiled over SHAPES. Counted as dynamo's unique graphs: an analysis restart
    within one compile (e.g. BatchNorm's float arguments being specialised) is not a
    recompilation, though it calls the backend again."""
    torch._dynamo.reset()
    counters.clear()
    compiled = torch.compile(model, fullgraph=True, dynamic=dynamic)
    for batch, height, width in SHAPES:
        x = torch.randn(batch, 3, height, width)
        if train:
            compiled(x).sum().backward()
        else:
            with torch.no_grad():
                compiled(x)
    return counters["stats"]["unique_graphs"]


@pytest.mark.slow
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


@pytest.mark.slow
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


@pytest.mark.slow
def test_involution_net_inference_compiles_once_like_plain_torch():
    oplib_model, torch_model = InvolutionNet(use_oplib=True), InvolutionNet(use_oplib=False)
    torch_model.load_state_dict(oplib_model.state_dict())
    for model in (oplib_model, torch_model):
        model.eval().requires_grad_(False)
    oplib_count = _count_compiles(oplib_model, False, True)
    assert oplib_count <= _count_compiles(torch_model, False, True)
    assert oplib_count == 1
