"""bench/_harness.py's reports: beside the markdown, the run as data (every reading of every
kept round and each table's cells, as JSON) and charts. The benchmark scripts are not a
package; their harness is imported from bench/ as they import it."""

import json
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
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
            # the generator grads: (grad_feature, grad_span_weight, grad_span_bias)
            assert (out[0] if isinstance(out, tuple) else out).shape[0] == 2, key
    assert shape.floor_bytes(torch.bfloat16) == 2 * (2 * 32 * 81 + 2 * 2 * 49 * 25 + 2 * 32 * 25)
    from oplib.kernels.involution import cuda as involution_cuda

    assert _cuda.GENERIC.kernel_sizes == () and involution_cuda.POLICY.kernel_sizes == (3, 5, 7)
    rows = [dict(shape="s", batch=32, dtype="float32", layout="NCHW", kernel=k, device_ms=0.02, generic_ms=0.1,
                 floor_ms=0.01, over_floor=2.5 if k == "grad_weight" else 1.5, wall_ms=0.03, depthwise_ms=0.01,
                 unfold_ms=0.5 if k == "forward" else None) for k in _cuda.KERNELS]  # fmt: skip
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "a GPU")
    report = "\n".join(involution_bench._cuda_report(2e12, rows, {"oplib involution": 12e-6,
                       "custom_op + empty CuPy kernel": 10e-6}, [["train, eager", "32", "100", "90", "1.11x"]]))
    assert "**not met** (worst 2.50x)" in report and "1.20x (bar: 1.3x, **met**)" in report
    assert "| s | float32 | NCHW | grad_weight | 0.0200 | 0.0100 | 2.50x |" in report


def test_the_cuda_chart_is_drawn_from_the_kernel_rows_without_a_gpu(settings, monkeypatch):
    """The CUDA chart (forward over its floor per shape, both layouts) is drawn only by a GPU
    run; here it is drawn from made-up rows, so the first GPU run cannot fail on it."""
    pytest.importorskip("matplotlib")
    import involution as involution_bench

    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "a GPU")
    rows = [dict(shape=shape, dtype=dtype, layout=layout, kernel=kernel, over_floor=over_floor)
            for shape, over_floor in (("a", 1.5), ("b", 3.0))
            for dtype in ("float32", "bfloat16") for layout in ("NCHW", "channels_last")
            for kernel in ("forward", "grad_input")]  # fmt: skip
    involution_bench._charts(settings, [], [], rows)
    chart = settings.output.with_name("demo-cuda.png")
    assert chart.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert not settings.output.with_name("demo-cpu.png").exists()


def test_the_rednet_and_backbone_charts_are_drawn_from_their_table_rows(settings):
    """Each chart is drawn from the rows of the markdown table it sits beside (the cells as
    written, so a chart cannot show another run than its table)."""
    pytest.importorskip("matplotlib")
    import backbone
    import rednet

    rednet._resnet_chart(settings, [["inference, eager", "1", "10.5", "12.0", "0.88x"], ["train, compiled", "8", "3.1", "2.9", "1.07x"]])
    backbone._chart(settings, [["RedNet-50", "938", "1.36x", "898", "1422", "1.00x"], ["ResNet-50", "688", "1.00x", "637", "1382", "0.97x"]])
    for name in ("demo-resnet.png", "demo-memory.png"):
        assert settings.output.with_name(name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", name


BENCH = Path(__file__).resolve().parents[2] / "bench"
RESULTS = BENCH / "results"


# Smoke runs (--quick, ``*-quick.md``) are ignored by git and not shown: only kept reports count.
@pytest.mark.parametrize("report", sorted(p.name for p in RESULTS.glob("*.md") if not p.stem.endswith("-quick")))
def test_every_timed_report_in_the_results_has_its_data_beside_it(report):
    """Each table that a timed benchmark wrote to bench/results/ has its JSON beside it, from
    the same run: the same script and date, and cell for cell the same tables (so a table
    edited by hand, or one left from an older run than its data, fails here)."""
    text = (RESULTS / report).read_text()
    script = text.split("Written by `python bench/", 1)[1].split(".py", 1)[0] if "Written by `python bench/" in text else ""
    # The timed scripts are those that report through the harness (which writes the JSON).
    if not script or "_harness.write_report(" not in (BENCH / f"{script}.py").read_text():
        pytest.skip(f"{report}: not written through bench/_harness.write_report")
    data_path = (RESULTS / report).with_suffix(".json")
    assert data_path.exists(), f"{report} has no {data_path.name} beside it"
    data = json.loads(data_path.read_text())
    assert data["script"] == f"bench/{script}.py"
    assert f" on {data['date']}." in text.splitlines()[2]
    assert data["tables"] == _harness._tables(text.splitlines())
    assert data["tables"], f"{report}: no table"


def test_a_table_with_fewer_alignments_than_columns_is_refused():
    """The fourth H200 draw's kernel table had 12 columns over an 11-cell separator (the tiled
    column added, its alignment not), which markdown renders as no table."""
    import _harness

    assert _harness.table(["a", "b"], "lr", [[1, 2]])[1] == "|---|---:|"
    with pytest.raises(ValueError, match="2 columns but 1 alignments"):
        _harness.table(["a", "b"], "l", [[1, 2]])


def test_launch_policy_swaps_the_ops_policy_and_drops_their_plans():
    """bench/_cuda.py's ``launch_policy``: inside, involution's CUDA calls default to the given
    policy; the launch plans of its three ops, recorded under whichever policy made them, are
    dropped on the way in and out (a stale plan would replay the other policy's kernels); the
    ops' policy is back after, an exception included."""
    import _cuda
    from oplib.kernels.involution import cuda as involution_cuda
    from oplib.ops._rules import CUDA_KERNELS

    plans = CUDA_KERNELS["oplib::involution_backward_weight"].plans
    default = involution_cuda.POLICY
    plans["stale"] = None
    with _cuda.launch_policy(involution_cuda.LAST):
        assert involution_cuda.POLICY is involution_cuda.LAST and "stale" not in plans
        plans["stale"] = None
    assert involution_cuda.POLICY is default and "stale" not in plans
    with pytest.raises(RuntimeError), _cuda.launch_policy(involution_cuda.LAST):
        raise RuntimeError
    assert involution_cuda.POLICY is default


def test_a_profiled_step_counts_the_time_in_oplibs_ops_and_its_heaviest_ops():
    """bench/_cuda.py's ``profile_steps`` on the CPU (a dry run's target): no device time, the
    host time inside oplib's ops (an involution call's, children included) over the steps, and
    the CPU ops with the most self time, heaviest first (on the CPU, also the host's heaviest
    events); its row gives each in its column."""
    import _cuda

    x, w = torch.randn(2, 16, 24, 24), torch.randn(2, 1, 7, 7, 24, 24)

    def step():
        torch.ops.oplib.involution(x, w, [1, 1], [3, 3], [1, 1])
        torch.mm(torch.randn(256, 256), torch.randn(256, 256))

    step()
    profiled = _cuda.profile_steps(step, 2, _cuda.Target("cpu", None, "cpu"))
    assert profiled["device_us"] is None and profiled["device_kinds"] == [] and profiled["launches"] == 0
    assert profiled["oplib_host_us"] > 0
    # a step's aten ops: the mm, the two randn and what they run inside (normal_, empty, ...)
    assert 3 <= profiled["aten_ops"] < 40
    assert len(profiled["top"]) == 3 and [t for _, t in profiled["top"]] == sorted((t for _, t in profiled["top"]), reverse=True)
    assert any(name.startswith("oplib::") or name in ("aten::mm", "aten::randn", "aten::normal_") for name, _ in profiled["top"])
    row = _cuda._profile_row("train", "eager", 2, "RedNet-50", 0.01, profiled)
    assert row[:8] == ["train, eager", "2", "RedNet-50", "10.00", "-", "-", "-", "0"]
    assert row[8] == f"{profiled['aten_ops']:.0f}" and row[9] == f"{profiled['oplib_host_us'] / 1e3:.2f}"
    assert row[10].startswith(f"`{profiled['top'][0][0][:60]}`")
    # the host's heaviest events, heaviest first: on the CPU, the heaviest ops
    assert [name for name, _ in profiled["host_top"]] == [name for name, _ in profiled["top"]]
    assert row[11].startswith(f"`{profiled['host_top'][0][0][:60]}`")
    assert profiled["waits"] is None and row[12] == "-"  # a dry run has no GPU to wait for


def test_a_steps_waits_for_the_gpu_are_counted_without_the_profiles_own():
    """``host_waits`` on host events as torch.profiler records them on a GPU: the runtime's and
    the driver's synchronisations and blocking copies counted per step with their host time, the
    profile's closing synchronisation (the last to start) left out, launches and async copies not
    counted."""
    import _cuda

    events = [("cudaLaunchKernel", 1.0, 5.0), ("cudaStreamSynchronize", 2.0, 300.0), ("cuLaunchKernel", 3.0, 4.0),
              ("cudaMemcpyAsync", 4.0, 6.0), ("cudaMemcpy", 5.0, 40.0), ("cudaDeviceSynchronize", 9.0, 900.0),
              ("cuStreamSynchronize", 6.0, 60.0)]
    assert _cuda.host_waits(events, 2) == (1.5, 200.0)
    # a step of no waits: only the profile's own closing one, which is not the step's
    assert _cuda.host_waits([("cudaLaunchKernel", 1.0, 5.0), ("cudaDeviceSynchronize", 2.0, 50.0)], 2) == (0.0, 0.0)
    # a step that synchronises the device itself: all but the last counted
    assert _cuda.host_waits([("cudaDeviceSynchronize", 1.0, 10.0), ("cudaDeviceSynchronize", 2.0, 50.0)], 1) == (1.0, 10.0)


def test_a_steps_device_time_is_summed_by_kind():
    """``device_kinds`` on device event names as torch.profiler gives them on an H200 (oplib's
    kernels by their source names, the first kind whose words a name holds), the largest
    first; a profiled row prints them."""
    import _cuda

    events = [
        ("void involution_forward_last<__nv_bfloat16, 7, 1>(__nv_bfloat16 const*, ...)", 900.0),
        ("void involution_generated_dense_window<__nv_bfloat16, true, true>(...)", 100.0),
        ("sm90_xmma_fprop_implicit_gemm_bf16bf16_bf16f32_f32_nhwckrsc_nhwc_tilesize128x128x64", 700.0),
        ("sm90_xmma_wgrad_implicit_gemm_indexed_bf16bf16_bf16f32_f32_nhwckrsc_nhwc", 600.0),
        ("void cudnn::engines_precompiled::nchwToNhwcKernel<__nv_bfloat16, __nv_bfloat16, float, false, true>", 50.0),
        ("void at::native::batch_norm_collect_statistics_channels_last_kernel<...>", 80.0),
        ("void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<c10::BFloat16>, ...>", 40.0),
        ("void at::native::elementwise_kernel<128, 4, at::native::direct_copy_kernel_cuda(...)>", 30.0),
        ("triton_poi_fused__native_batch_norm_legit_functional_convolution_relu_0", 20.0),
        ("void at::native::(anonymous namespace)::multi_tensor_apply_kernel<...>", 10.0),
        ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64", 5.0),
        ("void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float, ...>>", 3.0),
        ("void something_else(float*)", 1.0),
    ]
    kinds = _cuda.device_kinds(events)
    assert kinds == [("convolution", 1300.0), ("oplib", 1000.0), ("batch norm", 80.0), ("layout", 50.0),
                     ("elementwise", 40.0), ("copy", 30.0), ("inductor", 20.0), ("optimizer", 10.0), ("matmul", 5.0),
                     ("reduction", 3.0), ("other", 1.0)]
    assert "involution_backward_weight_last" in _cuda.oplib_kernel_names()
    profiled = {"device_us": 4000.0, "device_kinds": kinds[:2], "launches": 3, "aten_ops": 12, "oplib_host_us": 100.0,
                "top": [], "host_top": []}
    row = _cuda._profile_row("train", "eager", 32, "RedNet-50", 0.008, profiled)
    assert row[4:9] == ["4.00", "0.50", "convolution 1.30; oplib 1.00", "3", "12"]


def test_the_launch_stage_times_a_training_steps_calls():
    """bench/_cuda.py's training-step calls at the tiny input (on the CPU: a dry run's target):
    each a forward and a backward, the op's and the layer's through involution's backward ops,
    the convolution's through its own; the report's lines give each step against the
    convolution's."""
    import _cuda
    from involution import _step_lines
    from torch.profiler import ProfilerActivity, profile

    x, w = torch.randn(*_cuda.TINY["input"]), torch.randn(*_cuda.TINY["weight"])
    steps = _cuda._training_steps(_cuda.Target("cpu", None, "cpu"), (x, w, *_cuda.TINY["window"]))
    assert list(steps) == list(_cuda.STEP_NAMES)
    for name, step in steps.items():
        with profile(activities=[ProfilerActivity.CPU]) as recorded:
            step()
        ran = {event.key for event in recorded.key_averages()}
        backward = "aten::convolution_backward" if name == _cuda.STEP_CONV else "oplib::involution_backward_input"
        assert backward in ran, name
        assert (name == _cuda.STEP_LAYER) == ("aten::native_batch_norm_backward" in ran), name
    lines = _step_lines({_cuda.STEP_DIRECT: 2e-4, _cuda.STEP_DISPATCHER: 2.5e-4, _cuda.STEP_LAYER: 1e-3,
                         _cuda.STEP_CONV: 2e-4})
    assert "dispatcher 0.80x" in lines[0] and "the convolution 5.00x" in lines[0]
    assert "| the op, direct calls | 200.0 | 1.00x |" in lines
    assert _step_lines({}) == []
