"""The self-check behind ``python -m oplib``: every registered op on every available
device, against its reference, through opcheck, torch.compile and a torch.export round
trip, and, for ops with CUDA kernels, those kernels' installed sources compiled for the host
and run on CPU. A user on a new machine runs it to know oplib works there."""

from __future__ import annotations

import io
import time
import traceback
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import torch

from .registry import OpSpec, cast_sample
from .testing import OpCall, assert_matches_reference, tensor_args


class NotApplicable(Exception):
    """Raised by a check that does not apply to an (op, device); its message says why."""


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


def check_eager(spec: OpSpec, device: str) -> None:
    for dtype in spec.dtypes[device]:
        for sample in spec.sample_inputs(device, dtype, False):
            assert_matches_reference(spec, sample, spec.op(*sample.args), dtype)


def check_gradients(spec: OpSpec, device: str) -> None:
    """gradcheck and gradgradcheck in float64, both in fast mode (random projections of the
    Jacobians); the test suite builds the full first-order Jacobians, and the full
    second-order ones where the spec does not ask for fast mode."""
    for sample in spec.sample_inputs(device, torch.float64, True):
        tolerance = dict(fast_mode=True, nondet_tol=spec.gradcheck_nondet_tol)
        torch.autograd.gradcheck(spec.op, sample.args, **tolerance)
        torch.autograd.gradgradcheck(spec.op, sample.args, **tolerance)


def check_opcheck(spec: OpSpec, device: str) -> None:
    for sample in spec.sample_inputs(device, torch.float64, True):
        torch.library.opcheck(spec.op, sample.args)


def check_compile(spec: OpSpec, device: str, samples: slice = slice(None)) -> None:
    """Each sample (or the ``samples`` slice of them) compiled with the sizes of its first
    argument dynamic (weights stay static, as parameters do under torch.compile): forward,
    strides and gradients match eager. Not applicable on a CPU without a C++ compiler, where
    torch.compile itself cannot generate code."""
    from .testing.toolchain import missing_inductor_compiler

    if device == "cpu" and missing_inductor_compiler() is not None:
        raise NotApplicable(missing_inductor_compiler())
    for sample in list(spec.sample_inputs(device, torch.float32, True))[samples]:
        torch._dynamo.reset()
        compiled = torch.compile(spec.op, fullgraph=True)
        eager = cast_sample(sample, torch.float32)
        for dim in range(sample.args[0].dim()):
            torch._dynamo.maybe_mark_dynamic(sample.args[0], dim)
        out, expected = compiled(*sample.args), spec.op(*eager.args)
        torch.testing.assert_close(out, expected, msg=lambda m: f"{sample.name}: {m}")
        assert out.stride() == expected.stride() or out.numel() == 0, f"{sample.name}: strides differ"
        positions = tensor_args(sample)
        grad = torch.randn_like(expected)
        got = torch.autograd.grad(out, [sample.args[i] for i in positions], grad)
        want = torch.autograd.grad(expected, [eager.args[i] for i in positions], grad)
        torch.testing.assert_close(got, want, msg=lambda m: f"{sample.name} (gradients): {m}")
    torch._dynamo.reset()


def check_export(spec: OpSpec, device: str, samples: slice = slice(None)) -> None:
    """Each sample (or the ``samples`` slice of them) exported, saved, loaded back and run:
    outputs equal eager."""
    for sample in list(spec.sample_inputs(device, torch.float32, False))[samples]:
        tensors = tuple(a for a in sample.args if isinstance(a, torch.Tensor))
        module = OpCall(spec.op, sample)
        buffer = io.BytesIO()
        torch.export.save(torch.export.export(module, tensors), buffer)
        buffer.seek(0)
        loaded = torch.export.load(buffer).module()
        torch.testing.assert_close(loaded(*tensors), module(*tensors), msg=lambda m: f"{sample.name}: {m}")


def check_cuda_sources(spec: OpSpec, device: str) -> None:
    """On CPU: the op's CUDA dispatch (allocation, argument order, launch configuration) runs
    its installed ``.cu`` source compiled for the host by the C++ compiler (oplib's host
    emulation), on every sample in float64 and float32, against the reference. On a GPU the
    eager check already runs the real kernels."""
    from .kernels import CUDA_DISPATCH

    dispatch = CUDA_DISPATCH.get(spec.qualname)
    if dispatch is None:
        raise NotApplicable("no CUDA kernels of its own (the CUDA path is torch's)")
    if device != "cpu":
        raise NotApplicable("the eager check runs the real CUDA kernels here")
    from .testing.cuda_emulation import EmulatedLauncher
    from .testing.toolchain import missing_host_compiler

    if missing_host_compiler() is not None:
        raise NotApplicable(missing_host_compiler())
    launcher = EmulatedLauncher()
    for dtype in (torch.float64, torch.float32):
        for sample in spec.sample_inputs("cpu", dtype, False):
            assert_matches_reference(spec, sample, dispatch(*sample.args, launcher), dtype)


CHECKS: dict[str, Callable[[OpSpec, str], None]] = {
    "eager vs reference": check_eager,
    "gradcheck": check_gradients,
    "opcheck": check_opcheck,
    "torch.compile": check_compile,
    "export round trip": check_export,
    "CUDA sources": check_cuda_sources,
}


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
