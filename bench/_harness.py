"""What every benchmark script shares beyond oplib.benchmark's measuring code (statements,
interleaved timing, ratios, the machine; what ``python -m oplib bench`` runs for users): the
flags, load monitoring of the timed rounds, peak memory in a fresh process and the report:
markdown, the same run as data (JSON: every reading of every round, and each table's
cells) and charts (PNG). The scripts (``python bench/<name>.py``) import it as a sibling module and hold only
their cases and bars:

    settings = _harness.start(_harness.parser(__doc__, rounds=3, min_run_time=1.0).parse_args(), __file__)
    section = _harness.Section(settings)
    times = section.measure("fc", {"torch": benchmark.fwd_bwd(F.linear, args, grad), "oplib": ...})
    benchmark.ratio(times["oplib"], times["torch"])    # median of the per-round ratios
    _harness.peak_memory(make_step, shape, "oplib")    # bytes, one make_step(shape, "oplib")() call
    _harness.write_report(settings, [*_harness.header(settings, title), section.load_line(), ...])
    _harness.write_chart(settings, "speed-up", figure)  # bench/results/<script>-speed-up.png
"""

from __future__ import annotations

import argparse
import datetime
import json
import multiprocessing
import os
import resource
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional, TypeVar
from unittest import mock

import torch

from oplib import benchmark
from oplib.benchmark import Clock, Stmt, Timing, describe_machine

RESULTS = Path(__file__).resolve().parent / "results"

# Every Section.measure of this process, for the report's data file.
_READINGS: list[dict[str, Any]] = []

# A round during which other processes kept more than this many cores busy on average is
# run once more, and the quieter of the two kept: with a torch thread on every core, one
# busy core stalls every parallel region.
RERUN_CORES = 0.25
# A section whose kept rounds still saw more than this is reported as unreliable.
BUSY_CORES = 0.1


# ---------------------------------------------------------------------------------------
# Settings
# ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Settings:
    """How a script was asked to run."""

    script: str  # file stem: "dense" for bench/dense.py
    quick: bool
    threads: int
    rounds: int
    min_run_time: float  # seconds per candidate per round
    output: Path


def parser(doc: str, *, rounds: int, min_run_time: float, quick_rounds: int = 1, quick_min_run_time: float = 0.2) -> argparse.ArgumentParser:
    """The flags every script takes: --quick, --threads, --rounds, --min-run-time, --output."""
    result = argparse.ArgumentParser(description=doc.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    result.add_argument("--quick", action="store_true", help="smoke test: small cases, short timings")
    result.add_argument("--threads", type=int, default=os.cpu_count(), help="torch threads (default: os.cpu_count())")
    result.add_argument(
        "--rounds", type=int, help=f"interleaved timing rounds, the median kept (default: {rounds}; --quick: {quick_rounds})"
    )
    result.add_argument(
        "--min-run-time",
        type=float,
        help=f"seconds per candidate per round (default: {min_run_time:g}; --quick: {quick_min_run_time:g})",
    )
    result.add_argument("--output", type=Path, help="markdown file (default: bench/results/<script>[-quick].md)")
    result.set_defaults(_defaults=(rounds, min_run_time, quick_rounds, quick_min_run_time))
    return result


def start(args: argparse.Namespace, script_file: str) -> Settings:
    """Resolve the defaults of ``parser``'s flags, set torch's threads and print the machine."""
    rounds, min_run_time, quick_rounds, quick_min_run_time = args._defaults
    script = Path(script_file).stem
    settings = Settings(
        script=script,
        quick=args.quick,
        threads=args.threads,
        rounds=args.rounds or (quick_rounds if args.quick else rounds),
        min_run_time=args.min_run_time or (quick_min_run_time if args.quick else min_run_time),
        output=args.output or RESULTS / f"{script}{'-quick' if args.quick else ''}.md",
    )
    torch.set_num_threads(settings.threads)
    print(describe_machine(), flush=True)
    return settings


# ---------------------------------------------------------------------------------------
# Load: CPU time of the other processes
# ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _CpuSnapshot:
    """CPU seconds used so far by the whole machine (None without /proc/stat) and by this
    process, and a wall-clock reading."""

    machine: Optional[float]
    process: float
    wall: float

    @staticmethod
    def take() -> _CpuSnapshot:
        try:
            with open("/proc/stat") as f:
                ticks = [int(v) for v in f.readline().split()[1:9]]
            user, nice, system, _idle, _iowait, irq, softirq, steal = ticks
            machine: Optional[float] = (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")
        except (OSError, ValueError):
            machine = None
        usage = resource.getrusage(resource.RUSAGE_SELF)
        return _CpuSnapshot(machine, usage.ru_utime + usage.ru_stime, time.monotonic())

    def other_cores_since(self, start: _CpuSnapshot) -> Optional[float]:
        """Cores other processes (and the hypervisor's steal) kept busy on average since ``start``."""
        if self.machine is None or start.machine is None:
            return None
        others = (self.machine - start.machine) - (self.process - start.process)
        return max(others, 0.0) / max(self.wall - start.wall, 1e-9)


# ---------------------------------------------------------------------------------------
# Timing
# ---------------------------------------------------------------------------------------


# A candidate's name in ``Section.measure``: a string, or a tuple of them such as (candidate, mode).
Key = TypeVar("Key", str, tuple[str, ...])


def _words(key: Key) -> str:
    return key if isinstance(key, str) else " ".join(key)


class Section:
    """Cases timed one after another, and how busy other processes kept the machine during
    their kept rounds."""

    def __init__(self, settings: Settings, min_run_time: Optional[float] = None, rounds: Optional[int] = None) -> None:
        self.rounds = settings.rounds if rounds is None else rounds
        self.min_run_time = settings.min_run_time if min_run_time is None else min_run_time
        self.reruns = 0
        self.kept = 0
        self._other_core_seconds: Optional[float] = 0.0
        self._seconds = 0.0

    def _monitored_round(self, clocks: Mapping[Key, Clock], first: int) -> tuple[dict[Key, float], Optional[float], float]:
        """``benchmark.run_round``: the readings, the other processes' cores meanwhile, the wall seconds."""
        start = _CpuSnapshot.take()
        readings = benchmark.run_round(clocks, first)
        end = _CpuSnapshot.take()
        return readings, end.other_cores_since(start), end.wall - start.wall

    def _round(self, clocks: Mapping[Key, Clock], first: int) -> dict[Key, float]:
        """A round, run once more if other processes disturbed it, the quieter of the two kept."""
        readings, others, seconds = self._monitored_round(clocks, first)
        if others is not None and others > RERUN_CORES:
            self.reruns += 1
            again = self._monitored_round(clocks, first)
            if again[1] is not None and again[1] < others:
                readings, others, seconds = again
        self.kept += 1
        self._seconds += seconds
        if others is None or self._other_core_seconds is None:
            self._other_core_seconds = None
        else:
            self._other_core_seconds += others * seconds
        return readings

    def measure(self, label: str, stmts: Mapping[Key, Stmt], device: str = "cpu") -> dict[Key, Timing]:
        """Time every statement on ``device`` in ``rounds`` interleaved rounds
        (``benchmark.interleave``); a round disturbed by other processes is run once more and
        the quieter of the two kept."""
        clocks = {name: benchmark.clock(stmt, device, self.min_run_time) for name, stmt in stmts.items()}
        times = benchmark.interleave(clocks, self.rounds, self._round)
        _READINGS.extend(
            {"case": label, "statement": [name] if isinstance(name, str) else list(name), "device": device,
             "seconds": list(timing.rounds), "median_seconds": timing.median}
            for name, timing in times.items()
        )  # fmt: skip
        load = "unknown" if self.other_cores is None else f"{self.other_cores:.2f}"
        print(
            f"{label}: " + ", ".join(f"{_words(name)} {t.median * 1e3:.3f} ms" for name, t in times.items())
            + f" (other processes' cores so far in this section: {load}, rounds run twice: {self.reruns})",
            flush=True,
        )
        return times

    @property
    def other_cores(self) -> Optional[float]:
        """Cores other processes kept busy on average during the kept rounds (None: unknown)."""
        if self._other_core_seconds is None or self._seconds == 0:
            return None
        return self._other_core_seconds / self._seconds

    @property
    def disturbed(self) -> bool:
        return self.other_cores is not None and self.other_cores > BUSY_CORES

    def load_line(self) -> str:
        """A markdown sentence: the other processes' load, the re-run rounds, a warning."""
        if self.other_cores is None:
            return "Other processes' CPU use during this section: unknown (no /proc/stat)."
        line = f"Other processes kept {self.other_cores:.2f} cores busy on average during this section's timed rounds"
        line += f"; {self.reruns} of {self.kept} rounds were run twice because of them." if self.reruns else "."
        if self.disturbed:
            line += " **Warning: timings unreliable**; rerun on a quiet machine."
        return line


# ---------------------------------------------------------------------------------------
# Peak memory
# ---------------------------------------------------------------------------------------


def _status_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"{field} not in /proc/self/status")


def _peak_in_this_process(make_step: Callable[..., Callable[[], Any]], args: tuple, threads: int) -> int:
    torch.set_num_threads(threads)
    step = make_step(*args)
    step()  # one-time caches stay resident, outside the reading
    Path("/proc/self/clear_refs").write_text("5")  # resets VmHWM to the current VmRSS
    before = _status_kib("VmRSS")
    step()
    # The kernel counts resident pages per CPU in batches, so readings move by a few hundred
    # KB: a peak below that can read as slightly negative, and counts as 0.
    return max(0, 1024 * (_status_kib("VmHWM") - before))


def peak_memory(make_step: Callable[..., Callable[[], Any]], *args: Any) -> int:
    """Peak resident bytes above the level before the call, during the second call of
    ``make_step(*args)()`` (Linux). Measured in a fresh process whose malloc hands large
    blocks straight back to the OS, so that the resident set tracks the live tensors: in a
    process that has timed things, freed memory waits in malloc's heap and later calls reuse
    it unseen. ``make_step`` must be a module-level function (it is pickled by name)."""
    # glibc reads these at start-up: blocks over 64 KiB are mmapped, and the heap is trimmed on every free.
    with mock.patch.dict(os.environ, MALLOC_MMAP_THRESHOLD_="65536", MALLOC_TRIM_THRESHOLD_="0"):
        with multiprocessing.get_context("spawn").Pool(1) as pool:
            return pool.apply(_peak_in_this_process, (make_step, args, torch.get_num_threads()))


# ---------------------------------------------------------------------------------------
# Report
# ---------------------------------------------------------------------------------------


def header(settings: Settings, title: str, *bullets: str, times: Optional[str] = None) -> list[str]:
    """The report's title, command, date, machine and timing method (``times``, where the
    report's tables are not timed by ``settings``' readings), then ``bullets``."""
    flag = " --quick" if settings.quick else ""
    return [
        f"# {title}",
        "",
        f"Written by `python bench/{settings.script}.py{flag}` on {datetime.date.today()}.",
        "",
        f"- machine: {describe_machine()}",
        f"- times: {times}" if times is not None else
        f"- times: `oplib.benchmark` readings (>= {settings.min_run_time:g} s each: on CPU `torch.utils.benchmark` "
        f"blocked_autorange medians, on a GPU the median of blocks timed by CUDA events) in "
        f"{settings.rounds} interleaved round(s), the order rotating; a time is the median of its rounds, a ratio "
        f"the median of the per-round ratios; a round during which other processes kept more than {RERUN_CORES:g} "
        "cores busy is run twice and the quieter kept"
        + (" (**--quick: smoke-test timing, not for conclusions**)" if settings.quick else ""),
        *bullets,
        "",
    ]


_ALIGN = {"l": "---", "r": "---:", "c": ":---:"}


def table(columns: Sequence[str], align: str, rows: Iterable[Sequence[Any]]) -> list[str]:
    """Markdown table lines; ``align`` has one letter per column: l(eft), r(ight), c(entre)."""
    if len(align) != len(columns):
        raise ValueError(f"{len(columns)} columns but {len(align)} alignments ({align!r})")
    lines = ["| " + " | ".join(columns) + " |", "|" + "|".join(_ALIGN[a] for a in align) + "|"]
    lines += ["| " + " | ".join(str(cell) for cell in row) + " |" for row in rows]
    return lines


def megabytes(size: int) -> str:
    return f"{size / 1e6:.0f}"


def busy_note(sections: Iterable[Section]) -> str:
    """A sentence for the verdict when a section was timed while other processes were busy."""
    busy = [s.other_cores for s in sections if s.disturbed]
    if not busy:
        return ""
    return f" Measured while other processes kept up to {max(busy):.2f} cores busy: see the load warnings."


def _tables(lines: Sequence[str]) -> list[dict[str, Any]]:
    """The markdown tables among ``lines`` (as ``table`` writes them), each with the heading
    it stands under: {"heading", "columns", "rows"}."""
    tables: list[dict[str, Any]] = []
    heading, previous = "", ""
    for line in lines:
        if line.startswith("#"):
            heading = line.lstrip("#").strip()
        elif line.startswith("|") and not previous.startswith("|"):
            tables.append({"heading": heading, "columns": _cells(line), "rows": []})
        elif line.startswith("|") and not line.startswith("|---") and not line.startswith("|:"):
            tables[-1]["rows"].append(_cells(line))
        previous = line
    return tables


def _cells(line: str) -> list[str]:
    return [cell.strip() for cell in line.strip().strip("|").split("|")]


def write_report(settings: Settings, lines: Sequence[str]) -> Path:
    """Write the markdown to ``settings.output`` and print it; beside it, the same run as data
    (``<name>.json``): the machine, every statement's reading in each kept round, and each
    table's cells."""
    report = "\n".join(lines).rstrip("\n") + "\n"
    settings.output.parent.mkdir(parents=True, exist_ok=True)
    settings.output.write_text(report)
    data = {
        "script": f"bench/{settings.script}.py", "quick": settings.quick, "date": str(datetime.date.today()),
        "machine": describe_machine(), "rounds": settings.rounds, "min_run_time_seconds": settings.min_run_time,
        "readings": _READINGS, "tables": _tables(lines),
    }  # fmt: skip
    data_path = settings.output.with_suffix(".json")
    data_path.write_text(json.dumps(data, indent=1) + "\n")
    print(f"\n{report}\nwritten to {settings.output} and {data_path}", flush=True)
    return settings.output


def pyplot() -> Any:
    """matplotlib.pyplot on the file-only Agg backend, or None (said once) where matplotlib is
    not installed: the scripts then write their data and markdown without charts."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("no charts: matplotlib is not installed (pip install matplotlib)", flush=True)
        return None
    return plt


def legend_in_headroom(axes: Any, ncols: int) -> None:
    """The legend in one row at the top left, above the bars: the y axis grows by a fifth,
    since a legend drawn over the tallest bars hides them."""
    axes.set_ylim(top=axes.get_ylim()[1] * 1.2)
    axes.legend(fontsize=8, ncols=ncols, loc="upper left")


def write_chart(settings: Settings, name: str, figure: Any) -> Path:
    """Save a matplotlib figure beside the report as ``<report name>-<name>.png``."""
    path = settings.output.with_name(f"{settings.output.stem}-{name}.png")
    figure.savefig(path, dpi=110, bbox_inches="tight")
    print(f"chart written to {path}", flush=True)
    return path


def checkout(rev: str) -> Path:
    """Git revision ``rev``'s oplib package, extracted (``git archive``) into a temporary
    directory: a baseline to build and time beside this tree."""
    import io
    import subprocess
    import tarfile
    import tempfile

    workdir = Path(tempfile.mkdtemp(prefix="oplib-baseline-"))
    archive = subprocess.run(["git", "-C", str(RESULTS.parents[1]), "archive", rev, "oplib"], capture_output=True, check=True).stdout
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(workdir, filter="data")
    return workdir
