"""Test helpers for the native CPU kernels (``oplib.kernels.native``)."""

from __future__ import annotations

from collections.abc import Sequence
from types import ModuleType

from ..kernels import native


def require_native_build() -> None:
    """Skip the calling test where no compiler can build the native CPU kernels."""
    import pytest

    missing = native._missing_tool()
    if missing is not None:
        pytest.skip(f"the native CPU kernels cannot be built here: {missing}")


def force_native(monkeypatch, small_maps: bool = False) -> None:
    """Route involution's CPU kernels through the native build for the rest of a test (pytest's
    ``monkeypatch`` undoes it), or skip the test where they cannot be built. The fused ops run
    their own kernels at every size unless ``small_maps``, which keeps the small-map route
    (``SMALL_MAP_PIXELS``) that the ops take by default."""
    from ..kernels.involution import cpu

    require_native_build()
    monkeypatch.setenv(native.ENV, "native")
    if not small_maps:
        monkeypatch.setattr(cpu, "SMALL_MAP_PIXELS", dict.fromkeys(cpu.SMALL_MAP_PIXELS, (0, 0)))


def check_module(module: ModuleType, random_geometries: int = 15, seed: int = 0, first: Sequence[str] = ()) -> int:
    """Every entry point of a built native module against the float64 reference: every
    registry sample of the five ops in every dtype, ``random_geometries`` random geometries per
    op and dtype, and hand-picked geometries that reach the unrolled windows with whole
    vectors of channels and of generated columns. Raises on the first mismatch; returns the
    number of calls checked. The sanitized, clang, AVX2-only and baseline builds run it.
    ``first``: ops checked before the others (the same calls, in another order; the hand-picked
    geometries last either way), so that a run under AddressSanitizer over a planted bug reaches
    the op that holds it at once rather than after the rest, which it aborts then."""
    import random

    import torch

    from .. import registry
    from ..registry import SampleInput
    from .helpers import assert_matches_reference

    calls = {
        "involution": module.involution_forward,
        "involution_backward_input": module.involution_backward_input,
        "involution_backward_weight": module.involution_backward_weight,
    }
    generated_calls = {
        "involution_generated": module.involution_generated_forward,
        "involution_generated_backward_input": module.involution_generated_backward_input,
        "involution_generated_backward_generator": module.involution_generated_backward_generator,
    }
    count = 0
    every = {**calls, **generated_calls}
    unknown = set(first) - set(every)
    if unknown:
        raise ValueError(f"first: no entry point for {sorted(unknown)}; there are {sorted(every)}")
    ordered = [*first, *(name for name in every if name not in first)]
    for name, call in ((name, every[name]) for name in ordered):
        rng = random.Random(f"{seed}-{name}")  # an op's geometries whatever its place in the order
        spec = registry.get(name)
        for dtype in registry.FLOAT_DTYPES:
            samples = list(spec.sample_inputs("cpu", dtype, False))
            samples += [spec.random_sample(rng.randint, "cpu", dtype, False) for _ in range(random_geometries)]
            for sample in samples:
                assert_matches_reference(spec, sample, call(*sample.args), dtype)
                count += 1
    # The unrolled row windows with whole vectors of channels (the samples above have at
    # most 3 channels a group), at stride 1 and 2, rows ending inside a block.
    references = [registry.get(name).reference for name in calls]
    for (n, c, h, w, groups, kernel, stride), dtype in zip(
        [(2, 32, 9, 11, 2, 7, 1), (1, 16, 14, 13, 1, 7, 2), (2, 32, 5, 17, 1, 3, 2), (1, 48, 8, 8, 3, 5, 1),
         (2, 32, 7, 14, 2, 7, 1), (1, 16, 13, 28, 1, 3, 2)],
        [torch.float32, torch.float64, torch.bfloat16, torch.float32, torch.float32, torch.float64],
    ):
        params = ([stride] * 2, [kernel // 2] * 2, [1, 1])
        out = [(s + 2 * (kernel // 2) - kernel) // stride + 1 for s in (h, w)]
        x, g = torch.randn(n, c, h, w, dtype=dtype), torch.randn(n, c, *out, dtype=dtype)
        weight = torch.randn(n, groups, kernel, kernel, *out, dtype=dtype)
        args = [(x, weight, *params), (g, weight, [h, w], *params), (g, x, [kernel, kernel], *params, groups)]
        atol, rtol = registry.get("involution").tolerance(dtype)
        for index, (call, reference, arguments) in enumerate(zip(calls.values(), references, args)):
            expected = reference(*[a.double() if isinstance(a, torch.Tensor) else a for a in arguments])
            torch.testing.assert_close(call(*arguments).double(), expected, atol=atol, rtol=rtol)
            count += 1
            if index < 2:  # the forward and grad_input also write into a channels_last result given
                count += _check_into_channels_last(call, arguments, expected, atol, rtol)
            if index == 0:  # the pixel-major weight a channels_last span conv writes, read in place
                pixel_major = weight.permute(0, 4, 5, 1, 2, 3).contiguous().permute(0, 3, 4, 5, 1, 2)
                torch.testing.assert_close(call(x, pixel_major, *params).double(), expected, atol=atol, rtol=rtol)
                count += 1
    # The generated weights with whole vectors of channels and of generated columns: blocks
    # of several rows ending inside a vector, one row wider than a block, odd R.
    references = [registry.get(name).reference for name in generated_calls]
    for (n, c, h, w, groups, kernel, stride, reduced), dtype in zip(
        [(2, 32, 9, 11, 2, 7, 1, 12), (1, 16, 14, 13, 1, 7, 2, 20), (1, 48, 8, 70, 3, 5, 1, 7), (2, 16, 7, 7, 1, 3, 1, 5)],
        [torch.float32, torch.float64, torch.bfloat16, torch.float16],
    ):
        params = ([kernel] * 2, [stride] * 2, [kernel // 2] * 2, [1, 1])
        out = [(s + 2 * (kernel // 2) - kernel) // stride + 1 for s in (h, w)]
        x, g = torch.randn(n, c, h, w, dtype=dtype), torch.randn(n, c, *out, dtype=dtype)
        feature = torch.randn(n, reduced, *out, dtype=dtype)
        span, bias = torch.randn(groups * kernel * kernel, reduced, dtype=dtype), torch.randn(groups * kernel * kernel, dtype=dtype)
        args = [(x, feature, span, bias, *params), (g, feature, span, bias, [h, w], *params), (g, feature, span, x, *params)]
        atol, rtol = registry.get("involution").tolerance(dtype)
        for call, reference, arguments in zip(generated_calls.values(), references, args):
            expected = reference(*[a.double() if isinstance(a, torch.Tensor) else a for a in arguments])
            if isinstance(expected, tuple):  # the generator's gradients: sums over samples and pixels
                spec = registry.get("involution_generated_backward_generator")
                assert_matches_reference(spec, SampleInput(arguments, "whole-vectors"), call(*arguments), dtype)
                count += 1 + _check_generator_grads_into_channels_last(call, arguments, expected, spec, dtype)
                continue
            torch.testing.assert_close(call(*arguments).double(), expected, atol=atol, rtol=rtol)
            count += 1 + _check_into_channels_last(call, arguments, expected, atol, rtol)
    return count


def _check_generator_grads_into_channels_last(call, arguments, expected, spec, dtype) -> int:
    """The generator's gradient op writes into the tensors given: grad_feature channels_last,
    grad_span_weight transposed (written through a contiguous copy)."""
    import torch

    grad_feature = torch.empty(expected[0].shape, dtype=dtype).contiguous(memory_format=torch.channels_last)
    grad_span = torch.empty(expected[1].shape[::-1], dtype=dtype).t()
    grad_bias = torch.empty(expected[2].shape, dtype=dtype)
    result = call(*arguments, grad_feature, grad_span, grad_bias)
    assert result[0] is grad_feature and result[1] is grad_span and result[2] is grad_bias
    atol, rtol = spec.tolerance(dtype)
    for got, want in zip(result, expected):
        torch.testing.assert_close(got.double(), want, atol=atol, rtol=rtol)
    return 1


def _check_into_channels_last(call, arguments, expected, atol: float, rtol: float) -> int:
    """call(*arguments, out=a channels_last tensor) writes the expected values into it."""
    import torch

    out = torch.empty(expected.shape, dtype=arguments[0].dtype).contiguous(memory_format=torch.channels_last)
    assert call(*arguments, out=out) is out
    torch.testing.assert_close(out.double(), expected, atol=atol, rtol=rtol)
    return 1
