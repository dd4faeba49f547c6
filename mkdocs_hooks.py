"""MkDocs hooks (mkdocs.yml `hooks:`): the charts that the benchmarks write to bench/results/
become site files under benchmarks/results/, so a benchmark page shows the last run's chart
beside the table it includes from the same run, with no copy in docs/ to go stale. A page that
names a chart the results folder lacks fails the strict build (an unresolved link)."""

from __future__ import annotations

from pathlib import Path

from mkdocs.structure.files import File, Files

RESULTS = Path(__file__).resolve().parent / "bench" / "results"


def on_files(files: Files, config) -> Files:
    for chart in sorted(RESULTS.glob("*.png")):
        if "-quick" not in chart.name:  # smoke runs (--quick) are not shown
            files.append(File.generated(config, f"benchmarks/results/{chart.name}", abs_src_path=str(chart)))
    return files
