"""ONNX export, generated from the registry: every op on its sample inputs exports to standard
ONNX (opset 18, no custom domain), passes the ONNX checker and runs in ONNX Runtime (CPU)
with eager's results; Involution2d exports with a dynamic batch and image size. RedNet-26's
round trips, the classifier and the features_only backbone (one named output per map, each
with a symbolic batch and size), are compile_tests/deploy/test_deploy.py's: through
``python -m oplib export``, which is ``oplib.onnx.export`` with a dynamic batch and size."""

from __future__ import annotations

import dataclasses
import logging

import onnx
import pytest
import torch
from torch.export import Dim

import oplib.deploy
import oplib.nn
import oplib.onnx
from oplib import registry
from oplib.testing import OpCall, spec_params
from oplib.testing.helpers import outputs

logging.getLogger("torch.onnx").setLevel(logging.ERROR)


def _export_and_run(spec, sample, path):
    tensors = tuple(a for a in sample.args if isinstance(a, torch.Tensor))
    oplib.onnx.export(OpCall(spec.op, sample), tensors, path, check=False)
    model = onnx.load(path)
    domains = {node.domain for node in model.graph.node} | {n.domain for f in model.functions for n in f.node}
    assert domains <= {"", "ai.onnx"}, f"{sample.name}: non-standard domains {domains}"
    assert model.opset_import[0].version >= 18
    expected = outputs(spec.op(*sample.args))
    got = oplib.onnx.run(path, tensors)
    assert len(got) == len(expected), f"{sample.name}: {len(got)} ONNX outputs, the op has {len(expected)}"
    return tuple(got), tuple(e.contiguous() for e in expected)


@pytest.mark.integration
@pytest.mark.parametrize("spec,device", [p for p in spec_params() if p.values[1] == "cpu"])
def test_every_sample_round_trips_through_onnx_runtime(spec, device, tmp_path):
    atol, rtol = spec.tolerance(torch.float32)
    for sample in spec.sample_inputs(device, torch.float32, False):
        got, expected = _export_and_run(spec, sample, tmp_path / "op.onnx")
        torch.testing.assert_close(got, expected, atol=atol, rtol=rtol, msg=lambda m: f"{sample.name}: {m}")


@pytest.mark.parametrize("spec,device", [p for p in spec_params() if p.values[1] == "cpu"])
def test_float16_round_trip(spec, device, tmp_path):
    """ONNX Runtime's CPU provider runs every op's translation in float16 too."""
    atol, rtol = spec.tolerance(torch.float16)
    sample = next(iter(spec.sample_inputs(device, torch.float16, False)))
    got, expected = _export_and_run(spec, sample, tmp_path / "op16.onnx")
    assert all(g.dtype == torch.float16 for g in got)
    torch.testing.assert_close(got, expected, atol=atol, rtol=rtol)


def test_translation_table_covers_every_op_of_oplib():
    table = oplib.onnx.translation_table()
    oplib_ops = {spec.op for spec in registry.all_specs() if spec.qualname.startswith("oplib::")}
    # and aten's avg_pool2d, whose torch.onnx translation drops divisor_override (below)
    assert set(table) == oplib_ops | {torch.ops.aten.avg_pool2d.default}


# An op outside oplib, with no ONNX translation of oplib's.
@torch.library.custom_op("oplib_onnx_test::twice", mutates_args=())
def _twice(x: torch.Tensor) -> torch.Tensor:
    return 2 * x


_twice.register_fake(lambda x: torch.empty_like(x))


def test_an_op_registered_from_outside_leaves_the_table_alone(monkeypatch):
    """A user's spec in the registry (as ``python -m oplib check --import`` adds one) has no
    translation of oplib's: the table, and so every export, must still work."""
    table = oplib.onnx.translation_table()
    outside = dataclasses.replace(registry.get("exp"), name="twice", op=torch.ops.oplib_onnx_test.twice.default)
    monkeypatch.setitem(registry._REGISTRY, outside.name, outside)
    assert oplib.onnx.translation_table() == table
    assert outside.op not in table


def test_an_op_without_translation_fails_clearly(tmp_path):
    class Model(torch.nn.Module):
        def forward(self, x):
            return torch.ops.oplib.exp(_twice(x))

    with pytest.raises(oplib.onnx.UntranslatedOpError, match=r"oplib_onnx_test::twice has no ONNX translation: oplib\.onnx\.translation_table\(\) covers"):
        oplib.onnx.export(Model(), (torch.randn(3),), tmp_path / "m.onnx")


def _round_trip(model: torch.nn.Module, path, shapes, example=(2, 3, 64, 64), min_size: int = 33, **kwargs) -> None:
    """``model`` exported on an ``example``-shaped input with a dynamic batch and image size
    (``min_size`` and up a side; ``kwargs`` to ``oplib.onnx.export``), then run in ONNX Runtime
    at ``shapes``: each output (a classifier's logits, a backbone's maps) within 1e-4 of
    eager's largest magnitude."""
    dynamic = ({0: Dim("batch"), 2: Dim("height", min=min_size, max=1024), 3: Dim("width", min=min_size, max=1024)},)
    oplib.onnx.export(model, (torch.randn(example),), path, dynamic_shapes=dynamic, **kwargs)
    for shape in shapes:
        x = torch.randn(shape)
        with torch.no_grad():
            expected = model(x)
        expected = [expected] if isinstance(expected, torch.Tensor) else expected
        got = oplib.onnx.run(path, (x,))
        assert [g.shape for g in got] == [e.shape for e in expected], shape
        for g, e in zip(got, expected):
            assert float((g - e).abs().max()) <= 1e-4 * float(e.abs().max()), shape


def test_involution2d_at_stride_2_matches_eager_at_odd_sizes(tmp_path):
    """At stride 2, Involution2d pools its kernel source over 2x2 cells, which an odd size
    leaves half outside the image (avg_pool2d with divisor_override=1, then divided by the
    in-image count). torch.onnx's own avg_pool2d translation drops divisor_override: the last
    row and column came out off by 30-50% of the output's largest value (oplib.onnx's
    translation_table() translates avg_pool2d itself)."""
    torch.manual_seed(0)
    model = oplib.nn.Involution2d(16, kernel_size=3, stride=2, group_channels=8).eval()
    _round_trip(model, tmp_path / "involution.onnx", [(1, 16, 9, 12), (2, 16, 11, 9), (1, 16, 10, 12)], (2, 16, 10, 10), 4)
