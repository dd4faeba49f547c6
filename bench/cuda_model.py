"""The offline model of CUDA device time (oplib.testing.device_model) against the committed H200
table: for every row of bench/results/involution-cuda.json, the launches the row's call makes
(recorded on CPU tensors of its shape and layout), each kernel's registers, occupancy, load
width and loads in flight (NVRTC + nvdisasm for sm_90), its traced work, the predicted and the
measured device time; the constants fitted on all rows and on each dtype alone (the other held
out); and the same calls predicted on an H100. No GPU needed; a few minutes on 2 cores.
Writes bench/results/cuda-model.md and .json (the json also keeps every row's model inputs,
from which tests/project/test_device_model.py recomputes the table).

    python bench/cuda_model.py
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import math
import re
from collections.abc import Iterable, Iterator
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Optional

import torch

import _harness
from _cuda import floor_bytes, launched, operands_on
from _harness import RESULTS
from oplib.benchmark import REDNET50_SHAPES, Shape
from oplib.kernels.involution import cuda as involution_cuda
from oplib.testing import device_model
from oplib.testing.device_model import H100_SXM, H200, Constants, Copy, Launch, LaunchInputs

# The latest H200 run of the kernel table (the sixth draw: involution_vectors.cu's first timing).
MEASURED = RESULTS / "h200" / "draw6" / "involution-cuda.json"
# The same table measured on an H100 by `make gpu-check` (a GPU the constants were not fitted on).
MEASURED_H100 = RESULTS / "h100" / "involution-cuda.json"
# The bar of the issue: the model within 2x of the measured time on every row.
BAR = 2.0


def within_bar(predicted: float, floor: float) -> bool:
    """The issue's bar on a kernel: within 2x its floor, or 10 us where the floor is under 5 us."""
    return predicted <= max(2.0 * floor, 10e-6 if floor < 5e-6 else 0.0)


def table_shape(name: str) -> Shape:
    """The ``REDNET50_SHAPES`` entry named ``name`` at the tables' batch, 32."""
    return next(dataclasses.replace(s, batch=32) for s in REDNET50_SHAPES if s.name == name)


def calls(shape: Shape, dtype: torch.dtype, layout: str) -> dict[str, tuple[str, tuple]]:
    """kernel (the table's column) -> (op, CUDA dispatch arguments) of bench/_cuda.py's
    ``kernel_calls``, on CPU tensors of the row's shape and layout. involution's three rows are
    its chunked (or generic) kernels, recorded under the ``CHUNKED`` policy: ``measured_rows``
    gives them the chunked kernels' time, and involution_vectors.cu's its own rows."""
    o = operands_on(shape, dtype, layout, "cpu")
    x, w, g = o["input"], o["weight"], o["grad_output"]
    stride, padding, dilation = shape.params
    kernel_size = [shape.kernel] * 2
    return {
        "forward": ("oplib::involution", (x, w, stride, padding, dilation)),
        "grad_input": ("oplib::involution_backward_input", (g, w, [shape.height, shape.width], stride, padding, dilation)),
        "grad_weight": ("oplib::involution_backward_weight", (g, x, kernel_size, stride, padding, dilation, shape.groups)),
        "generated forward": ("oplib::involution_generated", (x, o["feature"], o["span_weight"], o["span_bias"],
                                                              kernel_size, stride, padding, dilation)),
    }


# The rows of involution_generated's fused kernels, which the table times in columns of their
# own beside the row of the call they serve: row name -> (the table's row, its column, the
# function of oplib.kernels.involution.cuda that launches the kernel).
TILED = "tiled generated forward"
MMA_FORWARD = "tensor cores generated forward"
MMA_GRAD_INPUT = "tensor cores grad_input"
FUSED = {
    TILED: ("generated forward", "tiled (ms)", "involution_generated_tile"),
    MMA_FORWARD: ("generated forward", "tensor cores (ms)", "involution_generated_mma"),
    MMA_GRAD_INPUT: ("grad_input", "tensor cores (ms)", "involution_generated_mma_backward_input"),
}


# Kernels the table times in columns of their own where a run has them: row name -> (the
# table's row, its column, the function of oplib.kernels.involution.cuda that launches it).
# Predicted beside the row's kernel while the measured run has not timed them
# (``candidate_lines``); a measured column makes them rows like FUSED's. involution_vectors.cu's,
# which the sixth draw timed in a "vectors" column; since they became the ops' kernels the table
# times them as the row's own and the chunked kernel in a "chunked" column (``measured_rows``).
VECTORS = "vectors forward"
VECTORS_GRAD_INPUT = "vectors grad_input"
VECTORS_GRAD_WEIGHT = "vectors grad_weight"
VECTORS_ROWS = {VECTORS: ("forward", "vectors (ms)", "involution_vectors"),
                VECTORS_GRAD_INPUT: ("grad_input", "vectors (ms)", "involution_vectors_backward_input"),
                VECTORS_GRAD_WEIGHT: ("grad_weight", "vectors (ms)", "involution_vectors_backward_weight")}
# A lane a 16-byte vector of a group's channels in channels_last calls (the ``LAST`` policy:
# involution_last.cu's kernels, the forward's and grad_weight's two pixels a lane, grad_input's a
# block a segment of a band of rows; ``LAST_PAIRS``), timed in the table's "lanes on channels"
# column beside the op's call where it launches something else (``_lanes_on_channels_launch``);
# the forward and grad_weight with a pixel a lane (``LAST_ONE_PIXEL``), in the "a pixel a lane"
# column; grad_input's other candidate under it, the chunked kernel at one vector a thread
# (``LAST_VECTOR_GRAD_INPUT``), in the "vector a thread" column. involution_vectors.cu's NCHW
# forward with twice a thread's channels (its WIDE instantiations, ``VECTORS_WIDE``; the host's
# where the GPU's build of them does not spill, ``vectors_wide``), in the "vectors, wide" column.
LANES_ON_CHANNELS, ONE_PIXEL, VECTOR_A_THREAD = "LAST_PAIRS", "LAST_ONE_PIXEL", "LAST_VECTOR_GRAD_INPUT"
WIDE_VECTORS = "VECTORS_WIDE"
POLICY_CANDIDATES = (LANES_ON_CHANNELS, ONE_PIXEL, VECTOR_A_THREAD, WIDE_VECTORS)
LAST_FORWARD, LAST_GRAD_INPUT = "lanes on channels forward", "lanes on channels grad_input"
LAST_GRAD_WEIGHT = "lanes on channels grad_weight"
ONE_PIXEL_FORWARD, ONE_PIXEL_GRAD_WEIGHT = "a pixel a lane forward", "a pixel a lane grad_weight"
LAST_GRAD_INPUT_VECTOR = "vector a thread grad_input"
VECTORS_WIDE_FORWARD = "vectors forward, wide"
CANDIDATES = {**VECTORS_ROWS,
              LAST_FORWARD: ("forward", "lanes on channels (ms)", LANES_ON_CHANNELS),
              LAST_GRAD_INPUT: ("grad_input", "lanes on channels (ms)", LANES_ON_CHANNELS),
              LAST_GRAD_WEIGHT: ("grad_weight", "lanes on channels (ms)", LANES_ON_CHANNELS),
              ONE_PIXEL_FORWARD: ("forward", "a pixel a lane (ms)", ONE_PIXEL),
              ONE_PIXEL_GRAD_WEIGHT: ("grad_weight", "a pixel a lane (ms)", ONE_PIXEL),
              LAST_GRAD_INPUT_VECTOR: ("grad_input", "vector a thread (ms)", VECTOR_A_THREAD),
              VECTORS_WIDE_FORWARD: ("forward", "vectors, wide (ms)", WIDE_VECTORS)}
# Each pixel-a-lane candidate and the pairs' row it stands beside (the host's choice between them).
ONE_PIXEL_PAIRS = {ONE_PIXEL_FORWARD: LAST_FORWARD, ONE_PIXEL_GRAD_WEIGHT: LAST_GRAD_WEIGHT}
# The measured row a candidate stands beside where it is not its call's (the table's row of its
# kernel): the wide vectors forward beside the narrow one the draw timed, the op's forward now.
CANDIDATE_BESIDE = {VECTORS_WIDE_FORWARD: VECTORS}


# Kernels no row of the measured table serves yet, predicted at every (shape, dtype, layout) they
# serve (``generator_lines``): row name -> the function of oplib.kernels.involution.cuda that
# launches it. involution_generated_backward_generator's tensor-core kernel, whose op the kernel
# table times in a row of its own from the seventh draw on ("generator grads").
GENERATOR = "tensor cores generator grads"
# involution_generated_backward_input's staged kernel (a kernel row's weights formed on tensor
# cores into shared memory, summed by FMAs), which the kernel table times in the grad_input row's
# "staged" column from the eighth draw on.
STAGED_GRAD_INPUT = "staged grad_input"
# involution_generated's staged forward (a tile's weights formed on tensor cores into shared
# memory, all taps of a pass at once, summed by FMAs), which the kernel table times in the
# generated forward row's "staged" column from the eighth draw on.
STAGED_FORWARD = "staged generated forward"
# involution_generated's forward on small maps (dense_window.cu: a (sample, group) a block, the
# window a dense matrix, both products on tensor cores), which no draw has timed yet.
DENSE_FORWARD = "dense window generated forward"
DENSE_GRAD_INPUT = "dense window grad_input"
# involution's own grad_weight on the same maps (dense_window.cu: the products of grad_output and
# the input on tensor cores, gathered at the taps), the ``dense_window`` policy's, timed in the
# grad_weight row's "dense window" column from the next draw on.
DENSE_WEIGHT = "dense window grad_weight"
# The same kernel writing the map in float32 from 16-bit operands (DENSE_MAP_WIDE): the first step of the
# fused op's generator gradients under that policy (``generator_grads_through_dense_map``).
DENSE_MAP = "dense window float32 map"
PREDICTED = {GENERATOR: "involution_generated_mma_backward_generator",
             STAGED_GRAD_INPUT: "involution_generated_mma_backward_input_staged",
             STAGED_FORWARD: "involution_generated_mma_staged",
             DENSE_FORWARD: "involution_generated_dense_window",
             DENSE_GRAD_INPUT: "involution_generated_dense_window_backward_input",
             DENSE_WEIGHT: "involution_dense_window_backward_weight",
             DENSE_MAP: "involution_dense_window_backward_weight, float32"}


# The PREDICTED kernels the kernel table times by themselves, each in a column of the row of the
# call it serves (the "staged" and "dense window" columns, from the draw after the sixth on):
# row name -> (the table's row, its column). A measured column makes them rows like FUSED's
# (``measured_rows``), so that they leave the predicted sections for the fitted table.
PREDICTED_TIMED = {STAGED_GRAD_INPUT: ("grad_input", "staged (ms)"),
                   STAGED_FORWARD: ("generated forward", "staged (ms)"),
                   DENSE_FORWARD: ("generated forward", "dense window (ms)"),
                   DENSE_GRAD_INPUT: ("grad_input", "dense window (ms)"),
                   DENSE_WEIGHT: ("grad_weight", "dense window (ms)")}
# The routes the table times whole, which the model has no one kernel for (``route_times``):
# (the table's row, its column) -> the route's name in ``layer_totals``. The ops' map routes (the
# rows themselves), the generator's gradients through the tensor-core kernel with torch's sums of
# its partial sums, and through the dense window's float32 map with the contractions.
GENERATED_INPUT_ROUTE, GENERATOR_ROUTE = "generated grad_input", "generator grads"
GENERATOR_SUMS_ROUTE, DENSE_MAP_ROUTE = "tensor cores generator grads + sums", "dense window float32 map route"
ROUTES = {("generated grad_input", "device (ms)"): GENERATED_INPUT_ROUTE,
          ("generator grads", "device (ms)"): GENERATOR_ROUTE,
          ("generator grads", "tensor cores (ms)"): GENERATOR_SUMS_ROUTE,
          ("generator grads", "dense window (ms)"): DENSE_MAP_ROUTE}

# The table's rows the model leaves out: the generated grad_input's call runs the span conv
# (cuBLAS's batched products, kernels of torch's the model has no trace of) before involution's
# grad_input kernel, which the grad_input rows model; the generator grads' op adds its kernel's
# partial sums up with torch's sum (the ``GENERATOR`` rows model the kernel), or in float32 takes
# the map route's cuBLAS products.
UNMODELLED = ("generated grad_input", "generator grads")


def _kernel_table(path: Path) -> list[dict]:
    """The rows of a committed run's kernel table, each a dict of its columns."""
    data = json.loads(path.read_text())
    table = next(t for t in data["tables"] if t["heading"].startswith("CUDA: each kernel's device time"))
    return [dict(zip(table["columns"], cells)) for cells in table["rows"]]


def measured_rows(path: Path = MEASURED) -> tuple[float, list[dict]]:
    """A committed run (by default the H200's): its copy bandwidth (bytes/s) and its kernel rows,
    each followed by the rows of the fused kernels (``FUSED``), candidates (``CANDIDATES``) and
    predicted kernels (``PREDICTED_TIMED``) the run timed beside it."""
    text = path.with_suffix(".md").read_text()
    bandwidth = float(re.search(r"measured in this run, (\d+(?:\.\d+)?) GB/s", text).group(1)) * 1e9
    timed_beside = {fused: (kernel, column) for fused, (kernel, column, _) in {**FUSED, **CANDIDATES}.items()}
    timed_beside.update(PREDICTED_TIMED)
    rows = []
    for row in _kernel_table(path):
        if row["kernel"] in UNMODELLED:
            continue
        if row.get("chunked (ms)", "-") != "-":  # the op ran the vectors kernel, the chunked one timed beside it
            row = {**row, "device (ms)": row["chunked (ms)"], "vectors (ms)": row["device (ms)"]}
        rows.append(row)
        for fused, (kernel, column) in timed_beside.items():
            if row["kernel"] == kernel and row.get(column, "-") != "-":
                rows.append({"shape": row["shape"], "dtype": row["dtype"], "layout": row["layout"], "kernel": fused,
                             "device (ms)": row[column]})
    return bandwidth, rows


def route_times(path: Path = MEASURED) -> dict[str, float]:
    """The routes a committed run timed whole (``ROUTES``): "shape | dtype | layout | route" ->
    seconds."""
    times = {}
    for row in _kernel_table(path):
        for (kernel, column), route in ROUTES.items():
            if row["kernel"] == kernel and row.get(column, "-") != "-":
                times[" | ".join((row["shape"], row["dtype"], row["layout"], route))] = float(row[column]) * 1e-3
    return times


def _record(case: tuple[str, str, str], chunked: bool = True) -> list[tuple[str, list]]:
    """(kernel, events) of every kernel column at one (shape, dtype, layout): run in a worker.
    involution's three rows under the ``CHUNKED`` policy, as the table times them (``chunked``),
    or as the ops run them now (the default policy: a row no draw has timed)."""
    name, dtype_name, layout = case
    torch.set_num_threads(1)
    shape = table_shape(name)
    dtype = getattr(torch, dtype_name)
    result = []
    for kernel, (qualname, args) in calls(shape, dtype, layout).items():
        policy = involution_cuda.CHUNKED if chunked and kernel in ("forward", "grad_input", "grad_weight") else None
        events = device_model.record_launches(qualname, *args, policy=policy)
        result.append((kernel, [(e, device_model.kernel_work(e) if isinstance(e, Launch) else None) for e in events]))
    for fused, (kernel, _, function) in {**FUSED, **CANDIDATES}.items():
        launch = (_lanes_on_channels_launch(case, kernel, getattr(involution_cuda, function))
                  if function in POLICY_CANDIDATES else _fused_launch(case, function))
        if launch is not None:
            result.append((fused, [(launch, device_model.kernel_work(launch))]))
    for predicted, function in PREDICTED.items():
        launch = _fused_launch(case, function)
        if launch is not None:
            result.append((predicted, [(launch, device_model.kernel_work(launch))]))
    return result


def _source_profiles(recorded: Iterable[Launch], arch: str, profile=device_model.sass_profile) -> dict:
    """``profile(source, instantiations, arch)`` for each source of the ``recorded`` launches, its
    instantiations compiled together: name expression -> SassProfile."""
    launches = {(e.source, e.kernel, e.dtype, e.specialisation) for e in recorded}
    profiles = {}
    for source in sorted({key[0] for key in launches}):
        profiles.update(profile(source, tuple(sorted((k[1:] for k in launches if k[0] == source), key=str)), arch))
    return profiles


def unmeasured_cases(rows: list[dict]) -> list[tuple[str, str, str]]:
    """The (shape, dtype, layout) cases of the ``REDNET50_SHAPES`` the measured table has no row
    of, in the dtypes and layouts it times."""
    measured = {r["shape"] for r in rows}
    dtypes = list(dict.fromkeys(r["dtype"] for r in rows))
    layouts = list(dict.fromkeys(r["layout"] for r in rows))
    return [(s.name, dtype, layout) for s in REDNET50_SHAPES if s.name not in measured
            for dtype in dtypes for layout in layouts]


def model_rows(batch: int, workers: int = 2) -> tuple[list[dict], list[dict], list[dict]]:
    """Every row of the measured table with its events as model inputs (LaunchInputs, Copy),
    the rows of ``CANDIDATES`` the table does not time and of ``PREDICTED`` (where the kernel
    serves the call), and every kernel column at the cases no draw has timed
    (``unmeasured_cases``: involution's rows as the ops run them now)."""
    _, rows = measured_rows()
    # in the table's order (a set sorted by shape alone left the dtypes and layouts of a shape in
    # hash order, which moved the candidate rows from one run to the next)
    cases = list(dict.fromkeys((r["shape"], r["dtype"], r["layout"]) for r in rows))
    new_cases = unmeasured_cases(rows)
    with ProcessPoolExecutor(workers) as pool:
        recorded = dict(zip(cases, pool.map(_record, cases)))
        recorded_new = dict(zip(new_cases, pool.map(functools.partial(_record, chunked=False), new_cases)))

    def launches(recordings) -> Iterator[Launch]:
        return (e for per_case in recordings for _, events in per_case for e, _ in events if isinstance(e, Launch))

    # The cases no draw timed compile in modules of their own: NVVM's inlining depends on the
    # other instantiations of a module, and with the stem's 3 x 3 ones beside them the tensor-core
    # grad_input's took 6 registers fewer, which would move the measured rows' inputs.
    profiles = _source_profiles(launches(recorded.values()), H200.arch)
    new_profiles = _source_profiles(launches(recorded_new.values()), H200.arch)

    def model_inputs(events, profiles: dict = profiles) -> list:
        inputs = []
        for event, work in events:
            if isinstance(event, Copy):
                inputs.append(event)
                continue
            profile = profiles[event.name]
            inputs.append(LaunchInputs(event.name, event.blocks, event.threads_per_block,
                                       event.shared_bytes + profile.shared_bytes, profile.registers,
                                       profile.loads_in_flight, profile.widest_load, work, profile.instruction_ratio))
        return inputs

    result = [{**row, "events": model_inputs(dict(recorded[row["shape"], row["dtype"], row["layout"]])[row["kernel"]]),
               "measured_s": float(row["device (ms)"]) * 1e-3} for row in rows]
    timed = {_key(row) for row in rows}
    candidates = [{"shape": case[0], "dtype": case[1], "layout": case[2], "kernel": kernel,
                   "events": model_inputs(events)}
                  for case in cases for kernel, events in recorded[case]
                  if (kernel in CANDIDATES or kernel in PREDICTED) and " | ".join((*case, kernel)) not in timed]
    unmeasured = [{"shape": case[0], "dtype": case[1], "layout": case[2], "kernel": kernel,
                   "events": model_inputs(events, new_profiles)}
                  for case in new_cases for kernel, events in recorded_new[case]]
    return result, candidates, unmeasured


def events_to_json(events) -> list[dict]:
    return [{"copy": dataclasses.asdict(e)} if isinstance(e, Copy) else {"launch": e.to_json()} for e in events]


def events_from_json(data: list[dict]) -> list:
    return [Copy(**e["copy"]) if "copy" in e else LaunchInputs.from_json(e["launch"]) for e in data]


def _dtype_fits(rows: list[dict], bandwidth: float) -> dict[str, Constants]:
    """The constants fitted on each dtype's rows alone (the other dtype held out)."""
    return {dtype: device_model.fit([(r["events"], r["measured_s"]) for r in rows if r["dtype"] == dtype], H200, bandwidth)
            for dtype in sorted({r["dtype"] for r in rows})}


def constants_lines(label: str, constants: Constants) -> str:
    return (f"{label}: {constants.request_cycles:.3f} cycles per warp memory request, {constants.line_cycles:.3f} cycles "
            f"per L1 line, latency {constants.latency_cycles:.0f} cycles, launch floor "
            f"{constants.launch_seconds * 1e6:.2f} us, {constants.dependent_issue_cycles:.1f} cycles between a warp's "
            "instructions")


# Why a constant may end at a bound of its range, said in the report when it does.
_AT_BOUND = {
    "launch_seconds": "the small rows take more fixed time per kernel than the model gives them (first-wave ramp and "
                      "last-wave drain are not traced)",
}


def at_bounds(constants: Constants) -> list[tuple[str, str, str, str]]:
    result = []
    for name, (low, high) in device_model.BOUNDS.items():
        value = getattr(constants, name)
        end = "top" if math.isclose(value, high, rel_tol=1e-3) else "bottom" if math.isclose(value, low, rel_tol=1e-3) else None
        if end and name in _AT_BOUND:
            result.append((name, end, f"[{low:g}, {high:g}]", _AT_BOUND[name]))
    return result


def ratio_range(ratios: list[float]) -> str:
    return f"{min(ratios):.2f}x-{max(ratios):.2f}x"


# The H100 run's rows whose call ran another kernel than the rows model now: it predates
# involution_generated's fused kernels, so its "generated forward" timed the generic kernel.
H100_OTHER_KERNEL = ("generated forward",)


def h100_measured() -> Optional[dict]:
    """The H100 run's copy bandwidth and each row's device time (None: not committed), but
    those of ``H100_OTHER_KERNEL``."""
    if not MEASURED_H100.exists():
        return None
    bandwidth, rows = measured_rows(MEASURED_H100)
    return {"copy_bandwidth_bytes_per_s": bandwidth,
            "rows": [{"key": _key(r), "measured_s": float(r["device (ms)"]) * 1e-3} for r in rows
                     if r["kernel"] not in H100_OTHER_KERNEL]}


def _key(row: dict) -> str:
    return " | ".join((row["shape"], row["dtype"], row["layout"], row["kernel"]))


def report(rows: list[dict], bandwidth: float, h100: Optional[dict] = None) -> tuple[list[str], dict]:
    """The markdown lines and the data of the model beside them; ``h100`` (``h100_measured()``):
    the same rows measured on an H100, predicted with the constants fitted on the H200."""
    constants = device_model.fit([(r["events"], r["measured_s"]) for r in rows], H200, bandwidth)
    held = _dtype_fits(rows, bandwidth)
    h100_times = {r["key"]: r["measured_s"] for r in h100["rows"]} if h100 else {}
    # Measured there where a run exists; else H200's copy bandwidth scaled by the datasheets'.
    h100_bandwidth = (h100["copy_bandwidth_bytes_per_s"] if h100
                      else bandwidth * H100_SXM.dram_bytes_per_s / H200.dram_bytes_per_s)
    cells, ratios, held_ratios, out, h100_ratios, h100_out = [], [], [], [], [], []
    for r in rows:
        predicted = device_model.predict(r["events"], H200, constants, bandwidth)
        other = next(d for d in held if d != r["dtype"])  # fitted on the other dtype only
        held_out = device_model.predict(r["events"], H200, held[other], bandwidth) / r["measured_s"]
        h100_predicted = device_model.predict(r["events"], H100_SXM, constants, h100_bandwidth)
        h100_seconds = h100_times.get(_key(r))
        h100_cells = []
        if h100:
            h100_cells = ["-", "-"]
            if h100_seconds is not None:
                h100_ratios.append(h100_predicted / h100_seconds)
                h100_cells = [f"{h100_seconds * 1e6:.1f}", f"{h100_ratios[-1]:.2f}x"]
                if not 1 / BAR <= h100_ratios[-1] <= BAR:
                    h100_out.append(f"{_key(r)} ({h100_ratios[-1]:.2f}x)")
        ratio = predicted / r["measured_s"]
        ratios.append(ratio)
        held_ratios.append(held_out)
        launches = [e for e in r["events"] if isinstance(e, LaunchInputs)]
        copies = len(r["events"]) - len(launches)
        main = launches[0]
        terms = device_model.launch_terms(main, H200, constants, bandwidth)
        resident = device_model.resident_blocks(main.registers, main.threads_per_block, main.shared_bytes, H200)
        occupancy = resident * main.threads_per_block / H200.max_threads
        if ratio > BAR or ratio < 1 / BAR:
            out.append(f"{r['shape']} {r['dtype']} {r['layout']} {r['kernel']} ({ratio:.2f}x)")
        cells.append([
            r["shape"], r["dtype"], r["layout"], r["kernel"],
            main.kernel + (f" + {copies} copies" if copies else ""),
            f"{main.blocks} x {main.threads_per_block}", str(main.registers), f"{resident} ({occupancy:.0%})",
            str(main.widest_load), f"{main.loads_in_flight:.1f}", f"{main.work.load_lines / main.work.load_requests:.1f}",
            terms.bound, f"{predicted * 1e6:.1f}", f"{r['measured_s'] * 1e6:.1f}", f"{ratio:.2f}x", f"{held_out:.2f}x",
            f"{h100_predicted * 1e6:.1f}", *h100_cells,
        ])
    within = not out
    lines = [
        "# The offline model of CUDA device time against the H200 table",
        "",
        f"Written by `python bench/cuda_model.py` on {_harness.datetime.date.today()}.",
        "",
        f"- measured: `{MEASURED.relative_to(RESULTS.parents[1])}` (H200, batch 32, device time of CUDA graph replays), "
        f"its copy bandwidth {bandwidth / 1e9:.0f} GB/s as the DRAM bandwidth",
        f"- model: `oplib/testing/device_model.py`; kernels compiled by NVRTC for {H200.arch} and disassembled by nvdisasm; "
        f"work traced over {device_model.TRACED_WARPS} warps of each launch",
        f"- {constants_lines('fitted on all rows', constants)}",
        *[f"- {constants_lines(f'fitted on {d} only', c)}" for d, c in held.items()],
        *[f"- {name} sits at the {end} of its physical range {bounds} (`device_model.BOUNDS`): {why}"
          for name, end, bounds, why in at_bounds(constants)],
        "- latency: the largest mean load latency whose fit stays within 1 % of the best; above it rows turn "
        "latency-bound and overpredicted, below it nothing changes (the table bounds it from above only)",
        "",
        "## Predicted against measured",
        "",
        f"Bar: every row within {BAR:g}x of its measured time: **{'met' if within else 'not met'}** "
        f"(predicted / measured {ratio_range(ratios)}; held out, each dtype predicted by the constants fitted on the "
        f"other: {ratio_range(held_ratios)}).",
        *([f"Outside the bar: {'; '.join(out)}."] if out else []),
        *([f"On an H100 (`bench/results/h100/involution-cuda.json`, {len(h100_ratios)} of {len(rows)} rows measured "
           f"there; a GPU the constants were not fitted on, its own copy bandwidth {h100_bandwidth / 1e9:.0f} GB/s; its "
           f"{', '.join(H100_OTHER_KERNEL)} rows left out, which ran the generic kernel the fused ones replaced): "
           f"predicted / measured {ratio_range(h100_ratios)}, "
           f"{len(h100_ratios) - len(h100_out)} of {len(h100_ratios)} rows within {BAR:g}x"
           + (f"; outside: {'; '.join(h100_out)}." if h100_out else ".")] if h100_ratios else []),
        "",
        "Instantiation: the kernel of the call (and torch's layout copies around it); blocks per SM: resident blocks "
        "(occupancy); widest load: bytes per lane of the widest global load in the SASS; in flight: loads a warp "
        "issues before it waits; lines / request: 128-byte lines per warp load (traced); bound: the term that binds "
        "(l1: the load/store pipe and L1 of the busiest SM; latency: Little's law; dram; fma; shared: shared-memory "
        "wavefronts; issue: the instructions over the SM's schedulers). Held out: predicted "
        "by the constants fitted on the other dtype's rows. H100: the same call predicted on an H100 SXM with the "
        "constants fitted here, "
        + ("its DRAM bandwidth the copy bandwidth measured there, beside the device time measured there."
           if h100 else "its DRAM bandwidth scaled from this run's copy bandwidth."),
        "",
        *_harness.table(
            ["shape", "dtype", "layout", "kernel", "instantiation", "grid x block", "registers", "blocks per SM",
             "widest load (B)", "in flight", "lines / request", "bound", "predicted (us)", "measured (us)",
             "predicted / measured", "held out", "H100 predicted (us)",
             *(["H100 measured (us)", "H100 predicted / measured"] if h100 else [])],
            "llllllrrrrrlrrrrr" + ("rr" if h100 else ""), cells),
    ]
    data = {
        "gpu": H200.name, "copy_bandwidth_bytes_per_s": bandwidth, "h100_bandwidth_bytes_per_s": h100_bandwidth,
        "bar": BAR, "constants": dataclasses.asdict(constants), "h100_measured": h100,
        "held_out_constants": {d: dataclasses.asdict(c) for d, c in held.items()},
        "rows": [{"shape": r["shape"], "dtype": r["dtype"], "layout": r["layout"], "kernel": r["kernel"],
                  "measured_s": r["measured_s"], "events": events_to_json(r["events"])} for r in rows],
    }  # fmt: skip
    return lines, data


# ---------------------------------------------------------------------------------------
# The tiled fused forward beside the kernels it is to replace
# ---------------------------------------------------------------------------------------


def _fused_launch(case: tuple[str, str, str], fused: str = "involution_generated_tile",
                  runs_w: Optional[int] = None,
                  recording: Optional[device_model.RecordingLauncher] = None) -> Optional[Launch]:
    """The launch of one of the kernels timed in a column of its own (``fused``, a function of
    oplib.kernels.involution.cuda: a fused forward, ``involution_generated_mma_backward_input``,
    a staged kernel (``runs_w``: its tiles, the host's where None, as ``recording`` answers
    the host's questions: ``_GpuRecorder``),
    or one of involution_vectors.cu's: ``involution_vectors``, ``involution_vectors_backward_input``,
    ``involution_vectors_backward_weight``) at one (shape, dtype, layout), recorded on CPU
    tensors; None where the kernel declines it."""
    from oplib.kernels.involution import cuda as involution_cuda
    from oplib.kernels.involution.layouts import result_like
    from oplib.ops.involution_generated import _generator_grads_result as generator_result

    name, dtype_name, layout = case
    shape = table_shape(name)
    o = operands_on(shape, getattr(torch, dtype_name), layout, "cpu")
    x, feature, g = o["input"], o["feature"], o["grad_output"]
    recording = recording or device_model.RecordingLauncher()
    window = ([shape.kernel] * 2, *shape.params)
    tiles = {} if runs_w is None else {"runs_w": runs_w}
    if fused == "involution_vectors":
        w = o["weight"]
        involution_cuda.involution_vectors(x, w, *shape.params, result_like(x, w.shape[4:]), recording)
    elif fused == "involution_vectors_backward_weight":
        w = o["weight"]
        involution_cuda.involution_vectors_backward_weight(g, x, [shape.kernel] * 2, *shape.params, shape.groups,
                                                           torch.empty_like(w), recording)
    elif fused == "involution_vectors_backward_input":
        size = [shape.height, shape.width]
        involution_cuda.involution_vectors_backward_input(g, o["weight"], size, *shape.params, result_like(g, size),
                                                          recording)
    elif fused.startswith("involution_dense_window_backward_weight"):  # (", float32": the map in float32)
        w = o["weight"]
        involution_cuda.involution_dense_window_backward_weight(
            g, x, [shape.kernel] * 2, *shape.params, shape.groups,
            torch.empty_like(w, dtype=torch.float32 if fused.endswith("float32") else w.dtype), recording)
    elif fused == "involution_generated_mma_backward_generator":
        args = (g, feature, o["span_weight"], x, *window)
        involution_cuda.involution_generated_mma_backward_generator(*args, generator_result(*args), recording)
    elif fused in ("involution_generated_mma_backward_input", "involution_generated_mma_backward_input_staged",
                   "involution_generated_dense_window_backward_input"):
        size = [shape.height, shape.width]
        getattr(involution_cuda, fused)(g, feature, o["span_weight"], o["span_bias"], size, *window,
                                        result_like(g, size), recording, **tiles)
    else:
        getattr(involution_cuda, fused)(x, feature, o["span_weight"], o["span_bias"], *window,
                                        result_like(x, feature.shape[2:]), recording, **tiles)
    return recording.launches[0] if recording.launches else None


def _lanes_on_channels_launch(case: tuple[str, str, str], kernel: str, policy) -> Optional[Launch]:
    """The launch of the table's ``kernel`` call (forward, grad_input, grad_weight) at one
    (shape, dtype, layout) under ``policy`` (``LAST_PAIRS``, ``LAST_ONE_PIXEL``,
    ``LAST_VECTOR_GRAD_INPUT`` or ``VECTORS_WIDE``), recorded on CPU tensors (which take the
    vectors forward's narrow instantiations); None where it launches what the ops' policy
    launches (NCHW calls but the wide vectors forward's; channels_last ones that already give a
    thread one vector), or (the others) what ``LAST_PAIRS`` launches."""
    name, dtype_name, layout = case
    shape = table_shape(name)
    qualname, args = calls(shape, getattr(torch, dtype_name), layout)[kernel]

    def launches(policy):
        return [e for e in device_model.record_launches(qualname, *args, policy=policy) if isinstance(e, Launch)]

    last = launches(policy)
    pairs = involution_cuda.LAST_PAIRS
    others = [launches(involution_cuda.POLICY)] + ([launches(pairs)] if policy is not pairs else [])
    return None if any(launched(last) == launched(other) for other in others) else last[0]


def _predicted(row: dict, constants: Constants, bandwidth: float):
    """A row's main launch, its model terms, its predicted time and its resident blocks per SM."""
    inputs = next(e for e in row["events"] if isinstance(e, LaunchInputs))
    terms = device_model.launch_terms(inputs, H200, constants, bandwidth)
    predicted = device_model.predict(row["events"], H200, constants, bandwidth)
    resident = device_model.resident_blocks(inputs.registers, inputs.threads_per_block, inputs.shared_bytes, H200)
    return inputs, terms, predicted, resident


def tiled_lines(rows: list[dict], constants: Constants, bandwidth: float) -> list[str]:
    """The table's ``TILED`` rows predicted with the constants fitted above, beside the H200's
    measured generic generated forward and the involution forward alone (the aggregation of
    the path it replaces, whose span conv comes on top); the issue's bar is the tiled forward
    at most 0.5x span conv + involution."""
    times = {_key(r): r["measured_s"] for r in rows}
    cells, ratios = [], []
    for row in rows:
        if row["kernel"] != TILED:
            continue
        shape, dtype, layout = row["shape"], row["dtype"], row["layout"]
        inputs, terms, predicted, resident = _predicted(row, constants, bandwidth)
        generic = times.get(" | ".join((shape, dtype, layout, "generated forward")))
        forward = times.get(" | ".join((shape, dtype, layout, "forward")))
        tiled = row["measured_s"]
        ratios.append(predicted / tiled)
        cells.append([shape, dtype, layout, f"{inputs.blocks} x {inputs.threads_per_block}", str(inputs.registers),
                      f"{inputs.shared_bytes / 1024:.1f}", str(resident), f"{inputs.instruction_ratio:.2f}", terms.bound,
                      f"{predicted * 1e6:.1f}", f"{tiled * 1e6:.1f}", f"{predicted / tiled:.2f}x",
                      "-" if generic is None else f"{generic * 1e6:.1f}", "-" if forward is None else f"{forward * 1e6:.1f}",
                      "-" if forward is None else f"{predicted / forward:.2f}x"])
    heading = "## The tiled fused forward: involution_generated_tile"
    if not cells:
        return [heading, "", "Not timed in the measured table (its \"tiled\" column is empty).", ""]
    verdict = (f"Its {len(ratios)} rows, measured on the H200: predicted / measured {ratio_range(ratios)}, "
               f"{sum(1 / BAR <= r <= BAR for r in ratios)} within {BAR:g}x (these rows are among those the constants "
               "are fitted on; the held-out column of the table above predicts each dtype from the other's). The "
               "instruction count behind its issue term is set beside Nsight Compute's in the table after this one.")
    return [
        heading,
        "",
        "The tiled fused forward (`involution/csrc/cuda/span_tile.cu`: a tile's weights formed on tensor cores "
        "(bfloat16) or by FMAs (float32) into shared memory and aggregated from a staged input window) at RedNet-50's "
        "shapes, batch 32, predicted on the H200 with the constants fitted above; its shared-memory passes (bank "
        "conflicts traced) at one 128-byte wavefront a clock per SM, a hardware rate. Beside it the H200's measured "
        "generic generated forward (one thread per pixel and group) and involution's forward alone, the aggregation "
        "of the unfused path (its span conv comes on top): the issue's bar is the fused forward at most 0.5x span "
        "conv + involution, so a prediction above 0.5x the forward alone misses it whatever the span conv takes. "
        "Instruction ratio: all SASS instructions over the traced ones (memory, shared memory, multiply-adds).",
        "",
        verdict,
        "",
        *_harness.table(["shape", "dtype", "layout", "grid x block", "registers", "shared (KiB)", "blocks per SM",
                         "instruction ratio", "bound", "predicted (us)", "measured (us)", "predicted / measured",
                         "generic generated forward, measured (us)", "involution forward, measured (us)",
                         "predicted / involution forward"], "lllllrrrlrrrrrr", cells),
    ]


# ---------------------------------------------------------------------------------------
# The instruction ratio against Nsight Compute's executed instructions
# ---------------------------------------------------------------------------------------

# The sixth H200 draw's Nsight Compute run (involution_vectors.cu's kernels among its calls).
NCU = RESULTS / "h200" / "draw6" / "logs"
# ncu's call labels -> the kernel table's rows (the calls on the generic kernels are no row). The
# sixth draw's "oplib" calls ran the chunked kernels and its "vectors" calls involution_vectors.cu's;
# where a later draw has a "chunked" call, its "oplib" call ran the vectors kernel (``_ncu_row``).
NCU_CALLS = {"oplib forward": "forward", "oplib grad_input": "grad_input", "oplib grad_weight": "grad_weight",
             "oplib generated forward": "generated forward", TILED: TILED,
             "tensor cores generated forward": MMA_FORWARD, "tensor cores generated grad_input": MMA_GRAD_INPUT,
             "vectors forward": VECTORS, "vectors grad_input": VECTORS_GRAD_INPUT,
             "vectors grad_weight": VECTORS_GRAD_WEIGHT}


def _ncu_row(label: str, precision: str, calls: list[str]) -> Optional[str]:
    """The table's row of ncu's call ``label`` at ``precision`` (None: no row), among ``calls``."""
    kernel = label.split(" ", 1)[1]
    if f"chunked {kernel}, {precision}" in calls:  # the op ran the vectors kernel there
        return {"oplib": f"vectors {kernel}", "chunked": kernel}.get(label.split(" ", 1)[0], NCU_CALLS.get(label))
    return NCU_CALLS.get(label)


def _ncu_kernel(cell: str) -> str:
    """A kernel's name without its template arguments, from ncu's "Kernel Name" (``void
    involution_forward_chunked<oplib_bfloat16, int, 7, 1, 1>(const T1 *, ...)``)."""
    return cell.removeprefix("void ").split("<")[0].split("(")[0]


def ncu_instructions(rows: list[dict], folder: Path = NCU) -> list[dict]:
    """Per profiled call that is a row of the table: the warp instructions Nsight Compute saw
    executed (the SMs' issue rate times their elapsed cycles, summed over the SMs), the traced
    ones of the model's inputs for that row, and the model's instruction ratio. Each call is
    paired with the next profiled kernel of the row's kernel's name: a run may profile kernels
    that are no call of its list (the sixth draw's three first calls of the vectors kernels,
    made while the float32 calls were being prepared), which a pairing by position would shift."""
    import csv
    import io

    text = (folder / "ncu.csv").read_text().splitlines()
    start = next(i for i, line in enumerate(text) if line.startswith('"ID"'))
    table = list(csv.reader(io.StringIO("\n".join(text[start:]))))
    header, body = table[0], [r for r in table[2:] if len(r) == len(table[0])]
    calls = json.loads((folder / "ncu-calls.json").read_text())
    shape = calls["shape"].split(",")[0]
    by_key = {_key(r): r for r in rows}
    result, next_kernel = [], 0
    for call in calls["calls"]:
        label, precision = call.split(", ")
        dtype, layout = precision.split(" ")
        row_name = _ncu_row(label, precision, calls["calls"])
        if row_name is None:
            continue
        row = by_key[" | ".join((shape, dtype, layout, row_name))]
        launch = next(e for e in row["events"] if isinstance(e, LaunchInputs))
        name = launch.kernel.split("<")[0]
        found = next((i for i in range(next_kernel, len(body)) if _ncu_kernel(body[i][header.index("Kernel Name")]) == name),
                     None)
        if found is None:
            raise SystemExit(f"{folder / 'ncu.csv'}: no profiled {name} left for the call '{call}'")
        metric, next_kernel = dict(zip(header, body[found])), found + 1
        number = lambda name: float(metric[name].replace(",", ""))  # noqa: E731
        executed = (number("sm__inst_executed.avg.pct_of_peak_sustained_elapsed") / 100 * 4
                    * number("gpc__cycles_elapsed.avg") * H200.sms)
        result.append({"call": call, "kernel": launch.kernel, "executed": executed,
                       "traced": launch.work.instructions, "ratio": launch.instruction_ratio})
    return result


def instruction_lines(data: list[dict]) -> list[str]:
    cells = [[d["call"], f"`{d['kernel']}`", f"{d['executed'] / 1e6:.1f}", f"{d['traced'] / 1e6:.2f}",
              f"{d['executed'] / d['traced']:.2f}", f"{d['ratio']:.2f}", f"{d['ratio'] * d['traced'] / d['executed']:.2f}x"]
             for d in data]
    return [
        "## Instructions: the model's count against Nsight Compute's",
        "",
        f"The issue term's instructions are the traced ones times the kernel's instruction ratio (its SASS, each "
        f"instruction weighted by {device_model.LOOP_TRIPS} per loop around it). Beside them, the warp instructions "
        "Nsight Compute saw executed on the H200 at its profiled shape (`h200/draw6/`: the SMs' issue rate "
        "times their elapsed cycles).",
        "",
        *_harness.table(["call", "instantiation", "executed (M)", "traced (M)", "executed / traced", "instruction ratio",
                         "model / executed"], "llrrrrr", cells),
    ]


# ---------------------------------------------------------------------------------------
# Kernels changed since the measurement: predicted, beside what the draw measured
# ---------------------------------------------------------------------------------------


def _unnamed(events: list) -> list:
    """``events`` with each launch's instantiation name left out: what its SASS and trace give."""
    return [dataclasses.replace(e, kernel="") if isinstance(e, LaunchInputs) else e for e in events]


def changed_rows(rows: list[dict], current: list[dict]) -> list[dict]:
    """The rows whose model inputs the current kernels change (their SASS or their trace): each
    with the current inputs, as the json keeps them. An instantiation renamed alone (a template
    argument added, whose first value is the kernel as it was: the vectors forward's WIDE) is no
    change."""
    now = {_key(r): r["events"] for r in current}
    return [{"shape": r["shape"], "dtype": r["dtype"], "layout": r["layout"], "kernel": r["kernel"],
             "events": events_to_json(now[_key(r)])} for r in rows if _unnamed(now[_key(r)]) != _unnamed(r["events"])]


def changed_lines(data: list[dict], rows: list[dict], constants: Constants, bandwidth: float) -> list[str]:
    """The changed rows predicted with the constants fitted above, beside the prediction and
    the measurement of the kernels the draw timed: what the next draw should find."""
    measured = {_key(r): r for r in rows}
    cells = []
    for entry in data:
        row = measured[_key(entry)]
        events = events_from_json(entry["events"])
        before = device_model.predict(row["events"], H200, constants, bandwidth)
        after = device_model.predict(events, H200, constants, bandwidth)
        main = next(e for e in events if isinstance(e, LaunchInputs))
        terms = device_model.launch_terms(main, H200, constants, bandwidth)
        cells.append([entry["shape"], entry["dtype"], entry["layout"], entry["kernel"], f"`{main.kernel}`",
                      str(main.registers), f"{main.instruction_ratio:.2f}", terms.bound, f"{before * 1e6:.1f}",
                      f"{after * 1e6:.1f}", f"{after / before:.2f}x", f"{row['measured_s'] * 1e6:.1f}",
                      f"{row['measured_s'] * after / before * 1e6:.1f}"])
    heading = "## Predicted for the kernels changed since the measurement"
    if not cells:
        return [heading, "", "None: the current kernels are those the draw measured.", ""]
    return [
        heading,
        "",
        f"{len(cells)} rows whose kernel changed since the draw timed it (its SASS or its trace differ), predicted "
        "with the constants fitted above: before (the kernel measured) and after (the current one), and the "
        "measured time scaled by their ratio, what the next draw should find. These wait for it (`make gpu-check`).",
        "",
        *_harness.table(["shape", "dtype", "layout", "kernel", "instantiation now", "registers", "instruction ratio",
                         "bound", "predicted before (us)", "predicted now (us)", "now / before", "measured before (us)",
                         "expected now (us)"], "llllllrrlrrrr", cells),
    ]



def one_pixel_choices(data: list[dict], pixels: list[dict], constants: Constants,
                      bandwidth: float) -> list[tuple[str, bool, bool]]:
    """For each pixel-a-lane candidate (``ONE_PIXEL_PAIRS``) and its pairs' row at the same call:
    (the row, whether the host takes a pixel a lane on an H200, as ``pixel_entries`` recorded it
    there, whether the model puts the host's choice the faster of the two or equal)."""
    by_key = {(e["shape"], e["dtype"], e["layout"], e["kernel"]): e for e in data}
    hosts = {(e["shape"], e["dtype"], e["layout"], e["kernel"]): e["pixels"] for e in pixels
             if e["gpu"] == H200.name and e["host"]}
    choices = []
    for entry in (e for e in data if e["kernel"] in ONE_PIXEL_PAIRS):
        key = (entry["shape"], entry["dtype"], entry["layout"], ONE_PIXEL_PAIRS[entry["kernel"]])
        if key not in by_key or key not in hosts:
            continue
        one, pairs = (device_model.predict(events_from_json(e["events"]), H200, constants, bandwidth)
                      for e in (entry, by_key[key]))
        chosen, other = (one, pairs) if hosts[key] == 1 else (pairs, one)
        label = f"{entry['shape']} {entry['dtype']} {CANDIDATES[entry['kernel']][0]}"
        choices.append((label, hosts[key] == 1, chosen <= other))
    return choices


def builds_on(arch: str, source_name: str) -> dict:
    """Each instantiation of a source (by name) -> ptxas's report of NVRTC's compile of it with
    CuPy's options for ``arch`` (``oplib.testing.nvrtc.KernelResources``: its registers and
    spills), what the driver tells the host of the build (``vectors_wide``) on a GPU of that
    architecture."""
    from oplib.kernels.cuda_source import name_expression
    from oplib.testing import nvrtc

    return {name_expression(u.kernel, u.dtype, u.specialisation): u
            for u in nvrtc.resource_usage(involution_cuda.load_source(source_name), arch)}


def mark_h200_wide(candidates: list[dict]) -> None:
    """Each wide vectors forward candidate marked with whether the host takes it on an H200
    (``h200_host``): the op's forward at its case recorded through the host's own choice
    (``vectors_wide``), its questions answered as sm_90's build would (``_GpuRecorder``: ptxas's
    spills, the resident blocks of each width's registers)."""
    builds = builds_on(H200.arch, involution_cuda.VECTORS_SOURCE)
    for entry in (e for e in candidates if e["kernel"] == VECTORS_WIDE_FORWARD):
        qualname, args = calls(table_shape(entry["shape"]), getattr(torch, entry["dtype"]), entry["layout"])["forward"]

        def launch(policy=None, launcher=None) -> Launch:
            events = device_model.record_launches(qualname, *args, policy=policy, launcher=launcher)
            return next(e for e in events if isinstance(e, Launch))

        wide, narrow = launch(involution_cuda.VECTORS_WIDE), launch(involution_cuda.VECTORS_NARROW)
        recorder = _GpuRecorder(H200, _source_profiles([wide, narrow], H200.arch, _profiles), builds)
        entry["h200_host"] = launch(launcher=recorder) == wide


def candidate_lines(data: list[dict], rows: list[dict], table: list[dict], constants: Constants,
                    bandwidth: float, pixels: list[dict]) -> list[str]:
    """``CANDIDATES``' rows predicted with the constants fitted above, beside the prediction and
    the measurement of the kernel that serves the call now (the table's row), and its floor
    (``table``, ``measured_rows``' rows): the measured time scaled by the two predictions' ratio
    is what the next draw should find."""
    measured = {_key(r): r for r in rows}
    floors = {_key(r): float(r["floor (ms)"]) * 1e-3 for r in table if "floor (ms)" in r}
    cells, ratios = [], []
    for entry in (e for e in data if e["kernel"] in CANDIDATES):
        served = CANDIDATES[entry["kernel"]][0]
        case = (entry["shape"], entry["dtype"], entry["layout"])
        row = measured.get(" | ".join((*case, CANDIDATE_BESIDE.get(entry["kernel"], served))))
        row = row or measured[" | ".join((*case, served))]
        events = events_from_json(entry["events"])
        now = device_model.predict(row["events"], H200, constants, bandwidth)
        predicted = device_model.predict(events, H200, constants, bandwidth)
        main = next(e for e in events if isinstance(e, LaunchInputs))
        terms = device_model.launch_terms(main, H200, constants, bandwidth)
        floor = floors[" | ".join((*case, served))]
        expected = row["measured_s"] * predicted / now
        ratios.append(predicted / now)
        cells.append([entry["shape"], entry["dtype"], entry["layout"], entry["kernel"], f"`{main.kernel}`",
                      f"{main.blocks} x {main.threads_per_block}", str(main.registers),
                      f"{main.instruction_ratio:.2f}", terms.bound, f"{predicted * 1e6:.1f}", f"{now * 1e6:.1f}",
                      f"{predicted / now:.2f}x", f"{row['measured_s'] * 1e6:.1f}", f"{expected * 1e6:.1f}",
                      f"{floor * 1e6:.1f}", f"{expected / floor:.2f}x"])
    heading = "## Predicted, not yet measured: kernels waiting for a draw"
    if not cells:
        return [heading, "", "None: the measured table times every candidate kernel.", ""]
    choices = one_pixel_choices(data, pixels, constants, bandwidth)
    ones = [label for label, one, _ in choices if one]
    widths = [(f"{e['shape']} {e['dtype']}", e.get("h200_host")) for e in data if e["kernel"] == VECTORS_WIDE_FORWARD]
    wides = [label for label, taken in widths if taken]
    return [
        heading,
        "",
        "Kernels the measured run did not time (`make gpu-check` times each in a column of its own beside the row "
        "of the call it serves), at the rows they serve: `involution_vectors.cu`'s NCHW forward, stride-1 "
        "grad_input and grad_weight, a vector of 4 pixels a lane (2 in float64) and a fixed number of a group's "
        "channels (grad_weight: one kernel row) a thread (widths a multiple of the vector); and the "
        "channels_last calls with a lane a 16-byte vector of a group's channels (\"lanes on channels\", the `LAST` "
        "policy): `involution_last.cu`'s kernels, the forward's with two adjacent pixels a lane (`LAST_PAIRS`) and "
        "the warp's weights staged in shared memory, "
        "grad_input's a block a segment of a band of two input rows with, for each output row, the band's kernel "
        "rows of its weights staged in shared memory, "
        "grad_weight's with two adjacent pixels a lane and the group summed by shuffles; the forward and "
        "grad_weight with a pixel a lane (\"a pixel a lane\", `LAST_ONE_PIXEL`), which the host takes on a GPU "
        "where the pairs' grid is under a wave of the blocks it holds at once (`last_pixels`, by the driver's "
        "occupancy calculator): on an H200, by the pairs' resident blocks, at "
        f"{len(ones)} of {len(choices)} rows ({', '.join(ones) or 'none'}), the model putting the host's choice the "
        f"faster of the two (or as fast) at {sum(faster for *_, faster in choices)} of {len(choices)}; and "
        "grad_input's other candidate under the policy, the chunked "
        "kernel at one vector a thread (\"vector a thread\", `LAST_VECTOR_GRAD_INPUT`); and `involution_vectors.cu`'s "
        "NCHW forward with twice a thread's channels (\"vectors, wide\", `VECTORS_WIDE`: each kernel row's weights "
        "loaded and converted once for twice the multiply-adds), which the host takes on a GPU where its build keeps "
        "them in registers and as many blocks resident as the narrow one's (`vectors_wide`, by the driver's local "
        "memory of the build and its occupancy calculator; ptxas spills them at stride 2 on sm_80 to sm_90 and from "
        f"sm_100 on): on an H200, by sm_90's build, at {len(wides)} of {len(widths)} rows ({', '.join(wides) or 'none'}), "
        "each beside the narrow vectors forward, the op's kernel there now, as the draw measured it. Predicted with the constants fitted above, beside the prediction and the H200's measurement of the kernel "
        "that serves the row now: the measured time scaled by the two "
        f"predictions' ratio is what the next draw should find. Predicted / now {ratio_range(ratios)}, faster at "
        f"{sum(r < 1.0 for r in ratios)} of {len(ratios)} rows.",
        "",
        *_harness.table(["shape", "dtype", "layout", "kernel", "instantiation", "grid x block", "registers",
                         "instruction ratio", "bound", "predicted (us)", "the row's kernel, predicted (us)",
                         "predicted / the row's", "the row's kernel, measured (us)", "expected (us)", "floor (us)",
                         "expected / floor"], "lllllllrlrrrrrrr", cells),
    ]


def vectors_lines(rows: list[dict], table: list[dict], constants: Constants, bandwidth: float) -> list[str]:
    """involution_vectors.cu's measured rows (``VECTORS_ROWS``) predicted with the constants fitted
    above beside their measured time, the chunked kernel's measured time at the same call (the
    row it serves) and the floor (``table``, ``measured_rows``' rows)."""
    measured = {_key(r): r for r in rows}
    floors = {_key(r): float(r["floor (ms)"]) * 1e-3 for r in table if "floor (ms)" in r}
    cells, ratios, against, over = [], [], [], []
    for row in rows:
        if row["kernel"] not in VECTORS_ROWS:
            continue
        served = " | ".join((row["shape"], row["dtype"], row["layout"], VECTORS_ROWS[row["kernel"]][0]))
        chunked, floor = measured[served]["measured_s"], floors[served]
        inputs, terms, predicted, resident = _predicted(row, constants, bandwidth)
        ratios.append(predicted / row["measured_s"])
        against.append(row["measured_s"] / chunked)
        over.append(row["measured_s"] / floor)
        cells.append([row["shape"], row["dtype"], row["layout"], row["kernel"], f"`{inputs.kernel}`",
                      f"{inputs.blocks} x {inputs.threads_per_block}", str(inputs.registers), str(resident), terms.bound,
                      f"{predicted * 1e6:.1f}", f"{row['measured_s'] * 1e6:.1f}", f"{ratios[-1]:.2f}x",
                      f"{chunked * 1e6:.1f}", f"{against[-1]:.2f}x", f"{floor * 1e6:.1f}", f"{over[-1]:.2f}x"])
    heading = "## Measured: involution_vectors.cu's NCHW kernels"
    if not cells:
        return [heading, "", "Not timed in the measured table.", ""]
    return [
        heading,
        "",
        "involution's NCHW forward, stride-1 grad_input and grad_weight with a vector of 4 adjacent pixels a lane (2 "
        "in float64), the ops' kernels where they serve the call (widths a multiple of the vector), beside the "
        "chunked kernel that serves the same call without them, both measured in the same run, and the floor. "
        f"Predicted / measured {ratio_range(ratios)}, {sum(1 / BAR <= r <= BAR for r in ratios)} of {len(ratios)} "
        f"rows within {BAR:g}x (rows the constants are fitted on). Measured / the chunked kernel: "
        f"{ratio_range(against)}, faster at {sum(a < 1.0 for a in against)} of {len(against)} rows. Measured / floor: "
        f"{ratio_range(over)}, within 2x at {sum(o <= 2.0 for o in over)} of {len(over)} rows.",
        "",
        *_harness.table(["shape", "dtype", "layout", "kernel", "instantiation", "grid x block", "registers",
                         "blocks per SM", "bound", "predicted (us)", "measured (us)", "predicted / measured",
                         "chunked, measured (us)", "measured / chunked", "floor (us)", "measured / floor"],
                        "llllllrrlrrrrrrr", cells),
    ]


def _predicted_candidate(entry: dict, constants: Constants, bandwidth: float, op: str) -> tuple:
    """A ``PREDICTED`` row's (main launch's inputs, its terms, the prediction, blocks per SM,
    the floor in seconds: the bytes the table's row ``op`` must move once, ``floor_bytes``),
    and the first cells of its line: the row, the launch, the model's terms and the floor."""
    events = events_from_json(entry["events"])
    main = next(e for e in events if isinstance(e, LaunchInputs))
    terms = device_model.launch_terms(main, H200, constants, bandwidth)
    predicted = device_model.predict(events, H200, constants, bandwidth)
    resident = device_model.resident_blocks(main.registers, main.threads_per_block, main.shared_bytes, H200)
    shape = table_shape(entry["shape"])
    floor = floor_bytes(shape, getattr(torch, entry["dtype"]), op) / bandwidth
    cells = [entry["shape"], entry["dtype"], entry["layout"], f"`{main.kernel}`",
             f"{main.blocks} x {main.threads_per_block}", str(main.registers), f"{main.shared_bytes / 1024:.1f}",
             str(resident), f"{main.instruction_ratio:.2f}", terms.bound, f"{predicted * 1e6:.1f}",
             f"{floor * 1e6:.1f}", f"{predicted / floor:.2f}x"]
    return predicted, floor, cells


# The first columns of a ``PREDICTED`` kernel's table (``_predicted_candidate``'s cells).
PREDICTED_COLUMNS = ["shape", "dtype", "layout", "instantiation", "grid x block", "registers", "shared (KiB)",
                     "blocks per SM", "instruction ratio", "bound", "predicted (us)", "floor (us)", "predicted / floor"]


def generator_lines(data: list[dict], rows: list[dict], constants: Constants, bandwidth: float) -> list[str]:
    """``PREDICTED``'s generator kernel at every row it serves (bfloat16, and float32 in 3xTF32),
    predicted with the constants fitted above, beside its floor and two measured kernels of the
    draw at the same shape and layout: involution's grad_weight in float32, which the map route
    (the op's CUDA path) runs on float32 copies before three contractions of the float32 map it
    writes, a part of that route; and in the row's dtype, the unfused path's map before the
    span conv's backward (cuDNN's), a part of what the fused path's backward is to beat."""
    measured = {_key(r): r["measured_s"] for r in rows}
    cells, over, against_map, against_unfused = [], [], [], []
    for entry in (e for e in data if e["kernel"] == GENERATOR):
        predicted, floor, first = _predicted_candidate(entry, constants, bandwidth, "generator grads")
        map_weight = measured[" | ".join((entry["shape"], "float32", entry["layout"], "grad_weight"))]
        unfused_weight = measured[" | ".join((entry["shape"], entry["dtype"], entry["layout"], "grad_weight"))]
        over.append(predicted / floor)
        against_map.append(predicted / map_weight)
        against_unfused.append(predicted / unfused_weight)
        cells.append([*first, f"{map_weight * 1e6:.1f}", f"{against_map[-1]:.2f}x", f"{unfused_weight * 1e6:.1f}",
                      f"{against_unfused[-1]:.2f}x"])
    heading = "## Predicted, not yet measured: the generator's gradients on tensor cores"
    if not cells:
        return [heading, "", "None: the kernel serves no row.", ""]
    return [
        heading,
        "",
        "generated_mma.cu's `involution_generated_mma_backward_generator`, the CUDA kernel of "
        "involution_generated_backward_generator in bfloat16 and float32: per tile, gw formed on tensor cores in shared "
        "memory (never in global memory), contracted there with span_weight (grad_feature) and the feature (the "
        "block's partial sums of grad_span_weight and grad_span_bias, which torch adds up); float32's products in "
        "3xTF32 (each operand split into two TF32 parts as it is loaded, three TF32 products: a float's accuracy; the "
        "model counts their tensor-core time at half the BF16 rate). Predicted with the constants "
        "fitted above (the kernel is no row they are fitted on), beside its floor (grad_output, the input, the "
        "feature and grad_feature once) and two kernels the draw measured at the same shape and layout: "
        "involution's float32 grad_weight, the first of the four steps of the map route the op takes (the map in "
        "float32 from float32 copies, then three contractions of it), and involution's grad_weight in the row's dtype, "
        "the unfused path's map before cuDNN's span conv backward contracts it. Predicted / floor "
        f"{ratio_range(over)}, within 2x at {sum(o <= 2.0 for o in over)} of {len(over)} rows. Predicted / the "
        f"float32 grad_weight: {ratio_range(against_map)}; / the row's dtype's grad_weight: {ratio_range(against_unfused)}, "
        f"faster at {sum(a < 1.0 for a in against_unfused)} of {len(against_unfused)} rows. The next draw times it "
        "in the kernel table's \"generator grads\" row (its \"tensor cores\" column), beside the op's map route.",
        "",
        *_harness.table([*PREDICTED_COLUMNS, "float32 grad_weight, measured (us)", "predicted / it",
                         "its dtype's grad_weight, measured (us)", "predicted / it"], "llllllrrrlrrrrrrr", cells),
    ]


def _grad_input_candidate_cells(data: list[dict], rows: list[dict], constants: Constants, bandwidth: float,
                                kernel: str) -> tuple[list, list, list, list]:
    """A predicted grad_input kernel's table (``kernel``, a ``PREDICTED`` row) at every row it
    serves where the draw measured involution's grad_input: its cells, and its prediction over
    the floor, over involution's grad_input as the op runs it and over the tensor-core grad_input."""
    measured = {_key(r): r["measured_s"] for r in rows}
    cells, over, against_map, against_band = [], [], [], []
    for entry in (e for e in data if e["kernel"] == kernel):
        key = " | ".join((entry["shape"], entry["dtype"], entry["layout"]))
        if f"{key} | grad_input" not in measured:
            continue
        predicted, floor, first = _predicted_candidate(entry, constants, bandwidth, "generated grad_input")
        # as the op runs it: involution_vectors.cu's kernel where it serves the call
        map_kernel = measured.get(f"{key} | {VECTORS_GRAD_INPUT}", measured[f"{key} | grad_input"])
        band = measured.get(f"{key} | {MMA_GRAD_INPUT}")
        over.append(predicted / floor)
        against_map.append(predicted / map_kernel)
        if band is not None:
            against_band.append(predicted / band)
        cells.append([*first, f"{map_kernel * 1e6:.1f}", f"{against_map[-1]:.2f}x",
                      "-" if band is None else f"{band * 1e6:.1f}", "-" if band is None else f"{against_band[-1]:.2f}x"])
    return cells, over, against_map, against_band


def dense_grad_input_lines(data: list[dict], rows: list[dict], constants: Constants, bandwidth: float) -> list[str]:
    """``PREDICTED``'s dense window grad_input at every row it serves (16-bit dtypes, maps a
    block holds whole), as ``staged_lines`` puts the staged grad_input."""
    cells, over, against_map, against_band = _grad_input_candidate_cells(data, rows, constants, bandwidth,
                                                                         DENSE_GRAD_INPUT)
    heading = "## Predicted, not yet measured: the dense window grad_input"
    if not cells:
        return [heading, "", "None: the kernel serves no row.", ""]
    return [
        heading,
        "",
        "dense_window.cu's `involution_generated_dense_window_backward_input`, a CUDA kernel of "
        "involution_generated_backward_input on maps a block holds whole: per (sample, group), the forward's dense "
        "matrices formed, then their transposes times grad_output on tensor cores. Predicted with the constants "
        "fitted above (the kernel is no row they are fitted on), beside its floor and the two kernels the staged "
        f"grad_input's table sets it beside. Predicted / floor {ratio_range(over)}, within 2x at "
        f"{sum(o <= 2.0 for o in over)} of {len(over)} rows. Predicted / involution's grad_input: "
        f"{ratio_range(against_map)}, faster at {sum(a < 1.0 for a in against_map)} of {len(against_map)} rows; / "
        f"the tensor-core grad_input: {ratio_range(against_band)}. No draw has timed it yet.",
        "",
        *_harness.table([*PREDICTED_COLUMNS, "involution grad_input, measured (us)", "predicted / it",
                         "tensor-core grad_input, measured (us)", "predicted / it"], "llllllrrrlrrrrrrr", cells),
    ]


def _dense_weight_cells(data: list[dict], rows: list[dict], constants: Constants, bandwidth: float, kernel: str,
                        against: str) -> tuple[list, list, list, list]:
    """A dense window grad_weight kernel's table (``kernel``, a ``PREDICTED`` row) at every row it
    serves where the draw measured ``against`` (involution's grad_weight as the op runs it now in
    the row's dtype, or with ``against`` "float32" in float32): its cells, its prediction over the
    floor, whether it is within the issue's bar (2x the floor, or 10 us where the floor is under
    5 us), and its prediction over that kernel."""
    measured = {_key(r): r["measured_s"] for r in rows}
    cells, over, ratios, met = [], [], [], []
    for entry in (e for e in data if e["kernel"] == kernel):
        row = " | ".join((entry["shape"], "float32" if against == "float32" else entry["dtype"], entry["layout"]))
        if f"{row} | grad_weight" not in measured:
            continue
        predicted, floor, first = _predicted_candidate(entry, constants, bandwidth, "grad_weight")
        now = measured.get(f"{row} | {VECTORS_GRAD_WEIGHT}", measured[f"{row} | grad_weight"])
        over.append(predicted / floor)
        ratios.append(predicted / now)
        met.append(within_bar(predicted, floor))
        cells.append([*first, "yes" if met[-1] else "no", f"{now * 1e6:.1f}", f"{ratios[-1]:.2f}x"])
    return cells, over, ratios, met


def dense_weight_lines(data: list[dict], rows: list[dict], constants: Constants, bandwidth: float) -> list[str]:
    """``PREDICTED``'s dense window grad_weight (involution's own grad_weight, the ``dense_window``
    policy's) at every row it serves where the draw measured involution's grad_weight, and its
    float32 map (DENSE_MAP_WIDE, the fused op's generator gradients' first step under that policy) beside
    involution's float32 grad_weight, which the op's map route runs on float32 copies."""
    lines = []
    for kernel, heading, text, against, columns in (
            (DENSE_WEIGHT, "## Predicted, not yet measured: the dense window grad_weight",
             "dense_window.cu's `involution_dense_window_backward_weight`, involution's grad_weight on tensor cores (the "
             "`dense_window` launch policy's; the op's default policy does not take it until a draw has timed it): per "
             "(sample, group, band of output rows; a map a block holds whole in one band), the products of grad_output "
             "and the input on tensor cores (float sums), gathered at the taps. Predicted with the constants fitted above "
             "(the kernel is no row they are fitted on), beside its floor, the issue's bar (within 2x the floor, or 10 us "
             "where the floor is under 5 us) and involution's grad_weight as the draw measured it.",
             "", "involution grad_weight, measured (us)"),
            (DENSE_MAP, "## Predicted, not yet measured: the dense window grad_weight's float32 map",
             "The same kernel writing the map gw in float32 from the 16-bit operands (`DENSE_MAP_WIDE`): under the `dense_window` "
             "policy the first step of involution_generated_backward_generator's route through the map "
             "(`generator_grads_through_dense_map`), whose default route writes it with involution's float32 grad_weight "
             "from float32 copies of grad_output and the input. Beside its floor (the row's dtype's), the bar, and that "
             "float32 kernel as the draw measured it.", "float32", "involution float32 grad_weight, measured (us)")):
        cells, over, ratios, met = _dense_weight_cells(data, rows, constants, bandwidth, kernel, against)
        if not cells:
            lines += [heading, "", "None: the kernel serves no row.", ""]
            continue
        lines += [heading, "", f"{text} Predicted / floor {ratio_range(over)}; the bar met at {sum(met)} of {len(met)} "
                  f"rows. Predicted / that kernel: {ratio_range(ratios)}, faster at {sum(r < 1.0 for r in ratios)} of "
                  f"{len(ratios)} rows. No draw has timed it yet.", "",
                  *_harness.table([*PREDICTED_COLUMNS, "within the bar", columns, "predicted / it"], "llllllrrrlrrrlrr",
                                  cells), ""]
    return lines[:-1]


def staged_lines(data: list[dict], rows: list[dict], constants: Constants, bandwidth: float) -> list[str]:
    """``PREDICTED``'s staged grad_input at every row it serves (16-bit dtypes; the draws
    measured bfloat16), predicted with the constants fitted above, beside its floor and two
    kernels the draw measured at the same (shape, dtype, layout): involution's grad_input, which
    the op's map route runs after the span conv (and the unfused path after its own span conv),
    and the tensor-core grad_input it is to replace, whose kernel changed since (its expected
    time is in the table of changed kernels above)."""
    cells, over, against_map, against_band = _grad_input_candidate_cells(data, rows, constants, bandwidth,
                                                                         STAGED_GRAD_INPUT)
    heading = "## Predicted, not yet measured: the staged grad_input"
    if not cells:
        return [heading, "", "None: the kernel serves no row.", ""]
    return [
        heading,
        "",
        "generated_mma.cu's `involution_generated_mma_backward_input_staged`, a CUDA kernel of "
        "involution_generated_backward_input: per tile of input pixels, every kernel row's weights at the output "
        "pixels the tile reads formed on tensor cores into shared memory (never in global memory; float32's a row "
        "at a time, in 3xTF32), then summed by FMAs with grad_output staged in shared memory. Predicted with the constants "
        "fitted above (the kernel is no row they are fitted on), beside its floor (grad_output, the feature and "
        "grad_input once) and two kernels the draw measured at the same shape, dtype and layout: involution's "
        "grad_input as the op runs it (the vectors kernel where it serves the call), which the op's map route runs "
        "after the span conv writes the map (the unfused path after its own span conv), and the tensor-core grad_input this one is to replace (its kernel changed since: its "
        f"expected time is in the table above). Predicted / floor {ratio_range(over)}, within 2x at "
        f"{sum(o <= 2.0 for o in over)} of {len(over)} rows. Predicted / involution's grad_input: "
        f"{ratio_range(against_map)}, faster at {sum(a < 1.0 for a in against_map)} of {len(against_map)} rows; / "
        f"the tensor-core grad_input: {ratio_range(against_band)}. It declines RedNet-50's 7x7 map at stride 1 (its "
        "tiles would hold it in less than half their pixels; the map route serves it). The next draw times it in "
        "the kernel table's grad_input row (its \"staged\" column).",
        "",
        *_harness.table([*PREDICTED_COLUMNS, "involution grad_input, measured (us)", "predicted / it",
                         "tensor-core grad_input, measured (us)", "predicted / it"], "llllllrrrlrrrrrrr", cells),
    ]


def _forward_candidate_cells(data: list[dict], rows: list[dict], table: list[dict], constants: Constants,
                             bandwidth: float, kernel: str) -> tuple[list, list, list, list]:
    """A predicted forward kernel's table (``kernel``, a ``PREDICTED`` row) at every row it
    serves where the draw measured the op's fused forward: its cells, and its prediction over
    the floor, over that fused forward and over span conv + involution (``table``'s "generic
    (before)" of the generated forward)."""
    measured = {_key(r): r["measured_s"] for r in rows}
    before = {_key(r): float(r["generic (before, ms)"]) * 1e-3 for r in table if r["kernel"] == "generated forward"}
    cells, over, against_mma, against_unfused = [], [], [], []
    for entry in (e for e in data if e["kernel"] == kernel):
        key = " | ".join((entry["shape"], entry["dtype"], entry["layout"]))
        fused = TILED if entry["dtype"] == "float32" else MMA_FORWARD
        if f"{key} | {fused}" not in measured:
            continue
        predicted, floor, first = _predicted_candidate(entry, constants, bandwidth, "generated forward")
        mma, unfused = measured[f"{key} | {fused}"], before[f"{key} | generated forward"]
        over.append(predicted / floor)
        against_mma.append(predicted / mma)
        against_unfused.append(predicted / unfused)
        cells.append([*first, f"{mma * 1e6:.1f}", f"{against_mma[-1]:.2f}x", f"{unfused * 1e6:.1f}",
                      f"{against_unfused[-1]:.2f}x"])
    return cells, over, against_mma, against_unfused


def dense_forward_lines(data: list[dict], rows: list[dict], table: list[dict], constants: Constants,
                        bandwidth: float) -> list[str]:
    """``PREDICTED``'s dense window forward at every row it serves (16-bit dtypes, maps a block
    holds whole: RedNet-50's 7 x 7 ones), as ``staged_forward_lines`` puts the staged forward."""
    cells, over, against_mma, against_unfused = _forward_candidate_cells(data, rows, table, constants, bandwidth,
                                                                         DENSE_FORWARD)
    heading = "## Predicted, not yet measured: the dense window forward"
    if not cells:
        return [heading, "", "None: the kernel serves no row.", ""]
    return [
        heading,
        "",
        "dense_window.cu's `involution_generated_dense_window`, a CUDA kernel of involution_generated's forward on "
        "maps a block holds whole: per (sample, group), the weights formed on tensor cores, written into a dense "
        "matrix of output pixels by input pixels (hi and lo), and the aggregation one tensor-core product of it "
        "with the staged input. Predicted with the constants fitted above (the kernel is no row they are fitted "
        "on), beside its floor and what the draw measured at the same shape, dtype and layout, as the staged "
        f"forward's table. Predicted / floor {ratio_range(over)}, within 2x at {sum(o <= 2.0 for o in over)} of "
        f"{len(over)} rows. Predicted / the op's fused forward: {ratio_range(against_mma)}, faster at "
        f"{sum(a < 1.0 for a in against_mma)} of {len(against_mma)} rows; / span conv + involution: "
        f"{ratio_range(against_unfused)}, within 0.5x at {sum(a <= 0.5 for a in against_unfused)} of "
        f"{len(against_unfused)} rows. No draw has timed it yet.",
        "",
        *_harness.table([*PREDICTED_COLUMNS, "the op's fused forward, measured (us)", "predicted / it",
                         "span conv + involution, measured (us)", "predicted / it"], "llllllrrrlrrrrrrr", cells),
    ]


def staged_forward_lines(data: list[dict], rows: list[dict], table: list[dict], constants: Constants,
                         bandwidth: float) -> list[str]:
    """``PREDICTED``'s staged forward at every row it serves (16-bit dtypes on tensor cores,
    float32 in 3xTF32; the draws measured bfloat16 and float32), predicted with the constants
    fitted above, beside its floor and what the draw measured at the same (shape, dtype, layout):
    the fused forward the op runs there (``rows``: the tensor-core one, float32's tiled one), and
    span conv + involution, the path the fused forward is to beat by the issue's 0.5x
    (``table``'s "generic (before)" of the generated forward)."""
    cells, over, against_mma, against_unfused = _forward_candidate_cells(data, rows, table, constants, bandwidth,
                                                                         STAGED_FORWARD)
    heading = "## Predicted, not yet measured: the staged forward"
    if not cells:
        return [heading, "", "None: the kernel serves no row.", ""]
    return [
        heading,
        "",
        "generated_mma.cu's `involution_generated_mma_staged`, a CUDA kernel of involution_generated's forward: per "
        "tile of output pixels, the weights of all its taps (for a 7 x 7 window, of half the kernel "
        "rows at a time, at stride 2 of a third; float32's a third at both strides) formed on tensor cores into shared memory once (never in global memory), then summed by FMAs "
        "with the input staged in shared memory. float32 forms them in 3xTF32 (each operand split into two TF32 "
        "parts, three TF32 products: a float's accuracy; the model counts their tensor-core time at half the BF16 "
        "rate) and at stride 2 takes 8 channels a block (its float region's room). Predicted with the constants fitted above (the kernel is no row "
        "they are fitted on), beside its floor (the input, the feature and the output once) and what the draw "
        "measured at the same shape, dtype and layout: the fused forward the op runs there (the tensor-core one; "
        "float32's tiled one, FMAs), and span conv + "
        f"involution, which the issue's bar wants the fused forward at 0.5x of. Predicted / floor {ratio_range(over)}, "
        f"within 2x at {sum(o <= 2.0 for o in over)} of {len(over)} rows. Predicted / the op's fused forward: "
        f"{ratio_range(against_mma)}, faster at {sum(a < 1.0 for a in against_mma)} of {len(against_mma)} rows; / "
        f"span conv + involution: {ratio_range(against_unfused)}, within 0.5x at "
        f"{sum(a <= 0.5 for a in against_unfused)} of {len(against_unfused)} rows. RedNet-50's 7x7 maps it takes "
        "folded, four samples a block (8 x 8 pixels each of an 8 x 32 tile), at stride 2 too (the kernel rows in "
        "three passes leave room for four samples' regions beside an R of 128). The next "
        "draw times it in the kernel table's generated forward row (its \"staged\" column).",
        "",
        *_harness.table([*PREDICTED_COLUMNS, "the op's fused forward, measured (us)", "predicted / it",
                         "span conv + involution, measured (us)", "predicted / it"], "llllllrrrlrrrrrrr", cells),
    ]


def span_conv_backward_floor(shape_name: str, dtype: torch.dtype, bandwidth: float) -> float:
    """Seconds the unfused path's span conv backward takes at least: its two products (cuDNN's)
    read the weight map's gradient, (N, G K^2, Ho, Wo), and the feature, and write grad_feature,
    each once over the DRAM bandwidth (span_weight's gradient a few KB)."""
    sizes = _layer_sizes(shape_name)
    return (sizes["weight_map"] + 2 * sizes["feature"]) * dtype.itemsize / bandwidth


def _layer_sizes(shape_name: str) -> dict[str, int]:
    """Elements of a RedNet-50 layer's tensors at batch 32: input (N, C, H, W), grad_output (N,
    C, Ho, Wo), the feature (N, C/4, Ho, Wo) and the weight map (N, G K^2, Ho, Wo)."""
    shape = table_shape(shape_name)
    out_h, out_w = shape.out_size
    return {"input": shape.batch * shape.channels * shape.height * shape.width,
            "grad_output": shape.batch * shape.channels * out_h * out_w,
            "feature": shape.batch * max(1, shape.channels // 4) * out_h * out_w,
            "weight_map": math.prod(shape.weight_shape)}


def generator_map_route_floor(shape_name: str, dtype: torch.dtype, bandwidth: float, copies: bool = True) -> float:
    """Seconds the op's map route for the generator's gradients (``generator_grads_through_map``)
    takes at least besides involution's float32 grad_weight: grad_output, the input and the
    feature copied to float32 (each read in ``dtype``, written in float32; none in float32), the float32 map gw
    read by each of its three contractions (grad_feature, grad_span_weight, grad_span_bias), the
    float32 feature read and grad_feature written, and grad_feature copied back to ``dtype``,
    each once over the DRAM bandwidth. Without ``copies`` (the dense map route: its kernel reads
    the 16-bit operands), grad_output and the input are not copied."""
    sizes, wide = _layer_sizes(shape_name), torch.float32.itemsize
    # (float32 operands are no copies: Tensor.to returns them)
    copied = sizes["grad_output"] + sizes["input"] + sizes["feature"] if copies else sizes["feature"]
    copies = 0 if dtype == torch.float32 else copied * (dtype.itemsize + wide)
    contractions = 3 * sizes["weight_map"] * wide + 2 * sizes["feature"] * wide
    return (copies + contractions + sizes["feature"] * (wide + dtype.itemsize)) / bandwidth


def generator_partials_floor(shape_name: str, dtype: torch.dtype, bandwidth: float) -> float:
    """Seconds the tensor-core generator's op takes at least besides its kernel: torch's sums of
    the kernel's float32 partial sums (``involution_generated_mma_backward_generator`` in
    oplib/kernels/involution/cuda.py), grad_span_weight's and grad_span_bias's over a slot per tile
    and sample, and where the groups are split among blocks grad_feature's over the splits (its
    float32 sum then copied into grad_feature's layout and dtype), each read and written once over
    the DRAM bandwidth. The kernel's writes of them are its own traced stores."""
    shape = table_shape(shape_name)
    source = involution_cuda.load_source(involution_cuda.GENERATED_MMA_SOURCE)
    sizes, wide = _layer_sizes(shape_name), torch.float32.itemsize
    reduced, rows, kernel_size = max(1, shape.channels // 4), shape.groups * shape.kernel**2, [shape.kernel] * 2
    config = involution_cuda.generated_mma_generator_config(source, dtype, shape.batch, reduced, shape.out_size,
                                                           kernel_size, [shape.stride] * 2, [1, 1], shape.groups)
    slots, splits = involution_cuda.generated_mma_generator_parts(source, config, shape.batch, reduced,
                                                                  shape.out_size[1])
    span_sums = slots * rows * (reduced + 1) * wide + rows * (reduced + 1) * dtype.itemsize
    feature_parts = (splits + 2) * sizes["feature"] * wide + sizes["feature"] * dtype.itemsize if splits > 1 else 0
    return (span_sums + feature_parts) / bandwidth


def layer_totals(data: list[dict], changed: list[dict], rows: list[dict], table: list[dict], constants: Constants,
                 bandwidth: float, routes: Optional[dict[str, float]] = None) -> list[dict]:
    """Per (shape, dtype, layout), seconds of the fused path and the unfused one, forward and
    backward, for the issue's two bars on the fused path, forward at most 0.5x and forward + backward below
    1.0x of span conv + involution, at each (shape, layout) in bfloat16 where the fused kernels
    are predicted or measured, and in float32 (its forward the fastest of the predicted staged
    kernel, in 3xTF32, and the tiled kernel and the op's as measured; its grad_input the faster of
    the predicted staged kernel and the map route; its generator's gradients the faster of the predicted
    tensor-core kernel, in 3xTF32, and the map route). In bfloat16: its forward the fastest of the predicted staged
    and dense window kernels (``PREDICTED``) and the measured tensor-core one (a kernel changed since, ``changed``:
    its expected time, the measured one scaled as the model scales it); each of its two backward
    ops the fastest of its kernels (predicted or measured) and the op's map route, at least its
    measured kernels and its other traffic at its DRAM floor. The unfused path: the draw's span
    conv (its span conv + involution less its involution forward), involution's forward,
    grad_input and grad_weight as the op runs them now on an H200 (the forward: the wide vectors
    forward where the H200 takes it, ``h200_host``, at its expected time: the narrow one's
    measured time scaled by their two predictions), and its span conv backward at its DRAM floor
    (unmeasured: a lower bound)."""
    # the routes the draw timed whole (``route_times``; ``routes`` in place of the committed run's)
    measured = {**(route_times() if routes is None else routes), **{_key(r): r["measured_s"] for r in rows}}
    drawn = dict(measured)  # as the draw measured them, before the changed kernels' scaling
    events_by = {_key(r): r["events"] for r in rows}
    expected = {_key(entry) for entry in changed}
    for entry in changed:
        key = _key(entry)
        now = device_model.predict(events_from_json(entry["events"]), H200, constants, bandwidth)
        measured[key] *= now / device_model.predict(events_by[key], H200, constants, bandwidth)
    before = {_key(r): float(r["generic (before, ms)"]) * 1e-3 for r in table if r["kernel"] == "generated forward"}
    predicted = {}  # (kernel, key) -> seconds
    for entry in data:
        if entry["kernel"] in PREDICTED:
            key = " | ".join((entry["shape"], entry["dtype"], entry["layout"]))
            predicted[entry["kernel"], key] = _predicted_candidate(entry, constants, bandwidth, "generated forward")[0]

    def faster(options: list[tuple[str, Optional[float]]]) -> tuple[str, float]:
        return min(((name, t) for name, t in options if t is not None), key=lambda o: o[1])

    def map_route(key: str, estimate: float) -> tuple[str, float]:
        return ("map route, measured", measured[key]) if key in measured else ("map route", estimate)

    def timed(key: str, label: str, estimate: Optional[float]) -> tuple[str, Optional[float]]:
        """A kernel or route as a draw timed it (``PREDICTED_TIMED``' rows, ``ROUTES``), else predicted."""
        return (f"{label}, measured", measured[key]) if key in measured else (f"{label}, predicted", estimate)

    def as_run(row: str, kernel: str, vectors: str) -> float:
        """involution's ``kernel`` at ``row`` as the op runs it now: the vectors kernel where it serves."""
        return measured.get(f"{row} | {vectors}", measured[f"{row} | {kernel}"])

    wide = {" | ".join((e["shape"], e["dtype"], e["layout"])): e for e in data
            if e["kernel"] == VECTORS_WIDE_FORWARD and e.get("h200_host")}

    def forward_as_run(row: str) -> float:
        """involution's forward at ``row`` as the op runs it now on an H200: the wide vectors
        forward where it takes it, the narrow one's measured time scaled by their predictions."""
        narrow = as_run(row, "forward", VECTORS)
        if row not in wide or f"{row} | {VECTORS}" not in events_by:
            return narrow
        return narrow * (device_model.predict(events_from_json(wide[row]["events"]), H200, constants, bandwidth)
                         / device_model.predict(events_by[f"{row} | {VECTORS}"], H200, constants, bandwidth))

    totals = []
    for key, span_and_involution in before.items():
        shape_name, dtype, layout = key.split(" | ")[:3]
        row = " | ".join((shape_name, dtype, layout))
        if dtype not in ("bfloat16", "float32") or dtype == "bfloat16" and (GENERATOR, row) not in predicted:
            continue
        def tensor_cores(kernel: str) -> tuple[str, Optional[float]]:
            key = f"{row} | {kernel}"
            return f"tensor cores, {'expected' if key in expected else 'measured'}", measured.get(key)

        # The draw's span conv: its span conv + involution ran involution's forward as the op did then.
        span_forward = span_and_involution - drawn[f"{row} | forward"]
        unfused_forward = span_forward + forward_as_run(row)
        unfused_input = as_run(row, "grad_input", VECTORS_GRAD_INPUT)
        unfused_weight = as_run(row, "grad_weight", VECTORS_GRAD_WEIGHT)
        torch_dtype = getattr(torch, dtype)
        span_backward = span_conv_backward_floor(shape_name, torch_dtype, bandwidth)
        # The map route: the span conv writes the map and involution's grad_input reads it; gw in
        # float32 (from float32 copies) by involution's float32 grad_weight, then contracted.
        # (a draw from the seventh on times the ops' map routes: their rows replace the estimates)
        wide = " | ".join((shape_name, "float32", layout))
        map_input = map_route(f"{row} | {GENERATED_INPUT_ROUTE}", span_forward + unfused_input)
        map_generator = map_route(f"{row} | {GENERATOR_ROUTE}", as_run(wide, "grad_weight", VECTORS_GRAD_WEIGHT)
                                  + generator_map_route_floor(shape_name, torch_dtype, bandwidth))
        partials = generator_partials_floor(shape_name, torch_dtype, bandwidth)

        def kernel(name: str, label: str) -> tuple[str, Optional[float]]:
            return timed(f"{row} | {name}", label, predicted.get((name, row)))

        sums = predicted[GENERATOR, row] + partials if (GENERATOR, row) in predicted else None
        with_sums = timed(f"{row} | {GENERATOR_SUMS_ROUTE}", "tensor cores + sums", sums)
        if dtype == "bfloat16":
            forward = faster([kernel(STAGED_FORWARD, "staged"), kernel(DENSE_FORWARD, "dense window"),
                              tensor_cores(MMA_FORWARD)])
            grad_input = faster([kernel(STAGED_GRAD_INPUT, "staged"), kernel(DENSE_GRAD_INPUT, "dense window"),
                                 tensor_cores(MMA_GRAD_INPUT), map_input])
            dense_map = predicted.get((DENSE_MAP, row))
            generator = faster([with_sums, map_generator,
                                timed(f"{row} | {DENSE_MAP_ROUTE}", "dense map", None if dense_map is None else
                                      dense_map + generator_map_route_floor(shape_name, torch_dtype, bandwidth,
                                                                            copies=False))])
        else:  # float32: the staged kernels (3xTF32), the tiled one (FMAs), the op's and the map routes
            forward = faster([kernel(STAGED_FORWARD, "staged"),
                              (f"tiled, {'expected' if f'{row} | {TILED}' in expected else 'measured'}",
                               measured.get(f"{row} | {TILED}")), ("the op's, measured", measured[f"{row} | generated forward"])])
            grad_input = faster([kernel(STAGED_GRAD_INPUT, "staged"), map_input])
            generator = faster([with_sums, map_generator])
        totals.append({"shape": shape_name, "dtype": dtype, "layout": layout, "forward": forward,
                       "grad_input": grad_input, "generator": generator,
                       "fused": forward[1] + grad_input[1] + generator[1], "span_forward": span_forward,
                       "unfused_forward": unfused_forward, "unfused_input": unfused_input,
                       "unfused_weight": unfused_weight, "span_backward": span_backward,
                       "unfused": unfused_forward + unfused_input + unfused_weight + span_backward})
    return totals


def layer_lines(totals: list[dict]) -> list[str]:
    """``layer_totals`` as the page's section: a row per (shape, dtype, layout), each fused
    kernel named by where its time comes from, and the two bars' ratios."""
    cells, forward_ratios, both_ratios, routes = [], {}, {}, {}
    for t in totals:
        dtype, forward, grad_input, generator = t["dtype"], t["forward"], t["grad_input"], t["generator"]
        if dtype == "bfloat16":
            routes[t["shape"], t["layout"]] = (grad_input[0], generator[0])
        forward_ratios.setdefault(dtype, []).append(forward[1] / t["unfused_forward"])
        both_ratios.setdefault(dtype, []).append(t["fused"] / t["unfused"])
        cells.append([t["shape"], dtype, t["layout"], f"{forward[1] * 1e6:.1f} ({forward[0]})",
                      f"{grad_input[1] * 1e6:.1f} ({grad_input[0]})", f"{generator[1] * 1e6:.1f} ({generator[0]})",
                      *(f"{t[k] * 1e6:.1f}" for k in ("fused", "span_forward", "unfused_forward", "unfused_input",
                                                      "unfused_weight", "span_backward", "unfused")),
                      f"{forward_ratios[dtype][-1]:.2f}x", f"{both_ratios[dtype][-1]:.2f}x"])
    heading = "## Predicted: the fused path against span conv + involution, forward and backward"
    if not cells:
        return [heading, "", "None: no row has the fused kernels predicted or measured.", ""]
    by_map = [sum(route[i].startswith("map route") for route in routes.values()) for i in range(2)]
    verdicts = [f"{dtype}, forward {ratio_range(forward_ratios[dtype])}, within 0.5x at "
                f"{sum(r <= 0.5 for r in forward_ratios[dtype])} of {len(forward_ratios[dtype])} rows; forward + "
                f"backward {ratio_range(both_ratios[dtype])}, below 1.0x at {sum(r < 1.0 for r in both_ratios[dtype])} of "
                f"{len(both_ratios[dtype])}"
                for dtype in forward_ratios]
    return [
        heading,
        "",
        "The issue's bars on the fused path (involution_generated and its two backward ops) in bfloat16 and float32, "
        "where its CUDA kernels are predicted (the tables above) or measured. The fused path in bfloat16: its forward "
        "the fastest of the staged and the dense window kernels predicted and the tensor-core one (as measured, or "
        "changed since: its "
        "expected time from the table of changed kernels); each backward op the fastest of its kernels (grad_input: "
        "the staged and the dense window kernels predicted or the tensor-core one; the generator's gradients: the "
        "tensor-core kernel "
        "predicted, with torch's sums of its partial sums at their DRAM floor, `generator_partials_floor`, or the "
        "dense map route: the dense window grad_weight's float32 map predicted, with the map's three contractions and "
        "the feature's float32 copy at their DRAM floor, no copies of grad_output and the input) and the op's map "
        "route, which its CUDA path runs until a draw confirms the kernels. In float32: "
        "its forward the fastest of the staged kernel predicted (3xTF32 on tensor cores), the tiled kernel (FMAs) and "
        "the op's as measured; its grad_input the faster of the staged kernel predicted (3xTF32) and the map route; "
        "its generator's gradients the faster of the tensor-core kernel predicted (3xTF32; with its sums) and the map route. The map "
        "route: for grad_input the draw's span conv writing the weight "
        "map and involution's grad_input reading it, for the generator's gradients involution's float32 grad_weight "
        "as measured plus (bfloat16) the float32 copies and the three contractions of the float32 map at their DRAM "
        "floor (`generator_grads_through_map`; a lower bound), or each as a draw measured it (\"map route, measured\": "
        "the generated grad_input and generator grads rows, from the seventh draw on). The unfused path: the draw's span conv (its span "
        "conv + involution less the involution forward it ran), involution's forward, grad_input and grad_weight as "
        "the op runs them now on an H200 (the vectors kernels where they serve the call: what the next draw's span "
        "conv + involution runs; the forward's wide instantiations where the H200's build of them does not spill, "
        "at their expected time: the narrow forward's measured time scaled by the two predictions), and the span "
        "conv's backward at its DRAM floor (the weight map's gradient and the "
        "feature read and grad_feature written once; unmeasured, so the unfused total is a lower bound and the "
        f"fused / unfused ratio an upper bound). Fused / unfused: {'; '.join(verdicts)}. In bfloat16 the map route "
        f"is the faster grad_input at {by_map[0]} of {len(routes)} rows and the faster generator's gradients at "
        f"{by_map[1]}.",
        "",
        *_harness.table(["shape", "dtype", "layout", "fused forward (us)", "fused grad_input (us)",
                         "fused generator grads (us)", "fused, forward + backward (us)",
                         "span conv, measured (us)", "span conv + involution (us)",
                         "involution grad_input, measured (us)", "involution grad_weight, measured (us)",
                         "span conv backward, floor (us)", "unfused, forward + backward (us)",
                         "fused / unfused, forward", "fused / unfused, forward + backward"],
                        "lllllllrrrrrrrr", cells),
    ]


# The bytes each kernel column must move, as the table's row of the call it serves
# (``floor_bytes``' kernel): a kernel that forms the weights inside has the fused op's floor.
FLOOR_OPS = {"forward": "forward", "grad_input": "grad_input", "grad_weight": "grad_weight",
             "generated forward": "generated forward", TILED: "generated forward", MMA_FORWARD: "generated forward",
             MMA_GRAD_INPUT: "generated grad_input", **{name: served for name, (served, *_) in CANDIDATES.items()},
             GENERATOR: "generator grads", STAGED_GRAD_INPUT: "generated grad_input",
             STAGED_FORWARD: "generated forward", DENSE_FORWARD: "generated forward",
             DENSE_GRAD_INPUT: "generated grad_input", DENSE_WEIGHT: "grad_weight", DENSE_MAP: "grad_weight"}
# The fused forward's kernels (the op's own call and each kernel timed beside it).
FUSED_FORWARDS = ("generated forward", TILED, MMA_FORWARD, STAGED_FORWARD, DENSE_FORWARD)


def unmeasured_lines(data: list[dict], constants: Constants, bandwidth: float) -> list[str]:
    """Every kernel column at the cases no draw has timed (``unmeasured_cases``), predicted with
    the constants fitted above, beside its floor and the bar; and per case the fused forward
    (its fastest kernel) against the unfused one (involution's forward as the op runs it and the
    span conv at its DRAM floor, the feature read and the weight map written once: a lower bound)."""
    heading = "## Predicted, not yet measured: RedNet-50's shapes no draw has timed"
    if not data:
        return [heading, "", "None: the measured table has a row of every shape.", ""]
    cells, predicted_by = [], {}
    for entry in data:
        predicted, floor, first = _predicted_candidate(entry, constants, bandwidth, FLOOR_OPS[entry["kernel"]])
        predicted_by[entry["shape"], entry["dtype"], entry["layout"], entry["kernel"]] = predicted
        cells.append([*first[:3], entry["kernel"], *first[3:], "yes" if within_bar(predicted, floor) else "no"])
    fused = []
    for shape_name, dtype, layout in dict.fromkeys((e["shape"], e["dtype"], e["layout"]) for e in data):
        forwards = {k: predicted_by[shape_name, dtype, layout, k] for k in FUSED_FORWARDS
                    if (shape_name, dtype, layout, k) in predicted_by}
        if not forwards or (shape_name, dtype, layout, "forward") not in predicted_by:
            continue
        shape = table_shape(shape_name)
        sizes, itemsize = _layer_sizes(shape_name), getattr(torch, dtype).itemsize
        span_bytes = (sizes["feature"] + sizes["weight_map"]) * itemsize
        span = span_bytes / bandwidth
        best = min(forwards, key=forwards.get)
        unfused = predicted_by[shape_name, dtype, layout, "forward"] + span
        floors = floor_bytes(shape, getattr(torch, dtype), "generated forward") / (
            floor_bytes(shape, getattr(torch, dtype), "forward") + span_bytes)
        fused.append([shape_name, dtype, layout, f"{forwards[best] * 1e6:.1f} ({best})", f"{span * 1e6:.1f}",
                      f"{unfused * 1e6:.1f}", f"{forwards[best] / unfused:.2f}x", f"{floors:.2f}x"])
    met = [c[-1] == "yes" for c in cells]
    shapes = ", ".join(dict.fromkeys(e["shape"] for e in data))
    return [
        heading,
        "",
        f"Shapes of RedNet-50's involutions that no row of the measured table holds ({shapes}), so that no constant is "
        "fitted on them: every kernel column of the kernel table at them, involution's forward, grad_input and "
        "grad_weight as the ops run them now, and each fused, candidate and predicted kernel where it serves the call, "
        "predicted with the constants fitted above, beside its floor (the bytes of the table's row it serves) and the "
        f"issue's bar on it (2x the floor, or 10 us where the floor is under 5 us): met at {sum(met)} of {len(met)} "
        "rows. The next draw's kernel table has a row of each.",
        "",
        *_harness.table([*PREDICTED_COLUMNS[:3], "kernel", *PREDICTED_COLUMNS[3:], "within the bar"],
                        "lllllllrrrlrrrl", cells),
        "",
        "The fused forward at the same cases: its fastest kernel predicted, against the unfused forward, involution's "
        "forward as the op runs it predicted plus the span conv at its DRAM floor (the feature read and the weight "
        "map written once; cuDNN's kernel is no model's), a lower bound, so the ratio is an upper bound on the "
        "issue's fused / unfused forward (bar: 0.5x). Beside it the same ratio of the two paths' DRAM floors (the "
        "fused op's input, feature and output; involution's input, map and output and the span conv's feature and "
        "map): what the ratio would be were both paths at their floor. Where it is above 0.5x, the bar holds only "
        "while the unfused path runs well above its floor: the map is small beside the activations (the stem's 3 x 3 "
        "kernel: 18 channels a pixel, 2 groups of 9 taps, to the input's 32), so writing and reading it costs the "
        "unfused path little.",
        "",
        *_harness.table(["shape", "dtype", "layout", "fused forward, predicted (us)", "span conv, floor (us)",
                         "unfused forward (us)", "fused / unfused, forward", "fused / unfused, floors"], "lllrrrrr",
                        fused),
    ]


# The draw's RedNet-50 / ResNet-50 table (bench/involution.py's models stage), beside MEASURED.
MEASURED_MODELS = MEASURED.with_name("involution-cuda-models.json")


def rednet50_involutions() -> tuple[dict[str, int], list[str]]:
    """RedNet-50's involution layers at 224 px: how many take each of ``REDNET50_SHAPES``, and
    the others (``channels@size sstride``: no row of the table)."""
    import oplib
    from oplib.models import rednet50

    model, found = rednet50().eval(), []
    hooks = [module.register_forward_hook(lambda module, args, out: found.append((*args[0].shape[1:], module.stride[0])))
             for module in model.modules() if isinstance(module, oplib.nn.Involution2d)]
    with torch.no_grad():
        model(torch.zeros(1, 3, 224, 224))
    for hook in hooks:
        hook.remove()
    names = {(s.channels, s.height, s.width, s.stride): s.name for s in REDNET50_SHAPES}
    counts = {name: 0 for name in names.values()}
    others = []
    for channels, height, width, stride in found:
        if (channels, height, width, stride) in names:
            counts[names[channels, height, width, stride]] += 1
        else:
            others.append(f"{channels}@{height} s{stride}")
    return counts, others


def network_lines(totals: list[dict], counts: dict[str, int], others: list[str], models: list[list[str]]) -> list[str]:
    """RedNet-50's involution layers summed (``layer_totals``' bfloat16 channels_last rows, each
    times its count in the network, ``rednet50_involutions``), unfused and fused, against the
    draw's RedNet-50 and ResNet-50 steps at batch 32 (``models``: the models table's rows): the
    step with the unfused layers' device time replaced by the fused layers'."""
    rows = [t for t in totals if t["dtype"] == "bfloat16" and t["layout"] == "channels_last"]
    heading = "## Predicted: RedNet-50's involution layers in the draw's RedNet-50 / ResNet-50 steps"
    if not rows or not models:
        return [heading, "", "None: no bfloat16 channels_last row, or no models table.", ""]
    # a shape the draw did not time has no totals: its layers are counted on neither side
    totalled = {t["shape"] for t in rows}
    others = [*(f"{n} x {name}" for name, n in counts.items() if n and name not in totalled), *others]
    counts = {name: n for name, n in counts.items() if name in totalled}
    sums = {key: sum(counts[t["shape"]] * (t["forward"][1] if key == "fused_forward" else t[key]) for t in rows)
            for key in ("unfused_forward", "fused_forward", "unfused", "fused")}
    cells = []
    for mode, batch, rednet, resnet, _ in models:
        if batch != "32":
            continue
        inference = mode.startswith("inference")
        unfused, fused = (sums["unfused_forward"], sums["fused_forward"]) if inference else (sums["unfused"], sums["fused"])
        rednet_step, resnet_step = 32 / float(rednet), 32 / float(resnet)
        predicted = rednet_step - unfused + fused
        cells.append([mode, batch, f"{rednet_step * 1e3:.2f}", f"{resnet_step * 1e3:.2f}", f"{unfused * 1e3:.2f}",
                      f"{unfused / rednet_step:.0%}", f"{fused * 1e3:.2f}", f"{predicted * 1e3:.2f}",
                      f"{resnet_step / rednet_step:.2f}x", f"{resnet_step / predicted:.2f}x"])
    layers = sum(counts.values())
    return [
        heading,
        "",
        f"RedNet-50's {layers} involution layers of the table's shapes ("
        + ", ".join(f"{n} x {name}" for name, n in counts.items() if n)
        + f"; {', '.join(others) if others else 'none'} besides, no measured row and counted on neither side), "
        "bfloat16 channels_last as the models table runs them, batch 32: the unfused path (span conv + involution and, "
        "training, their backward as the section above puts them) and the fused path (the section above: each of its "
        "kernels the fastest predicted or measured), summed over the layers; beside the draw's RedNet-50 and ResNet-50 "
        "steps (the models table: batch over images a second), RedNet-50's step with its unfused layers' device time "
        "replaced by the fused layers'. Only the device time changes: a step the host sets the pace of (one whose "
        "batch-128 step in the models table is barely longer) shrinks by less, so there the predicted ratio is an "
        "upper bound; a CUDA graph's step (reduce-overhead) is device time.",
        "",
        *_harness.table(["mode", "batch", "RedNet-50 step, measured (ms)", "ResNet-50 step, measured (ms)",
                         "involution layers, unfused (ms)", "their share of RedNet-50's step",
                         "involution layers, fused (ms)", "RedNet-50 step, predicted (ms)",
                         "RedNet-50 / ResNet-50, measured", "RedNet-50 / ResNet-50, predicted"], "llrrrrrrrr", cells),
    ]


def models_rows(path: Path = MEASURED_MODELS) -> list[list[str]]:
    """The rows of the draw's RedNet-50 / ResNet-50 table (none where the draw has no models table)."""
    if not path.exists():
        return []
    tables = json.loads(path.read_text())["tables"]
    return next((t["rows"] for t in tables if t["heading"].startswith("CUDA: RedNet-50 vs ResNet-50")), [])


# The tensor-core kernels (generated_mma.cu), measured rows of the table: each row's title.
MMA_TITLES = {
    MMA_FORWARD: "the tensor-core forward, involution_generated_mma",
    MMA_GRAD_INPUT: "the tensor-core grad_input, involution_generated_mma_backward_input",
}


def mma_lines(rows: list[dict], table: list[dict], constants: Constants, bandwidth: float) -> list[str]:
    """The tensor-core kernels' rows (``MMA_TITLES``) predicted with the constants fitted above
    beside their measured time, and the measured time beside what the draw measured of the path
    each is to replace (``table``, ``measured_rows``' rows): for the forward span conv +
    involution (the table's "generic (before)" of the generated forward, the issue's bar 0.5x);
    for grad_input involution's grad_input reading the span conv's map (the fused one forms the
    weights again instead)."""
    measured = {_key(r): r for r in table}
    lines = []
    time_by, replaced_by = {}, {}  # (kernel, key) -> seconds
    for kernel, title in MMA_TITLES.items():
        cells, ratios, against = [], [], []
        served = FUSED[kernel][0]
        for row in rows:
            if row["kernel"] != kernel:
                continue
            key = " | ".join((row["shape"], row["dtype"], row["layout"]))
            cell = measured[f"{key} | {served}"]
            replaced = float(cell["generic (before, ms)" if served == "generated forward" else "device (ms)"]) * 1e-3
            inputs, terms, predicted, resident = _predicted(row, constants, bandwidth)
            ratios.append(predicted / row["measured_s"])
            against.append(row["measured_s"] / replaced)
            time_by[kernel, key], replaced_by[kernel, key] = row["measured_s"], replaced
            cells.append([row["shape"], row["dtype"], row["layout"], f"{inputs.blocks} x {inputs.threads_per_block}",
                          str(inputs.registers), f"{inputs.shared_bytes / 1024:.1f}", str(resident),
                          f"{inputs.instruction_ratio:.2f}", terms.bound, f"{predicted * 1e6:.1f}",
                          f"{row['measured_s'] * 1e6:.1f}", f"{ratios[-1]:.2f}x", f"{replaced * 1e6:.1f}",
                          f"{against[-1]:.2f}x"])
        if not cells:
            continue
        model = (f"Predicted / measured {ratio_range(ratios)}, {sum(1 / BAR <= r <= BAR for r in ratios)} of "
                 f"{len(ratios)} rows within {BAR:g}x (rows the constants are fitted on).")
        if kernel == MMA_FORWARD:
            replaced_name = "span conv + involution (us)"
            text = ("generated_mma.cu forms the weights and aggregates them on tensor cores (a kernel row of a 16-pixel "
                    "run as a band matrix times the window's input rows), in float16 and bfloat16; measured on the "
                    "H200 beside the path it is to replace, span conv + involution. " + model + " Measured / span conv "
                    f"+ involution: {ratio_range(against)}, faster at {sum(a < 1.0 for a in against)} of {len(against)} "
                    f"rows, within the issue's 0.5x at {sum(a <= 0.5 for a in against)}.")
        else:
            replaced_name = "involution grad_input (us)"
            both = [(time_by[MMA_FORWARD, k] + time_by[kernel, k]) / (replaced_by[MMA_FORWARD, k] + replaced_by[kernel, k])
                    for kind, k in time_by if kind == kernel and (MMA_FORWARD, k) in time_by]
            text = ("generated_mma.cu's grad_input of involution_generated: the forward's band transposed (a band "
                    "column holds one output pixel's weights), each warp forming its kernel row's weights at the "
                    "band's output pixels on tensor cores; measured on the H200 beside involution's grad_input, which "
                    "reads the weights the span conv wrote where this one forms them again. " + model + " Measured / "
                    f"involution's grad_input: {ratio_range(against)}, faster at {sum(a < 1.0 for a in against)} of "
                    f"{len(against)} rows. The two tensor-core kernels together / span conv + involution + involution's "
                    f"grad_input, what the fused path's forward and grad_input replace (all measured): "
                    f"{ratio_range(both)}, faster at {sum(r < 1.0 for r in both)} of {len(both)} rows (the generator's "
                    "gradients, through the weight gradient's map on both paths for now, come on top of each).")
        columns = ["shape", "dtype", "layout", "launch", "registers", "shared (KiB)", "blocks per SM",
                   "instruction ratio", "bound", "predicted (us)", "measured (us)", "predicted / measured",
                   replaced_name, "measured / replaced"]
        lines += [f"## Measured: {title}", "", text, "",
                  *_harness.table(columns, "lllrrrrrlrrrrr", cells), ""]
    return lines[:-1]


# The GPUs of the per-architecture table, oldest first: the H200 the constants are fitted on and
# four it has never measured (their datasheet figures: oplib.testing.device_model).
ARCH_GPUS = (device_model.A100_SXM, device_model.L40S, device_model.H100_SXM, H200, device_model.B200)
# The kernels whose tiles the host chooses among ``GENERATED_STAGED_RUNS_W`` (row name -> the
# function of oplib.kernels.involution.cuda that launches it, ``runs_w`` its tiles).
TILE_CHOICES = {STAGED_FORWARD: "involution_generated_mma_staged",
                STAGED_GRAD_INPUT: "involution_generated_mma_backward_input_staged"}


def _profiles(source: str, which: tuple, arch: str) -> dict[str, device_model.SassProfile]:
    """``sass_profile`` of ``which`` for ``arch``, leaving out the instantiations the model
    declines there (machine code that calls outside the source's cold blocks)."""
    try:
        return device_model.sass_profile(source, which, arch)
    except ValueError:
        profiles = {}
        for instantiation in which:
            try:
                profiles.update(device_model.sass_profile(source, (instantiation,), arch))
            except ValueError:
                pass
        return profiles


class _GpuRecorder(device_model.RecordingLauncher):
    """A recording launcher that answers the host's occupancy question (``launch_occupancy``) as
    ``gpu`` would: its resident blocks by the occupancy calculator's rule from the machine code of
    its architecture (``profiles``), and its SMs; None for an instantiation the model declines.
    With ``builds`` (``builds_on`` the GPU's architecture) it answers the host's question of a
    build's local memory (``local_bytes``) too: the bytes ptxas spilled there; None without."""

    def __init__(self, gpu: device_model.GPU, profiles: dict[str, device_model.SassProfile],
                 builds: Optional[dict] = None):
        super().__init__()
        self.gpu, self.profiles, self.builds = gpu, profiles, builds or {}

    def local_bytes(self, source, kernel, dtype, specialisation, device):
        from oplib.kernels.cuda_source import name_expression

        build = self.builds.get(name_expression(kernel, dtype, specialisation))
        return None if build is None else build.spill_stores + build.spill_loads

    def occupancy(self, source, kernel, dtype, specialisation, device, threads, shared_bytes):
        from oplib.kernels.cuda_source import name_expression

        profile = self.profiles.get(name_expression(kernel, dtype, specialisation))
        if profile is None:
            return None
        return (device_model.resident_blocks(profile.registers, threads, shared_bytes + profile.shared_bytes, self.gpu),
                self.gpu.sms)


def architecture_entries() -> list[dict]:
    """Each tile choice of each ``TILE_CHOICES`` kernel at every (shape, dtype, layout) of the
    measured table it serves and at the cases no draw has timed (``unmeasured_cases``), recorded
    on CPU tensors, and on each GPU of ``ARCH_GPUS`` its launch's model inputs from the machine
    code NVRTC compiles for that GPU (``events`` None where the model declines the instantiation
    there) and whether the host takes it there (its choice with the GPU's occupancy,
    ``_GpuRecorder``). The unmeasured cases' instantiations compile in modules of their own, as
    in ``model_rows``."""
    _, rows = measured_rows()
    cases = list(dict.fromkeys((r["shape"], r["dtype"], r["layout"]) for r in rows))
    new_cases = unmeasured_cases(rows)
    recorded = []
    for case in (*cases, *new_cases):
        for kernel, function in TILE_CHOICES.items():
            if _fused_launch(case, function) is None:
                continue
            for runs_w in involution_cuda.GENERATED_STAGED_RUNS_W:
                launch = _fused_launch(case, function, runs_w)
                if launch is not None:
                    recorded.append((case, kernel, runs_w, launch, device_model.kernel_work(launch)))
    measured = [e for case, *_, e, _ in recorded if case not in new_cases]
    unmeasured = [e for case, *_, e, _ in recorded if case in new_cases]
    entries = []
    for gpu in ARCH_GPUS:
        # (an instantiation of both sets keeps the measured rows' module)
        profiles = {**_source_profiles(unmeasured, gpu.arch, _profiles),
                    **_source_profiles(measured, gpu.arch, _profiles)}
        hosts = {(case, kernel): _fused_launch(case, TILE_CHOICES[kernel], recording=_GpuRecorder(gpu, profiles))
                 for case, kernel in dict.fromkeys((case, kernel) for case, kernel, *_ in recorded)}
        for case, kernel, runs_w, launch, work in recorded:
            shape, dtype, layout = case
            profile = profiles.get(launch.name)
            events = None if profile is None else [LaunchInputs(
                launch.name, launch.blocks, launch.threads_per_block, launch.shared_bytes + profile.shared_bytes,
                profile.registers, profile.loads_in_flight, profile.widest_load, work, profile.instruction_ratio)]
            entries.append({"shape": shape, "dtype": dtype, "layout": layout, "kernel": kernel, "runs_w": runs_w,
                            "host": launch == hosts[case, kernel], "gpu": gpu.name, "arch": gpu.arch,
                            "events": None if events is None else events_to_json(events)})
    return entries


def _choice_cells(entries: list[dict], constants: Constants, bandwidth: float, choice: str,
                  choices: tuple, what: str) -> tuple[list[list[str]], str, str]:
    """The per-architecture table of one host choice (``choice``, the entries' key of the choice
    each launch takes: one of ``choices``): per (shape, dtype, layout, kernel) and GPU, each
    choice's time with the constants fitted on the H200 and the H200's copy bandwidth scaled by
    the GPU's datasheet bandwidth, the host's choice in bold, and the host's over the model's
    best; the summary per GPU (the host's ``what`` the model's fastest at how many rows) and
    the kernels not modelled where."""
    gpus = {gpu.name: gpu for gpu in ARCH_GPUS}
    rows: dict[tuple, dict] = {}
    hosts: dict[tuple, dict] = {}
    for entry in entries:
        key = (entry["shape"], entry["dtype"], entry["layout"], entry["kernel"])
        gpu = gpus[entry["gpu"]]
        seconds = None if entry["events"] is None else device_model.predict(
            events_from_json(entry["events"]), gpu, constants, bandwidth * gpu.dram_bytes_per_s / H200.dram_bytes_per_s)
        rows.setdefault(key, {}).setdefault(gpu.name, {})[entry[choice]] = seconds
        if entry["host"]:
            hosts.setdefault(key, {})[gpu.name] = entry[choice]
    cells, ratios, declined = [], {name: [] for name in gpus}, {}
    for (shape, dtype, layout, kernel), row in rows.items():
        chosen = hosts[shape, dtype, layout, kernel]
        line = [shape, dtype, layout, kernel, " / ".join(str(r) for r in dict.fromkeys(chosen.values()))]
        for name in gpus:
            times, host = row.get(name, {}), chosen[name]
            if any(times.get(r) is None for r in times) or host not in times:
                declined.setdefault(gpus[name].arch, set()).add(f"{kernel}, {dtype}")
                line.append("-")
                continue
            best = min(times.values())
            ratios[name].append((times[host] / best, f"{shape} {dtype} {layout}, {kernel}"))
            shown = [f"**{times[r] * 1e6:.1f}**" if r == host else f"{times[r] * 1e6:.1f}" for r in choices if r in times]
            line.append(f"{' / '.join(shown)} ({times[host] / best:.2f}x)")
        cells.append(line)
    summary = []
    for name, found in ratios.items():
        if not found:
            summary.append(f"{name}: no row modelled")
            continue
        worst = max(found)
        summary.append(f"{name} ({gpus[name].arch}): the host's {what} the model's fastest at "
                       f"{sum(r <= 1.005 for r, _ in found)} of {len(found)} rows"
                       + ("" if worst[0] <= 1.005 else f", at most {worst[0]:.2f}x its time ({worst[1]})"))
    unmodelled = "; ".join(f"{arch}: {', '.join(sorted(names))}" for arch, names in sorted(declined.items()))
    return cells, "; ".join(summary), unmodelled


def architecture_lines(entries: list[dict], constants: Constants, bandwidth: float) -> list[str]:
    """``architecture_entries``' predictions: the staged kernels' tiles (``_choice_cells``)."""
    gpus = [gpu.name for gpu in ARCH_GPUS]
    runs = involution_cuda.GENERATED_STAGED_RUNS_W
    cells, summary, unmodelled = _choice_cells(entries, constants, bandwidth, "runs_w", runs, "tiles")
    return [
        "## Predicted per architecture: the staged kernels' tiles",
        "",
        "The staged kernels (generated_mma.cu) take their tiles of output (forward) or input (grad_input) pixels in "
        f"one of {len(runs)} shapes, runs_w = {' / '.join(map(str, runs))} runs of a warp along a row "
        "(`GENERATED_STAGED_RUNS_W`), which the host chooses by how the tiles fill the map (the forward: by the "
        "pixels of the warps the map reaches, and first by its time estimated from the GPU's occupancy, which the "
        "driver gives it on a GPU and the model here, the warps' sums and the weights formed at every pixel of "
        "the tiles: `_staged_estimate`, the column \"host's runs_w\" the choices "
        "on the five GPUs). The tiles do not change the bits. Each choice at each row the kernel "
        "serves, predicted on five GPUs: its machine code compiled by NVRTC for the GPU's architecture (registers, "
        "and the blocks an SM its launch bounds ask there), its occupancy from the GPU's shared memory and limits, "
        "the constants fitted on the H200 above and its copy bandwidth scaled by the GPU's datasheet bandwidth "
        "(`oplib.testing.device_model.GPUS`: only the H200 was ever measured, so the other four columns are "
        "extrapolations). Each cell: the times of runs_w "
        f"{' / '.join(map(str, runs))} in us, the host's choice in bold, and its time over the fastest. "
        + summary + ". "
        + (f"Not modelled (their machine code calls outside the source's cold blocks, which the model does not "
           f"count): {unmodelled}." if unmodelled else ""),
        "",
        *_harness.table(["shape", "dtype", "layout", "kernel", "host's runs_w", *gpus], "lllllrrrrr", cells),
    ]


# involution_last.cu's kernels whose lanes take one or two pixels of a row (``last_pixels``):
# the row name of their pairs -> the kernel table's call.
PIXEL_CHOICES = {LAST_FORWARD: "forward", LAST_GRAD_WEIGHT: "grad_weight"}
LANE_PIXELS = (2, 1)


def pixel_entries() -> list[dict]:
    """involution_last.cu's forward and grad_weight with two pixels a lane and with one
    (``LAST_PAIRS``, ``LAST_ONE_PIXEL``) at every channels_last (shape, dtype) of the measured
    table and at the cases no draw has timed, recorded on CPU tensors, and on each GPU of
    ``ARCH_GPUS`` each launch's model inputs from the machine code NVRTC compiles for that GPU
    (one module a source, every launch's instantiations) and whether the host takes it there
    (``last_pixels`` with the GPU's occupancy, ``_GpuRecorder``, under ``LAST``)."""
    _, rows = measured_rows()
    cases = [case for case in dict.fromkeys((r["shape"], r["dtype"], r["layout"]) for r in rows)]
    cases += unmeasured_cases(rows)
    recorded, served = [], {}  # served: (case, kernel) -> the call's (op, arguments)
    for case in (c for c in cases if c[2] == "channels_last"):
        case_calls = calls(table_shape(case[0]), getattr(torch, case[1]), case[2])
        for kernel, call in PIXEL_CHOICES.items():
            qualname, args = case_calls[call]
            for pixels, policy in zip(LANE_PIXELS, (involution_cuda.LAST_PAIRS, involution_cuda.LAST_ONE_PIXEL)):
                launches = [e for e in device_model.record_launches(qualname, *args, policy=policy)
                            if isinstance(e, Launch)]
                if launches[0].source == involution_cuda.LAST_SOURCE:
                    recorded.append((case, kernel, pixels, launches[0], device_model.kernel_work(launches[0])))
                    served[case, kernel] = case_calls[call]
    entries = []
    for gpu in ARCH_GPUS:
        profiles = _source_profiles([e for *_, e, _ in recorded], gpu.arch, _profiles)
        hosts = {key: next(e for e in device_model.record_launches(
                     qualname, *args, policy=involution_cuda.LAST, launcher=_GpuRecorder(gpu, profiles))
                     if isinstance(e, Launch))
                 for key, (qualname, args) in served.items()}
        for case, kernel, pixels, launch, work in recorded:
            profile = profiles.get(launch.name)
            events = None if profile is None else [LaunchInputs(
                launch.name, launch.blocks, launch.threads_per_block, launch.shared_bytes + profile.shared_bytes,
                profile.registers, profile.loads_in_flight, profile.widest_load, work, profile.instruction_ratio)]
            entries.append({"shape": case[0], "dtype": case[1], "layout": case[2], "kernel": kernel, "pixels": pixels,
                            "host": launch == hosts[case, kernel], "gpu": gpu.name, "arch": gpu.arch,
                            "events": None if events is None else events_to_json(events)})
    return entries


def pixel_lines(entries: list[dict], constants: Constants, bandwidth: float) -> list[str]:
    """``pixel_entries``' predictions (``_choice_cells``)."""
    gpus = [gpu.name for gpu in ARCH_GPUS]
    cells, summary, unmodelled = _choice_cells(entries, constants, bandwidth, "pixels", LANE_PIXELS, "pixels a lane")
    waves = involution_cuda.load_source(involution_cuda.LAST_SOURCE).constants["LAST_PAIRS_MIN_WAVES"]
    return [
        "## Predicted per architecture: a lane's pixels in involution_last.cu",
        "",
        "involution_last.cu's forward and grad_weight give a lane two adjacent pixels of a row or one "
        "(`PIXELS`): pairs load each input vector of a kernel row once for a tap of each, but halve the grid. The "
        f"host takes one where the grid of pairs is under {waves} wave(s) of the blocks the GPU holds at once (the "
        "driver's occupancy calculator for the pairs' instantiation on a GPU, the model's resident blocks here; "
        "`last_pixels`), pairs elsewhere; the choice does not change the bits. Each choice at each channels_last "
        "row the kernels serve (the stem's too), predicted on five GPUs as the staged kernels' tiles below: "
        "machine code compiled by NVRTC for each architecture (the launches' instantiations in one module a "
        "source), the constants fitted on the H200 and its copy bandwidth scaled by the GPU's datasheet bandwidth "
        "(extrapolations but for the H200). Each cell: the times with 2 / 1 pixels a lane in us, the host's "
        "choice in bold, and its time over the fastest. " + summary + ". The instruction ratio (all of a kernel's "
        "instructions over those a trace counts) is read from the machine code with one trip count for every "
        "loop, so it moves with how ptxas unrolls and nests the loops on each architecture: the pairs' grad_weight "
        "has about as many instructions on sm_100 as on sm_90 (in its code, counted once each) but twice the "
        "ratio, so the B200's pairs grad_weight is likely overpredicted. "
        + (f"Not modelled (their machine code calls outside the source's cold blocks, which the model does not "
           f"count): {unmodelled}." if unmodelled else ""),
        "",
        *_harness.table(["shape", "dtype", "layout", "kernel", "host's pixels", *gpus], "lllllrrrrr", cells),
    ]


def sections(rows: list[dict], model: dict, table: list[dict], bandwidth: float) -> list[str]:
    """The page's sections after ``report``'s table, from the model's constants, instructions,
    changed and candidate rows (``model``, as the json keeps them) and the measured ``table``."""
    constants = Constants(**model["constants"])
    candidates = model["candidates"]
    totals = layer_totals(candidates, model["changed"], rows, table, constants, bandwidth)
    return [*tiled_lines(rows, constants, bandwidth), "", *instruction_lines(model["instructions"]), "",
            *changed_lines(model["changed"], rows, constants, bandwidth), "",
            *vectors_lines(rows, table, constants, bandwidth), "",
            *candidate_lines(candidates, rows, table, constants, bandwidth, model.get("pixels", [])), "",
            *generator_lines(candidates, rows, constants, bandwidth), "",
            *staged_lines(candidates, rows, constants, bandwidth), "",
            *staged_forward_lines(candidates, rows, table, constants, bandwidth), "",
            *dense_forward_lines(candidates, rows, table, constants, bandwidth), "",
            *dense_grad_input_lines(candidates, rows, constants, bandwidth), "",
            *dense_weight_lines(candidates, rows, constants, bandwidth), "",
            *unmeasured_lines(model.get("unmeasured", []), constants, bandwidth), "",
            *layer_lines(totals), "", *network_lines(totals, *rednet50_involutions(), models_rows()), "",
            *mma_lines(rows, table, constants, bandwidth), "",
            *architecture_lines(model.get("architectures", []), constants, bandwidth), "",
            *pixel_lines(model.get("pixels", []), constants, bandwidth)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--output", type=Path, default=RESULTS / "cuda-model.md", help="markdown file")
    parser.add_argument("--derive-measured", action="store_true",
                        help="derive the measured rows' model inputs from the current kernels (right after a draw "
                             "timed them); by default they are the committed json's, derived from the kernels the "
                             "draw timed, and the current kernels are predicted beside them")
    args = parser.parse_args()
    settings = _harness.Settings(script="cuda_model", quick=False, threads=torch.get_num_threads(), rounds=0,
                                 min_run_time=0.0, output=args.output)
    data_path = args.output.with_suffix(".json")
    bandwidth, table = measured_rows()
    current, candidates, unmeasured = model_rows(batch=32)
    committed = json.loads(data_path.read_text())["model"] if data_path.exists() else None
    if args.derive_measured or committed is None:
        rows = current
    else:
        rows = [{**row, "events": events_from_json(row["events"])} for row in committed["rows"]]
        if [_key(r) for r in rows] != [_key(r) for r in current]:
            raise SystemExit("the committed rows are not the measured table's: run with --derive-measured")
    lines, model = report(rows, bandwidth, h100_measured())
    model["instructions"] = ncu_instructions(rows)
    model["changed"] = changed_rows(rows, current)
    mark_h200_wide(candidates)
    model["candidates"] = [{**entry, "events": events_to_json(entry["events"])} for entry in candidates]
    model["unmeasured"] = [{**entry, "events": events_to_json(entry["events"])} for entry in unmeasured]
    model["architectures"] = architecture_entries()
    model["pixels"] = pixel_entries()
    _harness.write_report(settings, [*lines, "", *sections(rows, model, table, bandwidth)])
    data = json.loads(data_path.read_text())
    data["model"] = model
    data_path.write_text(json.dumps(data, indent=1) + "\n")


if __name__ == "__main__":
    main()
