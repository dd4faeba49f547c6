"""RedNet: any input size, torch.compile(fullgraph=True) without graph breaks, convolutions
that inductor sees, and torch.export with dynamic batch and image size (the paper's parameter
counts: tests/models/test_backbones.py, from the pretrained configurations)."""

from __future__ import annotations

import pytest
import torch
from functorch.compile import make_boxed_func
from torch.export import Dim

import oplib.models
from oplib._torch_private import OpOverload, aot_autograd
from oplib.models import RedNet
from oplib.nn import Involution2d

DEPTHS = sorted(oplib.models.BLOCK_COUNTS)


def _narrow(depth: int, **kwargs) -> RedNet:
    """The depth's block counts at a width that keeps the tests fast."""
    torch.manual_seed(0)
    return getattr(oplib.models, f"rednet{depth}")(width=16, group_channels=8, num_classes=10, **kwargs)


@pytest.mark.parametrize("size", [(1, 1), (7, 9), (33, 32), (64, 64)])
def test_any_input_size(size):
    model = _narrow(26, in_channels=1).eval()
    assert model(torch.randn(2, 1, *size)).shape == (2, 10)


def test_rejects_group_channels_that_do_not_divide_the_stem():
    with pytest.raises(ValueError, match="group_channels"):
        RedNet((1, 1, 1, 1), width=16, group_channels=16)


# RedNet-26 (with a backward) in the unit tier, the deeper ones (the same blocks, more of them)
# in the integration tier.
@pytest.mark.parametrize(
    "depth", [d if d == 26 else pytest.param(d, marks=pytest.mark.integration) for d in DEPTHS]
)
def test_compiles_with_fullgraph(depth):
    """fullgraph=True raises on any graph break. Graph breaks are dynamo's business, so its
    plain "eager" backend checks every depth quickly; RedNet-26 also goes through AOTAutograd
    with a backward (inductor compiles it in the training tests)."""
    model = _narrow(depth)
    x = torch.randn(2, 3, 32, 32)
    backend = "aot_eager" if depth == 26 else "eager"
    compiled = torch.compile(model, fullgraph=True, backend=backend)
    torch.testing.assert_close(compiled(x), model(x))
    if depth == 26:
        compiled(x).sum().backward()
        assert all(p.grad is not None for p in model.parameters())


def test_inductor_sees_every_convolution_but_the_span_and_only_involution_as_oplib_op():
    """Inductor folds a BatchNorm into the convolution before it (under freezing) only when it
    gets ``aten.convolution``; a custom op is opaque to it. The inference graph AOTAutograd
    hands to the backend holds one ``aten.convolution`` per Conv2d module (the involutions'
    reduce convs included) but the involutions' span convs, whose parameters go into
    ``involution_generated``, oplib's only op there."""
    model = _narrow(26).eval()
    targets = []

    def record(graph_module: torch.fx.GraphModule, example_inputs):
        targets.extend(node.target for node in graph_module.graph.nodes if node.op == "call_function")
        return make_boxed_func(graph_module.forward)

    with torch.no_grad():
        torch.compile(model, fullgraph=True, backend=aot_autograd(fw_compiler=record))(torch.randn(2, 3, 32, 32))
    oplib_ops = {t for t in targets if isinstance(t, OpOverload) and t.namespace == "oplib"}
    assert oplib_ops == {torch.ops.oplib.involution_generated.default}
    convolutions = sum(isinstance(m, torch.nn.Conv2d) for m in model.modules())
    involutions = sum(isinstance(m, Involution2d) for m in model.modules())
    assert targets.count(torch.ops.aten.convolution.default) == convolutions - involutions > 0


# The integration tier: the unit tier exports RedNet-26 with a dynamic batch and size as a
# backbone (compile_tests/deploy/test_deploy.py), the same stages with their feature outputs.
@pytest.mark.integration
@pytest.mark.parametrize("depth", [26, 50])
def test_exports_with_dynamic_batch_and_size(depth, tmp_path):
    model = _narrow(depth).eval()
    # The five stride-2 steps leave (H - 1) // 32 + 1 pixels; export needs every symbolic
    # size to stay >= 2 over the whole range (it treats sizes 0 and 1 as special), so images
    # are at least 33 pixels a side. Eager mode takes any size.
    dynamic = {"x": {0: Dim("batch", max=256), 2: Dim("height", min=33, max=512), 3: Dim("width", min=33, max=512)}}
    program = torch.export.export(model, (torch.randn(2, 3, 64, 64),), dynamic_shapes=dynamic)
    torch.export.save(program, tmp_path / "rednet.pt2")
    loaded = torch.export.load(tmp_path / "rednet.pt2").module()
    for shape in [(1, 3, 33, 40), (5, 3, 47, 64), (2, 3, 96, 81)]:
        x = torch.randn(shape)
        torch.testing.assert_close(loaded(x), model(x))
