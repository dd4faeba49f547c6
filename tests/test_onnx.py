"""ONNX export, generated from the registry: every op on its sample inputs exports to standard
ONNX (opset 18, no custom domain), passes the ONNX checker and runs in ONNX Runtime (CPU)
with eager's results; RedNets export with dynamic batch and image size."""

from __future__ import annotations

import dataclasses
import logging

import onnx
import pytest
import torch
from torch.export import Dim

import oplib.models
import oplib.onnx
from oplib import registry
from oplib.testing import OpCall, spec_params

logging.getLogger("torch.onnx").setLevel(logging.ERROR)


def _export_and_run(spec, sample, path):
    tensors = tuple(a for a in sample.args if isinstance(a, torch.Tensor))
    oplib.onnx.export(OpCall(spec.op, sample), tensors, path, check=False)
    model = onnx.load(path)
    domains = {node.domain for node in model.graph.node} | {n.domain for f in model.functions for n in f.node}
    assert domains <= {"", "ai.onnx"}, f"{sample.name}: non-standard domains {domains}"
    assert model.opset_import[0].version >= 18
    return oplib.onnx.run(path, tensors)[0], spec.op(*sample.args)


@pytest.mark.integration
@pytest.mark.parametrize("spec,device", [p for p in spec_params() if p.values[1] == "cpu"])
def test_every_sample_round_trips_through_onnx_runtime(spec, device, tmp_path):
    atol, rtol = spec.tolerance(torch.float32)
    for sample in spec.sample_inputs(device, torch.float32, False):
        got, expected = _export_and_run(spec, sample, tmp_path / "op.onnx")
        torch.testing.assert_close(got, expected.contiguous(), atol=atol, rtol=rtol, msg=lambda m: f"{sample.name}: {m}")


@pytest.mark.parametrize("spec,device", [p for p in spec_params() if p.values[1] == "cpu"])
def test_float16_round_trip(spec, device, tmp_path):
    """ONNX Runtime's CPU provider runs every op's translation in float16 too."""
    atol, rtol = spec.tolerance(torch.float16)
    sample = next(iter(spec.sample_inputs(device, torch.float16, False)))
    got, expected = _export_and_run(spec, sample, tmp_path / "op16.onnx")
    assert got.dtype == torch.float16
    torch.testing.assert_close(got, expected, atol=atol, rtol=rtol)


def test_translation_table_covers_every_op_of_oplib():
    table = oplib.onnx.translation_table()
    assert set(table) == {spec.op for spec in registry.all_specs() if spec.qualname.startswith("oplib::")}


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


def _rednet_round_trip(depth: int, tmp_path):
    torch.manual_seed(0)
    model = getattr(oplib.models, f"rednet{depth}")().eval()
    dynamic = {"x": {0: Dim("batch"), 2: Dim("height", min=33, max=1024), 3: Dim("width", min=33, max=1024)}}
    path = tmp_path / f"rednet{depth}.onnx"
    oplib.onnx.export(model, (torch.randn(2, 3, 64, 64),), path, dynamic_shapes=dynamic)
    for shape in [(1, 3, 64, 64), (3, 3, 97, 81), (2, 3, 45, 224)]:
        x = torch.randn(shape)
        with torch.no_grad():
            expected = model(x)
        got = oplib.onnx.run(path, (x,))[0]
        assert got.shape == expected.shape
        assert float((got - expected).abs().max()) <= 1e-4 * float(expected.abs().max()), shape


@pytest.mark.integration
def test_rednet26_exports_with_dynamic_batch_and_size(tmp_path):
    _rednet_round_trip(26, tmp_path)


@pytest.mark.integration
def test_rednet50_exports_with_dynamic_batch_and_size(tmp_path):
    _rednet_round_trip(50, tmp_path)
