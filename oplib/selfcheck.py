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


def _wrap_schema(schema: str, width: int, indent: str) -> list[str]:
    """A schema over lines of at most ``width`` columns, broken after its arguments' commas,
    the continuation lines under the first argument."""
    name, _, rest = schema.partition("(")
    arguments, _, returns = rest.rpartition(") -> ")
    pieces = [*(f"{argument}, " for argument in arguments.split(", ")[:-1]), f"{arguments.split(', ')[-1]}) -> {returns}"]
    hang = indent + " " * (len(name) + 1)
    lines, line = [], f"{indent}{name}("
    for piece in pieces:
        if len(line) + len(piece.rstrip()) > width and line.strip() and not line.endswith("("):
            lines.append(line.rstrip())
            line = hang
        line += piece
    return [*lines, line.rstrip()]


def registry_listing(specs: Iterable[OpSpec], width: int = 100) -> str:
    """Each op in a few lines of at most ``width`` columns: its schema, the devices and dtypes
    it runs, and what it registers beside its kernels."""
    blocks = []
    for spec in specs:
        dtypes = sorted({str(d).removeprefix("torch.") for ds in spec.dtypes.values() for d in ds})
        registered = [name for name, flag in (("fake", spec.has_fake), ("autograd", spec.has_autograd),
                                              ("vmap", spec.has_vmap), ("flop formula", spec.has_flop_formula)) if flag]
        autocast = ", ".join(spec.autocast_devices()) or "none"
        blocks.append("\n".join([
            spec.name,
            *_wrap_schema(spec.schema, width, "  "),
            f"  devices: {', '.join(spec.devices)}; dtypes: {', '.join(dtypes)}",
            f"  registers: {', '.join(registered) or 'nothing'}; autocast kernels: {autocast}",
        ]))  # fmt: skip
    return "\n\n".join(blocks)
