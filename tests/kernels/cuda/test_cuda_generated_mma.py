"""generated_mma.cu, involution_generated's forward with both products on tensor cores, on the
host emulation: against the float64 reference on the registry's samples and random geometries
in float16 and bfloat16, both run orders and both ways of staging the input; inf and nan where
torch puts them (the band's zeros would spread them: the warp's direct sum must take over);
under AddressSanitizer; and planted bugs that each check must catch."""

from __future__ import annotations

import contextlib
from typing import NamedTuple

import pytest
import torch

from oplib import registry
from oplib.kernels import KernelSource, load_source
from oplib.kernels.involution import cuda as involution_cuda
from oplib.kernels.involution.layouts import result_like
from oplib.testing.cuda_emulation import INTERLEAVED, ORDERS, EmulatedLauncher
from oplib.testing.toolchain import require_host_compiler

from cuda_test_helpers import (_planted, assert_asan_catches, assert_clean_under_asan, planted_bug_caught,
                               random_samples, tensor_core_samples_script)
from test_cuda_tiles import REDNET_LIKE, TWO_CHANNEL_CHUNKS, TileCase, _random_specialised_cases, gpu_samples
from test_cuda_tiles import _assert_specialised_equals_runtime as assert_bits_equal

GENERATED = registry.get("involution_generated")
DTYPES = involution_cuda.GENERATED_MMA_DTYPES


def _source() -> KernelSource:
    return involution_cuda.load_source(involution_cuda.GENERATED_MMA_SOURCE)


def _result(args: tuple, launcher, specialised: bool = True):
    out = result_like(args[0], args[1].shape[2:])
    return involution_cuda.involution_generated_mma(*args, out, launcher, specialised), out


def float64_reference(spec, args: tuple) -> torch.Tensor:
    """``spec``'s reference on ``args`` in float64."""
    return spec.reference(*(a.double() if isinstance(a, torch.Tensor) else a for a in args))


@contextlib.contextmanager
def no_cold_blocks_on_finite_values(launcher, args: tuple, name: str):
    """Around an emulated launch on finite ``args``: the kernel ran none of its `oplib-cold`
    blocks (the code of infs and nans). A kernel that read shared memory before writing it would
    read the emulation's nans there, and its direct sums could then give the reference's numbers
    from global memory, where a GPU's stale shared memory gives wrong ones."""
    before = getattr(launcher, "cold_block_runs", None)
    yield
    if before is not None and all(bool(a.isfinite().all()) for a in args if isinstance(a, torch.Tensor)):
        assert launcher.cold_block_runs == before, f"{name}: finite values ran the code of infs and nans"


def check_against_reference(spec, result, args: tuple, launcher, name: str, specialised: bool = True) -> bool:
    """A kernel's output, ``result(args, launcher, specialised)`` -> (what the host returned, the
    output), against ``spec``'s float64 reference within its tolerance; False where it declines.
    The launch runs no `oplib-cold` block on finite values (``no_cold_blocks_on_finite_values``)."""
    with no_cold_blocks_on_finite_values(launcher, args, f"{spec.name}[{name}]"):
        returned, out = result(args, launcher, specialised)
    if returned is None:
        return False
    assert returned is out, name
    atol, rtol = spec.tolerance(args[0].dtype)
    torch.testing.assert_close(out.double(), float64_reference(spec, args), atol=atol, rtol=rtol,
                               msg=lambda m: f"{spec.name}[{name}, {args[0].dtype}]: {m}")
    return True


def _reference(args: tuple) -> torch.Tensor:
    return float64_reference(GENERATED, args)


def _check(args: tuple, launcher, name: str, specialised: bool = True) -> bool:
    """The kernel's result against the op's float64 reference; False where it declines."""
    return check_against_reference(GENERATED, _result, args, launcher, name, specialised)


def _declines_only_what_it_cannot_hold(args: tuple) -> bool:
    """More taps than MMA_TAPS, a kernel row wider than MMA_BAND_WIDTH or spanning more than
    MMA_BAND columns, or a window past the shared memory it may ask for."""
    kernel_size, stride, dilation, out_size = args[4], args[5], args[7], tuple(args[1].shape[2:])
    c = _source().constants
    folded = involution_cuda.generated_mma_folds(_source(), out_size[1], kernel_size, stride, dilation)
    steps = involution_cuda.generated_mma_band_steps(_source(), kernel_size, stride, dilation, folded)
    return (kernel_size[0] * kernel_size[1] > c["MMA_TAPS"] or kernel_size[1] > c["MMA_BAND_WIDTH"]
            or 16 * steps > c["MMA_FOLDED_BAND" if folded else "MMA_BAND"]
            or involution_cuda.generated_mma_shared_bytes(_source(), out_size[0], kernel_size, stride, dilation, folded)
            > involution_cuda.GENERATED_TILE_MAX_SHARED)


def _folded(args: tuple) -> bool:
    return involution_cuda.generated_mma_folds(_source(), args[1].shape[3], args[4], args[5], args[7])


def _vectors(args: tuple) -> bool:
    groups = args[2].shape[0] // (args[4][0] * args[4][1])
    return involution_cuda.generated_mma_vectors_fit(args[0], groups)


# RedNet's stage-4 maps, 7x7 at stride 1 (channels_last) and 2 (NCHW): folded runs, an odd
# batch's last block with one sample.
FOLDED = (TileCase(batch=3, channels=64, groups=2, reduced=40, size=(7, 7), kernel_size=(7, 7), stride=(1, 1),
                   padding=(3, 3), dilation=(1, 1), channels_last=True),
          TileCase(batch=2, channels=32, groups=2, reduced=24, size=(14, 13), kernel_size=(7, 7), stride=(2, 2),
                   padding=(3, 3), dilation=(1, 1), channels_last=False))
# The RedNet geometries in channels_last too (the 16-byte staging), and a run past the map's
# right edge with two groups of 32 channels (two chunks each) at stride 2.
CASES = (TWO_CHANNEL_CHUNKS, TWO_CHANNEL_CHUNKS._replace(channels_last=True), *REDNET_LIKE, *FOLDED,
         TileCase(batch=2, channels=64, groups=2, reduced=36, size=(20, 19), kernel_size=(7, 7), stride=(2, 2),
                  padding=(3, 3), dilation=(1, 1), channels_last=True))


# The unit tier runs one thread order (the integration tier both): the tier's minutes.
@pytest.mark.parametrize("order", [ORDERS[0], *(pytest.param(o, marks=pytest.mark.integration)
                                                for o in (*ORDERS[1:], INTERLEAVED))])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_generated_mma_matches_the_reference_on_the_registry_samples(dtype, order):
    """involution_generated's samples (channels_last and strided operands, odd sizes, strides,
    dilations, no bias, an empty batch) and the geometries above, by both stagings, in runs of
    16 and folded."""
    require_host_compiler()
    launcher = EmulatedLauncher(order=order)
    served, ways = 0, set()
    for sample in GENERATED.sample_inputs("cpu", dtype, False):
        if _check(sample.args, launcher, sample.name):
            served += 1
            ways.add((_folded(sample.args), _vectors(sample.args)))
        else:
            assert _declines_only_what_it_cannot_hold(sample.args), sample.name
    for case in CASES:
        args = case.arguments(dtype)
        assert _check(args, launcher, case.name), case.name
        ways.add((_folded(args), _vectors(args)))
    assert served > 5 and ways == {(True, True), (True, False), (False, True), (False, False)}
    assert {launch[3] for launch in launcher.launches} == {256}
    # the samples' 3x3 windows and the 7x7 geometries take the specialised instantiations, every
    # other geometry the one that reads its window from the arguments
    assert {("3", "1"), ("7", "1"), ("7", "2"), involution_cuda.GENERATED_TILE_RUNTIME} <= _specialisations(launcher)


def _specialisations(launcher) -> set[tuple[str, ...]]:
    """The windows (KERNEL, STRIDE) of the forward's launches, folded or not."""
    return {launch[4][:2] for launch in launcher.launches if launch[0] == "involution_generated_mma"}


def _served_result(args: tuple, launcher, specialised: bool) -> torch.Tensor:
    result, out = _result(args, launcher, specialised)
    assert result is out
    return out


def _assert_specialised_equals_runtime(dtype: torch.dtype, device: str, launcher_for) -> None:
    """Random 7x7, 5x5 and 3x3 windows (every one served): the specialised instantiation's bits
    are those of the one that reads its window from the arguments."""
    assert_bits_equal(dtype, device, launcher_for, _served_result, seed=71)


@pytest.mark.parametrize("dtype", [torch.bfloat16, pytest.param(torch.float16, marks=pytest.mark.integration)], ids=str)
def test_specialised_generated_mma_gives_the_runtime_instantiations_bits(dtype):
    require_host_compiler()
    _assert_specialised_equals_runtime(dtype, "cpu", EmulatedLauncher)


@pytest.mark.integration
@pytest.mark.parametrize("order", ORDERS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_generated_mma_matches_the_reference_on_random_geometries(dtype, order):
    """The spec's random geometries (kernel sizes, strides, paddings, dilations, groups, R), half
    of them channels_last; then random square windows around the tile's edges."""
    require_host_compiler()
    launcher = EmulatedLauncher(order=order)
    served = 0
    for index, sample in enumerate(random_samples(GENERATED, dtype, 24, seed=61 + DTYPES.index(dtype))):
        args = sample.args
        if index % 2:
            args = (*(a.contiguous(memory_format=torch.channels_last) for a in args[:2]), *args[2:])
        if _check(args, launcher, f"random-{index}"):
            served += 1
        else:
            assert _declines_only_what_it_cannot_hold(args), index
    assert served >= 16
    for case in _random_specialised_cases(12, seed=67 + DTYPES.index(dtype)):
        args = case.arguments(dtype)
        assert _check(args, launcher, case.name) or _declines_only_what_it_cannot_hold(args), case.name


def test_generated_mma_declines_what_it_does_not_serve():
    """float32 and float64 (no such tensor-core product), more taps than it holds, a kernel row
    wider than its band copies or spanning more columns than its band: None, out untouched."""
    source, config = _source(), involution_cuda.generated_mma_config
    assert config(source, torch.bfloat16, 2, 4, (56, 56), (7, 7), (1, 1), (1, 1)).grid == (49, 4, 1)  # folded
    assert config(source, torch.bfloat16, 3, 4, (7, 7), (7, 7), (1, 1), (1, 1)).grid == (1, 4, 2)  # folded
    assert config(source, torch.bfloat16, 2, 4, (48, 48), (7, 7), (1, 1), (1, 1)).grid == (18, 4, 2)
    assert config(source, torch.float16, 2, 4, (28, 28), (7, 7), (2, 2), (1, 1)).grid == (8, 4, 2)
    assert config(source, torch.float32, 2, 4, (56, 56), (7, 7), (1, 1), (1, 1)) is None
    assert config(source, torch.float64, 2, 4, (56, 56), (7, 7), (1, 1), (1, 1)) is None
    assert config(source, torch.bfloat16, 2, 4, (56, 56), (9, 9), (1, 1), (1, 1)) is None
    assert config(source, torch.bfloat16, 2, 4, (56, 56), (1, 9), (1, 1), (1, 1)) is None
    assert config(source, torch.bfloat16, 2, 4, (56, 56), (3, 3), (4, 4), (1, 1)) is None  # folded: 2 x 31 rows staged
    assert config(source, torch.bfloat16, 2, 4, (48, 48), (3, 3), (5, 5), (1, 1)) is None  # 78 columns, folded 38
    assert config(source, torch.bfloat16, 2, 4, (56, 56), (3, 3), (3, 3), (1, 1)) is not None
    args = TWO_CHANNEL_CHUNKS.arguments(torch.float32)
    out = torch.full((1, 64, 11, 10), 7.0)
    assert involution_cuda.involution_generated_mma(*args, out, EmulatedLauncher()) is None
    assert bool((out == 7).all())


# Where one inf or nan goes (the argument's position, the index): each meets band zeros of the
# other pixels of its run; in the bias, a tap's weight is an inf at every pixel (whose split
# into hi and lo must not make it a nan).
NON_FINITE_PLACES = {
    "input corner": (0, (0, 0, 0, 0)),
    "input interior": (0, (0, 17, 5, 6)),
    "input right edge": (0, (0, 40, 7, 9)),
    "feature": (1, (0, 3, 4, 4)),
    "bias": (3, (5,)),
}


def assert_non_finite_as_expected(out: torch.Tensor, expected: torch.Tensor, tolerance: tuple, name: str) -> None:
    """inf and nan at exactly the reference's places, the finite values within ``tolerance``."""
    assert torch.equal(out.isnan(), expected.isnan()), f"{name}: nan at other places"
    assert torch.equal(out.isinf(), expected.isinf()), f"{name}: inf at other places"
    finite = expected.isfinite()
    atol, rtol = tolerance
    torch.testing.assert_close(out.double()[finite], expected[finite], atol=atol, rtol=rtol, msg=lambda m: f"{name}: {m}")


def with_one_non_finite(args: tuple, places: dict, value: float):
    """(place, args with ``value`` at one of ``places``: argument position -> index, clamped to
    the argument's shape) for each place."""
    for place, (position, index) in places.items():
        changed = list(args)
        changed[position] = args[position].clone()
        changed[position][tuple(min(i, s - 1) for i, s in zip(index, args[position].shape))] = value
        yield place, tuple(changed)


def _assert_non_finite_as_torch(args: tuple, launcher, name: str) -> None:
    result, out = _result(args, launcher)
    assert result is out, name
    assert_non_finite_as_expected(out, _reference(args), GENERATED.tolerance(out.dtype), name)


@pytest.mark.parametrize("channels_last", [False, True], ids=["nchw", "channels_last"])
@pytest.mark.parametrize("value", [float("inf"), float("nan")], ids=["inf", "nan"])
def test_non_finite_values_land_where_torch_puts_them(value, channels_last):
    """An inf or a nan in the input, the feature or the bias: the band's products by zero would
    make nan of its neighbours; the warp's direct sum gives torch's inf and nan, at its places
    only, and the other outputs as before. Strides 1 and 2, both stagings."""
    require_host_compiler()
    launcher = EmulatedLauncher()
    for case in (TWO_CHANNEL_CHUNKS, REDNET_LIKE[1]):
        args = case._replace(channels_last=channels_last).arguments(torch.bfloat16)
        for place, changed in with_one_non_finite(args, NON_FINITE_PLACES, value):
            _assert_non_finite_as_torch(changed, launcher, f"{case.name}-{place}")


# ---------------------------------------------------------------------------------------
# Planted bugs
# ---------------------------------------------------------------------------------------


class PlantedBug(NamedTuple):
    name: str
    text: str
    bug: str


# The bands of a kernel row read before every lane wrote its copies.
_ROWS = "\n                const unsigned int* rows = staged + half * sample_words"
BAND_SYNC = PlantedBug("bands-written-sync", "__syncwarp();  // the bands of row a are written" + _ROWS,
                      "// the bands of row a are written" + _ROWS)
# The input chunk read before the block staged it.
STAGED_BARRIER = PlantedBug("staged-barrier", "__syncthreads();  // the input chunk is staged", "// the input chunk is staged")
# A kernel row's weights one band column to the right.
_COPY_TO = "copy_to[i] = copies ? 2 * j * stride + (folded ? j % 8 : j) * stride_w + b * dilation_w"
BAND_COLUMN = PlantedBug("band-column", _COPY_TO + " : -1;", _COPY_TO + " + 1 : -1;")
# The direct sum one tap short: only the non-finite test reaches it.
DIRECT_SUM = PlantedBug("direct-sum-tap-short", "for (int b = 0; b < kernel_w; ++b) {\n                half_t hi, lo, x_value;",
                        "for (int b = 1; b < kernel_w; ++b) {\n                half_t hi, lo, x_value;")
# The bands one band further on: the last warp's lo band lies past the end of the shared memory.
BANDS_OVERRUN = PlantedBug(
    "bands-past-the-end",
    "unsigned int* band = plain - warp * MMA_TILE_W * plain_stride + 2 * plain_words + warp * MMA_TILE_W * stride;",
    "unsigned int* band = plain - warp * MMA_TILE_W * plain_stride + 2 * plain_words + (warp + 1) * MMA_TILE_W * stride;")
# The span chunk's last k-step left unstaged (its words read as they were).
SPAN_STEPS = PlantedBug("span-steps", "if (16 * step >= reduced - r0) break;", "if (16 * step >= reduced - r0 - 16) break;")
# The feature's pairs loaded as words (channels_last) one pair of R's channels further on.
FEATURE_WORDS = PlantedBug("feature-words", "a.reg[2] = mma_load_pair(low_pixel + r + 8, 1, low_count - 8, true);",
                           "a.reg[2] = mma_load_pair(low_pixel + r + 10, 1, low_count - 10, true);")
# The NCHW staging's step down the rows a column off (each row after a thread's first read one
# column further right).
ROW_STEP = PlantedBug("row-step", "const index_t at_step = (index_t)step * value_h;",
                      "const index_t at_step = (index_t)step * value_h + value_w;")
# The NCHW staging's second pass of a row (its words past MMA_THREADS: stride 2's 24 column words
# of the last channels) left out.
ROW_SLOTS = PlantedBug("row-slots", "for (int slot = 0; slot < 2; ++slot) {", "for (int slot = 0; slot < 1; ++slot) {")
# The split's long way left out where a hi of the warp is an inf or a nan.
_HI_COLD = "  // oplib-cold: a hi of the warp is an inf or a nan"
# Folded runs: the lower row's pixels applied to the upper row's window; a block's second sample
# left unstaged (its warps read the staged rows as they were).
FOLDED_LOWER = PlantedBug("folded-lower", "rows + lower_rows);", "rows + 0 * lower_rows);")
SECOND_SAMPLE = PlantedBug("second-sample", "if (second_sample) {", "if (second_sample && false) {")
SPLIT_LONG_WAY = PlantedBug("split-long-way",
                            "        if (oplib_warp_any(non_finite != 0)) {" + _HI_COLD + "\n            OPLIB_COLD_BLOCK();",
                            "        if (false) {\n            OPLIB_COLD_BLOCK();")


def _plant(monkeypatch, tmp_path, bug: PlantedBug) -> KernelSource:
    planted = _planted(tmp_path, involution_cuda.GENERATED_MMA_SOURCE, bug.text, bug.bug)
    monkeypatch.setattr(involution_cuda, "load_source", lambda filename: planted)
    return planted


@pytest.mark.parametrize("bug", [BAND_COLUMN, *(pytest.param(b, marks=pytest.mark.integration)
                                               for b in (BAND_SYNC, STAGED_BARRIER, SPAN_STEPS))], ids=lambda b: b.name)
def test_a_planted_bug_fails_the_reference_check(bug, tmp_path, monkeypatch):
    require_host_compiler()
    _plant(monkeypatch, tmp_path, bug)
    for order in ORDERS:
        for case in (TWO_CHANNEL_CHUNKS, TWO_CHANNEL_CHUNKS._replace(channels_last=True)):
            for specialised in (True, False):
                launcher = EmulatedLauncher(order=order)
                with planted_bug_caught():
                    _check(case.arguments(torch.bfloat16), launcher, f"{bug.name}-{order}", specialised)
                assert _specialisations(launcher) == {("7", "1") if specialised else involution_cuda.GENERATED_TILE_RUNTIME}


def test_a_planted_direct_sum_bug_fails_the_non_finite_check(tmp_path, monkeypatch):
    require_host_compiler()
    _plant(monkeypatch, tmp_path, DIRECT_SUM)
    args = list(TWO_CHANNEL_CHUNKS.arguments(torch.bfloat16))
    assert _check(tuple(args), EmulatedLauncher(), "finite")  # the band products never run it
    args[0] = args[0].clone()
    args[0][0, 17, 5, 6] = float("inf")
    with pytest.raises(AssertionError, match="inf at other places|not close"):
        _assert_non_finite_as_torch(tuple(args), EmulatedLauncher(), DIRECT_SUM.name)


# Planted bugs in code only some calls take, each with a case that takes other code (it passes)
# and one that takes the planted code (it fails):
# - the host has a channels_last feature's pairs loaded as words, and only it;
# - the stepping word-at-a-time staging is the NCHW input's (channels_last stages 16-byte vectors);
# - a row of stride 2's 7x7 windows is 24 column words of 16 channels, more than a pass of the
#   block (at stride 1 a pass covers whole rows; a folded run's window is 16 column words);
# - a map 7 wide takes folded runs, one 10 wide runs of 16;
# - a block's second sample exists where the batch has one more.
PATH_BUGS = {
    "feature-words": (FEATURE_WORDS, TWO_CHANNEL_CHUNKS, TWO_CHANNEL_CHUNKS._replace(channels_last=True)),
    "row-step": (ROW_STEP, TWO_CHANNEL_CHUNKS._replace(channels_last=True), TWO_CHANNEL_CHUNKS),
    "row-slots": (ROW_SLOTS, TWO_CHANNEL_CHUNKS, TWO_CHANNEL_CHUNKS._replace(size=(21, 20), stride=(2, 2))),
    "folded-lower": (FOLDED_LOWER, TWO_CHANNEL_CHUNKS, FOLDED[0]),
    "second-sample": (SECOND_SAMPLE, REDNET_LIKE[1], FOLDED[1]),
}


# One in the unit tier (the others, 5-7 s each of a new emulation library's compile, in the
# integration tier, as the planted bugs of the reference check above).
@pytest.mark.parametrize("bug, passing, failing", [
    values if name == "feature-words" else pytest.param(*values, marks=pytest.mark.integration)
    for name, values in PATH_BUGS.items()], ids=PATH_BUGS.keys())
def test_a_planted_bug_fails_only_where_its_code_runs(bug, passing, failing, tmp_path, monkeypatch):
    require_host_compiler()
    _plant(monkeypatch, tmp_path, bug)
    assert _check(passing.arguments(torch.bfloat16), EmulatedLauncher(), f"{bug.name} {passing.name}")
    with planted_bug_caught():
        _check(failing.arguments(torch.bfloat16), EmulatedLauncher(), f"{bug.name} {failing.name}")


def test_a_planted_split_without_its_long_way_fails_the_non_finite_check(tmp_path, monkeypatch):
    """The short split alone makes an inf weight's lo a nan: an inf in the bias (a tap's weight an
    inf at every pixel) then lands as nan; finite weights never need the long way."""
    require_host_compiler()
    _plant(monkeypatch, tmp_path, SPLIT_LONG_WAY)
    args = list(TWO_CHANNEL_CHUNKS.arguments(torch.bfloat16))
    assert _check(tuple(args), EmulatedLauncher(), "finite")
    args[3] = args[3].clone()
    args[3][5] = float("inf")
    with pytest.raises(AssertionError, match="nan at other places|inf at other places|not close"):
        _assert_non_finite_as_torch(tuple(args), EmulatedLauncher(), SPLIT_LONG_WAY.name)


def test_the_generated_mma_instantiations_are_the_tiles_pairs():
    """The same square windows as the tiled kernel, picked the same way, each in runs of 16 and
    folded."""
    mma = _source().specialisations["involution_generated_mma"]
    tile = load_source(involution_cuda.SPAN_TILE_SOURCE).specialisations["involution_generated_tile"]
    assert mma == tuple((*window, folded) for window in tile for folded in ("false", "true"))
    pick = involution_cuda.generated_tile_specialisation
    assert pick(_source(), (7, 7), (2, 2), (1, 1), "involution_generated_mma") == ("7", "2")
    assert pick(_source(), (7, 7), (2, 2), (2, 2), "involution_generated_mma") == involution_cuda.GENERATED_TILE_RUNTIME


_RUN_SAMPLES = tensor_core_samples_script("test_cuda_generated_mma", "GENERATED", "CASES", None, "DTYPES", 0)


@pytest.mark.integration
def test_generated_mma_is_clean_under_address_sanitizer():
    """The samples, the geometries above, random ones (every specialised window among them) and
    the direct sum: no access outside the tensors or the dynamic shared memory (the host's size
    of it is the kernel's layout)."""
    require_host_compiler()
    assert_clean_under_asan(_RUN_SAMPLES)


@pytest.mark.integration
def test_address_sanitizer_catches_the_bands_past_the_end(tmp_path):
    require_host_compiler()
    planted = _planted(tmp_path, involution_cuda.GENERATED_MMA_SOURCE, BANDS_OVERRUN.text, BANDS_OVERRUN.bug)
    assert_asan_catches(planted, """
        x, f, s = torch.randn(1, 32, 9, 9).bfloat16(), torch.randn(1, 8, 9, 9).bfloat16(), torch.randn(2 * 49, 8).bfloat16()
        ops.involution_generated_mma(x, f, s, None, [7, 7], [1, 1], [3, 3], [1, 1], torch.empty(1, 32, 9, 9).bfloat16(), launcher)
    """)


@pytest.mark.needs_cuda
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_generated_mma_on_a_gpu_matches_the_reference(dtype):
    """CuPy's launch, mma.sync and all: the samples, the geometries above, random ones, and
    inf and nan where torch puts them."""
    for args, name in gpu_samples(dtype, CASES):
        if not _check(args, None, name):
            assert _declines_only_what_it_cannot_hold(args), name
    for case in (TWO_CHANNEL_CHUNKS, CASES[1]):
        for position, index in ((0, (0, 17, 5, 6)), (3, (5,))):
            args = [a.cuda() if isinstance(a, torch.Tensor) else a for a in case.arguments(dtype)]
            args[position] = args[position].clone()
            args[position][index] = float("inf")
            _assert_non_finite_as_torch(tuple(args), None, f"{case.name}-inf-{position}")


@pytest.mark.needs_cuda
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_specialised_generated_mma_on_a_gpu_gives_the_runtime_instantiations_bits(dtype):
    """What NVRTC makes of the unrolled loops keeps every sum's order too."""
    _assert_specialised_equals_runtime(dtype, "cuda", lambda: None)
