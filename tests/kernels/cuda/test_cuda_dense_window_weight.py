"""dense_window.cu's involution_dense_window_backward_weight (involution's grad_weight on tensor
cores: a (sample, group, band of output rows) a block, a small map whole, the products of
grad_output and the input gathered at the taps) on the host emulation: against the float64
reference on the registry's samples, small maps and banded ones of every kind and random
geometries of both, in float16 and bfloat16,
both layouts and every thread order; the same bits whatever the layout and the order; inf and
nan where the op's other CUDA kernels put them; the op's dispatch under the ``dense_window``
policy; under AddressSanitizer; and planted bugs that each check must catch."""

from __future__ import annotations

import dataclasses
import random

import pytest
import torch

from oplib import registry
from oplib.kernels import KernelSource
from oplib.kernels.involution import cuda as involution_cuda
from oplib.kernels.involution.layouts import is_channels_last, weight_result
from oplib.testing.cuda_emulation import INTERLEAVED, ORDERS, EmulatedLauncher
from oplib.testing.toolchain import require_host_compiler

from cuda_test_helpers import _planted, assert_asan_catches, assert_clean_under_asan, random_samples
from test_cuda_dense_window import DENSE_CASES, FAR_TAP, LAST_FRAGMENT, _random_small_cases, _strided
from test_cuda_generated_mma import PlantedBug, check_against_reference
from test_cuda_generated_mma_grad_input import _caught
from test_cuda_tiles import TileCase

WEIGHT = registry.get("involution_backward_weight")
DTYPES = involution_cuda.DENSE_WINDOW_DTYPES
DENSE_POLICY = dataclasses.replace(involution_cuda.POLICY, dense_window=True)


def _source() -> KernelSource:
    return involution_cuda.load_source(involution_cuda.DENSE_WINDOW_SOURCE)


def weight_arguments(forward_args: tuple, groups: int) -> tuple:
    """involution_backward_weight's arguments for a generated forward call's (a TileCase's): a
    grad_output of the output's size in the input's layout (a seeded draw, the same values each
    time), the input, the window and ``groups``."""
    input, feature, _span_weight, _span_bias, kernel_size, stride, padding, dilation = forward_args
    generator = torch.Generator().manual_seed(input.numel() + feature.numel() + 1)
    grad = torch.randn(input.shape[0], input.shape[1], *feature.shape[2:], dtype=torch.float64, generator=generator)
    last = input.stride(1) == 1 and input.shape[1] > 1
    grad = grad.to(input.device, input.dtype).contiguous(memory_format=torch.channels_last if last
                                                         else torch.contiguous_format)
    return (grad, input, kernel_size, stride, padding, dilation, groups)


def _case_arguments(case, dtype) -> tuple:
    return weight_arguments(case.arguments(dtype), case.groups)


def _result(args: tuple, launcher, _unused=None):
    grad, input, kernel_size, stride, padding, dilation, groups = args
    out = weight_result(grad, (input.shape[0], groups, *kernel_size, *grad.shape[2:]), is_channels_last(input))
    return involution_cuda.involution_dense_window_backward_weight(*args, out, launcher), out


def _check(args: tuple, launcher, name: str) -> bool:
    """The kernel's grad_weight against the op's float64 reference; False where it declines."""
    return check_against_reference(WEIGHT, _result, args, launcher, name)


def _declines_only_what_it_cannot_hold(args: tuple) -> bool:
    """A dtype without the tensor-core product, a map no band of which fits, no input pixel, a
    window past the kernel's limits, no channel."""
    grad, input, kernel_size, stride, _, dilation, _ = args
    rows = involution_cuda.dense_weight_band_rows(_source(), input.shape[2:], grad.shape[2:], kernel_size, stride,
                                                  dilation)
    return (grad.dtype not in DTYPES or rows is None or input.shape[2] * input.shape[3] == 0
            or kernel_size[0] * kernel_size[1] > _source().constants["DENSE_TAPS"] or input.shape[1] == 0)


# Maps larger than a block holds, in bands of output rows: RedNet-50's stage 3 (14 x 14, bands of
# 4 rows, the last of 2) and stage 2 (28 x 28, bands of 2), its stride-2 stage 3 (28 x 28 in, bands
# of 2 rows of 14), three channel passes over bands, a rectangular dilated window at unequal
# strides, a map one row of which is a band (and its windows' rows reach 252 input pixels).
BAND_CASES = (
    TileCase(batch=1, channels=32, groups=2, reduced=8, size=(14, 14), kernel_size=(7, 7), stride=(1, 1),
             padding=(3, 3), dilation=(1, 1), channels_last=True),
    TileCase(batch=1, channels=16, groups=1, reduced=8, size=(28, 28), kernel_size=(7, 7), stride=(1, 1),
             padding=(3, 3), dilation=(1, 1), channels_last=False),
    TileCase(batch=1, channels=16, groups=1, reduced=8, size=(28, 28), kernel_size=(7, 7), stride=(2, 2),
             padding=(3, 3), dilation=(1, 1), channels_last=True),
    TileCase(batch=2, channels=40, groups=1, reduced=8, size=(13, 11), kernel_size=(7, 7), stride=(1, 1),
             padding=(3, 3), dilation=(1, 1), channels_last=False),
    TileCase(batch=1, channels=24, groups=3, reduced=8, size=(19, 12), kernel_size=(3, 5), stride=(2, 1),
             padding=(2, 2), dilation=(2, 1), channels_last=True),
    TileCase(batch=1, channels=16, groups=2, reduced=8, size=(9, 36), kernel_size=(7, 3), stride=(1, 1),
             padding=(3, 1), dilation=(1, 1), channels_last=False),
)


@pytest.mark.parametrize("order", [ORDERS[0], *(pytest.param(o, marks=pytest.mark.integration)
                                                for o in (*ORDERS[1:], INTERLEAVED))])
@pytest.mark.parametrize("dtype", [torch.bfloat16, pytest.param(torch.float16, marks=pytest.mark.integration)],
                         ids=str)
def test_dense_weight_matches_the_reference(dtype, order):
    """The registry's samples (channels_last and transposed operands, odd sizes, rectangular
    windows, strides, dilations, an empty batch: it declines those past its limits), the small
    maps of the dense window's tests and the banded ones above in both layouts (three channel
    passes of a group among them), and operands in views whose rows are not contiguous."""
    require_host_compiler()
    launcher = EmulatedLauncher(order=order)
    served = 0
    for sample in WEIGHT.sample_inputs("cpu", dtype, False):
        if _check(sample.args, launcher, sample.name):
            served += 1
        else:
            assert _declines_only_what_it_cannot_hold(sample.args), sample.name
    assert served >= 3
    for case in (*DENSE_CASES, *BAND_CASES):
        for channels_last in (False, True):
            assert _check(_case_arguments(case._replace(channels_last=channels_last), dtype), launcher,
                          f"{case.name}-{channels_last}")
    for case in (*DENSE_CASES[:2], BAND_CASES[0]):
        args = _case_arguments(case._replace(channels_last=True), dtype)
        for aligned in (False, True):
            strided = _strided((args[1], args[0]), aligned=aligned)  # (views of the input and grad_output)
            assert _check((strided[1], strided[0], *args[2:]), launcher, f"{case.name}-strided-{aligned}")


@pytest.mark.integration
@pytest.mark.parametrize("order", ORDERS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_dense_weight_matches_the_reference_on_random_geometries(dtype, order):
    """The spec's random geometries (it declines those past its limits), then random small maps
    it serves: windows of 1-7 rows and columns, strides 1-3, dilations 1-2, group channels that
    are and are not multiples of the 16-channel pass, either layout."""
    require_host_compiler()
    launcher = EmulatedLauncher(order=order)
    for index, sample in enumerate(random_samples(WEIGHT, dtype, 16, seed=307 + DTYPES.index(dtype))):
        if not _check(sample.args, launcher, f"random-{index}"):
            assert _declines_only_what_it_cannot_hold(sample.args), index
    for case in _random_small_cases(24, seed=311 + DTYPES.index(dtype)):
        assert _check(_case_arguments(case, dtype), launcher, case.name), case.name
    for case in _random_band_cases(12, seed=313 + DTYPES.index(dtype)):
        assert _check(_case_arguments(case, dtype), launcher, case.name), case.name


def _random_band_cases(count: int, seed: int) -> list[TileCase]:
    """Maps of 8-40 rows and columns the kernel serves in bands (more than DENSE_PIXELS output
    pixels): windows of 1-7 rows and columns, strides 1-3, dilations 1-2, either layout."""
    source = _source()
    rng = random.Random(seed)
    cases = []
    while len(cases) < count:
        kernel = (rng.randint(1, 7), rng.randint(1, 7))
        stride, dilation = (rng.randint(1, 3), rng.randint(1, 3)), (rng.randint(1, 2), rng.randint(1, 2))
        padding = tuple(rng.randint(0, d * (k - 1) // 2 + 1) for k, d in zip(kernel, dilation))
        size = (rng.randint(8, 40), rng.randint(8, 40))
        out = [(s + 2 * p - d * (k - 1) - 1) // st + 1 for s, p, d, k, st in zip(size, padding, dilation, kernel, stride)]
        if (min(out) < 1 or out[0] * out[1] <= source.constants["DENSE_PIXELS"]
                or involution_cuda.dense_weight_band_rows(source, size, out, kernel, stride, dilation) is None):
            continue
        groups = rng.randint(1, 2)
        cases.append(TileCase(batch=1, channels=groups * rng.choice([5, 16, 20]), groups=groups, reduced=8, size=size,
                              kernel_size=kernel, stride=stride, padding=padding, dilation=dilation,
                              channels_last=rng.random() < 0.5))
    return cases


def test_every_layout_and_order_gives_the_same_bits():
    """Each weight's sum takes the group's channels in 16-channel passes, in order, whatever the
    layout the operands are staged in and the threads' order: one result (and the output's
    layout, pixel-major for a channels_last input, changes only where it is stored)."""
    require_host_compiler()
    for case in (*DENSE_CASES[:3], BAND_CASES[0]):
        args = _case_arguments(case, torch.bfloat16)
        results = []
        for channels_last in (False, True):
            memory_format = torch.channels_last if channels_last else torch.contiguous_format
            laid = (args[0].contiguous(memory_format=memory_format), args[1].contiguous(memory_format=memory_format),
                    *args[2:])
            results += [_result(laid, EmulatedLauncher(order=order))[1].contiguous() for order in ORDERS]
        assert all(torch.equal(results[0], r) for r in results[1:]), case.name


def test_dense_weight_declines_what_it_does_not_serve():
    """What the dense window's forward declines (R aside): float32 and float64, more output pixels
    than DENSE_PIXELS, no input pixel or more than DENSE_INPUTS, more taps than DENSE_TAPS, a
    tap's offset past 16 bits; a group of no channel, an out whose offsets within a (sample,
    group) pass an int: None, out untouched. RedNet-50's last
    stage at batch 32 (7 x 7 maps out of 7 x 7 and 14 x 14, 32 groups): a block a (group, sample),
    four an SM of the H200 at stride 1 and three at stride 2; its stages 3 and 2 in bands of 4
    and 2 output rows (stride 2: 2 rows of 14), its first stage (56 x 56: a row's windows reach
    392 input pixels) declined."""
    from oplib.testing import device_model

    source, config = _source(), involution_cuda.dense_weight_config
    for size, blocks in ((7, 4), (14, 3)):
        for last in (False, True):
            chosen = config(source, torch.bfloat16, 32, 32, (size, size), (7, 7), (7, 7), (size // 7, size // 7), last)
            assert chosen.grid == (32, 32, 1) and chosen.block == (32, 4, 1), (size, last)
            assert device_model.resident_blocks(128, 128, chosen.shared_bytes, device_model.H200) >= blocks, (size, last)
    for size, out, stride, bands in ((14, 14, 1, 4), (28, 28, 1, 14), (28, 14, 2, 7), (14, 7, 2, 1), (7, 7, 1, 1)):
        chosen = config(source, torch.bfloat16, 32, 16, (size, size), (out, out), (7, 7), (stride, stride), True)
        assert chosen.grid == (16, 32, bands), (size, stride)
    # one pass over a group's channels keeps the products in 16 bits: stage 2's bands (56 pixels
    # whose windows reach 224 input pixels) four blocks an SM rather than three
    for narrow, blocks in ((False, 3), (True, 4)):
        chosen = config(source, torch.bfloat16, 32, 16, (28, 28), (28, 28), (7, 7), (1, 1), True, narrow=narrow)
        assert device_model.resident_blocks(128, 128, chosen.shared_bytes, device_model.H200) == blocks, narrow
    assert config(source, torch.bfloat16, 32, 4, (56, 56), (56, 56), (7, 7), (1, 1), True) is None
    assert config(source, torch.bfloat16, 2, 4, (7, 64), (7, 64), (7, 7), (1, 1), True) is None  # 448 input pixels a row
    assert config(source, torch.bfloat16, 2, 4, (1, 65), (1, 65), (1, 1), (1, 1), True) is None  # 65 pixels a row
    assert config(source, torch.bfloat16, 2, 4, (9, 36), (9, 36), (7, 3), (1, 1), True) is not None  # a row a band
    assert config(source, torch.bfloat16, 2, 4, (8, 8), (8, 8), (9, 9), (1, 1), True) is None  # 81 taps
    assert config(source, torch.bfloat16, 2, 4, (7, 0), (7, 2), (1, 3), (1, 1), True) is None  # no input pixel
    assert config(source, torch.bfloat16, 2, 4, (7, 7), (7, 7), (7, 7), (1, 1), True, dilation=(1, 10923)) is None
    assert config(source, torch.bfloat16, 65536, 4, (7, 7), (7, 7), (7, 7), (1, 1), True) is None
    for dtype in (torch.float32, torch.float64):
        assert config(source, dtype, 2, 4, (7, 7), (7, 7), (7, 7), (1, 1), True) is None
    for args in (_case_arguments(FAR_TAP, torch.bfloat16), _case_arguments(DENSE_CASES[0], torch.float64),
                 (torch.zeros(1, 0, 7, 7, dtype=torch.bfloat16), torch.zeros(1, 0, 7, 7, dtype=torch.bfloat16),
                  [7, 7], [1, 1], [3, 3], [1, 1], 2)):
        grad, input, kernel_size, *_, groups = args
        out = torch.full((input.shape[0], groups, *kernel_size, *grad.shape[2:]), 7.0, dtype=grad.dtype)
        assert involution_cuda.involution_dense_window_backward_weight(*args, out, EmulatedLauncher()) is None
        assert bool((out == 7).all())
    # an out whose offsets within a (sample, group) pass an int (the gather adds them in ints)
    args = _case_arguments(DENSE_CASES[0]._replace(batch=0), torch.bfloat16)
    far = torch.empty_strided((0, 2, 7, 7, 7, 7), (1, 1, 2**30, 1, 1, 1), dtype=torch.bfloat16)
    assert involution_cuda.involution_dense_window_backward_weight(*args, far, EmulatedLauncher()) is None


def test_the_staging_takes_vectors_only_where_both_activations_rows_are_aligned():
    """VECTORS in channels_last where grad_output's and the input's rows move as 16-byte vectors
    (a group's channels a multiple of 8, every pixel's first aligned); not for NCHW, a view from
    an odd column, 12 channels a group."""
    from oplib.testing.device_model import RecordingLauncher

    def specialisation(args) -> tuple:
        launcher = RecordingLauncher()
        _result(args, launcher)
        return launcher.launches[0].specialisation

    args = _case_arguments(DENSE_CASES[0], torch.bfloat16)  # channels_last, 16 channels a group
    narrow = "DENSE_MAP_NARROW"  # (one pass over 16 channels a group, or 12)
    assert specialisation(args) == ("true", "true", narrow)
    assert specialisation(_case_arguments(DENSE_CASES[0]._replace(channels_last=False), torch.bfloat16)) == (
        "false", "false", narrow)
    strided = _strided((args[1], args[0]))
    assert specialisation((strided[1], strided[0], *args[2:])) == ("false", "false", narrow)  # (views: not channels_last)
    strided = _strided((args[1], args[0]), feature_only=True)  # grad_output a view from an odd column
    assert specialisation((strided[1], args[1], *args[2:])) == ("true", "false", narrow)
    assert specialisation(_case_arguments(DENSE_CASES[0]._replace(channels=24), torch.bfloat16)) == ("true", "false", narrow)
    # three passes (40 channels a group): float products; a float32 out: DENSE_MAP_WIDE
    assert specialisation(_case_arguments(DENSE_CASES[2], torch.bfloat16))[2] == "DENSE_MAP_ROUNDED"
    launcher = RecordingLauncher()
    _wide(args, launcher)
    assert launcher.launches[0].specialisation == ("true", "true", "DENSE_MAP_WIDE")


def test_the_op_takes_it_under_the_dense_window_policy_only():
    """involution_backward_weight's CUDA dispatch launches it under ``dense_window`` where it
    serves the call (and its result is the kernel's), and never under the default policy."""
    from oplib.testing.device_model import RecordingLauncher

    for case in DENSE_CASES[:2]:
        args = _case_arguments(case, torch.bfloat16)
        kernels = {}
        for name, policy in (("default", involution_cuda.POLICY), ("dense", DENSE_POLICY)):
            launcher = RecordingLauncher()
            involution_cuda.launch_involution_backward_weight(*args, launcher, policy)
            kernels[name] = [launch.kernel for launch in launcher.launches]
        assert kernels["dense"] == ["involution_dense_window_backward_weight"], case.name
        assert "involution_dense_window_backward_weight" not in kernels["default"], case.name
    require_host_compiler()
    args = _case_arguments(DENSE_CASES[1], torch.bfloat16)
    out = involution_cuda.launch_involution_backward_weight(*args, EmulatedLauncher(), DENSE_POLICY)
    assert torch.equal(out, _result(args, EmulatedLauncher())[1])
    args = _case_arguments(DENSE_CASES[0], torch.float32)  # float32: the op's own kernels
    launcher = RecordingLauncher()
    involution_cuda.launch_involution_backward_weight(*args, launcher, DENSE_POLICY)
    assert "involution_dense_window_backward_weight" not in [launch.kernel for launch in launcher.launches]


# inf and nan in grad_output or the input: at an inner pixel, a corner, the edge.
NON_FINITE_PLACES = {
    "grad_output interior": (0, (0, 17, 3, 4)),
    "grad_output corner": (0, (0, 1, 0, 0)),
    "input interior": (1, (0, 17, 5, 6)),
    "input right edge": (1, (1, 30, 6, 13)),
}


def _assert_non_finite_as_the_op(args: tuple, launcher, name: str) -> None:
    """inf and nan at exactly the places of the op's CUDA kernels under the default policy (a tap
    in the padding skipped: 0 there, where torch's unfold would make inf times 0 a nan), finite
    values within the op's tolerance of theirs."""
    result, out = _result(args, launcher)
    assert result is out, name
    expected = involution_cuda.launch_involution_backward_weight(*args, EmulatedLauncher(), involution_cuda.POLICY)
    assert not expected.isfinite().all(), name
    assert torch.equal(out.isnan(), expected.isnan()), f"{name}: nan at other places"
    assert torch.equal(out.isinf(), expected.isinf()), f"{name}: inf at other places"
    finite = expected.isfinite()
    atol, rtol = WEIGHT.tolerance(out.dtype)
    torch.testing.assert_close(out.double()[finite], expected.double()[finite], atol=atol, rtol=rtol,
                               msg=lambda m: f"{name}: {m}")


@pytest.mark.parametrize("value", [float("inf"), pytest.param(float("nan"), marks=pytest.mark.integration)])
def test_non_finite_values_land_where_the_op_puts_them(value):
    """Every term of a gathered sum is one of the direct sum's: the tiles' zeros meet only zeros,
    so no nan appears where the op's other kernels make none. Strides 1 and 2, both layouts, a
    map whole and one in bands."""
    require_host_compiler()
    launcher = EmulatedLauncher()
    for case in (*DENSE_CASES[:2], BAND_CASES[0]):
        for channels_last in (False, True):
            args = _case_arguments(case._replace(channels_last=channels_last), torch.bfloat16)
            for place, (position, index) in NON_FINITE_PLACES.items():
                changed = list(args)
                changed[position] = args[position].clone()
                changed[position][tuple(min(i, s - 1) for i, s in zip(index, args[position].shape))] = value
                _assert_non_finite_as_the_op(tuple(changed), launcher, f"{case.name}-{channels_last}-{place}")


# ---------------------------------------------------------------------------------------
# Planted bugs
# ---------------------------------------------------------------------------------------

def _plant(monkeypatch, tmp_path, bug: PlantedBug) -> KernelSource:
    planted = _planted(tmp_path, involution_cuda.DENSE_WINDOW_SOURCE, bug.text, bug.bug)
    monkeypatch.setattr(involution_cuda, "load_source", lambda filename: planted)
    return planted


# A pass's sums stored over the earlier passes' instead of added to them.
PASSES_ADDED = PlantedBug("passes-added", "if (c0 > 0) {  // the lane's own places", "if (c0 < 0) {  // the lane's own places")
# The next pass staged while warps still multiply the previous one.
PASS_BARRIER = PlantedBug("pass-barrier", "if (c0 > 0) __syncthreads();  // every warp is done with the previous channels' staging",
                          "// every warp is done with the previous channels' staging")
# The products read before every warp has summed them.
PRODUCTS_BARRIER = PlantedBug("products-barrier", "__syncthreads();  // the products are summed", "// the products are summed")
# The last step of input pixels a warp's windows reach left out.
LAST_STEP = PlantedBug("last-step", "    k_end = y_first < y_end ? (y_end * width + 15) / 16 : 0;",
                       "    k_end = y_first < y_end ? (y_end * width + 15) / 16 - 1 : 0;")
# A tap's row offset without its dilation.
TAP_DILATION = PlantedBug("tap-dilation", "dy = a * dilation_h, dx = b * dilation_w;", "dy = a, dx = b * dilation_w;")
# A pixel's out offset with its row and column swapped (square maps: in bounds).
PIXEL_OUT = PlantedBug("pixel-out", "i * (int)out_hs + j * (int)out_ws", "j * (int)out_hs + i * (int)out_ws")
# The transposed B fragments' k rows and n-tile words swapped (here NCHW's staged input; the
# forward's channels_last input shares the loader).
B_TRANSPOSED = LAST_FRAGMENT
# NCHW's grad_output: A from the staged planes untransposed.
A_NCHW = PlantedBug("a-nchw", ": oplib_load_fragment_a_transposed(staged_grad + first / 2, DENSE_PIXEL_STRIDE);",
                    ": oplib_load_fragment_a(staged_grad + first / 2, DENSE_PIXEL_STRIDE);")

# A band's input staged from its first output row's row, not its windows' first row inside the map.
BAND_INPUT = PlantedBug("band-input", "(index_t)group * group_channels * input_c + (index_t)band_y * input_h;",
                        "(index_t)group * group_channels * input_c + (index_t)band_top * input_h;")
# A band's grad_weight stored at the first band's rows.
BAND_OUT = PlantedBug("band-out", "(index_t)group * out_g + (index_t)band_top * out_hs;", "(index_t)group * out_g;")
# A band's windows placed as if its first row's window began at the map's top.
BAND_PAD = PlantedBug("band-pad", "band_pad_h = band_y - reach_top;", "band_pad_h = pad_h;")

STRIDE_CASES = (DENSE_CASES[0], DENSE_CASES[1], DENSE_CASES[1]._replace(channels_last=True))


@pytest.mark.integration
@pytest.mark.parametrize("bug, cases", [
    (PASSES_ADDED, DENSE_CASES[2:3]), (PASS_BARRIER, DENSE_CASES[2:3]), (PRODUCTS_BARRIER, STRIDE_CASES),
    (LAST_STEP, STRIDE_CASES), (TAP_DILATION, DENSE_CASES[4:5]), (PIXEL_OUT, STRIDE_CASES),
    (B_TRANSPOSED, DENSE_CASES[1:3]), (A_NCHW, DENSE_CASES[1:3]),
    *((b, BAND_CASES[:3]) for b in (BAND_INPUT, BAND_OUT, BAND_PAD))], ids=lambda b: getattr(b, "name", ""))
def test_a_planted_bug_fails_the_reference_check(bug, cases, tmp_path, monkeypatch):
    """In every thread order (a race in one of them at least)."""
    require_host_compiler()
    _plant(monkeypatch, tmp_path, bug)
    for case in cases:
        caught = [_caught(lambda: _check(_case_arguments(case, torch.bfloat16), EmulatedLauncher(order=order),
                                         f"{bug.name}-{order}"))
                  for order in ORDERS]
        races = bug in (PASS_BARRIER, PRODUCTS_BARRIER)
        assert any(caught) if races else all(caught), (case.name, caught)


_RUN_SAMPLES = """
import torch
from oplib.testing.cuda_emulation import EmulatedLauncher
from test_cuda_dense_window import DENSE_CASES, _random_small_cases
from test_cuda_dense_window_weight import (BAND_CASES, DTYPES, WEIGHT, _case_arguments, _check, _random_band_cases,
                                           _result, _wide)
launcher = EmulatedLauncher(sanitize=True)
for dtype in DTYPES:
    for sample in WEIGHT.sample_inputs("cpu", dtype, False):
        _check(sample.args, launcher, sample.name)
    for case in DENSE_CASES:
        for last in (False, True):
            _check(_case_arguments(case._replace(channels_last=last), dtype), launcher, case.name)
    for case in (*_random_small_cases(8, seed=5), *BAND_CASES, *_random_band_cases(4, seed=5)):
        _check(_case_arguments(case, dtype), launcher, case.name)
    args = list(_case_arguments(DENSE_CASES[1], dtype))
    args[0] = args[0].clone()
    args[0][0, 3, 4, 4] = float("nan")
    _result(tuple(args), launcher)
    for case in (DENSE_CASES[0], BAND_CASES[0]):
        _wide(_case_arguments(case, dtype), launcher)
print("clean:", len(launcher.launches), "launches")
"""


@pytest.mark.integration
def test_dense_weight_is_clean_under_address_sanitizer():
    """The samples, the small maps and bands, random ones and a nan: no access outside the tensors or the
    dynamic shared memory (the host's size of it is the kernel's layout)."""
    require_host_compiler()
    assert_clean_under_asan(_RUN_SAMPLES)


# The pixels' gather entries past the dynamic shared memory's end.
PIXELS_OVERRUN = PlantedBug("pixels-past-the-end", "DenseGatherEntry* pixel_entries = tap_entries + DENSE_TAPS;",
                            "DenseGatherEntry* pixel_entries = tap_entries + DENSE_TAPS + DENSE_PIXELS;")


@pytest.mark.integration
def test_address_sanitizer_catches_the_pixels_past_the_end(tmp_path):
    require_host_compiler()
    planted = _planted(tmp_path, involution_cuda.DENSE_WINDOW_SOURCE, PIXELS_OVERRUN.text, PIXELS_OVERRUN.bug)
    assert_asan_catches(planted, """
        x = torch.randn(1, 16, 8, 8).bfloat16().contiguous(memory_format=torch.channels_last)
        g = torch.randn(1, 16, 8, 8).bfloat16().contiguous(memory_format=torch.channels_last)
        ops.involution_dense_window_backward_weight(g, x, [7, 7], [1, 1], [3, 3], [1, 1], 1,
                                                    torch.empty(1, 1, 7, 7, 8, 8).bfloat16(), launcher)
    """)


@pytest.mark.needs_cuda
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_dense_weight_on_a_gpu_matches_the_reference(dtype):
    """CuPy's launch, mma.sync and all: the samples, the small maps in both layouts, random
    ones, and an inf where the op's kernels put it."""
    samples = [(s.args, s.name) for s in WEIGHT.sample_inputs("cpu", dtype, False)]
    samples += [(_case_arguments(c._replace(channels_last=last), dtype), c.name) for c in DENSE_CASES for last in (False, True)]
    samples += [(_case_arguments(c, dtype), c.name) for c in (*_random_small_cases(12, seed=7), *BAND_CASES,
                                                             *_random_band_cases(8, seed=7))]
    for args, name in samples:
        args = tuple(a.cuda() if isinstance(a, torch.Tensor) else a for a in args)
        if not _check(args, None, name):
            assert _declines_only_what_it_cannot_hold(args), name
    args = [a.cuda() if isinstance(a, torch.Tensor) else a for a in _case_arguments(DENSE_CASES[0], dtype)]
    args[0] = args[0].clone()
    args[0][0, 17, 5, 6] = float("inf")
    out = _result(tuple(args), None)[1]
    expected = involution_cuda.launch_involution_backward_weight(*args, involution_cuda.cupy_launcher(),
                                                                 involution_cuda.POLICY)
    assert torch.equal(out.isinf(), expected.isinf()) and torch.equal(out.isnan(), expected.isnan())
    if dtype == torch.bfloat16:  # DENSE_MAP_WIDE: the float32 kernels' map within float32's rounding
        for case in (DENSE_CASES[0], BAND_CASES[0]):
            args = tuple(a.cuda() if isinstance(a, torch.Tensor) else a for a in _case_arguments(case, dtype))
            wide = involution_cuda.launch_involution_backward_weight(args[0].float(), args[1].float(), *args[2:],
                                                                     involution_cuda.cupy_launcher())
            torch.testing.assert_close(_wide(args, None), wide, atol=1e-5, rtol=1e-5)


# ---------------------------------------------------------------------------------------
# DENSE_MAP_WIDE: the map in float32, the fused op's generator gradients through it
# ---------------------------------------------------------------------------------------

GENERATOR = registry.get("involution_generated_backward_generator")


def _wide(args: tuple, launcher) -> torch.Tensor:
    grad, input, kernel_size, stride, padding, dilation, groups = args
    out = weight_result(grad.new_empty(0, dtype=torch.float32), (input.shape[0], groups, *kernel_size, *grad.shape[2:]),
                        is_channels_last(input))
    assert involution_cuda.involution_dense_window_backward_weight(*args, out, launcher) is out
    return out


def test_the_wide_map_is_the_float32_kernels_map():
    """DENSE_MAP_WIDE writes the float sums as they are: the float32 kernels' map of the same values (their
    products exact too, their sums in another order) within float32's rounding, where a map
    rounded to bfloat16 on the way is off by its 8 bits. A small map whole and one in bands, both
    layouts; an out in bfloat16 or float32 only."""
    require_host_compiler()
    for case in (*DENSE_CASES[:3], *BAND_CASES[:2]):
        for channels_last in (False, True):
            args = _case_arguments(case._replace(channels_last=channels_last), torch.bfloat16)
            out = _wide(args, EmulatedLauncher())
            wide = involution_cuda.launch_involution_backward_weight(args[0].float(), args[1].float(), *args[2:],
                                                                     EmulatedLauncher())
            torch.testing.assert_close(out, wide, atol=1e-5, rtol=1e-5, msg=lambda m: f"{case.name}: {m}")
            assert not torch.equal(out, out.bfloat16().float()), case.name
    args = _case_arguments(DENSE_CASES[0], torch.bfloat16)
    half = torch.empty(2, 2, 7, 7, 7, 7, dtype=torch.float16)
    with pytest.raises(ValueError, match="not torch.bfloat16 or float32"):
        involution_cuda.involution_dense_window_backward_weight(*args, half, EmulatedLauncher())


def test_the_storage_types_map_is_the_wide_map_rounded_once():
    """Whether the products stay floats (more than one 16-channel pass) or are kept rounded (one
    pass, RedNet's groups: half the shared memory), the map in the storage type is the float
    map rounded once, bit for bit; whole maps and bands, one pass and three, both layouts, both
    16-bit dtypes."""
    require_host_compiler()
    for dtype in DTYPES:
        for case in (DENSE_CASES[0], DENSE_CASES[1], DENSE_CASES[2], BAND_CASES[0], BAND_CASES[3]):
            for channels_last in (False, True):
                args = _case_arguments(case._replace(channels_last=channels_last), dtype)
                assert torch.equal(_result(args, EmulatedLauncher())[1], _wide(args, EmulatedLauncher()).to(dtype)), (
                    dtype, case.name, channels_last)


def _generator_arguments(case, dtype) -> tuple:
    forward = case.arguments(dtype)
    input, feature, span_weight, _, *window = forward
    return (weight_arguments(forward, case.groups)[0], feature, span_weight, input, *window)


def test_generator_grads_through_the_dense_map_match_the_reference():
    """involution_generated_backward_generator by the dense map route, against its float64
    reference: small maps whole and in bands, both layouts; and the op's CUDA writer takes it
    under the ``dense_window`` policy (the kernel's DENSE_MAP_WIDE instantiation), not by default."""
    from oplib.ops.involution_generated import _generator_grads_result as generator_result
    from oplib.testing.device_model import RecordingLauncher

    require_host_compiler()
    atol, rtol = GENERATOR.tolerance(torch.bfloat16)
    for case in (*DENSE_CASES[:3], BAND_CASES[0], BAND_CASES[3]):
        for channels_last in (False, True):
            args = _generator_arguments(case._replace(channels_last=channels_last), torch.bfloat16)
            out = generator_result(*args)
            assert involution_cuda.generator_grads_through_dense_map(*args, out, EmulatedLauncher()) is out
            for name, value, expected in zip(("grad_feature", "grad_span_weight", "grad_span_bias"), out,
                                             GENERATOR.reference(*(a.double() if isinstance(a, torch.Tensor) else a
                                                                   for a in args))):
                torch.testing.assert_close(value.double(), expected, atol=atol, rtol=rtol,
                                           msg=lambda m: f"{case.name} {name}: {m}")
    args = _generator_arguments(DENSE_CASES[0], torch.bfloat16)
    for policy, launched in ((involution_cuda.POLICY, False), (DENSE_POLICY, True)):
        launcher = RecordingLauncher()
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(involution_cuda, "POLICY", policy)
            involution_cuda.involution_generated_backward_generator(*args, generator_result(*args), launcher)
        kernels = [(launch.kernel, launch.specialisation) for launch in launcher.launches]
        assert (("involution_dense_window_backward_weight", ("true", "true", "DENSE_MAP_WIDE")) in kernels) == launched, kernels


# One pass's rounded pair stored with its two values swapped.
NARROW_PAIR = PlantedBug("narrow-pair", "sums[h & 1].value[2 * (h >> 1)], sums[h & 1].value[2 * (h >> 1) + 1], half_t());",
                         "sums[h & 1].value[2 * (h >> 1) + 1], sums[h & 1].value[2 * (h >> 1)], half_t());")


@pytest.mark.integration
def test_a_planted_narrow_bug_fails_the_reference_check(tmp_path, monkeypatch):
    """One pass (16 channels a group): the products kept rounded; three passes never take that way."""
    require_host_compiler()
    _plant(monkeypatch, tmp_path, NARROW_PAIR)
    assert _caught(lambda: _check(_case_arguments(DENSE_CASES[0], torch.bfloat16), EmulatedLauncher(), "narrow"))
    assert _check(_case_arguments(DENSE_CASES[2], torch.bfloat16), EmulatedLauncher(), "three passes")


# DENSE_MAP_WIDE's float out written as 16-bit values.
WIDE_STORE = PlantedBug("wide-store", "if constexpr (MAP == DENSE_MAP_WIDE) {\n                    static_cast<float*>(out)[at] =",
                        "if constexpr (false) {\n                    static_cast<float*>(out)[at] =")


@pytest.mark.integration
def test_a_planted_wide_bug_fails_the_check(tmp_path, monkeypatch):
    require_host_compiler()
    args = _case_arguments(DENSE_CASES[0], torch.bfloat16)
    expected = involution_cuda.launch_involution_backward_weight(args[0].float(), args[1].float(), *args[2:],
                                                                 EmulatedLauncher())
    _plant(monkeypatch, tmp_path, WIDE_STORE)
    with pytest.raises(AssertionError, match="not close"):
        torch.testing.assert_close(_wide(args, EmulatedLauncher()), expected, atol=1e-5, rtol=1e-5)
