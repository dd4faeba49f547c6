"""generated_mma.cu's generator gradients, involution_generated_mma_backward_generator (the map
gw formed per tile in shared memory on tensor cores, contracted there with span_weight and the
feature), on the host emulation, in bfloat16 and float32 (3xTF32): grad_feature,
grad_span_weight and grad_span_bias against the float64 reference on the registry's samples and
random geometries, both run orders, both ways of staging the input and of loading grad_output;
the same bits in either order and instantiation; inf and nan where torch puts them; under
AddressSanitizer; and planted bugs that each check must catch."""

from __future__ import annotations

from typing import Optional

import pytest
import torch

from oplib import registry
from oplib.kernels import KernelSource
from oplib.kernels.involution import cuda as involution_cuda
from oplib.ops.involution_generated import _generator_grads_result
from oplib.testing.cuda_emulation import INTERLEAVED, ORDERS, EmulatedLauncher
from oplib.testing.toolchain import require_host_compiler

from cuda_test_helpers import (_planted, assert_asan_catches, assert_clean_under_asan, planted_bug_caught,
                               random_samples, tensor_core_samples_script)
from test_cuda_generated_mma import (CASES, FOLDED, PlantedBug, assert_non_finite_as_expected, float64_reference,
                                     no_cold_blocks_on_finite_values, with_one_non_finite)
from test_cuda_generated_mma_grad_input_staged import assert_float32_bug_caught
from test_cuda_tiles import TWO_CHANNEL_CHUNKS, _random_specialised_cases

GENERATOR = registry.get("involution_generated_backward_generator")
KERNEL = "involution_generated_mma_backward_generator"
GENERATOR_DTYPES = involution_cuda.GENERATED_MMA_GENERATOR_DTYPES
OUTPUTS = ("grad_feature", "grad_span_weight", "grad_span_bias")


def _source() -> KernelSource:
    return involution_cuda.load_source(involution_cuda.GENERATED_MMA_SOURCE)


def generator_arguments(forward_args: tuple) -> tuple:
    """involution_generated_backward_generator's arguments for a forward call's: a grad_output of
    the output's size in the input's layout (a seeded draw: the same values each time)."""
    input, feature, span_weight, _, *window = forward_args
    generator = torch.Generator().manual_seed(input.numel() + feature.numel())
    grad = torch.randn(input.shape[0], input.shape[1], *feature.shape[2:], dtype=torch.float64, generator=generator)
    channels_last = input.stride(1) == 1 and input.shape[1] > 1
    grad = grad.to(input.dtype).contiguous(memory_format=torch.channels_last if channels_last else torch.contiguous_format)
    return (grad, feature, span_weight, input, *window)


def _result(args: tuple, launcher, specialised: bool = True, group_splits: Optional[int] = None):
    out = _generator_grads_result(*args)
    return involution_cuda.involution_generated_mma_backward_generator(*args, out, launcher, specialised,
                                                                       group_splits), out


def _check(args: tuple, launcher, name: str, specialised: bool = True, group_splits: Optional[int] = None) -> bool:
    """The kernel's three results against the op's float64 reference, with no `oplib-cold` block
    run on finite values; False where it declines."""
    with no_cold_blocks_on_finite_values(launcher, args, f"{GENERATOR.name}[{name}]"):
        returned, out = _result(args, launcher, specialised, group_splits)
    if returned is None:
        return False
    assert returned is out, name
    atol, rtol = GENERATOR.tolerance(args[0].dtype)
    for label, result, expected in zip(OUTPUTS, out, float64_reference(GENERATOR, args), strict=True):
        torch.testing.assert_close(result.double(), expected, atol=atol, rtol=rtol,
                                   msg=lambda m, label=label: f"{GENERATOR.name}[{name}] {label}: {m}")
    return True


def _declines_only_what_it_cannot_hold(args: tuple) -> bool:
    """A dtype other than bfloat16 and float32, more taps than MMA_TAPS, a run's windows over
    more than MMA_BAND columns, or a window past the shared memory it may ask for."""
    kernel_size, stride, dilation = args[4], args[5], args[7]
    c, narrow, dtype = _source().constants, _narrow(args), args[0].dtype
    columns = involution_cuda.generated_mma_generator_extent(_source(), kernel_size, stride, dilation, narrow)[1]
    return (dtype not in GENERATOR_DTYPES or kernel_size[0] * kernel_size[1] > c["MMA_TAPS"] or columns > c["MMA_BAND"]
            or involution_cuda.generated_mma_generator_shared_bytes(_source(), kernel_size, stride, dilation, narrow, dtype)
            > involution_cuda.GENERATED_TILE_MAX_SHARED)


def _vectors(args: tuple) -> bool:
    groups = args[2].shape[0] // (args[4][0] * args[4][1])
    return involution_cuda.generated_mma_vectors_fit(args[3], groups)


def _grad_words(args: tuple) -> bool:
    groups = args[2].shape[0] // (args[4][0] * args[4][1])
    return involution_cuda.generated_mma_grad_words(args[0], groups)


def _specialisations(launcher) -> set[tuple[str, ...]]:
    """The windows (KERNEL, STRIDE) of the kernel's launches."""
    return {launch[4][:2] for launch in launcher.launches if launch[0] == KERNEL}


def _narrow(args: tuple) -> bool:
    return involution_cuda.generated_mma_generator_narrow(_source(), args[1].shape[3], args[1].shape[1])


# The forward's geometries (two chunks, RedNet's 7x7 at strides 1 and 2, a run past the map's
# edge), stride 2 in channels_last with two chunks, R over two ranges of GEN_GRAD_R with a
# partial second (its grad_span_weight columns and grad_feature channels from two blocks); in
# narrow tiles, a 10x14 map with R past a 16-wide tile's range (two tiles a row, the second's
# last 2 columns past the map), and an 8x8 map with four groups and R over two of their ranges
# (the second partial; the tile's last rows inside the map).
STRIDE_2_CHUNKS = TWO_CHANNEL_CHUNKS._replace(stride=(2, 2), channels_last=True)
GENERATOR_CASES = (*CASES, STRIDE_2_CHUNKS,
                   TWO_CHANNEL_CHUNKS._replace(channels=32, reduced=44, size=(9, 17), channels_last=True),
                   TWO_CHANNEL_CHUNKS._replace(channels=32, reduced=40, size=(10, 14)),
                   TWO_CHANNEL_CHUNKS._replace(groups=4, reduced=72, size=(8, 8), channels_last=True))


# The unit tier runs one thread order (the integration tier both).
@pytest.mark.parametrize("order", [ORDERS[0], *(pytest.param(o, marks=pytest.mark.integration)
                                                for o in (*ORDERS[1:], INTERLEAVED))])
@pytest.mark.parametrize("dtype", GENERATOR_DTYPES, ids=str)
def test_generator_matches_the_reference_on_the_registry_samples(dtype, order):
    """involution_generated_backward_generator's samples (channels_last and transposed operands,
    odd sizes, rectangular windows, strides, dilations, an empty batch) and the geometries
    above, by both stagings of the input and both loads of grad_output, in 16-wide tiles and
    narrow ones."""
    require_host_compiler()
    launcher = EmulatedLauncher(order=order)
    served, staged_by_vectors, grad_words, narrow = 0, set(), set(), set()
    samples = list(GENERATOR.sample_inputs("cpu", dtype, False))
    for sample in samples:
        assert _check(sample.args, launcher, sample.name), sample.name
        served += 1
    for case in GENERATOR_CASES:
        args = generator_arguments(case.arguments(dtype))
        assert _check(args, launcher, case.name), case.name
        staged_by_vectors.add(_vectors(args))
        grad_words.add(_grad_words(args))
        narrow.add(_narrow(args))
    assert served == len(samples) > 5
    assert staged_by_vectors == {True, False} and grad_words == {True, False} and narrow == {True, False}
    assert {launch[3] for launch in launcher.launches} == {256}
    assert {("3", "1"), ("7", "1"), ("7", "2"), involution_cuda.GENERATED_TILE_RUNTIME} <= _specialisations(launcher)
    assert {launch[2] for launch in launcher.launches if launch[0] == KERNEL} > {1}  # R ranges, tiles, samples


@pytest.mark.integration
@pytest.mark.parametrize("order", ORDERS)
@pytest.mark.parametrize("dtype", GENERATOR_DTYPES, ids=str)
def test_generator_matches_the_reference_on_random_geometries(dtype, order):
    """The spec's random geometries, half of them channels_last; then random square windows."""
    require_host_compiler()
    launcher = EmulatedLauncher(order=order)
    served = 0
    for index, sample in enumerate(random_samples(GENERATOR, dtype, 24, seed=97 + GENERATOR_DTYPES.index(dtype))):
        args = sample.args
        if index % 2:
            args = tuple(a.contiguous(memory_format=torch.channels_last) if isinstance(a, torch.Tensor) and a.dim() == 4
                         else a for a in args)
        if _check(args, launcher, f"random-{index}"):
            served += 1
        else:
            assert _declines_only_what_it_cannot_hold(args), index
    assert served >= 16
    for case in _random_specialised_cases(12, seed=101 + GENERATOR_DTYPES.index(dtype)):
        args = generator_arguments(case.arguments(dtype))
        assert _check(args, launcher, case.name), case.name


def _bits(args: tuple, launcher, specialised: bool = True) -> list[torch.Tensor]:
    returned, out = _result(args, launcher, specialised)
    assert returned is out
    return list(out)


@pytest.mark.parametrize("dtype", GENERATOR_DTYPES, ids=str)
def test_the_bits_are_the_same_in_every_order_and_instantiation(dtype):
    """No atomics, every sum in a fixed order: both run orders and the instantiation that reads
    its window from the arguments give the same bits, on the RedNet geometries."""
    require_host_compiler()
    for case in GENERATOR_CASES[2:4]:
        args = generator_arguments(case.arguments(dtype))
        first = _bits(args, EmulatedLauncher(order=ORDERS[0]))
        for launcher, specialised in ((EmulatedLauncher(order=ORDERS[1]), True), (EmulatedLauncher(), False)):
            for label, a, b in zip(OUTPUTS, first, _bits(args, launcher, specialised), strict=True):
                assert torch.equal(a, b), f"{case.name} {label}"


# Four groups of 16 channels: split in 1, 2, 3 (uneven: 1, 1, 2 groups) and 4.
FOUR_GROUPS = TWO_CHANNEL_CHUNKS._replace(groups=4)


@pytest.mark.parametrize("dtype", [torch.bfloat16, pytest.param(torch.float32, marks=pytest.mark.integration)], ids=str)
def test_every_split_of_the_groups_gives_the_reference_and_the_same_span_sums(dtype):
    """grad_feature from the splits' parts within the tolerance at every split; grad_span_weight
    and grad_span_bias, whose sums a split does not change, the same bits at every split; in
    16-wide tiles and narrow ones."""
    require_host_compiler()
    args = generator_arguments(FOUR_GROUPS.arguments(dtype))
    results = {}
    for splits in (1, 2, 3, 4):
        launcher = EmulatedLauncher()
        assert _check(args, launcher, f"{splits} splits", group_splits=splits)
        assert {launch[2] for launch in launcher.launches} == {2 * splits}  # 2 tiles x 1 R range x splits
        results[splits] = _result(args, EmulatedLauncher(), group_splits=splits)[1]
    for splits in (2, 3, 4):
        assert torch.equal(results[1][1], results[splits][1]) and torch.equal(results[1][2], results[splits][2])
    args = generator_arguments(GENERATOR_CASES[-1].arguments(dtype))  # narrow, two R ranges
    assert _narrow(args)
    narrow = [_result(args, EmulatedLauncher(), group_splits=splits)[1] for splits in (1, 2, 3, 4)]
    for splits, out in zip((1, 2, 3, 4), narrow):
        assert _check(args, EmulatedLauncher(), f"narrow, {splits} splits", group_splits=splits)
        assert torch.equal(narrow[0][1], out[1]) and torch.equal(narrow[0][2], out[2])


def test_the_groups_are_split_where_the_grid_is_small():
    """Below GENERATOR_SPLIT_BLOCKS blocks of tiles x R ranges x samples, the fewest splits that
    reach it, at most one a group: RedNet-50's stages 2-4 at batch 32 (a fixed count, not the
    GPU's: the same bits on every GPU)."""
    source, split, config = _source(), involution_cuda.generated_mma_generator_splits, involution_cuda.generated_mma_generator_config
    assert involution_cuda.GENERATOR_SPLIT_BLOCKS == 512
    assert [split(blocks, groups) for blocks, groups in ((896, 4), (512, 8), (256, 8), (128, 16), (128, 2), (1, 3))] == [
        1, 1, 2, 4, 2, 3]
    grids = {size: config(source, torch.bfloat16, 32, channels // 4, (size, size), (7, 7), (1, 1), (1, 1), channels // 16).grid
             for size, channels in ((56, 64), (28, 128), (14, 256), (7, 512))}
    # (14 and 7 in narrow tiles: 2 x 2 and 1 of 8 columns, one and two R ranges of 64)
    assert grids == {56: (28, 1, 32), 28: (8, 2, 32), 14: (4, 4, 32), 7: (1, 16, 32)}


def test_generator_declines_what_it_does_not_serve():
    """float16 (a gw past its range) and float64, more than MMA_TAPS taps, windows over more
    columns than MMA_BAND, shared memory past its limit: None, out untouched."""
    source, config = _source(), involution_cuda.generated_mma_generator_config
    # its blocks per SM depend on the instantiation (three, two for the runtime window): the
    # launchers read the most threads alone
    assert (source.kernels[KERNEL].max_threads, source.kernels[KERNEL].min_blocks) == (256, None)
    assert config(source, torch.bfloat16, 32, 16, (56, 56), (7, 7), (1, 1), (1, 1)).grid == (28, 1, 32)
    assert config(source, torch.bfloat16, 32, 128, (7, 7), (7, 7), (1, 1), (1, 1)).grid == (1, 2, 32)  # narrow
    assert config(source, torch.bfloat16, 32, 64, (28, 28), (7, 7), (2, 2), (1, 1)).grid == (16, 1, 32)  # narrow
    assert config(source, torch.bfloat16, 32, 32, (28, 28), (7, 7), (2, 2), (1, 1)).grid == (8, 1, 32)
    for dtype in (torch.float16, torch.float64):
        assert config(source, dtype, 2, 16, (56, 56), (7, 7), (1, 1), (1, 1)) is None
    assert config(source, torch.bfloat16, 2, 16, (56, 56), (9, 9), (1, 1), (1, 1)) is None  # 81 taps
    assert config(source, torch.bfloat16, 2, 16, (56, 56), (1, 3), (1, 1), (1, 25)) is None  # 66 columns
    assert config(source, torch.bfloat16, 2, 16, (56, 56), (1, 3), (1, 1), (1, 24)) is not None  # 64
    assert config(source, torch.bfloat16, 2, 16, (56, 56), (7, 7), (2, 2), (5, 1)) is None  # 45 rows: 104 KiB
    assert config(source, torch.bfloat16, 2, 16, (56, 56), (7, 7), (2, 2), (4, 1)) is not None  # 39 rows: 97 KiB
    args = generator_arguments(TWO_CHANNEL_CHUNKS.arguments(torch.float16))
    out = tuple(torch.full_like(t, 7.0) for t in _generator_grads_result(*args))
    assert involution_cuda.involution_generated_mma_backward_generator(*args, out, EmulatedLauncher()) is None
    assert all(bool((t == 7).all()) for t in out)


def test_float32_takes_rednet50_in_a_block_every_architecture_holds():
    """float32's tiles (span rows, feature and gw in floats, the input a k-step of 8 channels at
    a time): RedNet-50's 7x7 windows at both strides in the grids bfloat16 takes, each block
    within the 99 KiB every architecture gives one."""
    source, config = _source(), involution_cuda.generated_mma_generator_config
    for size, channels, stride in ((56, 64, 1), (28, 128, 1), (14, 256, 1), (7, 512, 1), (28, 128, 2), (14, 256, 2),
                                   (7, 512, 2)):
        chosen = [config(source, dtype, 32, channels // 4, (size, size), (7, 7), (stride, stride), (1, 1), channels // 16)
                  for dtype in GENERATOR_DTYPES]
        assert chosen[0].grid == chosen[1].grid and chosen[1].block[:2] == (32, 8), (size, stride)
        assert chosen[0].shared_bytes < chosen[1].shared_bytes <= involution_cuda.GENERATED_TILE_MAX_SHARED, (size, stride)


@pytest.mark.parametrize("tensor_cores", [None, True], ids=["default", "tensor-cores"])
def test_the_cuda_writer_takes_the_kernel_where_asked_and_it_serves(tensor_cores):
    """By default (``GENERATOR_ON_TENSOR_CORES``, off until a draw times the kernel) every call
    goes through the float32 map (involution's grad_weight, then the contractions); with the
    kernel asked for, bfloat16 and float32 take it: all within the reference's tolerance."""
    require_host_compiler()
    assert involution_cuda.GENERATOR_ON_TENSOR_CORES is False
    for dtype in (torch.float32, torch.bfloat16):
        args = generator_arguments(TWO_CHANNEL_CHUNKS.arguments(dtype))
        launcher = EmulatedLauncher()
        out = involution_cuda.involution_generated_backward_generator(*args, _generator_grads_result(*args), launcher,
                                                                      tensor_cores)
        atol, rtol = GENERATOR.tolerance(dtype)
        for result, expected in zip(out, float64_reference(GENERATOR, args), strict=True):
            torch.testing.assert_close(result.double(), expected, atol=atol, rtol=rtol)
        assert bool(_specialisations(launcher)) == (tensor_cores is True)


# Where one inf or nan goes (the argument's position, the index).
NON_FINITE_PLACES = {
    "grad_output corner": (0, (0, 0, 0, 0)),
    "grad_output interior": (0, (0, 17, 5, 6)),
    "input edge": (3, (0, 20, 10, 9)),
    "input interior": (3, (0, 3, 4, 4)),
    "feature": (1, (0, 3, 4, 4)),
    "span_weight": (2, (60, 5)),
}


def _assert_non_finite_as_torch(args: tuple, launcher, name: str) -> None:
    returned, out = _result(args, launcher)
    assert returned is out, name
    for label, result, expected in zip(OUTPUTS, out, float64_reference(GENERATOR, args), strict=True):
        assert_non_finite_as_expected(result, expected, GENERATOR.tolerance(result.dtype), f"{name} {label}")


@pytest.mark.parametrize("channels_last", [False, True], ids=["nchw", "channels_last"])
@pytest.mark.parametrize("value, dtype", [(float("inf"), torch.bfloat16), (float("nan"), torch.bfloat16),
                                          (float("inf"), torch.float32),
                                          pytest.param(float("nan"), torch.float32, marks=pytest.mark.integration)],
                         ids=["inf-bfloat16", "nan-bfloat16", "inf-float32", "nan-float32"])
def test_non_finite_values_land_where_torch_puts_them(value, dtype, channels_last):
    """An inf or a nan in grad_output, the input, the feature or span_weight: every product of
    the kernel's sums is one of the reference's (float32's 3xTF32 turns a non-finite operand
    into a nan: the products that meet one are the direct sum's), so its inf and nan land at the
    reference's places in all three results. Strides 1 and 2."""
    require_host_compiler()
    launcher = EmulatedLauncher()
    for case in (TWO_CHANNEL_CHUNKS, STRIDE_2_CHUNKS):
        args = generator_arguments(case._replace(channels_last=channels_last).arguments(dtype))
        for place, changed in with_one_non_finite(args, NON_FINITE_PLACES, value):
            _assert_non_finite_as_torch(changed, launcher, f"{case.name}-{place}")


# ---------------------------------------------------------------------------------------
# Planted bugs
# ---------------------------------------------------------------------------------------


# A product's element read as the neighbouring tap: the band one column off.
BAND_TAP = PlantedBug("band-tap", "const int b = offset / dilation_w;", "const int b = offset / dilation_w + 1;")
# A fixed window's band: fragment rows 0-7 of every n-tile left out at compile time, as if they
# met no tap of their pixels (the first n-tile's taps 0-6 of pixels 0-7 among them).
BAND_PRUNED = PlantedBug("band-pruned", "if (KERNEL > 0 && (column + 6 - 8 * high * STRIDE < 0 ||",
                         "if (KERNEL > 0 && (column + 6 - 8 * STRIDE < 0 ||")
# A fixed window's products formed a batch at a time: every product of a batch from its first
# n-tile's columns.
BAND_BATCH = PlantedBug("band-batch", "gen_grad_load_columns(input_row, 8 * (t0 + u))",
                        "gen_grad_load_columns(input_row, 8 * t0)")
# The input chunk read before the block staged it.
STAGED_BARRIER = PlantedBug("staged-barrier", "__syncthreads();  // the input chunk (and, the first, the span rows) staged",
                            "// the input chunk (and, the first, the span rows) staged")
# grad_span_weight read from other warps' gw before they wrote it.
GW_BARRIER = PlantedBug("gw-barrier", "__syncthreads();  // every warp's gw of the group is split",
                        "// every warp's gw of the group is split")
# A second channel chunk written over the first instead of added to it.
CHUNKS_ADDED = PlantedBug("chunks-added", "*at = first ? value : oplib_add(*at, value);", "(void)first, *at = value;")
# grad_span_bias's last warp's sums (the tile's row 7) left out.
BIAS_PARTS = PlantedBug("bias-parts", "for (int part = 1; part < MMA_WARPS; ++part)",
                        "for (int part = 1; part < MMA_WARPS - 1; ++part)")
# gw's split read before every lane of the warp has stored its products.
PRODUCTS_SYNC = PlantedBug("products-sync", "__syncwarp();  // every lane's products are in the warp's rows",
                           "// every lane's products are in the warp's rows")
# gw's split written over its row before every lane of the warp has read its words.
SPLIT_SYNC = PlantedBug("split-sync", "__syncwarp();  // the row's words read, by every lane, before any is written over",
                        "// the row's words read, by every lane, before any is written over")
# grad_feature's lo fragment loaded from the hi words: hi taken twice, lo never.
FEATURE_LO = PlantedBug("feature-lo", "oplib_load_fragment_a(m_words + tap_pad / 2 + k0 / 2, gw_stride)",
                        "oplib_load_fragment_a(m_words + k0 / 2, gw_stride)")
# grad_span_weight's hi fragment loaded untransposed: pixels taken for taps.
SPAN_TRANSPOSED = PlantedBug("span-transposed", "oplib_load_fragment_a_transposed(at, gw_stride)",
                             "oplib_load_fragment_a(at, gw_stride)")
# grad_span_weight's last k-step of the tile's rows inside the map left out.
LIVE_PIXELS = PlantedBug("live-pixels", "p0 < live_pixels && !inf_flags[0]", "p0 < live_pixels - 16 && !inf_flags[0]")
# The pixels past the map split from what their floats hold (the previous group's split words),
# not as zeros.
PIXELS_PAST_THE_MAP = PlantedBug("pixels-past-the-map", "const bool pixel_inside = out_y < out_h && out_x0 + j < out_w;",
                                 "const bool pixel_inside = true;")
# The last n-tile of products that holds a tap of the map's pixels left out.
LIVE_TILES = PlantedBug("live-tiles", "(kernel_w - 1) * dilation_w) / 8 + 1;", "(kernel_w - 1) * dilation_w) / 8;")
# Narrow tiles: a warp's m-tile one row down where it is two (its pixels' grad_feature to the
# wrong rows); every warp's channels from the range's first half; its second row's stores 8
# pixels along its first, to the result and to a split's part.
NARROW_M_ROWS = PlantedBug("narrow-m-rows", "tile_y * MMA_TILE_H + 2 * (warp % 4) : out_y;",
                           "tile_y * MMA_TILE_H + (warp % 4) : out_y;")
NARROW_R_HALF = PlantedBug("narrow-r-half", "r_half = NARROW ? GEN_GRAD_R * (warp / 4) : 0;", "r_half = 0;")
NARROW_HIGH_ROW = PlantedBug("narrow-high-row", "mma_store_pixels(pair, pixel, NARROW ? result_h : 8 * result_w,",
                             "mma_store_pixels(pair, pixel, 8 * result_w,")
NARROW_HIGH_PART = PlantedBug("narrow-high-part", "high_x = NARROW ? m_x : m_x + 8,", "high_x = m_x + 8,")
# The lo half of gw left out of grad_span_weight: gw rounded to bfloat16 before the batch's sums.
SPAN_LO = PlantedBug("span-lo", "oplib_mma<half_t>(sums[u], lo, b[u]);", "")
# A split's first group one further where the groups do not divide evenly: a group left out.
GROUP_RANGE = PlantedBug("group-range", "group_first = split * groups / group_splits,",
                         "group_first = (split * groups + group_splits - 1) / group_splits,")
# A split row's lo words one row further: the last row's past the end of the dynamic shared memory.
SPLIT_OVERRUN = PlantedBug("split-past-the-end", "*reinterpret_cast<GenGradWords*>(words + tap_pad / 2) =",
                           "*reinterpret_cast<GenGradWords*>(words + tap_pad / 2 + gw_stride) =")
# A batch of span words stored from the batch's first place (a thread's second word of the
# group's span rows wrong).
SPAN_BATCH = PlantedBug("span-batch", "span[r * span_stride + tap / 2] = values[v];",
                        "span[r * span_stride + tap / 2] = values[0];")
# gw's split without its long way where a hi of the warp is an inf or a nan.
SPLIT_LONG_WAY = PlantedBug("split-long-way", "if (non_finite != 0) {  // oplib-cold: a hi is an inf or a nan",
                            "if (false) {")


def _plant(monkeypatch, tmp_path, bug: PlantedBug) -> KernelSource:
    planted = _planted(tmp_path, involution_cuda.GENERATED_MMA_SOURCE, bug.text, bug.bug)
    monkeypatch.setattr(involution_cuda, "load_source", lambda filename: planted)
    return planted


@pytest.mark.parametrize("bug", [pytest.param(BAND_TAP),
                                 *(pytest.param(b, marks=pytest.mark.integration)
                                   for b in (STAGED_BARRIER, GW_BARRIER, CHUNKS_ADDED, BIAS_PARTS, SPLIT_SYNC,
                                             FEATURE_LO, SPAN_TRANSPOSED, LIVE_PIXELS, LIVE_TILES, SPAN_BATCH,
                                             BAND_PRUNED, BAND_BATCH))],
                         ids=lambda b: b.name)
def test_a_planted_bug_fails_the_reference_check(bug, tmp_path, monkeypatch):
    """Each on the two-chunk geometry (stride 1, NCHW) and the stride-2 channels_last one, in
    both orders: every one of them must fail the float64 reference check, or a barrier left out
    may stop the emulation first at an ldmatrix whose row another lane of the warp wrote after
    the reading lane got there. (The bias's last part is the tile's row 7, which only the first
    geometry's 11 output rows reach. The live n-tiles of a run's band bound the products only in
    the instantiation that reads the window from the arguments: a fixed window's forms them all.)"""
    require_host_compiler()
    _plant(monkeypatch, tmp_path, bug)
    for order in ORDERS:
        for case in (TWO_CHANNEL_CHUNKS, *((STRIDE_2_CHUNKS,) if bug is not BIAS_PARTS else ())):
            with planted_bug_caught():
                _check(generator_arguments(case.arguments(torch.bfloat16)), EmulatedLauncher(order=order),
                       f"{bug.name}-{order}", specialised=bug is not LIVE_TILES)


def test_a_planted_split_without_its_long_way_fails_the_non_finite_check(tmp_path, monkeypatch):
    """The short split alone makes an inf of gw (an inf in grad_output) a nan in its lo: the
    results then hold nan where torch puts inf; finite values never need the long way."""
    require_host_compiler()
    _plant(monkeypatch, tmp_path, SPLIT_LONG_WAY)
    args = generator_arguments(TWO_CHANNEL_CHUNKS.arguments(torch.bfloat16))
    assert _check(args, EmulatedLauncher(), "finite")
    (_, changed), = with_one_non_finite(args, {"grad_output interior": NON_FINITE_PLACES["grad_output interior"]},
                                        float("inf"))
    with pytest.raises(AssertionError, match="nan at other places|inf at other places|not close"):
        _assert_non_finite_as_torch(changed, EmulatedLauncher(), SPLIT_LONG_WAY.name)


# The narrow geometries: RedNet's 7x7 at stride 1 (R 40: both halves of a range) and the 8x8
# map with R over two ranges.
NARROW_CASES = (FOLDED[0], GENERATOR_CASES[-1])


@pytest.mark.integration
@pytest.mark.parametrize("bug", [NARROW_M_ROWS, NARROW_R_HALF, NARROW_HIGH_ROW, NARROW_HIGH_PART],
                         ids=lambda b: b.name)
def test_a_planted_narrow_tile_bug_fails_the_reference_check(bug, tmp_path, monkeypatch):
    """Each on the narrow geometries, in both orders, with the groups split (grad_feature in
    parts, the default on these small grids) and in one block (to the result). (The second
    row's stores 8 pixels along land where they belong on the 8-wide map, whose next row is
    8 pixels on in channels_last: the 7-wide one shows them.)"""
    require_host_compiler()
    _plant(monkeypatch, tmp_path, bug)
    splits = (1,) if bug is NARROW_HIGH_ROW else (None,) if bug is NARROW_HIGH_PART else (None, 1)
    for order in ORDERS:
        for case in NARROW_CASES[:1] if bug is NARROW_HIGH_ROW else NARROW_CASES:
            args = generator_arguments(case.arguments(torch.bfloat16))
            assert _narrow(args), case.name
            for group_splits in splits:
                with planted_bug_caught():
                    _check(args, EmulatedLauncher(order=order), f"{bug.name}-{order}", group_splits=group_splits)


@pytest.mark.integration
def test_a_planted_split_before_the_products_are_stored_fails_in_the_order_its_race_runs(tmp_path, monkeypatch):
    """Without the warp barrier after the products, a lane splits words other lanes of its warp
    store after it reads them. On the host the race shows where the lanes run last to first:
    the stride-2 geometry's grad_feature is then far from the reference."""
    require_host_compiler()
    _plant(monkeypatch, tmp_path, PRODUCTS_SYNC)
    with planted_bug_caught():
        _check(generator_arguments(STRIDE_2_CHUNKS.arguments(torch.bfloat16)), EmulatedLauncher(order=ORDERS[1]),
               PRODUCTS_SYNC.name)


@pytest.mark.integration
def test_a_planted_split_of_the_pixels_past_the_map_fails_the_reference_check(tmp_path, monkeypatch):
    """Four groups a block: the tiles' pixels past the map hold the previous group's split words
    (rows past the 11-row map), or floats no products wrote (columns past its edge), which the
    planted split reads as gw."""
    require_host_compiler()
    _plant(monkeypatch, tmp_path, PIXELS_PAST_THE_MAP)
    args = generator_arguments(FOUR_GROUPS.arguments(torch.bfloat16))
    with planted_bug_caught():
        _check(args, EmulatedLauncher(), PIXELS_PAST_THE_MAP.name, group_splits=1)


@pytest.mark.integration
def test_a_planted_group_range_fails_the_reference_check(tmp_path, monkeypatch):
    """Three splits of four groups, in both orders."""
    require_host_compiler()
    _plant(monkeypatch, tmp_path, GROUP_RANGE)
    args = generator_arguments(FOUR_GROUPS.arguments(torch.bfloat16))
    for order in ORDERS:
        with pytest.raises(AssertionError, match="not close"):
            _check(args, EmulatedLauncher(order=order), f"{GROUP_RANGE.name}-{order}", group_splits=3)


def _cancelling_case() -> tuple:
    """grad_span_weight's sums over the batch cancel to a small part of each term: grad_output 1,
    sample 0's input 1 but one channel a group of 1.0625 (gw 16.0625 at every tap inside the
    image, halfway between two bfloat16 values) and its feature +1, sample 1's input all 1 (gw
    16) and its feature -1. The sum over a tap's pixels is 0.0625 a pixel; gw rounded to
    bfloat16 (16) alone makes it 0."""
    input, feature, span_weight, _, *window = TWO_CHANNEL_CHUNKS._replace(batch=2, channels=32).arguments(torch.bfloat16)
    input = torch.ones_like(input)
    input[0, ::16] = 1.0625
    feature = torch.ones_like(feature)
    feature[1] = -1
    grad = torch.ones(2, 32, *feature.shape[2:], dtype=torch.bfloat16)
    return (grad, feature, span_weight, input, *window)


def test_gw_split_in_hi_and_lo_keeps_grad_span_weight_where_sums_cancel(tmp_path, monkeypatch):
    """gw enters grad_span_weight's products as hi and lo: where the sums over a batch's pixels
    cancel, hi alone (the planted kernel without lo) is far from the reference."""
    require_host_compiler()
    args = _cancelling_case()
    assert _check(args, EmulatedLauncher(), "hi and lo")
    _plant(monkeypatch, tmp_path, SPAN_LO)
    with pytest.raises(AssertionError, match="grad_span_weight: Tensor-likes are not close"):
        _check(args, EmulatedLauncher(), "hi alone")


# float32's way (3xTF32, gw and the staged rows in floats): each of its own places.
# B's two channels of a staged column in the other k order from A's.
WIDE_K_ORDER = PlantedBug("wide-k-order", "oplib_split_tf32_into(in_hi, in_lo, 0, in.value[0]);",
                          "oplib_split_tf32_into(in_hi, in_lo, 0, in.value[1]);")
# The input's k-step read before the block staged it.
WIDE_STAGED_BARRIER = PlantedBug("wide-staged-barrier",
                                 "__syncthreads();  // the input's k-step (and, the first, the span rows) staged",
                                 "// the input's k-step (and, the first, the span rows) staged")
# A staged column's two units of 4 channels in each other's place.
WIDE_STAGED_HALVES = PlantedBug("wide-staged-halves", "staged + (y * columns + column) * CH + 4 * half) = v;",
                                "staged + (y * columns + column) * CH + 4 * (half ^ 1)) = v;")
# gw's products without their lo terms: one TF32 product, about 3 decimal digits.
WIDE_ONE_PRODUCT = PlantedBug("wide-one-product", "oplib_mma_3xtf32(product, run_hi, run_lo, in_hi, in_lo);",
                              "oplib_mma_tf32(product, run_hi, in_hi), (void)run_lo, (void)in_lo;")
# grad_feature's every other k-step of taps left out.
WIDE_FEATURE_STEPS = PlantedBug("wide-feature-steps", "gw_finite && m_y < out_h; k0 += 8) {",
                                "gw_finite && m_y < out_h; k0 += 16) {")
# grad_span_weight's gw rows unpaired: a fragment row's tap m0 + r / 2 read for m0 + 2 (r % 8) + r / 8.
WIDE_SPAN_PAIRED = PlantedBug("wide-span-paired", "gw + (p0 + quad + 4 * h) * tap_stride + m0 + 2 * row);",
                              "gw + (p0 + quad + 4 * h) * tap_stride + m0 + row);")
# Narrow tiles: grad_span_weight's second two n-tiles of a warp never summed (their slots as
# torch.empty left them).
WIDE_NARROW_PAIRS = PlantedBug("wide-narrow-pairs", "for (int u0 = 0; u0 < span_tiles; u0 += 2) {",
                               "for (int u0 = 0; u0 < 2; u0 += 2) {")
# gw at the pixels past the map kept as their floats hold (the previous group's gw, or floats no
# products wrote), not as zeros.
WIDE_PIXELS_PAST_THE_MAP = PlantedBug("wide-pixels-past-the-map",
                                      "four.lane[e] = pixel_inside && lane_taps + e < taps ? four.lane[e] : 0.0f;",
                                      "(void)pixel_inside, four.lane[e] = lane_taps + e < taps ? four.lane[e] : 0.0f;")
# A fixed window's products formed a batch at a time: every product of a batch from its first
# n-tile's columns.
WIDE_BAND_BATCH = PlantedBug("wide-band-batch", "gen_grad_wide_product(products[u], run_hi, run_lo, input_row, t0 + u)",
                             "gen_grad_wide_product(products[u], run_hi, run_lo, input_row, t0)")
# gw's pass before every lane of the warp has stored its products.
WIDE_PRODUCTS_SYNC = PlantedBug("wide-products-sync", "__syncwarp();  // every lane's products are in the warp's gw rows",
                                "// every lane's products are in the warp's gw rows")


# Maps wide enough that a row's last batch of products (a fixed window's n-tiles, two at a time on
# the host) holds a tap of a pixel inside the map: a batch's products synchronise the warp's
# lanes, so only the stores after the last batch's may race the pass over gw (16 columns at
# stride 1, the third n-tile; 15 at stride 2, the fifth, whose taps there read columns inside
# the image: at 14 they read the padding, zeros either way).
LAST_BATCH_LIVE = (TWO_CHANNEL_CHUNKS._replace(size=(11, 16)), STRIDE_2_CHUNKS._replace(size=(11, 30)))


@pytest.mark.integration
@pytest.mark.parametrize("bug, cases, group_splits", [
    *((b, (TWO_CHANNEL_CHUNKS, STRIDE_2_CHUNKS), None)
      for b in (WIDE_K_ORDER, WIDE_STAGED_BARRIER, WIDE_STAGED_HALVES, WIDE_ONE_PRODUCT, WIDE_FEATURE_STEPS,
                WIDE_SPAN_PAIRED, WIDE_BAND_BATCH)),
    (WIDE_PRODUCTS_SYNC, LAST_BATCH_LIVE, None),
    (WIDE_NARROW_PAIRS, NARROW_CASES, None), (WIDE_PIXELS_PAST_THE_MAP, (FOUR_GROUPS,), 1)],
    ids=lambda b: getattr(b, "name", ""))
def test_a_planted_float32_bug_fails_the_reference_check(bug, cases, group_splits, tmp_path, monkeypatch):
    """In the ascending order (the 16-bit way's bugs take both), the races in both, either
    catching it; the pixels past the map with four groups in one block (their floats then hold
    the previous group's gw)."""
    require_host_compiler()
    _plant(monkeypatch, tmp_path, bug)
    assert_float32_bug_caught(lambda args, launcher, name: _check(args, launcher, name, group_splits=group_splits),
                              lambda case: generator_arguments(case.arguments(torch.float32)), bug, cases,
                              races=bug in (WIDE_STAGED_BARRIER, WIDE_PRODUCTS_SYNC))


# The direct sums, which only a product, group or block that met an inf or a nan runs, each a term
# short: gw's products (an inf in grad_output), grad_feature's (in span_weight), grad_span_weight's
# (in the feature).
WIDE_COLD_PRODUCT = PlantedBug("wide-cold-product", "for (int k = 0; k < count && (v >> 1 ? high_inside : low_inside); ++k)",
                               "for (int k = 1; k < count && (v >> 1 ? high_inside : low_inside); ++k)")
# A fixed window's batch of products: the direct sum for its first product only, the second's
# 3xTF32 nan kept (grad_output's interior inf is pixel 4's: its taps reach n-tiles 0 and 1, a batch).
WIDE_COLD_BATCH = PlantedBug("wide-cold-batch", "if (oplib_warp_any(non_finite[u]))",
                             "if (u == 0 && oplib_warp_any(non_finite[u]))")
WIDE_COLD_FEATURE = PlantedBug("wide-cold-feature", "for (int tap = 0; tap < taps; ++tap) sum = oplib_fma(gw_row[tap],",
                               "for (int tap = 1; tap < taps; ++tap) sum = oplib_fma(gw_row[tap],")
WIDE_COLD_SPAN = PlantedBug("wide-cold-span", "for (int p = 0; p < live_pixels; ++p)", "for (int p = 1; p < live_pixels; ++p)")


@pytest.mark.integration
@pytest.mark.parametrize("bug, place", [(WIDE_COLD_PRODUCT, "grad_output interior"), (WIDE_COLD_FEATURE, "span_weight"),
                                        (WIDE_COLD_SPAN, "feature"), (WIDE_COLD_BATCH, "grad_output interior")],
                         ids=lambda b: getattr(b, "name", ""))
def test_a_planted_float32_cold_path_bug_fails_the_non_finite_check(bug, place, tmp_path, monkeypatch):
    """Finite values never reach the direct sums; an inf at the place that sends its products
    there does."""
    require_host_compiler()
    _plant(monkeypatch, tmp_path, bug)
    args = generator_arguments(TWO_CHANNEL_CHUNKS.arguments(torch.float32))
    assert _check(args, EmulatedLauncher(), "finite")
    (_, changed), = with_one_non_finite(args, {place: NON_FINITE_PLACES[place]}, float("inf"))
    with pytest.raises(AssertionError, match="^inf grad_"):
        _assert_non_finite_as_torch(changed, EmulatedLauncher(), "inf")


_RUN_SAMPLES = tensor_core_samples_script("test_cuda_generated_mma_generator", "GENERATOR", "GENERATOR_CASES",
                                          "generator_arguments", "GENERATOR_DTYPES", 3)


@pytest.mark.integration
def test_generator_is_clean_under_address_sanitizer():
    """The samples, the geometries above and random ones: no access outside the tensors, the
    partial sums or the dynamic shared memory (the host's size of it is the kernel's layout)."""
    require_host_compiler()
    assert_clean_under_asan(_RUN_SAMPLES)


# float32's pass over gw a row further: the last warp's last row past the end of the dynamic
# shared memory.
WIDE_ROW_OVERRUN = PlantedBug("wide-row-past-the-end", "float* gw_row = warp_gw + j * tap_stride + lane_taps;",
                              "float* gw_row = warp_gw + (j + 1) * tap_stride + lane_taps;")


@pytest.mark.integration
@pytest.mark.parametrize("bug, dtype", [(SPLIT_OVERRUN, "bfloat16"), (WIDE_ROW_OVERRUN, "float")],
                         ids=lambda b: getattr(b, "name", ""))
def test_address_sanitizer_catches_a_row_past_the_end(bug, dtype, tmp_path):
    require_host_compiler()
    planted = _planted(tmp_path, involution_cuda.GENERATED_MMA_SOURCE, bug.text, bug.bug)
    assert_asan_catches(planted, f"""
        g, f, s = torch.randn(1, 32, 9, 9).{dtype}(), torch.randn(1, 8, 9, 9).{dtype}(), torch.randn(2 * 49, 8).{dtype}()
        x = torch.randn(1, 32, 9, 9).{dtype}()
        out = (torch.empty(1, 8, 9, 9).{dtype}(), torch.empty(98, 8).{dtype}(), torch.empty(98).{dtype}())
        ops.involution_generated_mma_backward_generator(g, f, s, x, [7, 7], [1, 1], [3, 3], [1, 1], out, launcher)
    """)


def _gpu_arguments(dtype: torch.dtype) -> list[tuple[tuple, str]]:
    samples = [(s.args, s.name) for s in GENERATOR.sample_inputs("cpu", dtype, False)]
    samples += [(generator_arguments(c.arguments(dtype)), c.name) for c in GENERATOR_CASES]
    samples += [(s.args, f"random-{i}") for i, s in enumerate(random_samples(GENERATOR, dtype, 8, seed=3))]
    samples += [(generator_arguments(c.arguments(dtype)), c.name) for c in _random_specialised_cases(6, seed=7)]
    return [(tuple(a.cuda() if isinstance(a, torch.Tensor) else a for a in args), name) for args, name in samples]


@pytest.mark.needs_cuda
def test_generator_on_a_gpu_matches_the_reference():
    """CuPy's launch, mma.sync and all, in bfloat16 and float32: the samples, the geometries
    above, random ones, an inf where torch puts it, and the same bits twice."""
    for dtype in GENERATOR_DTYPES:
        for args, name in _gpu_arguments(dtype):
            if not _check(args, None, name):
                assert _declines_only_what_it_cannot_hold(args), name
        args = [a.cuda() if isinstance(a, torch.Tensor) else a for a in generator_arguments(CASES[1].arguments(dtype))]
        assert all(torch.equal(a, b) for a, b in zip(_bits(tuple(args), None), _bits(tuple(args), None)))
        args[0] = args[0].clone()
        args[0][0, 17, 5, 6] = float("inf")
        _assert_non_finite_as_torch(tuple(args), None, f"inf {dtype}")
