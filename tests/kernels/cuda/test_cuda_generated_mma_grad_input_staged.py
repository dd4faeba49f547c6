"""generated_mma.cu's staged grad_input, involution_generated_mma_backward_input_staged
(every kernel row's weights formed at once on tensor cores into shared memory, float32's
STAGED_GRAD_ROWS at a time, then summed by FMAs with grad_output staged there too), on the host emulation: against the float64 reference on the registry's
samples and random geometries in float16, bfloat16 and float32 (3xTF32), each tile layout, both run orders and
both ways of staging grad_output and loading the feature; the same bits whatever the layout; inf
and nan where torch puts them; under AddressSanitizer; and planted bugs that each check must
catch."""

from __future__ import annotations

import pytest
import torch

from oplib import registry
from oplib.kernels import KernelSource
from oplib.kernels.involution import cuda as involution_cuda
from oplib.kernels.involution.layouts import result_like
from oplib.testing.cuda_emulation import INTERLEAVED, ORDERS, EmulatedLauncher
from oplib.testing.toolchain import require_host_compiler

from cuda_test_helpers import (_planted, assert_asan_catches, assert_clean_under_asan, random_samples,
                               tensor_core_samples_script)
from test_cuda_generated_mma import (PlantedBug, assert_non_finite_as_expected, check_against_reference,
                                     float64_reference, with_one_non_finite)
from test_cuda_generated_mma_grad_input import GRAD_CASES, NON_FINITE_PLACES, _caught, _plant, grad_input_arguments
from test_cuda_tiles import TWO_CHANNEL_CHUNKS, _random_specialised_cases

GRAD_INPUT = registry.get("involution_generated_backward_input")
KERNEL = "involution_generated_mma_backward_input_staged"
RUNS_W = involution_cuda.GENERATED_STAGED_RUNS_W
STAGED_DTYPES = involution_cuda.GENERATED_STAGED_DTYPES
# Under AddressSanitizer: a 16-bit type (float16's addresses are bfloat16's) and float32's own way.
ASAN_DTYPES = (torch.bfloat16, torch.float32)


def _source() -> KernelSource:
    return involution_cuda.load_source(involution_cuda.GENERATED_MMA_SOURCE)


def _result(args: tuple, launcher, runs_w=None):
    out = result_like(args[0], args[4])
    return involution_cuda.involution_generated_mma_backward_input_staged(*args, out, launcher, runs_w), out


def _check(args: tuple, launcher, name: str, runs_w=None) -> bool:
    """The kernel's grad_input against the op's float64 reference; False where it declines."""
    return check_against_reference(GRAD_INPUT, _result, args, launcher, f"{name}, runs_w {runs_w}", runs_w)


def _declines_only_what_it_has_no_instantiation_for(args: tuple) -> bool:
    """A window other than a square 3, 5 or 7 at equal strides 1 or 2 without dilation, or shared
    memory past what it may ask for (a large R)."""
    kernel_size, stride, dilation = args[5], args[6], args[8]
    fixed = (kernel_size[0] == kernel_size[1] and stride[0] == stride[1] and tuple(dilation) == (1, 1)
             and kernel_size[0] in (3, 5, 7) and stride[0] in (1, 2))
    largest = max(involution_cuda.generated_mma_staged_shared_bytes(_source(), kernel_size[0], stride[0], runs_w,
                                                                    args[1].shape[1], args[0].dtype)
                  for runs_w in RUNS_W)
    return not fixed or largest > involution_cuda.GENERATED_TILE_MAX_SHARED


# Maps the tiles fill (the host takes them without a forced layout): RedNet's 7x7 at strides 1
# and 2 over two tiles of each layout's width (at stride 2 a width of whole tiles: the last run's
# last pixel inside), channels_last and NCHW, an R of two k-steps and one past a k-step, three
# groups, a 5x5 window with a padding other than K // 2.
WIDE = (TWO_CHANNEL_CHUNKS._replace(channels=32, reduced=24, size=(18, 60), channels_last=True),
        TWO_CHANNEL_CHUNKS._replace(channels=32, reduced=40, size=(30, 32), stride=(2, 2)),
        TWO_CHANNEL_CHUNKS._replace(channels=48, groups=3, reduced=16, size=(14, 14), channels_last=True),
        TWO_CHANNEL_CHUNKS._replace(channels=32, reduced=8, size=(20, 26), kernel_size=(5, 5), padding=(1, 3)))
STAGED_CASES = (*GRAD_CASES, *WIDE)


@pytest.mark.parametrize("order", [ORDERS[0], *(pytest.param(o, marks=pytest.mark.integration)
                                                for o in (*ORDERS[1:], INTERLEAVED))])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32, pytest.param(torch.float16, marks=pytest.mark.integration)],
                         ids=str)
def test_staged_grad_input_matches_the_reference(dtype, order):
    """The registry's samples (channels_last, odd sizes, rectangular windows, strides, dilations,
    no bias, an empty batch) and the geometries above in the tile layouts (the unit tier one a
    geometry, in turn); the wide maps in the layout the host picks, which fills them."""
    check_every_layout(GRAD_INPUT, _check, _declines_only_what_it_has_no_instantiation_for, STAGED_CASES, WIDE,
                       grad_input_arguments, dtype, order)


def check_every_layout(spec, check, declines, cases, wide, arguments, dtype, order) -> None:
    """A staged kernel (``check(args, launcher, name, runs_w)``, False where it declines) on
    ``spec``'s samples in one layout (``declines(args)`` where it does not serve them, a third
    at most), ``cases`` (each ``arguments(case.arguments(dtype))``) in the tile layouts (one
    each in turn in the unit tier's ascending bfloat16 and float32 runs, all of them otherwise), both ways
    of staging the first operand and of loading the feature among them, and ``wide`` in the
    layout the host picks; every launch of 256 threads."""
    require_host_compiler()
    launcher = EmulatedLauncher(order=order)
    served, vectors, words = 0, set(), set()
    samples = list(spec.sample_inputs("cpu", dtype, False))
    for sample in samples:
        if check(sample.args, launcher, sample.name, 8):
            served += 1
        else:
            assert declines(sample.args), sample.name
    assert served >= len(samples) // 3
    # the unit tier (bfloat16 and float32, ascending) a layout a geometry in turn, the
    # integration tier each layout every geometry
    every_layout = order != ORDERS[0] or dtype not in (torch.bfloat16, torch.float32)
    for index, case in enumerate(cases):
        args = arguments(case.arguments(dtype))
        for runs_w in RUNS_W if every_layout else RUNS_W[index % 3:index % 3 + 1]:
            assert check(args, launcher, case.name, runs_w), (case.name, runs_w)
        vectors.add(involution_cuda.generated_mma_vectors_fit(args[0], args[2].shape[0] // 49))
        words.add(involution_cuda.generated_mma_feature_words(args[1]))
    assert vectors == {True, False} and words == {True, False}  # both ways of each load
    for case in wide:
        assert check(arguments(case.arguments(dtype)), launcher, case.name), case.name
    assert {launch[3] for launch in launcher.launches} == {256}


def assert_float32_bug_caught(check, arguments, bug: PlantedBug, cases, races: bool) -> None:
    """A bug planted in a staged kernel's float32 way fails ``check`` (the reference check) on
    each of ``cases`` (``arguments(case)`` its arguments) in the ascending order (the float way's
    places are its own, its run orders the 16-bit way's code), a race in either order."""
    for case in cases:
        caught = [_caught(lambda: check(arguments(case), EmulatedLauncher(order=order), f"{bug.name}-{order}"))
                  for order in (ORDERS if races else ORDERS[:1])]
        assert any(caught) if races else all(caught), (case.name, caught)


def assert_only_the_inf_check_catches(check, assert_non_finite, args: tuple) -> None:
    """A bug planted in a float32 way's direct sum, which only a warp that met an inf or a nan
    runs: ``args`` pass ``check``; with an inf in the feature (``args[1]``) they fail
    ``assert_non_finite`` (its infs and nans, or its finite values, elsewhere)."""
    assert check(args, EmulatedLauncher(), "finite")
    changed = list(args)
    changed[1] = changed[1].clone()
    changed[1][0, 5, 4, 4] = float("inf")
    with pytest.raises(AssertionError, match="inf: "):
        assert_non_finite(tuple(changed), EmulatedLauncher(), "inf")


@pytest.mark.integration
@pytest.mark.parametrize("order", ORDERS)
@pytest.mark.parametrize("dtype", STAGED_DTYPES, ids=str)
def test_staged_grad_input_matches_the_reference_on_random_geometries(dtype, order):
    """The spec's random geometries, half of them channels_last, in a layout each (few are the
    square windows it serves: it declines the others); then random square windows it serves,
    in each layout."""
    require_host_compiler()
    launcher = EmulatedLauncher(order=order)
    for index, sample in enumerate(random_samples(GRAD_INPUT, dtype, 24, seed=97 + STAGED_DTYPES.index(dtype))):
        args = sample.args
        if index % 2:
            args = (args[0].contiguous(memory_format=torch.channels_last), args[1].contiguous(
                memory_format=torch.channels_last), *args[2:])
        if not _check(args, launcher, f"random-{index}", RUNS_W[index % 3]):
            assert _declines_only_what_it_has_no_instantiation_for(args), index
    for index, case in enumerate(_random_specialised_cases(18, seed=101 + STAGED_DTYPES.index(dtype))):
        args = grad_input_arguments(case.arguments(dtype))
        assert _check(args, launcher, case.name, RUNS_W[index % 3]), case.name


@pytest.mark.parametrize("dtype", [torch.bfloat16, pytest.param(torch.float32, marks=pytest.mark.integration)], ids=str)
def test_every_layout_gives_the_same_bits(dtype):
    """Each input pixel's sum takes its kernel rows, then its taps, in one order whatever the
    tile and the thread order: the three layouts and both orders give one result, twice."""
    require_host_compiler()
    for case in WIDE[1:2]:  # stride 2: a warp a row and column parity
        args = grad_input_arguments(case.arguments(dtype))
        results = [_result(args, EmulatedLauncher(order=order), runs_w)[1] for runs_w in RUNS_W for order in ORDERS]
        assert all(torch.equal(results[0], r) for r in results[1:]), case.name


def test_staged_grad_input_declines_what_it_does_not_serve():
    """float64, windows it has no instantiation for, a map its tiles fill less than half of
    (RedNet-50's 7x7 last stage), a span_weight past the shared memory: None, out untouched.
    RedNet-50's other grad_input maps in the layout that fills them, float32's (span rows and
    grad_output in floats) within the 99 KiB every architecture gives a block, 16-bit's three
    blocks an SM on sm_90."""
    source, config = _source(), involution_cuda.generated_mma_staged_config
    # (batch, channels, groups, input size, kernel, stride, R): RedNet-50's shapes at batch 32
    assert config(source, torch.bfloat16, 32, 64, 4, (56, 56), (7, 7), (1, 1), (1, 1), 16)[0].grid == (14, 4, 32)
    assert config(source, torch.bfloat16, 32, 128, 8, (28, 28), (7, 7), (1, 1), (1, 1), 32)[1] == 8
    assert config(source, torch.bfloat16, 32, 256, 16, (14, 14), (7, 7), (1, 1), (1, 1), 64)[1] == 4
    assert config(source, torch.float16, 32, 128, 8, (56, 56), (7, 7), (2, 2), (1, 1), 32)[0].grid == (14, 8, 32)
    assert config(source, torch.bfloat16, 32, 256, 16, (28, 28), (7, 7), (2, 2), (1, 1), 64)[1] == 4
    assert config(source, torch.bfloat16, 32, 512, 32, (14, 14), (7, 7), (2, 2), (1, 1), 128)[1] == 2
    assert config(source, torch.bfloat16, 32, 512, 32, (7, 7), (7, 7), (1, 1), (1, 1), 128) is None  # fill 49 / 256
    assert config(source, torch.bfloat16, 32, 512, 32, (7, 7), (7, 7), (1, 1), (1, 1), 128, runs_w=2) is not None
    # a block a chunk of 16 of a group's channels: 40 channels a group are 3 chunks
    assert config(source, torch.bfloat16, 2, 80, 2, (56, 56), (7, 7), (1, 1), (1, 1), 16)[0].grid == (14, 2, 6)
    assert config(source, torch.bfloat16, 32768, 64, 2, (56, 56), (7, 7), (1, 1), (1, 1), 16) is None
    assert config(source, torch.float64, 2, 64, 4, (56, 56), (7, 7), (1, 1), (1, 1), 16) is None
    for channels, size, stride in ((64, 56, 1), (128, 56, 2), (128, 28, 1), (256, 28, 2), (256, 14, 1), (512, 14, 2)):
        wide = config(source, torch.float32, 32, channels, channels // 16, (size, size), (7, 7), (stride, stride),
                      (1, 1), channels // 4)
        narrow = config(source, torch.bfloat16, 32, channels, channels // 16, (size, size), (7, 7),
                        (stride, stride), (1, 1), channels // 4)
        assert wide[0].grid == narrow[0].grid and wide[1] == narrow[1], (channels, stride)
        assert wide[0].shared_bytes <= involution_cuda.GENERATED_TILE_MAX_SHARED, (channels, stride)
        # 16-bit: three blocks an SM on sm_90 (228 KiB, a KiB of it each block's), as its launch
        # bounds ask there: every kernel row's weights in one buffer, grad_output in the span
        # rows' place
        assert 3 * (narrow[0].shared_bytes + 1024) <= 228 * 1024, (channels, stride)
    for window, stride, dilation in (((9, 9), (1, 1), (1, 1)), ((7, 5), (1, 1), (1, 1)), ((7, 7), (1, 2), (1, 1)),
                                     ((7, 7), (3, 3), (1, 1)), ((3, 3), (1, 1), (2, 2))):
        assert config(source, torch.bfloat16, 2, 64, 4, (56, 56), window, stride, dilation, 16) is None, window
    assert config(source, torch.bfloat16, 2, 64, 4, (56, 56), (7, 7), (1, 1), (1, 1), 1024) is None
    with pytest.raises(ValueError, match="runs_w must be one of"):  # a warp's 8 runs in whole rows
        config(source, torch.bfloat16, 2, 64, 4, (56, 56), (7, 7), (1, 1), (1, 1), 16, runs_w=3)
    args = grad_input_arguments(TWO_CHANNEL_CHUNKS.arguments(torch.float64))
    out = torch.full((1, 64, 11, 10), 7.0, dtype=torch.float64)
    assert involution_cuda.involution_generated_mma_backward_input_staged(*args, out, EmulatedLauncher()) is None
    assert bool((out == 7).all())


def _assert_non_finite_as_torch(args: tuple, launcher, name: str) -> None:
    result, out = _result(args, launcher, 4)
    assert result is out, name
    assert_non_finite_as_expected(out, float64_reference(GRAD_INPUT, args), GRAD_INPUT.tolerance(out.dtype), name)


@pytest.mark.parametrize("value, dtype", [(float("inf"), torch.bfloat16), (float("nan"), torch.bfloat16),
                                          (float("inf"), torch.float32),
                                          pytest.param(float("nan"), torch.float32, marks=pytest.mark.integration)],
                         ids=["inf-bfloat16", "nan-bfloat16", "inf-float32", "nan-float32"])
def test_non_finite_values_land_where_torch_puts_them(value, dtype):
    """An inf or a nan in grad_output, the feature or the bias: each weight is a whole dot
    product and each sum a plain one (no band zeros), and a pixel outside the map has weight 0
    and grad_output 0, so they land at torch's places (float32's split turns them into nans: a
    warp that meets one forms its weights again by the direct sum). Strides 1 and 2, both
    layouts."""
    require_host_compiler()
    launcher = EmulatedLauncher()
    for case in (TWO_CHANNEL_CHUNKS, GRAD_CASES[-1]):
        for channels_last in (False, True):
            args = grad_input_arguments(case._replace(channels_last=channels_last).arguments(dtype))
            for place, changed in with_one_non_finite(args, NON_FINITE_PLACES, value):
                _assert_non_finite_as_torch(changed, launcher, f"{case.name}-{channels_last}-{place}")


# ---------------------------------------------------------------------------------------
# Planted bugs
# ---------------------------------------------------------------------------------------

# The window read one column late.
WINDOW_LATE = PlantedBug("window-one-column-late", "- (TAPS - 1) - first_column;", "- (TAPS - 1) - first_column + 1;")
# grad_output staged in the span rows' place before every warp formed its weights from them.
FORMED_BARRIER = PlantedBug("formed-barrier",
                            "__syncthreads();  // every kernel row's weights are formed, and the span rows read",
                            "// every kernel row's weights are formed, and the span rows read")
# The weights summed before every warp's grad_output is staged.
STAGED_BARRIER = PlantedBug("staged-barrier", "__syncthreads();  // grad_output is staged", "// grad_output is staged")
# The buffer's places of a tap as if every tap were read by column parity 0 (stride 2 only).
TAP_PARITY = PlantedBug("tap-parity", "const int parity = (b - pad_w) & (STRIDE - 1);", "const int parity = (b - pad_w) & 0;")
# A tap's second bias value taken from the tap after it.
BIAS_TAP = PlantedBug("bias-tap", "taps_bias[K * a + 1];", "taps_bias[K * a + 2];")
# The last place of a tap's row left unformed (its rightmost run's last pixel).
LAST_PLACE = PlantedBug("last-place", "(e ? tap_gap - tap_stride : 0)) < (unsigned int)row_stride;",
                        "(e ? tap_gap - tap_stride : 0)) < (unsigned int)(row_stride - 1);")
# The output rows formed begun one row low: the last kernel row's first unformed.
UNION_FIRST = PlantedBug("union-first", "const int i_first = mma_floor_div(y0 + pad_h - (K - 1) + S - 1, S);",
                         "const int i_first = mma_floor_div(y0 + pad_h - (K - 1) + S - 1, S) + 1;")
# At stride 2, the odd kernel rows' first output rows found with the other parity of row_base:
# their weights stored a row off.
ODD_ROW_ON = PlantedBug("odd-row-on", "odd_row_on = ~row_base & 1;", "odd_row_on = row_base & 1;")
# A kernel row's last row of weights left unformed.
LAST_ROW = PlantedBug("last-row", "(unsigned int)(row0 + rows_on) < (unsigned int)weight_rows;",
                      "(unsigned int)(row0 + rows_on) < (unsigned int)(weight_rows - 1);")
# A lane's second tap placed a tap on from its first, without the column between their runs'
# places (stride 1, and stride 2 at an odd padding).
TAP_GAP = PlantedBug("tap-gap", "const int tap_gap = tap_stride + (S == 1 ? 1 : pad_w & 1);",
                     "const int tap_gap = tap_stride;")
# A formed pixel's row found as if the rows were a column longer: pixels placed off their rows.
PIXEL_ROW = PlantedBug("pixel-row", "0xffffffffu / (unsigned int)region_w + 1u;",
                       "0xffffffffu / (unsigned int)(region_w + 1) + 1u;")
# The weights two taps' rows further on: the last taps past the end of the shared memory.
BUFFER_OVERRUN = PlantedBug("buffer-past-the-end", "(((span_place > staged_place ? span_place : staged_place) + 3) & ~3));",
                            "(((span_place > staged_place ? span_place : staged_place) + 3) & ~3) + 2 * tap_stride);")


# Every bug on a stride-1 and a stride-2 map (the parity bugs only at stride 2, where a tap's
# readers and a kernel row's output rows have a parity; the pixel-row bug at both, every kernel row's weights formed from the
# same pixels, where one row at a time left it benign at stride 2), in both run orders but the
# races', which one order may miss.
STRIDE_CASES = (WIDE[0], WIDE[1])
RACES = ("formed-barrier", "staged-barrier")


@pytest.mark.integration
@pytest.mark.parametrize("bug, cases", [
    *((b, STRIDE_CASES) for b in (WINDOW_LATE, FORMED_BARRIER, STAGED_BARRIER, BIAS_TAP, LAST_PLACE, UNION_FIRST,
                                  LAST_ROW, TAP_GAP, PIXEL_ROW)),
    *((b, STRIDE_CASES[1:]) for b in (TAP_PARITY, ODD_ROW_ON))], ids=lambda b: getattr(b, "name", ""))
def test_a_planted_bug_fails_the_reference_check(bug, cases, tmp_path, monkeypatch):
    require_host_compiler()
    _plant(monkeypatch, tmp_path, bug)
    for case in cases:
        caught = [_caught(lambda: _check(grad_input_arguments(case.arguments(torch.bfloat16)),
                                         EmulatedLauncher(order=order), f"{bug.name}-{order}"))
                  for order in ORDERS]
        assert any(caught) if bug.name in RACES else all(caught), (case.name, caught)


# float32's way (3xTF32, float staging): its places of the 16-bit way's bugs, and its own.
WIDE_WINDOW_LATE = PlantedBug("wide-window-late", "- first_column - (TAPS - 1);", "- first_column - (TAPS - 1) + 1;")
WIDE_ONE_BUFFER = PlantedBug("wide-one-buffer", "(~step & 1) * buffer_taps * tap_stride);", "(step & 1) * buffer_taps * tap_stride);")
WIDE_ROW_BARRIER = PlantedBug("wide-row-barrier",
                              "__syncthreads();  // rows a0 .. a0 + ROWS - 1's float weights (and grad_output) are staged",
                              "// rows a0 .. a0 + ROWS - 1's float weights (and grad_output) are staged")
WIDE_BIAS_TAP = PlantedBug("wide-bias-tap", "rows_bias[1 + K * t] : 0.0f;", "rows_bias[2 + K * t] : 0.0f;")
WIDE_LAST_PLACE = PlantedBug("wide-last-place", "if ((unsigned int)at < (unsigned int)row_stride && ",
                             "if ((unsigned int)at < (unsigned int)(row_stride - 1) && ")
WIDE_UNION_FIRST = PlantedBug("wide-union-first", "mma_floor_div(y0 + pad_h - a0 - (rows - 1) + S - 1, S);",
                              "mma_floor_div(y0 + pad_h - a0 - (rows - 1) + S - 1, S) + 1;")
WIDE_ROW_OF_TAP = PlantedBug("wide-row-of-tap", "const int ui_low = -i_first + ((row_base - t) >> (S - 1));",
                             "const int ui_low = -i_first + ((row_base - t) >> S);")
WIDE_PIXEL_ROW = PlantedBug("wide-pixel-row", "1u + 0xffffffffu / (unsigned int)region_w;",
                            "1u + 0xffffffffu / (unsigned int)(region_w + 1);")
# The product without its lo terms: one TF32 product, about 3 decimal digits.
WIDE_ONE_PRODUCT = PlantedBug("wide-one-product", "oplib_mma_3xtf32(d[t], a_hi, a_lo, b_hi, b_lo);  // (a kernel row's",
                              "oplib_mma_tf32(d[t], a_hi, b_hi), (void)b_lo;  // (a kernel row's")
# The direct sum's feature from the lane's first channel: only a warp that met an inf or a nan runs it.
WIDE_COLD = PlantedBug("wide-cold", "const index_t back = (8 * ((reduced + 7) / 8) + 2 * quad) * feature_step;",
                       "const index_t back = 8 * ((reduced + 7) / 8) * feature_step;")


@pytest.mark.integration
@pytest.mark.parametrize("bug, cases", [
    *((b, STRIDE_CASES) for b in (WIDE_WINDOW_LATE, WIDE_ONE_BUFFER, WIDE_ROW_BARRIER, WIDE_BIAS_TAP, WIDE_LAST_PLACE,
                                  WIDE_UNION_FIRST, WIDE_ROW_OF_TAP, WIDE_ONE_PRODUCT)),
    (WIDE_PIXEL_ROW, STRIDE_CASES[:1])], ids=lambda b: getattr(b, "name", ""))
def test_a_planted_float32_bug_fails_the_reference_check(bug, cases, tmp_path, monkeypatch):
    """In the ascending order, the races in both, either catching them."""
    require_host_compiler()
    _plant(monkeypatch, tmp_path, bug)
    assert_float32_bug_caught(_check, lambda case: grad_input_arguments(case.arguments(torch.float32)), bug, cases,
                              races=bug in (WIDE_ONE_BUFFER, WIDE_ROW_BARRIER))


@pytest.mark.integration
def test_a_planted_float32_cold_path_bug_fails_the_non_finite_check(tmp_path, monkeypatch):
    """Finite values never reach the direct sum; an inf in the feature does."""
    require_host_compiler()
    _plant(monkeypatch, tmp_path, WIDE_COLD)
    assert_only_the_inf_check_catches(_check, _assert_non_finite_as_torch,
                                      grad_input_arguments(WIDE[0].arguments(torch.float32)))


_RUN_SAMPLES = tensor_core_samples_script("test_cuda_generated_mma_grad_input_staged", "GRAD_INPUT", "STAGED_CASES",
                                          "grad_input_arguments", "ASAN_DTYPES", 1)


@pytest.mark.integration
def test_staged_grad_input_is_clean_under_address_sanitizer():
    """The samples, the geometries above, random ones and a nan: no access outside the tensors
    or the dynamic shared memory (the host's size of it is the kernel's layout)."""
    require_host_compiler()
    assert_clean_under_asan(_RUN_SAMPLES.replace("launcher, case.name)", "launcher, case.name, 2)"))


@pytest.mark.integration
def test_address_sanitizer_catches_the_buffer_past_the_end(tmp_path):
    require_host_compiler()
    planted = _planted(tmp_path, involution_cuda.GENERATED_MMA_SOURCE, BUFFER_OVERRUN.text, BUFFER_OVERRUN.bug)
    assert_asan_catches(planted, """
        g, f, s = torch.randn(1, 32, 9, 20).bfloat16(), torch.randn(1, 8, 9, 20).bfloat16(), torch.randn(2 * 49, 8).bfloat16()
        ops.involution_generated_mma_backward_input_staged(g, f, s, None, [9, 20], [7, 7], [1, 1], [3, 3], [1, 1],
                                                           torch.empty(1, 32, 9, 20).bfloat16(), launcher, 8)
    """)


def _gpu_arguments(dtype: torch.dtype) -> list[tuple[tuple, str]]:
    samples = [(s.args, s.name) for s in GRAD_INPUT.sample_inputs("cpu", dtype, False)]
    samples += [(grad_input_arguments(c.arguments(dtype)), c.name) for c in STAGED_CASES]
    samples += [(s.args, f"random-{i}") for i, s in enumerate(random_samples(GRAD_INPUT, dtype, 8, seed=3))]
    samples += [(grad_input_arguments(c.arguments(dtype)), c.name) for c in _random_specialised_cases(6, seed=7)]
    return [(tuple(a.cuda() if isinstance(a, torch.Tensor) else a for a in args), name) for args, name in samples]


@pytest.mark.needs_cuda
@pytest.mark.parametrize("dtype", STAGED_DTYPES, ids=str)
def test_staged_grad_input_on_a_gpu_matches_the_reference(dtype):
    """CuPy's launch, mma.sync and all: the samples, the geometries above, random ones in each
    layout, and an inf where torch puts it."""
    for index, (args, name) in enumerate(_gpu_arguments(dtype)):
        if not _check(args, None, name, RUNS_W[index % 3]):
            assert _declines_only_what_it_has_no_instantiation_for(args), name
    args = [a.cuda() if isinstance(a, torch.Tensor) else a for a in grad_input_arguments(WIDE[0].arguments(dtype))]
    args[0] = args[0].clone()
    args[0][0, 17, 5, 6] = float("inf")
    _assert_non_finite_as_torch(tuple(args), None, "inf")
