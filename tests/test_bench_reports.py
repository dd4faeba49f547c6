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
