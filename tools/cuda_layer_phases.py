"""Where a row of ``make gpu-check``'s layer table spends its wall time: for each statement of
the first RedNet-50 shape (bench/_cuda.layer_stmts, both precisions), its first and second
calls, building its CUDA clock (the graph capture) and two readings, with a profile of any
capture that takes more than half a second.

    OPLIB_CUDA_PREBUILT=build/cuda-sm_90 PYTHONPATH=. python tools/cuda_layer_phases.py   # on a GPU
    python tools/cuda_layer_phases.py                                                     # here: CPU, emulated

Writes ``$OUT/phases.txt`` (default: the current directory) as it prints. Without a GPU it runs
on the CPU with the kernels emulated at batch 1, which shows that it runs, not where a GPU's
time goes.
"""

from __future__ import annotations

import cProfile
import io
import os
import pstats
import sys
import time
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

import torch  # noqa: E402

import _cuda  # noqa: E402
from oplib.benchmark import REDNET50_SHAPES, clock  # noqa: E402

MIN_RUN_TIME = 0.05  # the layer stage's reading (bench/_cuda.Plan.layer_min_run_time)


def main() -> int:
    gpu = torch.cuda.is_available()
    target = _cuda.Target.cuda() if gpu else _cuda.Target.dry()
    target.load_kernels()
    device = "cuda" if gpu else "cpu"
    sync = torch.cuda.synchronize if gpu else (lambda: None)
    shape = replace(REDNET50_SHAPES[0], batch=_cuda.BATCH if gpu else 1)
    with open(Path(os.environ.get("OUT", ".")) / "phases.txt", "w") as log:

        def say(line: str) -> None:
            print(line, flush=True)
            print(line, file=log, flush=True)

        say(f"{target.name}, {shape.name}, batch {shape.batch}, readings of {MIN_RUN_TIME} s")
        for dtype, layout in _cuda.LAYER_PRECISIONS:
            began = time.perf_counter()
            stmts = _cuda.layer_stmts(shape, getattr(torch, dtype), layout, device)
            say(f"{dtype} {layout}: layers built in {time.perf_counter() - began:.2f} s")
            for key, stmt in stmts.items():
                calls = []
                for _ in range(2):
                    began = time.perf_counter()
                    stmt.run()
                    sync()
                    calls.append(time.perf_counter() - began)
                profile = cProfile.Profile()
                began = time.perf_counter()
                profile.enable()
                read = clock(stmt, device, MIN_RUN_TIME)
                profile.disable()
                capture = time.perf_counter() - began
                readings = []
                for _ in range(2):
                    began = time.perf_counter()
                    value = read()
                    readings.append(time.perf_counter() - began)
                say(f"  {key}: first call {calls[0]:.3f} s, second {calls[1]:.4f} s, clock (capture) {capture:.2f} s, "
                    f"readings {readings[0]:.2f} s / {readings[1]:.2f} s ({value * 1e3:.3f} ms a call)")
                if capture > 0.5:
                    text = io.StringIO()
                    pstats.Stats(profile, stream=text).sort_stats("cumulative").print_stats(12)
                    say(text.getvalue())
    return 0


if __name__ == "__main__":
    sys.exit(main())
