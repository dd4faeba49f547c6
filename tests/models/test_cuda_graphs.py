"""RedNet-50 under CUDA graphs (needs a GPU): ``torch.compile(mode="reduce-overhead")``
(inductor's CUDA graph trees) and a manual ``torch.cuda.graph`` capture of a whole inference
and of a whole training step give the eager result, every kernel loaded ahead
(``oplib.kernels.load()``), as a capture wants. A narrow RedNet-50 (width 16), float32 with
TF32 off, so that the comparisons are tight."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F

import oplib
from oplib.models import rednet50
from oplib.nn import Involution2d

pytestmark = pytest.mark.needs_cuda

BATCH, SIZE, CLASSES = 4, 64, 10
# inductor against eager: other kernels, other summation orders; a replay against eager: the same kernels
COMPILED = dict(atol=1e-3, rtol=1e-3)
REPLAYED = dict(atol=1e-4, rtol=1e-4)


@pytest.fixture(autouse=True)
def _no_tf32(monkeypatch):
    monkeypatch.setattr(torch.backends.cudnn, "allow_tf32", False)
    monkeypatch.setattr(torch.backends.cuda.matmul, "allow_tf32", False)
    oplib.kernels.load()


def _model(fused) -> torch.nn.Module:
    """RedNet-50 at width 16, its involutions on the path ``fused`` names (None: the default)."""
    torch.manual_seed(0)
    model = rednet50(width=16, group_channels=8, num_classes=CLASSES).cuda()
    for module in model.modules():
        if isinstance(module, Involution2d):
            module.fused = fused
    return model


def _batch() -> tuple[torch.Tensor, torch.Tensor]:
    return torch.randn(BATCH, 3, SIZE, SIZE, device="cuda"), torch.randint(0, CLASSES, (BATCH,), device="cuda")


def _assert_same_gradients(model, reference, tolerance) -> None:
    for (name, parameter), expected in zip(model.named_parameters(), reference.parameters()):
        torch.testing.assert_close(parameter.grad, expected.grad, **tolerance, msg=name)


def test_reduce_overhead_inference_matches_eager():
    model = _model(None).eval()
    compiled = torch.compile(model, mode="reduce-overhead")
    for _ in range(3):  # a warm-up, the recording, a replay
        x, _ = _batch()
        with torch.no_grad():
            torch.compiler.cudagraph_mark_step_begin()
            out = compiled(x).clone()  # a replay's output is overwritten by the next
            torch.testing.assert_close(out, model(x), **COMPILED)


def test_reduce_overhead_training_step_matches_eager():
    reference = _model(None).train()
    model = copy.deepcopy(reference)
    compiled = torch.compile(model, mode="reduce-overhead")
    for _ in range(3):
        x, labels = _batch()
        torch.compiler.cudagraph_mark_step_begin()
        loss = F.cross_entropy(compiled(x), labels)
        loss.backward()
        expected = F.cross_entropy(reference(x), labels)
        expected.backward()
        torch.testing.assert_close(loss, expected, **COMPILED)
        _assert_same_gradients(model, reference, COMPILED)
        model.zero_grad(set_to_none=True)
        reference.zero_grad(set_to_none=True)


def _warm_up_on_a_side_stream(step, times: int = 2) -> None:
    """As torch's documentation asks before a capture: a few calls on a side stream."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(times):
            step()
    torch.cuda.current_stream().wait_stream(side)


@pytest.mark.parametrize("fused", [True, False], ids=["fused", "unfused"])
def test_a_captured_inference_replays_the_eager_result(fused):
    model = _model(fused).eval()
    static_x, _ = _batch()
    with torch.no_grad():
        _warm_up_on_a_side_stream(lambda: model(static_x))
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            static_out = model(static_x)
        for _ in range(2):
            x, _ = _batch()
            static_x.copy_(x)
            graph.replay()
            torch.testing.assert_close(static_out, model(x), **REPLAYED)


@pytest.mark.parametrize("fused", [True, False], ids=["fused", "unfused"])
def test_a_captured_training_step_replays_the_eager_loss_and_gradients(fused):
    """Forward, loss and backward in one graph (autograd's backward launches included), the
    gradients written into the static .grad tensors on each replay."""
    model = _model(fused).train()
    reference = copy.deepcopy(model)
    static_x, static_labels = _batch()

    def step() -> torch.Tensor:
        model.zero_grad(set_to_none=True)
        loss = F.cross_entropy(model(static_x), static_labels)
        loss.backward()
        return loss

    _warm_up_on_a_side_stream(step)
    model.zero_grad(set_to_none=True)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_loss = F.cross_entropy(model(static_x), static_labels)
        static_loss.backward()
    for _ in range(2):
        x, labels = _batch()
        static_x.copy_(x)
        static_labels.copy_(labels)
        graph.replay()
        reference.zero_grad(set_to_none=True)
        expected = F.cross_entropy(reference(x), labels)
        expected.backward()
        torch.testing.assert_close(static_loss, expected, **REPLAYED)
        _assert_same_gradients(model, reference, REPLAYED)
