"""The native CPU kernels' first-use build: how long it takes and how much memory it holds.

    python bench/build.py                       # this tree's build, writes bench/results/build.md
    python bench/build.py --baseline-rev REV    # and git revision REV's build, alternating with it
    python bench/build.py --quick               # one build

Each build is one first call as a user makes it (``oplib.kernels.native.involution()`` with
``OPLIB_CPU_KERNELS=native``) in a fresh process with an empty extension cache (a temporary
``TORCH_EXTENSIONS_DIR``). Wall time is the process's, from start to exit. Memory: the
resident memory of the process and every process it starts (the compilers), summed, sampled
every 50 ms from /proc; the peak is the highest sum. A baseline revision is built by its own
oplib, from ``git archive``. The bar (issue 35): at most 60 s and 1.5 GB on this machine.
"""

from __future__ import annotations

import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Optional

import _harness

ROOT = Path(__file__).resolve().parents[1]
MAX_SECONDS, MAX_BYTES = 60.0, 1.5e9
FIRST_CALL = "from oplib.kernels import native; native.involution()"


def _children() -> dict[int, list[int]]:
    tree: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                parent = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        tree.setdefault(parent, []).append(int(entry))
    return tree


def _tree_rss(root: int) -> int:
    """Resident bytes of root and all its descendants."""
    tree, total, stack = _children(), 0, [root]
    while stack:
        pid = stack.pop()
        stack += tree.get(pid, [])
        try:
            with open(f"/proc/{pid}/statm") as f:
                total += int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
        except (OSError, IndexError, ValueError):
            continue
    return total


def measure_build(source_root: Optional[Path]) -> dict:
    """One first-use build into an empty cache: seconds, peak bytes, the build's stderr lines.
    ``source_root``: the tree whose oplib builds (None: this checkout)."""
    with tempfile.TemporaryDirectory(prefix="oplib-build-bench-") as cache:
        env = dict(os.environ, TORCH_EXTENSIONS_DIR=cache, OPLIB_CPU_KERNELS="native")
        if source_root is not None:
            env["PYTHONPATH"] = str(source_root)
        start = time.monotonic()
        process = subprocess.Popen([sys.executable, "-c", FIRST_CALL], cwd=source_root or ROOT, env=env,
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        peak = 0
        while process.poll() is None:
            peak = max(peak, _tree_rss(process.pid))
            time.sleep(0.05)
        seconds = time.monotonic() - start
        stdout, stderr = process.communicate()
        if process.returncode != 0:
            raise RuntimeError(f"the build failed:\n{stdout}\n{stderr}")
        lines = [line for line in stderr.splitlines() if line.startswith("oplib:")]
        return {"seconds": seconds, "peak_bytes": peak, "lines": lines}


def measure_units() -> list[tuple[str, float, float]]:
    """Each unit of this tree compiled alone, one compiler process at a time, as the build
    compiles it: (unit, CPU seconds of the compiler, its wall seconds)."""
    sys.path.insert(0, str(ROOT))
    from oplib.kernels import native

    target = native.Target(native.compiler_command())
    flags = target.compile_flags("oplib_cpu_units")
    results = []
    with tempfile.TemporaryDirectory(prefix="oplib-build-units-") as workdir:
        for unit in native.units():
            before = os.times()
            start = time.monotonic()
            command = [*shlex.split(target.compiler), *flags, *target.unit_flags(unit.name), "-c", str(unit)]
            subprocess.run([*command, "-o", f"{workdir}/{unit.stem}.o"], check=True, capture_output=True)
            wall = time.monotonic() - start
            after = os.times()
            cpu = (after.children_user - before.children_user) + (after.children_system - before.children_system)
            results.append((unit.name, cpu, wall))
            print(f"  {unit.name}: {cpu:.1f} s CPU", flush=True)
    return results


def floor_seconds(unit_seconds: list[float], cores: int) -> float:
    """The least wall time in which ``cores`` compiler processes can compile units of these
    times: the longest unit, or the work shared evenly, whichever is longer (a lower bound no
    schedule beats)."""
    return max(max(unit_seconds), sum(unit_seconds) / cores)


def scheduled_seconds(unit_seconds: list[float], cores: int) -> float:
    """The wall time of the build's own schedule: the units in the build's order, each to the
    first compiler slot that frees."""
    slots = [0.0] * cores
    for seconds in unit_seconds:
        slots[slots.index(min(slots))] += seconds
    return max(slots)


def main(argv: Optional[list[str]] = None) -> int:
    parser = _harness.parser(__doc__, rounds=2, min_run_time=0.0)
    parser.add_argument("--baseline-rev", metavar="REV", help="also build git revision REV's native kernels, alternating")
    args = parser.parse_args(argv)
    settings = _harness.start(args, __file__)
    candidates = {"this tree": None}
    if args.baseline_rev:
        candidates[f"revision {args.baseline_rev}"] = _harness.checkout(args.baseline_rev)
    runs: dict[str, list[dict]] = {name: [] for name in candidates}
    for round_index in range(settings.rounds):
        order = list(candidates) if round_index % 2 == 0 else list(reversed(candidates))
        for name in order:
            run = measure_build(candidates[name])
            print(f"{name}: {run['seconds']:.1f} s, peak {run['peak_bytes'] / 1e9:.2f} GB", flush=True)
            runs[name].append(run)
    print("each unit alone:", flush=True)
    units = measure_units()
    cores = min(len(os.sched_getaffinity(0)), len(units))
    unit_cpu = [cpu for _, cpu, _ in units]
    floor, scheduled = floor_seconds(unit_cpu, cores), scheduled_seconds(unit_cpu, cores)
    cells = []
    for name, readings in runs.items():
        seconds = statistics.median(r["seconds"] for r in readings)
        peak = max(r["peak_bytes"] for r in readings)
        cells.append((name, len(readings), f"{seconds:.1f}", f"{peak / 1e9:.2f}",
                      " / ".join(f"{r['seconds']:.1f}" for r in readings)))  # fmt: skip
    mine = runs["this tree"]
    seconds, peak = statistics.median(r["seconds"] for r in mine), max(r["peak_bytes"] for r in mine)
    met = seconds <= MAX_SECONDS and peak <= MAX_BYTES
    lines = [
        *_harness.header(
            settings, "The native CPU kernels' first-use build",
            f"- compiler: `{os.environ.get('CXX', 'c++')}`; {len(os.sched_getaffinity(0))} cores for the compiles",
            "- each build: a first call in a fresh process with an empty extension cache; time = the process's wall "
            "time; peak = the highest resident memory of the process and its compilers together, sampled every 50 ms",
        ),
        *_harness.table(("build", "runs", "median wall (s)", "peak resident (GB)", "each run (s)"), "lrrrr", cells),
        "",
        f"Bar: at most {MAX_SECONDS:.0f} s and {MAX_BYTES / 1e9:.1f} GB for this tree's build: {'**met**' if met else '**not met**'}.",
        "",
        "## The floor of compiling these units",
        "",
        "Each unit of this tree compiled alone, one compiler process at a time with the build's flags, in the "
        "build's order (the longest first); CPU = the compiler's user + system time.",
        "",
        *_harness.table(("unit", "CPU (s)", "wall (s)"), "lrr",
                        [(f"`{name}`", f"{cpu:.1f}", f"{wall:.1f}") for name, cpu, wall in units]),  # fmt: skip
        "",
        f"- all units: {sum(unit_cpu):.1f} s of compiler CPU time; on {cores} cores the compiles cannot end before "
        f"{floor:.1f} s (the longest unit, or the work shared evenly); the build's order on {cores} compiler slots "
        f"ends them at {scheduled:.1f} s",
        f"- this tree's build took {seconds:.1f} s: {seconds - scheduled:.1f} s beyond its schedule's compiles "
        "(Python and torch starting, the link, the import)",
        "",
        "What the first call printed on stderr (this tree's last run):",
        "",
        "```text",
        *mine[-1]["lines"],
        "```",
    ]
    _harness.write_report(settings, lines)
    return 0 if met else 1


if __name__ == "__main__":
    sys.exit(main())
