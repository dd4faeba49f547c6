"""Tiled kernels on the host: the emulation of cooperating threads (cuda_host_shim.h: fibers,
barriers, warp shuffles, shared memory) against CUDA's rules, and span_tile.cu, which uses all
of it with tensor-core fragments (warp.cuh), against the float64 reference in every dtype and
both run orders, under AddressSanitizer, and with planted bugs that each check must catch: a
missing barrier and a wrong fragment layout (the reference), a barrier some threads return
before (the emulation's own error), a shared-memory over-run (AddressSanitizer)."""

from __future__ import annotations

import os
import random
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import NamedTuple, Optional

import pytest
import torch
import torch.nn.functional as F

from oplib import registry
from oplib.kernels import KernelSource, LaunchConfig, load_source
from oplib.kernels.involution import cuda as involution_cuda
from oplib.kernels.involution.layouts import result_like
from oplib.testing.cuda_emulation import INTERLEAVED, ORDERS, EmulatedLauncher, EmulationError, cooperative
from oplib.testing.toolchain import require_host_compiler

from cuda_test_helpers import (assert_asan_catches, planted_bug_caught, planted_span_tile, random_samples,
                               run_under_asan)

_COOPERATION_PATH = Path(__file__).parent / "cuda_sources" / "cooperation.cu"
COOPERATION = KernelSource(_COOPERATION_PATH, _COOPERATION_PATH.read_text())


# ---------------------------------------------------------------------------------------
# The emulation of cooperating threads
# ---------------------------------------------------------------------------------------


def test_only_sources_whose_threads_cooperate_run_as_fibers(tmp_path):
    """The fiber path is taken for a source that uses shared memory, barriers or shuffles, in
    its own code or in a header it includes; involution's kernels keep the plain loops."""
    assert cooperative(load_source(involution_cuda.SPAN_TILE_SOURCE)) and cooperative(COOPERATION)
    assert not cooperative(load_source(involution_cuda.SOURCE))
    assert not cooperative(load_source(involution_cuda.GENERATED_SOURCE))
    through_header = tmp_path / "through_header.cu"
    through_header.write_text('#include "warp.cuh"\n// __syncthreads() in a comment is no use\n')
    assert cooperative(KernelSource(through_header, through_header.read_text()))
    commented = tmp_path / "commented.cu"
    commented.write_text('#include "element.cuh"\n// __syncthreads() in a comment is no use\n')
    assert not cooperative(KernelSource(commented, commented.read_text()))


class ShuffleCase(NamedTuple):
    name: str
    source: int
    delta: int
    lane_mask: int
    width: int


SHUFFLE_CASES = (
    ShuffleCase("whole-warp", 5, 1, 1, 32),
    ShuffleCase("segments-of-8", 37, 3, 6, 8),
    ShuffleCase("negative-lane-halves", -1, 16, 16, 16),
    ShuffleCase("xor-past-the-segment", 2, 0, 31, 4),
    ShuffleCase("width-1", 0, 5, 40, 1),
)


def _expected_shuffles(threads: int, case: ShuffleCase) -> torch.Tensor:
    """CUDA's rules for the four shuffles of `shuffles`: the grid index of the lane each
    thread reads (its own where the rule says so)."""
    rows = []
    for t in range(threads):
        lane, width = t % 32, case.width
        warp, start = t - lane, lane & ~(width - 1)
        partner = lane ^ case.lane_mask
        sources = (
            start + (case.source & (width - 1)),
            lane - case.delta if lane - start >= case.delta else lane,
            lane + case.delta if lane - start + case.delta < width else lane,
            partner if partner < start + width else lane,
        )
        rows.append([warp + s for s in sources])
    return torch.tensor(rows, dtype=torch.float64)


@pytest.mark.parametrize("order", ORDERS)
@pytest.mark.parametrize("case", SHUFFLE_CASES, ids=lambda c: c.name)
def test_shuffles_follow_cuda_rules(case, order):
    require_host_compiler()
    out = torch.full((2 * 64, 4), -1.0, dtype=torch.float64)
    EmulatedLauncher(order=order).launch(COOPERATION, "shuffles", torch.float64, LaunchConfig(2, 64),
                                         (out, case.source, case.delta, case.lane_mask, case.width))
    torch.testing.assert_close(out, _expected_shuffles(2 * 64, case), rtol=0, atol=0)


@pytest.mark.parametrize("order", ORDERS)
@pytest.mark.parametrize("block", [(64, 1, 1), (8, 4, 2), (5, 7, 3)], ids=str)
def test_a_barrier_orders_static_shared_memory(block, order):
    """Every thread of every block shape (partial warps too) reads what another wrote before
    the barrier, in either run order."""
    require_host_compiler()
    threads = block[0] * block[1] * block[2]
    x = torch.randn(3 * threads, dtype=torch.float64)
    for shift in (1, -1):
        out = torch.empty_like(x)
        EmulatedLauncher(order=order).launch(COOPERATION, "rotate", torch.float64, LaunchConfig(3, block),
                                             (x, out, shift))
        torch.testing.assert_close(out, x.view(3, threads).roll(-shift, 1).reshape(-1), rtol=0, atol=0)


def test_a_missing_barrier_shows_in_the_order_its_race_runs(tmp_path):
    """Without the barrier, a thread reading the slot of the thread after it reads it before
    it is written when threads run ascending, and after when they run descending; the slot
    of the thread before it, the other way round: each race shows in exactly one order (the
    one thread whose slot wraps around the block aside)."""
    require_host_compiler()
    barrier = "__syncthreads();  // the slice is written"
    assert COOPERATION.text.count(barrier) == 1
    path = tmp_path / "cooperation.cu"
    path.write_text(COOPERATION.text.replace(barrier, "// no barrier"))
    planted = KernelSource(path, path.read_text())
    x = torch.randn(4, 64, dtype=torch.float64)
    for shift, racing, wraps in ((1, "ascending", 63), (-1, "descending", 0)):
        kept = [t for t in range(64) if t != wraps]
        for order in ORDERS:
            out = torch.empty_like(x)
            EmulatedLauncher(order=order).launch(planted, "rotate", torch.float64, LaunchConfig(4, 64), (x, out, shift))
            right = torch.equal(out[:, kept], x.roll(-shift, 1)[:, kept])
            assert right == (order != racing), (shift, order)


def test_interleaved_warps_see_a_staging_that_runs_into_the_next_warps_share():
    """A warp that writes past its share of static shared memory into the next warp's, which
    that warp writes too, reads its own values back in both run orders (there each warp runs to
    its end before the next begins, or after it ends) and, in its last 8 lanes, the next warp's
    in the interleaved order, as it may on a GPU; within its share, its own in every order."""
    require_host_compiler()
    warp = torch.arange(4, dtype=torch.float64).repeat_interleave(32).repeat(2, 1)
    for count, order in [(32, o) for o in (*ORDERS, INTERLEAVED)] + [(40, o) for o in ORDERS]:
        out = torch.empty(2, 128, dtype=torch.float64)
        EmulatedLauncher(order=order).launch(COOPERATION, "overrun", torch.float64, LaunchConfig(2, 128), (out, count))
        assert torch.equal(out, warp), (count, order)
    out = torch.empty(2, 128, dtype=torch.float64)
    EmulatedLauncher(order=INTERLEAVED).launch(COOPERATION, "overrun", torch.float64, LaunchConfig(2, 128), (out, 40))
    overrun = torch.arange(128) % 32 >= 24
    next_warp = torch.where(overrun & (torch.arange(128) < 96), warp + 1, warp)
    assert torch.equal(out, next_warp)


def test_dynamic_shared_memory_is_fresh_and_poisoned_in_every_block():
    """Each block finds its dynamic shared memory filled with 0xff bytes (a NaN in every
    floating type), whatever the block before it on the same OS thread wrote."""
    require_host_compiler()
    out = torch.zeros(16, 64, dtype=torch.float64)
    EmulatedLauncher().launch(COOPERATION, "first_bytes", torch.float64, LaunchConfig(16, 64, shared_bytes=64), (out,))
    assert torch.equal(out, torch.full_like(out, 255.0))


def _expected_fragments(tile: torch.Tensor) -> torch.Tensor:
    """The PTX ISA's fragment layout (warp.cuh's table) of a 16 x 8-word tile: per lane (group
    g, quad q), A's registers (g, q), (g + 8, q), (g, q + 4), (g + 8, q + 4); B's of the tile's
    row g (B's column), words q and q + 4; the pair's B of rows g and g + 8; the transposed A's
    (ldmatrix .trans: the tile's row k is A's column k), A's elements (m, k), (m, k + 1) in a
    register's halves for m = g, g + 8 and k = 2 q, 2 q + 8, element (m, k) the 16-bit half m % 2
    of the tile's word (k, m // 2)."""
    words = tile.long()

    def half(k: int, m: int) -> int:
        return int(words[k, m // 2]) >> 16 * (m % 2) & 0xFFFF

    rows = []
    for lane in range(32):
        g, q = lane // 4, lane % 4
        transposed = [half(k, m) | half(k + 1, m) << 16 for k in (2 * q, 2 * q + 8) for m in (g, g + 8)]
        rows.append([tile[g, q], tile[g + 8, q], tile[g, q + 4], tile[g + 8, q + 4], tile[g, q], tile[g, q + 4],
                     tile[g, q], tile[g, q + 4], tile[g + 8, q], tile[g + 8, q + 4], *transposed])
    return torch.tensor(rows, dtype=torch.float64)


def _fragment_tile() -> torch.Tensor:
    """Words whose 16-bit halves differ everywhere (the lanes' registers tell them apart)."""
    index = torch.arange(16 * 8, dtype=torch.float64)
    return (index + 1) * 65536 + (1000 + index)


@pytest.mark.parametrize("order", ORDERS)
@pytest.mark.parametrize("stride", [8, 12])
def test_fragment_loads_follow_the_ptx_layout(stride, order):
    """warp.cuh's ldmatrix loads, run on the host from each lane's row address: A, B, a pair of
    B tiles and A transposed, each lane's registers as the PTX ISA lays the fragments out."""
    require_host_compiler()
    tile = _fragment_tile()
    out = torch.full((32, 14), -1.0, dtype=torch.float64)
    EmulatedLauncher(order=order).launch(COOPERATION, "fragments", torch.float64, LaunchConfig(1, 32, shared_bytes=1024),
                                         (tile, out, stride, 0))
    torch.testing.assert_close(out, _expected_fragments(tile.view(16, 8)), rtol=0, atol=0)


def _tf32(values: torch.Tensor) -> torch.Tensor:
    """float32 values rounded to TF32 as cvt.rna.tf32.f32 rounds finite ones: to nearest, ties
    away from zero (half of the 13 dropped bits' weight added to the magnitude's bits)."""
    bits = values.float().view(torch.int32)
    return ((bits + 0x1000) & ~0x1FFF).view(torch.float32)


def _tf32_product(a: torch.Tensor, b: torch.Tensor, three: bool, source: KernelSource = COOPERATION,
                  order: str = ORDERS[0]) -> tuple[torch.Tensor, torch.Tensor]:
    out = torch.full((256,), float("nan"))
    EmulatedLauncher(order=order).launch(source, "tf32_product", torch.float32, LaunchConfig(1, 32),
                                         (a.float().contiguous(), b.float().contiguous(), out, int(three)))
    return out[:128].view(16, 8), out[128:].view(16, 8)


@pytest.mark.parametrize("order", ORDERS)
def test_the_tf32_product_follows_the_ptx_layout(order):
    """warp.cuh's mma.m16n8k8.tf32 on the host, from each lane's fragments as the PTX ISA lays
    them out: small integers (exact in TF32, every sum exact) give A B exactly; random floats
    give the product of their TF32 roundings (about 3 decimal digits of A B), and 3xTF32 gives A
    B to a float's accuracy, a thousand times closer. The rounding is cvt.rna's: ties away from
    zero, an overflow an inf, inf and nan kept."""
    require_host_compiler()
    generator = torch.Generator().manual_seed(5)
    a, b = (torch.randint(-8, 9, shape, generator=generator).float() for shape in ((16, 8), (8, 8)))
    for three in (False, True):
        torch.testing.assert_close(_tf32_product(a, b, three, order=order)[0], a @ b, rtol=0, atol=0)
    a, b = (torch.randn(shape, generator=generator) for shape in ((16, 8), (8, 8)))
    exact = a.double() @ b.double()
    one, rounded = _tf32_product(a, b, False, order=order)
    torch.testing.assert_close(one.double(), _tf32(a).double() @ _tf32(b).double(), rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(rounded, _tf32(a), rtol=0, atol=0)
    three = _tf32_product(a, b, True, order=order)[0].double()
    assert (three - exact).abs().max() < 1e-3 * (one.double() - exact).abs().max()
    torch.testing.assert_close(three, exact, rtol=2e-6, atol=2e-6)
    # ties (the 13 dropped bits 0x1000) away from zero; float's largest past TF32's: an inf
    special = torch.tensor([1 + 2 ** -11, -(1 + 2 ** -11), 1 + 3 * 2 ** -11, torch.finfo(torch.float32).max, float("inf"),
                            float("nan")])
    a = torch.zeros(16, 8)
    a.view(-1)[:len(special)] = special
    rounded = _tf32_product(a, torch.zeros(8, 8), False, order=order)[1].view(-1)[:len(special)]
    assert rounded[:3].tolist() == [1 + 2 ** -10, -(1 + 2 ** -10), 1 + 2 ** -9]
    assert rounded[3] == rounded[4] == float("inf") and rounded[5].isnan()


def test_a_wrong_tf32_fragment_fails_the_layout_check(tmp_path):
    """A's rows group and group + 8 swapped in the fragment: the exact integer product differs."""
    require_host_compiler()
    right = "const float a_values[4] = {(float)a[8 * group + quad], (float)a[8 * (group + 8) + quad],"
    assert COOPERATION.text.count(right) == 1
    path = tmp_path / "cooperation.cu"
    path.write_text(COOPERATION.text.replace(
        right, "const float a_values[4] = {(float)a[8 * (group + 8) + quad], (float)a[8 * group + quad],"))
    generator = torch.Generator().manual_seed(6)
    a, b = (torch.randint(-8, 9, shape, generator=generator).float() for shape in ((16, 8), (8, 8)))
    assert not torch.equal(_tf32_product(a, b, False, KernelSource(path, path.read_text()))[0], a @ b)


@pytest.mark.parametrize("order", ORDERS)
@pytest.mark.parametrize("mode, message", [
    (1, r"ldmatrix at warp\.cuh:\d+: a row address not 16-byte aligned"),
    (2, r"ldmatrix at warp\.cuh:\d+: a row address outside the block's shared memory"),
    (3, r"ldmatrix at warp\.cuh:\d+: lane \d+'s row was written by another lane after this lane reached the load "
        r"\(a __syncwarp missing"),
], ids=["misaligned", "global-memory", "no-syncwarp"])
def test_fragment_loads_stop_where_the_hardware_faults_or_races(mode, message, order):
    """A row address ldmatrix cannot take, and a tile read before the warp's lanes have all
    written it, stop the launch with the place, in either run order (the race shows in both:
    a lane reads its row before another lane writes part of it, whichever runs first)."""
    require_host_compiler()
    out = torch.zeros(32, 14, dtype=torch.float64)
    with pytest.raises(EmulationError, match=message):
        EmulatedLauncher(order=order).launch(COOPERATION, "fragments", torch.float64,
                                             LaunchConfig(1, 32, shared_bytes=1024), (_fragment_tile(), out, 12, mode))


class StuckCase(NamedTuple):
    name: str
    mode: int
    threads: int
    message: str  # a regular expression


STUCK_CASES = (
    StuckCase("barrier-skipped", 1, 64, r"__syncthreads at cooperation\.cu:\d+ is not reached by every thread of the "
              r"block: threads 0-31 wait at __syncthreads at cooperation\.cu:\d+; threads 32-63 wait at __syncthreads"),
    StuckCase("return-before-barrier", 2, 64, r"threads 0-31 wait at __syncthreads at cooperation\.cu:\d+; "
              r"threads 32-63 returned"),
    StuckCase("two-barriers", 3, 64, r"threads 0-31 wait at __syncthreads at cooperation\.cu:(\d+); "
              r"threads 32-63 wait at __syncthreads at cooperation\.cu:(?!\1)\d+"),
    StuckCase("shuffle-skipped", 4, 64, r"__shfl_sync at cooperation\.cu:\d+ with mask 0xffffffff in warp [01] is not "
              r"reached by every lane it names"),
    StuckCase("mask-leaves-out-the-caller", 5, 64, r"the mask 0x0000ffff leaves out the calling lane (1[6-9]|2\d|3[01])"),
    StuckCase("reads-outside-the-mask", 6, 64, r"lane \d+ of warp [01] reads lane (1[6-9]|2\d|3[01]), which the mask "
              r"0x0000ffff leaves out"),
    StuckCase("width-3", 7, 64, r"__shfl_sync: width 3 is not a power of two up to 32"),
    StuckCase("past-a-partial-warp", 8, 40, r"lane [4-7] of warp 1 reads lane (8|9|10|11), which the block does not have"),
)


@pytest.mark.parametrize("order", ORDERS)
@pytest.mark.parametrize("case", STUCK_CASES, ids=lambda c: c.name)
def test_blocks_that_can_never_finish_are_reported(case, order):
    """A launch whose blocks cannot finish raises EmulationError naming the place and the
    threads, instead of hanging; the fibers it left waiting do not stop the next launch."""
    require_host_compiler()
    launcher = EmulatedLauncher(order=order)
    out = torch.zeros(3 * case.threads, dtype=torch.float64)
    with pytest.raises(EmulationError, match=r"stuck<double>: block \(\d, 0, 0\): .*" + case.message):
        launcher.launch(COOPERATION, "stuck", torch.float64, LaunchConfig(3, case.threads), (out, case.mode))
    for mode in (0, 8):
        fine = torch.zeros(3 * 64, dtype=torch.float64)
        launcher.launch(COOPERATION, "stuck", torch.float64, LaunchConfig(3, 64), (fine, mode))
        assert torch.equal(fine, torch.arange(64, dtype=torch.float64).repeat(3)), mode


# ---------------------------------------------------------------------------------------
# span_tile.cu against the float64 reference
# ---------------------------------------------------------------------------------------

TOLERANCE = registry.get("involution_generated").tolerance


def _reference(feature: torch.Tensor, span_weight: torch.Tensor, span_bias: Optional[torch.Tensor]) -> torch.Tensor:
    """The span 1x1 conv in float64."""
    bias = None if span_bias is None else span_bias.double()
    return F.conv2d(feature.double(), span_weight.double()[:, :, None, None], bias)


def _check(feature, span_weight, span_bias, launcher, name: str) -> None:
    out = involution_cuda.span_tile(feature, span_weight, span_bias, launcher)
    assert out.dtype == feature.dtype and out.is_contiguous(), name
    atol, rtol = TOLERANCE(feature.dtype)
    torch.testing.assert_close(out.double(), _reference(feature, span_weight, span_bias), atol=atol, rtol=rtol,
                               msg=lambda m: f"span_tile[{name}, {feature.dtype}]: {m}")


def _registry_samples(dtype: torch.dtype):
    """(feature, span_weight, span_bias, name) of involution_generated's samples."""
    spec = registry.get("involution_generated")
    for sample in spec.sample_inputs("cpu", dtype, False):
        yield (*sample.args[1:4], sample.name)


class SpanCase(NamedTuple):
    batch: int
    reduced: int
    rows: int  # G * K * K
    height: int
    width: int
    bias: bool

    @property
    def name(self) -> str:
        return f"n{self.batch}-r{self.reduced}-rows{self.rows}-{self.height}x{self.width}-bias{int(self.bias)}"

    def tensors(self, dtype: torch.dtype):
        feature = torch.randn(self.batch, self.reduced, self.height, self.width, dtype=torch.float64).to(dtype)
        span_weight = torch.randn(self.rows, self.reduced, dtype=torch.float64).to(dtype)
        span_bias = torch.randn(self.rows, dtype=torch.float64).to(dtype) if self.bias else None
        return feature, span_weight, span_bias


# Two chunks of R, two pixel tiles (the second partial), two row tiles.
TWO_CHUNKS = SpanCase(batch=1, reduced=20, rows=40, height=9, width=9, bias=True)


def _random_cases(count: int, seed: int) -> list[SpanCase]:
    """Geometries around the tile sizes (64 pixels, 32 rows, R in chunks of 16): most of them
    are no multiple of any."""
    rng = random.Random(seed)
    cases = []
    for _ in range(count):
        groups, kernel = rng.randint(1, 4), rng.choice([1, 3, 5, 7])
        cases.append(SpanCase(rng.randint(1, 3), rng.choice([1, 2, 7, 15, 16, 17, 31, 33, 48, 70]),
                              groups * kernel * kernel, rng.randint(1, 21), rng.randint(1, 21), rng.random() < 0.7))
    return cases


@pytest.mark.parametrize("order", ORDERS)
@pytest.mark.parametrize("dtype", registry.FLOAT_DTYPES, ids=str)
def test_span_tile_matches_the_reference_on_the_registry_samples(dtype, order):
    """involution_generated's samples (their feature, span_weight and bias; channels_last and
    non-contiguous ones, an empty batch) and TWO_CHUNKS (the planted bugs' geometry),
    float16/bfloat16 through the tensor-core fragments, float32/float64 through the FMAs and
    the shuffle."""
    require_host_compiler()
    launcher = EmulatedLauncher(order=order)
    for feature, span_weight, span_bias, name in _registry_samples(dtype):
        _check(feature, span_weight, span_bias, launcher, name)
    _check(*TWO_CHUNKS.tensors(dtype), launcher, TWO_CHUNKS.name)
    assert launcher.launches and {launch[3] for launch in launcher.launches} == {256}


@pytest.mark.integration
@pytest.mark.parametrize("order", ORDERS)
@pytest.mark.parametrize("dtype", registry.FLOAT_DTYPES, ids=str)
def test_span_tile_matches_the_reference_on_random_geometries(dtype, order):
    """R over several chunks and not a multiple of one, rows and planes over several tiles and
    no multiple of one, one to three samples: every axis of the 3-D grid, every edge of a tile."""
    require_host_compiler()
    launcher = EmulatedLauncher(order=order)
    cases = _random_cases(24, seed=registry.FLOAT_DTYPES.index(dtype))
    source = load_source(involution_cuda.SPAN_TILE_SOURCE)
    grids = [involution_cuda.span_tile_config(source, dtype, c.batch, c.rows, c.height * c.width).grid for c in cases]
    assert all(max(g[axis] for g in grids) > 1 for axis in range(3)), grids
    assert any(c.reduced > 16 and c.reduced % 16 for c in cases)
    for case in cases:
        _check(*case.tensors(dtype), launcher, case.name)


@pytest.mark.needs_cuda
@pytest.mark.parametrize("dtype", registry.FLOAT_DTYPES, ids=str)
def test_span_tile_on_a_gpu_matches_the_reference(dtype):
    """CuPy's launch: on sm_80 and newer the tensor-core instruction itself, whose fragment
    layout the host emulation's product assumes."""
    samples = [(f.cuda(), s.cuda(), None if b is None else b.cuda(), name) for f, s, b, name in _registry_samples(dtype)]
    for case in _random_cases(8, seed=9):
        samples.append((*(None if t is None else t.cuda() for t in case.tensors(dtype)), case.name))
    for feature, span_weight, span_bias, name in samples:
        _check(feature, span_weight, span_bias, None, name)


# ---------------------------------------------------------------------------------------
# involution_generated_tile (span_tile.cu) against the float64 reference
# ---------------------------------------------------------------------------------------

GENERATED = registry.get("involution_generated")


def _check_tile(args: tuple, launcher, name: str, specialised: bool = True) -> bool:
    """involution_generated's arguments through the tiled kernel into a result in the op's
    layout, against the op's float64 reference; False where the kernel declines the geometry."""
    input, feature = args[:2]
    out = result_like(input, feature.shape[2:])
    result = involution_cuda.involution_generated_tile(*args, out, launcher, specialised)
    if result is None:
        return False
    assert result is out, name
    atol, rtol = GENERATED.tolerance(input.dtype)
    expected = GENERATED.reference(*(a.double() if isinstance(a, torch.Tensor) else a for a in args))
    torch.testing.assert_close(out.double(), expected, atol=atol, rtol=rtol,
                               msg=lambda m: f"involution_generated_tile[{name}, {input.dtype}]: {m}")
    return True


def _declined_only_past_the_tile(args: tuple) -> bool:
    """Whether the tile may decline these arguments: more taps than it holds, or a window
    wider than its shared memory."""
    input, kernel_size, stride, dilation = args[0], args[4], args[5], args[7]
    source = load_source(involution_cuda.SPAN_TILE_SOURCE)
    return (kernel_size[0] * kernel_size[1] > source.constants["GEN_TILE_TAPS"]
            or involution_cuda.generated_tile_shared_bytes(source, input.dtype, kernel_size, stride, dilation)
            > involution_cuda.GENERATED_TILE_MAX_SHARED)


class TileCase(NamedTuple):
    batch: int
    channels: int
    groups: int
    reduced: int
    size: tuple[int, int]
    kernel_size: tuple[int, int]
    stride: tuple[int, int]
    padding: tuple[int, int]
    dilation: tuple[int, int]
    channels_last: bool

    @property
    def name(self) -> str:
        return (f"n{self.batch}-c{self.channels}-g{self.groups}-r{self.reduced}-{self.size[0]}x{self.size[1]}-"
                f"k{self.kernel_size}-s{self.stride}-p{self.padding}-d{self.dilation}-cl{int(self.channels_last)}")

    def arguments(self, dtype: torch.dtype) -> tuple:
        out_size = [(s + 2 * p - d * (k - 1) - 1) // st + 1
                    for s, p, d, k, st in zip(self.size, self.padding, self.dilation, self.kernel_size, self.stride)]
        taps = self.kernel_size[0] * self.kernel_size[1]
        memory_format = torch.channels_last if self.channels_last else torch.contiguous_format
        input = torch.randn(self.batch, self.channels, *self.size, dtype=torch.float64).to(dtype, memory_format=memory_format)
        feature = torch.randn(self.batch, self.reduced, *out_size, dtype=torch.float64).to(dtype, memory_format=memory_format)
        span_weight = (torch.randn(self.groups * taps, self.reduced, dtype=torch.float64) / self.reduced**0.5).to(dtype)
        span_bias = torch.randn(self.groups * taps, dtype=torch.float64).to(dtype)
        return (input, feature, span_weight, span_bias, list(self.kernel_size), list(self.stride), list(self.padding),
                list(self.dilation))


# Two channel chunks of a group (the chunk's barrier matters), two row and column tiles (the
# second partial), R over two chunks, RedNet's 7x7 window: the planted bugs' geometry.
TWO_CHANNEL_CHUNKS = TileCase(batch=1, channels=64, groups=2, reduced=20, size=(11, 10), kernel_size=(7, 7),
                              stride=(1, 1), padding=(3, 3), dilation=(1, 1), channels_last=False)
# The RedNet geometries the tile is for, at small maps: 7x7 at strides 1 and 2, 16 channels a group.
REDNET_LIKE = (TWO_CHANNEL_CHUNKS._replace(channels=32, reduced=8, size=(9, 9), channels_last=True),
               TWO_CHANNEL_CHUNKS._replace(channels=32, reduced=8, size=(13, 12), stride=(2, 2)))


def _specialised_windows() -> list[tuple[int, int]]:
    """(kernel size, stride) of every instantiation of involution_generated_tile that fixes its window."""
    specialisations = load_source(involution_cuda.SPAN_TILE_SOURCE).specialisations["involution_generated_tile"]
    return [(int(k), int(s)) for k, s in specialisations if (k, s) != involution_cuda.GENERATED_TILE_RUNTIME]


def _random_specialised_cases(count: int, seed: int) -> list[TileCase]:
    """Square windows at equal strides, no dilation, each specialised window in turn: sizes
    around the 8 x 8 tile (partial tiles, windows past every edge), channel counts that are
    and are not multiples of the 16-channel chunk, R over one or two chunks, either layout."""
    rng = random.Random(seed)
    windows = _specialised_windows()
    cases = []
    for index in range(count):
        kernel, stride = windows[index % len(windows)]
        padding = rng.randint(0, kernel // 2)
        size = tuple(rng.randint(max(1, kernel - 2 * padding), 21) for _ in range(2))
        groups = rng.randint(1, 3)
        cases.append(TileCase(batch=rng.randint(1, 2), channels=groups * rng.choice([1, 5, 16, 20, 33]), groups=groups,
                              reduced=rng.choice([1, 7, 16, 20]), size=size, kernel_size=(kernel, kernel),
                              stride=(stride, stride), padding=(padding, padding), dilation=(1, 1),
                              channels_last=rng.random() < 0.5))
    return cases


def _served_windows(dtype: torch.dtype) -> set[tuple[str, str]]:
    """The specialisations the tile launches in ``dtype``: those whose window fits its shared memory."""
    source = load_source(involution_cuda.SPAN_TILE_SOURCE)
    return {(str(k), str(s)) for k, s in _specialised_windows()
            if involution_cuda.generated_tile_config(source, dtype, 1, 1, (8, 8), (k, k), (s, s), (1, 1)) is not None}


def _tile_specialisations(launcher) -> set[tuple[str, ...]]:
    return {launch[4] for launch in launcher.launches if launch[0] == "involution_generated_tile"}


@pytest.mark.parametrize("order", ORDERS)
@pytest.mark.parametrize("dtype", registry.FLOAT_DTYPES, ids=str)
def test_generated_tile_matches_the_reference_on_the_registry_samples(dtype, order):
    """involution_generated's samples (channels_last and strided operands, odd sizes, strides,
    dilations, no bias, an empty batch) and the geometries above: the weights formed on
    tensor-core fragments (float16/bfloat16) or by FMAs, then aggregated from the staged input."""
    require_host_compiler()
    launcher = EmulatedLauncher(order=order)
    served = 0
    for sample in GENERATED.sample_inputs("cpu", dtype, False):
        if _check_tile(sample.args, launcher, sample.name):
            served += 1
        else:
            assert _declined_only_past_the_tile(sample.args), sample.name
    for case in (TWO_CHANNEL_CHUNKS, *REDNET_LIKE):
        args = case.arguments(dtype)
        # float64's 7x7 windows need more shared memory than the tile asks for (its generic kernel serves them)
        assert _check_tile(args, launcher, case.name) or (dtype == torch.float64 and _declined_only_past_the_tile(args)), \
            case.name
    assert served > 5 and {launch[3] for launch in launcher.launches} == {256}
    # the samples' 3x3 windows at stride 1 (and 2) and the 7x7 geometries take the specialised
    # instantiations, every other geometry the one that reads its window from the arguments
    expected = {("3", "1"), ("7", "1"), ("7", "2")} if dtype != torch.float64 else {("3", "1")}
    assert expected | {involution_cuda.GENERATED_TILE_RUNTIME} <= _tile_specialisations(launcher)


@pytest.mark.integration
@pytest.mark.parametrize("order", ORDERS)
@pytest.mark.parametrize("dtype", registry.FLOAT_DTYPES, ids=str)
def test_generated_tile_matches_the_reference_on_random_geometries(dtype, order):
    """The spec's random geometries (kernel sizes, strides, paddings, dilations, groups, R):
    every edge of a tile, in either layout; then random square windows, each specialised
    instantiation the tile serves in this dtype at least once."""
    require_host_compiler()
    launcher = EmulatedLauncher(order=order)
    served = 0
    for index, sample in enumerate(random_samples(GENERATED, dtype, 24, seed=31 + registry.FLOAT_DTYPES.index(dtype))):
        args = sample.args
        if index % 2:  # half of them channels_last
            args = (*(a.contiguous(memory_format=torch.channels_last) for a in args[:2]), *args[2:])
        if _check_tile(args, launcher, f"random-{index}"):
            served += 1
        else:
            assert _declined_only_past_the_tile(args), index
    assert served >= (6 if dtype == torch.float64 else 16)  # float64: wide windows past the shared memory declined
    for case in _random_specialised_cases(12, seed=41 + registry.FLOAT_DTYPES.index(dtype)):
        args = case.arguments(dtype)
        assert _check_tile(args, launcher, case.name) or _declined_only_past_the_tile(args), case.name
    assert _served_windows(dtype) | {involution_cuda.GENERATED_TILE_RUNTIME} == _tile_specialisations(launcher)


def _tile_result(args: tuple, launcher, specialised: bool) -> Optional[torch.Tensor]:
    """The tile's output; None where it declines (float64's wide windows past its shared memory)."""
    out = result_like(args[0], args[1].shape[2:])
    written = involution_cuda.involution_generated_tile(*args, out, launcher, specialised)
    assert written is out or (written is None and _declined_only_past_the_tile(args)), args[1].shape
    return written


def _assert_specialised_equals_runtime(dtype: torch.dtype, device: str, launcher_for, result=_tile_result,
                                       seed: int = 53) -> None:
    """Random 7x7, 5x5 and 3x3 windows: the specialised instantiation's bits are those of the one
    that reads its window from the arguments (every sum adds its terms in the same order).
    ``result(args, launcher, specialised)``: a fused kernel's output (the tile's, by default)."""
    compared = 0
    for case in _random_specialised_cases(12, seed=seed):
        args = tuple(a.to(device) if isinstance(a, torch.Tensor) else a for a in case.arguments(dtype))
        launcher = launcher_for()
        specialised, runtime = result(args, launcher, True), result(args, launcher, False)
        if specialised is None and runtime is None:  # declined either way (checked by `result`)
            continue
        compared += 1
        if launcher is not None:  # the windows (KERNEL, STRIDE) differ, any further argument (folded runs) not
            assert [launch[4][:2] for launch in launcher.launches] == [
                (str(case.kernel_size[0]), str(case.stride[0])), involution_cuda.GENERATED_TILE_RUNTIME], case.name
            assert len({launch[4][2:] for launch in launcher.launches}) == 1, case.name
        assert torch.equal(specialised, runtime), f"{case.name}: {(specialised - runtime).abs().max()}"
    assert compared >= 4


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_specialised_tile_gives_the_runtime_instantiations_bits(dtype):
    require_host_compiler()
    _assert_specialised_equals_runtime(dtype, "cpu", EmulatedLauncher)


def test_generated_tile_declines_what_it_cannot_hold():
    """More taps than the tile's weights hold (9x9), or an input window past the shared memory
    it may ask for: declined, the result untouched (the caller runs the generic kernel)."""
    source = load_source(involution_cuda.SPAN_TILE_SOURCE)
    config = involution_cuda.generated_tile_config
    assert config(source, torch.float32, 2, 4, (56, 56), (7, 7), (1, 1), (1, 1)).grid == (49, 4, 2)
    assert config(source, torch.float32, 2, 4, (56, 56), (9, 9), (1, 1), (1, 1)) is None
    assert config(source, torch.float64, 2, 4, (56, 56), (7, 7), (4, 4), (3, 3)) is None
    assert config(source, torch.float32, 70000, 4, (8, 8), (3, 3), (1, 1), (1, 1)) is None
    args = TWO_CHANNEL_CHUNKS._replace(kernel_size=(9, 9), padding=(4, 4)).arguments(torch.float32)
    out = torch.full((1, 64, 11, 10), 7.0)
    assert involution_cuda.involution_generated_tile(*args, out, EmulatedLauncher()) is None
    assert bool((out == 7).all())


class WindowCase(NamedTuple):
    name: str
    kernel_size: tuple[int, int]
    stride: tuple[int, int]
    dilation: tuple[int, int]
    specialisation: tuple[str, str]


RUNTIME = involution_cuda.GENERATED_TILE_RUNTIME
WINDOW_CASES = (
    WindowCase("rednet-7x7", (7, 7), (1, 1), (1, 1), ("7", "1")),
    WindowCase("rednet-7x7-stride-2", (7, 7), (2, 2), (1, 1), ("7", "2")),
    WindowCase("3x3-stride-2", (3, 3), (2, 2), (1, 1), ("3", "2")),
    WindowCase("5x5", (5, 5), (1, 1), (1, 1), ("5", "1")),
    WindowCase("stride-3", (7, 7), (3, 3), (1, 1), RUNTIME),
    WindowCase("dilated", (7, 7), (1, 1), (2, 2), RUNTIME),
    WindowCase("dilated-columns-only", (3, 3), (1, 1), (1, 2), RUNTIME),
    WindowCase("unequal-strides", (7, 7), (1, 2), (1, 1), RUNTIME),
    WindowCase("rectangular", (3, 5), (1, 1), (1, 1), RUNTIME),
    WindowCase("unlisted-size", (1, 1), (1, 1), (1, 1), RUNTIME),
)


@pytest.mark.parametrize("case", WINDOW_CASES, ids=lambda c: c.name)
def test_the_tile_specialisation_fixes_only_listed_square_windows(case):
    source = load_source(involution_cuda.SPAN_TILE_SOURCE)
    pick = involution_cuda.generated_tile_specialisation(source, case.kernel_size, case.stride, case.dilation)
    assert pick == case.specialisation


def test_the_tile_instantiations_are_the_pairs_its_source_lists(tmp_path):
    """One oplib-template line names KERNEL and STRIDE together: the instantiations are its
    pairs (not every kernel size with every stride), and an edited line is what the host then
    picks from; a pair of the wrong length is refused."""
    source = load_source(involution_cuda.SPAN_TILE_SOURCE)
    line = "// oplib-template: KERNEL, STRIDE = 0, 0 | 3, 1 | 3, 2 | 5, 1 | 5, 2 | 7, 1 | 7, 2"
    assert source.text.count(line) == 1, "update the test"
    pairs = (("0", "0"), ("3", "1"), ("3", "2"), ("5", "1"), ("5", "2"), ("7", "1"), ("7", "2"))
    assert source.specialisations["involution_generated_tile"] == pairs
    assert source.specialisations["involution_span_tile"] == ((),)
    assert source.template_values == {"KERNEL": ("0", "3", "5", "7"), "STRIDE": ("0", "1", "2")}
    def edited(pairs: str) -> KernelSource:
        return KernelSource(tmp_path / "span_tile.cu", source.text.replace(line, f"// oplib-template: KERNEL, STRIDE = {pairs}"))

    fewer = edited("0, 0 | 7, 1")
    assert fewer.specialisations["involution_generated_tile"] == (("0", "0"), ("7", "1"))
    assert involution_cuda.generated_tile_specialisation(fewer, (7, 7), (2, 2), (1, 1)) == RUNTIME
    broken = edited("0, 0 | 7")
    with pytest.raises(ValueError, match="another length"):
        broken.specialisations


def gpu_samples(dtype: torch.dtype, cases) -> list[tuple[tuple, str]]:
    """(CUDA arguments, name) of involution_generated's samples, ``cases`` (TileCases), random
    geometries (the spec's) and random square windows: what a fused kernel's GPU test runs."""
    samples = [(s.args, s.name) for s in GENERATED.sample_inputs("cuda", dtype, False)]
    samples += [(c.arguments(dtype), c.name) for c in cases]
    samples += [(s.args, f"random-{i}") for i, s in enumerate(random_samples(GENERATED, dtype, 8, seed=3))]
    samples += [(c.arguments(dtype), c.name) for c in _random_specialised_cases(6, seed=7)]
    return [(tuple(a.cuda() if isinstance(a, torch.Tensor) else a for a in args), name) for args, name in samples]


@pytest.mark.needs_cuda
@pytest.mark.parametrize("dtype", registry.FLOAT_DTYPES, ids=str)
def test_generated_tile_on_a_gpu_matches_the_reference(dtype):
    """CuPy's launch, tensor cores and all, on the samples, the geometries above and random ones
    (the spec's, and square windows for the specialised instantiations)."""
    for args, name in gpu_samples(dtype, (TWO_CHANNEL_CHUNKS, *REDNET_LIKE)):
        if not _check_tile(args, None, name):
            assert _declined_only_past_the_tile(args), name


@pytest.mark.needs_cuda
@pytest.mark.parametrize("dtype", registry.FLOAT_DTYPES, ids=str)
def test_specialised_tile_on_a_gpu_gives_the_runtime_instantiations_bits(dtype):
    """What NVRTC makes of the unrolled loops keeps every sum's order too."""
    _assert_specialised_equals_runtime(dtype, "cuda", lambda: None)


# ---------------------------------------------------------------------------------------
# Planted bugs in span_tile.cu and warp.cuh
# ---------------------------------------------------------------------------------------


class PlantedBug(NamedTuple):
    name: str
    text: str
    bug: str


MISSING_BARRIERS = tuple(
    PlantedBug(name, f"__syncthreads();  // {comment}", f"// {comment}")
    for name, comment in (("staged", "the chunk is staged"), ("consumed", "every warp is done with the chunk"),
                          ("summed", "every warp's sums are in place"))
)
# a[1] and a[2] swapped (ldmatrix's matrix 1 the upper columns of rows 0-7, matrix 2 the lower of
# rows 8-15): the registers' order confused.
WRONG_FRAGMENT = PlantedBug(
    "fragment-a-register-order",
    "oplib_load_matrices<4>(words + ((lane & 7) + 8 * (lane >> 3 & 1)) * stride + 4 * (lane >> 4), a.reg);",
    "oplib_load_matrices<4>(words + ((lane & 7) + 8 * (lane >> 4)) * stride + 4 * (lane >> 3 & 1), a.reg);")
# The threads of the pixels past the plane leave before the block's barriers.
EARLY_RETURN = PlantedBug("return-past-the-plane", "const index_t pixel0 = (index_t)blockIdx.x * SPAN_TILE_PIXELS;",
                          "const index_t pixel0 = (index_t)blockIdx.x * SPAN_TILE_PIXELS; "
                          "if (pixel0 + thread >= plane) return;")
# The sums start one staged row late: their last row lies past the end of the shared memory.
SHARED_OVERRUN = PlantedBug("sums-past-the-end", "acc_t* sums = reinterpret_cast<acc_t*>(span_chunk + SPAN_TILE_ROWS * stride);",
                            "acc_t* sums = reinterpret_cast<acc_t*>(span_chunk + (SPAN_TILE_ROWS + 1) * stride);")


def _plant(monkeypatch, tmp_path, bug: PlantedBug) -> KernelSource:
    planted = planted_span_tile(tmp_path, bug.text, bug.bug)
    monkeypatch.setattr(involution_cuda, "load_source", lambda filename: planted)
    return planted


def _assert_fails_the_reference_check(bug: PlantedBug, dtypes, orders=ORDERS) -> None:
    for order in orders:
        for dtype in dtypes:
            with planted_bug_caught():
                _check(*TWO_CHUNKS.tensors(dtype), EmulatedLauncher(order=order), f"{bug.name}-{order}")


# Each planted source is a build of its own (seconds): the unit tier plants one barrier.
@pytest.mark.parametrize("bug", [MISSING_BARRIERS[0], *(pytest.param(b, marks=pytest.mark.integration)
                                                        for b in MISSING_BARRIERS[1:])], ids=lambda b: b.name)
def test_a_missing_barrier_fails_the_reference_check(bug, tmp_path, monkeypatch):
    """Each of the three barriers, left out: some warp reads a chunk or the sums before the
    others wrote them, or after they overwrote them, in every dtype and either run order
    (between two barriers a warp runs as far as it can before the next one starts). In 16-bit
    dtypes the emulation may stop first, at the ldmatrix whose row another lane of the warp
    wrote after the reading lane got there."""
    require_host_compiler()
    _plant(monkeypatch, tmp_path, bug)
    _assert_fails_the_reference_check(bug, registry.FLOAT_DTYPES)


def test_a_wrong_fragment_layout_fails_the_reference_check(tmp_path, monkeypatch):
    """The tensor-core product on the host is computed from each lane's fragments as the PTX
    ISA lays them out, so fragments loaded in another layout give wrong numbers."""
    require_host_compiler()
    _plant(monkeypatch, tmp_path, WRONG_FRAGMENT)
    _assert_fails_the_reference_check(WRONG_FRAGMENT, (torch.bfloat16, torch.float16), orders=ORDERS[:1])


def test_a_barrier_that_threads_return_before_is_reported(tmp_path, monkeypatch):
    require_host_compiler()
    _plant(monkeypatch, tmp_path, EARLY_RETURN)
    feature, span_weight, span_bias = TWO_CHUNKS.tensors(torch.float32)
    # 81 pixels: threads 81-255 of the first pixel tile return, 17-255 of the second.
    for order in ORDERS:
        with pytest.raises(EmulationError, match=r"block \([01], [01], 0\): __syncthreads at span_tile\.cu:\d+ is not "
                                                 r"reached by every thread of the block: threads 0-(80|16) wait at "
                                                 r"__syncthreads at span_tile\.cu:\d+; threads (81|17)-255 returned"):
            involution_cuda.span_tile(feature, span_weight, span_bias, EmulatedLauncher(order=order))


# In involution_generated_tile: the barrier before the sets' partial sums are added, left out (a
# set adds partials another has not written yet); the input window one
# column short (the last tap of each row read from the next staged row); the weights one tap row
# late, their last row past the end of the shared memory.
TILE_PARTIALS_BARRIER = PlantedBug("tile-partials-barrier", "__syncthreads();  // every set's partial sums are in place",
                                   "// every set's partial sums are in place")
TILE_HALO = PlantedBug("tile-halo-one-short",
                       "const int in_w = (GEN_TILE_W - 1) * geometry.stride_w + (geometry.kernel_w - 1) * geometry.dilation_w + 1;",
                       "const int in_w = (GEN_TILE_W - 1) * geometry.stride_w + (geometry.kernel_w - 1) * geometry.dilation_w;")
TILE_WEIGHTS_OVERRUN = PlantedBug(
    "tile-weights-past-the-end", "weight_t* weights = reinterpret_cast<weight_t*>(shared + (staging_bytes + 15) / 16 * 16);",
    "weight_t* weights = reinterpret_cast<weight_t*>(shared + (staging_bytes + 15) / 16 * 16) + SPAN_TILE_SUMS_STRIDE;")


@pytest.mark.parametrize("bug", [TILE_PARTIALS_BARRIER, TILE_HALO], ids=lambda b: b.name)
def test_a_planted_tile_bug_fails_the_reference_check(bug, tmp_path, monkeypatch):
    """In the 7x7 instantiation TWO_CHANNEL_CHUNKS takes and in the one that reads its window
    from the arguments."""
    require_host_compiler()
    _plant(monkeypatch, tmp_path, bug)
    for order in ORDERS:
        for dtype in (torch.float32, torch.bfloat16):
            for specialised in (True, False):
                launcher = EmulatedLauncher(order=order)
                with pytest.raises(AssertionError, match="not close"):
                    _check_tile(TWO_CHANNEL_CHUNKS.arguments(dtype), launcher, f"{bug.name}-{order}", specialised)
                assert _tile_specialisations(launcher) == {("7", "1") if specialised else ("0", "0")}


# ---------------------------------------------------------------------------------------
# AddressSanitizer, and the portable fiber switch
# ---------------------------------------------------------------------------------------

_RUN_SAMPLES = textwrap.dedent(
    """
    import random, sys, torch
    from oplib import registry
    from oplib.testing.cuda_emulation import EmulatedLauncher
    sys.path.insert(0, {tests!r})
    from test_cuda_tiles import (GENERATED, ORDERS, REDNET_LIKE, TWO_CHANNEL_CHUNKS, _check, _check_tile, _random_cases,
                                 _random_specialised_cases, _registry_samples)
    from cuda_test_helpers import random_samples
    launches = 0
    for order in ORDERS:
        launcher = EmulatedLauncher(sanitize={sanitize}, order=order)
        for dtype in registry.FLOAT_DTYPES:
            for feature, span_weight, span_bias, name in _registry_samples(dtype):
                _check(feature, span_weight, span_bias, launcher, name)
            for case in _random_cases({random_cases}, seed=5):
                _check(*case.tensors(dtype), launcher, case.name)
            for sample in GENERATED.sample_inputs("cpu", dtype, False):
                _check_tile(sample.args, launcher, sample.name)
            for case in (TWO_CHANNEL_CHUNKS, *REDNET_LIKE):
                _check_tile(case.arguments(dtype), launcher, case.name)
            for index, sample in enumerate(random_samples(GENERATED, dtype, {random_cases}, seed=5)):
                _check_tile(sample.args, launcher, f"random-{{index}}")
            for case in _random_specialised_cases(2 * {random_cases}, seed=5):
                _check_tile(case.arguments(dtype), launcher, case.name)
        launches += len(launcher.launches)
    print("clean:", launches, "launches")
    """
)


@pytest.mark.integration
def test_span_tile_is_clean_under_address_sanitizer():
    """The registry samples and random geometries (every specialised window among them), every
    dtype, both orders: no access outside the tensors or the dynamic shared memory (the host's
    size of it is the kernel's layout)."""
    require_host_compiler()
    script = _RUN_SAMPLES.format(tests=str(Path(__file__).parent), sanitize=True, random_cases=6)
    result = run_under_asan(script)
    assert result.returncode == 0, result.stderr[-5000:]
    assert "clean:" in result.stdout


# Each over-run with a call that reaches it.
OVER_RUNS = {
    SHARED_OVERRUN.name: (SHARED_OVERRUN, """
        f, s = torch.randn(1, 20, 9, 9), torch.randn(40, 20)
        ops.span_tile(f, s, None, launcher)
    """),
    TILE_WEIGHTS_OVERRUN.name: (TILE_WEIGHTS_OVERRUN, """
        x, f, s = torch.randn(1, 32, 9, 9), torch.randn(1, 8, 9, 9), torch.randn(2 * 49, 8)
        ops.involution_generated_tile(x, f, s, None, [7, 7], [1, 1], [3, 3], [1, 1], torch.empty(1, 32, 9, 9), launcher)
    """),
}


@pytest.mark.integration
@pytest.mark.parametrize("name", OVER_RUNS)
def test_address_sanitizer_catches_a_shared_memory_over_run(name, tmp_path):
    require_host_compiler()
    bug, call = OVER_RUNS[name]
    planted = planted_span_tile(tmp_path, bug.text, bug.bug)
    assert_asan_catches(planted, call)


@pytest.mark.integration
def test_the_portable_fiber_switch_gives_the_same_results():
    """Built with OPLIB_EMULATION_UCONTEXT (makecontext/swapcontext, the path of hosts other
    than x86-64), in a process of its own: the same samples pass."""
    require_host_compiler()
    env = dict(os.environ, OPLIB_EMULATION_CXXFLAGS="-DOPLIB_EMULATION_UCONTEXT")
    script = _RUN_SAMPLES.format(tests=str(Path(__file__).parent), sanitize=False, random_cases=3)
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=900)
    assert result.returncode == 0, result.stderr[-5000:]
    assert "clean:" in result.stdout
