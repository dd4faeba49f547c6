"""The helpers the test modules and the generated checks share: pytest parametrisation over
specs, comparison against the float64 reference, sample layout classes, BatchNorm statistics
for exported models, and a module that calls one op. ``oplib.testing`` hands them on; the
modules of this package import them from here, not from the package (whose ``__init__``
imports ``generated`` on first use: importing back from it would be a loop)."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Optional

import torch
from torch import Tensor

from .. import registry
from ..registry import OpSpec, SampleInput


def _pytest():
    """pytest, which the parametrisation helpers need and oplib does not install (the
    ``testing`` extra does)."""
    from .._extras import require

    return require("pytest", "testing", "oplib.testing's pytest parametrisation")


def cpu_and_cuda():
    """("cpu", cuda marked ``needs_cuda``): oplib's pytest plugin skips the mark where there is no GPU."""
    pytest = _pytest()

    return ("cpu", pytest.param("cuda", marks=pytest.mark.needs_cuda))


def spec_params(specs: Optional[Iterable[OpSpec]] = None):
    """One pytest param per (spec, device)."""
    pytest = _pytest()

    params = []
    for spec in specs if specs is not None else registry.all_specs():
        for device in spec.devices:
            marks = [pytest.mark.needs_cuda] if device == "cuda" else []
            params.append(pytest.param(spec, device, id=f"{spec.name}-{device}", marks=marks))
    return params


def spec_dtype_params(specs: Optional[Iterable[OpSpec]] = None, dtypes: Optional[Iterable[torch.dtype]] = None):
    """One pytest param per (spec, device, dtype) the spec supports, optionally only ``dtypes``."""
    pytest = _pytest()

    params = []
    for spec in specs if specs is not None else registry.all_specs():
        for device, supported in spec.dtypes.items():
            marks = [pytest.mark.needs_cuda] if device == "cuda" else []
            for dtype in supported:
                if dtypes is None or dtype in dtypes:
                    name = f"{spec.name}-{device}-{str(dtype).removeprefix('torch.')}"
                    params.append(pytest.param(spec, device, dtype, id=name, marks=marks))
    return params


def reference_output(spec: OpSpec, sample: SampleInput) -> Tensor:
    """The float64 reference output for ``sample`` (inputs cast to float64, not re-drawn)."""
    with torch.no_grad():
        return spec.reference(*registry.cast_sample(sample, torch.float64, requires_grad=False).args)


def outputs(result) -> tuple[Tensor, ...]:
    """An op's result as a tuple of tensors (one for a single-output op)."""
    return tuple(result) if isinstance(result, (tuple, list)) else (result,)


def shaped_like(values: Iterable[Tensor], result):
    """``values``, one per output, in ``result``'s structure (a tensor or a tuple)."""
    values = tuple(values)
    return values if isinstance(result, (tuple, list)) else values[0]


def like_result(result, make: Callable[[Tensor], Tensor]):
    """``make`` applied to each output, in the result's structure (a tensor or a tuple)."""
    return shaped_like((make(t) for t in outputs(result)), result)


def assert_matches_reference(spec: OpSpec, sample: SampleInput, out, dtype: torch.dtype) -> None:
    """``out`` (a tensor, or a tuple of them for an op of several outputs) has ``dtype`` and
    matches the float64 reference within ``dtype``'s tolerance."""
    expected = outputs(reference_output(spec, sample))
    atol, rtol = spec.tolerance(dtype)
    got = outputs(out)
    assert len(got) == len(expected), f"{spec.name}[{sample.name}]: {len(got)} outputs, the reference has {len(expected)}"
    for k, (value, want) in enumerate(zip(got, expected)):
        which = f" output {k}" if len(got) > 1 else ""
        assert value.dtype == dtype, f"{spec.name}[{sample.name}]{which}: output dtype {value.dtype}, expected {dtype}"
        torch.testing.assert_close(
            value.detach().double(), want, atol=atol, rtol=rtol, msg=lambda m: f"{spec.name}[{sample.name}]{which}: {m}"
        )


def layout_class(sample: SampleInput) -> tuple:
    """What tells two samples apart for opcheck and tracing: per tensor argument, its number
    of dimensions, whether it is empty, and its memory layout (contiguous, channels_last or
    other strides)."""

    def layout(t: Tensor) -> str:
        if t.is_contiguous():
            return "contiguous"
        return "channels_last" if t.dim() == 4 and t.is_contiguous(memory_format=torch.channels_last) else "strided"

    return tuple((a.dim(), a.numel() == 0, layout(a)) for a in sample.args if isinstance(a, Tensor))


def representative_samples(samples: Iterable[SampleInput]) -> list[SampleInput]:
    """The first sample of each ``layout_class``, in order."""
    seen, picked = set(), []
    for sample in samples:
        key = layout_class(sample)
        if key not in seen:
            seen.add(key)
            picked.append(sample)
    return picked


def tensor_args(sample: SampleInput) -> list[int]:
    """Positions of the tensor arguments of a sample."""
    return [i for i, a in enumerate(sample.args) if isinstance(a, Tensor)]


def with_batch_norm_statistics(model: torch.nn.Module, seed: int = 1) -> torch.nn.Module:
    """``model`` with random running statistics and affine parameters in every BatchNorm,
    in place. A fresh RedNet's residual branches end in a BatchNorm of scale 0, so in eval
    mode each block computes its shortcut alone and an export that got a block's involution
    wrong would still match eager; with these, every layer shows in the outputs."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, (torch.nn.BatchNorm1d, torch.nn.BatchNorm2d, torch.nn.BatchNorm3d, torch.nn.SyncBatchNorm)):
                module.running_mean.normal_(0, 0.1, generator=generator)
                module.running_var.uniform_(0.5, 1.5, generator=generator)
                module.bias.normal_(0, 0.1, generator=generator)
                # Scales well below 1: involution's kernels are generated from its input, so
                # activations grow quadratically through the blocks with scales near 1.
                module.weight.uniform_(0.1, 0.3, generator=generator)
    return model


class OpCall(torch.nn.Module):
    """A module calling ``op`` on a sample: its tensors are the forward's inputs, its other
    arguments constants. Used to export one op call."""

    def __init__(self, op, sample: SampleInput):
        super().__init__()
        self.op, self.args = op, sample.args

    def forward(self, *tensors: Tensor) -> Tensor:
        it = iter(tensors)
        return self.op(*(next(it) if isinstance(a, Tensor) else a for a in self.args))
