"""generated_mma.cu's staged forward, involution_generated_mma_staged (a tile's weights formed on
tensor cores into shared memory, all taps of a pass at once, then summed by FMAs with the input
staged there too), on the host emulation: against the float64 reference on the registry's
samples and random geometries in float16, bfloat16 and float32 (3xTF32), each tile layout, both run orders and
both ways of staging the input and loading the feature; the same bits whatever the layout; inf
and nan where torch puts them; under AddressSanitizer; and planted bugs that each check must
catch."""

from __future__ import annotations

import pytest
import torch

from oplib.kernels import KernelSource
from oplib.kernels.involution import cuda as involution_cuda
from oplib.kernels.involution.layouts import result_like
from oplib.testing import device_model
from oplib.testing.cuda_emulation import INTERLEAVED, ORDERS, EmulatedLauncher
from oplib.testing.toolchain import require_host_compiler

from cuda_test_helpers import (_planted, assert_asan_catches, assert_clean_under_asan, random_samples,
                               tensor_core_samples_script)
from test_cuda_generated_mma import (CASES, GENERATED, NON_FINITE_PLACES, PlantedBug,
                                     assert_non_finite_as_expected, check_against_reference, float64_reference,
                                     with_one_non_finite)
from test_cuda_generated_mma_grad_input import _caught, _plant
from test_cuda_generated_mma_grad_input_staged import (assert_float32_bug_caught, assert_only_the_inf_check_catches,
                                                       check_every_layout)
from test_cuda_tiles import TWO_CHANNEL_CHUNKS, _random_specialised_cases

KERNEL = "involution_generated_mma_staged"
RUNS_W = involution_cuda.GENERATED_STAGED_RUNS_W
STAGED_DTYPES = involution_cuda.GENERATED_STAGED_DTYPES
# Under AddressSanitizer: a 16-bit type (float16's addresses are bfloat16's) and float32's own way.
ASAN_DTYPES = (torch.bfloat16, torch.float32)


def _source() -> KernelSource:
    return involution_cuda.load_source(involution_cuda.GENERATED_MMA_SOURCE)


def _result(args: tuple, launcher, runs_w=None):
    out = result_like(args[0], args[1].shape[2:])
    return involution_cuda.involution_generated_mma_staged(*args, out, launcher, runs_w), out


def _check(args: tuple, launcher, name: str, runs_w=None) -> bool:
    """The kernel's output against the op's float64 reference; False where it declines."""
    return check_against_reference(GENERATED, _result, args, launcher, f"{name}, runs_w {runs_w}", runs_w)


def _declines_only_what_it_has_no_instantiation_for(args: tuple) -> bool:
    """A window other than a square 3, 5 or 7 at equal strides 1 or 2 without dilation, or shared
    memory past what it may ask for (a large R)."""
    kernel_size, stride, dilation = args[4], args[5], args[7]
    fixed = (kernel_size[0] == kernel_size[1] and stride[0] == stride[1] and tuple(dilation) == (1, 1)
             and kernel_size[0] in (3, 5, 7) and stride[0] in (1, 2))
    largest = max(involution_cuda.generated_mma_staged_forward_shared_bytes(_source(), kernel_size[0], stride[0],
                                                                            runs_w, args[1].shape[1],
                                                                            tuple(args[1].shape[2:]), args[0].dtype)
                  for runs_w in RUNS_W)
    return not fixed or largest > involution_cuda.GENERATED_TILE_MAX_SHARED


# Maps the tiles fill (the host takes them without a forced layout): RedNet's 7x7 at strides 1
# and 2 over two tiles of each layout's width, channels_last and NCHW, an R of 1.5 k-steps and
# an odd one past two (its span rows staged a word a unit, more units a pass than threads), three groups, a 5x5 window with a padding other than K // 2 (outputs 18 x
# 60, 15 x 32, 14 x 14 and 18 x 20); 7x7 maps folded, four samples a block, at strides 1 and 2,
# batches of 6 and 5 (the second block's last samples past the batch).
WIDE = (TWO_CHANNEL_CHUNKS._replace(channels=32, reduced=24, size=(18, 60), channels_last=True),
        TWO_CHANNEL_CHUNKS._replace(channels=32, reduced=41, size=(30, 64), stride=(2, 2)),
        TWO_CHANNEL_CHUNKS._replace(channels=48, groups=3, reduced=16, size=(14, 14), channels_last=True),
        TWO_CHANNEL_CHUNKS._replace(channels=32, reduced=8, size=(20, 26), kernel_size=(5, 5), padding=(1, 3)),
        TWO_CHANNEL_CHUNKS._replace(batch=6, channels=32, reduced=24, size=(7, 7), channels_last=True),
        TWO_CHANNEL_CHUNKS._replace(batch=5, channels=32, reduced=16, size=(13, 13), stride=(2, 2)))
STAGED_CASES = (*CASES, *WIDE)


@pytest.mark.parametrize("order", [ORDERS[0], *(pytest.param(o, marks=pytest.mark.integration)
                                                for o in (*ORDERS[1:], INTERLEAVED))])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32, pytest.param(torch.float16, marks=pytest.mark.integration)],
                         ids=str)
def test_staged_forward_matches_the_reference(dtype, order):
    """The registry's samples (channels_last and strided operands, odd sizes, rectangular
    windows, strides, dilations, no bias, an empty batch) and the geometries above in the tile
    layouts (the unit tier one a geometry, in turn); the wide maps in the layout the host picks,
    which fills them."""
    check_every_layout(GENERATED, _check, _declines_only_what_it_has_no_instantiation_for, STAGED_CASES, WIDE, tuple,
                       dtype, order)


@pytest.mark.integration
@pytest.mark.parametrize("order", ORDERS)
@pytest.mark.parametrize("dtype", STAGED_DTYPES, ids=str)
def test_staged_forward_matches_the_reference_on_random_geometries(dtype, order):
    """The spec's random geometries, half of them channels_last, in a layout each (few are the
    square windows it serves: it declines the others); then random square windows it serves,
    in each layout."""
    require_host_compiler()
    launcher = EmulatedLauncher(order=order)
    for index, sample in enumerate(random_samples(GENERATED, dtype, 24, seed=89 + STAGED_DTYPES.index(dtype))):
        args = sample.args
        if index % 2:
            args = (args[0].contiguous(memory_format=torch.channels_last), args[1].contiguous(
                memory_format=torch.channels_last), *args[2:])
        if not _check(args, launcher, f"random-{index}", RUNS_W[index % 3]):
            assert _declines_only_what_it_has_no_instantiation_for(args), index
    for index, case in enumerate(_random_specialised_cases(18, seed=103 + STAGED_DTYPES.index(dtype))):
        assert _check(case.arguments(dtype), launcher, case.name, RUNS_W[index % 3]), case.name


@pytest.mark.parametrize("dtype", [torch.bfloat16, pytest.param(torch.float32, marks=pytest.mark.integration)], ids=str)
def test_every_layout_gives_the_same_bits(dtype):
    """Each output's sum takes its kernel rows, then its taps, in one order whatever the tile
    and the thread order: the three layouts and both orders give one result, at strides 1 and 2
    (two passes of kernel rows; float32's three and, at stride 2, chunks of 8 channels)."""
    require_host_compiler()
    for case in WIDE[:2]:
        args = case.arguments(dtype)
        results = [_result(args, EmulatedLauncher(order=order), runs_w)[1] for runs_w in RUNS_W for order in ORDERS]
        assert all(torch.equal(results[0], r) for r in results[1:]), case.name


def test_staged_forward_declines_what_it_does_not_serve():
    """float64, windows it has no instantiation for, a map its tiles fill less than
    half of, a span_weight past the shared memory: None, out untouched. RedNet-50's maps in the
    layout that fills them, a 7x7 window's kernel rows in two passes (at stride 2 three, which
    leave room for the folded stride-2 map's four regions beside an R of 128; a 5x5 window's in
    one, at stride 2 two); its 7x7 maps folded, four samples a block."""
    source, config = _source(), involution_cuda.generated_mma_staged_forward_config
    # (batch, channels, groups, output size, kernel, stride, R): RedNet-50's shapes at batch 32
    stage1, runs_w = config(source, torch.bfloat16, 32, 64, 4, (56, 56), (7, 7), (1, 1), (1, 1), 16)
    assert stage1.grid == (14, 4, 32) and stage1.block == (32, 8, 1) and runs_w == 2  # 32 x 8 tiles
    assert config(source, torch.bfloat16, 32, 128, 8, (28, 28), (7, 7), (1, 1), (1, 1), 32)[1] == 8
    assert config(source, torch.bfloat16, 32, 256, 16, (14, 14), (7, 7), (1, 1), (1, 1), 64)[1] == 4
    assert config(source, torch.float16, 32, 128, 8, (28, 28), (7, 7), (2, 2), (1, 1), 32)[0].grid == (4, 8, 32)
    assert config(source, torch.bfloat16, 32, 256, 16, (14, 14), (7, 7), (2, 2), (1, 1), 64)[1] == 4
    passes = involution_cuda.generated_mma_staged_forward_passes
    assert passes(7, 1) == [(0, 4), (4, 7)] and passes(7, 2) == [(0, 3), (3, 5), (5, 7)]
    assert passes(5, 1) == [(0, 5)] and passes(5, 2) == [(0, 3), (3, 5)] and passes(3, 2) == [(0, 2), (2, 3)]
    folded, runs_w = config(source, torch.bfloat16, 32, 512, 32, (7, 7), (7, 7), (1, 1), (1, 1), 128)
    assert folded.grid == (1, 32, 8) and runs_w == 2  # 8 x 32 tiles, 8 x 8 a sample
    assert config(source, torch.bfloat16, 5, 512, 32, (7, 7), (7, 7), (1, 1), (1, 1), 128)[0].grid == (1, 32, 2)
    assert config(source, torch.bfloat16, 32, 512, 32, (7, 7), (7, 7), (2, 2), (1, 1), 128)[0].grid == (1, 32, 8)
    assert config(source, torch.bfloat16, 32, 512, 32, (7, 7), (7, 7), (2, 2), (1, 1), 16) is not None
    assert config(source, torch.bfloat16, 32, 64, 4, (3, 3), (7, 7), (1, 1), (1, 1), 16) is None  # fill 9 / 64
    assert config(source, torch.bfloat16, 32, 512, 32, (7, 7), (7, 7), (1, 1), (1, 1), 128, runs_w=8) is not None
    # a block a chunk of 16 of a group's channels: 40 channels a group are 3 chunks
    assert config(source, torch.bfloat16, 2, 80, 2, (56, 56), (7, 7), (1, 1), (1, 1), 16)[0].grid == (14, 2, 6)
    assert config(source, torch.bfloat16, 32768, 64, 2, (56, 56), (7, 7), (1, 1), (1, 1), 16) is None
    assert config(source, torch.float64, 2, 64, 4, (56, 56), (7, 7), (1, 1), (1, 1), 16) is None
    for window, stride, dilation in (((9, 9), (1, 1), (1, 1)), ((7, 5), (1, 1), (1, 1)), ((7, 7), (1, 2), (1, 1)),
                                     ((7, 7), (3, 3), (1, 1)), ((3, 3), (1, 1), (2, 2))):
        assert config(source, torch.bfloat16, 2, 64, 4, (56, 56), window, stride, dilation, 16) is None, window
    assert config(source, torch.bfloat16, 2, 64, 4, (56, 56), (7, 7), (1, 1), (1, 1), 1024) is None
    with pytest.raises(ValueError, match="runs_w must be one of"):  # a warp's 8 runs in whole rows
        config(source, torch.bfloat16, 2, 64, 4, (56, 56), (7, 7), (1, 1), (1, 1), 16, runs_w=3)
    args = TWO_CHANNEL_CHUNKS.arguments(torch.float64)
    out = torch.full((1, 64, 11, 10), 7.0, dtype=torch.float64)
    assert involution_cuda.involution_generated_mma_staged(*args, out, EmulatedLauncher()) is None
    assert bool((out == 7).all())


def test_the_forward_takes_the_tiles_whose_warps_the_map_reaches_least_in_part():
    """A warp issues its sums for every lane where one of its runs lies in the map, so the
    staged forward's tiles are chosen by the pixels of the warps the map reaches: at 56 x 56 the
    32 x 8 tiles' warps (4 x 8) lie inside the map or wholly past it, where the 8 x 32 tiles, as
    many pixels past the map, end each row of warps (1 x 32) with a warp 24 pixels in it (the
    choice before, the wider of equal fills). grad_input, whose warps at stride 2 take a row and
    column parity each, keeps the tiles' fill. A fill below GENERATED_STAGED_MIN_FILL still
    declines the call, whatever the warps."""
    source = _source()
    warp_pixels = involution_cuda._warp_pixels
    assert warp_pixels((56, 56), (8, 32), (1, 32)) == 56 * 64 and warp_pixels((56, 56), (32, 8), (4, 8)) == 56 * 56
    assert warp_pixels((14, 14), (16, 16), (2, 16)) == 14 * 16 and warp_pixels((7, 7), (8, 8), (4, 8)) == 64
    assert [involution_cuda.generated_mma_staged_forward_warp(source, r) for r in (8, 4, 2)] == [(1, 32), (2, 16), (4, 8)]
    forward, grad_input = involution_cuda.generated_mma_staged_forward_config, involution_cuda.generated_mma_staged_config
    for dtype in (torch.bfloat16, torch.float32):
        assert forward(source, dtype, 32, 64, 4, (56, 56), (7, 7), (1, 1), (1, 1), 16)[1] == 2
        assert grad_input(source, dtype, 32, 64, 4, (56, 56), (7, 7), (1, 1), (1, 1), 16)[1] == 8
    # equal warps keep the wider tiles; 30 x 30: the 8 x 32 tiles' warps reach 30 x 32 pixels, the
    # 32 x 8 tiles' 32 x 32
    assert forward(source, torch.bfloat16, 2, 64, 4, (28, 28), (7, 7), (1, 1), (1, 1), 16)[1] == 8
    assert forward(source, torch.bfloat16, 2, 64, 4, (30, 30), (7, 7), (1, 1), (1, 1), 16)[1] == 8
    assert forward(source, torch.bfloat16, 2, 64, 4, (3, 3), (7, 7), (1, 1), (1, 1), 16) is None


def test_the_forward_weighs_the_gpus_occupancy_where_the_launcher_gives_it():
    """Given the GPU's occupancy (a launcher's ``occupancy``: the driver's on a GPU), the
    forward's tiles are those of the least estimated time there (``_staged_estimate``: the
    busiest SM's share of the warps' pixels over the issue rate its resident blocks allow), of
    any fill once the call is served. RedNet-50's 14 x 14 maps: where the GPU's shared memory
    holds two blocks of the 2-run tiles (47.5 KiB) and one of the 4-run tiles (52.2 KiB), as an
    L40S's 100 KB does, the 2-run tiles; where it holds four of each (an H200's 228 KB), the
    4-run tiles, as without it (bench/results/cuda-model.md predicts the choices on five GPUs).
    A launcher's occupancy reaches the choice through the kernel's own launch."""
    source, config = _source(), involution_cuda.generated_mma_staged_forward_config

    def gpu(shared_per_sm: int, sms: int):
        return lambda shared_bytes: (min(4, shared_per_sm // (shared_bytes + 1024)), sms)

    l40s, h200 = gpu(100 * 1024, 142), gpu(228 * 1024, 132)
    stage3 = (source, torch.bfloat16, 32, 256, 16, (14, 14), (7, 7), (1, 1), (1, 1), 64)
    assert config(*stage3)[1] == 4 and config(*stage3, occupancy=h200)[1] == 4
    assert config(*stage3, occupancy=l40s)[1] == 2
    assert config(*stage3, occupancy=lambda shared_bytes: None)[1] == 4  # a GPU that cannot tell
    stage1 = (source, torch.bfloat16, 32, 64, 4, (56, 56), (7, 7), (1, 1), (1, 1), 16)
    assert config(*stage1, occupancy=l40s)[1] == config(*stage1, occupancy=h200)[1] == 2  # equal estimates: the warps
    assert config(source, torch.bfloat16, 32, 64, 4, (3, 3), (7, 7), (1, 1), (1, 1), 16, occupancy=l40s) is None
    # a choice past the shared memory the kernel takes is no choice: at R = 384 the folded 2-run
    # tiles of a 7x7 map at stride 2 need 99.3 KiB, and the others fill the map too little, so the
    # call is declined with the GPU's occupancy as without it
    wide_r = (source, torch.bfloat16, 32, 512, 32, (7, 7), (7, 7), (2, 2), (1, 1), 384)
    assert config(*wide_r) is None and config(*wide_r, occupancy=h200) is None

    class Recording(device_model.RecordingLauncher):
        def occupancy(self, source, kernel, dtype, specialisation, device, threads, shared_bytes):
            assert kernel == "involution_generated_mma_staged" and threads == 256
            return l40s(shared_bytes)

    x = torch.randn(2, 256, 14, 14, dtype=torch.bfloat16)
    feature, span_weight = torch.randn(2, 64, 14, 14, dtype=torch.bfloat16), torch.randn(16 * 49, 64, dtype=torch.bfloat16)
    for launcher, runs_w in ((Recording(), 2), (device_model.RecordingLauncher(), 4)):
        involution_cuda.involution_generated_mma_staged(x, feature, span_weight, None, (7, 7), (1, 1), (3, 3), (1, 1),
                                                        torch.empty_like(x), launcher)
        (launch,) = launcher.launches
        expected = config(source, torch.bfloat16, 2, 256, 16, (14, 14), (7, 7), (1, 1), (1, 1), 64, runs_w=runs_w)[0]
        assert (launch.grid, launch.shared_bytes) == (expected.grid, expected.shared_bytes), runs_w


def test_the_forward_weighs_the_weights_its_tiles_form(monkeypatch):
    """The estimate counts the weights a tile forms at every one of its pixels, not only the
    warps' sums (STAGED_FORMED_PIXEL a formed pixel, at R = 128). RedNet-50's last stage at stride
    2 (7 x 7 maps, R = 128) on an A100-like GPU (164 KB of shared memory, 108 SMs, two blocks an
    SM at most, as float32's registers allow): in float32 the 2-run tiles, four samples a block
    (256 pixels formed for four maps of 49), where the 4-run tiles form 256 for one map; without
    the formed pixels (their weight 0) the estimate took the 4-run tiles, 1.12-1.21x the 2-run
    ones' time in the offline model. In bfloat16 the 2-run tiles' 87 KiB leave one block an SM:
    the 4-run tiles either way."""
    source, config = _source(), involution_cuda.generated_mma_staged_forward_config
    a100 = lambda shared_bytes: (min(2, 164 * 1024 // (shared_bytes + 1024)), 108)  # noqa: E731
    last_stage = (32, 512, 32, (7, 7), (7, 7), (2, 2), (1, 1), 128)
    assert config(source, torch.float32, *last_stage, occupancy=a100)[1] == 2
    assert config(source, torch.bfloat16, *last_stage, occupancy=a100)[1] == 4
    monkeypatch.setattr(involution_cuda, "STAGED_FORMED_PIXEL", 0.0)
    assert config(source, torch.float32, *last_stage, occupancy=a100)[1] == 4
    assert config(source, torch.bfloat16, *last_stage, occupancy=a100)[1] == 4


def test_the_feature_takes_pixel_pairs_only_where_they_are_aligned_words():
    """The staged forward loads a channel's two pixels as one word (staged_feature_pixel_pairs)
    where an NCHW feature's rows have an even width and every row starts at an even element of
    a 4-byte aligned tensor, in 16 bits; not channels_last (whose channel pairs are words), an
    odd width (RedNet-50's 7x7 maps), a view from an odd element, float32. The launch takes the
    instantiation of the host's answer (FEATURE_PAIRS), which a channels_last feature never sets."""
    pairs = involution_cuda.generated_mma_feature_pairs
    feature = torch.randn(2, 16, 28, 28, dtype=torch.bfloat16)
    assert pairs(feature) and pairs(feature.half())
    assert not pairs(feature.contiguous(memory_format=torch.channels_last))
    assert not pairs(torch.randn(2, 16, 7, 7, dtype=torch.bfloat16))
    assert not pairs(torch.randn(2, 16, 28, 29, dtype=torch.bfloat16)[..., 1:])  # rows 29 apart
    assert not pairs(torch.randn(2 * 16 * 28 * 28 + 1, dtype=torch.bfloat16)[1:].view(2, 16, 28, 28))  # odd start
    assert not pairs(feature.float())
    from oplib.testing.device_model import RecordingLauncher

    for channels_last, expected in ((False, True), (True, False)):
        args = WIDE[1]._replace(channels_last=channels_last).arguments(torch.bfloat16)
        launcher = RecordingLauncher()
        _result(args, launcher)
        assert launcher.launches[0].specialisation[2:] == ("false", "true" if expected else "false"), channels_last


def test_a_map_smaller_than_the_tile_stages_its_own_windows():
    """A block stages the input its tile's pixels in the map read: at RedNet-50's 14x14 maps (a
    16 x 16 tile) 20 x 20 pixels where the whole tile's windows are 22 x 22, which brings the
    third stage's block to three an SM of the H200 (two while it staged the tile's region)."""
    from oplib.testing import device_model

    source = _source()
    region = involution_cuda.generated_mma_staged_forward_region
    assert region(source, 7, 1, 4, (14, 14)) == (20, 20)
    assert region(source, 7, 1, 8, (56, 56)) == (14, 38)  # a map the tiles cover: the tile's windows
    assert region(source, 7, 2, 8, (28, 28)) == (21, 61)
    assert region(source, 5, 1, 8, (3, 100)) == (7, 36)
    for channels, size in ((64, 56), (128, 28), (256, 14)):  # RedNet-50's stride-1 layers, R = C / 4
        config, _ = involution_cuda.generated_mma_staged_forward_config(
            source, torch.bfloat16, 32, channels, channels // 16, (size, size), (7, 7), (1, 1), (1, 1), channels // 4)
        # at the most registers the kernel asks for, 80
        assert device_model.resident_blocks(80, 256, config.shared_bytes, device_model.H200) == 3, size


def test_a_pass_stages_its_own_span_rows():
    """At stride 2 a block holds one pass's span rows at a time (a 7 x 7 window's n-tiles of 8
    taps: 3 of 7), which brings RedNet-50's second stage at stride 2 (R = 32) to three blocks an
    SM of the H200, as its third: with all 56 rows it needed 2.5 KiB more, past what three
    allow. At stride 1 it holds all of them (a pass's would fit no block more)."""
    from oplib.testing import device_model

    source = _source()
    span_tiles = involution_cuda.generated_mma_staged_forward_span_tiles
    assert involution_cuda.generated_mma_staged_forward_pass_tiles(7, 2) == span_tiles(7, 2) == 3
    assert involution_cuda.generated_mma_staged_forward_pass_tiles(7, 1) == 4 and span_tiles(7, 1) == 7
    assert span_tiles(3, 2) == 2 and span_tiles(5, 1) == 4  # (3 x 3 at stride 2: a pass's two n-tiles are all)
    for channels, size in ((128, 56), (256, 28)):  # RedNet-50's stride-2 layers, R = C / 4
        config, _ = involution_cuda.generated_mma_staged_forward_config(
            source, torch.bfloat16, 32, channels, channels // 16, (size // 2, size // 2), (7, 7), (2, 2), (1, 1),
            channels // 4)
        assert device_model.resident_blocks(80, 256, config.shared_bytes, device_model.H200) == 3, size
        all_rows = config.shared_bytes + 4 * 32 * (8 * -(-channels // 4 // 16) + 4)
        assert device_model.resident_blocks(80, 256, all_rows, device_model.H200) == (2 if size == 56 else 3), size


# RedNet-50's involutions at batch 32: (channels, output size, stride), R = C / 4, 7x7 windows.
REDNET50 = ((64, 56, 1), (128, 28, 2), (128, 28, 1), (256, 14, 2), (256, 14, 1), (512, 7, 2), (512, 7, 1))


def test_float32_takes_rednet50_in_a_block_every_architecture_holds():
    """float32's tiles (float span rows and input, 3xTF32) within the 99 KiB every architecture
    gives a block at each of RedNet-50's shapes: a 7x7 window's rows in three passes at stride
    1 too, and at stride 2 a chunk of 8 channels a block (16 took 112-116 KiB), twice the
    blocks; room for three blocks an SM of the H200 at stride 1 (at the 80 registers its launch
    bounds give there) but at the last stage's folded four maps, for two elsewhere (the launch
    bounds' two at stride 2)."""
    from oplib.testing import device_model

    source, config = _source(), involution_cuda.generated_mma_staged_forward_config
    assert involution_cuda.generated_mma_staged_forward_passes(7, 1, wide=True) == [(0, 3), (3, 5), (5, 7)]
    assert involution_cuda.generated_mma_staged_forward_passes(7, 2, wide=True) == [(0, 3), (3, 5), (5, 7)]
    # R in whole k-steps of 8, 8 past a multiple of 16 (a B fragment's loads in 32 banks)
    assert [involution_cuda.generated_mma_staged_wide_span_stride(r) for r in (16, 24, 41)] == [24, 24, 56]
    for channels, out, stride in REDNET50:
        chosen, _ = config(source, torch.float32, 32, channels, channels // 16, (out, out), (7, 7), (stride, stride),
                           (1, 1), channels // 4)
        bf16, _ = config(source, torch.bfloat16, 32, channels, channels // 16, (out, out), (7, 7), (stride, stride),
                         (1, 1), channels // 4)
        assert chosen.shared_bytes <= involution_cuda.GENERATED_TILE_MAX_SHARED, (channels, stride)
        assert chosen.grid[2] == bf16.grid[2] * (2 if stride == 2 else 1), (channels, stride)
        blocks = device_model.resident_blocks(80, 256, chosen.shared_bytes, device_model.H200)
        assert blocks >= (3 if stride == 1 and out > 7 else 2), (channels, stride, blocks)


def _assert_non_finite_as_torch(args: tuple, launcher, name: str) -> None:
    result, out = _result(args, launcher, 4)
    assert result is out, name
    assert_non_finite_as_expected(out, float64_reference(GENERATED, args), GENERATED.tolerance(out.dtype), name)


@pytest.mark.parametrize("value, dtype", [(float("inf"), torch.bfloat16), (float("nan"), torch.bfloat16),
                                          (float("inf"), torch.float32),
                                          pytest.param(float("nan"), torch.float32, marks=pytest.mark.integration)],
                         ids=["inf-bfloat16", "nan-bfloat16", "inf-float32", "nan-float32"])
def test_non_finite_values_land_where_torch_puts_them(value, dtype):
    """An inf or a nan in the input, the feature or the bias: each weight is a whole dot product
    and each sum a plain one (no band zeros), and a window pixel outside the image is 0, so they
    land at torch's places (float32's split turns them into nans: a warp that meets one forms its
    weights again by the direct sum). Strides 1 and 2, both layouts."""
    require_host_compiler()
    launcher = EmulatedLauncher()
    for case in (TWO_CHANNEL_CHUNKS, WIDE[1]):
        for channels_last in (False, True):
            args = case._replace(channels_last=channels_last).arguments(dtype)
            for place, changed in with_one_non_finite(args, NON_FINITE_PLACES, value):
                _assert_non_finite_as_torch(changed, launcher, f"{case.name}-{channels_last}-{place}")


# ---------------------------------------------------------------------------------------
# Planted bugs
# ---------------------------------------------------------------------------------------

# The window read one column late.
WINDOW_LATE = PlantedBug("window-one-column-late", "(S * sample_y * pitch + tx) * STAGED_PIXEL + 2 * quarter",
                         "(S * sample_y * pitch + tx + 1) * STAGED_PIXEL + 2 * quarter")
# A pass's weights read before every warp formed them.
PASS_BARRIER = PlantedBug("pass-barrier", "__syncthreads();  // the pass's weights are formed",
                          "// the pass's weights are formed")
# The second pass's weights formed while warps still read the first's (7x7 windows and stride 2).
BETWEEN_PASSES = PlantedBug("between-passes",
                            "if (pass > 0) __syncthreads();  // every warp is done with the previous pass's weights",
                            "// every warp is done with the previous pass's weights")
# The next pass's span rows staged from the pass's own first n-tile: its taps formed from the
# wrong rows of span_weight (stride 2, where a block holds a pass's rows at a time).
PASS_SPAN = PlantedBug("pass-span", "staged_pass_span_rows<K, PASSES, 1>(span, span_weight, pass + 1, reduced);",
                       "staged_pass_span_rows<K, PASSES, 1>(span, span_weight, pass, reduced);")
# A row's odd columns staged one place early, over its last even column (stride 2 only).
ODD_COLUMNS = PlantedBug("odd-columns", "(col & 1) * ((region_w + 1) >> 1) + (col >> 1)",
                         "(col & 1) * (region_w >> 1) + (col >> 1)")
# A tap's bias taken from the tap after it.
BIAS_TAP = PlantedBug("bias-tap", "thread < taps ? mma_to_float(__ldg(group_bias + thread), half_t())",
                      "thread < taps ? mma_to_float(__ldg(group_bias + thread + 1), half_t())")
# A pass's last tap left unformed.
LAST_TAP = PlantedBug("last-tap", "if (t >= tiles || 8 * first_tile + place >= end_a * K) continue;",
                      "if (t >= tiles || 8 * first_tile + place >= end_a * K - 1) continue;")
# The region staging's carry a column short: the pixel after a row's last staged on the next
# row one place early (and a row's first never staged).
REGION_CARRY = PlantedBug("region-carry", "col -= carry ? region_w : 0;", "col -= carry ? region_w - 1 : 0;")
# The region a row short of what the tile's pixels in the map read.
REGION_ROWS = PlantedBug("region-rows", "const int region_h = S * ((sample_rows < out_h ? sample_rows : out_h) - 1) + K;",
                         "const int region_h = S * ((sample_rows < out_h ? sample_rows : out_h) - 1) + K - 1;")
# Folded, every run's window in the first sample's region.
FOLDED_WINDOW = PlantedBug("folded-window", "staged + run_sample * region_words + (S * sample_y * pitch + tx)",
                           "staged + (S * sample_y * pitch + tx)")
# Folded, every pixel's feature the block's first sample's.
FOLDED_FEATURE = PlantedBug("folded-feature", "(index_t)(inside[h] ? sample : n0) * feature_n",
                            "(index_t)n0 * feature_n")
# The map's last column taken for a pixel outside it (its feature read as zeros: its weights the bias).
LAST_COLUMN = PlantedBug("last-column", "inside[h] = i < out_h && o < out_w && sample < batch;",
                         "inside[h] = i < out_h && o < out_w - 1 && sample < batch;")
# A row's last 16-byte unit of span_weight within R left zero (span staging's vector path).
SPAN_UNIT = PlantedBug("span-unit", "values[v] = count > 0 ? *reinterpret_cast<const Unit*>(at) : Unit{};",
                       "values[v] = count > 8 ? *reinterpret_cast<const Unit*>(at) : Unit{};")
# A span unit stepping past its row's end placed a column late on the next row (its first unit
# never staged).
SPAN_CARRY = PlantedBug("span-carry", "column -= carry ? row_units : 0;", "column -= carry ? row_units - 1 : 0;")
# NCHW pairs staging: a pixel pair's second column given the first's channels; a unit
# stepping past its row's end one pair late on the next row (its first pair never staged).
PAIR_COLUMNS = PlantedBug("pair-columns", "(words[k] >> 16) | (words[k + 1] & 0xffff0000u);",
                          "(words[k] & 0xffffu) | (words[k + 1] << 16);")
PAIR_CARRY = PlantedBug("pair-carry", "pair -= carry ? row_pairs : 0;", "pair -= carry ? row_pairs - 1 : 0;")
# NCHW pixel pairs (staged_feature_pixel_pairs): the first pixel given the second's channels; a
# pixel's second channel of a pair read 8 channels on.
PIXEL_PAIR_HALVES = PlantedBug("pixel-pair-halves", "f.reg[2 * half] = (first & 0xffffu) | second << 16;",
                               "f.reg[2 * half] = first >> 16 | (second & 0xffff0000u);")
PIXEL_PAIR_CHANNEL = PlantedBug("pixel-pair-channel", "reinterpret_cast<const unsigned int*>(channel + feature_c)",
                                "reinterpret_cast<const unsigned int*>(channel + 8 * feature_c)")
# A tap's weights of the lane's two pixels stored the other way round (every layout).
STORE_PAIR = PlantedBug("store-pair", "StagedBias{{d[t].value[e], d[t].value[2 + e]}};",
                        "StagedBias{{d[t].value[2 + e], d[t].value[e]}};")
# The weights a tap's row further on: the buffer's last row past the end of the shared memory.
BUFFER_OVERRUN = PlantedBug("buffer-past-the-end",
                            "float* weights = reinterpret_cast<float*>(staged + (((region_words << fold_shift) + 3) & ~3));",
                            "float* weights = reinterpret_cast<float*>(staged + (((region_words << fold_shift) + 3) & ~3) + tap_stride);")


# Every bug on a stride-1 and a stride-2 map (the parity's only at stride 2),
# in both run orders but the races', which one order may miss; the folding's on folded maps.
STRIDE_CASES = (WIDE[0], WIDE[1])
FOLDED_CASES = (WIDE[4], WIDE[5])


@pytest.mark.integration
@pytest.mark.parametrize("bug, cases", [
    *((b, STRIDE_CASES) for b in (WINDOW_LATE, PASS_BARRIER, BETWEEN_PASSES, BIAS_TAP, LAST_TAP, REGION_ROWS,
                                  STORE_PAIR)),
    # (the stride-2 map's NCHW feature takes pixel pairs, whose two pixels are in the map or out of it
    # together: the last column's bug is benign there)
    (LAST_COLUMN, STRIDE_CASES[:1]),
    # (the stride-2 map is NCHW with even widths: staged in pairs, PAIR_CARRY's place)
    (REGION_CARRY, STRIDE_CASES[:1]),
    # (the vector units' bug where R is a multiple of 8, the stride-1 map's R = 24)
    (SPAN_UNIT, STRIDE_CASES[:1]),
    # (R = 24's rows are whole trips of the block's threads: no unit steps past a row's end there;
    # at R = 41 a pass's 24 rows are 576 word units, more than one a thread)
    *((b, STRIDE_CASES[1:]) for b in (ODD_COLUMNS, PASS_SPAN, SPAN_CARRY, PAIR_COLUMNS, PAIR_CARRY, PIXEL_PAIR_HALVES,
                                      PIXEL_PAIR_CHANNEL)),
    *((b, FOLDED_CASES) for b in (FOLDED_WINDOW, FOLDED_FEATURE))], ids=lambda b: getattr(b, "name", ""))
def test_a_planted_bug_fails_the_reference_check(bug, cases, tmp_path, monkeypatch):
    require_host_compiler()
    _plant(monkeypatch, tmp_path, bug)
    for case in cases:
        caught = [_caught(lambda: _check(case.arguments(torch.bfloat16), EmulatedLauncher(order=order),
                                         f"{bug.name}-{order}"))
                  for order in ORDERS]
        races = bug.name in ("pass-barrier", "between-passes")
        assert any(caught) if races else all(caught), (case.name, caught)


# float32's way (3xTF32, float staging): each of its own places.
# The window read one column late.
WIDE_WINDOW_LATE = PlantedBug("wide-window-late", "(S * sample_y * pitch + tx) * PIXEL + CH * quarter",
                              "(S * sample_y * pitch + tx + 1) * PIXEL + CH * quarter")
# A pass's weights read before every warp formed them.
WIDE_PASS_BARRIER = PlantedBug("wide-pass-barrier", "__syncthreads();  // the pass's float weights are formed",
                               "// the pass's float weights are formed")
# A's two channels of a pixel in the other k order from B's.
WIDE_K_ORDER = PlantedBug("wide-k-order", "oplib_split_tf32_into(hi, lo, 2 * e + h, v[e]);",
                          "oplib_split_tf32_into(hi, lo, 2 * (1 - e) + h, v[e]);")
# The product without its lo terms: one TF32 product, about 3 decimal digits.
WIDE_ONE_PRODUCT = PlantedBug("wide-one-product", "oplib_mma_3xtf32(d[t], a_hi, a_lo, b_hi, b_lo);\n",
                              "oplib_mma_tf32(d[t], a_hi, b_hi), (void)b_lo;\n")
# The next pass's span rows staged from the pass's own first n-tile (both strides: float stages
# a pass's rows at a time).
WIDE_PASS_SPAN = PlantedBug("wide-pass-span",
                            "staged_wide_pass_span_rows<K, PASSES>(span, span_weight, pass + 1, reduced, thread);",
                            "staged_wide_pass_span_rows<K, PASSES>(span, span_weight, pass, reduced, thread);")
# A pass's last tap left unformed.
WIDE_LAST_TAP = PlantedBug("wide-last-tap", "if (t >= tiles || place >= end_a * K - 8 * first_tile) continue;",
                           "if (t >= tiles || place >= end_a * K - 8 * first_tile - 1) continue;")
# The region a row short.
WIDE_REGION_ROWS = PlantedBug("wide-region-rows", "const int region_h = S * (share_h - 1) + K,",
                              "const int region_h = S * (share_h - 1) + K - 1,")
# The region staging's carry a column short.
WIDE_REGION_CARRY = PlantedBug("wide-region-carry", "col -= carry ? per_line : 0;", "col -= carry ? per_line - 1 : 0;")
# Folded, every pixel's feature the block's first sample's.
WIDE_FOLDED_FEATURE = PlantedBug("wide-folded-feature", "const int read_sample = inside[h] ? sample : n0;",
                                 "const int read_sample = n0;")
# The map's last column taken for a pixel outside it.
WIDE_LAST_COLUMN = PlantedBug("wide-last-column", "inside[h] = sample < batch && i < out_h && o < out_w;",
                              "inside[h] = sample < batch && i < out_h && o < out_w - 1;")
# Stride 2's chunk of 8 channels taken as 16: the second chunk's blocks write the next group's
# channels' place, each group's upper half never written.
WIDE_CHUNK = PlantedBug("wide-chunk", "constexpr int CHUNK = S == 2 ? STAGED_WIDE_HALF : MMA_CHANNELS, CH = CHUNK / 4;",
                        "constexpr int CHUNK = MMA_CHANNELS, CH = (S == 2 ? STAGED_WIDE_HALF : MMA_CHANNELS) / 4;")
# The direct sum's feature from the lane's first channel, not the pixel's first: only a warp that
# met an inf or a nan runs it.
WIDE_COLD = PlantedBug("wide-cold", "const index_t back = (2 * quad + 8 * ((reduced + 7) / 8)) * feature_step;",
                       "const index_t back = 8 * ((reduced + 7) / 8) * feature_step;")


@pytest.mark.integration
@pytest.mark.parametrize("bug, cases", [
    *((b, STRIDE_CASES) for b in (WIDE_WINDOW_LATE, WIDE_PASS_BARRIER, WIDE_K_ORDER, WIDE_ONE_PRODUCT, WIDE_PASS_SPAN,
                                  WIDE_LAST_TAP, WIDE_REGION_ROWS, WIDE_LAST_COLUMN)),
    (WIDE_REGION_CARRY, STRIDE_CASES[1:]), (WIDE_CHUNK, STRIDE_CASES[1:]),
    (WIDE_FOLDED_FEATURE, FOLDED_CASES)], ids=lambda b: getattr(b, "name", ""))
def test_a_planted_float32_bug_fails_the_reference_check(bug, cases, tmp_path, monkeypatch):
    """In the ascending order (the 16-bit way's bugs take both), and the race in both, either
    catching it."""
    require_host_compiler()
    _plant(monkeypatch, tmp_path, bug)
    assert_float32_bug_caught(_check, lambda case: case.arguments(torch.float32), bug, cases,
                              races=bug is WIDE_PASS_BARRIER)


@pytest.mark.integration
def test_a_planted_float32_cold_path_bug_fails_the_non_finite_check(tmp_path, monkeypatch):
    """Finite values never reach the direct sum; an inf in the feature does."""
    require_host_compiler()
    _plant(monkeypatch, tmp_path, WIDE_COLD)
    assert_only_the_inf_check_catches(_check, _assert_non_finite_as_torch, WIDE[0].arguments(torch.float32))


_RUN_SAMPLES = tensor_core_samples_script("test_cuda_generated_mma_staged", "GENERATED", "STAGED_CASES", None,
                                          "ASAN_DTYPES", 0)


@pytest.mark.integration
def test_staged_forward_is_clean_under_address_sanitizer():
    """The samples, the geometries above, random ones and a nan: no access outside the tensors
    or the dynamic shared memory (the host's size of it is the kernel's layout)."""
    require_host_compiler()
    assert_clean_under_asan(_RUN_SAMPLES.replace("launcher, case.name)", "launcher, case.name, 2)"))


@pytest.mark.integration
def test_address_sanitizer_catches_the_buffer_past_the_end(tmp_path):
    require_host_compiler()
    planted = _planted(tmp_path, involution_cuda.GENERATED_MMA_SOURCE, BUFFER_OVERRUN.text, BUFFER_OVERRUN.bug)
    assert_asan_catches(planted, """
        x, f, s = torch.randn(1, 32, 9, 20).bfloat16(), torch.randn(1, 8, 9, 20).bfloat16(), torch.randn(2 * 49, 8).bfloat16()
        ops.involution_generated_mma_staged(x, f, s, None, [7, 7], [1, 1], [3, 3], [1, 1],
                                            torch.empty(1, 32, 9, 20).bfloat16(), launcher, 8)
    """)


def _gpu_arguments(dtype: torch.dtype) -> list[tuple[tuple, str]]:
    samples = [(s.args, s.name) for s in GENERATED.sample_inputs("cpu", dtype, False)]
    samples += [(c.arguments(dtype), c.name) for c in STAGED_CASES]
    samples += [(s.args, f"random-{i}") for i, s in enumerate(random_samples(GENERATED, dtype, 8, seed=3))]
    samples += [(c.arguments(dtype), c.name) for c in _random_specialised_cases(6, seed=7)]
    return [(tuple(a.cuda() if isinstance(a, torch.Tensor) else a for a in args), name) for args, name in samples]


@pytest.mark.needs_cuda
@pytest.mark.parametrize("dtype", STAGED_DTYPES, ids=str)
def test_staged_forward_on_a_gpu_matches_the_reference(dtype):
    """CuPy's launch, mma.sync and all: the samples, the geometries above, random ones in each
    layout, and an inf where torch puts it."""
    for index, (args, name) in enumerate(_gpu_arguments(dtype)):
        if not _check(args, None, name, RUNS_W[index % 3]):
            assert _declines_only_what_it_has_no_instantiation_for(args), name
    args = [a.cuda() if isinstance(a, torch.Tensor) else a for a in WIDE[0].arguments(dtype)]
    args[0] = args[0].clone()
    args[0][0, 17, 5, 6] = float("inf")
    _assert_non_finite_as_torch(tuple(args), None, "inf")
