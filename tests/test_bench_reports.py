"""bench/_harness.py's reports: beside the markdown, the run as data (every reading of every
kept round and each table's cells, as JSON) and charts. The benchmark scripts are not a
package; their harness is imported from bench/ as they import it."""

import json
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
import _harness  # noqa: E402

from oplib import benchmark  # noqa: E402


@pytest.fixture
def settings(tmp_path, monkeypatch):
    monkeypatch.setattr(_harness, "_READINGS", [])
    return _harness.Settings(script="demo", quick=False, threads=1, rounds=2, min_run_time=0.001, output=tmp_path / "demo.md")


def test_the_report_writes_its_readings_and_tables_as_data(settings):
    section = _harness.Section(settings)
    x = torch.randn(64)
    times = section.measure("case one", {("oplib", "forward"): benchmark.call(torch.exp, x), "torch": benchmark.call(torch.sin, x)})
    lines = [
        *_harness.header(settings, "Demo"),
        "## First",
        "",
        *_harness.table(("shape", "ms"), "lr", [("a", "1.00"), ("b", "2.00")]),
        "",
        "## Second",
        "",
        *_harness.table(("x", "y", "z"), "lrc", [("1", "2", "3")]),
    ]
    _harness.write_report(settings, lines)
    data = json.loads(settings.output.with_suffix(".json").read_text())
    assert data["script"] == "bench/demo.py" and data["rounds"] == 2
    assert data["tables"] == [
        {"heading": "First", "columns": ["shape", "ms"], "rows": [["a", "1.00"], ["b", "2.00"]]},
        {"heading": "Second", "columns": ["x", "y", "z"], "rows": [["1", "2", "3"]]},
    ]
    readings = {tuple(r["statement"]): r for r in data["readings"]}
    assert set(readings) == {("oplib", "forward"), ("torch",)}
    for key, timing in times.items():
        reading = readings[key if isinstance(key, tuple) else (key,)]
        assert reading["case"] == "case one" and reading["seconds"] == list(timing.rounds)
        assert reading["median_seconds"] == timing.median and len(reading["seconds"]) == 2


def test_a_chart_is_saved_beside_the_report(settings):
    pytest.importorskip("matplotlib")
    plt = _harness.pyplot()
    figure, axes = plt.subplots()
    axes.bar([0, 1], [1.0, 2.0])
    path = _harness.write_chart(settings, "speed-up", figure)
    plt.close(figure)
    assert path == settings.output.with_name("demo-speed-up.png")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_cuda_bench_calls_and_report_work_without_a_gpu(monkeypatch):
    """bench/_cuda.py runs only on a GPU (make gpu-check); what does not need one runs here:
    every candidate call of a (small) shape in both layouts, the floors, and the report's
    tables and bars from made-up readings."""
    import _cuda
    import involution as involution_bench

    shape = benchmark.Shape("tiny 32@9 s2", 32, 9, 9, 2, batch=2)
    for layout in _cuda.LAYOUTS:
        o = _cuda.operands_on(shape, torch.float32, layout, "cpu")
        for key, call in _cuda.kernel_calls(o).items():
            out = call()
            assert out.shape[0] == 2, key
    assert shape.floor_bytes(torch.bfloat16) == 2 * (2 * 32 * 81 + 2 * 2 * 49 * 25 + 2 * 32 * 25)
    with _cuda.generic_kernels():
        from oplib.ops import involution as involution_ops

        assert involution_ops.TILED_KERNEL_SIZES == ()
    assert involution_ops.TILED_KERNEL_SIZES == (3, 5, 7)
    rows = [dict(shape="s", batch=32, dtype="float32", layout="NCHW", kernel=k, device_ms=0.02, generic_ms=0.1,
                 floor_ms=0.01, over_floor=2.5 if k == "grad_weight" else 1.5, wall_ms=0.03, depthwise_ms=0.01,
                 unfold_ms=0.5 if k == "forward" else None) for k in _cuda.KERNELS]  # fmt: skip
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "a GPU")
    report = "\n".join(involution_bench._cuda_report(2e12, rows, {"oplib involution": 12e-6,
                       "custom_op + empty CuPy kernel": 10e-6}, [["train, eager", "32", "100", "90", "1.11x"]]))
    assert "**not met** (worst 2.50x)" in report and "1.20x (bar: 1.3x, **met**)" in report
    assert "| s | float32 | NCHW | grad_weight | 0.0200 | 0.0100 | 2.50x |" in report
