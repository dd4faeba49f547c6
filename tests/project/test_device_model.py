"""oplib.testing.device_model and its committed table (bench/results/cuda-model.md and .json).

Unit tier: the table is what the model code makes of the inputs the json keeps (the fit, every
prediction and ratio, cell for cell), every row is within the bar, and the pieces that can be
wrong on their own: occupancy against the CUDA occupancy calculator, a launch with twice the
bytes taking twice the time when DRAM binds, the line count of coalesced and scattered lanes,
the SASS reader, the shared-memory passes of bank conflicts. Integration tier: the inputs themselves regenerated for some rows (a recorded
launch, its trace, and its SASS from NVRTC and nvdisasm) equal what the json keeps."""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

import pytest
import torch

from oplib.testing import device_model
from oplib.testing.device_model import H100_SXM, H200, A100_SXM, Constants, KernelWork, LaunchInputs

BENCH = Path(__file__).resolve().parents[2] / "bench"
RESULTS = BENCH / "results"
sys.path.insert(0, str(BENCH))
import cuda_model  # noqa: E402


@pytest.fixture(scope="module")
def committed():
    data = json.loads((RESULTS / "cuda-model.json").read_text())
    model = data["model"]
    rows = [{**row, "events": cuda_model.events_from_json(row["events"])} for row in model["rows"]]
    return data, model, rows


def test_the_committed_table_is_what_the_model_makes_of_its_inputs(committed):
    """Refit and repredict from the json's inputs: every line of the markdown but its date."""
    data, model, rows = committed
    lines, regenerated = cuda_model.report(rows, model["copy_bandwidth_bytes_per_s"], model.get("h100_measured"))
    lines += ["", *cuda_model.sections(rows, {**model, "constants": regenerated["constants"]},
                                       cuda_model.measured_rows()[1], model["copy_bandwidth_bytes_per_s"])]
    committed_lines = (RESULTS / "cuda-model.md").read_text().splitlines()
    assert [line for i, line in enumerate(lines) if i != 2] == [l for i, l in enumerate(committed_lines) if i != 2]
    assert regenerated["constants"] == pytest.approx(model["constants"])


def _ratios(model, rows) -> dict[str, float]:
    constants = Constants(**model["constants"])
    bandwidth = model["copy_bandwidth_bytes_per_s"]
    return {cuda_model._key(row): device_model.predict(row["events"], H200, constants, bandwidth) / row["measured_s"]
            for row in rows}


def test_every_row_is_within_the_bar(committed):
    """The specialised and generic kernels, the three fused ones (tiled, tensor-core forward
    and grad_input) and involution_vectors.cu's three, as the sixth draw measured them. The
    fourth draw's bfloat16 tile rows had fallen short (0.33-0.50x): the instruction ratio had
    counted the kernel's cold subroutine in (``test_the_instruction_ratio_leaves_the_subroutines_out``)."""
    _, model, rows = committed
    for key, ratio in _ratios(model, rows).items():
        assert 1 / cuda_model.BAR <= ratio <= cuda_model.BAR, (key, ratio)
    assert {row["kernel"] for row in rows} >= {*cuda_model.FUSED, *cuda_model.VECTORS_ROWS}


def test_the_kernels_waiting_for_a_draw_are_predicted_at_every_row_they_serve(committed):
    """The ``LAST`` policy's calls, not yet timed on a GPU, are predicted at channels_last rows
    only: grad_weight (involution_last.cu's kernel) at every one (RedNet-50's 16 channels a
    group), the forward and grad_input wherever the ops' policy gives a thread more than one
    vector of channels (RedNet-50's first two stages in both dtypes at least); grad_input's
    other candidate (a vector a thread) at some of grad_input's rows and no other."""
    _, model, rows = committed
    last = {(c["shape"], c["dtype"], c["layout"], c["kernel"]) for c in model["candidates"]
            if c["kernel"].startswith("lanes on channels")}
    assert {case[2] for case in last} == {"channels_last"}
    served = {(r["shape"], r["dtype"], r["layout"]) for r in rows if r["kernel"] == "grad_weight"
              and r["layout"] == "channels_last"}
    assert served and {case[:3] for case in last if case[3] == cuda_model.LAST_GRAD_WEIGHT} == served
    for kernel in (cuda_model.LAST_FORWARD, cuda_model.LAST_GRAD_INPUT):
        for shape in ("stage1 64@56 s1", "stage2 128@28 s1"):
            for dtype in ("float32", "bfloat16"):
                assert (shape, dtype, "channels_last", kernel) in last
    # grad_input's other candidate under the policy, at the rows where the two differ
    vector = {(c["shape"], c["dtype"], c["layout"]) for c in model["candidates"]
              if c["kernel"] == cuda_model.LAST_GRAD_INPUT_VECTOR}
    assert vector and vector <= {case[:3] for case in last if case[3] == cuda_model.LAST_GRAD_INPUT}


def test_the_generator_kernel_is_predicted_at_every_bfloat16_and_float32_row(committed):
    """The generator gradients' tensor-core kernel, which no table row serves yet, at every
    bfloat16 and float32 (shape, layout) of the table (the dtypes it serves), at no other."""
    _, model, rows = committed
    generator = {(c["shape"], c["dtype"], c["layout"]) for c in model["candidates"] if c["kernel"] == cuda_model.GENERATOR}
    assert generator == {(r["shape"], r["dtype"], r["layout"]) for r in rows if r["dtype"] in ("bfloat16", "float32")}
    assert len(generator) == 28


def test_the_staged_tiles_are_predicted_on_every_gpu_and_the_hosts_are_the_fastest(committed):
    """Each tile choice (runs_w) of both staged kernels, at every row each serves (the stem's
    3 x 3 rows, which no draw timed, too), on the five GPUs of the per-architecture table, one
    marked the host's on each GPU (its choice with that GPU's occupancy); every one modelled on
    every GPU; the host's tiles within 6% of the model's fastest (5.1% at most: the staged
    grad_input's at RedNet-50's second stage at stride 2 in NCHW bfloat16, on the A100; 4.9% on
    the others), the A100's float32 forward at RedNet-50's last stage too (its estimate counts
    the weights every tile pixel forms, STAGED_FORMED_PIXEL: without them it took the 4-run
    tiles there, 1.12-1.21x the 2-run ones); at RedNet-50's 56 x 56 maps the forward's the fastest
    everywhere (its tiles chosen by the warps the map reaches), and at its 14 x 14 maps at stride
    1 the 2-run tiles on the L40S (two blocks an SM in its 100 KB, where the 4-run tiles fit one)
    and the 4-run tiles on the H200."""
    _, model, _ = committed
    entries, constants = model["architectures"], Constants(**model["constants"])
    gpus = {gpu.name: gpu for gpu in cuda_model.ARCH_GPUS}
    assert set(gpus) == set(device_model.GPUS) and len(gpus) == 5
    rows: dict[tuple, dict] = {}
    for entry in entries:
        row = rows.setdefault((entry["shape"], entry["dtype"], entry["layout"], entry["kernel"]), {})
        row.setdefault(entry["gpu"], {})[entry["runs_w"]] = entry
    # the rows of the measured table each kernel serves, and the stem's, which no draw timed
    served = {(c["shape"], c["dtype"], c["layout"], c["kernel"]) for c in model["candidates"] + model["unmeasured"]
              if c["kernel"] in cuda_model.TILE_CHOICES}
    assert set(rows) == served and len(served) == 60
    assert sum(key[0].startswith("stem") for key in served) == 8
    hosts = {}
    for key, row in rows.items():
        assert set(row) == set(gpus), key
        for name, choices in row.items():
            (host,) = [r for r, e in choices.items() if e["host"]]
            hosts[key, name] = host
            assert all(e["events"] is not None for e in choices.values()), (key, name)
            gpu = gpus[name]
            bandwidth = model["copy_bandwidth_bytes_per_s"] * gpu.dram_bytes_per_s / H200.dram_bytes_per_s
            times = {r: device_model.predict(cuda_model.events_from_json(e["events"]), gpu, constants, bandwidth)
                     for r, e in choices.items()}
            assert set(times) == {8, 4, 2}, (key, name)
            assert times[host] <= 1.06 * min(times.values()), (key, name, times)
            if key[0].startswith("stage1") and key[3] == cuda_model.STAGED_FORWARD:
                assert host == 2 and times[host] == min(times.values()), (key, name)
    stage3 = ("stage3 256@14 s1", "bfloat16", "channels_last", cuda_model.STAGED_FORWARD)
    assert hosts[stage3, device_model.L40S.name] == 2 and hosts[stage3, H200.name] == 4


def test_a_measured_map_route_replaces_its_estimate(committed):
    """Where a draw timed an op's map route (the generated grad_input and generator grads rows,
    from the seventh draw on), the forward + backward section takes it in place of its estimate:
    a row given a map route faster than everything else picks it, marked measured."""
    _, model, rows = committed
    row = {**next(r for r in rows if (r["shape"], r["dtype"], r["layout"]) == ("stage1 64@56 s1", "bfloat16", "NCHW")),
           "events": []}
    timed = rows + [{**row, "kernel": "generated grad_input", "measured_s": 1e-6},
                    {**row, "kernel": "generator grads", "measured_s": 2e-6}]
    lines = cuda_model.layer_lines(cuda_model.layer_totals(model["candidates"], model["changed"], timed,
                                                           cuda_model.measured_rows()[1], Constants(**model["constants"]),
                                                           model["copy_bandwidth_bytes_per_s"]))
    cells = next(line for line in lines if line.startswith("| stage1 64@56 s1 | bfloat16 | NCHW |")).split(" | ")
    assert cells[4:6] == ["1.0 (map route, measured)", "2.0 (map route, measured)"]
    assert sum("map route, measured" in line for line in lines if line.startswith("| stage")) == 1


def _run_with(tmp_path, columns: dict[tuple[str, str, str, str], dict[str, str]], extra_rows: list[dict]) -> Path:
    """A copy of the committed run with ``columns`` ((shape, dtype, layout, kernel) -> {column:
    value in ms}) added to its kernel table's rows and ``extra_rows`` appended."""
    data = json.loads(cuda_model.MEASURED.read_text())
    table = next(t for t in data["tables"] if t["heading"].startswith("CUDA: each kernel's device time"))
    names = {name for cells in columns.values() for name in cells} | {name for row in extra_rows for name in row}
    table["columns"] += sorted(names - set(table["columns"]))
    rows = []
    for cells in table["rows"]:
        row = dict(zip(table["columns"], cells))
        row.update(columns.get((row["shape"], row["dtype"], row["layout"], row["kernel"]), {}))
        rows.append(row)
    table["rows"] = [[row.get(name, "-") for name in table["columns"]] for row in rows + extra_rows]
    path = tmp_path / "involution-cuda.json"
    path.write_text(json.dumps(data))
    path.with_suffix(".md").write_text(cuda_model.MEASURED.with_suffix(".md").read_text())
    return path


def test_a_draws_columns_of_the_predicted_kernels_become_rows_and_replace_their_predictions(committed, tmp_path):
    """A run that times the predicted kernels in their columns ("staged", "dense window") and the
    generator's routes whole (its row, with the tensor-core kernel and the dense map): the kernels
    become measured rows (out of the predicted sections, into the fitted table), the routes are
    read, and the forward + backward section takes each, marked measured, where it is the fastest."""
    _, model, rows = committed
    case = ("stage4 512@7 s1", "bfloat16", "channels_last")
    path = _run_with(tmp_path, {(*case, "generated forward"): {"staged (ms)": "0.0010", "dense window (ms)": "0.0500"},
                                (*case, "grad_weight"): {"dense window (ms)": "0.0090"}},
                     [{"shape": case[0], "dtype": case[1], "layout": case[2], "kernel": "generator grads",
                       "device (ms)": "0.0400", "tensor cores (ms)": "0.0300", "dense window (ms)": "0.0020"}])
    _, measured = cuda_model.measured_rows(path)
    timed = {r["kernel"]: float(r["device (ms)"]) for r in measured if (r["shape"], r["dtype"], r["layout"]) == case}
    assert timed[cuda_model.STAGED_FORWARD] == 0.001 and timed[cuda_model.DENSE_FORWARD] == 0.05
    assert timed[cuda_model.DENSE_WEIGHT] == 0.009 and "generator grads" not in timed
    routes = cuda_model.route_times(path)
    key = " | ".join(case)
    assert routes == {f"{key} | {cuda_model.GENERATOR_ROUTE}": pytest.approx(40e-6),
                      f"{key} | {cuda_model.GENERATOR_SUMS_ROUTE}": pytest.approx(30e-6),
                      f"{key} | {cuda_model.DENSE_MAP_ROUTE}": pytest.approx(2e-6)}
    row = {**next(r for r in rows if (r["shape"], r["dtype"], r["layout"]) == case), "events": []}
    lines = cuda_model.layer_lines(cuda_model.layer_totals(
        model["candidates"], model["changed"], rows + [{**row, "kernel": cuda_model.STAGED_FORWARD, "measured_s": 1e-6}],
        cuda_model.measured_rows()[1], Constants(**model["constants"]), model["copy_bandwidth_bytes_per_s"], routes))
    cells = next(line for line in lines if line.startswith(f"| {case[0]} | bfloat16 | channels_last |")).split(" | ")
    assert cells[3] == "1.0 (staged, measured)" and cells[5] == "2.0 (dense map, measured)", cells
    # without the run's routes or rows, the same cells are the predictions
    plain = cuda_model.layer_lines(cuda_model.layer_totals(
        model["candidates"], model["changed"], rows, cuda_model.measured_rows()[1], Constants(**model["constants"]),
        model["copy_bandwidth_bytes_per_s"], {}))
    assert not any("measured)" in cell for line in plain if line.startswith(f"| {case[0]} | bfloat16 | channels_last |")
                   for cell in line.split(" | ")[3:6] if "tensor cores" not in cell)


def test_rednet50s_involutions_are_counted_by_shape():
    """RedNet-50 at 224 px: its bottlenecks' 16 involutions (3, 4, 6 and 3 a stage, the first of
    stages 2-4 at stride 2 on the larger map) and the stem's, each a shape of the tables."""
    counts, others = cuda_model.rednet50_involutions()
    assert counts == {"stage1 64@56 s1": 3, "stage2 128@28 s1": 3, "stage3 256@14 s1": 5, "stage4 512@7 s1": 2,
                      "stage2 128@56 s2": 1, "stage3 256@28 s2": 1, "stage4 512@14 s2": 1, "stem 32@112 k3 s1": 1}
    assert others == []


def test_the_network_section_replaces_the_unfused_layers_time_by_the_fused():
    """Two shapes' bfloat16 channels_last totals, counted 3 and 1 times: inference rows trade the
    forward sums, training rows the forward + backward sums; rows of another batch are left out,
    and the other dtypes' and layouts' totals count for nothing."""
    def total(shape, dtype="bfloat16", layout="channels_last", forward=1e-3, unfused_forward=2e-3, fused=3e-3,
              unfused=5e-3):
        return {"shape": shape, "dtype": dtype, "layout": layout, "forward": ("staged, predicted", forward),
                "unfused_forward": unfused_forward, "fused": fused, "unfused": unfused}

    totals = [total("a"), total("b", forward=2e-3, unfused_forward=4e-3, fused=4e-3, unfused=8e-3),
              total("a", layout="NCHW", forward=9.0), total("b", dtype="float32", fused=9.0)]
    models = [["inference, reduce-overhead", "32", "1000", "2000", "0.50x"], ["train, eager", "32", "100", "400", "0.25x"],
              ["train, eager", "128", "100", "400", "0.25x"]]
    # "c" has layers but no totals (a shape no draw has timed): counted on neither side, and named
    lines = cuda_model.network_lines(totals, {"a": 3, "b": 1, "c": 2}, [], models)
    assert "RedNet-50's 4 involution layers of the table's shapes (3 x a, 1 x b; 2 x c besides," in lines[2]
    rows = [line.split(" | ") for line in lines if line.startswith("| inference") or line.startswith("| train")]
    # inference: unfused forward 3 x 2 + 4 = 10 ms, fused 3 x 1 + 2 = 5 ms; a step of 32 ms
    assert rows[0][2:8] == ["32.00", "16.00", "10.00", "31%", "5.00", "27.00"]
    # training: unfused 3 x 5 + 8 = 23 ms, fused 3 x 3 + 4 = 13 ms; a step of 320 ms
    assert rows[1][2:8] == ["320.00", "80.00", "23.00", "7%", "13.00", "310.00"]
    assert len(rows) == 2 and rows[1][-1] == "0.26x |"


def test_the_kernels_bar_is_twice_the_floor_or_10_us_under_a_5_us_floor():
    assert cuda_model.within_bar(12e-6, 6e-6) and not cuda_model.within_bar(12.1e-6, 6e-6)
    assert cuda_model.within_bar(10e-6, 4.9e-6) and not cuda_model.within_bar(10.1e-6, 4.9e-6)
    assert cuda_model.within_bar(9.8e-6, 4.9e-6) and not cuda_model.within_bar(10.1e-6, 5e-6)


def test_the_shapes_no_draw_timed_are_predicted_whole(committed):
    """The stem's involution (3 x 3 at 112 x 112) has no row in the sixth draw's table: the model
    predicts every kernel column there, in the table's dtypes and layouts, involution's three as
    the ops run them now (not the chunked kernels the table's rows time), and the committed page
    has a row of each."""
    _, model, rows = committed
    cases = cuda_model.unmeasured_cases(rows)
    assert cases == [("stem 32@112 k3 s1", dtype, layout) for dtype in ("float32", "bfloat16")
                     for layout in ("NCHW", "channels_last")]
    entries = model["unmeasured"]
    assert list(dict.fromkeys((e["shape"], e["dtype"], e["layout"]) for e in entries)) == cases
    for case in cases:
        kernels = {e["kernel"]: e for e in entries if (e["shape"], e["dtype"], e["layout"]) == case}
        assert {"forward", "grad_input", "grad_weight", "generated forward", cuda_model.STAGED_FORWARD} <= set(kernels)
        names = {kernel: cuda_model.events_from_json(kernels[kernel]["events"])[0].kernel.split("<")[0]
                 for kernel in ("forward", "grad_weight")}
        # as the op runs them: the vectors kernels on NCHW maps (widths a multiple of 4)
        if case[2] == "NCHW":
            assert names == {"forward": "involution_forward_vectors", "grad_weight": "involution_backward_weight_vectors"}
    page = (RESULTS / "cuda-model.md").read_text()
    section = page.split("## Predicted, not yet measured: RedNet-50's shapes no draw has timed")[1].split("\n## ")[0]
    table = [line for line in section.splitlines() if line.startswith("| stem 32@112 k3 s1 |")]
    assert len(table) == len(entries) + len(cases)  # a row per kernel, and the fused forward's per case


def test_the_map_routes_floors_count_the_bytes_by_hand():
    """RedNet-50's last stage at stride 1, batch 32 (input and grad_output 32 x 512 x 7 x 7, the
    feature 32 x 128 x 7 x 7, the weight map 32 x 32 x 49 x 7 x 7) at 1e12 bytes a second: the
    generator's map route copies grad_output, the input and the feature to float32 (2 bytes
    read, 4 written each), reads the float32 map three times, the float32 feature once, writes
    grad_feature in float32 and copies it back (4 read, 2 written; float32 operands are no
    copies, and 4 written back); the span conv's backward reads the 16-bit map and the feature
    and writes grad_feature."""
    activation, feature, weight_map = 32 * 512 * 49, 32 * 128 * 49, 32 * 32 * 49 * 49
    copies = (2 * activation + feature) * 6
    contractions = 3 * weight_map * 4 + feature * 4 + feature * 4 + feature * 6
    assert cuda_model.generator_map_route_floor("stage4 512@7 s1", torch.bfloat16, 1e12) == pytest.approx(
        (copies + contractions) / 1e12, rel=1e-12)
    # float32 operands are not copied; grad_feature is still copied into the op's result
    assert cuda_model.generator_map_route_floor("stage4 512@7 s1", torch.float32, 1e12) == pytest.approx(
        (contractions + feature * 2) / 1e12, rel=1e-12)
    assert cuda_model.span_conv_backward_floor("stage4 512@7 s1", torch.bfloat16, 1e12) == pytest.approx(
        (weight_map + 2 * feature) * 2 / 1e12, rel=1e-12)


def test_every_h100_row_is_within_the_bar_with_the_h200_constants(committed):
    """The H100 run of make gpu-check: a GPU the constants were not fitted on."""
    _, model, rows = committed
    h100 = model["h100_measured"]
    measured = {r["key"]: r["measured_s"] for r in h100["rows"]}
    # every row of the H100's table (it has no fused or vectors kernels' columns yet) whose call
    # ran the kernel the row models
    others = {*cuda_model.FUSED, *cuda_model.CANDIDATES, *cuda_model.H100_OTHER_KERNEL}
    assert len(measured) == len([row for row in rows if row["kernel"] not in others])
    constants = Constants(**model["constants"])
    outside = []
    for row in (row for row in rows if row["kernel"] not in others):
        predicted = device_model.predict(row["events"], H100_SXM, constants, h100["copy_bandwidth_bytes_per_s"])
        ratio = predicted / measured[cuda_model._key(row)]
        if not 1 / cuda_model.BAR <= ratio <= cuda_model.BAR:
            outside.append(cuda_model._key(row))
    # Fitted on the sixth draw, the H100's stride-2 NCHW grad_input rows fall short (0.33-0.47x),
    # as the report says: no other row, and never on the H200 itself
    assert outside == [key for key in outside if key.endswith("s2 | float32 | NCHW | grad_input")
                       or key.endswith("s2 | bfloat16 | NCHW | grad_input")]
    assert len(outside) <= 6
    line = next(l for l in (RESULTS / "cuda-model.md").read_text().splitlines() if l.startswith("On an H100"))
    assert all(key in line for key in outside)


def test_the_rows_are_those_of_the_measured_table(committed):
    _, model, _ = committed
    _, measured = cuda_model.measured_rows()
    assert [(r["shape"], r["dtype"], r["layout"], r["kernel"]) for r in model["rows"]] == [
        (r["shape"], r["dtype"], r["layout"], r["kernel"]) for r in measured]
    assert [r["measured_s"] for r in model["rows"]] == [float(r["device (ms)"]) * 1e-3 for r in measured]


@pytest.mark.parametrize(
    "gpu, registers, threads, shared, blocks",
    [
        # CUDA Occupancy Calculator, compute capability 9.0 and 8.0
        (H200, 32, 256, 0, 8),  # the thread limit: 2048 per SM
        (H200, 56, 256, 0, 4),  # 56 registers -> 1792 per warp -> 9 warps per scheduler -> 36 warps
        (H200, 64, 256, 0, 4),
        (H200, 48, 256, 0, 5),  # 1536 per warp -> 10 warps per scheduler
        (H200, 128, 256, 0, 2),
        (H200, 255, 256, 0, 1),
        (H200, 64, 1024, 0, 1),
        (H200, 16, 32, 0, 32),  # the block limit
        (H200, 32, 256, 100 * 1024, 2),  # 100 KB + 1 KB reserved per block out of 228 KB
        (H200, 32, 128, 48 * 1024, 4),
        (A100_SXM, 32, 256, 100 * 1024, 1),  # 164 KB per SM
        (A100_SXM, 64, 256, 0, 4),
    ],
)
def test_occupancy_matches_the_calculator(gpu, registers, threads, shared, blocks):
    assert device_model.resident_blocks(registers, threads, shared, gpu) == blocks


def test_occupancy_agrees_with_the_resource_table_rule():
    from oplib.testing.nvrtc import resident_blocks

    for registers in range(16, 256, 7):
        assert device_model.resident_blocks(registers, 256, 0, H200) == resident_blocks(registers, "sm_90")


def _streaming(megabytes: float) -> LaunchInputs:
    """A launch that reads and writes ``megabytes`` once, coalesced: DRAM-bound."""
    warps = int(megabytes * 1e6 / 128 / 2)
    work = KernelWork(warps=warps, load_requests=warps, load_lines=warps, store_requests=warps, store_lines=warps,
                      fma_requests=0, dram_bytes=int(megabytes * 1e6))
    return LaunchInputs("copy<float>", blocks=-(-warps // 8), threads_per_block=256, shared_bytes=0, registers=16,
                        loads_in_flight=1, widest_load=4, work=work)


@pytest.mark.parametrize("gpu", [H200, H100_SXM, A100_SXM], ids=lambda gpu: gpu.name)
def test_twice_the_bytes_takes_twice_the_time_when_dram_binds(gpu):
    constants = Constants(request_cycles=1, line_cycles=1, latency_cycles=500, launch_seconds=0)
    one, two = _streaming(256), _streaming(512)
    assert device_model.launch_terms(one, gpu, constants, gpu.dram_bytes_per_s).bound == "dram"
    ratio = device_model.predict([two], gpu, constants) / device_model.predict([one], gpu, constants)
    assert ratio == pytest.approx(2, rel=1e-6)
    # and the H200's larger bandwidth makes the same launch faster than on an H100
    assert device_model.predict([one], H200, constants) < device_model.predict([one], H100_SXM, constants)


def test_a_tail_block_costs_a_whole_wave():
    """One block more than the SMs hold at once doubles the busiest SM's share."""
    constants = Constants(request_cycles=1, line_cycles=1, latency_cycles=100, launch_seconds=0)
    base = _streaming(1)
    full = dataclasses.replace(base, blocks=H200.sms)
    tail = dataclasses.replace(base, blocks=H200.sms + 1)
    terms = [device_model.launch_terms(x, H200, constants, 1e30) for x in (full, tail)]
    assert terms[1].l1 / terms[0].l1 == pytest.approx(2 * H200.sms / (H200.sms + 1))


def test_a_grid_smaller_than_the_gpu_issues_with_the_warps_it_has():
    """One block per SM where eight fit (16 registers, 256 threads): each scheduler holds two
    warps, not sixteen, to hide a warp's dependent instructions; the issue term of the same
    work over eight times the blocks (each an eighth of it) is an eighth per block, the
    SM's share the same: the grid that fills the SMs issues four times as fast (8.5 cycles
    between a warp's instructions: 2 warps a scheduler wait 4.25 cycles an instruction, 16
    none past 1). The generator kernel's split groups (RedNet-50's small maps) rest on it."""
    constants = Constants(request_cycles=1, line_cycles=1, latency_cycles=100, launch_seconds=0,
                          dependent_issue_cycles=8.5)
    base = _streaming(1)
    one = dataclasses.replace(base, blocks=H200.sms)
    eight = dataclasses.replace(base, blocks=8 * H200.sms)
    terms = [device_model.launch_terms(x, H200, constants, 1e30) for x in (one, eight)]
    assert terms[0].issue / terms[1].issue == pytest.approx(8.5 / 2)


def test_tensor_core_work_takes_its_rate():
    """A launch's tensor-core multiply-adds (float32's 3xTF32) over the SM's dense rate, the
    busiest SM's share: where nothing else binds, that term does, and twice the work takes
    twice the time."""
    constants = Constants(request_cycles=1, line_cycles=1, latency_cycles=100, launch_seconds=0)
    base = _streaming(1)
    macs = 1e12
    heavy = dataclasses.replace(base, blocks=H200.sms, work=dataclasses.replace(base.work, tensor_macs=macs))
    terms = device_model.launch_terms(heavy, H200, constants, 1e30)
    assert terms.bound == "tensor"
    assert terms.tensor == pytest.approx(macs / H200.sms / (H200.tensor_macs_per_clock * H200.clock_hz))
    twice = dataclasses.replace(heavy, work=dataclasses.replace(base.work, tensor_macs=2 * macs))
    assert device_model.launch_terms(twice, H200, constants, 1e30).tensor == pytest.approx(2 * terms.tensor)


def test_lines_of_coalesced_and_scattered_lanes():
    lanes = torch.arange(32).view(1, 32)
    tally = device_model._Tally(torch.ones(1, 32, dtype=torch.bool), 128)
    tally.load(0, lanes, torch.ones(1, 32, dtype=torch.bool), 4)  # 32 adjacent floats: one line
    tally.load(0, lanes * 32, torch.ones(1, 32, dtype=torch.bool), 4)  # a line apart: 32 lines
    tally.load(0, lanes * 4, torch.ones(1, 32, dtype=torch.bool), 4)  # 16-byte vectors: four lines
    tally.load(0, lanes, lanes < 0, 4)  # no lane active: no request
    assert tally.counts["load_requests"] == 3 and tally.counts["load_lines"] == 1 + 32 + 4


# involution_vectors.cu at bfloat16, 3x3, padding 1, a 128-pixel row: one warp a row (32 vectors
# of 4 pixels), 4 channels a thread. Per kernel row inside the image (22 over the 8 warps: the
# first and last rows have 2), the row's weight vectors, then per channel 3 window vectors, each
# warp access 256 contiguous bytes or 248 (a border lane's vector outside): two lines; 12
# multiply-adds a channel; a vector store a channel. The forward's weights are 3 vectors a row
# (one a tap); grad_input's tap b reads columns x + 1 - b, two vectors where they are not
# aligned to the lane's pixels (b = 0, 2) and one where they are (b = 1): 5.
VECTOR_TRACES = {
    "forward": ("involution_vectors", lambda t, w: (t, w, [1, 1], [1, 1], [1, 1]), 3),
    "grad_input": ("involution_vectors_backward_input", lambda t, w: (t, w, [8, 128], [1, 1], [1, 1], [1, 1]), 5),
}


@pytest.mark.parametrize("kernel", VECTOR_TRACES)
def test_the_vectors_traces_count_a_launch_counted_by_hand(kernel):
    from oplib.kernels.involution import cuda as involution_cuda

    function, arguments, weight_loads = VECTOR_TRACES[kernel]
    t, w = torch.randn(1, 4, 8, 128, dtype=torch.bfloat16), torch.randn(1, 1, 3, 3, 8, 128, dtype=torch.bfloat16)
    recording = device_model.RecordingLauncher()
    assert getattr(involution_cuda, function)(*arguments(t, w), torch.empty_like(t), recording) is not None
    work = device_model.kernel_work(recording.launches[0])
    rows, loads = 6 * 3 + 2 * 2, weight_loads + 4 * 3
    assert work.warps == 8
    assert (work.load_requests, work.load_lines) == (rows * loads, rows * loads * 2)
    assert (work.store_requests, work.store_lines) == (8 * 4, 8 * 4 * 2)
    assert work.fma_requests == rows * 4 * 3 * 4


def test_the_wide_vectors_forward_trace_counts_a_launch_counted_by_hand():
    """The forward's WIDE instantiation at the same row with 8 channels in one group: 8 channels
    a thread, still one warp a row. Per kernel row inside the image the row's 3 weight vectors,
    then per channel 3 window vectors (two lines each); 12 multiply-adds a channel; a vector
    store a channel."""
    from oplib.kernels.involution import cuda as involution_cuda

    x, w = torch.randn(1, 8, 8, 128, dtype=torch.bfloat16), torch.randn(1, 1, 3, 3, 8, 128, dtype=torch.bfloat16)
    recording = device_model.RecordingLauncher()
    assert involution_cuda.involution_vectors(x, w, [1, 1], [1, 1], [1, 1], torch.empty_like(x), recording,
                                              involution_cuda.VECTORS_WIDE) is not None
    (launch,) = recording.launches
    assert launch.specialisation == ("3", "1", "true")
    work = device_model.kernel_work(launch)
    rows, loads = 6 * 3 + 2 * 2, 3 + 8 * 3
    assert work.warps == 8
    assert (work.load_requests, work.load_lines) == (rows * loads, rows * loads * 2)
    assert (work.store_requests, work.store_lines) == (8 * 8, 8 * 8 * 2)
    assert work.fma_requests == rows * 8 * 3 * 4


def test_the_vectors_grad_weight_trace_counts_a_launch_counted_by_hand():
    """involution_vectors.cu's grad_weight at the same launch: a warp a (kernel row, output row)
    pair, 24 warps, 22 of them reading a row inside the image. Per channel (4) a grad_output
    vector and 3 window vectors, two lines each; 12 multiply-adds; every warp stores its row's 3
    taps, a vector each."""
    from oplib.kernels.involution import cuda as involution_cuda

    g, x = torch.randn(1, 4, 8, 128, dtype=torch.bfloat16), torch.randn(1, 4, 8, 128, dtype=torch.bfloat16)
    recording = device_model.RecordingLauncher()
    out = torch.empty(1, 1, 3, 3, 8, 128, dtype=torch.bfloat16)
    assert involution_cuda.involution_vectors_backward_weight(g, x, [3, 3], [1, 1], [1, 1], [1, 1], 1, out,
                                                              recording) is not None
    work = device_model.kernel_work(recording.launches[0])
    inside = 7 + 8 + 7
    assert work.warps == 24
    assert (work.load_requests, work.load_lines) == (inside * 4 * 4, inside * 4 * 4 * 2)
    assert (work.store_requests, work.store_lines) == (24 * 3, 24 * 3 * 2)
    assert work.fma_requests == inside * 4 * 12


def test_the_lanes_on_channels_forward_trace_counts_a_launch_counted_by_hand():
    """involution_last.cu's forward at a 1x3 map of 16 float32 channels (4 lanes a group), a
    3x3 kernel, padding 1: two pixels a lane, so 8 work items, warp 0's first 8 lanes: lanes
    0-3 pixels 0 and 1, lanes 4-7 pixel 2 and one past the row. The warp's records 0 to 2, 27
    floats, copied as 6 vectors and 3 values (a load and a shared store each). Every lane loads
    the 4 input columns of each of the 3 kernel rows; only the middle row lies in the image,
    where the first pixels' taps are columns 0-2 (pixel 0: 1-2, pixel 2: 0-1) and the second
    pixels' columns 1-3 (a shared read and 4 multiply-adds a column each); one store for the
    first pixels, one for the second pixels of lanes 0-3."""
    from oplib.kernels.involution import cuda as involution_cuda
    from oplib.kernels.involution.layouts import as_pixel_major

    x = torch.randn(1, 16, 1, 3).to(memory_format=torch.channels_last)
    w = as_pixel_major(torch.randn(1, 1, 3, 3, 1, 3))
    recording = device_model.RecordingLauncher()
    out = torch.empty(1, 16, 1, 3).to(memory_format=torch.channels_last)
    assert involution_cuda.involution_last(x, w, [1, 1], [1, 1], [1, 1], out, recording) is not None
    (launch,) = recording.launches
    assert launch.kernel == "involution_forward_last" and launch.scalars[0] == 8
    work = device_model.kernel_work(launch)
    assert (work.load_requests, work.store_requests) == (2 + 3 * 4, 2)
    assert (work.shared_requests, work.fma_requests) == (2 + 3 + 3, (3 + 3) * 4)


def test_the_lanes_on_channels_grad_weight_trace_counts_a_launch_counted_by_hand():
    """involution_last.cu's grad_weight at the forward's 1x3 map above (16 float32 channels, 4
    lanes a group, a 3x3 kernel, padding 1, two pixels a lane: warp 0's lanes 0-7). Loads: the
    first pixels' grad_output (lanes 0-7) and the second pixels' (lanes 0-3), and the 4 input
    columns of each of the 3 kernel rows, every row (outside the image too): 2 + 12. Per row, 3
    taps of each pixel, 4 multiply-adds each: 72 in all; each tap's sum over 4 lanes, 2 shuffle
    levels (traced as shared passes): 12 a row; each tap staged by the one part whose share it
    is, 6 a row. The warp's records 0 to 2 are one run (the second pair has no second pixel):
    27 floats copied out as 6 vectors and 3 values, a shared read and a store each."""
    from oplib.kernels.involution import cuda as involution_cuda
    from oplib.kernels.involution.layouts import weight_result

    g = torch.randn(1, 16, 1, 3).to(memory_format=torch.channels_last)
    x = torch.randn(1, 16, 1, 3).to(memory_format=torch.channels_last)
    out = weight_result(g, (1, 1, 3, 3, 1, 3), True)
    recording = device_model.RecordingLauncher()
    assert involution_cuda.involution_last_backward_weight(g, x, [3, 3], [1, 1], [1, 1], [1, 1], 1, out,
                                                           recording) is not None
    (launch,) = recording.launches
    assert launch.kernel == "involution_backward_weight_last" and launch.scalars[0] == 8
    work = device_model.kernel_work(launch)
    assert (work.load_requests, work.store_requests) == (2 + 3 * 4, 2)
    assert (work.shared_requests, work.fma_requests) == (3 * (12 + 6) + 2, 3 * 6 * 4)


def test_the_lanes_on_channels_traces_count_a_pixel_a_lane_by_hand():
    """The two launches above with a pixel a lane (``LAST_ONE_PIXEL``): 12 work items, warp 0's
    lanes 0-11, a pixel each; the warp's records 0 to 2 one run, copied as before (2 loads and 2
    shared stores in the forward, 2 shared reads and 2 stores in grad_weight). Each lane loads
    the 3 input columns of each kernel row. The forward: in the middle row, 3 taps (a shared read
    and 4 multiply-adds each), one store. grad_weight: one grad_output load; per row 3 taps of 4
    multiply-adds, 2 shuffle levels a tap (6 shared passes) and 3 staged: 36 multiply-adds."""
    from oplib.kernels.involution import cuda as involution_cuda
    from oplib.kernels.involution.layouts import as_pixel_major, weight_result

    one = involution_cuda.LAST_ONE_PIXEL
    x = torch.randn(1, 16, 1, 3).to(memory_format=torch.channels_last)
    w = as_pixel_major(torch.randn(1, 1, 3, 3, 1, 3))
    forward = device_model.RecordingLauncher()
    out = torch.empty(1, 16, 1, 3).to(memory_format=torch.channels_last)
    assert involution_cuda.involution_last(x, w, [1, 1], [1, 1], [1, 1], out, forward, one) is not None
    (launch,) = forward.launches
    assert launch.specialisation == ("3", "1", "1") and launch.scalars[0] == 12
    work = device_model.kernel_work(launch)
    assert (work.load_requests, work.store_requests) == (2 + 3 * 3, 1)
    assert (work.shared_requests, work.fma_requests) == (2 + 3, 3 * 4)
    grad_weight = device_model.RecordingLauncher()
    out = weight_result(x, (1, 1, 3, 3, 1, 3), True)
    assert involution_cuda.involution_last_backward_weight(x, x, [3, 3], [1, 1], [1, 1], [1, 1], 1, out,
                                                           grad_weight, one) is not None
    (launch,) = grad_weight.launches
    assert launch.specialisation == ("3", "1", "1") and launch.scalars[0] == 12
    work = device_model.kernel_work(launch)
    assert (work.load_requests, work.store_requests) == (1 + 3 * 3, 2)
    assert (work.shared_requests, work.fma_requests) == (3 * (6 + 3) + 2, 3 * 3 * 4)


def test_the_lanes_on_channels_grad_input_trace_counts_a_launch_counted_by_hand():
    """involution_last.cu's grad_input at a 1x4 map of 16 float32 channels (4 vectors a pixel:
    a block a segment of 64 pixels of a band of 2 rows, one block, 8 warps, the first 16 lanes
    active), a 3x3 kernel, padding 1: the band reads the one output row, from which its first
    row takes kernel row 1 and its second (past the image) kernel row 2. Their pieces, 4
    records of one group, 2 x 3 values each, copied a value a lane by 6 of 8 lanes a piece (a
    load and a shared store of warp 0); then every warp loads its 3 taps' grad_output vectors (every lane loads),
    and warp 0 alone reads each tap's weight for each of the band's two rows from shared memory
    and adds 4 multiply-adds for each; one vector store, warp 0's first row's (the second is
    past the image)."""
    from oplib.kernels.involution import cuda as involution_cuda
    from oplib.kernels.involution.layouts import as_pixel_major

    g = torch.randn(1, 16, 1, 4).to(memory_format=torch.channels_last)
    w = as_pixel_major(torch.randn(1, 1, 3, 3, 1, 4))
    recording = device_model.RecordingLauncher()
    out = torch.empty(1, 16, 1, 4).to(memory_format=torch.channels_last)
    assert involution_cuda.involution_last_backward_input(g, w, [1, 4], [1, 1], [1, 1], [1, 1], out,
                                                          recording) is not None
    (launch,) = recording.launches
    assert launch.kernel == "involution_backward_input_last" and launch.blocks == 1
    work = device_model.kernel_work(launch)
    assert work.warps == 8
    assert (work.load_requests, work.store_requests) == (1 + 8 * 3, 1)
    assert (work.shared_requests, work.fma_requests) == (1 + 3 * 2, 3 * 2 * 4)


def test_the_lanes_on_channels_grad_input_trace_counts_16_bit_units_by_hand():
    """The same launch in bfloat16 (2 vectors a pixel: the first 8 lanes active): each piece's
    6 values are 3 units of two, staged by 3 of 4 lanes a piece, warp 0's first 16. The pieces
    start at values 3, 12, 21 and 30 of the weight: the first and third at a unit's second
    value, so their lanes load the unit of memory after theirs too. Two loads and a shared
    store of warp 0; the rest as in float32, 8 multiply-adds a weight."""
    from oplib.kernels.involution import cuda as involution_cuda
    from oplib.kernels.involution.layouts import as_pixel_major

    g = torch.randn(1, 16, 1, 4, dtype=torch.bfloat16).to(memory_format=torch.channels_last)
    w = as_pixel_major(torch.randn(1, 1, 3, 3, 1, 4, dtype=torch.bfloat16))
    recording = device_model.RecordingLauncher()
    out = torch.empty(1, 16, 1, 4, dtype=torch.bfloat16).to(memory_format=torch.channels_last)
    assert involution_cuda.involution_last_backward_input(g, w, [1, 4], [1, 1], [1, 1], [1, 1], out,
                                                          recording) is not None
    (launch,) = recording.launches
    work = device_model.kernel_work(launch)
    assert work.warps == 8
    assert (work.load_requests, work.store_requests) == (2 + 8 * 3, 1)
    assert (work.shared_requests, work.fma_requests) == (1 + 3 * 2, 3 * 2 * 8)


def test_the_staged_grad_input_trace_counts_a_launch_counted_by_hand():
    """generated_mma.cu's staged grad_input at an 8 x 32 input of one group of 16 bfloat16
    channels (channels_last), a 3x3 kernel at stride 1, padding 1, in runs of 8 along a row: one
    block, a tile of 8 rows x 32 columns, 8 warps. Each warp takes each of the 3 kernel rows:
    12 (tap, pixel) pairs of its runs, 4 multiply-adds each; then each lane stores its 4 pixels
    x 2 pairs of channels, a 32-bit store each."""
    from oplib.kernels.involution import cuda as involution_cuda

    g = torch.randn(1, 16, 8, 32, dtype=torch.bfloat16).to(memory_format=torch.channels_last)
    f = torch.randn(1, 16, 8, 32, dtype=torch.bfloat16).to(memory_format=torch.channels_last)
    s = torch.randn(9, 16, dtype=torch.bfloat16)
    out = torch.empty(1, 16, 8, 32, dtype=torch.bfloat16).to(memory_format=torch.channels_last)
    recording = device_model.RecordingLauncher()
    assert involution_cuda.involution_generated_mma_backward_input_staged(
        g, f, s, None, [8, 32], [3, 3], [1, 1], [1, 1], [1, 1], out, recording, runs_w=8) is not None
    (launch,) = recording.launches
    assert launch.kernel == "involution_generated_mma_backward_input_staged" and launch.blocks == 1
    work = device_model.kernel_work(launch)
    assert work.warps == 8
    assert work.fma_requests == 8 * 3 * 12 * 4
    assert work.store_requests == 8 * 4 * 2


def test_the_float32_staged_grad_input_trace_counts_a_launch_counted_by_hand():
    """The same launch in float32 (3xTF32): the same sums and stores (a pair of channels an
    8-byte store); on tensor cores, per kernel row, the 17 m-tiles of 16 of the 8 x 34 output
    pixels its tile reads (8 rows of the 32 columns and their halo), 2 k-steps of 8 of R, one
    n-tile (the row's taps), three TF32 products each, 1024 multiply-adds a product counted as
    two BF16 ones."""
    from oplib.kernels.involution import cuda as involution_cuda

    g = torch.randn(1, 16, 8, 32).to(memory_format=torch.channels_last)
    f = torch.randn(1, 16, 8, 32).to(memory_format=torch.channels_last)
    out = torch.empty(1, 16, 8, 32).to(memory_format=torch.channels_last)
    recording = device_model.RecordingLauncher()
    assert involution_cuda.involution_generated_mma_backward_input_staged(
        g, f, torch.randn(9, 16), None, [8, 32], [3, 3], [1, 1], [1, 1], [1, 1], out, recording, runs_w=8) is not None
    (launch,) = recording.launches
    work = device_model.kernel_work(launch)
    assert work.warps == 8 and launch.dtype == torch.float32
    assert work.fma_requests == 8 * 3 * 12 * 4
    assert work.store_requests == 8 * 4 * 2
    assert work.tensor_macs == 3 * 17 * 2 * 3 * 2 * 1024


def test_the_staged_forward_trace_counts_a_launch_counted_by_hand():
    """generated_mma.cu's staged forward at a 6 x 30 output of one group of 16 bfloat16 channels
    (channels_last), a 3x3 kernel at stride 1, padding 1, in runs of 8 along a row: one block, a
    tile of 8 rows x 32 columns, 8 warps, a warp a row. Warps 0-5 (the map's rows) take each of
    the 3 kernel rows: 6 window columns meet 12 (tap, pixel) pairs of its runs, 4 multiply-adds
    each, after 3 16-byte weight loads and 6 8-byte input loads; then each lane stores its
    pixels in the map x 2 pairs of channels, a 32-bit store each (a warp's 4 pixels, as its
    first 7 runs lie in the map). Warps 6 and 7 form weights and neither sum nor store."""
    from oplib.kernels.involution import cuda as involution_cuda

    x = torch.randn(1, 16, 6, 30, dtype=torch.bfloat16).to(memory_format=torch.channels_last)
    f = torch.randn(1, 16, 6, 30, dtype=torch.bfloat16).to(memory_format=torch.channels_last)
    s = torch.randn(9, 16, dtype=torch.bfloat16)
    out = torch.empty(1, 16, 6, 30, dtype=torch.bfloat16).to(memory_format=torch.channels_last)
    recording = device_model.RecordingLauncher()
    assert involution_cuda.involution_generated_mma_staged(x, f, s, None, [3, 3], [1, 1], [1, 1], [1, 1], out,
                                                           recording, runs_w=8) is not None
    (launch,) = recording.launches
    assert launch.kernel == "involution_generated_mma_staged" and launch.blocks == 1
    work = device_model.kernel_work(launch)
    assert work.warps == 8
    assert work.fma_requests == 6 * 3 * 12 * 4
    assert work.store_requests == 6 * 4 * 2
    # shared memory, warp instructions: the span's 16 rows of 8 words, 2 16-byte units a row
    # (warp 0, a store) and their 16 biases (warp 0); the region the map's pixels read, 8 x 32 (not the
    # tile's 10 x 34), 512 units, 2 passes of the block, 4 word stores a unit; per warp, 2
    # m-tiles of 2 n-tiles (one k-step): a bias load and an ldmatrix each, and the stores of
    # taps 0-7 (2 values, a lane's two pixels one 8-byte store each) and of tap 8 (quad 0's
    # first value, its two pixels one store); the sums' 3 + 6 loads a kernel row
    assert work.shared_requests == 1 + 1 + 16 * 4 + 8 * 2 * (2 + 2 + 2 + 1) + 6 * 3 * (3 + 6)


def test_the_float32_staged_forward_trace_counts_a_launch_counted_by_hand():
    """The same launch in float32 (3xTF32): the same sums and stores (a pair of channels an
    8-byte store); in shared memory, the span's 16 rows of 16 floats a unit each, 256 units, a
    store by each of the 8 warps; the 16 biases (warp 0); the region's 8 x 32 pixels in 4
    quarters of 4 channels, 1024 units, 4 passes of the block, a 16-byte store each; per warp,
    2 m-tiles of 2 n-tiles and 2 k-steps of 8: a bias load per n-tile, an 8-byte load of the
    span's pair per n-tile and k-step, the same weight stores; the sums' 3 + 6 loads a kernel
    row. On tensor cores, three TF32 products per n-tile and k-step, 1024 multiply-adds each,
    counted as two BF16 ones (half the rate)."""
    from oplib.kernels.involution import cuda as involution_cuda

    x = torch.randn(1, 16, 6, 30).to(memory_format=torch.channels_last)
    f = torch.randn(1, 16, 6, 30).to(memory_format=torch.channels_last)
    out = torch.empty(1, 16, 6, 30).to(memory_format=torch.channels_last)
    recording = device_model.RecordingLauncher()
    assert involution_cuda.involution_generated_mma_staged(x, f, torch.randn(9, 16), None, [3, 3], [1, 1], [1, 1],
                                                           [1, 1], out, recording, runs_w=8) is not None
    (launch,) = recording.launches
    work = device_model.kernel_work(launch)
    assert work.warps == 8 and launch.dtype == torch.float32
    assert work.fma_requests == 6 * 3 * 12 * 4
    assert work.store_requests == 6 * 4 * 2
    assert work.shared_requests == 8 + 1 + 4 * 8 + 8 * 2 * (2 + 2 * 2 + 4 + 2) + 6 * 3 * (3 + 6)
    assert work.tensor_macs == 8 * 2 * 2 * 2 * 3 * 2 * 1024


def test_the_float32_generator_trace_counts_a_launch_counted_by_hand():
    """generated_mma.cu's generator gradients in float32 (3xTF32) at an 8 x 16 map of one group
    of 16 channels (channels_last), R 8, a 3x3 kernel at stride 1, padding 1: one block, a tile
    of 8 rows x 16 columns, 8 warps, a warp a row. On tensor cores, three TF32 products each
    (1024 multiply-adds, counted as two BF16 ones): gw's, 2 k-steps of 8 channels x 3 kernel
    rows x the 3 n-tiles of its 18 columns a warp; grad_feature's, 2 k-steps of 8 of the 16
    padded taps x 4 n-tiles a warp; grad_span_weight's, its one m-tile of taps x 4 n-tiles of
    the range taken two a warp by warps 0 and 1, 16 k-steps of the tile's 128 pixels each. The
    bias's adds, 4 a lane's row pair, 8 pairs a warp (lanes past the 16 taps idle), and their
    7 adds over the warps; the stores: warp 0's span sums, 4 values of its first n-tile (R 8:
    the range's other n-tiles, its second and warp 1's two, hold none); the bias's sums (warp 0);
    grad_feature, 2 pixels x 2 channels a lane (the range's first n-tile)."""
    from oplib.kernels.involution import cuda as involution_cuda
    from oplib.ops.involution_generated import _generator_grads_result

    g = torch.randn(1, 16, 8, 16).to(memory_format=torch.channels_last)
    f = torch.randn(1, 8, 8, 16).to(memory_format=torch.channels_last)
    x = torch.randn(1, 16, 8, 16).to(memory_format=torch.channels_last)
    args = (g, f, torch.randn(9, 8), x, [3, 3], [1, 1], [1, 1], [1, 1])
    recording = device_model.RecordingLauncher()
    assert involution_cuda.involution_generated_mma_backward_generator(*args, _generator_grads_result(*args),
                                                                       recording) is not None
    (launch,) = recording.launches
    assert launch.kernel == "involution_generated_mma_backward_generator" and launch.blocks == 1
    assert launch.dtype == torch.float32 and launch.specialisation[2] == "false"
    work = device_model.kernel_work(launch)
    assert work.warps == 8
    assert work.tensor_macs == (8 * 2 * 3 * 3 + 8 * 2 * 4 + 2 * 16 * 2) * 3 * 2 * 1024
    assert work.fma_requests == 8 * 8 * 4 + 7
    assert work.store_requests == 4 + 1 + 8 * 2 * 2


@pytest.mark.parametrize("dtype, third_tile_requests", [
    (torch.bfloat16, 3),  # one 16-channel chunk: the ldmatrix and two stores
    (torch.float32, 2 * 1 + 2 + 2 * 2),  # two k-steps of 8: a load each; two stores, then two loads and stores
])
def test_a_fixed_window_generator_trace_forms_every_n_tile_of_the_band(dtype, third_tile_requests):
    """generated_mma.cu's generator gradients at an 8 x 10 map (a tile of 8 rows x 16 columns, a
    warp a row), 7x7 at stride 1, 16 channels a group: a run's band spans 3 n-tiles (22 columns),
    of which the map's 10 columns reach 2. The fixed window's instantiation forms and stores all
    3 (its n-tiles unrolled, the 16-bit way's and float32's); the one that reads the window from
    the arguments the 2 live ones. The third n-tile's shared requests a warp and kernel row: its
    B fragment and the stores of its fragment rows 8-15 (rows 0-7 meet no tap of theirs there:
    taps 9 and up), per chunk of the group's channels (the 16-bit way's one of 16, float32's
    two k-steps of 8, the second adding to gw: a load before each store): 8 warps x 7 kernel
    rows x those."""
    from oplib.kernels.involution import cuda as involution_cuda
    from oplib.ops.involution_generated import _generator_grads_result

    channels_last = torch.channels_last
    g = torch.randn(1, 16, 8, 10).to(dtype, memory_format=channels_last)
    f = torch.randn(1, 8, 8, 10).to(dtype, memory_format=channels_last)
    x = torch.randn(1, 16, 8, 10).to(dtype, memory_format=channels_last)
    args = (g, f, torch.randn(49, 8).to(dtype), x, [7, 7], [1, 1], [3, 3], [1, 1])
    works = {}
    for specialised in (True, False):
        recording = device_model.RecordingLauncher()
        assert involution_cuda.involution_generated_mma_backward_generator(
            *args, _generator_grads_result(*args), recording, specialised) is not None
        (launch,) = recording.launches
        assert launch.blocks == 1 and launch.dtype == dtype and (launch.specialisation[0] == "7") == specialised
        works[specialised] = device_model.kernel_work(launch)
    fixed, read = works[True], works[False]
    assert fixed.shared_requests - read.shared_requests == 8 * 7 * third_tile_requests
    assert (fixed.load_requests, fixed.store_requests, fixed.fma_requests) == (
        read.load_requests, read.store_requests, read.fma_requests)


@pytest.mark.parametrize("index, mask, element_bytes, passes", [
    ("lanes", "all", 4, 1),  # 32 consecutive words, one a bank
    ("lanes * 2", "all", 4, 2),  # two lanes a bank
    ("lanes * 17", "all", 4, 1),  # an odd stride: every bank once (the tiled kernel's staged input)
    ("lanes * 32", "all", 4, 32),  # one bank for all
    ("lanes * 0", "all", 4, 1),  # one word: a broadcast
    ("lanes", "all", 8, 2),  # 256 bytes of doubles
    ("lanes * 32", "half", 4, 16),  # half the lanes active
    ("lanes", "none", 4, 0),  # no lane active: no pass
])
def test_shared_memory_passes_count_bank_conflicts(index, mask, element_bytes, passes):
    lanes = torch.arange(32).view(1, 32)
    masks = {"all": lanes >= 0, "half": lanes < 16, "none": lanes < 0}
    tally = device_model._Tally(torch.ones(1, 32, dtype=torch.bool), 128)
    tally.shared(eval(index, {"lanes": lanes}), masks[mask], element_bytes)
    assert tally.counts["shared_wavefronts"] == passes


def test_the_sass_reader_counts_loads_and_waits():
    sass = """
        /*0010*/                   LDG.E.128.CONSTANT R4, desc[UR6][R2.64] ;
        /*0020*/              @!P0 LDG.E.CONSTANT R8, desc[UR6][R2.64+0x10] ;
        /*0030*/                   FFMA R9, R5, R10, R9 ;
        /*0040*/                   LDG.E.U16.CONSTANT R11, desc[UR6][R2.64+0x20] ;
        /*0050*/                   IMAD.U32 R12, R11, 0x10000, RZ ;
        /*0060*/                   STG.E [R2.64], R12 ;
    """
    loads, in_flight = device_model._profile_function(sass)
    assert loads == {16: 1, 4: 1, 2: 1}
    assert in_flight == pytest.approx(1.5)  # two loads before the first wait, one before the second


@pytest.mark.integration
def test_the_json_inputs_are_what_the_model_derives_for_some_rows(committed):
    """Record, trace and compile two (shape, dtype, layout) cases again: the same inputs as the
    json's, those of the current kernels (the changed rows') where they changed since the draw."""
    if device_model.nvdisasm() is None:
        pytest.skip("nvdisasm not installed (pip install nvidia-cuda-nvdisasm)")
    _, model, rows = committed
    changed = {cuda_model._key(r): cuda_model.events_from_json(r["events"]) for r in model["changed"]}
    rows = rows + [{**c, "events": cuda_model.events_from_json(c["events"])} for c in model["candidates"]]
    for case in [("stage4 512@7 s1", "bfloat16", "channels_last"), ("stage3 256@28 s2", "float32", "NCHW")]:
        for kernel, events in cuda_model._record(case):
            measured = next(r for r in rows if (r["shape"], r["dtype"], r["layout"], r["kernel"]) == (*case, kernel))
            expected = {"events": changed.get(cuda_model._key(measured), measured["events"])}
            launches = [e for e, _ in events if isinstance(e, device_model.Launch)]
            profiles = {}
            for launch in launches:
                profiles.update(device_model.sass_profile(launch.source, ((launch.kernel, launch.dtype, launch.specialisation),)))
            regenerated = [e if isinstance(e, device_model.Copy) else LaunchInputs(
                e.name, e.blocks, e.threads_per_block, e.shared_bytes + profiles[e.name].shared_bytes,
                profiles[e.name].registers, profiles[e.name].loads_in_flight, profiles[e.name].widest_load, work,
                profiles[e.name].instruction_ratio)
                for e, work in events]  # fmt: skip
            # NVRTC's register count can move by one or two with the other kernels compiled in
            # the same module (the model compiles a source's instantiations together; here one),
            # and its schedule a little: the tensor-core forward's folded body, compiled beside
            # the backward kernels, has 3.25 loads in flight and an instruction ratio of 6.127,
            # alone 3.2 and 6.129
            for now, then in zip(regenerated, expected["events"]):
                if isinstance(now, LaunchInputs) and isinstance(then, LaunchInputs):
                    assert abs(now.registers - then.registers) <= 2, (case, kernel)
                    assert now.loads_in_flight == pytest.approx(then.loads_in_flight, rel=0.05), (case, kernel)
                    assert now.instruction_ratio == pytest.approx(then.instruction_ratio, rel=0.01), (case, kernel)
                    now = dataclasses.replace(now, registers=then.registers, loads_in_flight=then.loads_in_flight,
                                              instruction_ratio=then.instruction_ratio)
                assert now == then, (case, kernel)
            assert len(regenerated) == len(expected["events"]), (case, kernel)


def test_the_instruction_ratio_weighs_the_loops():
    """All instructions over the traced ones (memory, shared memory, multiply-adds), NOPs aside,
    each weighted by LOOP_TRIPS per loop around it (a backward branch to a label)."""
    sass = """
        /*0000*/                   MOV R1, R2 ;
.L_x_0:
        /*0010*/                   LDS R3, [R1] ;
        /*0020*/                   FFMA R4, R3, R3, R4 ;
        /*0030*/                   IADD3 R1, R1, 0x4, RZ ;
        /*0040*/                   ISETP.NE.AND P0, PT, R1, R5, PT ;
        /*0050*/               @P0 BRA `(.L_x_0) ;
        /*0060*/                   STG.E [R6.64], R4 ;
        /*0070*/                   EXIT ;
        /*0080*/                   NOP ;
    """
    assert device_model.instruction_ratio(sass, loop_trips=1) == pytest.approx(8 / 3)
    assert device_model.instruction_ratio(sass, loop_trips=4) == pytest.approx((3 + 5 * 4) / (1 + 2 * 4))


def test_the_instruction_ratio_leaves_the_subroutines_out():
    """A __noinline__ function (oplib's are the cold fallbacks, the direct sums for an inf or a
    nan) sits in the kernel's SASS after its EXIT, under a ``$kernel$function:`` label: its
    loops, weighted as hot, had put the tensor-core grad_input's ratio at 4.07 where Nsight
    Compute measured 10.3 (8.47 without the subroutine) and the bfloat16 tile's at half its own."""
    kernel = """
        /*0000*/                   MOV R1, R2 ;
        /*0010*/                   LDS R3, [R1] ;
        /*0020*/                   IADD3 R1, R1, 0x4, RZ ;
        /*0030*/               @P0 CALL.REL.NOINC `($kernel$cold) ;
        /*0040*/                   EXIT ;
"""
    subroutine = """$kernel$cold:
.L_x_9:
        /*0050*/                   LDG.E R4, [R6.64] ;
        /*0060*/                   FFMA R4, R4, R4, R4 ;
        /*0070*/               @P1 BRA `(.L_x_9) ;
        /*0080*/                   RET.REL.NODEC R20 `(kernel) ;
"""
    assert device_model.kernel_code(kernel + subroutine) == kernel
    assert device_model.instruction_ratio(device_model.kernel_code(kernel + subroutine)) == pytest.approx(5 / 1)
    # counted in, the cold loop weighs 4 a trip: (5 + 3 x 4 + RET) / (1 + 2 x 4)
    assert device_model.instruction_ratio(kernel + subroutine) == pytest.approx((5 + 3 * 4 + 1) / (1 + 2 * 4))


def test_cold_lines_are_the_marked_blocks():
    """From each ``if (...) {`` marked ``// oplib-cold`` to its closing brace, nested blocks and
    braces in comments aside; a marked line that opens no block is an error, not a guess."""
    source = """int a;
if (rare) {  // oplib-cold: an inf or a nan
    if (deeper) { b; }  // a } in a comment
    c;
}
d;
for (;;) {
    if (again) {  // oplib-cold
        e;
    }
}
"""
    assert device_model.cold_lines(source) == {2, 3, 4, 5, 8, 9, 10}
    with pytest.raises(ValueError, match="opens no block"):
        device_model.cold_lines("x = 1;  // oplib-cold\n")


def test_the_functions_called_from_cold_blocks_only_are_cold():
    """A ``__noinline__`` function whose every call lies in a cold block is cold: a kernel's SASS
    may call it (nvdisasm can give that call an inlined caller's line); one called from hot code
    is not, and sass_profile refuses a kernel that calls it (its code is no part of the count)."""
    source = """__device__ __noinline__ void direct_sums(int a) { }
__device__ __noinline__ void body_apart(int a) { }
__global__ void kernel(int a) {
    if (rare) {  // oplib-cold
        direct_sums(a);
    }
    body_apart(a);
}
"""
    assert device_model.cold_functions(source) == {"direct_sums"}
    call = "`($_Z24involution_generated_mmaI14oplib_bfloat16Li7ELi1EEvPKT_$_Z15mma_direct_sumsI14oplib_bfloat16EvPKt)`"
    assert device_model._callee(call) == "mma_direct_sums"
    assert device_model._callee("`(__cuda_sm20_div_s64)`") == "__cuda_sm20_div_s64"


def test_a_loop_exit_to_a_label_of_the_kernel_is_no_call():
    """ptxas leaves a loop that holds warp-synchronous code by a CALL.REL.NOINC to the label after
    the loop's back branch on sm_80 and sm_89 (involution_last.cu's forward there): a jump inside
    the kernel's own code, which the model counts, not a call outside it, which it refuses; a
    call to a function of the source outside its cold blocks still is one, and the compiler's own
    routines and the cold functions are none. Counted as calls, the loop exits had kept the model
    off involution_last.cu's forward and grad_weight and the staged kernels' float32 code on both."""
    sass = """
.L_x_26:
        /*1f50*/                   IADD3 R46, R46, 0x1, RZ ;
        /*1f60*/                   ISETP.GE.U32.AND P0, PT, R46, 0x3, PT ;
        /*1f70*/               @P0 CALL.REL.NOINC `(.L_x_25) ;
        /*1f80*/                   BRA `(.L_x_26) ;
.L_x_25:
        /*1f90*/                   BSYNC B0 ;
        /*1fd0*/                   CALL.REL.NOINC `($__internal_1_$__cuda_sm70_warpsync) ;
        /*1fe0*/                   CALL.REL.NOINC `($kernel$_Z11direct_sumsi) ;
        /*1ff0*/                   EXIT ;
"""
    assert device_model.outside_calls(sass, frozenset({"direct_sums"})) == set()
    assert device_model.outside_calls(sass, frozenset()) == {"direct_sums"}
    # the loop is the back branch's: 4 instructions a trip, a weight of 4
    assert device_model.instruction_ratio(sass) == pytest.approx(4 * 4 + 4)


@pytest.mark.integration
def test_the_model_counts_sm_80_and_sm_89_code_that_leaves_loops_by_calls():
    """involution_last.cu's forward (bfloat16, 7 x 7) and the staged forward's float32 code, whose
    machine code for sm_80 and sm_89 leaves its loops by CALL.REL.NOINC, are profiled there, as
    on sm_90: registers within the launch bounds, and an instruction ratio within a factor of
    1.5 of sm_90's."""
    if device_model.nvdisasm() is None:
        pytest.skip("nvdisasm not installed (pip install nvidia-cuda-nvdisasm)")
    for source, kernel, dtype, specialisation in [
            ("involution/csrc/cuda/involution_last.cu", "involution_forward_last", torch.bfloat16, ("7", "1", "2")),
            ("involution/csrc/cuda/generated_mma.cu", "involution_generated_mma_staged", torch.float32,
             ("7", "1", "true", "false"))]:
        sm_90 = device_model.sass_profile(source, ((kernel, dtype, specialisation),), "sm_90")
        (profile_90,) = sm_90.values()
        for arch in ("sm_80", "sm_89"):
            (profile,) = device_model.sass_profile(source, ((kernel, dtype, specialisation),), arch).values()
            assert 0 < profile.registers <= 255 and profile.arch == arch
            assert 1 / 1.5 < profile.instruction_ratio / profile_90.instruction_ratio < 1.5, (kernel, arch)


def test_the_instruction_ratio_leaves_the_cold_blocks_out():
    """Instructions whose line, or a call site they are inlined at, lies in a cold block leave
    the count with the traced ones among them; the loop around them keeps its branch. Counted
    in, the generator's inline direct sums (sixteen small loops in its loop over the groups)
    weighed as much as its products."""
    sass = """
        //## File "/tmp/kernel.cu", line 10
        /*0000*/                   MOV R1, R2 ;
.L_x_0:
        //## File "/tmp/kernel.cu", line 12
        /*0010*/                   LDS R3, [R1] ;
        //## File "/tmp/warp.cuh", line 40 inlined at "/tmp/kernel.cu", line 21
        /*0020*/                   FFMA R4, R3, R3, R4 ;
        /*0030*/                   FFMA R4, R4, R3, R4 ;
        //## File "/tmp/kernel.cu", line 21
        /*0040*/                   IADD3 R5, R5, 0x1, RZ ;
        //## File "/tmp/kernel.cu", line 12
        /*0050*/               @P0 BRA `(.L_x_0) ;
        /*0060*/                   EXIT ;
    """
    cold = {"kernel.cu": frozenset({20, 21, 22})}
    hot = device_model.hot_code(sass, cold)
    assert "FFMA" not in hot and "IADD3" not in hot and ".L_x_0:" in hot and "BRA" in hot
    # MOV, LDS and BRA a trip, EXIT, over LDS: (1 + 2 x 4 + 1) / (1 x 4)
    assert device_model.instruction_ratio(hot) == pytest.approx((1 + 2 * 4 + 1) / 4)
    assert device_model.hot_code(sass, {}).count("/*") == 7


def test_shared_accesses_count_as_instructions():
    tally = device_model._Tally(torch.ones(2, 32, dtype=torch.bool), 128)
    tally.shared(torch.arange(32).view(1, 1, 32).expand(3, 2, 32), torch.ones(1, dtype=torch.bool), 4)
    work = KernelWork(warps=2, load_requests=1, load_lines=1, store_requests=2, store_lines=2, fma_requests=4,
                      dram_bytes=0, shared_wavefronts=tally.counts["shared_wavefronts"],
                      shared_requests=tally.counts["shared_requests"])
    assert tally.counts["shared_requests"] == 6  # 3 slots x 2 warps
    assert work.instructions == 1 + 2 + 4 + 6


def test_a_lanes_pixels_are_predicted_on_every_gpu_and_the_hosts_follow_the_rule(committed):
    """involution_last.cu's forward and grad_weight with two pixels a lane and one, at every
    channels_last row they serve (the stem's too), on the five GPUs: one marked the host's on
    each (its choice with that GPU's occupancy), every one modelled on every GPU; on the
    H200 the host's choice the rule's, worked out here from the pairs' launch (one pixel a lane
    where its blocks are under LAST_PAIRS_MIN_WAVES waves of those the H200 holds) and the
    candidates table's (``one_pixel_choices``) at every row it has; a pixel a lane at RedNet-50's
    last stage in bfloat16 on every GPU, and on the H200 the host's time within 15% of
    the faster wherever it chooses."""
    from oplib.kernels.involution import cuda as involution_cuda

    _, model, _ = committed
    entries, constants = model["pixels"], Constants(**model["constants"])
    gpus = {gpu.name: gpu for gpu in cuda_model.ARCH_GPUS}
    rows: dict[tuple, dict] = {}
    for entry in entries:
        rows.setdefault((entry["shape"], entry["dtype"], entry["layout"], entry["kernel"]), {}).setdefault(
            entry["gpu"], {})[entry["pixels"]] = entry
    served = {(c["shape"], c["dtype"], c["layout"], c["kernel"]) for c in model["candidates"] + model["unmeasured"]
              if c["kernel"] in cuda_model.PIXEL_CHOICES}
    assert set(rows) == served and len(served) == 32
    waves = involution_cuda.load_source(involution_cuda.LAST_SOURCE).constants["LAST_PAIRS_MIN_WAVES"]
    hosts = {}
    for key, row in rows.items():
        assert set(row) == set(gpus), key
        for name, choices in row.items():
            assert set(choices) == {1, 2}, (key, name)
            (host,) = [p for p, e in choices.items() if e["host"]]
            hosts[key, name] = host
            assert all(e["events"] is not None for e in choices.values()), (key, name)
            if name == H200.name:
                times = {p: device_model.predict(cuda_model.events_from_json(e["events"]), H200, constants,
                                                 model["copy_bandwidth_bytes_per_s"]) for p, e in choices.items()}
                assert times[host] <= 1.15 * min(times.values()), (key, times)
                pairs = cuda_model.events_from_json(choices[2]["events"])[0]
                held = device_model.resident_blocks(pairs.registers, pairs.threads_per_block, pairs.shared_bytes, H200)
                assert (host == 1) == (pairs.blocks < waves * held * H200.sms), key
    by_label = {label: one for label, one, _ in cuda_model.one_pixel_choices(
        model["candidates"], entries, constants, model["copy_bandwidth_bytes_per_s"])}
    assert len(by_label) == 28
    for (shape, dtype, layout, kernel), row in rows.items():
        label = f"{shape} {dtype} {cuda_model.PIXEL_CHOICES[kernel]}"
        if label in by_label:
            assert (hosts[(shape, dtype, layout, kernel), H200.name] == 1) == by_label[label], label
        if shape == "stage4 512@7 s1" and dtype == "bfloat16":
            for name in row:
                assert hosts[(shape, dtype, layout, kernel), name] == 1, (kernel, name)


def test_the_per_architecture_choices_are_the_hosts_tiles_now(committed):
    """The per-architecture table's launches, recorded again at RedNet-50's first stage: each
    tile choice's grid and shared memory and the host's mark are what the json keeps, so the
    table follows the host's choice (a change to it without regenerating the table fails here)."""
    _, model, _ = committed
    case = ("stage1 64@56 s1", "bfloat16", "channels_last")
    for kernel, function in cuda_model.TILE_CHOICES.items():
        host = cuda_model._fused_launch(case, function)
        for entry in model["architectures"]:
            if (entry["shape"], entry["dtype"], entry["layout"], entry["kernel"], entry["gpu"]) != (*case, kernel, H200.name):
                continue
            launch = cuda_model._fused_launch(case, function, entry["runs_w"])
            kept = cuda_model.events_from_json(entry["events"])[0]
            # (the json's shared memory adds the kernel's static share to the launch's dynamic)
            assert kept.blocks == launch.blocks and kept.shared_bytes >= launch.shared_bytes, kernel
            assert entry["host"] == (launch == host), (kernel, entry["runs_w"])
