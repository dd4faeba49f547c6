"""The two plain-PyTorch CPU strategies of involution (dense matrices on small maps, tap passes
on larger ones) and the native kernels, each checked against the float64 reference on the
same inputs, whichever the size rule would pick, with finite and with non-finite values; and
each deterministic."""

import random

import pytest
import torch

from oplib import registry
from oplib.kernels import native
from oplib.kernels.involution import cpu as involution_cpu
from oplib.kernels.involution.pytorch import dense_map, taps
from oplib.kernels.involution.pytorch.geometry import Geometry
from oplib.kernels.involution.layouts import is_channels_last, is_pixel_major
from oplib.ops._common import window_output_size
from oplib.testing.native import force_native

# DENSE_MAP_MAX_PIXELS_PER_TAP forcing each strategy, and each once more with slices of one
# item each (the test tensors otherwise fit in one slice); "native": the C++ kernels.
STRATEGIES = {"dense-map": 10**9, "dense-map-sliced": 10**9, "taps": 0, "taps-sliced": 0, "native": None}


def _force(monkeypatch, strategy):
    if strategy == "native":
        force_native(monkeypatch)
        return
    monkeypatch.setenv(native.ENV, "pytorch")
    monkeypatch.setattr(involution_cpu, "DENSE_MAP_MAX_PIXELS_PER_TAP", STRATEGIES[strategy])
    if strategy.endswith("-sliced"):
        for module, constant in ((dense_map, "CHUNK_BYTES"), (taps, "CHUNK_BYTES"), (taps, "WEIGHT_GRAD_CHUNK_BYTES")):
            monkeypatch.setattr(module, constant, 1)


def _check_three_ops(x, w, g, groups, params, same=torch.testing.assert_close, reference_inputs=None):
    """Each of the three CPU kernels against its float64 reference on (x, w, g) (or on
    reference_inputs); each result in the layout the fake kernels promise."""
    size, kernel = list(x.shape[2:]), list(w.shape[2:4])
    rx, rw, rg = reference_inputs or (x, w, g)
    results = (
        (torch.ops.oplib.involution(x, w, *params), registry.get("involution").reference(rx, rw, *params)),
        (
            torch.ops.oplib.involution_backward_input(g, w, size, *params),
            registry.get("involution_backward_input").reference(rg, rw, size, *params),
        ),
        (
            torch.ops.oplib.involution_backward_weight(g, x, kernel, *params, groups),
            registry.get("involution_backward_weight").reference(rg, rx, kernel, *params, groups),
        ),
    )
    for actual, expected in results:
        same(actual, expected)
    out, grad_input, grad_weight = (actual for actual, _ in results)
    assert out.is_contiguous(memory_format=torch.channels_last if is_channels_last(x) else torch.contiguous_format)
    assert grad_input.is_contiguous(memory_format=torch.channels_last if is_channels_last(g) else torch.contiguous_format)
    assert is_pixel_major(grad_weight) if is_channels_last(x) else grad_weight.is_contiguous()


def _random_cases(count: int, seed: int):
    rng = random.Random(seed)
    cases = []
    while len(cases) < count:
        kernel = (rng.randint(1, 5), rng.randint(1, 5))
        stride, dilation = (rng.randint(1, 3), rng.randint(1, 3)), (rng.randint(1, 2), rng.randint(1, 2))
        padding = (rng.randint(0, 3), rng.randint(0, 3))
        size = (rng.randint(1, 13), rng.randint(1, 13))
        if any(size[i] + 2 * padding[i] < dilation[i] * (kernel[i] - 1) + 1 for i in range(2)):
            continue
        groups = rng.choice([1, 2, 3])
        cases.append((rng.randint(0, 2), groups * rng.randint(1, 3), size, groups, kernel, stride, padding, dilation))
    return cases


# Sizes that are multiples of the stride, with outputs no bigger than a phase: the taps split
# the image into phases with one permuting copy (TapLayout.fills_blocks).
PHASE_GATHER_CASES = [
    (2, 6, (12, 12), 2, (3, 3), (2, 2), (1, 1), (1, 1)),
    (1, 4, (12, 9), 2, (5, 3), (2, 3), (2, 1), (1, 2)),
    (3, 3, (6, 8), 3, (7, 3), (3, 2), (3, 1), (1, 1)),
    (0, 4, (8, 8), 2, (3, 3), (2, 2), (1, 1), (1, 1)),
]


# RedNet-50's geometries (7x7 kernels, padding 3) at a small batch and width: the random
# cases above stay below 14 pixels.
REDNET_CASES = [
    (2, 4, (size, size), 2, (7, 7), (stride, stride), (3, 3), (1, 1))
    for size, stride in [(7, 1), (14, 1), (28, 1), (14, 2), (28, 2), (56, 2)]
]


def _row_window_cases(count: int, seed: int):
    """Random geometries of the native kernels' unrolled paths: kernel widths 3, 5, 7 at row
    strides 1 and 2 without row dilation, with any kernel height, row stride, dilation and
    padding down the columns, and groups of 8, 16 or 32 channels (whole vectors of channels
    in float64 and float32); sizes up to 23, so that rows end inside a block and blocks span
    the padding."""
    rng = random.Random(seed)
    cases = []
    while len(cases) < count:
        kernel = (rng.randint(1, 7), rng.choice([3, 5, 7]))
        stride, dilation = (rng.randint(1, 3), rng.choice([1, 2])), (rng.randint(1, 2), 1)
        padding = (rng.randint(0, 3), rng.randint(0, 4))
        size = (rng.randint(1, 17), rng.randint(1, 23))
        if any(size[i] + 2 * padding[i] < dilation[i] * (kernel[i] - 1) + 1 for i in range(2)):
            continue
        groups = rng.choice([1, 2])
        cases.append((rng.randint(0, 2), groups * rng.choice([8, 16, 32]), size, groups, kernel, stride, padding, dilation))
    return cases


ROW_WINDOW_CASES = _row_window_cases(24, seed=5)


# Found by a randomized review of a strategy since dropped (the row bands), and edge cases for
# any strategy: one-pixel-wide images under dilated kernels, and one-row kernels.
EDGE_CASES = [
    (1, 1, (5, 1), 1, (2, 1), (1, 1), (0, 0), (3, 1)),
    (2, 6, (7, 21), 3, (3, 1), (2, 4), (0, 3), (3, 1)),
    (2, 1, (5, 1), 1, (1, 1), (1, 1), (2, 1), (1, 1)),
]


@pytest.mark.parametrize("strategy", STRATEGIES)
@pytest.mark.parametrize(
    "case",
    _random_cases(40, seed=3) + PHASE_GATHER_CASES + REDNET_CASES + EDGE_CASES + ROW_WINDOW_CASES,
    ids=lambda case: f"{case}",
)
def test_strategy_matches_reference(monkeypatch, strategy, case):
    _force(monkeypatch, strategy)
    n, channels, size, groups, kernel, stride, padding, dilation = case
    out_size = window_output_size(size, kernel, stride, padding, dilation)
    x = torch.randn(n, channels, *size, dtype=torch.float64)
    w = torch.randn(n, groups, *kernel, *out_size, dtype=torch.float64)
    g = torch.randn(n, channels, *out_size, dtype=torch.float64)
    params = (stride, padding, dilation)
    if strategy != "native":
        expected = "dense" if strategy.startswith("dense") else "taps"
        assert involution_cpu.strategy_name(size, w.shape, *params) == expected
    if case in PHASE_GATHER_CASES and strategy != "native":
        layout = involution_cpu.TapLayout(Geometry(size, kernel, out_size, stride, padding, dilation))
        assert layout.fills_blocks and layout.phases > 1
    _check_three_ops(x, w, g, groups, params)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("layout", ["contiguous", "channels_last"])
def test_native_row_windows_in_every_dtype(monkeypatch, dtype, layout):
    """The unrolled paths with whole vectors of channels in float32 (16 lanes where the CPU
    has AVX-512), and 16-bit operands accumulated in float32, against the float64 reference
    within the registry's tolerance of the dtype; channels_last operands read in place."""
    force_native(monkeypatch)
    atol, rtol = registry.get("involution").tolerance(dtype)
    for n, channels, size, groups, kernel, stride, padding, dilation in ROW_WINDOW_CASES[:12]:
        params = (stride, padding, dilation)
        out_size = window_output_size(size, kernel, *params)
        x, g = torch.randn(n, channels, *size).to(dtype), torch.randn(n, channels, *out_size).to(dtype)
        w = torch.randn(n, groups, *kernel, *out_size).to(dtype)
        if layout == "channels_last":
            x, g = x.to(memory_format=torch.channels_last), g.to(memory_format=torch.channels_last)

        def same(actual, expected):
            assert actual.dtype == dtype
            torch.testing.assert_close(actual.double(), expected, atol=atol, rtol=rtol)

        _check_three_ops(x, w, g, groups, params, same, reference_inputs=(x.double(), w.double(), g.double()))


NON_FINITE_PLACES = {
    # Where one inf or nan goes: each can meet a zero that the padded formulation never
    # multiplies it by (a wrapped-around read, or an empty entry of the dense matrix).
    "input corner": ("input", (0, 1, 0, 0)),
    "input right edge": ("input", (1, 2, 5, 9)),
    "input interior": ("input", (0, 0, 4, 4)),
    "weight on padding": ("weight", (0, 1, 0, 0, 0, 0)),
    "weight inside": ("weight", (1, 0, 1, 1, 3, 3)),
    "grad_output edge": ("grad_output", (1, 3, 0, 4)),
}


@pytest.mark.parametrize("strategy", STRATEGIES)
@pytest.mark.parametrize("value", [float("inf"), float("nan")], ids=["inf", "nan"])
@pytest.mark.parametrize("place", NON_FINITE_PLACES)
@pytest.mark.parametrize("stride", [1, 2])
def test_non_finite_values_propagate_as_in_the_reference(monkeypatch, strategy, value, place, stride):
    _force(monkeypatch, strategy)
    size, kernel, padding = (10, 10), (3, 3), (1, 1)
    params = ((stride, stride), padding, (1, 1))
    out_size = window_output_size(size, kernel, *params)
    tensors = {
        "input": torch.randn(2, 4, *size, dtype=torch.float64),
        "weight": torch.randn(2, 2, *kernel, *out_size, dtype=torch.float64),
        "grad_output": torch.randn(2, 4, *out_size, dtype=torch.float64),
    }
    name, index = NON_FINITE_PLACES[place]
    tensors[name][index] = value
    x, w, g = tensors["input"], tensors["weight"], tensors["grad_output"]

    def same(actual, expected):
        torch.testing.assert_close(actual, expected, equal_nan=True)
        assert torch.equal(actual.isnan(), expected.isnan()) and torch.equal(actual.isinf(), expected.isinf())

    _check_three_ops(x, w, g, 2, params, same)


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_strategy_is_deterministic(monkeypatch, strategy):
    _force(monkeypatch, strategy)
    torch.set_num_threads(2)
    try:
        x = torch.randn(4, 32, 12, 12)
        w = torch.randn(4, 2, 5, 5, 12, 12)
        g = torch.randn(4, 32, 12, 12)
        params = ((1, 1), (2, 2), (1, 1))
        runs = [
            (
                torch.ops.oplib.involution(x, w, *params),
                torch.ops.oplib.involution_backward_input(g, w, [12, 12], *params),
                torch.ops.oplib.involution_backward_weight(g, x, [5, 5], *params, 2),
            )
            for _ in range(3)
        ]
    finally:
        torch.set_num_threads(1)
    for run in runs[1:]:
        for first, again in zip(runs[0], run):
            assert torch.equal(first, again)


def test_rednet_shapes_pick_the_expected_strategy():
    # 7x7 kernels, padding 3: the 7x7 stage and the stride-2 14x14 -> 7x7 involution use the
    # dense matrices, the larger maps the taps.
    def picked(size, stride):
        out = (size - 1) // stride + 1
        return involution_cpu.strategy_name((size, size), (8, 4, 7, 7, out, out), (stride,) * 2, (3, 3), (1, 1))

    assert picked(7, 1) == picked(14, 2) == "dense"
    assert picked(14, 1) == picked(28, 2) == picked(28, 1) == picked(56, 1) == picked(56, 2) == "taps"
