"""The self-check behind ``python -m oplib``: every registered op on every available
device, against its reference, through opcheck, torch.compile and a torch.export round
trip, and, for ops with CUDA kernels, those kernels' installed sources compiled for the host
and run on CPU. A user on a new machine runs it to know oplib works there."""

from __future__ import annotations

import time
import traceback
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from .registry import OpSpec
from .testing.checks import (  # noqa: F401  (re-exported: the checks the self-check runs)
    NotApplicable,
    check_compile,
    check_cuda_sources,
    check_eager,
    check_export,
    check_gradients,
    check_opcheck,
)


CHECKS: dict[str, Callable[[OpSpec, str], None]] = {
    "eager vs reference": check_eager,
    "gradcheck": check_gradients,
    "opcheck": check_opcheck,
    "torch.compile": check_compile,
    "export round trip": check_export,
    "CUDA sources": check_cuda_sources,
}


@dataclass(frozen=True)
class CheckResult:
    op: str
    device: str
    check: str
    passed: bool
    seconds: float
    detail: str = ""
    applicable: bool = True

    @property
    def status(self) -> str:
        return "n/a" if not self.applicable else "pass" if self.passed else "FAIL"


def run(specs: Iterable[OpSpec], devices: Iterable[str], report: Callable[[CheckResult], None] = lambda r: None):
    """Run every check for every (spec, device); ``report`` sees each result as it comes."""
    results = []
    for spec in specs:
        for device in devices:
            if device not in spec.dtypes:
                continue
            for name, check in CHECKS.items():
                start = time.perf_counter()
                try:
                    check(spec, device)
                    result = CheckResult(spec.name, device, name, True, time.perf_counter() - start)
                except NotApplicable as reason:
                    result = CheckResult(spec.name, device, name, True, time.perf_counter() - start, str(reason), False)
                except Exception:  # noqa: BLE001  (a failing check is reported, not raised)
                    result = CheckResult(
                        spec.name, device, name, False, time.perf_counter() - start, traceback.format_exc()
                    )
                report(result)
                results.append(result)
    return results


def format_table(headers: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(str(x)) for x in column) for column in zip(headers, *rows)]
    line = lambda cells: "  ".join(str(c).ljust(w) for c, w in zip(cells, widths)).rstrip()  # noqa: E731
    return "\n".join([line(headers), line(["-" * w for w in widths]), *(line(r) for r in rows)])


def registry_table(specs: Iterable[OpSpec]) -> str:
    yes = lambda flag: "yes" if flag else "no"  # noqa: E731
    rows = []
    for spec in specs:
        dtypes = sorted({str(d).removeprefix("torch.") for ds in spec.dtypes.values() for d in ds})
        rows.append(
            [
                spec.name,
                spec.schema,
                ",".join(spec.devices),
                ",".join(dtypes),
                yes(spec.has_fake),
                yes(spec.has_autograd),
                yes(spec.has_vmap),
                ",".join(spec.autocast_devices()) or "-",
                yes(spec.has_flop_formula),
            ]
        )
    headers = ["op", "schema", "devices", "dtypes", "fake", "autograd", "vmap", "autocast kernel", "flops"]
    return format_table(headers, rows)


def results_matrix(results: list[CheckResult]) -> str:
    rows, index = [], {}
    for r in results:
        key = (r.op, r.device)
        if key not in index:
            index[key] = len(rows)
            rows.append([r.op, r.device] + [""] * len(CHECKS))
        column = 2 + list(CHECKS).index(r.check)
        rows[index[key]][column] = "n/a" if not r.applicable else f"{r.status} {r.seconds:5.1f}s"
    return format_table(["op", "device", *CHECKS], rows)
