"""generated_mma.cu's grad_input, involution_generated_mma_backward_input (the forward's band
transposed: a band column holds one output pixel's weights, formed per kernel row), on the host
emulation: against the float64 reference on the registry's samples and random geometries in
float16 and bfloat16, both run orders and both ways of staging grad_output; inf and nan where
torch puts them; under AddressSanitizer; and planted bugs that each check must catch."""

from __future__ import annotations


import pytest
import torch

from oplib import registry
from oplib.kernels import KernelSource
from oplib.kernels.involution import cuda as involution_cuda
from oplib.kernels.involution.layouts import result_like
from oplib.testing.cuda_emulation import INTERLEAVED, ORDERS, EmulatedLauncher
from oplib.testing.toolchain import require_host_compiler

from cuda_test_helpers import (_planted, assert_asan_catches, assert_clean_under_asan, planted_bug_caught,
                               random_samples, tensor_core_samples_script)
from test_cuda_generated_mma import (CASES, DTYPES, PlantedBug, assert_non_finite_as_expected, check_against_reference,
                                     float64_reference, with_one_non_finite)
from test_cuda_tiles import TWO_CHANNEL_CHUNKS, _random_specialised_cases
from test_cuda_tiles import _assert_specialised_equals_runtime as assert_bits_equal

GRAD_INPUT = registry.get("involution_generated_backward_input")
KERNEL = "involution_generated_mma_backward_input"


def _source() -> KernelSource:
    return involution_cuda.load_source(involution_cuda.GENERATED_MMA_SOURCE)


def grad_input_arguments(forward_args: tuple) -> tuple:
    """involution_generated_backward_input's arguments for a forward call's: a grad_output of the
    output's size in the input's layout, on the input's device (the same values each time: a
    seeded draw on the CPU; left there, a GPU test's kernel read host memory)."""
    input, feature, span_weight, span_bias, *window = forward_args
    generator = torch.Generator().manual_seed(input.numel() + feature.numel())
    grad = torch.randn(input.shape[0], input.shape[1], *feature.shape[2:], dtype=torch.float64, generator=generator)
    grad = grad.to(input.device, input.dtype).contiguous(memory_format=torch.channels_last if input.stride(1) == 1 and input.shape[1] > 1
                                           else torch.contiguous_format)
    return (grad, feature, span_weight, span_bias, list(input.shape[2:]), *window)


def _result(args: tuple, launcher, specialised: bool = True):
    out = result_like(args[0], args[4])
    return involution_cuda.involution_generated_mma_backward_input(*args, out, launcher, specialised), out


def _reference(args: tuple) -> torch.Tensor:
    return float64_reference(GRAD_INPUT, args)


def _check(args: tuple, launcher, name: str, specialised: bool = True) -> bool:
    """The kernel's grad_input against the op's float64 reference; False where it declines."""
    return check_against_reference(GRAD_INPUT, _result, args, launcher, name, specialised)


def _declines_only_what_it_cannot_hold(args: tuple) -> bool:
    """A kernel row wider than one n-tile of taps, more output columns than the band holds, or
    shared memory past what it may ask for (a large R)."""
    kernel_size, stride, dilation = args[5], args[6], args[8]
    c = _source().constants
    steps = involution_cuda.generated_mma_backward_extent(_source(), kernel_size, stride, dilation)[1]
    return (kernel_size[1] > c["MMA_BAND_WIDTH"] or 16 * steps > c["MMA_GRAD_BAND"]
            or involution_cuda.generated_mma_backward_shared_bytes(_source(), kernel_size, stride, dilation,
                                                                   args[1].shape[1])
            > involution_cuda.GENERATED_TILE_MAX_SHARED)


def _vectors(args: tuple) -> bool:
    groups = args[2].shape[0] // (args[5][0] * args[5][1])
    return involution_cuda.generated_mma_vectors_fit(args[0], groups)


def _specialisations(launcher) -> set[tuple[str, ...]]:
    return {launch[4] for launch in launcher.launches if launch[0] == KERNEL}


# An R past what a thread's feature share holds (MMA_FEATURE_SHARE words, 8 or 16 threads a
# pixel), so that it stages the rest as it stores: two k-steps of pixels (32, 8 threads each:
# R over 64) in channels_last, and one (16, 16 threads each: R over 128) in NCHW.
LARGE_R = (TWO_CHANNEL_CHUNKS._replace(channels=32, reduced=72, size=(15, 14), channels_last=True),
           TWO_CHANNEL_CHUNKS._replace(channels=32, reduced=136, size=(7, 7)))
# The forward's geometries (two chunks, RedNet's 7x7 at strides 1 and 2, a run past the map's
# edge), the large Rs, and stride 2 in channels_last with two chunks: stride 2 leaves every
# other input pixel of a row without the taps of half the kernel rows.
STRIDE_2_CHUNKS = TWO_CHANNEL_CHUNKS._replace(stride=(2, 2), channels_last=True)
GRAD_CASES = (*CASES, *LARGE_R, STRIDE_2_CHUNKS)


# The unit tier runs bfloat16 in one thread order (the integration tier float16 and both orders).
@pytest.mark.parametrize("order", [ORDERS[0], *(pytest.param(o, marks=pytest.mark.integration)
                                                for o in (*ORDERS[1:], INTERLEAVED))])
@pytest.mark.parametrize("dtype", [torch.bfloat16, pytest.param(torch.float16, marks=pytest.mark.integration)], ids=str)
def test_grad_input_matches_the_reference_on_the_registry_samples(dtype, order):
    """involution_generated_backward_input's samples (channels_last, odd sizes, rectangular
    windows, strides, dilations, no bias, an empty batch) and the geometries above, by both
    stagings of grad_output and both ways of loading the feature."""
    require_host_compiler()
    launcher = EmulatedLauncher(order=order)
    served, staged_by_vectors, feature_words = 0, set(), set()
    for sample in GRAD_INPUT.sample_inputs("cpu", dtype, False):
        if _check(sample.args, launcher, sample.name):
            served += 1
            staged_by_vectors.add(_vectors(sample.args))
            feature_words.add(involution_cuda.generated_mma_feature_words(sample.args[1]))
        else:
            assert _declines_only_what_it_cannot_hold(sample.args), sample.name
    for case in GRAD_CASES:
        args = grad_input_arguments(case.arguments(dtype))
        assert _check(args, launcher, case.name), case.name
        staged_by_vectors.add(_vectors(args))
        feature_words.add(involution_cuda.generated_mma_feature_words(args[1]))
    assert served == len(list(GRAD_INPUT.sample_inputs("cpu", dtype, False)))
    assert staged_by_vectors == {True, False} and feature_words == {True, False}  # both ways of each load
    assert {launch[3] for launch in launcher.launches} == {256}
    assert {("3", "1"), ("7", "1"), ("7", "2"), involution_cuda.GENERATED_TILE_RUNTIME} <= _specialisations(launcher)


def _served_result(forward_args: tuple, launcher, specialised: bool) -> torch.Tensor:
    result, out = _result(grad_input_arguments(forward_args), launcher, specialised)
    assert result is out
    return out


@pytest.mark.parametrize("dtype", [torch.bfloat16, pytest.param(torch.float16, marks=pytest.mark.integration)], ids=str)
def test_specialised_grad_input_gives_the_runtime_instantiations_bits(dtype):
    """Random 7x7, 5x5 and 3x3 windows: the specialised instantiation's bits are the runtime one's."""
    require_host_compiler()
    assert_bits_equal(dtype, "cpu", EmulatedLauncher, _served_result, seed=73)


@pytest.mark.integration
@pytest.mark.parametrize("order", ORDERS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_grad_input_matches_the_reference_on_random_geometries(dtype, order):
    """The spec's random geometries, half of them channels_last; then random square windows."""
    require_host_compiler()
    launcher = EmulatedLauncher(order=order)
    served = 0
    for index, sample in enumerate(random_samples(GRAD_INPUT, dtype, 24, seed=83 + DTYPES.index(dtype))):
        args = sample.args
        if index % 2:
            args = (args[0].contiguous(memory_format=torch.channels_last), args[1].contiguous(
                memory_format=torch.channels_last), *args[2:])
        if _check(args, launcher, f"random-{index}"):
            served += 1
        else:
            assert _declines_only_what_it_cannot_hold(args), index
    assert served >= 16
    for case in _random_specialised_cases(12, seed=89 + DTYPES.index(dtype)):
        args = grad_input_arguments(case.arguments(dtype))
        assert _check(args, launcher, case.name), case.name


def test_grad_input_declines_what_it_does_not_serve():
    """float32 and float64, a kernel row wider than an n-tile of taps, more output columns than
    the band holds, a span_weight past the shared memory: None, out untouched."""
    source, config = _source(), involution_cuda.generated_mma_backward_config
    assert config(source, torch.bfloat16, 2, 4, (56, 56), (7, 7), (1, 1), (1, 1), 16).grid == (28, 4, 2)
    assert config(source, torch.float16, 2, 4, (56, 56), (7, 7), (2, 2), (1, 1), 128).grid == (28, 4, 2)
    assert config(source, torch.float32, 2, 4, (56, 56), (7, 7), (1, 1), (1, 1), 16) is None
    assert config(source, torch.float64, 2, 4, (56, 56), (7, 7), (1, 1), (1, 1), 16) is None
    assert config(source, torch.bfloat16, 2, 4, (56, 56), (9, 9), (1, 1), (1, 1), 16) is None
    assert config(source, torch.bfloat16, 2, 4, (56, 56), (9, 1), (1, 1), (1, 1), 16) is not None
    assert config(source, torch.bfloat16, 2, 4, (56, 56), (3, 3), (1, 1), (9, 9), 16) is None  # 34 columns
    assert config(source, torch.bfloat16, 2, 4, (56, 56), (3, 3), (1, 1), (8, 8), 16) is not None  # 32
    assert config(source, torch.bfloat16, 2, 4, (56, 56), (7, 7), (1, 1), (1, 1), 256) is not None
    # the span rows and an output row's feature past 99 KiB
    assert config(source, torch.bfloat16, 2, 4, (56, 56), (7, 7), (1, 1), (1, 1), 512) is None
    args = grad_input_arguments(TWO_CHANNEL_CHUNKS.arguments(torch.float32))
    out = torch.full((1, 64, 11, 10), 7.0)
    assert involution_cuda.involution_generated_mma_backward_input(*args, out, EmulatedLauncher()) is None
    assert bool((out == 7).all())


# Where one inf or nan goes (the argument's position, the index).
NON_FINITE_PLACES = {
    "grad_output corner": (0, (0, 0, 0, 0)),
    "grad_output interior": (0, (0, 17, 5, 6)),
    "grad_output right edge": (0, (0, 40, 7, 9)),
    "feature": (1, (0, 3, 4, 4)),
    "bias": (3, (5,)),
}


def _assert_non_finite_as_torch(args: tuple, launcher, name: str) -> None:
    result, out = _result(args, launcher)
    assert result is out, name
    assert_non_finite_as_expected(out, _reference(args), GRAD_INPUT.tolerance(out.dtype), name)


@pytest.mark.parametrize("channels_last", [False, True], ids=["nchw", "channels_last"])
@pytest.mark.parametrize("value", [float("inf"), float("nan")], ids=["inf", "nan"])
def test_non_finite_values_land_where_torch_puts_them(value, channels_last):
    """An inf or a nan in grad_output, the feature or the bias: the warp's direct sum gives
    torch's inf and nan, at its places only. Strides 1 and 2, both stagings. (An inf in the bias
    is an inf weight, whose lo the kernel's unchecked split makes a nan: the direct sums, which
    form each weight anew, must still give torch's inf.)"""
    require_host_compiler()
    launcher = EmulatedLauncher()
    for case in (TWO_CHANNEL_CHUNKS, STRIDE_2_CHUNKS):
        args = grad_input_arguments(case._replace(channels_last=channels_last).arguments(torch.bfloat16))
        for place, changed in with_one_non_finite(args, NON_FINITE_PLACES, value):
            runs = launcher.cold_block_runs
            _assert_non_finite_as_torch(changed, launcher, f"{case.name}-{place}")
            # the emulation counts the direct sums' runs (what a check on finite values requires none of)
            assert launcher.cold_block_runs > runs, (case.name, place)


# ---------------------------------------------------------------------------------------
# Planted bugs
# ---------------------------------------------------------------------------------------


# A band value one input pixel too far: tap b's weight at the next row of the band.
BAND_PLACE = PlantedBug("band-place", "j = o * stride_w - pad_w + b * dilation_w - x0;",
                        "j = o * stride_w - pad_w + b * dilation_w - x0 + 1;")
# An output row's feature read before the block staged it (and the grad_output chunk, which the
# same barrier orders on the first row).
STAGED_BARRIER = PlantedBug("staged-barrier", "__syncthreads();  // the row's feature is staged",
                            "// the row's feature is staged")
# An output row's feature staged over the previous row's while a warp may still read it.
FEATURE_REUSED = PlantedBug("feature-reused", "__syncthreads();  // the previous row's feature is used",
                            "// the previous row's feature is used")
# The direct sum one tap short: only the non-finite test reaches it.
DIRECT_SUM = PlantedBug("direct-sum-tap-short", "for (int b = 0; b < kernel_w; ++b) {\n                const int from_x",
                        "for (int b = 1; b < kernel_w; ++b) {\n                const int from_x")
# The band's last k-step with output pixels of the map taken as past it (its weights neither
# formed nor applied).
LIVE_STEPS = PlantedBug("live-steps", ": (live_columns + 15) / 16;", ": live_columns / 16;")
# The next row's feature loaded a row ahead for the row itself (each row but the first staged
# with its predecessor's feature).
NEXT_ROW = PlantedBug("next-row", "feature_bits + (index_t)(i - 1) * feature_h", "feature_bits + (index_t)i * feature_h")
# A chunk's first row's feature loaded for the row below it.
FIRST_ROW = PlantedBug("first-row", "feature_bits + (index_t)(first_row + q_top) * feature_h",
                       "feature_bits + (index_t)(first_row + q_top - 1) * feature_h")
# The next row's feature loaded by the warps that read this row only (each thread loads its
# own share of it, whatever its warp's input row reads).
EVERY_WARP_LOADS = PlantedBug("every-warp-loads", "                if (q > q_bottom)\n                    mma_load_feature_share(",
                              "                if (q > q_bottom && reads)\n                    mma_load_feature_share(")
# The map's first output row left out where the block's windows reach above the map.
FIRST_IN_MAP = PlantedBug("first-in-map", "q_bottom = first_row < 0 ? -first_row : 0;",
                          "q_bottom = first_row < 0 ? 1 - first_row : 0;")
# A thread's words past its share staged from the previous pair of channels (a large R only:
# LARGE_R). (Not left unstaged: the emulation's shared memory starts as nans, which send a
# warp to the direct sums, and they form the weights from global memory.)
SHARE_REST = PlantedBug("share-rest", "to[word] = mma_feature_word(place.values, 2 * word,",
                        "to[word] = mma_feature_word(place.values, 2 * word - 2,")
# The same words left unstaged: the emulation's nans there send the warps to the direct sums,
# which give the reference's numbers from global memory; the check that finite values run no
# such code catches it (on a GPU, stale words would give wrong numbers).
SHARE_REST_UNSTAGED = PlantedBug("share-rest-unstaged", "word = place.word + MMA_FEATURE_SHARE * place.step;",
                                 "word = place.word + (MMA_FEATURE_SHARE + 8) * place.step;")
# A span row's units past its eighth loaded from the first eight's places (R over 64 only: LARGE_R).
SPAN_UNITS = PlantedBug("span-units", "const int r = 2 * UNIT_WORDS * column,",
                        "const int r = 2 * UNIT_WORDS * (column & 7),")
# The staged output row's feature one pixel further on: its last pixel lies past the end of the
# shared memory.
STAGED_OVERRUN = PlantedBug(
    "feature-past-the-end",
    "unsigned int* features = staged + rows_h * MMA_CHANNELS * stride + 2 * band_words;",
    "unsigned int* features = staged + rows_h * MMA_CHANNELS * stride + 2 * band_words + span_stride;")


def _band_sync_bug() -> PlantedBug:
    """The grad_input kernel's "bands of row a are written" barrier (the forward has one too: the
    text around it names grad_input's) taken out."""
    text = ("                if (!reads) continue;\n                __syncwarp();  // the bands of row a are written\n"
            "                const unsigned int* rows = staged + q * MMA_CHANNELS * stride;")
    return PlantedBug("bands-written-sync", text, text.replace("__syncwarp();  // the bands", "// the bands"))


def _plant(monkeypatch, tmp_path, bug: PlantedBug) -> KernelSource:
    planted = _planted(tmp_path, involution_cuda.GENERATED_MMA_SOURCE, bug.text, bug.bug)
    monkeypatch.setattr(involution_cuda, "load_source", lambda filename: planted)
    return planted


def _caught(call) -> bool:
    """Whether ``call`` raises what a planted bug must (``planted_bug_caught``)."""
    try:
        with planted_bug_caught():
            call()
    except pytest.fail.Exception:
        return False
    return True


# The planted bugs in the integration tier: the unit tier's planted band bug is the forward's
# (test_cuda_generated_mma.py), each of these a compile of the emulation library (the tier's minutes).
# Each is caught in both run orders, but the warp barrier's race, which shows in the order where a
# lane reads its ldmatrix row before another lane writes part of it: at stride 2 only the
# ascending order has such a lane (the barriers over the whole block show in both).
# The bugs of a large R's staging, on LARGE_R; every other on two chunks at strides 1 and 2.
@pytest.mark.integration
@pytest.mark.parametrize("bug, cases", [
    *((b, (TWO_CHANNEL_CHUNKS, STRIDE_2_CHUNKS))
      for b in (BAND_PLACE, _band_sync_bug(), STAGED_BARRIER, FEATURE_REUSED, LIVE_STEPS, NEXT_ROW, FIRST_ROW,
                EVERY_WARP_LOADS, FIRST_IN_MAP)),
    *((b, LARGE_R) for b in (SHARE_REST, SHARE_REST_UNSTAGED, SPAN_UNITS))], ids=lambda b: getattr(b, "name", ""))
def test_a_planted_bug_fails_the_reference_check(bug, cases, tmp_path, monkeypatch):
    require_host_compiler()
    _plant(monkeypatch, tmp_path, bug)
    for case in cases:
        for specialised in (True, False):
            caught = []
            for order in ORDERS:
                launcher = EmulatedLauncher(order=order)
                caught.append(_caught(lambda: _check(grad_input_arguments(case.arguments(torch.bfloat16)), launcher,
                                                     f"{bug.name}-{order}", specialised)))
                expected = (str(case.kernel_size[0]), str(case.stride[0]))
                assert _specialisations(launcher) == {expected if specialised else involution_cuda.GENERATED_TILE_RUNTIME}
            assert (any(caught) if bug.name == "bands-written-sync" else all(caught)), (case.name, specialised, caught)


@pytest.mark.integration
def test_a_planted_direct_sum_bug_fails_the_non_finite_check(tmp_path, monkeypatch):
    require_host_compiler()
    _plant(monkeypatch, tmp_path, DIRECT_SUM)
    args = list(grad_input_arguments(TWO_CHANNEL_CHUNKS.arguments(torch.bfloat16)))
    assert _check(tuple(args), EmulatedLauncher(), "finite")  # the band products never run it
    args[0] = args[0].clone()
    args[0][0, 17, 5, 6] = float("inf")
    with pytest.raises(AssertionError, match="inf at other places|not close"):
        _assert_non_finite_as_torch(tuple(args), EmulatedLauncher(), DIRECT_SUM.name)


_RUN_SAMPLES = tensor_core_samples_script("test_cuda_generated_mma_grad_input", "GRAD_INPUT", "GRAD_CASES",
                                          "grad_input_arguments", "DTYPES", 1)


@pytest.mark.integration
def test_grad_input_is_clean_under_address_sanitizer():
    """The samples, the geometries above, random ones and the direct sum: no access outside the
    tensors or the dynamic shared memory (the host's size of it is the kernel's layout)."""
    require_host_compiler()
    assert_clean_under_asan(_RUN_SAMPLES)


@pytest.mark.integration
def test_address_sanitizer_catches_the_feature_past_the_end(tmp_path):
    require_host_compiler()
    planted = _planted(tmp_path, involution_cuda.GENERATED_MMA_SOURCE, STAGED_OVERRUN.text, STAGED_OVERRUN.bug)
    # 20 columns: the first tile's band reads output columns -3 to 28, both k-steps of them in the
    # map (on a 9-wide map the second holds none, and the kernel stages no feature there)
    assert_asan_catches(planted, """
        g, f, s = torch.randn(1, 32, 9, 20).bfloat16(), torch.randn(1, 8, 9, 20).bfloat16(), torch.randn(2 * 49, 8).bfloat16()
        ops.involution_generated_mma_backward_input(g, f, s, None, [9, 20], [7, 7], [1, 1], [3, 3], [1, 1],
                                                    torch.empty(1, 32, 9, 20).bfloat16(), launcher)
    """)


def _gpu_arguments(dtype: torch.dtype) -> list[tuple[tuple, str]]:
    samples = [(s.args, s.name) for s in GRAD_INPUT.sample_inputs("cpu", dtype, False)]
    samples += [(grad_input_arguments(c.arguments(dtype)), c.name) for c in GRAD_CASES]
    samples += [(s.args, f"random-{i}") for i, s in enumerate(random_samples(GRAD_INPUT, dtype, 8, seed=3))]
    samples += [(grad_input_arguments(c.arguments(dtype)), c.name) for c in _random_specialised_cases(6, seed=7)]
    return [(tuple(a.cuda() if isinstance(a, torch.Tensor) else a for a in args), name) for args, name in samples]


@pytest.mark.needs_cuda
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_grad_input_on_a_gpu_matches_the_reference(dtype):
    """CuPy's launch, mma.sync and all: the samples, the geometries above, random ones, and an
    inf where torch puts it."""
    for args, name in _gpu_arguments(dtype):
        if not _check(args, None, name):
            assert _declines_only_what_it_cannot_hold(args), name
    args = [a.cuda() if isinstance(a, torch.Tensor) else a for a in grad_input_arguments(CASES[1].arguments(dtype))]
    args[0] = args[0].clone()
    args[0][0, 17, 5, 6] = float("inf")
    _assert_non_finite_as_torch(tuple(args), None, "inf")


@pytest.mark.needs_cuda
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_specialised_grad_input_on_a_gpu_gives_the_runtime_instantiations_bits(dtype):
    """What NVRTC makes of the unrolled loops keeps every sum's order too."""
    assert_bits_equal(dtype, "cuda", lambda: None, _served_result, seed=73)
