"""The checks of one op on one device that both runners share: ``python -m oplib``'s
self-check (``oplib.selfcheck``) and the generated pytest class (``oplib.testing.generated``).
Each raises on failure and ``NotApplicable`` where it does not apply. Kept apart from both
runners so that neither imports the other."""

from __future__ import annotations

import io

import torch

from .. import _torch_private as private
from ..registry import OpSpec, cast_sample
from .helpers import OpCall, assert_matches_reference, like_result, outputs, tensor_args


class NotApplicable(Exception):
    """Raised by a check that does not apply to an (op, device); its message says why."""


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
    from .toolchain import missing_inductor_compiler

    if device == "cpu" and missing_inductor_compiler() is not None:
        raise NotApplicable(missing_inductor_compiler())
    for sample in list(spec.sample_inputs(device, torch.float32, True))[samples]:
        torch.compiler.reset()
        compiled = torch.compile(spec.op, fullgraph=True)
        eager = cast_sample(sample, torch.float32)
        for dim in range(sample.args[0].dim()):
            private.maybe_mark_dynamic(sample.args[0], dim)
        out, expected = compiled(*sample.args), spec.op(*eager.args)
        torch.testing.assert_close(out, expected, msg=lambda m: f"{sample.name}: {m}")
        for got, want in zip(outputs(out), outputs(expected)):
            assert got.stride() == want.stride() or got.numel() == 0, f"{sample.name}: strides differ"
        positions = tensor_args(sample)
        grad = like_result(expected, torch.randn_like)
        got = torch.autograd.grad(out, [sample.args[i] for i in positions], grad)
        want = torch.autograd.grad(expected, [eager.args[i] for i in positions], grad)
        torch.testing.assert_close(got, want, msg=lambda m: f"{sample.name} (gradients): {m}")
    torch.compiler.reset()


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
    from ..kernels.cuda_launch import CUDA_DISPATCH

    dispatch = CUDA_DISPATCH.get(spec.qualname)
    if dispatch is None:
        raise NotApplicable("no CUDA kernels of its own (the CUDA path is torch's)")
    if device != "cpu":
        raise NotApplicable("the eager check runs the real CUDA kernels here")
    from .cuda_emulation import EmulatedLauncher
    from .toolchain import missing_host_compiler

    if missing_host_compiler() is not None:
        raise NotApplicable(missing_host_compiler())
    launcher = EmulatedLauncher()
    for dtype in (torch.float64, torch.float32):
        for sample in spec.sample_inputs("cpu", dtype, False):
            assert_matches_reference(spec, sample, dispatch(*sample.args, launcher), dtype)
