"""Tiled kernels on the host: the emulation of cooperating threads (cuda_host_shim.h: fibers,
barriers, warp shuffles, shared memory) against CUDA's rules, on the small kernels of
cuda_sources/cooperation.cu."""

from __future__ import annotations

from pathlib import Path
from typing import NamedTuple

import pytest
import torch

from oplib.kernels import KernelSource, LaunchConfig, load_source
from oplib.kernels.involution import cuda as involution_cuda
from oplib.testing.cuda_emulation import ORDERS, EmulatedLauncher, EmulationError, cooperative
from oplib.testing.toolchain import require_host_compiler

_COOPERATION_PATH = Path(__file__).parent / "cuda_sources" / "cooperation.cu"
COOPERATION = KernelSource(_COOPERATION_PATH, _COOPERATION_PATH.read_text())


# ---------------------------------------------------------------------------------------
# The emulation of cooperating threads
# ---------------------------------------------------------------------------------------


def test_only_sources_whose_threads_cooperate_run_as_fibers(tmp_path):
    """The fiber path is taken for a source that uses shared memory, barriers or shuffles, in
    its own code or in a header it includes; involution's kernels keep the plain loops."""
    assert cooperative(COOPERATION)
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


def test_dynamic_shared_memory_is_fresh_and_poisoned_in_every_block():
    """Each block finds its dynamic shared memory filled with 0xff bytes (a NaN in every
    floating type), whatever the block before it on the same OS thread wrote."""
    require_host_compiler()
    out = torch.zeros(16, 64, dtype=torch.float64)
    EmulatedLauncher().launch(COOPERATION, "first_bytes", torch.float64, LaunchConfig(16, 64, shared_bytes=64), (out,))
    assert torch.equal(out, torch.full_like(out, 255.0))


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
