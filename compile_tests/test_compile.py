"""torch.compile tests generated from the registry: parity with eager, errors while tracing,
and recompilation counts of a small model against its torch.nn twin."""

from __future__ import annotations

import re

import pytest
import torch
from torch._dynamo.testing import CompileCounterWithBackend

from oplib import registry
from oplib.registry import cast_sample
from oplib.testing import spec_params, tensor_args

from _models import SmallNet


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


@pytest.mark.parametrize("spec,device", spec_params())
def test_compiled_forward_and_backward_match_eager(spec, device):
    """Each sample compiled with the sizes of its first argument dynamic (weights stay
    static, as parameters do under torch.compile)."""
    for sample in spec.sample_inputs(device, torch.float32, True):
        torch._dynamo.reset()
        compiled = torch.compile(spec.op, fullgraph=True)
        positions = tensor_args(sample)
        eager_sample = cast_sample(sample, torch.float32)
        for dim in range(sample.args[0].dim()):
            torch._dynamo.maybe_mark_dynamic(sample.args[0], dim)
        out = compiled(*sample.args)
        expected = spec.op(*eager_sample.args)
        torch.testing.assert_close(out, expected, msg=sample.name)
        assert out.stride() == expected.stride() or out.numel() == 0, sample.name
        grad_out = torch.randn_like(expected)
        grads = torch.autograd.grad(out, [sample.args[i] for i in positions], grad_out)
        expected_grads = torch.autograd.grad(expected, [eager_sample.args[i] for i in positions], grad_out)
        for i, got, want in zip(positions, grads, expected_grads):
            torch.testing.assert_close(got, want, msg=f"{sample.name}: gradient of argument {i}")


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
    torch._dynamo.reset()
    counter = CompileCounterWithBackend("inductor")
    compiled = torch.compile(model, backend=counter, fullgraph=True, dynamic=dynamic)
    for batch, height, width in SHAPES:
        x = torch.randn(batch, 3, height, width)
        if train:
            compiled(x).sum().backward()
        else:
            with torch.no_grad():
                compiled(x)
    return counter.frame_count


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
