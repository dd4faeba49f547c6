"""tools/gpu_check.py, the one command of a GPU lease, without a GPU: the parsers of what
compute-sanitizer, Nsight Compute and pytest print (on recorded samples in gpu_check_fixtures/),
the command lines it cannot run here, the deadlines that stop a stage and let the next run, the
summary and the archive rewritten after each stage; and the dry run of every stage end to end."""

from __future__ import annotations

import importlib.util
import json
import re
import sys
import tarfile
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = Path(__file__).resolve().parent / "gpu_check_fixtures"


@pytest.fixture(scope="module")
def gpu_check():
    spec = importlib.util.spec_from_file_location("gpu_check", ROOT / "tools" / "gpu_check.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["gpu_check"] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def test_the_ncu_parser_reads_the_raw_page(gpu_check):
    kernels = gpu_check.parse_ncu_raw((FIXTURES / "ncu-raw.csv").read_text())
    assert len(kernels) == 5
    first = kernels[0]
    # template arguments in brackets of their own survive; the parameter list does not
    assert first["kernel"] == "involution_forward_chunked<oplib_bfloat16, int, (int)7, (int)1, (bool)1>"
    assert first["duration_us"] == pytest.approx(40.416)  # "40,416" nanoseconds
    assert (first["dram_pct"], first["achieved_occupancy_pct"], first["registers"]) == (61.84, 87.12, 40)
    assert list(first["stalls"])[:3] == ["long_scoreboard", "lg_throttle", "wait"]
    assert "selected" not in first["stalls"]  # the issuing warp, not a stall
    assert kernels[4]["kernel"] == "involution_forward<oplib_bfloat16>"


def test_the_ncu_parser_takes_a_page_without_units_and_refuses_no_table(gpu_check):
    header = '"ID","Kernel Name","gpu__time_duration.sum","sm__warps_active.avg.pct_of_peak_sustained_active"'
    (kernel,) = gpu_check.parse_ncu_raw(header + '\n"0","void k<float>(float *)","1,500","n/a"\n')
    assert kernel["kernel"] == "k<float>" and kernel["duration_us"] == 1.5 and kernel["achieved_occupancy_pct"] is None
    with pytest.raises(ValueError, match="no ncu CSV header"):
        gpu_check.parse_ncu_raw("==ERROR== ERR_NVGPUCTRPERM - The user does not have permission to access counters")


def test_the_ncu_table_names_each_call_only_when_each_launched_one_kernel(gpu_check):
    kernels = gpu_check.parse_ncu_raw((FIXTURES / "ncu-raw.csv").read_text())
    labelled = gpu_check.ncu_table(kernels, [f"call {i}" for i in range(5)])
    assert labelled[2].startswith("| call 0 | `involution_forward_chunked<")
    assert "| 40.4 | 61.8 | 87.1 | 100.0 | 40 | long_scoreboard 14.2, lg_throttle 2.7, wait 1.9 |" in labelled[2]
    assert all(line.startswith("| - |") for line in gpu_check.ncu_table(kernels, ["one call"])[2:])


def test_the_memcheck_parser_counts_and_names_the_errors(gpu_check):
    clean = gpu_check.parse_memcheck((FIXTURES / "compute-sanitizer-memcheck.txt").read_text())
    assert clean == {"errors": 0, "calls": 240, "first_errors": []}
    found = gpu_check.parse_memcheck((FIXTURES / "compute-sanitizer-memcheck-errors.txt").read_text())
    assert found["errors"] == 2 and found["calls"] == 240
    assert found["first_errors"] == [
        "Invalid __global__ read of size 2 bytes in `involution_forward_chunked<oplib_bfloat16, int, (int)7, (int)1, (bool)1>`",
        "Invalid __global__ write of size 4 bytes in `involution_backward_weight<float>`",
    ]
    # a run killed before its summary has no count: never read as clean
    assert gpu_check.parse_memcheck("========= COMPUTE-SANITIZER\n")["errors"] is None


def test_the_junit_parser_counts_and_keeps_each_failure(gpu_check):
    report = """<testsuites><testsuite name="pytest" time="12.5">
      <testcase classname="tests.a" name="test_ok" time="1"/>
      <testcase classname="tests.a" name="test_bad" time="1"><failure message="assert 1 == 2&#10;more">trace</failure></testcase>
      <testcase classname="tests.b" name="test_broken" time="1"><error message="fixture failed">trace</error></testcase>
      <testcase classname="tests.b" name="test_skip" time="0"><skipped message="needs a CUDA GPU"/></testcase>
    </testsuite></testsuites>"""
    counts = gpu_check.parse_junit(report)
    assert {k: counts[k] for k in ("passed", "failed", "errors", "skipped", "seconds")} == dict(
        passed=1, failed=1, errors=1, skipped=1, seconds=12.5)
    assert counts["failures"] == [("tests.a::test_bad", "assert 1 == 2"), ("tests.b::test_broken", "fixture failed")]


def test_a_test_run_stopped_at_its_deadline_is_counted_from_its_progress_lines(gpu_check):
    """pytest writes its JUnit report at the end only: a run killed at the stage's deadline is
    counted from -v's lines, with xdist ([gw0] [ 1%] PASSED name) and without (name PASSED)."""
    log = "\n".join([
        "[gw0] [  1%] PASSED tests/a.py::test_x[cuda]",
        "[gw1] [  2%] FAILED tests/b.py::test_y",
        "[gw1] [  3%] SKIPPED tests/b.py::test_z",
        "tests/c.py::test_w PASSED                                     [ 50%]",
        "tests/c.py::test_v ERROR                                      [ 60%]",
        "some output PASSED in a test's print",
    ])  # fmt: skip
    counts = gpu_check.parse_pytest_progress(log)
    assert {k: counts[k] for k in ("passed", "failed", "errors", "skipped")} == dict(passed=2, failed=1, errors=1, skipped=1)
    assert counts["failures"] == [("tests/b.py::test_y", "failed"), ("tests/c.py::test_v", "error")]


def test_the_commands_a_dry_run_cannot_run_are_well_formed(gpu_check, tmp_path):
    profiled = [sys.executable, str(ROOT / "tools" / "gpu_check.py"), "--body", "ncu-calls"]
    profile, read_back = gpu_check.ncu_commands(sys.executable, tmp_path / "ncu.ncu-rep", profiled)
    gpu_check._check_command(profile, "ncu", profiled)
    assert profile.count("--section") == len(gpu_check.NCU_SECTIONS) and "--export" in profile
    assert read_back == ["ncu", "--import", str(tmp_path / "ncu.ncu-rep"), "--page", "raw", "--csv"]
    memcheck = gpu_check.memcheck_command(sys.executable)
    gpu_check._check_command(memcheck, "compute-sanitizer", memcheck[-1:])
    with pytest.raises(ValueError, match="missing scripts"):
        gpu_check._check_command(["ncu", "python", "tools/no_such_script.py"], "ncu", [])
    with pytest.raises(ValueError, match="malformed"):
        gpu_check._check_command(["nsys", "python"], "ncu", [])


def _context(gpu_check, tmp_path):
    return gpu_check.Context(out=tmp_path / "out", logs=tmp_path / "out" / "logs", dry=False, python=sys.executable,
                             env={"PATH": "/usr/bin:/bin"})


def test_a_stage_past_its_deadline_is_stopped_and_the_next_runs(gpu_check, tmp_path, monkeypatch):
    """The first stage sleeps past its deadline (its process group is killed, its table kept);
    the second gets its own budget; the summary and the archive are rewritten after each."""
    ctx = _context(gpu_check, tmp_path)
    ctx.logs.mkdir(parents=True)
    stages = [gpu_check.Stage("slow", "sleeps", 6, 6, ("slow.md",)), gpu_check.Stage("quick", "writes", 30, 30, ("quick.md",))]

    def slow(ctx):
        (ctx.out / "slow.md").write_text("| a |\n|---|\n| partial |\n")
        gpu_check.run_command(ctx, [sys.executable, "-c", "import time; print('started', flush=True); time.sleep(60)"],
                              ctx.logs / "slow.log")

    def quick(ctx):
        (ctx.out / "quick.md").write_text("done\n")
        with tarfile.open(tmp_path / "gpu-check.tar.gz") as packed:
            archived = packed.getnames()
        assert "slow.md" in archived and "gpu-check.md" in archived  # the first stage's, already packed
        return gpu_check.Outcome("ok", "wrote quick.md")

    monkeypatch.setattr(gpu_check, "RUNNERS", {"slow": slow, "quick": quick})
    start = time.monotonic()
    outcomes = gpu_check.run(ctx, stages, 36, tmp_path / "gpu-check.tar.gz")
    assert time.monotonic() - start < 20
    assert outcomes["slow"].status == "timed out" and outcomes["quick"].status == "ok"
    assert "started" in (ctx.logs / "slow.log").read_text()
    summary = (ctx.out / "gpu-check.md").read_text()
    assert "| slow | sleeps | timed out |" in summary and "| quick | writes | ok |" in summary
    with tarfile.open(tmp_path / "gpu-check.tar.gz") as archive:
        names = archive.getnames()
    assert {"gpu-check.md", "gpu-check.json", "slow.md", "quick.md", "logs", "logs/slow.log"} <= set(names)
    data = json.loads((ctx.out / "gpu-check.json").read_text())
    assert [s["status"] for s in data["stages"]] == ["timed out", "ok"]


def test_a_stage_that_raises_costs_only_itself(gpu_check, tmp_path, monkeypatch):
    ctx = _context(gpu_check, tmp_path)
    ctx.logs.mkdir(parents=True)
    stages = [gpu_check.Stage("broken", "raises", 10, 10), gpu_check.Stage("after", "runs", 10, 10)]

    def broken(ctx):
        raise KeyError("typo")

    monkeypatch.setattr(gpu_check, "RUNNERS", {"broken": broken, "after": lambda ctx: gpu_check.Outcome("ok")})
    outcomes = gpu_check.run(ctx, stages, 20, None)
    assert outcomes["broken"].status == "failed" and "KeyError" in outcomes["broken"].result
    assert outcomes["after"].status == "ok"


def test_a_dry_run_never_writes_into_bench_results(gpu_check, capsys):
    with pytest.raises(SystemExit):
        gpu_check.main(["--dry", "--out", str(ROOT / "bench" / "results")])
    assert "must not be bench/results" in capsys.readouterr().err


def test_the_stages_fit_the_lease(gpu_check):
    """Eight minutes of stages: a lent machine's command runs at most ten, and its start and the
    transfers come out of the same fifteen minutes of device time."""
    assert sum(stage.budget for stage in gpu_check.STAGES) <= 8 * 60
    assert [s.name for s in gpu_check.STAGES][:2] == ["load", "tests"] and gpu_check.STAGES[-1].name == "models"
    assert set(gpu_check.RUNNERS) == set(gpu_check.BY_NAME)


@pytest.mark.integration
def test_the_dry_run_runs_every_stage_and_writes_its_table(gpu_check, tmp_path):
    """Every stage end to end on the CPU (tiny sizes, the kernels emulated, the tests skipped,
    ncu and compute-sanitizer replaced by their recorded outputs), every table written."""
    import subprocess

    out, archive = tmp_path / "out", tmp_path / "device-out" / "gpu-check.tar.gz"
    result = subprocess.run([sys.executable, str(ROOT / "tools" / "gpu_check.py"), "--dry", "--out", str(out),
                             "--archive", str(archive)], capture_output=True, text=True, timeout=3000)
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-3000:]
    data = json.loads((out / "gpu-check.json").read_text())
    assert [(s["stage"], s["status"]) for s in data["stages"]] == [(s.name, "ok") for s in gpu_check.STAGES]
    for stage in gpu_check.STAGES:
        for table in stage.files:
            assert "|---" in (out / table).read_text(), f"{stage.name}: {table} has no table"
            assert (out / table).with_suffix(".json").exists(), table
    models = (out / "involution-cuda-models.md").read_text()
    assert "### Where a step's time goes" in models and "| train, eager | 2 | RedNet-50 |" in models
    # tuning timed every model, and at some signature kept a candidate other than the op's choice
    tuning = (out / "involution-cuda-tuning.md").read_text()
    assert "| train, eager | RedNet-50 |" in tuning and "| inference, eager | RedNet-50, fused, tuned |" in tuning
    assert re.search(r"\| (tiled|staged|dense window|tensor cores|generic) \| 0\.\d\dx \|", tuning), tuning[-3000:]
    summary = (out / "gpu-check.md").read_text()
    assert "## Kernels loaded" in summary and "## needs_cuda tests" in summary and "## compute-sanitizer memcheck" in summary
    with tarfile.open(archive) as packed:
        names = set(packed.getnames())
    assert {"gpu-check.md", *(table for stage in gpu_check.STAGES for table in stage.files)} <= names
    assert "logs/needs-cuda.xml" in names


def test_the_gpu_branches_of_memcheck_and_ncu_read_what_the_tools_print(gpu_check, tmp_path, monkeypatch):
    """compute-sanitizer and ncu replaced by scripts that print the recorded outputs: the
    stages' GPU code (the commands run, ncu's CSV read back into a file, the tables) runs here.
    This ncu refuses the --metrics list, as one that lacks a metric name does: the stage
    profiles again with the sections alone."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    tools = {
        "compute-sanitizer": f"cat {FIXTURES / 'compute-sanitizer-memcheck.txt'}",
        "ncu": 'case " $* " in *" --metrics "*) echo "==ERROR== Failed to find metric"; exit 1;; esac\n'
               f'if [ "$1" = "--import" ]; then cat {FIXTURES / "ncu-raw.csv"}; fi',
    }
    for name, body in tools.items():
        (bin_dir / name).write_text(f"#!/bin/sh\n{body}\n")
        (bin_dir / name).chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:/usr/bin:/bin")
    ctx = _context(gpu_check, tmp_path)
    ctx.env["PATH"] = f"{bin_dir}:/usr/bin:/bin"
    ctx.logs.mkdir(parents=True)
    ctx.deadline = time.monotonic() + 60
    memcheck = gpu_check.stage_memcheck(ctx)
    assert (memcheck.status, memcheck.result) == ("ok", "240 calls, 0 errors")
    ncu = gpu_check.stage_ncu(ctx)
    assert (ncu.status, ncu.result) == ("ok", "5 kernels profiled")
    table = (ctx.out / "involution-cuda-ncu.md").read_text()
    assert "`involution_backward_weight_chunked<oplib_bfloat16, int, (int)7, (int)1, (bool)1>`" in table
    assert json.loads((ctx.out / "involution-cuda-ncu.json").read_text())["kernels"][3]["dram_pct"] == 9.41
    assert (ctx.logs / "ncu.log").read_text().count("$ ncu --target-processes") == 2  # with the metrics, then without
