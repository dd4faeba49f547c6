"""dense_window.cu's involution_generated_dense_window (a small map's (sample, group) a block:
the weights formed on tensor cores, the window written as a dense matrix and the aggregation
one tensor-core product) and its grad_input (the matrix's transpose times grad_output) on the
host emulation: against the float64 reference on the registry's samples, small maps of every
kind and random geometries, in float16 and bfloat16, both layouts and every thread order; the
same bits whatever the layout and the order; inf and nan where torch puts them; under
AddressSanitizer; and planted bugs that each check must catch."""

from __future__ import annotations

import random

import pytest
import torch

from oplib import registry
from oplib.kernels import KernelSource
from oplib.kernels.involution import cuda as involution_cuda
from oplib.kernels.involution.layouts import result_like
from oplib.testing.cuda_emulation import INTERLEAVED, ORDERS, EmulatedLauncher
from oplib.testing.toolchain import require_host_compiler

from cuda_test_helpers import _planted, assert_asan_catches, assert_clean_under_asan, random_samples
from test_cuda_generated_mma import (GENERATED, NON_FINITE_PLACES, PlantedBug, assert_non_finite_as_expected,
                                     check_against_reference, float64_reference, with_one_non_finite)
from test_cuda_generated_mma_grad_input import NON_FINITE_PLACES as GRAD_NON_FINITE_PLACES
from test_cuda_generated_mma_grad_input import _caught, grad_input_arguments
from test_cuda_tiles import TileCase

KERNEL = "involution_generated_dense_window"
DTYPES = involution_cuda.DENSE_WINDOW_DTYPES
GRAD_INPUT = registry.get("involution_generated_backward_input")


def _source() -> KernelSource:
    return involution_cuda.load_source(involution_cuda.DENSE_WINDOW_SOURCE)


def _result(args: tuple, launcher, _unused=None):
    out = result_like(args[0], args[1].shape[2:])
    return involution_cuda.involution_generated_dense_window(*args, out, launcher), out


def _check(args: tuple, launcher, name: str) -> bool:
    """The kernel's output against the op's float64 reference; False where it declines."""
    return check_against_reference(GENERATED, _result, args, launcher, name)


def _declines_only_what_it_cannot_hold(args: tuple) -> bool:
    """A dtype without the tensor-core product, or a map, a window or an R past the kernel's limits."""
    c = _source().constants
    (height, width), (out_h, out_w) = args[0].shape[2:], args[1].shape[2:]
    return (args[0].dtype not in DTYPES or out_h * out_w > c["DENSE_PIXELS"] or height * width > c["DENSE_INPUTS"]
            or args[4][0] * args[4][1] > c["DENSE_TAPS"] or args[1].shape[1] > c["DENSE_REDUCED"])


def _strided(args: tuple, feature_only: bool = False, aligned: bool = False) -> tuple:
    """The same values in views of larger tensors whose rows are not contiguous with each other
    (layouts kept): the input and the feature a column and a channel into theirs, or
    (``feature_only``) the feature alone, which leaves a channels_last input channels_last; or
    (``aligned``) 8 columns and no channel in, every pixel's first still 16-byte aligned."""
    def view(t: torch.Tensor) -> torch.Tensor:
        n, c, h, w = t.shape
        last = t.stride(1) == 1 and c > 1
        skip_c, skip_w = (0, 8) if aligned else (1, 1)
        big = torch.zeros(n, c + skip_c, h, w + 2 * skip_w + 1, dtype=t.dtype)
        big = big.contiguous(memory_format=torch.channels_last) if last else big
        big[:, skip_c:, :, skip_w:w + skip_w] = t
        return big[:, skip_c:, :, skip_w:w + skip_w]

    return (args[0] if feature_only else view(args[0]), view(args[1]), *args[2:])


# Small maps of every kind: RedNet-50's last stage at strides 1 and 2 (7 x 7 maps, 16 channels a
# group), three channel passes of a group (the last partial), R at its largest (eight k-steps) and
# an odd one, a rectangular dilated window at unequal strides, the largest map (8 x 8 out of 16 x
# 16 at stride 2), a 1 x 1 map, 3 x 3 at stride 3 past the edges.
DENSE_CASES = (
    TileCase(batch=2, channels=32, groups=2, reduced=24, size=(7, 7), kernel_size=(7, 7), stride=(1, 1),
             padding=(3, 3), dilation=(1, 1), channels_last=True),
    TileCase(batch=1, channels=48, groups=3, reduced=41, size=(14, 14), kernel_size=(7, 7), stride=(2, 2),
             padding=(3, 3), dilation=(1, 1), channels_last=False),
    TileCase(batch=1, channels=80, groups=2, reduced=16, size=(7, 7), kernel_size=(7, 7), stride=(1, 1),
             padding=(3, 3), dilation=(1, 1), channels_last=False),
    TileCase(batch=1, channels=16, groups=1, reduced=128, size=(7, 7), kernel_size=(7, 7), stride=(1, 1),
             padding=(3, 3), dilation=(1, 1), channels_last=True),
    TileCase(batch=2, channels=40, groups=2, reduced=9, size=(6, 9), kernel_size=(3, 5), stride=(1, 2),
             padding=(1, 2), dilation=(2, 1), channels_last=True),
    TileCase(batch=1, channels=16, groups=1, reduced=16, size=(16, 16), kernel_size=(7, 7), stride=(2, 2),
             padding=(3, 3), dilation=(1, 1), channels_last=True),
    TileCase(batch=2, channels=8, groups=2, reduced=5, size=(1, 1), kernel_size=(3, 3), stride=(1, 1),
             padding=(1, 1), dilation=(1, 1), channels_last=False),
    TileCase(batch=1, channels=24, groups=3, reduced=8, size=(10, 11), kernel_size=(3, 3), stride=(3, 3),
             padding=(2, 2), dilation=(1, 1), channels_last=True),
)
# A tap's offset past 16 bits (a 1 x 1 map padded by 65537 rows: the second output pixel's second
# tap reads it), which the kernel's packed offsets cannot hold: declined.
FAR_TAP = TileCase(batch=1, channels=8, groups=2, reduced=5, size=(1, 1), kernel_size=(2, 1), stride=(65537, 1),
                   padding=(65537, 0), dilation=(65537, 1), channels_last=False)


def _check_samples_and_maps(spec, check, declines_only_what_it_cannot_hold, arguments, launcher, dtype) -> None:
    """``check`` on ``spec``'s samples (at least 3 served; the others past the kernel's limits)
    and on the small maps in both layouts (each forward case's arguments through ``arguments``)."""
    served = 0
    for sample in spec.sample_inputs("cpu", dtype, False):
        if check(sample.args, launcher, sample.name):
            served += 1
        else:
            assert declines_only_what_it_cannot_hold(sample.args), sample.name
    assert served >= 3
    for case in DENSE_CASES:
        for channels_last in (False, True):
            assert check(arguments(case._replace(channels_last=channels_last).arguments(dtype)), launcher,
                         f"{case.name}-{channels_last}")


@pytest.mark.parametrize("order", [ORDERS[0], *(pytest.param(o, marks=pytest.mark.integration)
                                                for o in (*ORDERS[1:], INTERLEAVED))])
@pytest.mark.parametrize("dtype", [torch.bfloat16, pytest.param(torch.float16, marks=pytest.mark.integration)],
                         ids=str)
def test_dense_window_matches_the_reference(dtype, order):
    """The registry's samples (channels_last and strided operands, odd sizes, rectangular
    windows, strides, dilations, no bias, an empty batch: it declines those past its limits),
    the small maps above in both layouts, and in views whose rows are not contiguous."""
    require_host_compiler()
    launcher = EmulatedLauncher(order=order)
    _check_samples_and_maps(GENERATED, _check, _declines_only_what_it_cannot_hold, tuple, launcher, dtype)
    for case in DENSE_CASES[:2]:
        args = case._replace(channels_last=True).arguments(dtype)
        for feature_only, aligned in ((False, False), (True, False), (True, True)):
            assert _check(_strided(args, feature_only, aligned), launcher, f"{case.name}-strided-{feature_only}-{aligned}")


def _random_small_cases(count: int, seed: int) -> list[TileCase]:
    """Windows of 1-7 rows and columns, strides 1-3, dilations 1-2 and paddings up to the
    window's reach, over maps whose output fits DENSE_PIXELS and input DENSE_INPUTS; channel
    counts a group that are and are not multiples of the 16-channel pass, R of 1-128, either
    layout."""
    c = _source().constants
    rng = random.Random(seed)
    cases = []
    while len(cases) < count:
        kernel = (rng.randint(1, 7), rng.randint(1, 7))
        if kernel[0] * kernel[1] > c["DENSE_TAPS"]:
            continue
        stride, dilation = (rng.randint(1, 3), rng.randint(1, 3)), (rng.randint(1, 2), rng.randint(1, 2))
        padding = tuple(rng.randint(0, d * (k - 1) // 2 + 1) for k, d in zip(kernel, dilation))
        size = (rng.randint(1, 16), rng.randint(1, 16))
        out = [(s + 2 * p - d * (k - 1) - 1) // st + 1 for s, p, d, k, st in zip(size, padding, dilation, kernel, stride)]
        if min(out) < 1 or out[0] * out[1] > c["DENSE_PIXELS"] or size[0] * size[1] > c["DENSE_INPUTS"]:
            continue
        groups = rng.randint(1, 3)
        cases.append(TileCase(batch=rng.randint(1, 2), channels=groups * rng.choice([1, 5, 16, 20, 33]), groups=groups,
                              reduced=rng.choice([1, 7, 16, 20, 64, 128]), size=size, kernel_size=kernel, stride=stride,
                              padding=padding, dilation=dilation, channels_last=rng.random() < 0.5))
    return cases


@pytest.mark.integration
@pytest.mark.parametrize("order", ORDERS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_dense_window_matches_the_reference_on_random_geometries(dtype, order):
    """The spec's random geometries (it declines those past its limits), then random small maps
    it serves."""
    require_host_compiler()
    launcher = EmulatedLauncher(order=order)
    for index, sample in enumerate(random_samples(GENERATED, dtype, 16, seed=211 + DTYPES.index(dtype))):
        if not _check(sample.args, launcher, f"random-{index}"):
            assert _declines_only_what_it_cannot_hold(sample.args), index
    for case in _random_small_cases(24, seed=223 + DTYPES.index(dtype)):
        assert _check(case.arguments(dtype), launcher, case.name), case.name


def test_every_layout_and_order_gives_the_same_bits():
    """Each output's sum takes the dense matrix's columns in one order, hi before lo, whatever
    the layout the operands are staged in and the threads' order: one result."""
    require_host_compiler()
    _assert_the_same_bits(_result, tuple)


def _assert_the_same_bits(result, arguments) -> None:
    """``result``'s output (the forward's arguments through ``arguments``) the same in both
    layouts and every thread order, at strides 1 and 2."""
    for case in DENSE_CASES[:2]:
        args = arguments(case.arguments(torch.bfloat16))
        results = []
        for channels_last in (False, True):
            memory_format = torch.channels_last if channels_last else torch.contiguous_format
            laid = (args[0].contiguous(memory_format=memory_format), args[1].contiguous(memory_format=memory_format),
                    *args[2:])
            results += [result(laid, EmulatedLauncher(order=order))[1].contiguous() for order in ORDERS]
        assert all(torch.equal(results[0], r) for r in results[1:]), case.name


def test_dense_window_declines_what_it_does_not_serve():
    """float32 and float64, a map of more output pixels than DENSE_PIXELS, no input pixel or more
    than DENSE_INPUTS, more taps than DENSE_TAPS, an R of 0 or past DENSE_REDUCED, a tap's offset
    past 16 bits (both kernels): None, out untouched.
    RedNet-50's last stage at batch 32 (7 x 7 maps out of 7 x 7 and 14 x 14, R = 128, 32 groups):
    a block a (group, sample), four an SM of the H200 at stride 1 and three at stride 2 (at the
    128 registers its launch bound allows)."""
    from oplib.testing import device_model

    source, config = _source(), involution_cuda.dense_window_config
    # (dtype, batch, groups, input size, output size, window, R, channels_last)
    for size, blocks in ((7, 4), (14, 3)):
        for last in (False, True):
            chosen = config(source, torch.bfloat16, 32, 32, (size, size), (7, 7), (7, 7), 128, last)
            assert chosen.grid == (32, 32, 1) and chosen.block == (32, 4, 1), (size, last)
            assert device_model.resident_blocks(128, 128, chosen.shared_bytes, device_model.H200) == blocks, (size, last)
    assert config(source, torch.bfloat16, 2, 4, (16, 16), (8, 8), (7, 7), 128, True) is not None
    assert config(source, torch.bfloat16, 2, 4, (16, 18), (8, 9), (7, 7), 16, True) is None  # 72 output pixels
    assert config(source, torch.bfloat16, 2, 4, (17, 16), (6, 6), (7, 7), 16, True) is None  # 272 input pixels
    assert config(source, torch.bfloat16, 2, 4, (8, 8), (8, 8), (9, 9), 16, True) is None  # 81 taps
    assert config(source, torch.bfloat16, 2, 4, (7, 7), (7, 7), (7, 7), 129, True) is None
    assert config(source, torch.bfloat16, 2, 4, (7, 7), (7, 7), (7, 7), 0, True) is None  # R = 0
    assert config(source, torch.bfloat16, 2, 4, (7, 0), (7, 2), (1, 3), 8, True) is None  # no input pixel
    assert config(source, torch.bfloat16, 2, 4, (7, 7), (7, 7), (7, 7), 8, True, dilation=(1, 10923)) is None
    assert config(source, torch.bfloat16, 2, 4, (7, 7), (7, 7), (7, 7), 8, True, dilation=(1, 10922)) is not None
    for function, arguments, out in ((involution_cuda.involution_generated_dense_window, FAR_TAP.arguments,
                                      torch.full((1, 8, 2, 1), 7.0, dtype=torch.bfloat16)),
                                     (involution_cuda.involution_generated_dense_window_backward_input,
                                      lambda dtype: grad_input_arguments(FAR_TAP.arguments(dtype)),
                                      torch.full((1, 8, 1, 1), 7.0, dtype=torch.bfloat16))):
        assert function(*arguments(torch.bfloat16), out, EmulatedLauncher()) is None
        assert bool((out == 7).all())
    assert config(source, torch.bfloat16, 65536, 4, (7, 7), (7, 7), (7, 7), 16, True) is None
    for dtype in (torch.float32, torch.float64):
        assert config(source, dtype, 2, 4, (7, 7), (7, 7), (7, 7), 16, True) is None
    args = DENSE_CASES[0].arguments(torch.float64)
    out = torch.full((2, 32, 7, 7), 7.0, dtype=torch.float64)
    assert involution_cuda.involution_generated_dense_window(*args, out, EmulatedLauncher()) is None
    assert bool((out == 7).all())


def test_the_staging_takes_vectors_only_where_they_are_aligned_rows():
    """16-byte vectors (VECTORS) where span_weight's rows are (R a multiple of 8) and, in
    channels_last, the feature's and the input's rows too (channels adjacent, every pixel's first
    aligned, a group's channels a multiple of 8; a feature whose rows are not contiguous with
    each other too); not a view from an odd channel, R = 41, 12 channels a group. NCHW's feature
    and input take pairs either way."""
    from oplib.testing.device_model import RecordingLauncher

    def specialisation(args) -> tuple:
        launcher = RecordingLauncher()
        _result(args, launcher)
        return launcher.launches[0].specialisation

    args = DENSE_CASES[0].arguments(torch.bfloat16)  # channels_last, 16 channels a group, R = 24
    assert specialisation(args) == ("true", "true")
    assert specialisation(DENSE_CASES[0]._replace(channels_last=False).arguments(torch.bfloat16)) == ("false", "true")
    assert specialisation(_strided(args)) == ("false", "true")  # (views: not channels_last)
    assert specialisation(_strided(args, feature_only=True)) == ("true", "false")
    assert specialisation(_strided(args, feature_only=True, aligned=True)) == ("true", "true")
    assert specialisation(DENSE_CASES[1]._replace(channels_last=True).arguments(torch.bfloat16)) == ("true", "false")
    assert specialisation(DENSE_CASES[1].arguments(torch.bfloat16)) == ("false", "false")
    assert specialisation(DENSE_CASES[0]._replace(channels=24).arguments(torch.bfloat16)) == ("true", "false")


def _assert_non_finite_as_torch(args: tuple, launcher, name: str) -> None:
    result, out = _result(args, launcher)
    assert result is out, name
    assert_non_finite_as_expected(out, float64_reference(GENERATED, args), GENERATED.tolerance(out.dtype), name)


@pytest.mark.parametrize("value", [float("inf"), pytest.param(float("nan"), marks=pytest.mark.integration)])
def test_non_finite_values_land_where_torch_puts_them(value):
    """An inf or a nan in the input, the feature or the bias: the dense matrix's zeros times it
    would put nans across the group's outputs, and a weight at a tap in the padding (none of the
    matrix) would be left out; a warp that meets one sums its outputs directly, so they land at
    torch's places. Strides 1 and 2, both layouts."""
    require_host_compiler()
    launcher = EmulatedLauncher()
    for case in DENSE_CASES[:2]:
        for channels_last in (False, True):
            args = case._replace(channels_last=channels_last).arguments(torch.bfloat16)
            for place, changed in with_one_non_finite(args, NON_FINITE_PLACES, value):
                _assert_non_finite_as_torch(changed, launcher, f"{case.name}-{channels_last}-{place}")


# ---------------------------------------------------------------------------------------
# Planted bugs
# ---------------------------------------------------------------------------------------

def _plant(monkeypatch, tmp_path, bug: PlantedBug) -> KernelSource:
    planted = _planted(tmp_path, involution_cuda.DENSE_WINDOW_SOURCE, bug.text, bug.bug)
    monkeypatch.setattr(involution_cuda, "load_source", lambda filename: planted)
    return planted


# A weight placed a column late in the dense matrix.
PLACE = PlantedBug("place", "const int place = (half ? high_place : low_place) + tap_place;",
                   "const int place = (half ? high_place : low_place) + tap_place + 1;")
# The lo matrix left zero: the weights rounded to the storage type.
NO_LO = PlantedBug("no-lo", "(unsigned short)(mma_round_pair(rest, 0.0f, half_t()) & 0xffffu);",
                   "(unsigned short)(mma_round_pair(rest, 0.0f, half_t()) & 0u);")
# A tap's bias taken from the tap after it.
BIAS_TAP = PlantedBug("bias-tap", "mma_to_float(__ldg(group_bias + tap), half_t());",
                      "mma_to_float(__ldg(group_bias + tap + 1), half_t());")
# The dilation left out of a tap's row.
DILATION = PlantedBug("dilation", "const int dy = thread / kernel_w * dilation_h,",
                      "const int dy = thread / kernel_w * (dilation_h > 0),")
# The weights scattered before every warp's zeros are written.
ZEROS_BARRIER = PlantedBug("zeros-barrier", "__syncthreads();  // the zeros are written", "// the zeros are written")
# A group's next channels staged while warps still read the previous ones.
CHANNELS_BARRIER = PlantedBug("channels-barrier",
                              "if (c0 > 0) __syncthreads();  // every warp is done with the previous channels\n",
                              "// every warp is done with the previous channels\n")
# channels_last's B fragments: the second n-tile's channels and the second k-half's rows swapped.
LAST_FRAGMENT = PlantedBug("last-fragment", "(rows + (8 * (i & 1) + (lane & 7)) * stride + 4 * (i >> 1), reg);",
                           "(rows + (8 * (i >> 1) + (lane & 7)) * stride + 4 * (i & 1), reg);")
# NCHW's feature: a pixel pair's two values swapped; NCHW's input likewise.
FEATURE_PAIR = PlantedBug("feature-pair", "staged_feature[r * DENSE_PIXEL_STRIDE + w] = low_value | high_value << 16;",
                          "staged_feature[r * DENSE_PIXEL_STRIDE + w] = high_value | low_value << 16;")
INPUT_PAIR = PlantedBug("input-pair", "staged[c * stride + w] = low_value | high_value << 16;",
                        "staged[c * stride + w] = high_value | low_value << 16;")
# NCHW's input: a thread's pixel stepped past a row's end kept on its row.
INPUT_CARRY = PlantedBug("input-carry", "            x -= map_w;\n            ++y;\n", "            x -= map_w;\n")
# A row's last 16-byte vector within its count left zero (the vector staging).
LAST_VECTOR = PlantedBug("last-vector", "if (row < rows_inside && 8 * column < count)",
                         "if (row < rows_inside && 8 * column + 8 < count)")
# A thread's next row, where its column carries past a row's end, taken as the same row.
ROW_CARRY = PlantedBug("row-carry", "            ++row;\n            ++x;\n", "            ++x;\n")
# The weights formed from one k-step fewer of R.
R_STEPS = PlantedBug("r-steps", "for (int k = 0; k < r_steps; ++k) {", "for (int k = 1; k < r_steps; ++k) {")

# Each bug on the small maps whose code it is in: RedNet-50's last stage at both strides and layouts,
# the dilated window, the three channel passes.
STRIDE_CASES = (DENSE_CASES[0], DENSE_CASES[1], DENSE_CASES[1]._replace(channels_last=True))


@pytest.mark.integration
@pytest.mark.parametrize("bug, cases", [
    *((b, STRIDE_CASES) for b in (PLACE, BIAS_TAP, ZEROS_BARRIER, R_STEPS)),
    (DILATION, DENSE_CASES[4:5]), (CHANNELS_BARRIER, DENSE_CASES[2:3]),
    (LAST_FRAGMENT, (DENSE_CASES[0], STRIDE_CASES[2])), (LAST_VECTOR, DENSE_CASES[:1]), (ROW_CARRY, DENSE_CASES[1:2]),
    (FEATURE_PAIR, DENSE_CASES[1:3]), (INPUT_PAIR, DENSE_CASES[1:3]), (INPUT_CARRY, DENSE_CASES[1:3])], ids=lambda b: getattr(b, "name", ""))
def test_a_planted_bug_fails_the_reference_check(bug, cases, tmp_path, monkeypatch):
    """In every thread order (a race in one of them at least)."""
    require_host_compiler()
    _plant(monkeypatch, tmp_path, bug)
    for case in cases:
        caught = [_caught(lambda: _check(case.arguments(torch.bfloat16), EmulatedLauncher(order=order),
                                         f"{bug.name}-{order}"))
                  for order in ORDERS]
        races = bug in (ZEROS_BARRIER, CHANNELS_BARRIER)
        assert any(caught) if races else all(caught), (case.name, caught)


def _assert_rounded_once(args: tuple, name: str) -> None:
    """The outputs are the float64 reference rounded to the storage type but at a few (under 2%;
    0.2-0.4% here, outputs near zero where the window's terms cancel): the weights' hi + lo hold
    16 bits and more, the sums are in float. (Rounded to the storage type, hi alone, 40% are off.)"""
    out = _result(args, EmulatedLauncher())[1].double()
    rounded = float64_reference(GENERATED, args).to(args[0].dtype).double()
    apart = int((out != rounded).sum())
    assert apart <= 0.02 * out.numel(), f"{name}: {apart} of {out.numel()} outputs off"


def test_the_outputs_are_the_reference_rounded_once():
    require_host_compiler()
    for case in STRIDE_CASES:
        _assert_rounded_once(case.arguments(torch.bfloat16), case.name)


@pytest.mark.integration
def test_a_planted_bug_without_lo_fails_the_rounding_check(tmp_path, monkeypatch):
    """The weights rounded to the storage type (lo left zero) stay within the op's tolerance on
    these maps, not within a rounding of the reference."""
    require_host_compiler()
    _plant(monkeypatch, tmp_path, NO_LO)
    with pytest.raises(AssertionError, match="outputs off"):
        _assert_rounded_once(STRIDE_CASES[0].arguments(torch.bfloat16), "no lo")


# The direct sum without the taps in the padding (an inf weight there times zero is a nan).
COLD_PADDING = PlantedBug("cold-padding", "sum = oplib_fma(weight, value, sum);",
                          "if (inside) sum = oplib_fma(weight, value, sum);")
# The weights' check left out: a weight at a tap in the padding is in no product.
WEIGHTS_CHECK = PlantedBug("weights-check", "non_finite |= !mma_finite(w);", "(void)non_finite;")


@pytest.mark.integration
@pytest.mark.parametrize("bug", [COLD_PADDING, WEIGHTS_CHECK], ids=lambda b: b.name)
def test_a_planted_non_finite_bug_fails_the_non_finite_check(bug, tmp_path, monkeypatch):
    """Finite values never reach the direct sum; an inf in the bias of tap 5 (the window's first
    row) does: every pixel's weight there an inf, a nan (times zero) at the map's first three
    rows, whose tap 5 lies in the padding (an inf elsewhere, in the dense matrix)."""
    require_host_compiler()
    _plant(monkeypatch, tmp_path, bug)
    args = DENSE_CASES[0].arguments(torch.bfloat16)
    assert _check(args, EmulatedLauncher(), "finite")
    changed = list(args)
    changed[3] = changed[3].clone()
    changed[3][5] = float("inf")
    with pytest.raises(AssertionError, match="inf: "):
        _assert_non_finite_as_torch(tuple(changed), EmulatedLauncher(), "inf")


_RUN_SAMPLES = """
import torch
from oplib.testing.cuda_emulation import EmulatedLauncher
from test_cuda_dense_window import DENSE_CASES, DTYPES, GENERATED, _assert_non_finite_as_torch, _check, _strided
from test_cuda_dense_window import GRAD_INPUT, _assert_grad_non_finite_as_torch, _grad_check, _random_small_cases
from test_cuda_generated_mma_grad_input import grad_input_arguments
launcher = EmulatedLauncher(sanitize=True)
for dtype in DTYPES:
    for sample in GENERATED.sample_inputs("cpu", dtype, False):
        _check(sample.args, launcher, sample.name)
    for case in DENSE_CASES:
        for last in (False, True):
            _check(case._replace(channels_last=last).arguments(dtype), launcher, case.name)
    _check(_strided(DENSE_CASES[0].arguments(dtype)), launcher, "strided")
    for case in _random_small_cases(8, seed=5):
        _check(case.arguments(dtype), launcher, case.name)
    args = list(DENSE_CASES[1].arguments(dtype))
    args[1] = args[1].clone()
    args[1][0, 3, 4, 4] = float("nan")
    _assert_non_finite_as_torch(tuple(args), launcher, "nan")
    for sample in GRAD_INPUT.sample_inputs("cpu", dtype, False):
        _grad_check(sample.args, launcher, sample.name)
    for case in DENSE_CASES:
        for last in (False, True):
            _grad_check(grad_input_arguments(case._replace(channels_last=last).arguments(dtype)), launcher, case.name)
    grad = list(grad_input_arguments(DENSE_CASES[1].arguments(dtype)))
    grad[0] = grad[0].clone()
    grad[0][0, 3, 4, 4] = float("nan")
    _assert_grad_non_finite_as_torch(tuple(grad), launcher, "nan")
print("clean:", len(launcher.launches), "launches")
"""


@pytest.mark.integration
def test_dense_window_is_clean_under_address_sanitizer():
    """The samples, the small maps, random ones and a nan: no access outside the tensors or the
    dynamic shared memory (the host's size of it is the kernel's layout)."""
    require_host_compiler()
    assert_clean_under_asan(_RUN_SAMPLES)


# The taps' offsets 16 staged rows on: past the dynamic shared memory's end.
STAGED_OVERRUN = PlantedBug("offsets-past-the-end",
                            "tap_offsets = staged + (LAST ? 16 * q_steps * DENSE_CHANNEL_STRIDE",
                            "tap_offsets = staged + 16 * DENSE_CHANNEL_STRIDE + (LAST ? 16 * q_steps * DENSE_CHANNEL_STRIDE")


@pytest.mark.integration
def test_address_sanitizer_catches_the_offsets_past_the_end(tmp_path):
    require_host_compiler()
    planted = _planted(tmp_path, involution_cuda.DENSE_WINDOW_SOURCE, STAGED_OVERRUN.text, STAGED_OVERRUN.bug)
    assert_asan_catches(planted, """
        x = torch.randn(1, 16, 7, 7).bfloat16().contiguous(memory_format=torch.channels_last)
        f = torch.randn(1, 8, 7, 7).bfloat16().contiguous(memory_format=torch.channels_last)
        s = torch.randn(49, 8).bfloat16()
        ops.involution_generated_dense_window(x, f, s, None, [7, 7], [1, 1], [3, 3], [1, 1],
                                              torch.empty_like(x), launcher)
    """)


@pytest.mark.needs_cuda
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_dense_window_on_a_gpu_matches_the_reference(dtype):
    """CuPy's launch, mma.sync and all: the samples, the small maps in both layouts, random
    ones, and an inf where torch puts it."""
    samples = [(s.args, s.name) for s in GENERATED.sample_inputs("cpu", dtype, False)]
    samples += [(c._replace(channels_last=last).arguments(dtype), c.name) for c in DENSE_CASES for last in (False, True)]
    samples += [(c.arguments(dtype), c.name) for c in _random_small_cases(12, seed=7)]
    for args, name in samples:
        args = tuple(a.cuda() if isinstance(a, torch.Tensor) else a for a in args)
        if not _check(args, None, name):
            assert _declines_only_what_it_cannot_hold(args), name
    args = [a.cuda() if isinstance(a, torch.Tensor) else a for a in DENSE_CASES[0].arguments(dtype)]
    args[0] = args[0].clone()
    args[0][0, 17, 5, 6] = float("inf")
    _assert_non_finite_as_torch(tuple(args), None, "inf")


# ---------------------------------------------------------------------------------------
# grad_input: involution_generated_dense_window_backward_input
# ---------------------------------------------------------------------------------------

def _grad_result(args: tuple, launcher, _unused=None):
    out = result_like(args[0], args[4])
    return involution_cuda.involution_generated_dense_window_backward_input(*args, out, launcher), out


def _grad_check(args: tuple, launcher, name: str) -> bool:
    """The kernel's grad_input against the op's float64 reference; False where it declines."""
    return check_against_reference(GRAD_INPUT, _grad_result, args, launcher, name)


def _grad_declines_only_what_it_cannot_hold(args: tuple) -> bool:
    c = _source().constants
    (height, width), (out_h, out_w) = args[4], args[0].shape[2:]
    return (args[0].dtype not in DTYPES or out_h * out_w > c["DENSE_PIXELS"] or height * width > c["DENSE_INPUTS"]
            or args[5][0] * args[5][1] > c["DENSE_TAPS"] or args[1].shape[1] > c["DENSE_REDUCED"])


@pytest.mark.parametrize("order", [ORDERS[0], *(pytest.param(o, marks=pytest.mark.integration)
                                                for o in (*ORDERS[1:], INTERLEAVED))])
@pytest.mark.parametrize("dtype", [torch.bfloat16, pytest.param(torch.float16, marks=pytest.mark.integration)],
                         ids=str)
def test_dense_window_grad_input_matches_the_reference(dtype, order):
    """involution_generated_backward_input's samples (it declines those past its limits), the
    small maps above in both layouts, and grad_output in views whose rows are not contiguous."""
    require_host_compiler()
    launcher = EmulatedLauncher(order=order)
    _check_samples_and_maps(GRAD_INPUT, _grad_check, _grad_declines_only_what_it_cannot_hold, grad_input_arguments,
                            launcher, dtype)
    for case in DENSE_CASES[:2]:
        args = grad_input_arguments(case._replace(channels_last=True).arguments(dtype))
        strided = _strided((args[0], args[1]), feature_only=False)
        assert _grad_check((*strided, *args[2:]), launcher, f"{case.name}-strided")


@pytest.mark.integration
@pytest.mark.parametrize("order", ORDERS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_dense_window_grad_input_matches_the_reference_on_random_geometries(dtype, order):
    require_host_compiler()
    launcher = EmulatedLauncher(order=order)
    for index, sample in enumerate(random_samples(GRAD_INPUT, dtype, 16, seed=227 + DTYPES.index(dtype))):
        if not _grad_check(sample.args, launcher, f"random-{index}"):
            assert _grad_declines_only_what_it_cannot_hold(sample.args), index
    for case in _random_small_cases(24, seed=229 + DTYPES.index(dtype)):
        assert _grad_check(grad_input_arguments(case.arguments(dtype)), launcher, case.name), case.name


def test_grad_input_in_every_layout_and_order_gives_the_same_bits():
    require_host_compiler()
    _assert_the_same_bits(_grad_result, grad_input_arguments)


def test_dense_window_grad_input_declines_what_it_does_not_serve():
    """What the forward declines; RedNet-50's last stage at batch 32 four blocks an SM of the
    H200 at stride 1, three at stride 2 (its staged grad_output smaller than the forward's input)."""
    from oplib.testing import device_model

    source, config = _source(), involution_cuda.dense_window_config
    for size, blocks in ((7, 4), (14, 3)):
        for last in (False, True):
            chosen = config(source, torch.bfloat16, 32, 32, (size, size), (7, 7), (7, 7), 128, last, grad_input=True)
            assert chosen.grid == (32, 32, 1), (size, last)
            assert device_model.resident_blocks(128, 128, chosen.shared_bytes, device_model.H200) == blocks, (size, last)
    assert config(source, torch.float32, 2, 4, (7, 7), (7, 7), (7, 7), 16, True, grad_input=True) is None
    assert config(source, torch.bfloat16, 2, 4, (16, 18), (8, 9), (7, 7), 16, True, grad_input=True) is None
    args = grad_input_arguments(DENSE_CASES[0].arguments(torch.float64))
    out = torch.full((2, 32, 7, 7), 7.0, dtype=torch.float64)
    assert involution_cuda.involution_generated_dense_window_backward_input(*args, out, EmulatedLauncher()) is None
    assert bool((out == 7).all())


def _assert_grad_non_finite_as_torch(args: tuple, launcher, name: str) -> None:
    result, out = _grad_result(args, launcher)
    assert result is out, name
    assert_non_finite_as_expected(out, float64_reference(GRAD_INPUT, args), GRAD_INPUT.tolerance(out.dtype), name)


@pytest.mark.parametrize("value", [float("inf"), pytest.param(float("nan"), marks=pytest.mark.integration)])
def test_grad_input_non_finite_values_land_where_torch_puts_them(value):
    """An inf or a nan in grad_output, the feature or the bias: the matrices' zeros times it put
    nans across the group's grad_input, and a warp that meets one sums directly. Strides 1 and
    2, both layouts."""
    require_host_compiler()
    launcher = EmulatedLauncher()
    for case in DENSE_CASES[:2]:
        for channels_last in (False, True):
            args = grad_input_arguments(case._replace(channels_last=channels_last).arguments(torch.bfloat16))
            for place, changed in with_one_non_finite(args, GRAD_NON_FINITE_PLACES, value):
                _assert_grad_non_finite_as_torch(changed, launcher, f"{case.name}-{channels_last}-{place}")


# A's columns of the hi matrix an m-tile's half late (its input pixels 8 on).
GRAD_COLUMNS = PlantedBug("grad-columns",
                          "oplib_load_fragment_a_transposed(dense + 16 * k * dense_stride + 8 * tile, dense_stride);",
                          "oplib_load_fragment_a_transposed(dense + 16 * k * dense_stride + 8 * tile + 4, dense_stride);")
# A group's next channels of grad_output staged while warps still read the previous ones.
GRAD_BARRIER = PlantedBug("grad-barrier",
                          "if (c0 > 0) __syncthreads();  // every warp is done with the previous channels' grad_output",
                          "// every warp is done with the previous channels' grad_output")
# grad_input's pixel at its row's place as a column and its column's as a row (square maps).
GRAD_STORE = PlantedBug("grad-store", "out_group + (index_t)(q / width) * out_hs + (index_t)(q % width) * out_ws;",
                        "out_group + (index_t)(q % width) * out_hs + (index_t)(q / width) * out_ws;")


@pytest.mark.integration
@pytest.mark.parametrize("bug, cases", [
    *((b, (DENSE_CASES[2], DENSE_CASES[1]._replace(channels_last=True))) for b in (GRAD_COLUMNS, GRAD_STORE)),
    (GRAD_BARRIER, DENSE_CASES[2:3])], ids=lambda b: getattr(b, "name", ""))
def test_a_planted_grad_input_bug_fails_the_reference_check(bug, cases, tmp_path, monkeypatch):
    """On square maps at strides 1 and 2 (the barrier's on three channel passes of a group)."""
    require_host_compiler()
    _plant(monkeypatch, tmp_path, bug)
    for case in cases:
        caught = [_caught(lambda: _grad_check(grad_input_arguments(case.arguments(torch.bfloat16)),
                                              EmulatedLauncher(order=order), f"{bug.name}-{order}"))
                  for order in ORDERS]
        assert any(caught) if bug is GRAD_BARRIER else all(caught), (case.name, caught)


# The direct sum's taps read at every stride step (stride 2 only: a tap no output pixel reaches).
GRAD_COLD_STRIDE = PlantedBug("grad-cold-stride", "i_step % stride_h != 0 || j_step % stride_w != 0",
                              "i_step % 1 != 0 || j_step % 1 != 0")


@pytest.mark.integration
def test_a_planted_grad_input_cold_path_bug_fails_the_non_finite_check(tmp_path, monkeypatch):
    """Finite values never reach the direct sum; an inf in the feature does (stride 2)."""
    require_host_compiler()
    _plant(monkeypatch, tmp_path, GRAD_COLD_STRIDE)
    args = grad_input_arguments(DENSE_CASES[1].arguments(torch.bfloat16))
    assert _grad_check(args, EmulatedLauncher(), "finite")
    changed = list(args)
    changed[1] = changed[1].clone()
    changed[1][0, 5, 4, 4] = float("inf")
    with pytest.raises(AssertionError, match="inf: "):
        _assert_grad_non_finite_as_torch(tuple(changed), EmulatedLauncher(), "inf")


@pytest.mark.needs_cuda
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_dense_window_grad_input_on_a_gpu_matches_the_reference(dtype):
    """CuPy's launch, mma.sync and all: the samples, the small maps in both layouts, random
    ones, and an inf where torch puts it."""
    samples = [(s.args, s.name) for s in GRAD_INPUT.sample_inputs("cpu", dtype, False)]
    samples += [(grad_input_arguments(c._replace(channels_last=last).arguments(dtype)), c.name)
                for c in DENSE_CASES for last in (False, True)]
    samples += [(grad_input_arguments(c.arguments(dtype)), c.name) for c in _random_small_cases(12, seed=7)]
    for args, name in samples:
        args = tuple(a.cuda() if isinstance(a, torch.Tensor) else a for a in args)
        if not _grad_check(args, None, name):
            assert _grad_declines_only_what_it_cannot_hold(args), name
    args = [a.cuda() if isinstance(a, torch.Tensor) else a for a in grad_input_arguments(DENSE_CASES[0].arguments(dtype))]
    args[0] = args[0].clone()
    args[0][0, 17, 5, 6] = float("inf")
    _assert_grad_non_finite_as_torch(tuple(args), None, "inf")
