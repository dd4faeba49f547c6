#!/usr/bin/env python
"""``make gpu-check``: everything a GPU lease is for, in one command, most valuable first, each
stage in a process of its own under a time budget, each writing its table as soon as it ends.

    python tools/gpu_check.py                        # on a GPU: the tables into bench/results/
    python tools/gpu_check.py --out DIR --archive $OUT/gpu-check.tar.gz   # on a lent device
    python tools/gpu_check.py --dry                  # here, on the CPU: every stage, tiny, into a temporary folder
    python tools/gpu_check.py --stages models,ncu    # some stages only (the last gets the time left)

The stages, in order, with their budgets on an H100 or H200 (``STAGES``; 8 minutes in all):

- ``load``: every CUDA kernel loaded (``oplib.kernels.load()``) and timed; from the cubins of
  ``OPLIB_CUDA_PREBUILT`` (``make gpu-prebuild``) where they match, else compiled by NVRTC;
- ``tests``: every ``needs_cuda`` test (pytest-xdist, a worker per core up to 14);
- ``kernels``, ``layer``, ``launch``: the CUDA tables of ``bench/involution.py --cuda-only``
  (bench/_cuda.py), one ``--cuda-stage`` each;
- ``ncu``: Nsight Compute on each oplib kernel at one shape: DRAM throughput, achieved
  occupancy, the top warp stall reasons;
- ``memcheck``: every op with kernels of its own under compute-sanitizer's memcheck
  (tools/cuda_sanitize.py);
- ``tuning``: RedNet-50 with oplib's kernels tuned on the GPU (each op's candidate kernels timed
  at each of its call signatures, the fastest kept), unfused and fused, beside its default
  kernels and ResNet-50; and what tuning chose at each signature (the next defaults);
- ``models``: RedNet-50 against ResNet-50, eager and compiled (its rows most wanted first; the
  compiled ones take minutes each, so it gets the time left), and each row's steps under
  torch.profiler: where a step's time goes.

A stage stops at its budget plus what the stages before it left unused; a stage stopped there
keeps the rows it wrote. After each stage the summary (``gpu-check.md`` and ``.json``: each
stage's status, wall time, budget and result, with the load, test and memcheck details) is
rewritten, and with ``--archive`` every file this run wrote (tables, summary, ``logs/``) is
packed again into one tar.gz: a lease that ends mid-run still brings back what was done, in
one file (a lent device returns at most 8).

``--dry`` runs every stage end to end on the CPU with tiny sizes (bench/_cuda.py's ``DRY``):
CPU tensors, the CUDA kernels emulated on the host, perf_counter in place of CUDA events; the
tests run and skip; compute-sanitizer and ncu are replaced by building their command lines and
parsing the recorded outputs in ``tests/project/gpu_check_fixtures/``. A typo in any stage
shows here, not on the lease.
"""

from __future__ import annotations

import argparse
import csv
import datetime
import importlib.util
import io
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
import xml.etree.ElementTree as ElementTree
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
FIXTURES = ROOT / "tests" / "project" / "gpu_check_fixtures"
SUMMARY = "gpu-check.md"


@dataclass(frozen=True)
class Stage:
    name: str
    what: str
    budget: float  # seconds on an H100 or H200
    dry_budget: float  # seconds for --dry on a 2-core CPU
    files: tuple[str, ...] = ()  # the tables it writes (a .md with its .json beside it)


STAGES = (
    # --dry's load builds the host emulation of every source: 145 s from a cold cache here with
    # the other core busy (a fresh machine's run, or a test run that starts with it), 120 s of
    # budget was enough only where earlier tests had filled the cache.
    Stage("load", "every CUDA kernel loaded before anything, timed", 20, 360),
    Stage("tests", "every needs_cuda test", 145, 300),
    Stage("kernels", "each kernel's device time against its DRAM floor", 65, 300, ("involution-cuda.md",)),
    Stage("layer", "Involution2d fused and unfused against a depthwise Conv2d", 70, 180,
          ("involution-cuda-layer.md",)),
    Stage("launch", "the host's time per call at a tiny shape against a bare custom op, and per training step", 30, 120,
          ("involution-cuda-launch.md",)),
    Stage("ncu", "Nsight Compute: DRAM throughput, occupancy, warp stalls of each kernel", 30, 180,
          ("involution-cuda-ncu.md",)),
    Stage("memcheck", "compute-sanitizer memcheck of every op with kernels of its own", 25, 180),
    Stage("tuning", "RedNet-50 with its kernels tuned, beside its default kernels and ResNet-50", 40, 300,
          ("involution-cuda-tuning.md",)),
    Stage("models", "RedNet-50 against ResNet-50, eager and compiled", 50, 600, ("involution-cuda-models.md",)),
)  # fmt: skip
BY_NAME = {stage.name: stage for stage in STAGES}


@dataclass
class Outcome:
    """How a stage ended: ``status`` ok / failed / timed out / skipped / not run, its ``result``
    in a few words, and what the summary shows of it (``details``: markdown lines)."""

    status: str
    result: str = ""
    seconds: float = 0.0
    details: list[str] = field(default_factory=list)
    data: dict[str, Any] = field(default_factory=dict)


@dataclass
class Context:
    """One run: where it writes, dry or not, with which Python and environment, and until when
    the current stage may run."""

    out: Path
    logs: Path
    dry: bool
    python: str
    env: dict[str, str]
    deadline: float = 0.0  # the current stage's, time.monotonic()

    def left(self) -> float:
        return self.deadline - time.monotonic()


# ---------------------------------------------------------------------------------------
# Running a command under the stage's deadline
# ---------------------------------------------------------------------------------------


class TimedOut(Exception):
    pass


def run_command(ctx: Context, command: Sequence[str], log: Path, stdout: Optional[Path] = None) -> int:
    """Run ``command`` from the repository's root until the stage's deadline, its output
    streamed to our stdout and appended to ``log`` (or, its stdout alone, written to
    ``stdout``). The command runs in a process group of its own, killed whole at the deadline
    (``TimedOut``). Returns its exit status."""
    print(f"$ {' '.join(command)}", flush=True)
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "a") as log_file:
        log_file.write(f"$ {' '.join(command)}\n")
        log_file.flush()
        target = open(stdout, "w") if stdout is not None else None
        try:
            process = subprocess.Popen(command, cwd=ROOT, env=ctx.env, stdout=subprocess.PIPE,
                                       stderr=log_file if target is not None else subprocess.STDOUT,
                                       text=True, preexec_fn=os.setpgrp)

            def pump() -> None:
                for line in process.stdout:
                    (target or log_file).write(line)
                    if target is None:
                        sys.stdout.write(line)
                        sys.stdout.flush()

            reader = threading.Thread(target=pump, daemon=True)
            reader.start()
            try:
                process.wait(timeout=max(ctx.left(), 0.1))
            except subprocess.TimeoutExpired:
                _kill(process)
                reader.join(5)
                raise TimedOut from None
            reader.join(30)
            return process.returncode
        finally:
            if target is not None:
                target.close()


def _kill(process: subprocess.Popen) -> None:
    """SIGTERM to the command's whole process group, SIGKILL ten seconds later."""
    for sig, grace in ((signal.SIGTERM, 10), (signal.SIGKILL, 5)):
        try:
            os.killpg(process.pid, sig)
        except ProcessLookupError:
            return
        try:
            process.wait(timeout=grace)
            return
        except subprocess.TimeoutExpired:
            continue


# ---------------------------------------------------------------------------------------
# The stages
# ---------------------------------------------------------------------------------------


def _body(ctx: Context, name: str) -> list[str]:
    """This script running one of its in-process bodies (``--body``) in a child."""
    return [ctx.python, str(Path(__file__).resolve()), "--body", name, "--out", str(ctx.out), "--logs", str(ctx.logs),
            *(["--dry"] if ctx.dry else [])]


def stage_load(ctx: Context) -> Outcome:
    status = run_command(ctx, _body(ctx, "load"), ctx.logs / "load.log")
    loaded = json.loads((ctx.logs / "load.json").read_text()) if (ctx.logs / "load.json").exists() else {}
    if status != 0 or not loaded:
        return Outcome("failed", f"exit {status}")
    sources = loaded["sources"]
    prebuilt = sum(s["prebuilt"] for s in sources)
    way = ("built for the host emulation" if ctx.dry else
           f"{prebuilt} of {len(sources)} sources from prebuilt cubins ({loaded['arch']})")
    result = (f"{len(sources)} sources, {sum(s['instantiations'] for s in sources)} instantiations, {way}, "
              f"in {loaded['seconds']:.1f} s")
    details = [
        "## Kernels loaded",
        "",
        f"`{loaded['call']}` in {loaded['seconds']:.2f} s; `OPLIB_CUDA_PREBUILT`: "
        f"{loaded['prebuilt_dir'] or 'not set'}; GPU architecture {loaded['arch']}.",
        "",
        "| source | instantiations | prebuilt cubin | why not |",
        "|---|---:|---|---|",
        *[f"| {s['source']} | {s['instantiations']} | {'yes' if s['prebuilt'] else 'no'} | {s['reason'] or '-'} |"
          for s in sources],
        "",
        *[f"- warning: {w}" for w in loaded["warnings"]],
    ]
    return Outcome("ok", result, details=details, data=loaded)


def _plugin_installed() -> bool:
    """Whether oplib's pytest11 entry point is installed for this Python."""
    from importlib.metadata import entry_points

    return any(point.value == "oplib.testing.plugin" for point in entry_points(group="pytest11"))


def stage_tests(ctx: Context) -> Outcome:
    junit, log = ctx.logs / "needs-cuda.xml", ctx.logs / "tests.log"
    # -v: a line per test as it ends, so that a run stopped at its deadline still counts
    command = [ctx.python, "-m", "pytest", "-m", "needs_cuda", "-p", "no:cacheprovider", "-v", "-rfE",
               f"--junitxml={junit}"]
    if not _plugin_installed():
        # A lent machine's image may not have taken `pip install -e .` (no network for its build
        # backend): the checkout is on PYTHONPATH, so the plugin is named instead of found.
        command += ["-p", "oplib.testing.plugin"]
    if importlib.util.find_spec("xdist") is not None:
        command += ["-n", str(2 if ctx.dry else min(14, os.cpu_count() or 1))]
    command += [folder for folder in ("tests", "compile_tests", "examples") if (ROOT / folder).is_dir()]
    try:
        status, timed_out = run_command(ctx, command, log), False
    except TimedOut:
        status, timed_out = None, True
    if junit.exists() and not timed_out:
        counts, source = parse_junit(junit.read_text()), "the JUnit report"
    elif log.exists():
        counts, source = parse_pytest_progress(log.read_text()), "pytest's progress lines (no JUnit report)"
    else:
        return Outcome("failed", f"exit {status}, no report")
    result = ", ".join(f"{counts[k]} {k}" for k in ("passed", "failed", "errors", "skipped"))
    stopped = " **stopped at its deadline**: the tests that finished" if timed_out else ""
    details = ["## needs_cuda tests", "", f"`python {' '.join(command[1:])}`{stopped}: {result} (from {source}).", ""]
    if counts["failures"]:
        details += ["| test | message |", "|---|---|"]
        details += [f"| `{name}` | {message} |" for name, message in counts["failures"][:40]]
        details.append("")
    if timed_out:
        return Outcome("timed out", result, details=details, data=counts)
    ok = status == 0 and not counts["failed"] and not counts["errors"]
    return Outcome("ok" if ok else "failed", result, details=details, data=counts)


_PROGRESS = re.compile(r"^(?:\[gw\d+\] \[\s*\d+%\] (?P<a>PASSED|FAILED|SKIPPED|ERROR|XFAIL|XPASS) (?P<b>\S+)"
                       r"|(?P<c>\S+::\S+) (?P<d>PASSED|FAILED|SKIPPED|ERROR|XFAIL|XPASS)\b)", re.MULTILINE)


def parse_pytest_progress(text: str) -> dict[str, Any]:
    """The counts of ``pytest -v``'s progress lines (with or without xdist): what finished
    before a run was stopped."""
    counts: dict[str, Any] = {"passed": 0, "failed": 0, "errors": 0, "skipped": 0, "seconds": 0.0, "failures": []}
    kinds = {"PASSED": "passed", "XFAIL": "passed", "XPASS": "passed", "FAILED": "failed", "ERROR": "errors",
             "SKIPPED": "skipped"}
    for match in _PROGRESS.finditer(text):
        outcome, name = (match["a"], match["b"]) if match["a"] else (match["d"], match["c"])
        counts[kinds[outcome]] += 1
        if outcome in ("FAILED", "ERROR"):
            counts["failures"].append((name, outcome.lower()))
    return counts


def parse_junit(text: str) -> dict[str, Any]:
    """Counts of a JUnit XML report (pytest's --junitxml) and each failure's test and first line."""
    root = ElementTree.fromstring(text)
    counts: dict[str, Any] = {"passed": 0, "failed": 0, "errors": 0, "skipped": 0, "seconds": 0.0, "failures": []}
    for suite in root.iter("testsuite"):
        counts["seconds"] += float(suite.get("time", 0))
    for case in root.iter("testcase"):
        outcome = next((child for child in case if child.tag in ("failure", "error", "skipped")), None)
        kind = {"failure": "failed", "error": "errors", "skipped": "skipped"}.get(getattr(outcome, "tag", ""), "passed")
        counts[kind] += 1
        if kind in ("failed", "errors"):
            message = (outcome.get("message") or outcome.text or "").strip().splitlines()
            name = f"{case.get('classname', '')}::{case.get('name', '')}"
            counts["failures"].append((name, (message[0] if message else "")[:200].replace("|", "\\|")))
    return counts


def _check_command(command: Sequence[str], tool: str, tail: Sequence[str]) -> None:
    """A dry run's check of a command it cannot run: the tool first, every argument a string,
    ``tail`` (the profiled program) last, and every path it names to a script present."""
    if command[0] != tool or not all(isinstance(a, str) and a for a in command) or list(command[len(command) - len(tail):]) != list(tail):
        raise ValueError(f"malformed {tool} command: {command}")
    missing = [a for a in command if a.endswith(".py") and not Path(a).exists()]
    if missing:
        raise ValueError(f"{tool} command names missing scripts: {missing}")


def memcheck_command(python: str) -> list[str]:
    return ["compute-sanitizer", "--tool", "memcheck", "--error-exitcode", "9", "--print-limit", "20", python,
            str(ROOT / "tools" / "cuda_sanitize.py")]


_SANITIZER_SUMMARY = re.compile(r"^========= ERROR SUMMARY: (\d+) errors?", re.MULTILINE)
_SANITIZER_ERROR = re.compile(r"^========= (Invalid .*|Program hit .*|Out-of-range .*|Misaligned .*|Malloc/Free error.*)$",
                              re.MULTILINE)
_SANITIZER_WHERE = re.compile(r"^=========\s+at (.*)$", re.MULTILINE)


def parse_memcheck(text: str) -> dict[str, Any]:
    """compute-sanitizer's report: the error count of its summary (None without one: it did not
    finish), the calls tools/cuda_sanitize.py made, and the first errors with where they were."""
    summary = _SANITIZER_SUMMARY.search(text)
    calls = re.search(r"^(\d+) calls, forward and backward", text, re.MULTILINE)
    errors = []
    for match in _SANITIZER_ERROR.finditer(text):
        where = _SANITIZER_WHERE.search(text, match.end())
        kernel = _function_name(re.sub(r"\+0x[0-9a-f]+$", "", where.group(1).strip())) if where else "?"
        errors.append(f"{match.group(1)} in `{kernel}`")
    return {"errors": int(summary.group(1)) if summary else None, "calls": int(calls.group(1)) if calls else None,
            "first_errors": errors[:10]}


def stage_memcheck(ctx: Context) -> Outcome:
    log = ctx.logs / "memcheck.log"
    command = memcheck_command(ctx.python)
    if ctx.dry:
        # The calls themselves run on the CPU; compute-sanitizer's part is its command line and the parser.
        status = run_command(ctx, [ctx.python, str(ROOT / "tools" / "cuda_sanitize.py"), "--device", "cpu"], log)
        if status != 0:
            return Outcome("failed", f"tools/cuda_sanitize.py --device cpu: exit {status}")
        _check_command(command, "compute-sanitizer", command[-1:])
        text = (FIXTURES / "compute-sanitizer-memcheck.txt").read_text()
        source = "the recorded sample `tests/project/gpu_check_fixtures/compute-sanitizer-memcheck.txt` (dry run)"
    else:
        if shutil.which("compute-sanitizer") is None:
            return Outcome("skipped", "compute-sanitizer is not on the PATH")
        status = run_command(ctx, command, log)
        text, source = log.read_text(), f"`{' '.join(command[:-2])} python tools/cuda_sanitize.py`"
    report = parse_memcheck(text)
    result = f"{report['calls']} calls, {'no summary' if report['errors'] is None else report['errors']} errors"
    details = ["## compute-sanitizer memcheck", "", f"From {source}: {result}.", "",
               *[f"- {error}" for error in report["first_errors"]], ""]
    ok = report["errors"] == 0 and (ctx.dry or status == 0)
    return Outcome("ok" if ok else "failed", result, details=details, data=report)


def _bench_stage(name: str) -> Callable[[Context], Outcome]:
    """A CUDA stage of bench/involution.py, alone, its table into --out."""

    def run(ctx: Context) -> Outcome:
        output = ctx.out / BY_NAME[name].files[0]
        command = [ctx.python, str(ROOT / "bench" / "involution.py"), "--cuda-only", "--cuda-stage", name,
                   "--output", str(output), *(["--dry", "--threads", "1"] if ctx.dry else [])]
        status = run_command(ctx, command, ctx.logs / f"{name}.log")
        rows = _table_rows(output.with_suffix(".json"))
        return Outcome("ok" if status == 0 else "failed", f"{rows} table rows" + ("" if status == 0 else f", exit {status}"))

    return run


def _table_rows(data: Path) -> int:
    """Rows of the tables a report's JSON holds (bench/_harness.write_report)."""
    if not data.exists():
        return 0
    return sum(len(table["rows"]) for table in json.loads(data.read_text())["tables"])


# Nsight Compute: what it collects per kernel, and how its CSV names what the table shows.
NCU_SECTIONS = ("SpeedOfLight", "Occupancy", "LaunchStats", "WarpStateStats")
NCU_METRICS = (
    "gpu__time_duration.sum", "dram__throughput.avg.pct_of_peak_sustained_elapsed",
    "sm__warps_active.avg.pct_of_peak_sustained_active", "sm__maximum_warps_per_active_cycle_pct",
    "launch__registers_per_thread", r"regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio",
)  # fmt: skip
_STALL = re.compile(r"^smsp__average_warps_issue_stalled_(\w+?)_per_issue_active\.ratio$")


def ncu_commands(python: str, report: Path, profiled: Sequence[str]) -> tuple[list[str], list[str]]:
    """ncu profiling ``profiled`` (a command) into ``report`` (.ncu-rep), every kernel whose
    name holds "involution"; then ncu reading it back as CSV, one row per kernel, a column per metric."""
    profile = ["ncu", "--target-processes", "all", "--kernel-name", "regex:involution"]
    for section in NCU_SECTIONS:
        profile += ["--section", section]
    profile += ["--metrics", ",".join(NCU_METRICS), "--export", str(report.with_suffix("")), "--force-overwrite",
                *profiled]
    return profile, ["ncu", "--import", str(report), "--page", "raw", "--csv"]


def _number(text: str) -> Optional[float]:
    try:
        return float(text.replace(",", ""))
    except ValueError:
        return None


def _function_name(demangled: str) -> str:
    """``void f<float, (int)7>(const T1 *, int)`` -> ``f<float, (int)7>``: the parameter list is
    the last bracketed group (template arguments may hold brackets of their own)."""
    name, depth = demangled.strip(), 0
    if name.endswith(")"):
        for i in range(len(name) - 1, -1, -1):
            depth += {")": 1, "(": -1}.get(name[i], 0)
            if depth == 0:
                name = name[:i]
                break
    return name.removeprefix("void ").strip()


def parse_ncu_raw(text: str) -> list[dict[str, Any]]:
    """ncu's raw page as CSV (``--page raw --csv``): a header of metric names, a row of units,
    then a row per profiled kernel. Returns per kernel its name (the function, template
    arguments kept, parameters dropped), grid and block, and the table's metrics: duration (us),
    DRAM throughput and achieved and theoretical occupancy (% of peak), registers, and every
    warp stall reason (cycles per issued instruction)."""
    lines = text.splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith('"ID"')), None)
    if start is None:
        raise ValueError("no ncu CSV header (a line starting with \"ID\") in the output")
    rows = list(csv.reader(io.StringIO("\n".join(lines[start:]))))
    header, body = rows[0], rows[1:]
    units = body.pop(0) if body and not body[0][0] else [""] * len(header)
    kernels = []
    for row in body:
        if len(row) != len(header):
            continue
        cells, unit = dict(zip(header, row)), dict(zip(header, units))
        duration = _number(cells.get("gpu__time_duration.sum", ""))
        scale = {"nsecond": 1e-3, "ns": 1e-3, "usecond": 1.0, "us": 1.0, "msecond": 1e3, "ms": 1e3}
        dram = next((_number(cells[k]) for k in ("dram__throughput.avg.pct_of_peak_sustained_elapsed",
                                                  "gpu__dram_throughput.avg.pct_of_peak_sustained_elapsed") if k in cells), None)
        stalls = {m.group(1): value for name, text in cells.items()
                  if (m := _STALL.match(name)) and m.group(1) != "selected" and (value := _number(text)) is not None}
        kernels.append({
            "id": cells["ID"], "kernel": _function_name(cells["Kernel Name"]),
            "grid": cells.get("Grid Size", ""), "block": cells.get("Block Size", ""),
            "duration_us": None if duration is None else duration * scale.get(unit.get("gpu__time_duration.sum", ""), 1e-3),
            "dram_pct": dram,
            "achieved_occupancy_pct": _number(cells.get("sm__warps_active.avg.pct_of_peak_sustained_active", "")),
            "theoretical_occupancy_pct": _number(cells.get("sm__maximum_warps_per_active_cycle_pct", "")),
            "registers": _number(cells.get("launch__registers_per_thread", "")),
            "stalls": dict(sorted(stalls.items(), key=lambda item: -item[1])),
        })  # fmt: skip
    return kernels


def ncu_table(kernels: list[dict[str, Any]], calls: Sequence[str]) -> list[str]:
    """The markdown table: a row per profiled kernel, the call that launched it where each call
    launched one (as many kernels as calls), its metrics and its three top stall reasons."""
    def cell(value: Optional[float], digits: int = 1) -> str:
        return "-" if value is None else f"{value:.{digits}f}"

    labelled = len(kernels) == len(calls)
    lines = ["| call | kernel | grid | block | duration (us) | DRAM (% of peak) | achieved occupancy (%) | "
             "theoretical occupancy (%) | registers | top stalls (cycles per issued instruction) |",
             "|---|---|---|---|---:|---:|---:|---:|---:|---|"]
    for i, k in enumerate(kernels):
        stalls = ", ".join(f"{name} {value:.1f}" for name, value in list(k["stalls"].items())[:3]) or "-"
        lines.append(f"| {calls[i] if labelled else '-'} | `{k['kernel']}` | {k['grid']} | {k['block']} | "
                     f"{cell(k['duration_us'])} | {cell(k['dram_pct'])} | {cell(k['achieved_occupancy_pct'])} | "
                     f"{cell(k['theoretical_occupancy_pct'])} | {cell(k['registers'], 0)} | {stalls} |")
    return lines


def stage_ncu(ctx: Context) -> Outcome:
    report, csv_path, calls_path = ctx.logs / "ncu.ncu-rep", ctx.logs / "ncu.csv", ctx.logs / "ncu-calls.json"
    profiled = _body(ctx, "ncu-calls")
    profile, read_back = ncu_commands(ctx.python, report, profiled)
    log = ctx.logs / "ncu.log"
    if ctx.dry:
        # The profiled calls run on the CPU; ncu's part is its command lines and the parser.
        status = run_command(ctx, profiled, log)
        _check_command(profile, "ncu", profiled)
        _check_command(read_back, "ncu", [])
        text = (FIXTURES / "ncu-raw.csv").read_text()
        source = "the recorded sample `tests/project/gpu_check_fixtures/ncu-raw.csv` (dry run: not this machine's kernels)"
    else:
        if shutil.which("ncu") is None:
            return Outcome("skipped", "ncu is not on the PATH")
        status = run_command(ctx, profile, log)
        if status != 0:  # a metric name this ncu does not know fails the whole run: the sections alone
            metrics = profile.index("--metrics")
            status = run_command(ctx, profile[:metrics] + profile[metrics + 2:], log)
        if status == 0:
            status = run_command(ctx, read_back, log, stdout=csv_path)
        text, source = (csv_path.read_text() if csv_path.exists() else ""), f"`{' '.join(profile[:-len(profiled)])} ...`"
    if status != 0:
        return Outcome("failed", f"exit {status} (see logs/ncu.log)")
    calls = json.loads(calls_path.read_text())["calls"] if calls_path.exists() else []
    shape = json.loads(calls_path.read_text())["shape"] if calls_path.exists() else "?"
    kernels = parse_ncu_raw(text)
    lines = [
        "# Involution on CUDA: Nsight Compute on each kernel",
        "",
        f"Written by `python tools/gpu_check.py` (stage ncu) on {datetime.date.today()}.",
        "",
        f"- shape: {shape}; each call once, in bfloat16 channels_last then float32 NCHW, after every kernel was "
        "loaded (`oplib.kernels.load()`); generic: the same call on the generic kernels of involution.cu",
        f"- metrics: from {source}; sections {', '.join(NCU_SECTIONS)}; DRAM throughput "
        "`dram__throughput.avg.pct_of_peak_sustained_elapsed`, achieved occupancy "
        "`sm__warps_active.avg.pct_of_peak_sustained_active`, stalls "
        "`smsp__average_warps_issue_stalled_<reason>_per_issue_active.ratio` (the three largest)",
        *([] if len(kernels) == len(calls) else
          [f"- {len(kernels)} kernels profiled for {len(calls)} calls: the call column is left empty"]),
        "",
        *ncu_table(kernels, calls),
    ]
    output = ctx.out / BY_NAME["ncu"].files[0]
    output.write_text("\n".join(lines) + "\n")
    output.with_suffix(".json").write_text(json.dumps({"source": source, "shape": shape, "calls": calls,
                                                       "kernels": kernels}, indent=1) + "\n")
    return Outcome("ok" if kernels else "failed", f"{len(kernels)} kernels profiled")


RUNNERS: dict[str, Callable[[Context], Outcome]] = {
    "load": stage_load, "tests": stage_tests, "memcheck": stage_memcheck, "ncu": stage_ncu,
    **{name: _bench_stage(name) for name in ("kernels", "layer", "launch", "tuning", "models")},
}  # fmt: skip


# ---------------------------------------------------------------------------------------
# The bodies run in a child (--body): the kernels' load, the calls ncu profiles
# ---------------------------------------------------------------------------------------


def body_load(logs: Path, dry: bool, arch: str = "sm_90") -> None:
    """Load every CUDA kernel (dry: build the host emulation of every source), timed; each
    source's prebuilt match; written to ``logs/load.json``."""
    import warnings

    import torch

    from oplib.benchmark import describe_machine
    from oplib.kernels import cuda_prebuilt, load
    from oplib.kernels.cuda_source import cuda_sources, instantiations, load_source

    sources = [load_source(name) for name in cuda_sources()]
    if not dry:
        major, minor = torch.cuda.get_device_capability()
        arch = f"sm_{major}{minor}"
    lookups = [cuda_prebuilt.lookup(source, arch) for source in sources]
    start = time.perf_counter()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        if dry:
            from oplib.testing.cuda_emulation import build

            for source in sources:
                build(source)
        else:
            load()
            torch.cuda.synchronize()
    seconds = time.perf_counter() - start
    loaded = {
        "machine": describe_machine(), "arch": arch, "seconds": seconds,
        "call": "oplib.testing.cuda_emulation.build(source) for every source" if dry else "oplib.kernels.load()",
        "prebuilt_dir": os.environ.get(cuda_prebuilt.ENVIRONMENT),
        "warnings": [str(w.message) for w in caught],
        "sources": [{"source": s.path.name, "instantiations": len(instantiations(s)), "prebuilt": found.cubin is not None,
                     "reason": found.reason} for s, found in zip(sources, lookups)],
    }  # fmt: skip
    (logs / "load.json").write_text(json.dumps(loaded, indent=1) + "\n")
    print(json.dumps(loaded, indent=1), flush=True)


def body_ncu_calls(logs: Path, dry: bool) -> None:
    """Each oplib kernel once at the profiled shape (``bench/_cuda.py``'s ``profiled_calls``),
    after loading every kernel; the calls' labels, in order, to ``logs/ncu-calls.json``."""
    import torch

    sys.path.insert(0, str(ROOT / "bench"))
    import _cuda

    target = _cuda.Target.dry() if dry else _cuda.Target.cuda()
    target.load_kernels()
    shape = _cuda.DRY.shapes[0] if dry else _cuda.NCU_SHAPE
    labels = []
    for dtype_name, layout in _cuda.LAYER_PRECISIONS:
        operands = _cuda.operands_on(shape, getattr(torch, dtype_name), layout, target.device)
        for label, launch in _cuda.profiled_calls(operands, target.launcher).items():
            launch()
            labels.append(f"{label}, {dtype_name} {layout}")
        target.synchronize()
    description = f"{shape.name}, batch {shape.batch}, K = {shape.kernel}, {shape.group_channels} channels per group"
    (logs / "ncu-calls.json").write_text(json.dumps({"shape": description, "calls": labels}, indent=1) + "\n")
    print("\n".join(labels), flush=True)


BODIES = {"load": body_load, "ncu-calls": body_ncu_calls}


# ---------------------------------------------------------------------------------------
# The summary and the archive
# ---------------------------------------------------------------------------------------


def write_summary(ctx: Context, budget: float, outcomes: dict[str, Outcome], selected: Sequence[Stage]) -> Path:
    """gpu-check.md and .json: a row per stage (not run yet: said so), then the details of
    the stages that give them."""
    machine = next((o.data["machine"] for o in outcomes.values() if "machine" in o.data), "see the load stage")
    rows = []
    for stage in selected:
        outcome = outcomes.get(stage.name, Outcome("not run"))
        files = ", ".join(f"`{name}`" for name in stage.files if (ctx.out / name).exists()) or "-"
        budget_cell = stage.dry_budget if ctx.dry else stage.budget
        rows.append(f"| {stage.name} | {stage.what} | {outcome.status} | {outcome.seconds:.0f} | {budget_cell:.0f} | "
                    f"{outcome.result or '-'} | {files} |")
    lines = [
        "# GPU check: every stage, its time and its result",
        "",
        f"Written by `python tools/gpu_check.py{' --dry' if ctx.dry else ''}` on {datetime.date.today()}.",
        "",
        f"- machine: {machine}",
        *(["- **dry run: the CPU, the CUDA kernels emulated, tiny sizes; no GPU figures**"] if ctx.dry else []),
        f"- budget: {budget:.0f} s in all; each stage stops at its own budget plus what the stages before it "
        "left unused (the last at the total); logs of each stage in `logs/`",
        "",
        "| stage | what | status | wall (s) | budget (s) | result | tables |",
        "|---|---|---|---:|---:|---|---|",
        *rows,
        "",
    ]
    for stage in selected:
        lines += outcomes.get(stage.name, Outcome("")).details
    path = ctx.out / SUMMARY
    path.write_text("\n".join(lines).rstrip("\n") + "\n")
    data = {"dry": ctx.dry, "date": str(datetime.date.today()), "machine": machine, "budget_seconds": budget,
            "stages": [{"stage": s.name, "status": outcomes.get(s.name, Outcome("not run")).status,
                        "seconds": outcomes.get(s.name, Outcome("")).seconds, "budget_seconds": s.budget,
                        "result": outcomes.get(s.name, Outcome("")).result,
                        "data": outcomes.get(s.name, Outcome("")).data} for s in selected]}  # fmt: skip
    path.with_suffix(".json").write_text(json.dumps(data, indent=1, default=str) + "\n")
    return path


def write_archive(ctx: Context, archive: Path, selected: Sequence[Stage]) -> None:
    """Every file this run wrote (summary, tables with their JSON and charts, logs/) packed
    into ``archive``, replaced atomically: names relative to --out, so that
    ``tar -xzf ARCHIVE -C bench/results --exclude=logs`` puts the tables in place."""
    names = [SUMMARY, SUMMARY.replace(".md", ".json")]
    for stage in selected:
        for table in stage.files:
            stem = Path(table).stem
            names += sorted(p.name for p in ctx.out.glob(f"{stem}*") if p.suffix in (".md", ".json", ".png"))
    partial = archive.with_name(archive.name + ".partial")
    archive.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(partial, "w:gz") as tar:
        for name in dict.fromkeys(names):
            if (ctx.out / name).exists():
                tar.add(ctx.out / name, arcname=name)
        if ctx.logs.exists():
            tar.add(ctx.logs, arcname="logs")
    partial.replace(archive)


# ---------------------------------------------------------------------------------------
# The driver
# ---------------------------------------------------------------------------------------


def run(ctx: Context, selected: Sequence[Stage], budget: float, archive: Optional[Path]) -> dict[str, Outcome]:
    """Every selected stage in order, each until its deadline: its own budget plus what the
    stages before it left (the last: the total budget); the summary and the archive rewritten
    after each."""
    start = time.monotonic()
    outcomes: dict[str, Outcome] = {}
    allotted = 0.0
    for index, stage in enumerate(selected):
        allotted += stage.dry_budget if ctx.dry else stage.budget
        end = start + (budget if index == len(selected) - 1 else min(allotted, budget))
        ctx.deadline = end
        began = time.monotonic()
        print(f"\n=== gpu-check: {stage.name} ({stage.what}): {max(ctx.left(), 0):.0f} s", flush=True)
        if ctx.left() < 5:
            outcome = Outcome("not run", "no time left")
        else:
            try:
                outcome = RUNNERS[stage.name](ctx)
            except TimedOut:
                outcome = Outcome("timed out", "stopped at its deadline; what it wrote is kept")
            except Exception as error:  # noqa: BLE001  (one stage's bug must not cost the others)
                outcome = Outcome("failed", f"{type(error).__name__}: {error}")
        outcome.seconds = time.monotonic() - began
        outcomes[stage.name] = outcome
        print(f"=== gpu-check: {stage.name}: {outcome.status} in {outcome.seconds:.0f} s: {outcome.result}", flush=True)
        write_summary(ctx, budget, outcomes, selected)
        if archive is not None:
            write_archive(ctx, archive, selected)
    return outcomes


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    parser.add_argument("--dry", action="store_true", help="every stage on the CPU, tiny (see above)")
    parser.add_argument("--out", type=Path, help="where the tables go (default: bench/results/; --dry: a temporary folder)")
    parser.add_argument("--logs", type=Path, help="the stages' logs (default: OUT/logs, or build/gpu-check-logs "
                                                  "when OUT is bench/results)")
    parser.add_argument("--archive", type=Path, help="also pack what the run wrote into this .tar.gz after each stage")
    parser.add_argument("--stages", help=f"comma-separated, run in this order (default: {','.join(BY_NAME)})")
    parser.add_argument("--budget", type=float, help="seconds in all (default: the stages' budgets summed)")
    parser.add_argument("--body", choices=sorted(BODIES), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    out = args.out or (Path(tempfile.mkdtemp(prefix="oplib-gpu-check-dry-")) if args.dry else RESULTS)
    if args.dry and RESULTS in [out.resolve(), *out.resolve().parents]:
        parser.error("--dry writes the CPU's figures: its --out must not be bench/results/")
    logs = args.logs or (ROOT / "build" / "gpu-check-logs" if out.resolve() == RESULTS else out / "logs")
    out.mkdir(parents=True, exist_ok=True)
    logs.mkdir(parents=True, exist_ok=True)
    if args.body:
        BODIES[args.body](logs, args.dry)
        return 0
    for old in logs.iterdir():  # an earlier run's logs and reports (build/gpu-check-logs stays between runs)
        if old.is_file():
            old.unlink()
    names = args.stages.split(",") if args.stages else list(BY_NAME)
    unknown = [name for name in names if name not in BY_NAME]
    if unknown:
        parser.error(f"--stages: unknown {', '.join(unknown)}; the stages are {', '.join(BY_NAME)}")
    selected = [BY_NAME[name] for name in names]
    budget = args.budget or sum(stage.dry_budget if args.dry else stage.budget for stage in selected)
    env = dict(os.environ, PYTHONUNBUFFERED="1", PYTHONPATH=os.pathsep.join(
        [str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]))
    if args.dry:
        # The host emulation's OpenMP and torch on one thread each: on a busy 2-core machine,
        # spinning threads made every tiny call take milliseconds.
        env.setdefault("OMP_NUM_THREADS", "1")
    ctx = Context(out=out, logs=logs, dry=args.dry, python=sys.executable, env=env)
    print(f"gpu-check{' --dry' if args.dry else ''}: {', '.join(names)} in {budget:.0f} s; tables into {out}, logs "
          f"into {logs}" + (f", archived into {args.archive}" if args.archive else ""), flush=True)
    outcomes = run(ctx, selected, budget, args.archive)
    print("\n" + (out / SUMMARY).read_text(), flush=True)
    return 0 if all(o.status in ("ok", "skipped") for o in outcomes.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
