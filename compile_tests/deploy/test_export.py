"""torch.export and AOTInductor (each op's save/load round trip is generated in
test_compile.py): a model with dynamic sizes loads in a fresh
process, and an AOTInductor package runs."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
import torch
from torch.export import Dim

from oplib._torch_private import aoti_compile_and_package, aoti_load_package

# The test extra has it; a GPU machine's own Python may not, and then only this file is skipped.
expecttest = pytest.importorskip("expecttest")

from _models import InvolutionNet, SmallNet


def _export_small_net(tmp_path):
    torch.manual_seed(0)
    model = SmallNet().eval()
    example = torch.randn(3, 3, 10, 12)
    dynamic = {"x": {0: Dim("batch", max=64), 2: Dim("height", min=2, max=256), 3: Dim("width", min=2, max=256)}}
    return model, torch.export.export(model, (example,), dynamic_shapes=dynamic)


def test_export_dynamic_sizes_load_in_fresh_process(tmp_path):
    model, program = _export_small_net(tmp_path)
    torch.export.save(program, tmp_path / "small_net.pt2")
    cases = [torch.randn(n, 3, h, w) for n, h, w in ((1, 7, 9), (5, 10, 12), (8, 17, 6))]
    with torch.no_grad():
        torch.save({"inputs": cases, "expected": [model(x) for x in cases]}, tmp_path / "io.pt")
    script = textwrap.dedent(
        """
        import sys, torch
        import oplib  # registers torch.ops.oplib.* before the graph is loaded
        program = torch.export.load(sys.argv[1])
        data = torch.load(sys.argv[2])
        for x, expected in zip(data["inputs"], data["expected"]):
            torch.testing.assert_close(program.module()(x), expected)
        print("fresh process: outputs equal")
        """
    )
    result = subprocess.run(
        [sys.executable, "-c", script, str(tmp_path / "small_net.pt2"), str(tmp_path / "io.pt")],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    assert "outputs equal" in result.stdout


@pytest.mark.integration
@pytest.mark.needs_compiler
def test_aoti_package_runs_and_matches_eager(tmp_path):
    model, program = _export_small_net(tmp_path)
    path = aoti_compile_and_package(program, package_path=str(tmp_path / "small_net_aoti.pt2"))
    runner = aoti_load_package(path)
    with torch.no_grad():
        for n, h, w in ((1, 7, 9), (4, 10, 12), (6, 21, 13)):
            x = torch.randn(n, 3, h, w)
            torch.testing.assert_close(runner(x), model(x))


def test_involution_net_exports_with_dynamic_batch_height_width():
    torch.manual_seed(0)
    model = InvolutionNet().eval()
    dynamic = {"x": {0: Dim("batch", max=64), 2: Dim("height", min=4, max=512), 3: Dim("width", min=4, max=512)}}
    program = torch.export.export(model, (torch.randn(2, 3, 16, 12),), dynamic_shapes=dynamic)
    with torch.no_grad():
        for n, h, w in ((1, 7, 9), (3, 15, 15), (5, 32, 21)):
            x = torch.randn(n, 3, h, w)
            torch.testing.assert_close(program.module()(x), model(x))


class TestExportedGraph(expecttest.TestCase):
    def test_oplib_calls_stay_single_nodes(self):
        program = torch.export.export(SmallNet().eval(), (torch.randn(2, 3, 8, 8),))
        self.assertExpectedInline(
            str(program.graph_module.code).strip(),
            """\
def forward(self, p_conv_weight, p_conv_bias, p_fc_weight, p_fc_bias, x):
    conv2d = torch.ops.oplib.conv2d.default(x, p_conv_weight, p_conv_bias, [1, 1], [1, 1], [1, 1], 1);  x = p_conv_weight = p_conv_bias = None
    exp = torch.ops.oplib.exp.default(conv2d);  conv2d = None
    mean = torch.ops.aten.mean.dim(exp, [-2, -1]);  exp = None
    linear = torch.ops.oplib.linear.default(mean, p_fc_weight, p_fc_bias);  mean = p_fc_weight = p_fc_bias = None
    return (linear,)""",
        )
