"""An offline model of the device time of oplib's CUDA kernels: what a launch would take on a
GPU that this project rarely has, from what a machine without one can know.

Per launch (the kernel instantiation, grid and block that the op's CUDA dispatch chooses,
recorded by ``record_launches`` on CPU tensors):

- **work**, from a warp-level trace of the kernel's memory instructions (``kernel_work``): the
  kernel's address expressions, re-stated per kernel family below, are evaluated for every
  lane of a sample of warps, giving the load and store instructions a warp issues, the 128-byte
  lines each touches (what the L1 processes: a "wavefront" a clock), the multiply-adds and the
  bytes of every tensor the launch reads or writes once (the DRAM traffic when the caches hold
  the reuse);
- **resources**, from the SASS that NVRTC compiles (``sass_profile``): registers (hence the
  blocks resident per SM, ``resident_blocks``), the width of each load, and how many loads a
  warp issues before it must wait for one (its memory-level parallelism);
- **time** (``predict``): the launch floor plus the slowest of

    - DRAM: unique bytes over the effective bandwidth (a fraction of the peak: measured copy
      bandwidth where a run gave one);
    - L1: the lines of the busiest SM (its share of blocks: the tail of the last wave) over the
      lines a clock it achieves;
    - latency (Little's law): an SM keeps ``resident warps x loads in flight per warp``
      requests outstanding, each taking the memory latency, so each wave of resident blocks
      takes ``dependent round trips per warp x latency``;
    - FMA and tensor-core pipes: multiply-adds over the SM's rate;
    - shared memory (the tiled kernels): the busiest SM's wavefronts, one a clock (bank
      conflicts counted from the traced addresses; a hardware rate, not a fitted constant);
    - instruction issue: the busiest SM's instructions over its 4 schedulers, each issuing at
      most one a clock, and less when it holds fewer warps than one warp's dependent issue
      interval (``Constants.dependent_issue_cycles``). The instructions are the traced ones
      (memory, shared memory, multiply-adds) times the kernel's ratio of all its SASS
      instructions to those kinds (``SassProfile.instruction_ratio``): the index arithmetic,
      conversions and branches around them, which bind a kernel whose memory does not.

Five constants are fitted (``Constants``): the cycles per warp memory request and per L1 line
(the load/store pipe's and the L1's achieved rates), the memory latency, the launch floor and
a warp's dependent issue interval; each has a physical meaning and a plausible range. ``fit``
finds them by least squares on log(predicted / measured) over a table's rows.
``bench/cuda_model.py`` fits them on the committed H200 table (held-out halves too) and
writes ``bench/results/cuda-model.md``.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import math
import re
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Optional

import torch
from torch import Tensor

# ---------------------------------------------------------------------------------------
# GPUs
# ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class GPU:
    """What the model needs of a GPU: ``sms`` streaming multiprocessors at ``clock_hz``,
    ``dram_bytes_per_s`` peak DRAM bandwidth (read + write), per SM: ``fma_per_clock`` FP32
    multiply-adds, ``tensor_macs_per_clock`` dense BF16 tensor-core multiply-adds, the
    occupancy limits (threads, blocks, registers, shared memory) and the L1 line size."""

    name: str
    arch: str
    sms: int
    clock_hz: float
    dram_bytes_per_s: float
    fma_per_clock: int
    tensor_macs_per_clock: int
    max_threads: int = 2048
    max_blocks: int = 32
    registers: int = 65536
    shared_bytes: int = 228 * 1024
    shared_reserved_per_block: int = 1024
    line_bytes: int = 128
    # Shared memory: 32 banks of 4 bytes, one pass of a warp access (a wavefront) a clock.
    shared_wavefronts_per_clock: float = 1.0


# Sources: NVIDIA's datasheets for H200 SXM (4.8 TB/s HBM3e) and H100 SXM (3.35 TB/s HBM3),
# the NVIDIA H100 Tensor Core GPU Architecture whitepaper (132 SMs on H100 SXM5 and so on H200,
# the same GH100 die; 128 FP32 lanes and 1024 dense FP16/BF16 tensor multiply-adds a clock per
# SM... doubled to 2048 on Hopper's fourth-generation tensor cores; 228 KB shared memory and
# 64K registers per SM, 2048 threads and 32 blocks) and the NVIDIA A100 Tensor Core GPU
# Architecture whitepaper (108 SMs at 1410 MHz boost, 64 FP32 lanes and 1024 dense FP16
# tensor multiply-adds a clock per SM, 164 KB shared memory; 2039 GB/s on the 80 GB SXM).
# Hopper's 1980 MHz is the maximum SM clock that nvidia-smi reports on H100/H200 SXM.
H200 = GPU("NVIDIA H200", "sm_90", sms=132, clock_hz=1.98e9, dram_bytes_per_s=4.8e12, fma_per_clock=128,
           tensor_macs_per_clock=2048)
H100_SXM = GPU("NVIDIA H100 SXM", "sm_90", sms=132, clock_hz=1.98e9, dram_bytes_per_s=3.35e12, fma_per_clock=128,
               tensor_macs_per_clock=2048)
A100_SXM = GPU("NVIDIA A100 SXM 80GB", "sm_80", sms=108, clock_hz=1.41e9, dram_bytes_per_s=2.039e12, fma_per_clock=64,
               tensor_macs_per_clock=1024, shared_bytes=164 * 1024)
# The two Blackwell and Ada data-centre parts, whose NVIDIA pages give totals only: the L40S
# datasheet (18,176 CUDA cores, 128 an SM: 142 SMs; 91.6 TFLOPS FP32 at its 2520 MHz boost;
# 362 TFLOPS dense BF16, 506 multiply-adds a clock per SM, taken as Ada's 512; 864 GB/s GDDR6)
# with sm_89's 100 KB of shared memory, 1536 threads and 24 blocks an SM (CUDA Programming
# Guide, compute capability 8.9), and the HGX B200 at 1000 W as published pages give it (148
# SMs at 1980 MHz, 128 FP32 lanes an SM; 2.25 PFLOPS dense BF16, about 4096 multiply-adds a
# clock per SM at its 1860 MHz tensor clock; 8 TB/s HBM3e) with sm_100's 228 KB, 2048 threads
# and 32 blocks. Used for the offline model's per-architecture tables only, never fitted.
L40S = GPU("NVIDIA L40S", "sm_89", sms=142, clock_hz=2.52e9, dram_bytes_per_s=0.864e12, fma_per_clock=128,
           tensor_macs_per_clock=512, max_threads=1536, max_blocks=24, shared_bytes=100 * 1024)
B200 = GPU("NVIDIA B200", "sm_100", sms=148, clock_hz=1.98e9, dram_bytes_per_s=8.0e12, fma_per_clock=128,
           tensor_macs_per_clock=4096)
GPUS = {gpu.name: gpu for gpu in (H200, H100_SXM, A100_SXM, L40S, B200)}

# The occupancy calculator's allocation rules (CUDA Occupancy Calculator, sm_70 and newer):
# registers go to a warp in units of 256, the register file is split among 4 schedulers, each
# holding whole warps; shared memory goes in units of 128 bytes.
_REGISTER_UNIT = 256
_SCHEDULERS = 4
_SHARED_UNIT = 128


def resident_blocks(registers: int, threads_per_block: int, shared_bytes: int, gpu: GPU) -> int:
    """Blocks of ``threads_per_block`` threads, each using ``registers`` registers and the block
    ``shared_bytes`` of shared memory (static + dynamic), that fit on one SM of ``gpu`` at once."""
    warps = -(-threads_per_block // 32)
    per_warp = -(-registers * 32 // _REGISTER_UNIT) * _REGISTER_UNIT
    warps_by_registers = _SCHEDULERS * (gpu.registers // _SCHEDULERS // per_warp)
    limits = [gpu.max_blocks, gpu.max_threads // (warps * 32), warps_by_registers // warps]
    if shared_bytes:
        per_block = -(-(shared_bytes + gpu.shared_reserved_per_block) // _SHARED_UNIT) * _SHARED_UNIT
        limits.append(gpu.shared_bytes // per_block)
    return max(0, min(limits))


# ---------------------------------------------------------------------------------------
# Launches: what an op's CUDA dispatch launches, recorded on CPU tensors
# ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Launch:
    """One kernel launch: ``kernel`` of ``source`` for ``dtype`` with its template arguments
    after scalar_t (``specialisation``), ``grid`` and ``block`` (dim3), dynamic shared memory,
    its scalar arguments in order, and the bytes of each tensor argument."""

    source: str
    kernel: str
    dtype: torch.dtype
    specialisation: tuple[str, ...]
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    shared_bytes: int
    scalars: tuple[int, ...]
    tensor_bytes: tuple[int, ...]

    @property
    def blocks(self) -> int:
        return self.grid[0] * self.grid[1] * self.grid[2]

    @property
    def threads_per_block(self) -> int:
        return self.block[0] * self.block[1] * self.block[2]

    @property
    def name(self) -> str:
        from ..kernels.cuda_source import name_expression

        return name_expression(self.kernel, self.dtype, self.specialisation)


@dataclass(frozen=True)
class Copy:
    """A copy that torch runs around a launch (a layout change: ``clone``, ``copy_``):
    ``bytes`` read plus written."""

    op: str
    bytes: int


class RecordingLauncher:
    """A Launcher (``oplib.kernels.cuda_launch.Launcher``) that records each launch and runs
    nothing: the dispatch code chooses kernels, grids and arguments as it would on a GPU."""

    def __init__(self) -> None:
        self.launches: list[Launch] = []

    def launch(self, source, kernel, dtype, config, args, specialisation=()) -> None:
        from ..kernels.cuda_source import KERNEL_DIR

        tensors = tuple(a.numel() * a.element_size() for a in args if isinstance(a, Tensor))
        scalars = tuple(a for a in args if not isinstance(a, Tensor))
        self.launches.append(Launch(source.path.relative_to(KERNEL_DIR).as_posix(), kernel, dtype,
                                    tuple(specialisation), config.grid, config.block, config.shared_bytes,
                                    scalars, tensors))


def record_launches(qualname: str, *args: Any, policy: Any = None,
                    launcher: Optional[RecordingLauncher] = None) -> list[Launch | Copy]:
    """Run the CUDA dispatch of op ``qualname`` (``oplib.kernels.CUDA_DISPATCH``) on ``args``
    (CPU tensors of the real shapes and layouts: the dispatch reads pointers' alignment) with a
    recording launcher (``launcher``, a new one where None: one that answers the host's
    questions of a GPU, such as its occupancy, records the launches the host chooses there),
    and ``policy`` where given (involution's ops: a ``LaunchPolicy``); returns its launches and
    the copies torch makes around them, in order."""
    from torch.overrides import TorchFunctionMode

    from ..kernels import CUDA_DISPATCH

    events: list[Launch | Copy] = []
    launcher = RecordingLauncher() if launcher is None else launcher
    copying = (Tensor.contiguous, Tensor.clone, Tensor.copy_)

    class _Copies(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            # contiguous() returns its input where it is already in the layout asked for
            if func in copying and isinstance(out, Tensor) and (func is Tensor.copy_ or out is not args[0]):
                events.append(Copy(func.__name__, 2 * out.numel() * out.element_size()))
            return out

    original = launcher.launch

    def launch(*launch_args, **kwargs):
        original(*launch_args, **kwargs)
        events.append(launcher.launches[-1])

    launcher.launch = launch  # type: ignore[method-assign]
    with _Copies():
        CUDA_DISPATCH[qualname].launch(*args, launcher, *(() if policy is None else (policy,)))
    return events


# ---------------------------------------------------------------------------------------
# Work: a warp-level trace of a launch's memory instructions
# ---------------------------------------------------------------------------------------

# Warps traced per launch: evenly spaced over the grid, so that edge rows and columns weigh
# as they do in the whole launch; the sums are scaled to every warp.
TRACED_WARPS = 128


@dataclass(frozen=True)
class KernelWork:
    """A launch's work summed over its warps: warp-level load and store instructions with a
    lane active (``*_requests``) and the 128-byte lines they touch (``*_lines``), warp-level
    FP32 multiply-add instructions, the bytes of every tensor read or written once (the DRAM
    traffic when the caches hold all reuse), and the warps."""

    warps: int
    load_requests: float
    load_lines: float
    store_requests: float
    store_lines: float
    fma_requests: float
    dram_bytes: int
    # Shared-memory wavefronts (a warp access's bank-conflict passes), of the tiled kernels.
    shared_wavefronts: float = 0.0
    # Warp-level shared-memory load and store instructions with a lane active.
    shared_requests: float = 0.0
    # Tensor-core multiply-adds, in dense BF16 ones (a TF32 one counts two: half the rate), of the
    # kernels whose tensor-core work is a term (float32's 3xTF32).
    tensor_macs: float = 0.0

    @property
    def lines(self) -> float:
        return self.load_lines + self.store_lines

    @property
    def instructions(self) -> float:
        """The traced warp instructions: global and shared loads and stores, multiply-adds."""
        return self.load_requests + self.store_requests + self.shared_requests + self.fma_requests


class _Tally:
    """Counts a traced kernel's instructions. Every index is a tensor broadcast to
    (..., warps, 32): the leading dimensions are instruction slots (one warp instruction each,
    issued where any lane is active), the last two the traced warps and their lanes."""

    def __init__(self, active: Tensor, line_bytes: int):
        self.active = active
        self.line_bytes = line_bytes
        self.counts = {"load_requests": 0.0, "load_lines": 0.0, "store_requests": 0.0, "store_lines": 0.0,
                       "fma_requests": 0.0, "shared_wavefronts": 0.0, "shared_requests": 0.0, "tensor_macs": 0.0}

    def _access(self, kind: str, tensor: int, index: Tensor, mask: Tensor, element_bytes: int) -> None:
        mask = mask & self.active
        index, mask = torch.broadcast_tensors(index, mask)
        line = torch.where(mask, (index * element_bytes) // self.line_bytes + (tensor << 48), -1)
        line = line.sort(dim=-1).values
        new = torch.ones_like(mask)
        new[..., 1:] = line[..., 1:] != line[..., :-1]
        self.counts[f"{kind}_requests"] += float(mask.any(-1).sum())
        self.counts[f"{kind}_lines"] += float((new & (line >= 0)).sum())

    def load(self, tensor: int, index: Tensor, mask: Tensor, element_bytes: int) -> None:
        """A load per slot of ``index`` (elements of ``element_bytes``) from tensor argument
        number ``tensor``, by the lanes of ``mask``."""
        self._access("load", tensor, index, mask, element_bytes)

    def store(self, tensor: int, index: Tensor, mask: Tensor, element_bytes: int) -> None:
        self._access("store", tensor, index, mask, element_bytes)

    def shared(self, index: Tensor, mask: Tensor, element_bytes: int) -> None:
        """A shared-memory load or store per slot of ``index`` (elements of ``element_bytes``
        from the start of the block's shared memory), by the lanes of ``mask``: the passes it
        takes, the most distinct 4-byte words any of the 32 banks serves (one word read by
        several lanes is a broadcast, one pass)."""
        mask = mask & self.active
        index, mask = torch.broadcast_tensors(index, mask)
        self.counts["shared_requests"] += float(mask.any(-1).sum())
        words = (index * element_bytes) // 4
        if element_bytes > 4:  # each lane's value spans element_bytes / 4 consecutive words
            words = (words.unsqueeze(-1) + torch.arange(element_bytes // 4)).flatten(-2)
            mask = mask.unsqueeze(-1).expand(*mask.shape, element_bytes // 4).flatten(-2)
        self.counts["shared_wavefronts"] += _bank_passes(words, mask)

    def matrices(self, rows: Tensor, mask: Tensor, count: int) -> None:
        """An ldmatrix of ``count`` 8 x 8 matrices of 16-bit values per slot of ``rows`` (each
        lane's row address, in 4-byte words from the start of the block's shared memory; lanes
        8 i .. 8 i + 7 name matrix i's rows), by the warps with a lane of ``mask`` active: one
        instruction, and per matrix the passes its 8 rows of 4 words take."""
        mask = mask & self.active
        rows, mask = torch.broadcast_tensors(rows, mask)
        warp_active = mask.any(-1)
        self.counts["shared_requests"] += float(warp_active.sum())
        matrix_rows = rows[..., :8 * count].unflatten(-1, (count, 8))
        words = (matrix_rows.unsqueeze(-1) + torch.arange(4)).flatten(-2)  # (..., count, 32)
        live = warp_active[..., None, None].expand(*words.shape)
        self.counts["shared_wavefronts"] += _bank_passes(words, live)

    def fma(self, mask: Tensor, per_slot: int = 1) -> None:
        """``per_slot`` FP32 multiply-add instructions per slot of ``mask`` with a lane active."""
        self.counts["fma_requests"] += per_slot * float((mask & self.active).any(-1).sum())

    def tf32_products(self, mask: Tensor, per_slot: int = 1) -> None:
        """``per_slot`` mma.m16n8k8.tf32 per slot of ``mask`` with a lane active: 1024
        multiply-adds each, at half the BF16 rate."""
        self.counts["tensor_macs"] += 2 * 1024 * per_slot * float((mask & self.active).any(-1).sum())


def _bank_passes(words: Tensor, mask: Tensor) -> float:
    """The passes a shared-memory access takes, summed over its leading dimensions: of the
    4-byte ``words`` (last dimension) the lanes of ``mask`` touch, the most distinct ones any of
    the 32 banks serves (one word read by several lanes is a broadcast, one pass)."""
    key = torch.where(mask, words, -1).sort(dim=-1).values
    new = torch.ones_like(key, dtype=torch.bool)
    new[..., 1:] = key[..., 1:] != key[..., :-1]
    new &= key >= 0
    per_bank = torch.zeros(*key.shape[:-1], 32, dtype=torch.long)
    per_bank.scatter_add_(-1, torch.where(key >= 0, key % 32, 0), new.long())
    return float(per_bank.max(dim=-1).values.sum())


def _fragment_a_rows(lane: Tensor, stride: int) -> Tensor:
    """warp.cuh's oplib_load_fragment_a: each lane's ldmatrix row, in words from the tile's
    first word (rows ``stride`` words apart)."""
    return (lane % 8 + 8 * (lane // 8 % 2)) * stride + 4 * (lane // 16)


def _fragment_b_rows(lane: Tensor, stride: int, second: int = 0) -> Tensor:
    """warp.cuh's oplib_load_fragment_b (2 matrices), or with ``second`` (words to the second
    tile) oplib_load_fragments_b (4): each lane's ldmatrix row, in words from the first tile's
    first word (columns ``stride`` words apart)."""
    return lane // 16 * second + lane % 8 * stride + 4 * (lane // 8 % 2)


def _band_products(t: "_Tally", lane: Tensor, band_at, band_words: int, rows, stride: int, k_steps, mask: Tensor,
                   paired_windows: bool, most_steps: Optional[int] = None, lower=None) -> None:
    """generated_mma.cu's mma_band_products, the fragment loads of a run's sums over one kernel
    row: per k-step an ldmatrix for each band's A fragment (hi, lo: ``band_words`` apart from
    ``band_at``) and the staged ``rows``' B fragments of two n-tiles, in one ldmatrix with
    ``paired_windows`` (the forward), else one each (grad_input); tensor cores: no term.
    ``k_steps`` may differ by thread (a tensor, at most ``most_steps``: grad_input's k-steps
    with pixels of the map). With ``lower`` (FOLDED, a folded run), the B fragments of the
    upper row's window (``rows``) and of the lower row's, each A fragment serving both."""
    windows = (rows,) if lower is None else (rows, lower)
    for k in range(k_steps if most_steps is None else most_steps):
        live = mask if most_steps is None else mask & (k < k_steps)
        for plane in range(2):
            t.matrices(band_at + plane * band_words + 8 * k + _fragment_a_rows(lane, stride), live, 4)
        for window in windows:
            if paired_windows:
                t.matrices(window + 8 * k + _fragment_b_rows(lane, stride, 8 * stride), live, 4)
                continue
            for n_tile in range(2):
                t.matrices(window + 8 * n_tile * stride + 8 * k + _fragment_b_rows(lane, stride), live, 2)


def _slots(n: int, dims: int = 3) -> Tensor:
    """0..n-1 as a leading slot dimension over (warps, lanes) and ``dims - 3`` more slot dims."""
    return torch.arange(n).view(n, *(1,) * (dims - 1))


def _decode(item: Tensor, parts: int, groups: int, rows: int, columns: int, channels_last: bool):
    """``decode_item`` of involution.cu: (n, g, k, y, x) of a chunked kernel's work item."""
    if channels_last:
        k, rest = item % parts, item // parts
        g, rest = rest % groups, rest // groups
        x, rest = rest % columns, rest // columns
        return rest // rows, g, k, rest % rows, x
    x, rest = item % columns, item // columns
    y, rest = rest % rows, rest // rows
    k, rest = rest % parts, rest // parts
    return rest // groups, rest % groups, k, y, x


def _first_true(valid: Tensor) -> Tensor:
    """Index along dim 0 of the first True (its size where none is)."""
    size = valid.shape[0]
    where = torch.where(valid, _slots(size, valid.dim()).expand_as(valid), size)
    return where.min(dim=0).values


def _chunked_window(launch: Launch):
    K, S, last = int(launch.specialisation[1]), int(launch.specialisation[2]), launch.specialisation[3] == "true"
    es = launch.dtype.itemsize
    return K, S, last, es, 16 // es


def _forward_chunked(t: _Tally, item: Tensor, launch: Launch) -> None:
    """involution_forward_chunked: weight loads for every tap of each valid row, then the
    chunk's channels at each valid tap (16-byte vectors when channels_last)."""
    _, C, H, W, G, OH, OW, ph, pw, chunk = launch.scalars
    K, S, last, es, lanes = _chunked_window(launch)
    pg, plane, b = C // G, OH * OW, _slots(K)
    n, g, k, i, j = _decode(item, pg // chunk, G, OH, OW, last)
    c0, y0, x0 = g * pg + k * chunk, i * S - ph, j * S - pw
    rows_ok = (y0 + _slots(K) >= 0) & (y0 + _slots(K) < H)
    b_ok = (x0 + b >= 0) & (x0 + b < W)
    a_begin = _first_true(rows_ok)
    for step in range(K):  # the runtime loop a = a_begin .. a_end - 1
        a = a_begin + step
        on = (a < K) & rows_ok.gather(0, a.clamp(max=K - 1).unsqueeze(0))[0]
        weight = (((n * OH + i) * OW + j) * G * K * K + g * K * K + a * K + b if last
                  else (n * G + g) * K * K * plane + (a * K + b) * plane + i * OW + j)
        t.load(1, weight, on, es)
        y = y0 + a
        if last:
            v = _slots(chunk // lanes, 4) * lanes
            t.load(0, ((n * H + y) * W + x0 + b) * C + c0 + v, on & b_ok, es)
            t.fma(on & b_ok & (v >= 0), lanes)
        else:
            c = _slots(chunk, 4)
            t.load(0, ((n * C + c0 + c) * H + y) * W + x0 + b, on & b_ok & (c >= 0), es)
            t.fma(on & b_ok & (c >= 0))
    _store_channels(t, 2, launch, n, c0, i, j, OH, OW, C, chunk, last, es, lanes)


def _store_channels(t, tensor, launch, n, c0, y, x, rows, columns, C, chunk, last, es, lanes) -> None:
    if last:
        t.store(tensor, ((n * rows + y) * columns + x) * C + c0 + _slots(chunk // lanes) * lanes, True, es)
    else:
        t.store(tensor, (n * C + c0 + _slots(chunk)) * rows * columns + y * columns + x, True, es)


def _backward_input_chunked(t: _Tally, item: Tensor, launch: Launch) -> None:
    """involution_backward_input_chunked: the taps of one residue class per axis (a column slot
    t is the tap b = x's phase + S t of each lane); a weight load and the chunk's grad_output
    channels per valid tap."""
    _, C, H, W, G, OH, OW, ph, pw, chunk = launch.scalars
    K, S, last, es, lanes = _chunked_window(launch)
    pg, plane, a_all = C // G, OH * OW, _slots(K)
    n, g, k, y, x = _decode(item, pg // chunk, G, H, W, last)
    c0, ry, rx = g * pg + k * chunk, y + ph, x + pw
    rows_ok = (ry - a_all >= 0) & ((ry - a_all) % S == 0) & ((ry - a_all) // S < OH)
    b = rx % S + S * _slots(-(-K // S))
    b_ok = (b < K) & (rx - b >= 0) & ((rx - b) // S < OW)
    a_begin = _first_true(rows_ok)
    for step in range(-(-K // S)):  # a = a_begin, a_begin + S, ... while valid
        a = a_begin + step * S
        on = (a < K) & rows_ok.gather(0, a.clamp(max=K - 1).unsqueeze(0))[0]
        i, jj = (ry - a) // S, (rx - b) // S
        weight = (((n * OH + i) * OW + jj) * G * K * K + g * K * K + a * K + b if last
                  else ((n * G + g) * K * K + a * K + b) * plane + i * OW + jj)
        t.load(1, weight, on & b_ok, es)
        if last:
            v = _slots(chunk // lanes, 4) * lanes
            t.load(0, ((n * OH + i) * OW + jj) * C + c0 + v, on & b_ok, es)
            t.fma(on & b_ok & (v >= 0), lanes)
        else:
            c = _slots(chunk, 4)
            t.load(0, ((n * C + c0 + c) * OH + i) * OW + jj, on & b_ok & (c >= 0), es)
            t.fma(on & b_ok & (c >= 0))
    _store_channels(t, 2, launch, n, c0, y, x, H, W, C, chunk, last, es, lanes)


def _backward_weight_chunked(t: _Tally, item: Tensor, launch: Launch) -> None:
    """involution_backward_weight_chunked: one kernel row per thread; per channel (vector),
    a grad_output load and the row's valid taps of the input; K stores."""
    _, C, H, W, G, OH, OW, ph, pw = launch.scalars
    K, S, last, es, lanes = _chunked_window(launch)
    pg, plane, b = C // G, OH * OW, _slots(K)
    n, g, a, i, j = _decode(item, K, G, OH, OW, last)
    y, x0 = i * S - ph + a, j * S - pw
    b_ok = (x0 + b >= 0) & (x0 + b < W) & (y >= 0) & (y < H)
    any_b = b_ok.any(0)
    step = lanes if last else 1
    c = _slots(pg // step, 4) * step
    if last:
        t.load(0, ((n * OH + i) * OW + j) * C + g * pg + c[:, 0], any_b, es)
        t.load(1, ((n * H + y) * W + x0 + b) * C + g * pg + c, b_ok & (c >= 0), es)
        t.fma(b_ok & (c >= 0), lanes)
    else:
        t.load(0, (n * C + g * pg + c[:, 0]) * plane + i * OW + j, any_b, es)
        t.load(1, ((n * C + g * pg + c) * H + y) * W + x0 + b, b_ok & (c >= 0), es)
        t.fma(b_ok & (c >= 0))
    weight = (((n * OH + i) * OW + j) * G * K * K + g * K * K + a * K + b if last
              else ((n * G + g) * K * K + a * K + b) * plane + i * OW + j)
    t.store(2, weight, True, es)


_GENERATED_CHUNK = 8  # OPLIB_GENERATED_CHUNK of involution_generated.cu


def _generated_forward(t: _Tally, item: Tensor, launch: Launch) -> None:
    """involution_generated_forward: per chunk of 8 channels and valid tap, the tap's weight
    formed from the span row and the feature map (R loads of each), then 8 input loads."""
    _, C, H, W, G, KH, KW, OH, OW, sh, sw, ph, pw, dh, dw, R = launch.scalars
    es, pg, plane = launch.dtype.itemsize, C // G, OH * OW
    p, g, n = item % plane, (item // plane) % G, item // (plane * G)
    i, j = p // OW, p % OW
    b, r, kk = _slots(KW, 4), _slots(R, 5).unsqueeze(1), _slots(_GENERATED_CHUNK, 5).unsqueeze(1)
    for first in range(0, pg, _GENERATED_CHUNK):
        count = min(_GENERATED_CHUNK, pg - first)
        for a in range(KH):
            y, x = i * sh - ph + a * dh, j * sw - pw + b * dw
            valid = (y >= 0) & (y < H) & (x >= 0) & (x < W)
            tap = g * KH * KW + a * KW + b
            t.load(3, tap, valid, es)
            t.load(2, tap * R + r, valid, es)
            t.load(1, n * R * plane + p + r * plane, valid, es)
            t.fma(valid & (r >= 0))
            channel = (n * C + g * pg + first + kk[:count]) * H * W + y * W + x
            t.load(0, channel, valid, es)
            t.fma(valid & (kk[:count] >= 0))
        t.store(4, (n * C + g * pg + first + _slots(count)) * plane + p, True, es)


def _generic_window(launch: Launch):
    _, C, H, W, G, KH, KW, OH, OW, sh, sw, ph, pw, dh, dw = launch.scalars
    return C, H, W, G, KH, KW, OH, OW, sh, sw, ph, pw, dh, dw


def _forward_generic(t: _Tally, item: Tensor, launch: Launch) -> None:
    """involution_forward: one thread per output element, a weight and an input load per valid tap."""
    C, H, W, G, KH, KW, OH, OW, sh, sw, ph, pw, dh, dw = _generic_window(launch)
    es, plane = launch.dtype.itemsize, OH * OW
    j, i, c, n = item % OW, (item // OW) % OH, (item // plane) % C, item // (plane * C)
    a, b = _slots(KH, 4), _slots(KW)
    y, x = i * sh - ph + a * dh, j * sw - pw + b * dw
    valid = (y >= 0) & (y < H) & (x >= 0) & (x < W)
    t.load(1, (n * G + c // (C // G)) * KH * KW * plane + (a * KW + b) * plane + i * OW + j, valid, es)
    t.load(0, (n * C + c) * H * W + y * W + x, valid, es)
    t.fma(valid)
    t.store(2, item, True, es)


def _backward_input_generic(t: _Tally, item: Tensor, launch: Launch) -> None:
    """involution_backward_input: one thread per grad_input element, gathering its taps."""
    C, H, W, G, KH, KW, OH, OW, sh, sw, ph, pw, dh, dw = _generic_window(launch)
    es, plane = launch.dtype.itemsize, OH * OW
    x, y, c, n = item % W, (item // W) % H, (item // (H * W)) % C, item // (H * W * C)
    a, b = _slots(KH, 4), _slots(KW)
    row, col = y + ph - a * dh, x + pw - b * dw
    valid = (row >= 0) & (row % sh == 0) & (row // sh < OH) & (col >= 0) & (col % sw == 0) & (col // sw < OW)
    i, jj = row // sh, col // sw
    t.load(1, (n * G + c // (C // G)) * KH * KW * plane + (a * KW + b) * plane + i * OW + jj, valid, es)
    t.load(0, (n * C + c) * plane + i * OW + jj, valid, es)
    t.fma(valid)
    t.store(2, item, True, es)


def _backward_weight_generic(t: _Tally, item: Tensor, launch: Launch) -> None:
    """involution_backward_weight: one thread per weight element, summing its group's channels."""
    C, H, W, G, KH, KW, OH, OW, sh, sw, ph, pw, dh, dw = _generic_window(launch)
    es, plane, pg = launch.dtype.itemsize, OH * OW, C // G
    j, i = item % OW, (item // OW) % OH
    b, a = (item // plane) % KW, (item // (plane * KW)) % KH
    g, n = (item // (plane * KW * KH)) % G, item // (plane * KW * KH * G)
    y, x = i * sh - ph + a * dh, j * sw - pw + b * dw
    valid = (y >= 0) & (y < H) & (x >= 0) & (x < W)
    k = _slots(pg)
    t.load(0, (n * C + g * pg + k) * plane + i * OW + j, valid, es)
    t.load(1, (n * C + g * pg + k) * H * W + y * W + x, valid, es)
    t.fma(valid & (k >= 0))
    t.store(2, item, True, es)


# kernel name -> its trace; a kernel missing here has no model yet (predict refuses it).
def _generated_tile(t: _Tally, item: Tensor, launch: Launch) -> None:
    """involution_generated_tile (span_tile.cu): ``item`` is the thread's index in the grid
    (block-major, 256 threads a block). Per chunk of R: the feature and span chunks staged
    (global loads, shared stores), the span product from shared memory (FMAs, or fragment
    loads for tensor cores, whose pipe is not a term); the weights to shared memory; per chunk
    of 16 of the group's channels: the input window staged, then four sets of threads over the
    kernel rows, a thread's 4 pixels x 4 channels per tap from 4 weights (16-byte loads) and,
    sliding at strides 1 and 2, one new column of 4 values; the sets' partial sums through
    shared memory, then the stores. The layout's sizes are the source's and its host's."""
    from ..kernels.involution import cuda as involution_cuda

    (C, H, W, G, KH, KW, OH, OW, sh, sw, ph, pw, dh, dw, R, tiles_w,
     isn, isc, ish, isw, osn, osc, osh, osw, fsn, fsc, fsh, fsw, last) = launch.scalars
    source = involution_cuda.load_source(involution_cuda.SPAN_TILE_SOURCE)
    c = source.constants
    es = launch.dtype.itemsize
    acc = 8 if launch.dtype == torch.float64 else 4
    halves = es == 2
    per_word = 2 if halves else 1
    stride_words = involution_cuda.span_tile_stride(source, launch.dtype) // per_word
    chunk_words, sums_stride = c["SPAN_TILE_REDUCED"] // per_word, c["SPAN_TILE_SUMS_STRIDE"]
    word_bytes = 4 if halves else es
    taps, pg, threads = KH * KW, C // G, launch.threads_per_block
    in_h, in_w = involution_cuda.tile_input_size(source, (KH, KW), (sh, sw), (dh, dw))
    in_row, in_stride = in_w | 1, c["GEN_TILE_IN_STRIDE"]
    weights_at = involution_cuda.generated_tile_staging_bytes(source, launch.dtype, (KH, KW), (sh, sw), (dh, dw)) // acc
    block, thread = item // threads, item % threads
    lane, warp = thread % 32, thread // 32
    tile, group, n = block % launch.grid[0], (block // launch.grid[0]) % G, block // (launch.grid[0] * G)
    oy0, ox0 = tile // tiles_w * 8, tile % tiles_w * 8
    span_at = 64 * stride_words  # the span chunk, in words
    for half in range(2):  # the bias of each SpanTile's rows
        row = 32 * half + 4 * warp + _slots(4)
        t.load(3, group * taps + row, row < taps, es)
    for r0 in range(0, R, 16):
        for i0 in range(0, 64 * chunk_words, threads):
            i = thread + i0
            pixel, word = (i // chunk_words, i % chunk_words) if fsc == 1 and acc == 4 else (i % 64, i // 64)
            r = r0 + word * per_word
            y, x = oy0 + pixel // 8, ox0 + pixel % 8
            inside = (y < OH) & (x < OW)
            for h in range(per_word):
                t.load(1, n * fsn + (r + h) * fsc + y * fsh + x * fsw, inside & (r + h < R), es)
            t.shared(pixel * stride_words + word, True, word_bytes)
        for i0 in range(0, 64 * chunk_words, threads):
            i = thread + i0
            tap, word = i // chunk_words, i % chunk_words
            r = r0 + word * per_word
            for h in range(per_word):
                t.load(2, (group * taps + tap) * R + r + h, (tap < taps) & (r + h < R), es)
            t.shared(span_at + tap * stride_words + word, True, word_bytes)
        for half in range(2):
            if halves:  # ldmatrix: fragment A, and the B fragments of both column halves at once
                t.matrices(16 * (warp % 4) * stride_words + _fragment_a_rows(lane, stride_words), True, 4)
                b_at = span_at + (32 * half + 16 * (warp // 4)) * stride_words
                t.matrices(b_at + _fragment_b_rows(lane, stride_words, 8 * stride_words), True, 4)
            else:
                column, row = lane % 16, 4 * warp
                for r in range(0, 16, 2):
                    rr = r + lane // 16
                    t.shared((column + 16 * _slots(4)) * stride_words + rr, True, es)
                    t.shared(span_at + (32 * half + row + _slots(4)) * stride_words + rr, True, es)
                    t.fma(True, 16)
        # (the two barriers' waits are not a term)
    for half in range(2):  # the weights to shared memory
        if halves:
            group_row, quad = lane // 4, lane % 4
            rows = 32 * half + 16 * (warp // 4) + 8 * _slots(2, 4) + 2 * quad + _slots(2)
            t.shared(weights_at + rows * sums_stride + 16 * (warp % 4) + group_row + 8 * _slots(2, 5), True, 4)
        else:
            rows = 32 * half + 4 * warp + _slots(4, 4)
            t.shared(weights_at + rows * sums_stride + lane % 16 + 16 * _slots(4), lane < 16, acc)
    staged_values = (in_h * in_w + 7) // 8 * 8 * 16
    top, left = oy0 * sh - ph, ox0 * sw - pw
    # the aggregation's sets (a share of the kernel rows each) and a thread's 4 pixels x 4 channels
    thread_set, member = thread // 64, thread % 64
    first, run = member % 4, member // 4  # channels first, first + 4, ...
    py, px0 = run // 2, run % 2 * 4
    row_begin, row_end = thread_set * KH // 4, (thread_set + 1) * KH // 4
    partials_at = weights_at + 64 * sums_stride
    run_slots, channel_slots = _slots(4, 4), 4 * _slots(4)  # 4 x 4 slots: pixels, channel offsets
    sliding = acc == 4 and sw in (1, 2) and dw == 1
    for c0 in range(0, pg, 16):
        for i0 in range(0, staged_values, threads):
            i = thread + i0
            c = i % 16 if last else i % 4 + i // 32 % 4 * 4
            at = i // 16 if last else i // 4 % 8 + i // 128 * 8
            iy, ix = top + at // in_w, left + at % in_w
            inside = (c0 + c < pg) & (iy >= 0) & (iy < H) & (ix >= 0) & (ix < W)
            staged = (i < staged_values) & (at < in_h * in_w)
            t.load(0, n * isn + (group * pg + c0 + c) * isc + iy * ish + ix * isw, staged & inside, es)
            t.shared((at // in_w * in_row + at % in_w) * in_stride + c, staged, acc)
        for a in range(KH):
            mine = (a >= row_begin) & (a < row_end)
            row = (py * sh + a * dh) * in_row
            if sliding:  # the windows (one per tap b mod sw): 4 columns each, then one more every sw taps
                for q in range(min(sw, KW)):
                    t.shared((row + sw * (px0 + run_slots) + q) * in_stride + first + channel_slots, mine, acc)
            for b in range(KW):
                if sliding:
                    if b >= sw:
                        t.shared((row + sw * (px0 + 3) + b) * in_stride + first + channel_slots, mine, acc)
                else:
                    t.shared((row + (px0 + run_slots) * sw + b * dw) * in_stride + first + channel_slots, mine, acc)
                # the 4 weights by 16-byte loads (index in 16-byte units)
                run_at = (weights_at + (a * KW + b) * sums_stride + py * 8 + px0) * acc // 16
                t.shared(run_at + _slots(4 * acc // 16), mine, 16)
                t.fma(mine, 16)
        t.shared(partials_at + (thread_set * 16 + first + channel_slots) * 65 + py * 8 + px0 + run_slots, True, acc)
        for o0 in range(0, 64 * 16, threads):  # the sets' sums added and stored
            o = thread + o0
            c = o % 16 if last else o // 64
            pixel = o // 16 if last else o % 64
            y, x = oy0 + pixel // 8, ox0 + pixel % 8
            valid = (y < OH) & (x < OW) & (c0 + c < pg)
            for other in range(4):
                t.shared(partials_at + (other * 16 + c) * 65 + pixel, valid, acc)
            t.store(4, n * osn + (group * pg + c0 + c) * osc + y * osh + x * osw, valid, es)



def _mma_thread(item: Tensor, launch: Launch, groups: int, tiles_w: int):
    """generated_mma.cu's decoding of a thread: (thread, lane, warp, fragment row, quad, sample,
    group, the warp's row and its run's first column), 256 threads a block, a block a tile of
    8 rows x 16 columns of a (sample, group), a warp a row."""
    threads = launch.threads_per_block
    block, thread = item // threads, item % threads
    lane, warp = thread % 32, thread // 32
    tile, group, n = block % launch.grid[0], (block // launch.grid[0]) % groups, block // (launch.grid[0] * groups)
    return thread, lane, warp, lane // 4, lane % 4, n, group, tile // tiles_w * 8 + warp, tile % tiles_w * 16


def _mma_folded_thread(item: Tensor, launch: Launch, groups: int, tiles_w: int):
    """involution_generated_mma's decoding of a thread in folded runs: (thread, lane, warp,
    fragment row, quad, sample, group, the block's sample the warp takes, the warp's upper row
    in the tile, that row, its run's first column), a block two samples' tiles of 8 x 8 pixels
    (warps 0-3 the first's), a warp 8 columns of two rows."""
    thread, lane, warp, row, quad, pair, group, _, _ = _mma_thread(item, launch, groups, tiles_w)
    tile = item // launch.threads_per_block % launch.grid[0]
    half, tile_row = warp // 4, 2 * (warp % 4)
    return (thread, lane, warp, row, quad, 2 * pair + half, group, half, tile_row, tile // tiles_w * 8 + tile_row,
            tile % tiles_w * 8)


def _mma_staging(t: _Tally, thread: Tensor, threads: int, vector: bool, staged_at: int, rows: int, column_words: int,
                 stride: int, top, left, height: int, width: int, base, pg: int, c0: int, strides: tuple, es: int,
                 live=True) -> None:
    """generated_mma.cu's mma_stage_rows: a chunk of 16 channels from c0 of ``rows`` rows x
    2 ``column_words`` columns of tensor 0 (the input, or grad_output) from (top, left), zeros
    outside the height x width map; ``base`` its (sample, group)'s first channel's offset,
    ``strides`` its channel, row and column strides; shared words from ``staged_at``; where
    ``live`` is False (a folded block's second sample past the batch), nothing."""
    sc, sh_, sw_ = strides
    if not isinstance(live, Tensor) and not live:
        return
    if vector:  # two columns x 8 channels a unit: two 16-byte loads (index in 16-byte units), 8 word stores
        units = rows * column_words * 2
        unit = thread + threads * _slots(-(-units // threads))
        half, word, y = unit % 2, unit // 2 % column_words, unit // 2 // column_words
        iy, ix, ch = top + y, left + 2 * word, c0 + 8 * half
        rows_in = (unit < units) & (ch < pg) & (iy >= 0) & (iy < height) & live
        for h in range(2):
            x = ix + h
            t.load(0, (base + ch * sc + iy * sh_ + x * sw_) // 8, rows_in & (x >= 0) & (x < width), 16)
        t.shared(staged_at + (y * 16 + 8 * half + _slots(8, 4)) * stride + word, (unit < units) & live, 4)
        return
    row_words = 16 * column_words  # a word of two columns of a channel at a time, a thread down the rows
    if threads % row_words == 0:  # a pass covers whole rows: the flat order of the words
        words = rows * row_words
        i = thread + threads * _slots(-(-words // threads))
        word, ch, y = i % column_words, i // column_words % 16, i // column_words // 16
        inside_rows = i < words
    else:  # words thread and thread + threads of every row
        item = thread + threads * _slots(2, 4)
        word, ch, y = item % column_words, item // column_words, _slots(rows)
        inside_rows = (item < row_words) & (y < rows)
    live = live & inside_rows
    iy, ix = top + y, left + 2 * word
    row_in = live & (c0 + ch < pg) & (iy >= 0) & (iy < height)
    for h in range(2):
        x = ix + h
        t.load(0, base + (c0 + ch) * sc + iy * sh_ + x * sw_, row_in & (x >= 0) & (x < width), es)
    t.shared(staged_at + (y * 16 + ch) * stride + word, live, 4)


def _generated_mma(t: _Tally, item: Tensor, launch: Launch) -> None:
    """involution_generated_mma (generated_mma.cu): ``item`` is the thread's index in the grid
    (block-major, 256 threads a block, a warp an output row's run of 16 pixels, or folded 8
    columns of two rows, a block two samples' tiles, each sample's rows staged). Per chunk of R:
    the span chunk staged a k-step at a time (global loads, shared stores), the feature's A
    fragments from global memory (a pair one 32-bit load where the host says it is an aligned
    word) and the span's B fragments from shared memory (tensor cores: no term); the weights
    split hi and lo into shared memory, the bands' zeros; per chunk of 16 of the group's
    channels: the input rows staged (16-byte vectors and 8 word stores a unit, or a word of two
    values at a time), then per kernel row the band copies and per k-step the two bands' A
    fragments and the window's two B fragments; the stores. The layout's sizes are the
    source's and its host's."""
    from ..kernels.involution import cuda as involution_cuda

    (C, H, W, G, KH, KW, OH, OW, sh, sw, ph, pw, dh, dw, R, tiles_w,
     isn, isc, ish, isw, osn, osc, osh, osw, fsn, fsc, fsh, fsw, vector, feature_words, N) = launch.scalars
    folded = launch.specialisation[2] == "true"
    source = involution_cuda.load_source(involution_cuda.GENERATED_MMA_SOURCE)
    c = source.constants
    es, taps, pg = launch.dtype.itemsize, KH * KW, C // G
    k_steps = involution_cuda.generated_mma_band_steps(source, (KH, KW), (sh, sw), (dh, dw), folded)
    stride, column_words = 8 * k_steps + 4, 8 * k_steps
    tap_tiles = -(-taps // 8)
    plain_stride = 4 * tap_tiles + (0 if tap_tiles % 2 else 4)
    in_h = involution_cuda.generated_mma_staged_rows(source, OH, (KH, KW), (sh, sw), (dh, dw), folded)
    sample_words = in_h * 16 * stride
    span_stride, threads = c["MMA_SPAN_STRIDE"], launch.threads_per_block
    plain_at = max(c["MMA_TAPS"] * span_stride, (2 if folded else 1) * sample_words)  # words
    plain_words, band_words = 8 * 16 * plain_stride, 8 * 16 * stride
    if folded:
        thread, lane, warp, row, quad, n, group, half, tile_row, oy, ox0 = _mma_folded_thread(item, launch, G, tiles_w)
    else:
        thread, lane, warp, row, quad, n, group, oy, ox0 = _mma_thread(item, launch, G, tiles_w)
        half, tile_row = 0, warp
    first_sample = n - half
    inside = (oy < OH) & (n < N)
    # the lane's two pixels (fragment rows row, row + 8): folded, the second one row lower
    pixel_y = oy + (_slots(2, 4) if folded else 0)
    pixel_x = ox0 + row + (0 if folded else 8 * _slots(2, 4))
    mine_plain = plain_at + warp * 16 * plain_stride
    mine_band = plain_at + 2 * plain_words + warp * 16 * stride
    tap = 8 * _slots(8) + 2 * quad + _slots(2, 4)  # the bias, 2 a tap tile
    t.load(3, group * taps + tap, tap < taps, es)
    for r0 in range(0, R, c["MMA_REDUCED"]):
        for k0 in range(0, c["MMA_REDUCED"], 16):  # the span chunk a k-step at a time, 8 threads a tap's row
            if r0 + k0 >= R:
                break
            word = thread + threads * _slots(c["MMA_TAPS"] * 8 // threads)
            span_tap, column = word // 8, k0 // 2 + word % 8
            r = r0 + 2 * column
            for h in range(2):
                t.load(2, (group * taps + span_tap) * R + r + h, (span_tap < taps) & (r + h < R), es)
            t.shared(span_tap * span_stride + column, True, 4)
        for k0 in range(0, c["MMA_REDUCED"], 16):
            if r0 + k0 >= R:
                break
            rr = r0 + k0 + 2 * quad + 8 * _slots(2)
            feature_inside = inside & (pixel_x < OW) & (pixel_y < OH)
            if feature_words:  # a pair one 32-bit load (index in 32-bit units)
                t.load(1, (n * fsn + rr + pixel_y * fsh + pixel_x * fsw) // 2, feature_inside & (rr < R), 4)
            else:
                for h in range(2):
                    t.load(1, n * fsn + (rr + h) * fsc + pixel_y * fsh + pixel_x * fsw, feature_inside & (rr + h < R), es)
            pairs = _slots(-(-tap_tiles // 2))  # two tap tiles' B fragments an ldmatrix
            t.matrices(16 * pairs * span_stride + k0 // 2 + _fragment_b_rows(lane, span_stride, 8 * span_stride), inside, 4)
    pixels = row + 8 * _slots(2, 4)
    for plane in range(2):  # hi, lo
        t.shared(mine_plain + plane * plain_words + pixels * plain_stride + 4 * _slots(tap_tiles, 5) + quad, inside, 4)
        zeros = lane + 32 * _slots(-(-4 * stride // 32))  # 16 bytes a store (index in 16-byte units)
        t.shared((mine_band + plane * band_words) // 4 + zeros, inside & (zeros < 4 * stride), 16)
    copy = lane + 32 * _slots(c["MMA_BAND_COPIES"])
    j, b = copy // KW, copy % KW
    copies = inside & (copy < 16 * KW)
    top, left = oy // 8 * 8 * sh - ph, ox0 * sw - pw
    lower_rows = torch.where(oy + 1 < OH, sh * 16 * stride, 0) if folded else 0
    for c0 in range(0, pg, 16):
        for sample in range(2 if folded else 1):  # folded: the block's second sample where the batch has it
            _mma_staging(t, thread, threads, vector, sample * sample_words, in_h, column_words, stride, top, left, H, W,
                         (first_sample + sample) * isn + group * pg * isc, pg, c0, (isc, ish, isw), es,
                         live=first_sample + sample < N)
        for a in range(KH):
            for plane in range(2):  # the copies: a 16-bit load and store each (index in 16-bit units)
                t.shared(2 * (mine_plain + plane * plain_words) + 2 * j * plain_stride + a * KW + b, copies, 2)
                column = (j % 8 if folded else j) * sw + b * dw
                t.shared(2 * (mine_band + plane * band_words) + 2 * j * stride + column, copies, 2)
            rows = half * sample_words + (tile_row * sh + a * dh) * 16 * stride
            _band_products(t, lane, mine_band, band_words, rows, stride, k_steps, inside, paired_windows=True,
                           lower=rows + lower_rows if folded else None)
        channel = c0 + 8 * _slots(2, 4) + 2 * quad + _slots(2)
        for h in range(2):
            y, x = (oy + h, ox0 + row) if folded else (oy, ox0 + row + 8 * h)
            t.store(4, n * osn + (group * pg + channel) * osc + y * osh + x * osw,
                    inside & (x < OW) & (y < OH) & (channel < pg), es)


def _span_staging(t: "_Tally", thread: Tensor, threads: int, group, taps: int, R: int, span_rows: int,
                  span_words: int, span_stride: int, es: int, first_tap: int = 0) -> None:
    """generated_mma.cu's mma_stage_span_rows: the group's span rows from tap ``first_tap`` on
    into shared memory, the block's threads along the rows' units as one run, a thread's units
    ``threads`` apart; a unit 8 values (one 16-byte load and store) where R is a multiple of 8
    (the rows aligned, as a parameter's are), else a word (two 16-bit loads)."""
    unit_words = 4 if R % 8 == 0 else 1
    row_units = span_words // unit_words
    units = span_rows * row_units
    unit = thread + threads * _slots(-(-units // threads))
    live = unit < units
    row, column = unit // row_units, unit % row_units
    span_tap = first_tap + row
    r = 2 * unit_words * column
    if unit_words == 4:
        t.load(2, ((group * taps + span_tap) * R + r) // 8, live & (span_tap < taps) & (r < R), 16)
        t.shared((row * span_stride) // 4 + column, live, 16)
        return
    for h in range(2):
        t.load(2, (group * taps + span_tap) * R + r + h, live & (span_tap < taps) & (r + h < R), es)
    t.shared(row * span_stride + column, live, 4)


def _bias_staging(t: "_Tally", thread: Tensor, group, taps: int, span_rows: int, bias_at: int, es: int) -> None:
    """generated_mma.cu's mma_stage_span_bias: the group's bias in float from word ``bias_at``,
    a thread a tap, span_rows threads (zeros past the taps, nothing loaded)."""
    t.load(3, group * taps + thread, (thread < span_rows) & (thread < taps), es)
    t.shared(bias_at + thread, thread < span_rows, 4)

def _generated_mma_backward_input(t: _Tally, item: Tensor, launch: Launch) -> None:
    """involution_generated_mma_backward_input (generated_mma.cu): ``item`` is the thread's
    index in the grid (block-major, 256 threads a block, a warp a run of 16 pixels of a grad_input
    row). The group's span rows staged (global loads, shared stores) and the bands' zeros; per
    chunk of 16 of the group's channels: the grad_output rows staged (as the forward stages its
    input), then per output row in the map the block stages its feature at the band's pixels
    (a feature pair one 32-bit load where the host says it is an aligned word), and each warp
    whose input row reads that row: the bias, per k-step of R the span's B fragment and per band
    k-step the feature's A fragment, ldmatrix both (tensor cores: no term), the values' band
    stores (hi and lo, 16 bits each), and per k-step the two bands' A fragments and
    grad_output's two B fragments; the stores. The layout's sizes are the source's and its
    host's."""
    from ..kernels.involution import cuda as involution_cuda

    (C, H, W, G, KH, KW, OH, OW, sh, sw, ph, pw, dh, dw, R, tiles_w,
     gsn, gsc, gsh, gsw, isn, isc, ish, isw, fsn, fsc, fsh, fsw, vector, feature_words) = launch.scalars
    source = involution_cuda.load_source(involution_cuda.GENERATED_MMA_SOURCE)
    es, taps, pg = launch.dtype.itemsize, KH * KW, C // G
    rows_h, k_steps = involution_cuda.generated_mma_backward_extent(source, (KH, KW), (sh, sw), (dh, dw))
    stride, column_words = 8 * k_steps + 4, 8 * k_steps
    span_rows, span_words = (KH - 1) * KW + 8, 8 * -(-R // 16)
    span_stride, threads = span_words + 4, launch.threads_per_block
    staged_at = span_rows * span_stride  # words
    band_words = 8 * 16 * stride
    thread, lane, warp, row, quad, n, group, y, x0 = _mma_thread(item, launch, G, tiles_w)
    inside_row = y < H
    mine_band = staged_at + rows_h * 16 * stride + warp * 16 * stride
    features_at = staged_at + rows_h * 16 * stride + 2 * band_words
    first_row = (y - warp + ph - (KH - 1) * dh) // sh
    first_column = (x0 + pw - (KW - 1) * dw) // sw
    live_steps = ((OW - first_column + 15) // 16).clamp(0, k_steps)  # the k-steps with pixels of the map
    _span_staging(t, thread, threads, group, taps, R, span_rows, span_words, span_stride, es)
    for plane in range(2):
        zeros = lane + 32 * _slots(-(-4 * stride // 32))  # 16 bytes a store (index in 16-byte units)
        t.shared((mine_band + plane * band_words) // 4 + zeros, zeros < 4 * stride, 16)
    for c0 in range(0, pg, 16):
        _mma_staging(t, thread, threads, vector, staged_at, rows_h, column_words, stride, first_row, first_column, OH,
                     OW, n * gsn + group * pg * gsc, pg, c0, (gsc, gsh, gsw), es)
        for q in reversed(range(rows_h)):  # the output rows, the last first
            oy = first_row + q
            in_map = (oy >= 0) & (oy < OH)  # the same for the whole block
            # The row's feature at the band's 16 live_steps pixels, 256 / pixels threads a pixel
            # (a shift: 16 or 8) along its words (a 32-bit load each, index in 32-bit units)
            # where pairs are words, else along a word's pixels (two 16-bit loads a word); a word
            # store each. (Loaded a row ahead of its store: the same loads.)
            shift = torch.where(live_steps > 1, 3, 4)
            step = 1 << shift
            if feature_words:
                pixel, first_word = thread >> shift, thread & (step - 1)
            else:
                pixel, first_word = thread & (threads // step - 1), thread >> (8 - shift)
            word = first_word + step * _slots(-(-span_words // 8))
            staging = in_map & (word < span_words) & (live_steps > 0)
            o, rr = first_column + pixel, 2 * word
            inside = staging & (o >= 0) & (o < OW)
            _feature_pair_loads(t, n * fsn + oy * fsh + o * fsw, rr, inside, R, fsc, feature_words, es)
            t.shared(features_at + pixel * span_stride + word, staging, 4)
            to_a = y + ph - oy * sh
            a = to_a // dh
            reads = inside_row & in_map & (to_a >= 0) & (to_a == a * dh) & (a < KH)
            b = 2 * quad + _slots(2)
            t.load(3, group * taps + a * KW + b, reads & (b < KW), es)
            for k0 in range(0, R, 16):  # ldmatrix: the span's B fragment, the feature's A per band k-step
                t.matrices(a * KW * span_stride + k0 // 2 + _fragment_b_rows(lane, span_stride), reads, 2)
                for m in range(k_steps):
                    t.matrices(features_at + 16 * m * span_stride + k0 // 2 + _fragment_a_rows(lane, span_stride),
                               reads & (m < live_steps), 4)
            for m in range(k_steps):  # each value's band places, hi and lo (index in 16-bit units)
                k = 16 * m + row + 8 * _slots(2, 4)
                b = 2 * quad + _slots(2)
                j = (first_column + k) * sw - pw + b * dw - x0
                places = reads & (b < KW) & (j >= 0) & (j < 16) & (m < live_steps)
                for plane in range(2):
                    t.shared(2 * (mine_band + plane * band_words) + 2 * j * stride + k, places, 2)
            _band_products(t, lane, mine_band, band_words, staged_at + q * 16 * stride, stride, live_steps, reads,
                           paired_windows=False, most_steps=k_steps)
        channel = c0 + 8 * _slots(2, 4) + 2 * quad + _slots(2)
        for h in range(2):
            x = x0 + row + 8 * h
            t.store(4, n * isn + (group * pg + channel) * isc + y * ish + x * isw, inside_row & (x < W) & (channel < pg), es)


def _gen_grad_tile(item: Tensor, launch: Launch, narrow: bool) -> SimpleNamespace:
    """The generator kernel's block and warp places (generated_mma.cu's GenGradTile), both ways':
    the thread's lane parts, its block's tile (tile_y, ox0), R range (r0), split of the groups
    (split: group_first to group_end), sample (n) and partial sums' slot; its warp's output row (oy), the
    n-tiles of a run's products it forms (formed_tiles), the fragment rows' pixels (inside the map
    where ``inside``) and grad_feature's m-tile (m_pixel, m_y, r_half)."""
    from ..kernels.involution import cuda as involution_cuda

    splits, G, KH, KW, OH, OW, sh, sw, dh, dw, tiles_w = (launch.scalars[i] for i in (0, 4, 5, 6, 7, 8, 9, 10, 13, 14, 16))
    source = involution_cuda.load_source(involution_cuda.GENERATED_MMA_SOURCE)
    tile_w, span_r = involution_cuda.generated_mma_generator_tile(source, narrow)
    threads = launch.threads_per_block
    block, thread = item // threads, item % threads
    warp, lane = thread // 32, thread % 32
    tile, y_block = block % launch.grid[0], block // launch.grid[0] % launch.grid[1]
    r_range, split = y_block // splits, y_block % splits
    n = block // (launch.grid[0] * launch.grid[1])
    tile_y, ox0 = tile // tiles_w, tile % tiles_w * tile_w
    # The n-tiles a run forms and stores: where the instantiation fixes the window (KERNEL > 0),
    # every one of its band (unrolled; those past the live ones hold taps of pixels past the map
    # only); where it reads the window from the arguments, the live ones (a tap of a pixel inside
    # the map). The 16-bit way's narrow tile at stride 2 keeps the live ones before sm_90
    # (GenGradUnrolled), where at RedNet-50's 7 x 7 maps every n-tile of it is live.
    if launch.specialisation[0] != "0":
        formed_tiles = involution_cuda.generated_mma_generator_extent(source, (KH, KW), (sh, sw), (dh, dw), narrow)[1] // 8
    else:
        live_w = (OW - ox0).clamp(max=tile_w)
        formed_tiles = ((live_w - 1) * sw + (KW - 1) * dw) // 8 + 1
    pixels = lane // 4 + 8 * _slots(2, 4)  # a fragment's two rows of pixels
    oy = tile_y * 8 + warp
    return SimpleNamespace(
        thread=thread, warp=warp, lane=lane, row=lane // 4, quad=lane % 4, r_range=r_range, r0=r_range * span_r,
        split=split, group_first=split * G // splits, group_end=(split + 1) * G // splits, n=n, slot=tile + launch.grid[0] * n,
        tile_y=tile_y, ox0=ox0, oy=oy, formed_tiles=formed_tiles, pixels=pixels,
        inside=(oy < OH) & (ox0 + pixels < OW) & (pixels < tile_w),
        # grad_feature's m-tile of the warp: 16 pixels from m_pixel (narrow: rows m_y, m_y + 1), and
        # its channels of the range from r_half
        m_pixel=16 * (warp % 4) if narrow else 16 * warp, m_y=tile_y * 8 + 2 * (warp % 4) if narrow else oy,
        r_half=source.constants["GEN_GRAD_R"] * (warp // 4) if narrow else 0)


def _gen_grad_store_product(t: _Tally, place: SimpleNamespace, warp_at, gw_stride: int, a: int, n_tile: int,
                            launch: Launch, tile_w: int, live, first: bool) -> None:
    """A run's product into the warp's gw rows (generated_mma.cu's gen_grad_store_product): the
    band's elements, a word store each (and a load before it from the second chunk on)."""
    KW, sw, dw = (launch.scalars[i] for i in (6, 10, 14))
    for v in range(4):
        j = place.row + 8 * (v >> 1)
        offset = 8 * n_tile + 2 * place.quad + (v & 1) - j * sw
        b = offset // dw
        on_band = (offset >= 0) & (offset == b * dw) & (b < KW) & (j < tile_w)
        at = warp_at + j * gw_stride + a * KW + b
        if not first:
            t.shared(at, on_band & live, 4)
        t.shared(at, on_band & live, 4)


def _gen_grad_span_loads(t: _Tally, place: SimpleNamespace, group, launch: Launch, span_r: int, tap_pad: int):
    """A group's span rows of the block's R range, a pair of taps a thread, consecutive threads
    along r: the two loads; (r, tap, the threads that stage) for the store."""
    taps, R, es = launch.scalars[5] * launch.scalars[6], launch.scalars[15], launch.dtype.itemsize
    e = place.thread + launch.threads_per_block * _slots(-(-span_r * tap_pad // 2 // launch.threads_per_block))
    staging = e < span_r * tap_pad // 2
    r, tap = e % span_r, 2 * (e // span_r)
    for h in range(2):
        t.load(3, (group * taps + tap + h) * R + place.r0 + r, staging & (place.r0 + r < R) & (tap + h < taps), es)
    return r, tap, staging


def _gen_grad_bias_total(t: _Tally, place: SimpleNamespace, staged_at: int, taps: int, G: int, group) -> None:
    """grad_span_bias's sums over the tile (R range 0's blocks): the warps' parts added up, stored."""
    sums = (place.r_range == 0) & (place.thread < taps)
    for part in range(8):
        t.shared(staged_at + part * 64 + place.thread, sums, 4)
    t.fma(sums, 7)
    t.store(7, (place.slot * G + group) * taps + place.thread, sums, 4)


def _generated_mma_backward_generator(t: _Tally, item: Tensor, launch: Launch) -> None:
    """involution_generated_mma_backward_generator (generated_mma.cu): ``item`` is the thread's
    index in the grid (block-major, 256 threads a block, a block a tile of 8 rows x 16 columns of
    a sample and a range of GEN_GRAD_R of R, or narrow 8 columns and twice the range, and a
    split of the groups; a warp a row's run). The tile's feature staged ([r][pixel pair]); per
    group: its span rows staged ([r][tap pair]); per
    chunk of 16 of its channels the input rows staged ([row][column][channel pair]: 16-byte
    vectors and 4 word stores a unit, or a word of two channels at a time), grad_output's A
    fragment from global memory, per kernel row and n-tile the input's B fragment and the band's
    gw stores (a load and a store from the second chunk on; none in a warp whose row is past the
    map, nor, in a window read from the arguments, past the n-tiles of the band with a tap of a
    pixel inside it: a fixed window's instantiation forms and stores them all); each warp's split of
    its rows (the floats' loads, the hi and lo words' stores, the bias's adds as multiply-adds)
    and, in R range 0, its bias sums' store; then grad_feature's products (gw's hi and lo A
    fragments of the warp's m-tile and the span's B fragments by ldmatrix, none past the map),
    the block's grad_span_weight tiles (gw's transposed A fragments and the feature's B
    fragments over the tile's rows inside the map, the partial sums' stores) and, in R range 0,
    grad_span_bias's sum of the warps' sums; at the end grad_feature's stores (in float to the
    split's part where the groups are split).
    Tensor cores: no term. The layout's sizes are the source's and its host's. float32 is its
    own way (``_generated_mma_backward_generator_wide``)."""
    from ..kernels.involution import cuda as involution_cuda

    if launch.dtype == torch.float32:
        _generated_mma_backward_generator_wide(t, item, launch)
        return
    (splits, C, H, W, G, KH, KW, OH, OW, sh, sw, ph, pw, dh, dw, R, tiles_w, gsn, gsc, gsh, gsw, isn, isc, ish, isw,
     fsn, fsc, fsh, fsw, rsn, rsc, rsh, rsw, vector, grad_words) = launch.scalars
    source = involution_cuda.load_source(involution_cuda.GENERATED_MMA_SOURCE)
    c = source.constants
    es, taps, pg, threads = launch.dtype.itemsize, KH * KW, C // G, launch.threads_per_block
    narrow = launch.specialisation[2] == "true"  # tiles 8 wide, twice the R range
    tile_w, span_r = involution_cuda.generated_mma_generator_tile(source, narrow)
    in_h, columns = involution_cuda.generated_mma_generator_extent(source, (KH, KW), (sh, sw), (dh, dw), narrow)
    n_tiles, pixel_words, column_words = columns // 8, 8 * tile_w // 2 + 4, c["GEN_GRAD_COLUMN_WORDS"]
    span_tiles = 4 if narrow else 2  # grad_span_weight's n-tiles a warp
    tap_pad = 16 * -(-taps // 16)
    span_stride, gw_stride = tap_pad // 2 + 4, tap_pad + 4
    features_at = span_r * span_stride
    staged_at = features_at + span_r * pixel_words
    gw_at = staged_at + in_h * columns * column_words
    place = _gen_grad_tile(item, launch, narrow)
    thread, warp, lane, row, quad, n = place.thread, place.warp, place.lane, place.row, place.quad, place.n
    tile_y, ox0, oy, r0, r_range, slot = place.tile_y, place.ox0, place.oy, place.r0, place.r_range, place.slot
    word = thread + threads * _slots(span_r * (pixel_words - 4) // threads)
    r, pair = word // (pixel_words - 4), word % (pixel_words - 4)
    y, x = tile_y * 8 + pair // (tile_w // 2), ox0 + 2 * (pair % (tile_w // 2))
    for h in range(2):
        t.load(2, n * fsn + (r0 + r) * fsc + y * fsh + (x + h) * fsw, (r0 + r < R) & (y < OH) & (x + h < OW), es)
    t.shared(features_at + r * pixel_words + pair, True, 4)
    top, left = tile_y * 8 * sh - ph, ox0 * sw - pw
    formed_tiles, pixels, inside = place.formed_tiles, place.pixels, place.inside
    m_pixel, m_y, r_half = place.m_pixel, place.m_y, place.r_half
    everywhere = t.active
    for index in range(-(-G // splits)):  # the block's groups, the most any split takes
        group = place.group_first + index
        t.active = everywhere & (group < place.group_end)
        r, tap, staging = _gen_grad_span_loads(t, place, group, launch, span_r, tap_pad)
        t.shared(r * span_stride + tap // 2, staging, 4)
        for c0 in range(0, pg, 16):
            base = n * isn + (group * pg + c0) * isc
            if vector:  # 8 channels a 16-byte load (index in 16-byte units), 4 word stores
                units = in_h * columns * 2
                unit = thread + threads * _slots(-(-units // threads))
                half, column, yy = unit % 2, unit // 2 % columns, unit // 2 // columns
                iy, ix = top + yy, left + column
                t.load(1, (base + 8 * half * isc + iy * ish + ix * isw) // 8,
                       (unit < units) & (c0 + 8 * half < pg) & (iy >= 0) & (iy < H) & (ix >= 0) & (ix < W), 16)
                t.shared(staged_at + (yy * columns + column) * column_words + ((4 * half) ^ (column & 4)) + _slots(4, 4),
                         unit < units, 4)
            else:  # a word of two channels at a time, consecutive threads along a row's columns
                units = in_h * columns * 8
                unit = thread + threads * _slots(-(-units // threads))
                column, channel_pair, yy = unit % columns, unit // columns % 8, unit // columns // 8
                iy, ix = top + yy, left + column
                at = (unit < units) & (iy >= 0) & (iy < H) & (ix >= 0) & (ix < W)
                for h in range(2):
                    t.load(1, base + (2 * channel_pair + h) * isc + iy * ish + ix * isw, at & (c0 + 2 * channel_pair + h < pg), es)
                t.shared(staged_at + (yy * columns + column) * column_words + (channel_pair ^ (column & 4)), unit < units, 4)
            channel = c0 + 2 * quad + 8 * _slots(2)  # grad_output's A fragment: pixels x channel pairs
            grad = n * gsn + (group * pg + channel) * gsc + oy * gsh + (ox0 + pixels) * gsw
            if grad_words:  # a pair a 32-bit load (index in 32-bit units)
                t.load(0, grad // 2, inside & (channel < pg), 4)
            else:
                for h in range(2):
                    t.load(0, grad + h * gsc, inside & (channel + h < pg), es)
            for a in range(KH):
                input_row = staged_at + (warp * sh + a * dh) * columns * column_words
                for n_tile in range(n_tiles):
                    live = (oy < OH) & (n_tile < formed_tiles)
                    column = 8 * n_tile + lane % 8  # an ldmatrix row: its words' halves swapped in columns 4-7
                    t.matrices(input_row + column * column_words + ((4 * (lane // 8 % 2)) ^ (column & 4)), live, 2)
                    _gen_grad_store_product(t, place, gw_at + warp * tile_w * gw_stride, gw_stride, a, n_tile, launch,
                                            tile_w, live, c0 == 0)
        # the warp splits its rows in place: a lane 4 taps (16 bytes) of every other row, those
        # of pixels inside the map, its hi and lo words 8 bytes each; the bias's adds
        lane_taps = 4 * (lane % 16)
        for step in range(tile_w // 2):
            j = lane // 16 + 2 * step
            row_at = gw_at + (warp * tile_w + j) * gw_stride
            t.shared((row_at + lane_taps) // 4, (oy < OH) & (ox0 + j < OW) & (lane_taps < tap_pad), 16)
            t.fma(True, 4)
            for plane in range(2):
                t.shared((row_at + plane * tap_pad // 2 + lane_taps // 2) // 2, lane_taps < tap_pad, 8)
        t.shared((staged_at + warp * 64 + lane_taps) // 4, (r_range == 0) & (lane < 16) & (lane_taps < tap_pad), 16)
        warp_at = gw_at + m_pixel * gw_stride
        for k0 in range(0, tap_pad, 16):  # grad_feature: gw's hi and lo A fragments, the span's B
            for plane in range(2):
                t.matrices(warp_at + plane * tap_pad // 2 + k0 // 2 + _fragment_a_rows(lane, gw_stride), m_y < OH, 4)
            for n_tile in range(c["GEN_GRAD_R"] // 8):
                t.matrices((r_half + 8 * n_tile) * span_stride + k0 // 2 + _fragment_b_rows(lane, span_stride), m_y < OH, 2)
        mine = span_tiles * warp < tap_pad // 16 * (span_r // 8)  # one m-tile, span_tiles n-tiles a warp
        m0, first_n_tile = 16 * (span_tiles * warp // (span_r // 8)), span_tiles * warp % (span_r // 8)
        n_tile = first_n_tile + _slots(span_tiles, 4)
        live_pixels = tile_w * (OH - tile_y * 8).clamp(max=8)  # k-steps of 16, those with pixels inside the map
        for step in range(8 * tile_w // 16):
            p0 = 16 * step
            transposed = (lane % 8 + 8 * (lane // 16)) * gw_stride + 4 * (lane // 8 % 2)
            for plane in range(2):
                t.matrices(gw_at + p0 * gw_stride + plane * tap_pad // 2 + m0 // 2 + transposed, mine & (p0 < live_pixels), 4)
            for pair_of_tiles in range(span_tiles // 2):
                t.matrices(features_at + 8 * (first_n_tile + 2 * pair_of_tiles) * pixel_words + p0 // 2
                           + _fragment_b_rows(lane, pixel_words, 8 * pixel_words), mine & (p0 < live_pixels), 4)
        for v in range(4):
            tap, r = m0 + row + 8 * (v >> 1), r0 + 8 * n_tile + 2 * quad + (v & 1)
            t.store(6, ((slot * G + group) * taps + tap) * R + r, mine & (tap < taps) & (r < R), 4)
        _gen_grad_bias_total(t, place, staged_at, taps, G, group)
    t.active = everywhere
    channel = r0 + r_half + 8 * _slots(4, 4) + 2 * quad
    # a fragment's rows 8-15: pixels 8-15 of the warp's row, or narrow the next row's 0-7
    rows_at = [(m_y, ox0 + row), (m_y + 1, ox0 + row) if narrow else (m_y, ox0 + row + 8)]
    if splits > 1:  # floats to the split's part, [split][n][y][x][r]
        for yy, xx in rows_at:
            for e in range(2):
                t.store(5, (((place.split * launch.grid[2] + n) * OH + yy) * OW + xx) * R + channel + e,
                        (m_y < OH) & (yy < OH) & (xx < OW) & (channel + e < R), 4)
        return
    pair_stores = rsc == 1 and (rsn | rsh | rsw | R) % 2 == 0
    for yy, xx in rows_at:
        at = n * rsn + yy * rsh + xx * rsw
        stores = (m_y < OH) & (yy < OH) & (xx < OW)
        if pair_stores:  # a 32-bit store (index in 32-bit units)
            t.store(4, (at + channel) // 2, stores & (channel + 1 < R), 4)
        else:
            for e in range(2):
                t.store(4, at + (channel + e) * rsc, stores & (channel + e < R), es)


def _generated_mma_backward_generator_wide(t: _Tally, item: Tensor, launch: Launch) -> None:
    """involution_generated_mma_backward_generator's float32 way (generated_mma.cu's
    generator_wide): the bfloat16 trace's tiles, grid and groups, with the tile's feature staged
    a float at a time ([r][pixel]); per group its span rows (a pair of taps' floats, an 8-byte
    store); per k-step of 8 of its channels the input rows (a unit of 4 channels: a 16-byte
    load, or 4 loads, and a 16-byte store), grad_output's A fragment (a pair an 8-byte load, or
    two), per kernel row and n-tile the input's B fragment (an 8-byte shared load), three TF32
    products and the band's gw stores (every n-tile of the band in a fixed window's
    instantiation, the live ones in the one that reads the window from the arguments); each
    warp's pass over its rows (a 16-byte load and store a lane and row, the bias's adds);
    grad_feature's products (per k-step of 8 taps, gw's A fragment in two 8-byte loads and per
    n-tile the span's B in one, three TF32 products); the block's grad_span_weight tiles, two
    n-tiles at a time (per k-step of 8 pixels inside the map gw's two 8-byte loads, its rows
    paired, the feature's B fragments of both by ldmatrix, three TF32 products an n-tile);
    grad_span_bias's sum of the warps' sums; at the end grad_feature's float stores. Tensor
    cores: their term (TF32, half the BF16 rate)."""
    from ..kernels.involution import cuda as involution_cuda

    (splits, C, H, W, G, KH, KW, OH, OW, sh, sw, ph, pw, dh, dw, R, tiles_w, gsn, gsc, gsh, gsw, isn, isc, ish, isw,
     fsn, fsc, fsh, fsw, rsn, rsc, rsh, rsw, vector, grad_words) = launch.scalars
    source = involution_cuda.load_source(involution_cuda.GENERATED_MMA_SOURCE)
    c = source.constants
    taps, pg, threads, CH = KH * KW, C // G, launch.threads_per_block, c["GEN_GRAD_WIDE_CHANNELS"]
    narrow = launch.specialisation[2] == "true"  # tiles 8 wide, twice the R range
    tile_w, span_r = involution_cuda.generated_mma_generator_tile(source, narrow)
    in_h, columns = involution_cuda.generated_mma_generator_extent(source, (KH, KW), (sh, sw), (dh, dw), narrow)
    n_tiles, tile_pixels = columns // 8, 8 * tile_w
    span_tiles = 4 if narrow else 2  # grad_span_weight's n-tiles a warp
    tap_pad = 16 * -(-taps // 16)
    tap_stride, feature_stride = tap_pad + c["GEN_GRAD_WIDE_PAD"], tile_pixels + 4
    features_at = span_r * tap_stride  # (floats)
    staged_at = features_at + span_r * feature_stride
    gw_at = staged_at + in_h * columns * CH
    place = _gen_grad_tile(item, launch, narrow)
    thread, warp, lane, row, quad, n = place.thread, place.warp, place.lane, place.row, place.quad, place.n
    tile_y, ox0, oy, r0, r_range, slot = place.tile_y, place.ox0, place.oy, place.r0, place.r_range, place.slot
    e = thread + threads * _slots(span_r * tile_pixels // threads)
    r, p = e // tile_pixels, e % tile_pixels
    y, x = tile_y * 8 + p // tile_w, ox0 + p % tile_w
    t.load(2, n * fsn + (r0 + r) * fsc + y * fsh + x * fsw, (r0 + r < R) & (y < OH) & (x < OW), 4)
    t.shared(features_at + r * feature_stride + p, True, 4)
    top, left = tile_y * 8 * sh - ph, ox0 * sw - pw
    formed_tiles, pixels, inside = place.formed_tiles, place.pixels, place.inside
    m_pixel, m_y, r_half = place.m_pixel, place.m_y, place.r_half
    everywhere = t.active
    for index in range(-(-G // splits)):  # the block's groups, the most any split takes
        group = place.group_first + index
        t.active = everywhere & (group < place.group_end)
        r, tap, staging = _gen_grad_span_loads(t, place, group, launch, span_r, tap_pad)
        t.shared((r * tap_stride + tap) // 2, staging, 8)
        for c0 in range(0, pg, CH):
            base = n * isn + (group * pg + c0) * isc
            units = in_h * columns * 2
            unit = thread + threads * _slots(-(-units // threads))
            if vector:  # a unit of 4 channels one 16-byte load (index in 16-byte units)
                half, column, yy = unit % 2, unit // 2 % columns, unit // 2 // columns
            else:  # 4 loads, consecutive threads along a row's columns
                column, half, yy = unit % columns, unit // columns % 2, unit // columns // 2
            iy, ix = top + yy, left + column
            at = (unit < units) & (iy >= 0) & (iy < H) & (ix >= 0) & (ix < W)
            if vector:
                t.load(1, (base + 4 * half * isc + iy * ish + ix * isw) // 4, at & (c0 + 4 * half < pg), 16)
            else:
                for m in range(4):
                    t.load(1, base + (4 * half + m) * isc + iy * ish + ix * isw, at & (c0 + 4 * half + m < pg), 4)
            t.shared((staged_at + (yy * columns + column) * CH + 4 * half) // 4, unit < units, 16)
            channel = c0 + 2 * quad  # grad_output's A fragment: pixels x a channel pair
            grad = n * gsn + (group * pg + channel) * gsc + oy * gsh + (ox0 + pixels) * gsw
            if grad_words:  # a pair one 8-byte load (index in 8-byte units)
                t.load(0, grad // 2, inside & (channel < pg), 8)
            else:
                for h in range(2):
                    t.load(0, grad + h * gsc, inside & (channel + h < pg), 4)
            for a in range(KH):
                input_row = staged_at + (warp * sh + a * dh) * columns * CH
                for n_tile in range(n_tiles):
                    live = (oy < OH) & (n_tile < formed_tiles)
                    t.shared((input_row + (8 * n_tile + row) * CH + 2 * quad) // 2, live, 8)
                    t.tf32_products(live, 3)
                    _gen_grad_store_product(t, place, gw_at + warp * tile_w * tap_stride, tap_stride, a, n_tile, launch,
                                            tile_w, live, c0 == 0)
        # the warp's pass over its rows: a lane 4 taps (16 bytes) of every other row, loaded and
        # stored; the bias's adds
        lane_taps = 4 * (lane % 16)
        for step in range(tile_w // 2):
            j = lane // 16 + 2 * step
            row_at = gw_at + (warp * tile_w + j) * tap_stride
            t.shared((row_at + lane_taps) // 4, lane_taps < tap_pad, 16)
            t.fma(lane_taps < tap_pad, 4)
            t.shared((row_at + lane_taps) // 4, lane_taps < tap_pad, 16)
        t.shared((staged_at + warp * 64 + lane_taps) // 4, (r_range == 0) & (lane < 16) & (lane_taps < tap_pad), 16)
        warp_at = gw_at + m_pixel * tap_stride
        for k0 in range(0, tap_pad, 8):  # grad_feature: gw's A fragment, the span's B, per n-tile
            for h in range(2):
                t.shared((warp_at + (row + 8 * h) * tap_stride + k0 + 2 * quad) // 2, m_y < OH, 8)
            for n_tile in range(c["GEN_GRAD_R"] // 8):
                t.shared(((r_half + 8 * n_tile + row) * tap_stride + k0 + 2 * quad) // 2, m_y < OH, 8)
                t.tf32_products(m_y < OH, 3)
        mine = span_tiles * warp < tap_pad // 16 * (span_r // 8)  # one m-tile, span_tiles n-tiles a warp
        m0, first_n_tile = 16 * (span_tiles * warp // (span_r // 8)), span_tiles * warp % (span_r // 8)
        live_pixels = tile_w * (OH - tile_y * 8).clamp(max=8)  # k-steps of 8, those with pixels inside the map
        for u0 in range(0, span_tiles, 2):
            for step in range(tile_pixels // 8):
                p0, live = 8 * step, mine & (8 * step < live_pixels)
                for h in range(2):  # gw transposed, its rows paired: pixels p0 + quad (+ 4), taps m0 + 2 row, + 1
                    t.shared((gw_at + (p0 + quad + 4 * h) * tap_stride + m0 + 2 * row) // 2, live, 8)
                feature_row = 8 * (first_n_tile + u0) + lane % 8 + 8 * (lane // 16)  # an ldmatrix row
                t.matrices(features_at + feature_row * feature_stride + p0 + 4 * (lane // 8 % 2), live, 4)
                t.tf32_products(live, 3 * 2)
            n_tile = first_n_tile + u0 + _slots(2, 4)
            for v in range(4):
                tap, r = m0 + 2 * row + (v >> 1), r0 + 8 * n_tile + 2 * quad + (v & 1)
                t.store(6, ((slot * G + group) * taps + tap) * R + r, mine & (tap < taps) & (r < R), 4)
        _gen_grad_bias_total(t, place, staged_at, taps, G, group)
    t.active = everywhere
    channel = r0 + r_half + 8 * _slots(4, 4) + 2 * quad
    rows_at = [(m_y, ox0 + row), (m_y + 1, ox0 + row) if narrow else (m_y, ox0 + row + 8)]
    for yy, xx in rows_at:
        for e in range(2):
            if splits > 1:  # to the split's part, [split][n][y][x][r]
                at, tensor = (((place.split * launch.grid[2] + n) * OH + yy) * OW + xx) * R + channel + e, 5
            else:
                at, tensor = n * rsn + yy * rsh + xx * rsw + (channel + e) * rsc, 4
            t.store(tensor, at, (m_y < OH) & (yy < OH) & (xx < OW) & (channel + e < R), 4)

def _vectors_item(launch: Launch, item: Tensor, columns: int, rows: int, parts: Optional[int] = None):
    """``decode_vector_item`` of involution_vectors.cu over rows of ``columns`` pixels, with the
    kernel's pixels a lane and channels a thread read from its source, as the host reads them
    (the forward's WIDE instantiations, its third argument, twice as many): (pixels, channels,
    vector s, row, part k, group g, sample n) of each work item. ``parts``: kernel rows, or by
    default the chunks of a group's channels."""
    from ..kernels.cuda_source import load_source
    from ..kernels.involution import cuda as involution_cuda

    source = load_source(launch.source)
    P = involution_cuda.vectors_pixels(source, launch.dtype)
    wide = launch.kernel == "involution_forward_vectors" and launch.specialisation[2] == "true"
    chunk = involution_cuda.vectors_channels(source, launch.dtype, launch.kernel == "involution_backward_input_vectors",
                                             wide)
    C, G = launch.scalars[1], launch.scalars[4]
    parts = parts or C // G // chunk
    s, rest = item % (columns // P), item // (columns // P)
    row, rest = rest % rows, rest // rows
    k, rest = rest % parts, rest // parts
    return P, chunk, s, row, k, rest % G, rest // G


def _forward_vectors(t: _Tally, item: Tensor, launch: Launch) -> None:
    """involution_forward_vectors (involution_vectors.cu): per kernel row inside the image, the
    row's K weight vectors, then per channel of the thread's the window's aligned vectors inside
    the row and K x PIXELS multiply-adds; a vector store per channel. A vector load or store is
    traced by its first element (aligned, so within one line)."""
    _, C, H, W, G, OH, OW, ph = launch.scalars
    K, S = int(launch.specialisation[0]), int(launch.specialisation[1])
    es = launch.dtype.itemsize
    P, chunk, s, i, k, g, n = _vectors_item(launch, item, OW, OH)
    offset, span = (-(K // 2)) % P, (P - 1) * S + K
    loads, plane, pg = -(-(offset + span) // P), OH * OW, C // G
    c0, j0 = g * pg + k * chunk, s * P
    y0, x_aligned = i * S - ph, j0 * S - K // 2 - offset
    kernel = (n * G + g) * K * K * plane + i * OW + j0
    c, v = _slots(chunk, 4), _slots(loads, 3)
    for a in range(K):
        y = y0 + a
        row_ok = (y >= 0) & (y < H)
        t.load(1, kernel + (a * K + _slots(K)) * plane, row_ok, es)
        x = x_aligned + v * P
        t.load(0, ((n * C + c0 + c) * H + y) * W + x, row_ok & (x >= 0) & (x < W) & (c >= 0), es)
        t.fma(row_ok & (_slots(chunk) >= 0), K * P)
    t.store(2, (n * C + c0 + _slots(chunk)) * plane + i * OW + j0, True, es)


def _backward_input_vectors(t: _Tally, item: Tensor, launch: Launch) -> None:
    """involution_backward_input_vectors (involution_vectors.cu, stride 1): per kernel row that
    reaches an output row, each tap's weight vectors (one where the tap's columns are aligned,
    else two; those outside the row not loaded), then per channel of the thread's the window's
    aligned grad_output vectors inside the row and K x PIXELS multiply-adds; a vector store per
    channel. Vectors traced by their first element."""
    _, C, H, W, G, OH, ph = launch.scalars
    K = int(launch.specialisation[0])
    es = launch.dtype.itemsize
    P, chunk, s, y, k, g, n = _vectors_item(launch, item, W, H)
    offset = (K // 2 - (K - 1)) % P
    loads, plane, pg = -(-(offset + K + P - 1) // P), OH * W, C // G
    c0, x0 = g * pg + k * chunk, s * P
    j_aligned = x0 + K // 2 - (K - 1) - offset
    c, v = _slots(chunk, 4), _slots(loads, 3)
    for a in range(K):
        i = y + ph - a
        row_ok = (i >= 0) & (i < OH)
        for b in range(K):
            first = offset + K - 1 - b
            for h in range(1 if first % P == 0 else 2):
                j = j_aligned + (first // P + h) * P
                t.load(1, ((n * G + g) * K * K + a * K + b) * plane + i * W + j, row_ok & (j >= 0) & (j < W), es)
        j = j_aligned + v * P
        t.load(0, ((n * C + c0 + c) * OH + i) * W + j, row_ok & (j >= 0) & (j < W) & (c >= 0), es)
        t.fma(row_ok & (_slots(chunk) >= 0), K * P)
    t.store(2, (n * C + c0 + _slots(chunk)) * H * W + y * W + x0, True, es)


def _backward_weight_vectors(t: _Tally, item: Tensor, launch: Launch) -> None:
    """involution_backward_weight_vectors (involution_vectors.cu): for a kernel row inside the
    image, per channel of the group a grad_output vector, the window's aligned input vectors
    inside the row and K x PIXELS multiply-adds; K vector stores. Vectors traced by their first
    element."""
    _, C, H, W, G, OH, OW, ph = launch.scalars
    K, S = int(launch.specialisation[0]), int(launch.specialisation[1])
    es = launch.dtype.itemsize
    P, _, s, i, a, g, n = _vectors_item(launch, item, OW, OH, K)
    offset, span = (-(K // 2)) % P, (P - 1) * S + K
    loads, plane, pg = -(-(offset + span) // P), OH * OW, C // G
    j0, y = s * P, i * S - ph + a
    x_aligned = j0 * S - K // 2 - offset
    row_ok = (y >= 0) & (y < H)
    c, v = _slots(pg, 4), _slots(loads, 3)
    c0 = n * C + g * pg
    t.load(0, (c0 + _slots(pg)) * plane + i * OW + j0, row_ok, es)
    x = x_aligned + v * P
    t.load(1, ((c0 + c) * H + y) * W + x, row_ok & (x >= 0) & (x < W) & (c >= 0), es)
    t.fma(row_ok & (_slots(pg) >= 0), K * P)
    t.store(2, ((n * G + g) * K * K + a * K + _slots(K)) * plane + i * OW + j0, True, es)


def _pair_item(item: Tensor, launch: Launch):
    """``LastLaunch::pair_item`` of involution_last.cu: (K, S, the pixels P a lane takes, element
    bytes, lanes, parts, n, i, j, the first pixel, the vector's first channel c0, the first
    pixel's record, whether a second pixel lies in the row, and the warp's runs of records,
    ``_pair_runs``) of each work item."""
    total, C, H, W, G, OH, OW, ph, pw = launch.scalars
    K, S, P = (int(v) for v in launch.specialisation[:3])
    es = launch.dtype.itemsize
    lanes = 16 // es
    parts = C // G // lanes
    pairs = -(-OW // P)
    unit = item // parts
    g, run = unit % G, unit // G
    j, i, n = run % pairs * P, (run // pairs) % OH, run // (pairs * OH)
    pixel = (n * OH + i) * OW + j
    runs = _pair_runs(item - torch.arange(32), total, parts, G, OW, P)
    return (K, S, P, es, lanes, parts, n, i, j, pixel, g * (C // G) + item % parts * lanes, pixel * G + g,
            (j + 1 < OW) & (P == 2), runs)


def _copy_runs(t: _Tally, tensor: int, runs: list[tuple[Tensor, Tensor]], K: int, P: int, parts: int, es: int,
               lanes: int, to_global: bool) -> None:
    """The warp's runs of records (``_pair_runs``; P pixels a lane) copied between the weight
    (tensor argument ``tensor``) and the staging, one after another."""
    staged = 0
    for start, end in runs:
        _warp_copy(t, tensor, start * K * K, (end - start) * K * K, P * (32 // parts) * K * K, es, lanes, to_global,
                   staged=staged * K * K)
        staged = staged + end - start


def _warp_copy(t: _Tally, tensor: int, start: Tensor, values: Tensor, most: int, es: int, lanes: int,
               to_global: bool, staged: Tensor | int = 0) -> None:
    """``warp_copy`` of involution_last.cu between the warp's staging from element ``staged``
    and ``values`` elements of tensor argument ``tensor`` from ``start`` (at most ``most``):
    16-byte vectors where both ends are aligned to them (the tensor's start and the staging's
    are), then a value a lane."""
    lane = torch.arange(32)
    vectors = torch.where((start * es) % 16 + (staged * es) % 16 == 0, values // lanes, 0)
    v = lane + 32 * _slots(-(-most // lanes // 32))
    t.shared(staged + v * lanes, v < vectors, es * lanes)
    (t.store if to_global else t.load)(tensor, start + v * lanes, v < vectors, es)
    v = vectors * lanes + lane + 32 * _slots(-(-most // 32))
    t.shared(staged + v, v < values, es)
    (t.store if to_global else t.load)(tensor, start + v, v < values, es)


def _pair_runs(base: Tensor, total: int, parts: int, G: int, OW: int, P: int = 2) -> list[tuple[Tensor, Tensor]]:
    """``LastLaunch::pair_records`` of involution_last.cu: the (start, end) records of the up to
    three runs of the warp's items from ``base``, P pixels a lane (empty where they are equal;
    one run where P is 1)."""
    pairs = -(-OW // P)
    last_lane = (total - base).clamp(max=32) - 1
    unit0, unit1 = base // parts, (base + last_lane) // parts
    pair0, pair1 = unit0 // G, unit1 // G
    group0, group1 = unit0 - pair0 * G, unit1 - pair1 * G
    j0, j1 = pair0 % pairs * P, pair1 % pairs * P
    pixel0, pixel1 = pair0 // pairs * OW + j0, pair1 // pairs * OW + j1
    one_pair = pair0 == pair1
    two0, two1 = (j0 + 1 < OW) & (P == 2), (j1 + 1 < OW) & (P == 2)
    start0 = pixel0 * G + group0
    end2 = torch.where(two1, pixel1 + 1, pixel1) * G + group1 + 1
    hole0 = two0 & torch.where(one_pair, group1 - group0 + 1 < G, group0 > 0)
    hole1 = two1 & ~one_pair & (group1 + 1 < G)
    end0 = torch.where(hole0, pixel0 * G + torch.where(one_pair, group1 + 1, G), start0)
    start1 = torch.where(hole0, (pixel0 + 1) * G + group0, start0)
    end1 = torch.where(hole1, pixel1 * G + group1 + 1, end2)
    start2 = torch.where(hole1, (pixel1 + 1) * G, end2)
    return [(start0, end0), (start1, end1), (start2, end2)]


def _pair_position(record: Tensor, runs: list[tuple[Tensor, Tensor]]) -> Tensor:
    """``PairRecords::position``: where ``record`` lies in the staging, in records."""
    (start0, end0), (start1, end1), (start2, _) = runs
    return (record - start0 - torch.where(record >= start1, start1 - end0, 0)
            - torch.where(record >= start2, start2 - end1, 0))


def _forward_last(t: _Tally, item: Tensor, launch: Launch) -> None:
    """involution_forward_last (involution_last.cu): a lane two adjacent pixels of a row (the
    second past the row where the width is odd: summed, not stored), or one (P, the
    instantiation's third argument); the warp's records, every pixel's of each lane, copied into
    shared memory in up to three runs (``_pair_runs``; one for a pixel a lane); per kernel row the
    K + (P - 1) S input vectors the pixels read (every one loaded: a column outside
    the image reads the sample's first pixel), and per column inside the image a shared-memory
    load of the weight and LANES multiply-adds for each pixel whose tap it is; a vector store
    per pixel in the row. Vectors traced by their first element."""
    _, C, H, W, G, _, _, ph, pw = launch.scalars
    K, S, P, es, lanes, parts, n, i, j, pixel, c0, record, second, runs = _pair_item(item, launch)
    _copy_runs(t, 1, runs, K, P, parts, es, lanes, to_global=False)
    slot = _pair_position(record, runs)
    second_slot = torch.where(second, _pair_position(record + G, runs), slot)
    c = _slots(K + (P - 1) * S)
    x = j * S - pw + c
    for a in range(K):
        y = i * S - ph + a
        inside = (y >= 0) & (y < H) & (x >= 0) & (x < W)
        t.load(0, torch.where(inside, ((n * H + y) * W + x) * C + c0, c0), True, es)
        first_tap, second_tap = inside & (c < K), inside & (c >= S) & (P == 2)
        t.shared(slot * K * K + a * K + c, first_tap, es)
        t.fma(first_tap, lanes)
        t.shared(second_slot * K * K + a * K + c - S, second_tap, es)
        t.fma(second_tap, lanes)
    t.store(2, pixel * C + c0, True, es)
    t.store(2, (pixel + 1) * C + c0, second, es)


def _backward_weight_last(t: _Tally, item: Tensor, launch: Launch) -> None:
    """involution_backward_weight_last (involution_last.cu): a lane two adjacent pixels of a
    row (the forward's pair items; the second past the row where the width is odd: not stored),
    or one (P), and their grad_output vectors; per kernel row the K + (P - 1) S input vectors the
    pixels read
    (every one loaded: a column outside the image reads the sample's first pixel), and per
    column LANES multiply-adds for each pixel whose tap it is, the sum added over the group's
    PARTS lanes by log2(PARTS) shuffles (traced as shared-memory passes: the shuffles take the
    same unit's slots) and staged in shared memory by the part whose share the tap is; then the
    warp's records copied out in up to three runs. Vectors traced by their first element."""
    _, C, H, W, G, _, _, ph, pw = launch.scalars
    K, S, P, es, lanes, parts, n, i, j, pixel, c0, record, second, runs = _pair_item(item, launch)
    part = item % parts
    t.load(0, pixel * C + c0, True, es)
    t.load(0, (pixel + 1) * C + c0, second, es)
    slot, second_slot = _pair_position(record, runs), _pair_position(record + G, runs)
    c = _slots(K + (P - 1) * S)
    x = j * S - pw + c
    shuffles = P * K * (parts.bit_length() - 1)
    for a in range(K):
        y = i * S - ph + a
        inside = (y >= 0) & (y < H) & (x >= 0) & (x < W)
        t.load(1, torch.where(inside, ((n * H + y) * W + x) * C + c0, c0), True, es)
        first_tap, second_tap = torch.ones_like(inside) & (c < K), torch.ones_like(inside) & (c >= S) & (P == 2)
        t.fma(first_tap, lanes)
        t.fma(second_tap, lanes)
        if shuffles:
            t.shared(_slots(shuffles) * 0 + torch.arange(32), True, 4)
        t.shared(slot * K * K + a * K + c, first_tap & (c % parts == part), es)
        t.shared(second_slot * K * K + a * K + c - S, second_tap & second & ((c - S) % parts == part), es)
    _copy_runs(t, 2, runs, K, P, parts, es, lanes, to_global=True)


def _backward_input_last(t: _Tally, item: Tensor, launch: Launch) -> None:
    """involution_backward_input_last (involution_last.cu): a block a segment of a band of
    ``LAST_GRAD_INPUT_ROWS`` input rows. Per output row the band reads (the last first), the
    segment's pieces of the band's kernel rows copied into shared memory by all the block's
    threads in units (two 16-bit values, or one value), a power of two of lanes a piece, a
    thread the same unit of every piece it copies: the unit of memory from the staged unit's
    first value, and where that value is a unit's second (every other piece) the next one too,
    each where it holds a value inside the record; then per tap of the lane's column phase a
    grad_output vector (every lane loads each: a tap with no output pixel reads the sample's
    first) and, where the tap has one, for each of the band's rows that takes a kernel row of
    the output row a shared-memory read of its weight and LANES multiply-adds; a vector store
    per row of the band in the image. Vectors traced by their first element."""
    from ..kernels.cuda_source import load_source

    total, C, H, W, G, OH, OW, ph, pw = launch.scalars
    K, S = int(launch.specialisation[0]), int(launch.specialisation[1])
    rows = load_source(launch.source).constants["LAST_GRAD_INPUT_ROWS"]
    run = rows * K
    es = launch.dtype.itemsize
    lanes = 16 // es
    vectors, threads = C // lanes, launch.threads_per_block
    segment, parts = threads // vectors, C // G // lanes
    segments, bands = -(-W // segment), -(-H // rows)
    task, thread = item // threads, item % threads
    v = thread % vectors
    g, c0 = v // parts, v * lanes
    band, x_first = task // segments, (task % segments) * segment
    y_first, n = (band % bands) * rows, band // bands
    x = x_first + thread // vectors
    active = x < W
    b_phase = (x + pw) % S
    j_first = (x + pw - b_phase) // S
    j_low = (-(-(x_first + pw - (K - 1)) // S)).clamp(min=0)
    j_high = ((torch.clamp(x_first + segment, max=W) - 1 + pw) // S).clamp(max=OW - 1)
    pieces = (j_high - j_low + 1).clamp(min=0) * G
    unit = max(es, 4)
    values = unit // es  # a unit's
    staged_units = run // values  # a piece's
    slots = 1 << (staged_units - 1).bit_length()
    slot, copied = thread % slots, thread // slots
    piece = copied + threads // slots * _slots(max(1, -(-int(pieces.max()) // (threads // slots))))
    copies = piece < pieces
    step = torch.arange(-(-K // S)).view(-1, 1, 1)
    b, j = b_phase + S * step, j_first - step
    i_low = (-(-(y_first + ph - (K - 1)) // S)).clamp(min=0)
    i_high = ((y_first + rows - 1 + ph) // S).clamp(max=OH - 1)
    for back in range((rows + K - 2) // S + 1):
        i = i_high - back
        reaches = i >= i_low
        i = torch.where(reaches, i, 0)
        a_first = y_first + ph - i * S
        value = a_first * K + slot * values  # the staged unit's first, in the record
        first_value = ((n * OH + i) * OW + j_low) * G * K * K + piece * K * K + a_first * K  # the piece's, in the weight
        shift = first_value % values
        inside, next_inside = (value >= 0) & (value < K * K), (values > 1) & (value + 1 >= 0) & (value + 1 < K * K)
        stages = slot < staged_units
        own = stages & (inside | ((shift == 0) & next_inside))
        at = (first_value + slot * values - shift) // values  # the unit of memory, in units
        t.load(1, at, reaches & copies & own, unit)
        t.load(1, at + 1, reaches & copies & stages & (shift == 1) & next_inside, unit)
        t.shared(piece * staged_units + slot, reaches & copies & stages, unit)
        reads = reaches & active & (b < K) & (j >= 0) & (j < OW)
        t.load(0, torch.where(reads, ((n * OH + i) * OW + j) * C + c0, c0), reaches, es)
        for r in range(rows):
            takes = reads & (a_first + r >= 0) & (a_first + r < K)
            t.shared(torch.where(takes, ((j - j_low) * G + g) * run + r * K + b, 0), takes, es)
            t.fma(takes, lanes)
    for r in range(rows):
        t.store(2, ((n * H + y_first + r) * W + x) * C + c0, active & (y_first + r < H), es)



def _feature_pair_loads(t: _Tally, at, r, inside, R: int, fsc: int, feature_words: bool, es: int) -> None:
    """A lane's pair of the feature's reduced channels (r, r + 1) at index ``at`` (its pixel's
    channel 0), as generated_mma.cu's kernels load an A fragment's register (or, float32's, its
    two values of a pixel): one load of the pair where the host says pairs are aligned words
    (channels_last), else two loads of ``es`` bytes; none past R or outside the map (``inside``
    false)."""
    if feature_words:
        t.load(1, (at + r) // 2, inside & (r < R), 2 * es)
    else:
        for h in range(2):
            t.load(1, at + (r + h) * fsc, inside & (r + h < R), es)


def _staged_thread(item: Tensor, launch: Launch, G: int, pg: int, tiles_w: int, tile: tuple[int, int],
                   chunk: int = 16):
    """A staged kernel's thread (generated_mma.cu: block-major, a block a tile of a (sample,
    group) and a chunk of ``chunk`` of its channels, the grid (tiles, groups, samples x chunks)): its
    index in the block, warp, a fragment's row and quad, and the block's group, sample, first
    channel and tile origin (y0, x0)."""
    chunks = -(-pg // chunk)
    block, thread = item // launch.threads_per_block, item % launch.threads_per_block
    lane, warp = thread % 32, thread // 32
    tile_index, group, z = block % launch.grid[0], (block // launch.grid[0]) % G, block // (launch.grid[0] * G)
    return (thread, warp, lane // 4, lane % 4, group, z // chunks, chunk * (z % chunks),
            tile_index // tiles_w * tile[0], tile_index % tiles_w * tile[1])


def _staged_region(t: _Tally, thread: Tensor, threads: int, plane_at, c0, pg: int, region: tuple[int, int],
                   pitch: int, split: int, first: tuple, size: tuple[int, int], strides: tuple, vector: bool, es: int,
                   staged_at: int, samples: int = 1, present=1, sample_step: int = 0) -> None:
    """generated_mma.cu's staged_region: a region of pixels of tensor argument 0 (a map of
    ``size``, from its pixel ``first``; ``plane_at`` its index at the group's first channel,
    ``strides`` its channel, row and column strides) into shared memory from word ``staged_at``,
    a unit a pixel's 8 channels (a 16-byte load where the host says they are a vector, else two
    16-bit loads a pair; 4 word stores), a pixel STAGED_PIXEL (10) words, at place ri * pitch +
    col, or with ``split`` 2 a row's even columns first; ``samples`` regions one after the other,
    of maps ``sample_step`` apart, from the ``present``-th zeros."""
    region_h, region_w = region
    cs, hs, ws = strides
    if (not vector and ws == 1 and (size[1] | cs | hs | sample_step) % 2 == 0
            and samples * sample_step + pg * cs + size[0] * hs + size[1] < 2 ** 31):
        _staged_region_pairs(t, thread, threads, plane_at, c0, pg, region, pitch, split, first, size, (cs, hs),
                             staged_at, samples, present, sample_step)
        return
    units = samples * region_h * region_w * 2
    unit = thread + threads * _slots(-(-units // threads))
    half, pixel = unit % 2, unit // 2
    ri, col = pixel // region_w, pixel % region_w
    sample = ri // region_h
    i, o = first[0] + ri % region_h, first[1] + col
    c = c0 + 8 * half
    staging = unit < units
    in_map = staging & (sample < present) & (i >= 0) & (i < size[0]) & (o >= 0) & (o < size[1])
    at = plane_at + sample * sample_step + c * cs + i * hs + o * ws
    if vector:
        t.load(0, at // 8, in_map & (c < pg), 16)
    else:
        for word in range(8):
            t.load(0, at + word * cs, in_map & (c + word < pg), es)
    place = ri * pitch + (col % 2 * ((region_w + 1) // 2) + col // 2 if split == 2 else col)
    for word in range(4):
        t.shared(staged_at + place * 10 + 4 * half + word, staging, 4)



def _staged_region_pairs(t: _Tally, thread: Tensor, threads: int, plane_at, c0, pg: int, region: tuple[int, int],
                         pitch: int, split: int, first: tuple, size: tuple[int, int], strides: tuple, staged_at: int,
                         samples: int, present, sample_step: int) -> None:
    """generated_mma.cu's staged_region_pairs (staged_region's NCHW way where a row's columns
    pair into aligned words): a unit a pixel pair's 8 channels (x even), a word load a channel,
    two 8-byte stores a column; units along a row's column pairs, then the chunk's halves, then
    the rows."""
    region_h, region_w = region
    cs, hs = strides
    lead = first[1] % 2
    first_even = first[1] - lead
    row_pairs = (region_w + lead + 1) // 2
    lines = samples * region_h * 2
    most = int(torch.as_tensor(lines * row_pairs).max())
    unit = thread + threads * _slots(-(-most // threads))
    line, pair = unit // row_pairs, unit % row_pairs
    live = line < lines
    ri, half = line // 2, line % 2
    sample = ri // region_h
    i, x = first[0] + ri % region_h, first_even + 2 * pair
    c = c0 + 8 * half
    in_map = live & (sample < present) & (i >= 0) & (i < size[0]) & (x >= 0) & (x < size[1])
    at = plane_at + sample * sample_step + c * cs + i * hs + x  # even: 4-byte words
    for k in range(8):
        t.load(0, (at + k * cs) // 2, in_map & (c + k < pg), 4)
    col = x - first[1]
    for p in range(2):
        q = col + p
        stored = live & (q >= 0) & (q < region_w)
        place = ri * pitch + (q % 2 * ((region_w + 1) // 2) + q // 2 if split == 2 else q)
        for w in range(2):  # 8 bytes each (index in 8-byte units)
            t.shared((staged_at + place * 10 + 4 * half) // 2 + w, stored, 8)

def _staged_run_stores(t: _Tally, row_at, channel, channels: int, pg: int, x, step: int, columns: int, strides: tuple,
                       stored, es: int) -> None:
    """The staged kernels' stores of a thread's run (staged_store_run, staged_wide_store_run):
    its 4 pixels (columns x + step p before ``columns``) of the row at index ``row_at`` (of tensor
    argument 4, at the group's channel 0; ``stored``: the row's run stores at all) x its
    ``channels`` channels from ``channel`` (those of the group's), a pair one store of 2 es bytes
    where the layout allows it (channels_last, even strides and group), else one a value."""
    sn, sc, sh, sw = strides
    pairs = sc == 1 and (sn | sh | sw | pg) % 2 == 0
    for p in range(4):
        xp = x + step * p
        live = stored & (xp < columns)
        for e in range(0, channels, 2 if pairs else 1):
            at = row_at + (channel + e) * sc + xp * sw
            if pairs:
                t.store(4, at // 2, live & (channel + e < pg), 2 * es)
            else:
                t.store(4, at, live & (channel + e < pg), es)


def _generated_mma_backward_input_staged(t: _Tally, item: Tensor, launch: Launch) -> None:
    """involution_generated_mma_backward_input_staged (generated_mma.cu): ``item`` is the
    thread's index in the grid (block-major, 256 threads a block, a block a tile of a (sample,
    group) and a chunk of 16 of its channels; a warp 8 runs of 4 pixels x 4 channel quarters of
    one row and column parity). The group's span rows and their bias (a value a thread, stored
    in float), then the kernel rows' weights formed (16-bit: every row at once, then grad_output
    staged in the span rows' place; float32: grad_output staged first, its own place, then
    STAGED_GRAD_ROWS rows at a time; per m-tile, 16 of the pixels, row-major, of the output rows
    any of the rows reads x the region's columns: per n-tile the bias, two shared loads; per
    k-step of R the feature's A fragment from global memory and per n-tile the span's B by
    ldmatrix; tensor cores: no term; a word store per value a run reads (the others unstored);
    grad_output a 16-byte load
    a pixel's 8 channels where the host says they are a vector, else two 16-bit loads a pair; 4
    word stores) and, per kernel row, for a warp whose
    rows read an output row through it, its taps' 4 weights (a 16-byte shared load each), the window's
    grad_output (an 8-byte shared load a pixel) and 4 multiply-adds per (tap, pixel) pair; the
    stores. The layout's sizes are the source's and its host's."""
    from ..kernels.involution import cuda as involution_cuda

    (C, H, W, G, OH, OW, ph, pw, R, tiles_w, runs_w, gsn, gsc, gsh, gsw, isn, isc, ish, isw,
     fsn, fsc, fsh, fsw, vector, feature_words) = launch.scalars
    K, S = (int(v) for v in launch.specialisation[:2])  # (and VECTORS: the same work)
    source = involution_cuda.load_source(involution_cuda.GENERATED_MMA_SOURCE)
    es, taps, pg, threads = launch.dtype.itemsize, K * K, C // G, launch.threads_per_block
    # float32's way (3xTF32): span rows and grad_output in floats, k-steps of 8, three TF32
    # products per n-tile and k-step, a window pixel's 4 channels one 16-byte load
    wide = launch.dtype == torch.float32
    pixel_words = source.constants["STAGED_WIDE_PIXEL"] if wide else 10
    most_taps = -(-K // S)
    tile_h, tile_w = involution_cuda.generated_mma_staged_tile(source, S, runs_w)
    region_h, region_w = ((size - 1 + K - 1 + S - 1) // S + 1 for size in (tile_h, tile_w))
    weight_rows, row_stride = tile_h // S, tile_w // S
    tap_stride = (weight_rows * row_stride + 27) // 32 * 32 + 4
    span_rows, span_words = K * K + 7, 8 * -(-R // 16)
    span_stride = involution_cuda.generated_mma_staged_wide_span_stride(R) if wide else span_words + 4
    bias_at = span_rows * span_stride  # words
    if wide:  # span rows, grad_output and the weights' two buffers apart
        staged_at = bias_at + -(-span_rows // 4) * 4
        weights_at = staged_at + -(-region_h * region_w * pixel_words // 4) * 4
        rows_at_once = min(K, source.constants["STAGED_GRAD_ROWS"])
    else:  # grad_output in the span rows' place once every kernel row's weights are formed, into one buffer
        staged_at = 0
        weights_at = -(-max(bias_at + span_rows, region_h * region_w * pixel_words) // 4) * 4
        rows_at_once = K
    buffer_taps = rows_at_once * K
    thread, warp, row, quad, group, n, c0, y0, x0 = _staged_thread(item, launch, G, pg, tiles_w, (tile_h, tile_w))
    lane = thread % 32
    first_row, first_column = (y0 + ph - (K - 1)) // S, (x0 + pw - (K - 1)) // S
    parity = warp % (S * S)
    run_x, run_y = row % runs_w, row // runs_w
    y = y0 + parity // S + S * (warp // (S * S) * (8 // runs_w) + run_y)
    x = x0 + parity % S + S * 4 * run_x
    b0 = (x + pw) % S
    taps_b = most_taps if S == 1 else (K - b0 + S - 1) // S
    window_column = (x + pw - b0) // S - (most_taps - 1) - first_column
    if wide:
        _wide_span_staging(t, thread, threads, group, taps, R, span_rows, span_stride)
    else:
        _span_staging(t, thread, threads, group, taps, R, span_rows, span_words, span_stride, es)
    _bias_staging(t, thread, group, taps, span_rows, bias_at, es)

    def form_rows(a0: int, buffer: int) -> None:
        rows = min(rows_at_once, K - a0)  # an n-tile a kernel row, its taps 0 .. 7
        i_first = (y0 + ph - (a0 + rows - 1) + S - 1) // S
        pixels = ((y0 + ph - a0 + S - 1) // S - i_first + weight_rows) * region_w  # the rows' x the region's columns
        m_tiles = -(-pixels // 16)
        m = warp + 8 * _slots(-(-int(torch.as_tensor(m_tiles).max()) // 8))  # (the blocks' tile origins differ)
        live = m < m_tiles
        pixel = [16 * m + row + 8 * h for h in range(2)]  # the lane's two, row-major
        i = [i_first + p // region_w for p in pixel]
        column = [p % region_w for p in pixel]
        for tt in range(rows):
            for e in range(2):
                t.shared(bias_at + (a0 + tt) * K + 2 * quad + e, live, 4)
        for k0 in range(0, R, 8 if wide else 16):
            for v in range(2 if wide else 4):
                h = v & 1
                o = first_column + column[h]
                inside = live & (i[h] >= 0) & (i[h] < OH) & (o >= 0) & (o < OW)
                _feature_pair_loads(t, n * fsn + i[h] * fsh + o * fsw, k0 + 2 * quad + 8 * (v >> 1), inside, R, fsc,
                                    feature_words, es)
            for tt in range(rows):
                if wide:
                    t.shared(((a0 + tt) * K * span_stride + row * span_stride + 2 * quad + k0) // 2, live, 8)
                    t.tf32_products(live, 3)
                else:
                    t.matrices((a0 + tt) * K * span_stride + k0 // 2 + _fragment_b_rows(lane, span_stride), live, 2)
        for r in range(rows):
            for e in range(2):
                b = 2 * quad + e  # the lane's tap (those past K unstored)
                offset = (x0 + pw - b + (b - pw) % S) // S - first_column
                for h in range(2):
                    wi = i[h] - (y0 + ph - a0 + S - 1 - r) // S  # the pixel's row among kernel row a0 + r's
                    at = column[h] - offset
                    stored = live & (b < K) & (wi >= 0) & (wi < weight_rows) & (at >= 0) & (at < row_stride)
                    place = weights_at + (buffer * buffer_taps + r * K + b) * tap_stride + wi * row_stride + at
                    t.shared(place, stored, 4)  # (a value no run reads unstored: a predicated store)

    if wide:
        _wide_region(t, thread, threads, n * gsn + group * pg * gsc, c0, 4, pixel_words, pg, (region_h, region_w),
                     region_w, 1, (first_row, first_column), (OH, OW), (gsc, gsh, gsw), vector, staged_at)
        form_rows(0, 0)
    else:
        form_rows(0, 0)
        _staged_region(t, thread, threads, n * gsn + group * pg * gsc, c0, pg, (region_h, region_w), region_w, 1,
                       (first_row, first_column), (OH, OW), (gsc, gsh, gsw), vector, es, staged_at)
    for step, a0 in enumerate(range(0, K, rows_at_once)):
        end = min(a0 + rows_at_once, K)
        for a in range(a0, end):
            from_y = y + ph - a
            reads = from_y % S == 0
            i = from_y // S
            wi = i - (-((a - y0 - ph) // S))
            first_tap = (weights_at + ((step % 2) * buffer_taps + (a - a0) * K + b0) * tap_stride + wi * row_stride +
                         4 * run_x)
            for tap in range(most_taps):  # 16 bytes each (index in 16-byte units)
                t.shared((first_tap + S * tap * tap_stride) // 4, reads, 16)
            window = staged_at + ((i - first_row) * region_w + window_column) * pixel_words + (4 if wide else 2) * quad
            for k in range(4 + most_taps - 1):  # 8 bytes each, or float32's 16
                if wide:
                    t.shared((window + k * pixel_words) // 4, reads, 16)
                else:
                    t.shared((window + k * 10) // 2, reads, 8)
                for tap in range(most_taps):
                    if 0 <= k + tap - (most_taps - 1) < 4:
                        t.fma(reads & (tap < taps_b), 4)
        if end < K:
            form_rows(end, (step + 1) % 2)
    _staged_run_stores(t, n * isn + group * pg * isc + y * ish, c0 + 4 * quad, 4, pg, x, S, W, (isn, isc, ish, isw),
                       y < H, es)


def _generated_mma_staged(t: _Tally, item: Tensor, launch: Launch) -> None:
    """involution_generated_mma_staged (generated_mma.cu): ``item`` is the thread's index in the
    grid (block-major, 256 threads a block, a block a tile of output pixels of a (sample, group)
    and a chunk of 16 of its channels, or folded of 1 << fold_shift samples, each a share of the
    tile's rows; a warp 8 runs of 4 pixels x 4 channel quarters, runs_w along a row). The span
    rows (at stride 2 the first pass's), the taps' bias (a value a thread, stored in float) and,
    per sample, the input over the region its pixels in the map read staged (``_staged_region``,
    at stride 2 a row's even columns first); per pass of kernel rows, the pass's taps formed (per
    m-tile of 16 of the tile's pixels: per n-tile the bias, an 8-byte shared load; per k-step of
    R the feature's A fragment from global memory and the span's B by ldmatrix per n-tile;
    tensor cores: no term; an 8-byte store per tap of the pass and the lane's pixel pair) and, per kernel row of the
    pass, for a run with a pixel in the map, its K taps' 4 weights (a 16-byte shared load each),
    the window's input (an 8-byte shared load a pixel) and 4 multiply-adds per (tap, pixel)
    pair, then at stride 2 the next pass's span rows staged; the stores. The layout's sizes are
    the source's and its host's."""
    from ..kernels.involution import cuda as involution_cuda

    (C, H, W, G, OH, OW, ph, pw, R, tiles_w, runs_w, N, fold_shift, isn, isc, ish, isw, osn, osc, osh, osw,
     fsn, fsc, fsh, fsw, vector, feature_words) = launch.scalars
    K, S = (int(v) for v in launch.specialisation[:2])  # (and INPUT_VECTORS: the same work)
    feature_pairs = launch.specialisation[3:] == ("true",)  # FEATURE_PAIRS
    if launch.dtype == torch.float32:
        _generated_mma_staged_wide(t, item, launch)
        return
    source = involution_cuda.load_source(involution_cuda.GENERATED_MMA_SOURCE)
    es, taps, pg, threads = launch.dtype.itemsize, K * K, C // G, launch.threads_per_block
    tile_h, tile_w = involution_cuda.generated_mma_staged_forward_tile(source, runs_w)
    tile_pixels, sample_rows = tile_h * tile_w, tile_h >> fold_shift
    region_h, region_w = involution_cuda.generated_mma_staged_forward_region(source, K, S, runs_w, (OH, OW))
    pitch = 2 * -(-region_w // 2) if S == 2 else region_w
    odd = -(-region_w // 2) * 10 if S == 2 else 0
    tap_stride = tile_pixels + 4
    span_rows, span_words = 8 * -(-taps // 8), 8 * -(-R // 16)
    span_stride = span_words + 4
    bias_at = 8 * involution_cuda.generated_mma_staged_forward_span_tiles(K, S) * span_stride  # words
    staged_at = bias_at + span_rows
    region_words = region_h * pitch * 10  # a sample's
    weights_at = staged_at + -(-(region_words << fold_shift) // 4) * 4
    thread, warp, row, quad, group, n0, c0, y0, x0 = _staged_thread(item, launch, G, pg, tiles_w, (tile_h, tile_w))
    n0 = n0 << fold_shift
    lane = thread % 32
    passes = involution_cuda.generated_mma_staged_forward_passes(K, S)
    pass_span = S == 2  # a pass's span rows at a time, else all of them once

    def pass_span_staging(first_a: int, end_a: int) -> None:  # staged_pass_span_rows
        first_tile = first_a * K // 8
        _span_staging(t, thread, threads, group, taps, R, 8 * (-(-end_a * K // 8) - first_tile), span_words,
                      span_stride, es, first_tap=8 * first_tile)

    pass_span_staging(*(passes[0] if pass_span else (0, K)))
    _bias_staging(t, thread, group, taps, span_rows, bias_at, es)
    _staged_region(t, thread, threads, n0 * isn + group * pg * isc, c0, pg, (region_h, region_w), pitch, S,
                   (S * y0 - ph, S * x0 - pw), (H, W), (isc, ish, isw), vector, es, staged_at, 1 << fold_shift, N - n0,
                   isn)
    run_x, run_y = row % runs_w, row // runs_w
    ty, tx = warp * (8 // runs_w) + run_y, 4 * run_x
    run_sample, sample_y = ty // sample_rows, ty % sample_rows
    n = n0 + run_sample
    summing = (y0 + sample_y < OH) & (x0 + tx < OW) & (n < N)  # a run with a pixel in the map
    m = warp + 8 * _slots(-(-tile_pixels // 16 // 8))
    live = m < tile_pixels // 16
    for index, (first_a, end_a) in enumerate(passes):
        first_tile = first_a * K // 8
        tiles = -(-end_a * K // 8) - first_tile
        for tt in range(tiles):
            t.shared((bias_at + 8 * (first_tile + tt) + 2 * quad) // 2, live, 8)
        for k0 in range(0, R, 16):  # every n-tile of the pass at once: the feature read once a k-step
            for v in range(4):  # (the lane's pixels 2 row and 2 row + 1 of the m-tile)
                pixel = 16 * m + 2 * row + (v & 1)
                py, o = pixel // tile_w, x0 + pixel % tile_w
                sample, i = n0 + py // sample_rows, y0 + py % sample_rows
                inside, r = live & (i < OH) & (o < OW) & (sample < N), k0 + 2 * quad + 8 * (v >> 1)
                if not feature_pairs:
                    _feature_pair_loads(t, sample * fsn + i * fsh + o * fsw, r, inside, R, fsc, feature_words, es)
                elif v & 1 == 0:  # a word of both pixels a channel (staged_feature_pixel_pairs)
                    for c in range(2):
                        t.load(1, (sample * fsn + i * fsh + o + (r + c) * fsc) // 2, inside & (r + c < R), 4)
            for tt in range(tiles):
                t.matrices(8 * (tt + (0 if pass_span else first_tile)) * span_stride + k0 // 2
                           + _fragment_b_rows(lane, span_stride), live, 2)
        for tt in range(tiles):
            for e in range(2):  # a tap's two pixels one 8-byte store (index in 8-byte units)
                place = 8 * tt + 2 * quad + e
                t.shared((weights_at + place * tap_stride + 16 * m + 2 * row) // 2,
                         live & (8 * first_tile + place < end_a * K), 8)
        for a in range(first_a, end_a):
            first_tap = weights_at + (a * K - 8 * first_tile) * tap_stride + ty * tile_w + tx
            for b in range(K):  # 16 bytes each (index in 16-byte units)
                t.shared((first_tap + b * tap_stride) // 4, summing, 16)
            window = staged_at + run_sample * region_words + ((S * sample_y + a) * pitch + tx) * 10 + 2 * quad
            for k in range(S * 3 + K):  # 8 bytes each
                at = window + (k % 2 * odd + k // 2 * 10 if S == 2 else k * 10)
                t.shared(at // 2, summing, 8)
                t.fma(summing, 4 * sum(0 <= k - S * p < K for p in range(4)))
        if pass_span and index + 1 < len(passes):
            pass_span_staging(*passes[index + 1])
    y, x = y0 + sample_y, x0 + tx
    _staged_run_stores(t, n * osn + group * pg * osc + y * osh, c0 + 4 * quad, 4, pg, x, 1, OW, (osn, osc, osh, osw),
                       (y < OH) & (n < N), es)


def _dense_rows(t: _Tally, thread: Tensor, threads: int, tensor: int, at, stride, rows, rows_inside, words_per_row: int,
                base, row_w: int, row_h_step: int, row_w_step: int, step: int, count: int, vectors: bool, es: int,
                most_rows: Optional[int] = None) -> None:
    """dense_window.cu's dense_stage_rows: ``rows`` rows of ``words_per_row`` words (``stride``
    apart, from word ``at`` of the shared memory), consecutive threads along a row, from tensor
    argument ``tensor`` (row r the pixel (r // row_w, r % row_w) of a map ``row_h_step`` and
    ``row_w_step`` elements a row and a column from ``base``, its values ``step`` apart, ``count``
    of them inside, rows from ``rows_inside`` on zeros): a 16-byte load and store a thread a turn
    with ``vectors``, else two 16-bit loads and a word's store. ``rows`` (and ``at``, ``stride``,
    ``rows_inside``) may be a value a lane, at most ``most_rows``."""
    per_row = words_per_row // 4 if vectors else words_per_row
    turn = thread + threads * _slots(-(-(rows if most_rows is None else most_rows) * per_row // threads))
    live = turn < rows * per_row
    row, column = turn // per_row, (8 if vectors else 2) * (turn % per_row)
    inside = live & (row < rows_inside)
    first = base + row // row_w * row_h_step + row % row_w * row_w_step
    if vectors:
        t.load(tensor, (first + column) // 8, inside & (column < count), 16)
        t.shared((at + row * stride + column // 2) // 4, live, 16)
        return
    for e in range(2):
        t.load(tensor, first + (column + e) * step, inside & (column + e < count), es)
    t.shared(at + row * stride + column // 2, live, 4)


def _dense_block(item: Tensor, launch: Launch) -> SimpleNamespace:
    """A dense_window.cu kernel's thread (``item``, block-major, a block a (group, sample, band),
    a warp 16 of its output pixels): its lane, warp, fragment row and quad, group, sample, band
    and first pixel, the launch's LAST and VECTORS, element size, and the source's constants."""
    from ..kernels.involution import cuda as involution_cuda

    threads, (groups, samples, _) = launch.threads_per_block, launch.grid
    block, thread = item // threads, item % threads
    lane, warp = thread % 32, thread // 32
    last, vectors = (flag == "true" for flag in launch.specialisation[:2])
    return SimpleNamespace(thread=thread, threads=threads, lane=lane, warp=warp, row=lane // 4, quad=lane % 4,
                           group=block % groups, n=block // groups % samples, band=block // (groups * samples),
                           first=16 * warp, last=last, vectors=vectors,
                           es=launch.dtype.itemsize,
                           c=involution_cuda.load_source(involution_cuda.DENSE_WINDOW_SOURCE).constants)


def _dense_reached_steps(first: Tensor, P, OW: int, sh: int, ph, KH: int, dh: int, H, W: int):
    """dense_window.cu's dense_reached_steps: the steps of 16 input pixels, (first, end), that hold
    the input rows the windows of output pixels first .. first + 15 reach (``P``, ``ph``, ``H``
    ints or a value a lane)."""
    top = first // OW * sh - ph
    bottom = torch.minimum(first + 15, torch.as_tensor(P - 1)) // OW * sh - ph + (KH - 1) * dh
    y_first, y_end = top.clamp(min=0), torch.minimum(bottom + 1, torch.as_tensor(H))
    return (torch.where(y_first < y_end, y_first * W // 16, 0), torch.where(y_first < y_end, (y_end * W + 15) // 16, 0))


def _generated_dense_window(t: _Tally, item: Tensor, launch: Launch, grad_input: bool = False) -> None:
    """involution_generated_dense_window (dense_window.cu): ``item`` is the thread's index in the
    grid (block-major, 128 threads a block, a block a (group, sample), a warp 16 of its pixels).
    The feature (channels_last: a pixel a row, 16-byte vectors where aligned; NCHW: an R a row,
    a lane's pixel pair two 16-bit loads) and the group's span rows staged; the weights formed
    (per k-step of R, A by one ldmatrix and B by one per pair of n-tiles; tensor cores: no term);
    the dense matrices' zeros (16-byte stores), and per (tap, pixel) of the lane its bias (a
    global load a tap), the bias's add and, where the tap reads the map, hi's and lo's 16-bit
    stores; per 16 of the group's channels the input staged (channels_last a pixel a row, NCHW
    a channel a row), then per k-step of the input rows the warp's windows reach B's ldmatrix and
    hi's and lo's A, and the outputs' 16-bit stores. ``grad_input``: its grad_input
    (involution_generated_dense_window_backward_input), whose scalars name grad_output where the
    forward's name the input: per 16 channels grad_output staged, then per m-tile of the input
    pixels the warp takes (every fourth) per k-step of the output pixels B's ldmatrix and hi's
    and lo's A (transposed), and grad_input's 16-bit stores. The layout's sizes are the source's
    and its host's."""
    (C, H, W, G, KH, KW, OH, OW, sh, sw, ph, pw, dh, dw, R, isn, isc, ish, isw, osn, osc, osh, osw, fsn, fsc, fsh,
     fsw) = launch.scalars
    b = _dense_block(item, launch)
    c, es, threads, thread, lane, warp, row, quad = b.c, b.es, b.threads, b.thread, b.lane, b.warp, b.row, b.quad
    last, vectors, group, n, first = b.last, b.vectors, b.group, b.n, b.first
    taps, P, Q, pg = KH * KW, OH * OW, H * W, C // G
    r_steps, q_steps, tap_rows = -(-R // 16), -(-Q // 16), 16 * -(-taps // 16)
    reduced_stride, dense_stride = 8 * r_steps + 4, 8 * q_steps + 4
    pixel_stride, channel_stride = c["DENSE_PIXEL_STRIDE"], c["DENSE_CHANNEL_STRIDE"]
    feature_words = c["DENSE_PIXELS"] * reduced_stride if last else 16 * r_steps * pixel_stride
    dense_words = c["DENSE_PIXELS"] * dense_stride
    staged_at = max(feature_words + tap_rows * reduced_stride, 2 * dense_words)
    if grad_input:
        offsets_at = staged_at + (c["DENSE_PIXELS"] * channel_stride if last else c["DENSE_CHANNELS"] * pixel_stride)
    else:
        offsets_at = staged_at + (16 * q_steps * channel_stride if last else c["DENSE_CHANNELS"] * dense_stride)
    t.shared(offsets_at // 2 + thread, thread < taps, 8)  # the taps' offsets and places

    def rows(tensor, at, stride, count_rows, inside_rows, words, base, row_w, row_h_step, row_w_step, step, count,
             vectors):
        _dense_rows(t, thread, threads, tensor, at, stride, count_rows, inside_rows, words, base, row_w, row_h_step,
                    row_w_step, step, count, vectors, es)

    if last:
        rows(1, 0, reduced_stride, c["DENSE_PIXELS"], P, 8 * r_steps, n * fsn, OW, fsh, fsw, fsc, R, vectors)
    else:
        w, r = thread % 32, thread // 32 + 4 * _slots(-(-16 * r_steps // 4))
        for e in range(2):
            p = 2 * w + e
            t.load(1, n * fsn + r * fsc + p // OW * fsh + p % OW * fsw, (r < R) & (p < P), es)
        t.shared(r * pixel_stride + w, r < 16 * r_steps, 4)
    rows(2, feature_words, reduced_stride, tap_rows, taps, 8 * r_steps, group * taps * R, tap_rows, 0, R, 1, R,
         vectors)
    live = first < P
    for k in range(r_steps):
        if last:
            t.matrices(first * reduced_stride + 8 * k + _fragment_a_rows(lane, reduced_stride), live, 4)
        else:  # oplib_load_fragment_a_transposed
            t.matrices(16 * k * pixel_stride + first // 2 + (lane % 8 + 8 * (lane // 16)) * pixel_stride
                       + 4 * (lane // 8 % 2), live, 4)
        for pair in range(-(-taps // 16)):
            t.matrices(feature_words + 16 * pair * reduced_stride + 8 * k
                       + _fragment_b_rows(lane, reduced_stride, 8 * reduced_stride), live, 4)
    zeros = thread + threads * _slots(-(-2 * dense_words // 4 // threads))
    t.shared(zeros, zeros < 2 * dense_words // 4, 16)
    for tile in range(-(-taps // 8)):
        for h in range(2):
            tap = 8 * tile + 2 * quad + h
            t.load(3, group * taps + tap, tap < taps, es)
            t.shared(offsets_at // 2 + tap, tap < taps, 8)
            for half in range(2):
                p = first + row + 8 * half
                weighs = (p < P) & (tap < taps)
                t.fma(weighs)  # the bias's add
                y = p // OW * sh - ph + tap // KW * dh
                x = p % OW * sw - pw + tap % KW * dw
                inside = weighs & (y >= 0) & (y < H) & (x >= 0) & (x < W)
                for lo in range(2):
                    t.shared(2 * p * dense_stride + y * W + x + lo * 2 * dense_words, inside, 2)
    if grad_input:
        _dense_grad_input_products(t, thread, lane, warp, row, quad, group, n, launch, last, vectors, rows, staged_at,
                                   dense_stride, dense_words, pixel_stride, channel_stride, c["DENSE_CHANNELS"])
        return
    # the k-steps of the input rows the warp's windows reach
    k_first, k_end = _dense_reached_steps(first, P, OW, sh, ph, KH, dh, H, W)
    for c0 in range(0, pg, c["DENSE_CHANNELS"]):
        chunk = n * isn + (group * pg + c0) * isc
        if last:
            rows(0, staged_at, channel_stride, 16 * q_steps, Q, 8, chunk, W, ish, isw, isc, pg - c0, vectors)
        else:
            channel, word = thread // 8, thread % 8 + 8 * _slots(q_steps)  # 8 threads a channel
            q = 2 * word
            for e in range(2):
                t.load(0, chunk + channel * isc + (q + e) // W * ish + (q + e) % W * isw,
                       (c0 + channel < pg) & (q + e < Q), es)
            t.shared(staged_at + channel * dense_stride + word, torch.ones_like(word, dtype=torch.bool), 4)
        for k in range(q_steps):
            steps = live & (k >= k_first) & (k < k_end)
            if last:  # B transposed: matrix i the rows 16 k + 8 (i & 1) .., channels 8 (i >> 1) ..
                i = lane // 8
                t.matrices(staged_at + (16 * k + 8 * (i % 2) + lane % 8) * channel_stride + 4 * (i // 2), steps, 4)
            else:
                t.matrices(staged_at + 8 * k + _fragment_b_rows(lane, dense_stride, 8 * dense_stride), steps, 4)
            for lo in range(2):
                t.matrices(lo * dense_words + first * dense_stride + 8 * k + _fragment_a_rows(lane, dense_stride),
                           steps, 4)
        for v in range(8):
            p = first + row + 8 * (v // 2 % 2)
            channel = c0 + 8 * (v // 4) + 2 * quad + v % 2
            t.store(4, n * osn + (group * pg + channel) * osc + p // OW * osh + p % OW * osw,
                    (p < P) & (channel < pg), es)


def _dense_grad_input_products(t: _Tally, thread, lane, warp, row, quad, group, n, launch: Launch, last: bool,
                               vectors: bool, rows, staged_at: int, dense_stride: int, dense_words: int,
                               pixel_stride: int, channel_stride: int, chunk_channels: int) -> None:
    """``_generated_dense_window``'s step 3 of the grad_input: per chunk of the group's channels,
    grad_output staged, the products of the matrices' columns, grad_input's stores."""
    (C, H, W, G, KH, KW, OH, OW, sh, sw, ph, pw, dh, dw, R, gsn, gsc, gsh, gsw, osn, osc, osh, osw, *_) = launch.scalars
    es, P, Q, pg = launch.dtype.itemsize, OH * OW, H * W, C // G
    q_steps, p_steps = -(-Q // 16), -(-P // 16)
    tile = warp + 4 * _slots(-(-q_steps // 4))
    live = tile < q_steps
    for c0 in range(0, pg, chunk_channels):
        chunk = n * gsn + (group * pg + c0) * gsc
        if last:
            rows(0, staged_at, channel_stride, 64, P, 8, chunk, OW, gsh, gsw, gsc, pg - c0, vectors)
        else:  # dense_stage_planes: 8 threads a channel
            channel, word = thread // 8, thread % 8 + 8 * _slots(4)
            for e in range(2):
                p = 2 * word + e
                t.load(0, chunk + channel * gsc + p // OW * gsh + p % OW * gsw, (c0 + channel < pg) & (p < P), es)
            t.shared(staged_at + channel * pixel_stride + word, torch.ones_like(word, dtype=torch.bool), 4)
        for k in range(p_steps):
            if last:
                i = lane // 8
                t.matrices(staged_at + (16 * k + 8 * (i % 2) + lane % 8) * channel_stride + 4 * (i // 2), live, 4)
            else:
                t.matrices(staged_at + 8 * k + _fragment_b_rows(lane, pixel_stride, 8 * pixel_stride), live, 4)
            for lo in range(2):  # oplib_load_fragment_a_transposed
                t.matrices(lo * dense_words + 16 * k * dense_stride + 8 * tile
                           + (lane % 8 + 8 * (lane // 16)) * dense_stride + 4 * (lane // 8 % 2), live, 4)
        for h in range(2):
            q = 16 * tile + row + 8 * h
            for v in range(4):
                channel = c0 + 8 * (v // 2) + 2 * quad + v % 2
                t.store(4, n * osn + (group * pg + channel) * osc + q // W * osh + q % W * osw,
                        live & (q < Q) & (channel < pg), es)


def _dense_window_backward_weight(t: _Tally, item: Tensor, launch: Launch) -> None:
    """involution_dense_window_backward_weight (dense_window.cu): ``item`` is the thread's index in
    the grid (block-major, 128 threads a block, a block a (group, sample), a warp 16 of its output
    pixels). The taps' and the pixels' words; per 16 of the group's channels grad_output and the
    input staged (channels_last a pixel a row, 16-byte vectors where aligned; NCHW a channel a
    row, a pixel pair two 16-bit loads), A's ldmatrix, then per step of 16 input pixels the
    warp's windows reach B's ldmatrix (tensor cores: no term) and the float sums' 8-byte stores
    (past the first pass, their loads and adds; with one pass, a rounded pair's 32-bit store);
    then the gather, a lane a pixel (or a tap): its
    entry once, per turn the other index's, the product's load where the tap reads the map and
    grad_weight's 16-bit store (DENSE_MAP_WIDE: 32-bit). The layout's sizes are the source's and its host's."""
    (C, H, W, G, KH, KW, OH, OW, sh, sw, ph, pw, dh, dw, band_rows, gsn, gsc, gsh, gsw, isn, isc, ish, isw, osn, osg,
     oskh, oskw, osh, osw) = launch.scalars
    b = _dense_block(item, launch)
    c, es, threads, thread, lane, row, quad = b.c, b.es, b.threads, b.thread, b.lane, b.row, b.quad
    last, vectors, group, n, first = b.last, b.vectors, b.group, b.n, b.first
    taps, pg = KH * KW, C // G
    # the block's band (a value a lane): its output rows and the input rows it stages
    band_top = b.band * band_rows
    rows_here = torch.clamp(OH - band_top, max=band_rows)
    reach_top = band_top * sh - ph
    reach_end = reach_top + (rows_here - 1) * sh + (KH - 1) * dh + 1
    band_y = reach_top.clamp(min=0)
    band_h = (reach_end.clamp(max=H) - band_y).clamp(min=0)
    band_pad = band_y - reach_top
    P, Q = rows_here * OW, band_h * W
    q_steps = (Q + 15) // 16
    most_q_steps = -(-min(H, (band_rows - 1) * sh + (KH - 1) * dh + 1) * W // 16)  # the loops' bound
    product_stride, input_stride = 16 * q_steps + 8, 8 * q_steps + 4
    pixel_stride, channel_stride = c["DENSE_PIXEL_STRIDE"], c["DENSE_CHANNEL_STRIDE"]
    wide = launch.specialisation[2] == "DENSE_MAP_WIDE"  # a float out
    narrow = launch.specialisation[2] == "DENSE_MAP_NARROW"  # one pass: the products in 16 bits
    grad_at = c["DENSE_PIXELS"] * product_stride // (2 if narrow else 1)
    input_at = grad_at + (c["DENSE_PIXELS"] * channel_stride if last else c["DENSE_CHANNELS"] * pixel_stride)
    taps_at = input_at + (16 * q_steps * channel_stride if last else c["DENSE_CHANNELS"] * input_stride)
    pixels_at = taps_at + 4 * c["DENSE_TAPS"]
    t.shared(taps_at // 4 + thread, thread < taps, 16)  # the gather's entries
    t.shared(pixels_at // 4 + thread, thread < P, 16)
    live = first < P
    k_first, k_end = _dense_reached_steps(first, P, OW, sh, band_pad, KH, dh, band_h, W)
    for c0 in range(0, pg, c["DENSE_CHANNELS"]):
        grad_chunk = n * gsn + (group * pg + c0) * gsc + band_top * gsh
        input_chunk = n * isn + (group * pg + c0) * isc + band_y * ish
        if last:
            _dense_rows(t, thread, threads, 0, grad_at, channel_stride, c["DENSE_PIXELS"], P, 8, grad_chunk, OW, gsh,
                        gsw, gsc, pg - c0, vectors, es)
            _dense_rows(t, thread, threads, 1, input_at, channel_stride, 16 * q_steps, Q, 8, input_chunk, W, ish, isw,
                        isc, pg - c0, vectors, es, most_rows=16 * most_q_steps)
        else:  # dense_stage_planes: 8 threads a channel
            for tensor, at, chunk, stride, words, most_words, map_w, count, steps in (
                    (0, grad_at, grad_chunk, pixel_stride, c["DENSE_PIXELS"] // 2, c["DENSE_PIXELS"] // 2, OW, P,
                     (gsc, gsh, gsw)),
                    (1, input_at, input_chunk, input_stride, 8 * q_steps, 8 * most_q_steps, W, Q, (isc, ish, isw))):
                channel, word = thread // 8, thread % 8 + 8 * _slots(-(-most_words // 8))
                for e in range(2):
                    q = 2 * word + e
                    t.load(tensor, chunk + channel * steps[0] + q // map_w * steps[1] + q % map_w * steps[2],
                           (c0 + channel < pg) & (q < count) & (word < words), es)
                t.shared(at + channel * stride + word, word < words, 4)
        steps = live & (k_first < k_end)
        if last:
            t.matrices(grad_at + first * channel_stride + _fragment_a_rows(lane, channel_stride), steps, 4)
        else:  # oplib_load_fragment_a_transposed
            t.matrices(grad_at + first // 2 + (lane % 8 + 8 * (lane // 16)) * pixel_stride + 4 * (lane // 8 % 2),
                       steps, 4)
        for k in range(most_q_steps):
            steps = live & (k >= k_first) & (k < k_end)
            if last:
                t.matrices(input_at + 16 * k * channel_stride + _fragment_b_rows(lane, channel_stride, 8 * channel_stride),
                           steps, 4)
            else:  # dense_load_b_transposed
                i = lane // 8
                t.matrices(input_at + 8 * k + (8 * (i % 2) + lane % 8) * input_stride + 4 * (i // 2), steps, 4)
            for h in range(4):
                at = (first + row + 8 * (h // 2)) * product_stride + 16 * k + 8 * (h % 2) + 2 * quad
                if narrow:  # the pair rounded, a 32-bit store
                    t.shared(at // 2, steps, 4)
                    continue
                for _ in range(2 if c0 > 0 else 1):  # the earlier passes' sums read, then the store
                    t.shared(at // 2, steps, 8)
                if c0 > 0:
                    t.fma(steps, 2)
    # the gather: a lane a pixel (a tap where out's stride along pixels is the larger), its entry
    # read once, then per turn the other index's (a broadcast), the product's load where the tap
    # reads the map and grad_weight's store
    pixels_inner = osw <= oskw
    lanes = c["DENSE_GATHER_LANES"]
    index = thread % lanes
    most_outer = taps if pixels_inner else min(OH, band_rows) * OW
    inner, outer = (P, taps) if pixels_inner else (taps, P)
    other = thread // lanes + threads // lanes * _slots(-(-most_outer // (threads // lanes)))
    gathers = (index < inner) & (other < outer)
    p, tap = (index, other) if pixels_inner else (other, index)
    p, tap = torch.where(gathers, p, 0), torch.where(gathers, tap, 0)
    t.shared((taps_at if pixels_inner else pixels_at) // 4 + index, index < inner, 16)
    t.shared((pixels_at if pixels_inner else taps_at) // 4 + other, gathers, 16)
    y, x = p // OW * sh - band_pad + tap // KW * dh, p % OW * sw - pw + tap % KW * dw
    inside = gathers & (y >= 0) & (y < band_h) & (x >= 0) & (x < W)
    t.shared(p * product_stride + (y * W + x).clamp(min=0), inside, 2 if narrow else 4)
    t.store(2, n * osn + group * osg + tap // KW * oskh + tap % KW * oskw + (band_top + p // OW) * osh + p % OW * osw,
            gathers, 4 if wide else es)


def _wide_span_staging(t: _Tally, thread: Tensor, threads: int, group, taps: int, R: int, rows: int,
                       span_stride: int, first_tap: int = 0) -> None:
    """generated_mma.cu's staged_wide_span_rows: ``rows`` span rows from tap ``first_tap`` in float,
    R in whole k-steps of 8 a row, a unit a value (a 4-byte load and store), the block's threads
    along the rows (zeros past the taps and past R, nothing loaded)."""
    steps = 8 * -(-R // 8)
    unit = thread + threads * _slots(-(-rows * steps // threads))
    live = unit < rows * steps
    span_row, r = unit // steps, unit % steps
    tap = first_tap + span_row
    t.load(2, (group * taps + tap) * R + r, live & (tap < taps) & (r < R), 4)
    t.shared(span_row * span_stride + r, live, 4)


def _wide_region(t: _Tally, thread: Tensor, threads: int, plane_at, c0, CH: int, PIXEL: int, pg: int,
                 region: tuple[int, int], pitch: int, split: int, first: tuple, size: tuple[int, int], strides: tuple,
                 vector: bool, staged_at: int, samples: int = 1, present=1, sample_step: int = 0) -> None:
    """generated_mma.cu's staged_wide_region: a region of tensor argument 0 in float, a unit a
    pixel's CH channels (one load where the host says vector, units along a pixel's quarters;
    else CH 4-byte loads, units along a row's columns), one shared store, a pixel PIXEL words at
    ``_staged_region``'s places."""
    region_h, region_w = region
    cs, hs, ws = strides
    units = samples * region_h * region_w * 4
    unit = thread + threads * _slots(-(-units // threads))
    if vector:
        quarter, pixel = unit % 4, unit // 4
        ri, col = pixel // region_w, pixel % region_w
    else:
        col, rest = unit % region_w, unit // region_w
        quarter, ri = rest % 4, rest // 4
    staging = unit < units
    sample = ri // region_h
    i, o = first[0] + ri % region_h, first[1] + col
    channel = c0 + CH * quarter
    in_map = staging & (sample < present) & (i >= 0) & (i < size[0]) & (o >= 0) & (o < size[1])
    at = plane_at + sample * sample_step + channel * cs + i * hs + o * ws
    if vector:
        t.load(0, at // CH, in_map & (channel < pg), 4 * CH)
    else:
        for m in range(CH):
            t.load(0, at + m * cs, in_map & (channel + m < pg), 4)
    place = ri * pitch + (col % 2 * ((region_w + 1) // 2) + col // 2 if split == 2 else col)
    t.shared((staged_at + place * PIXEL + CH * quarter) // CH, staging, 4 * CH)


def _generated_mma_staged_wide(t: _Tally, item: Tensor, launch: Launch) -> None:
    """involution_generated_mma_staged's float32 way (3xTF32: generated_mma.cu's "wide" helpers),
    as ``_generated_mma_staged`` traces the 16-bit one, with what differs: a block takes a chunk
    of 16 channels, at stride 2 of 8 (a thread 4 or 2 of them: CH); every pass stages its own
    span rows, in float, a value a unit (a 4-byte load and store); the region in float, a unit a
    pixel's CH channels (one load where the host says vector, else CH 4-byte loads; one shared
    store), a pixel PIXEL words; per m-tile and k-step of 8 the feature's two channels a pixel
    (one 8-byte load where pairs are words, else two 4-byte loads), per n-tile an 8-byte shared
    load of the span pair and three TF32 products; per kernel row the window's CH channels a
    pixel one shared load, CH multiply-adds per (tap, pixel) pair; the sums stored in float
    (pairs one 8-byte store where the layout allows)."""
    from ..kernels.involution import cuda as involution_cuda

    (C, H, W, G, OH, OW, ph, pw, R, tiles_w, runs_w, N, fold_shift, isn, isc, ish, isw, osn, osc, osh, osw,
     fsn, fsc, fsh, fsw, vector, feature_words) = launch.scalars
    K, S = (int(v) for v in launch.specialisation[:2])
    source = involution_cuda.load_source(involution_cuda.GENERATED_MMA_SOURCE)
    c = source.constants
    taps, pg, threads = K * K, C // G, launch.threads_per_block
    chunk = involution_cuda.generated_mma_staged_forward_chunk(source, launch.dtype, S)
    CH, PIXEL = chunk // 4, c["STAGED_WIDE_HALF_PIXEL"] if S == 2 else c["STAGED_WIDE_PIXEL"]
    tile_h, tile_w = involution_cuda.generated_mma_staged_forward_tile(source, runs_w)
    tile_pixels, sample_rows = tile_h * tile_w, tile_h >> fold_shift
    region_h, region_w = involution_cuda.generated_mma_staged_forward_region(source, K, S, runs_w, (OH, OW))
    pitch = 2 * -(-region_w // 2) if S == 2 else region_w
    odd = -(-region_w // 2) * PIXEL if S == 2 else 0
    tap_stride = tile_pixels + 4
    span_rows, span_stride = 8 * -(-taps // 8), involution_cuda.generated_mma_staged_wide_span_stride(R)
    passes = involution_cuda.generated_mma_staged_forward_passes(K, S, wide=True)
    bias_at = 8 * involution_cuda.generated_mma_staged_forward_pass_tiles(K, S, wide=True) * span_stride
    staged_at = bias_at + span_rows
    region_words = region_h * pitch * PIXEL  # a sample's
    weights_at = staged_at + -(-(region_words << fold_shift) // 4) * 4
    thread, warp, row, quad, group, n0, c0, y0, x0 = _staged_thread(item, launch, G, pg, tiles_w, (tile_h, tile_w),
                                                                    chunk)
    n0 = n0 << fold_shift

    def pass_span_staging(first_a: int, end_a: int) -> None:  # staged_wide_pass_span_rows
        first_tile = first_a * K // 8
        _wide_span_staging(t, thread, threads, group, taps, R, 8 * (-(-end_a * K // 8) - first_tile), span_stride,
                           8 * first_tile)

    pass_span_staging(*passes[0])
    _bias_staging(t, thread, group, taps, span_rows, bias_at, 4)
    _wide_region(t, thread, threads, n0 * isn + group * pg * isc, c0, CH, PIXEL, pg, (region_h, region_w), pitch, S,
                 (S * y0 - ph, S * x0 - pw), (H, W), (isc, ish, isw), vector, staged_at, 1 << fold_shift, N - n0, isn)

    run_x, run_y = row % runs_w, row // runs_w
    ty, tx = warp * (8 // runs_w) + run_y, 4 * run_x
    run_sample, sample_y = ty // sample_rows, ty % sample_rows
    n = n0 + run_sample
    summing = (y0 + sample_y < OH) & (x0 + tx < OW) & (n < N)
    m = warp + 8 * _slots(-(-tile_pixels // 16 // 8))
    live = m < tile_pixels // 16
    for index, (first_a, end_a) in enumerate(passes):
        first_tile = first_a * K // 8
        tiles = -(-end_a * K // 8) - first_tile
        for tt in range(tiles):
            t.shared((bias_at + 8 * (first_tile + tt) + 2 * quad) // 2, live, 8)
        for k0 in range(0, R, 8):
            for h in range(2):
                pixel = 16 * m + row + 8 * h
                py, o = pixel // tile_w, x0 + pixel % tile_w
                sample, i = n0 + py // sample_rows, y0 + py % sample_rows
                inside = live & (i < OH) & (o < OW) & (sample < N)
                _feature_pair_loads(t, sample * fsn + i * fsh + o * fsw, k0 + 2 * quad, inside, R, fsc, feature_words, 4)
            for tt in range(tiles):
                t.shared((8 * tt * span_stride + row * span_stride + 2 * quad + k0) // 2, live, 8)
                t.tf32_products(live, 3)
        for tt in range(tiles):
            for e in range(2):
                tap_place = 8 * tt + 2 * quad + e
                for h in range(2):
                    t.shared(weights_at + tap_place * tap_stride + 16 * m + row + 8 * h,
                             live & (8 * first_tile + tap_place < end_a * K), 4)
        for a in range(first_a, end_a):
            first_tap = weights_at + (a * K - 8 * first_tile) * tap_stride + ty * tile_w + tx
            for b in range(K):  # 16 bytes each (index in 16-byte units)
                t.shared((first_tap + b * tap_stride) // 4, summing, 16)
            window = staged_at + run_sample * region_words + ((S * sample_y + a) * pitch + tx) * PIXEL + CH * quad
            for k in range(S * 3 + K):
                at = window + (k % 2 * odd + k // 2 * PIXEL if S == 2 else k * PIXEL)
                t.shared(at // CH, summing, 4 * CH)
                t.fma(summing, CH * sum(0 <= k - S * p < K for p in range(4)))
        if index + 1 < len(passes):
            pass_span_staging(*passes[index + 1])
    y, x = y0 + sample_y, x0 + tx
    _staged_run_stores(t, n * osn + group * pg * osc + y * osh, c0 + CH * quad, CH, pg, x, 1, OW, (osn, osc, osh, osw),
                       (y < OH) & (n < N), 4)


TRACES: dict[str, Callable[[_Tally, Tensor, Launch], None]] = {
    "involution_forward_last": _forward_last,
    "involution_backward_input_last": _backward_input_last,
    "involution_backward_weight_last": _backward_weight_last,
    "involution_forward_chunked": _forward_chunked,
    "involution_forward_vectors": _forward_vectors,
    "involution_backward_input_vectors": _backward_input_vectors,
    "involution_backward_weight_vectors": _backward_weight_vectors,
    "involution_backward_input_chunked": _backward_input_chunked,
    "involution_backward_weight_chunked": _backward_weight_chunked,
    "involution_generated_forward": _generated_forward,
    "involution_forward": _forward_generic,
    "involution_backward_input": _backward_input_generic,
    "involution_backward_weight": _backward_weight_generic,
    "involution_generated_tile": _generated_tile,
    "involution_generated_mma": _generated_mma,
    "involution_generated_mma_backward_input": _generated_mma_backward_input,
    "involution_generated_mma_backward_input_staged": _generated_mma_backward_input_staged,
    "involution_generated_mma_staged": _generated_mma_staged,
    "involution_generated_mma_backward_generator": _generated_mma_backward_generator,
    "involution_generated_dense_window": _generated_dense_window,
    "involution_generated_dense_window_backward_input": functools.partial(_generated_dense_window, grad_input=True),
    "involution_dense_window_backward_weight": _dense_window_backward_weight,
}
# Tiled kernels: a thread per grid thread (no grid-stride loop), its index block-major.
TILED = {"involution_generated_tile", "involution_generated_mma", "involution_generated_mma_backward_input",
         "involution_generated_mma_backward_input_staged", "involution_generated_mma_staged",
         "involution_generated_mma_backward_generator", "involution_generated_dense_window",
         "involution_generated_dense_window_backward_input", "involution_dense_window_backward_weight"}


def kernel_work(launch: Launch, gpu: GPU = H200, traced_warps: int = TRACED_WARPS) -> KernelWork:
    """Trace ``traced_warps`` warps of ``launch`` (evenly spaced over its grid; every warp of a
    smaller launch) through the kernel's address expressions and scale the counts to all of
    its warps. The work items of a thread are ``thread, thread + grid threads, ...``."""
    if launch.kernel not in TRACES:
        raise KeyError(f"no trace of {launch.kernel}: add one to oplib.testing.device_model.TRACES")
    threads = launch.blocks * launch.threads_per_block
    total = threads if launch.kernel in TILED else launch.scalars[0]
    warps = -(-threads // 32)
    sample = torch.linspace(0, warps - 1, min(warps, traced_warps)).round().long().unique()
    lanes = sample.view(-1, 1) * 32 + torch.arange(32)
    counts: dict[str, float] = {}
    for first in range(0, total, threads):  # grid-stride iterations
        item = lanes + first
        tally = _Tally(item < total, gpu.line_bytes)
        TRACES[launch.kernel](tally, item.clamp(max=total - 1), launch)
        for key, value in tally.counts.items():
            counts[key] = counts.get(key, 0.0) + value
    scale = warps / len(sample)
    return KernelWork(warps=warps, dram_bytes=sum(launch.tensor_bytes), **{k: v * scale for k, v in counts.items()})


# ---------------------------------------------------------------------------------------
# Resources: what ptxas made of a kernel (registers, load widths, loads in flight)
# ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class SassProfile:
    """One kernel instantiation's machine code for one target: ``registers`` per thread,
    static ``shared_bytes``, global load instructions by width in bytes (``loads``: width ->
    count in the code), and ``loads_in_flight``: loads issued, on average, before an
    instruction must wait for one of them (a use of a register a pending load writes), which
    is what one warp keeps outstanding."""

    name: str
    arch: str
    registers: int
    shared_bytes: int
    loads: dict[int, int]
    loads_in_flight: float
    # All instructions of the function over those of the kinds a trace counts (``_TRACED``).
    instruction_ratio: float = 1.0

    @property
    def widest_load(self) -> int:
        return max(self.loads, default=0)


def nvdisasm() -> Optional[str]:
    """The nvdisasm executable (the ``nvidia-cuda-nvdisasm`` wheel, or CUDA's on the PATH), or None."""
    try:
        import nvidia

        for folder in nvidia.__path__:
            for candidate in sorted(Path(folder).glob("cu*/bin/nvdisasm")):
                return str(candidate)
    except ImportError:
        pass
    return shutil.which("nvdisasm")


_LOAD = re.compile(r"^LDG\.E(?:\.(?P<type>U8|S8|U16|S16|64|128))?")
_WIDTHS = {None: 4, "U8": 1, "S8": 1, "U16": 2, "S16": 2, "64": 8, "128": 16}
_REGISTER = re.compile(r"\bR(\d+)(?:\.64)?\b")


def _registers(operand_text: str, width: int = 4) -> set[int]:
    """Registers an operand list names (a ``.64`` pair as two), or, for a load's destination,
    the ``width`` // 4 registers it writes."""
    found = set()
    for match in _REGISTER.finditer(operand_text):
        first = int(match.group(1))
        count = 2 if match.group(0).endswith(".64") else 1
        found.update(range(first, first + max(count, width // 4)))
    return found


# The SASS instructions a trace counts (``KernelWork.instructions``): global and shared memory,
# FP32/FP64 multiply-adds. Tensor-core instructions are overhead here: no trace counts them.
_TRACED = re.compile(r"^(?:LDG|STG|LDS|STS|LDSM|FFMA|DFMA)(?:\.|$)")
_INSTRUCTION = re.compile(r"\s*/\*[0-9a-f]+\*/\s*(?:@!?U?P\w+\s+)?(?P<op>[A-Z][\w.]*)\s*(?P<args>[^;]*);")


# What an instruction inside a loop counts for per enclosing loop (``instruction_ratio``): the
# trip count the static code stands for. Against Nsight Compute's executed instructions over
# the traced ones on an H200 (bench/results/h200/draw4/second/), 4 kept the specialised and
# generated kernels' ratios within about 1.35x of the measured ones; 1 (no weighting)
# overstated the generated forward's fourfold, its one hot loop among much setup code. Each
# loop weighted by its real trips instead (counted by hand for the two tensor-core kernels of
# draw6/'s Nsight Compute table, at that draw's commit) moved both ratios further from the
# measured ones, the grad_input's from 0.82x to 0.72x of it: a loop's SASS holds both sides of
# its runtime-uniform branches (the feature's NCHW and word paths), of which one runs, and
# trips alone miss what the hardware counts. A count that beats this one needs basic blocks'
# executions, not loops' trips. What a fixed weight cannot see, for a kernel change: a path
# added beside a general one raises every launch's ratio, whichever runs (an NCHW staging path
# for the staged forward, left out: 4.77 -> 5.11 for its channels_last rows too), and a loop
# body made longer to run fewer trips reads as a loss (the staged grad_input's m-tiles over the
# formed pixels: 6.42 -> 6.71, where its loops at their real trips lost 7-12% of their
# instructions; channels_last grad_input's staging copied in 4-byte units instead of a value a
# thread: bfloat16 4.21 -> 4.28, where its instructions an output row at their real trips fell
# 10-21% over RedNet-50's stride-1 stages); a layout as a template argument, one way's code
# an instantiation, would let the ratio see only the path that runs. And an unrolled loop's
# copies of an inner loop count 4 trips each: the staged forward's kernel rows split into two
# passes (three at stride 2) put two (three) copies of its aggregation loop at 4 trips each
# where the rows' 7 trips ran before as one, and its static ratio fell 4.07 -> 3.13, where its
# instructions at their real trips rose 8-14%. A rolled loop that runs more than 4 times weighs
# too little: the 16-bit staged grad_input's sums over its 7 kernel rows, rolled, put its
# bfloat16 channels_last ratio at 4.93, unrolled (as they are) at 3.88, with about the same
# instructions at their real trips. The other way round: the 16-bit generator gradients' band
# products unrolled over a fixed window's n-tiles (each store's tap its lane's and a constant,
# the taps no lane meets left out at compile time) run about 35 instructions a warp and kernel
# row where they ran 128 (7x7 at stride 1; about 50 where 216 at stride 2: the SASS's
# first-chunk path, counted by hand; the largest part of a group's instructions), and its split
# takes 2 rows a barrier: the static ratio fell only 7.53 -> 7.43 (a rolled loop of 3 trips had
# weighed 4, its stores with it). Its float32 (3xTF32) band products unrolled the same way, two
# products to a warp vote: a kernel row's product loop on sm_90 (hand count) fell about a fifth
# (7x7 at stride 1, tiles 16 wide, 513 -> 426 instructions; at stride 2, 855 -> 662), and the
# static ratio 8.62 -> 7.42 (the rolled loop of live tiles it replaced, a vote and a cold block
# a product, had weighed 4 where it ran 2 or 3 trips).
LOOP_TRIPS = 4
_LABEL = re.compile(r"^\s*(\.L_x_\d+):")
_TARGET = re.compile(r"`\((\.L_x_\d+)\)")


# Where a subroutine (a __noinline__ device function: oplib's are the kernels' cold fallbacks,
# the direct sums for an inf or a nan) begins inside a kernel's SASS: its entry label,
# ``$<kernel>$<function>:``, after the kernel's own code.
_SUBROUTINE = re.compile(r"^\s*\$\S+:\s*$", re.MULTILINE)


def kernel_code(sass: str) -> str:
    """One kernel's SASS text without the subroutines nvdisasm lists after it: what the kernel
    runs when no fallback is taken. (Counted in, the grad_input on tensor cores' direct sums,
    four loops deep, had put its instruction ratio at half what Nsight Compute measured.)"""
    return _SUBROUTINE.split(sass, maxsplit=1)[0]


# A block of source that runs only for rare inputs (an inf or a nan), kept inline where a call
# spilled: its ``if (...) {`` line ends in this marker, and the model leaves the SASS compiled
# from the block out, as kernel_code leaves the subroutines out. (Counted in, the generator's
# inline direct sums, sixteen small loops inside its loop over the groups, weighed as much as
# its products.)
_COLD = re.compile(r"//\s*oplib-cold\b")
# nvdisasm -g -gi's location of the instructions after it: the line, and the call sites it is
# inlined at, innermost first.
_LOCATION = re.compile(r'^\s*//## File "(?P<file>[^"]+)", line (?P<line>\d+)(?P<inlined>.*)$')
_INLINED = re.compile(r'inlined at "([^"]+)", line (\d+)')


def cold_lines(text: str) -> frozenset[int]:
    """The lines (from 1) of ``text``'s cold blocks: from each line marked ``// oplib-cold``,
    which opens a block, to the line of the brace that closes it (comments aside)."""
    lines = text.splitlines()
    cold: set[int] = set()
    for first, line in enumerate(lines):
        if not _COLD.search(line):
            continue
        depth = 0
        for last in range(first, len(lines)):
            code = lines[last].split("//", 1)[0]
            depth += code.count("{") - code.count("}")
            if last == first and depth <= 0:
                raise ValueError(f"line {first + 1} is marked oplib-cold but opens no block: {line.strip()!r}")
            if depth <= 0:
                break
        else:
            raise ValueError(f"the cold block of line {first + 1} does not close")
        cold.update(range(first + 1, last + 2))
    return frozenset(cold)


def _callee(args: str) -> str:
    """The name of the function a SASS CALL's operand names (`($kernel$_Z15mma_direct_sumsI...)`:
    the last symbol's length-prefixed name)."""
    symbol = args.strip(" `()").split("$")[-1]
    length = re.match(r"_Z(\d+)", symbol)
    return symbol[length.end():length.end() + int(length.group(1))] if length else symbol


def cold_functions(text: str) -> frozenset[str]:
    """The ``__noinline__`` functions of ``text`` called from its cold blocks only: a kernel's
    SASS calls them (their code lies among the subroutines ``kernel_code`` leaves out), and
    nvdisasm may give such a call the line of an inlined caller's call site instead of the
    cold block's."""
    cold = cold_lines(text)
    lines = text.splitlines()
    names = set(re.findall(r"__noinline__\s+\w+\s+(\w+)\s*\(", text))
    result = set()
    for name in names:
        sites = [at for at, line in enumerate(lines, 1) if re.search(rf"\b{name}\s*[<(]", line)
                 and not re.search(rf"__noinline__\s+\w+\s+{name}\s*\(", line)]
        if sites and all(at in cold for at in sites):
            result.add(name)
    return frozenset(result)


def outside_calls(code: str, cold_callees: frozenset[str]) -> set[str]:
    """The functions ``code`` (one kernel's SASS, ``hot_code``'s) calls that are neither cold
    (``cold_callees``) nor the compiler's own routines (``__cuda_sm20_div_s64`` and the like,
    uncounted as ever). A CALL to a label of the kernel's own code is no call: ptxas leaves a
    loop that holds warp-synchronous code by ``@P0 CALL.REL.NOINC `(.L_x_25)`; BRA
    `(.L_x_26)`; .L_x_25:`` on sm_80 and sm_89 (NOINC: no return address kept), a conditional
    jump to the label after the loop's back branch, where sm_90's code branches. Counted as calls,
    they had kept the model off involution_last.cu's forward and grad_weight and the staged
    kernels' float32 code on both."""
    return {callee for op, args in _INSTRUCTION.findall(code)
            if op.startswith("CALL") and not _TARGET.search(args)
            and not (callee := _callee(args)).startswith("__cuda") and callee not in cold_callees}


def hot_code(sass: str, cold: dict[str, frozenset[int]]) -> str:
    """``sass`` (nvdisasm -g -gi's text) without the instructions compiled from a cold block:
    those whose line, or a call site they are inlined at, lies in ``cold[the file's name]``.
    Labels and branches stay, so that the loops around the rest stay whole."""
    kept, is_cold = [], False
    for line in sass.splitlines():
        location = _LOCATION.match(line)
        if location is not None:
            frames = [(location["file"], location["line"]), *_INLINED.findall(location["inlined"])]
            is_cold = any(int(at) in cold.get(Path(file).name, ()) for file, at in frames)
            continue
        if not (is_cold and _INSTRUCTION.match(line)):
            kept.append(line)
    return "\n".join(kept)


def instruction_ratio(sass: str, loop_trips: float = LOOP_TRIPS) -> float:
    """All instructions of one function's SASS text over those a trace counts (``_TRACED``),
    NOPs aside, each weighted by ``loop_trips`` per loop around it (a backward branch and the
    code from its target): what the instructions around the traced ones (index arithmetic,
    conversions, branches) cost per traced one when the loops run."""
    instructions, labels, pending = [], {}, []
    for line in sass.splitlines():
        if (label := _LABEL.match(line)) is not None:
            pending.append(label.group(1))
        elif (match := _INSTRUCTION.match(line)) is not None:
            labels.update(dict.fromkeys(pending, len(instructions)))
            pending = []
            instructions.append((match.group("op"), match.group("args")))
    loops = [(labels[target.group(1)], at) for at, (op, args) in enumerate(instructions)
             if op.startswith("BRA") and (target := _TARGET.search(args)) and labels.get(target.group(1), at + 1) <= at]
    everything = traced = 0.0
    for at, (op, _) in enumerate(instructions):
        if op == "NOP":
            continue
        weight = loop_trips ** sum(1 for first, last in loops if first <= at <= last)
        everything += weight
        traced += weight if _TRACED.match(op) else 0.0
    return everything / max(traced, 1.0)


def _profile_function(sass: str) -> tuple[dict[int, int], float]:
    """Loads by width and loads in flight (issued per wait) of one function's SASS text."""
    loads: dict[int, int] = {}
    pending: set[int] = set()
    issued = waits = 0
    for line in sass.splitlines():
        match = _INSTRUCTION.match(line)
        if match is None:
            continue
        op, args = match.group("op"), match.group("args")
        destination, _, sources = args.partition(",")
        if op.startswith(("ST", "RED", "ATOM", "BRA", "EXIT", "RET", "ISETP", "FSETP")):
            sources = args  # no register destination: every register named is read
        if pending & _registers(sources):
            waits += 1
            pending.clear()
        load = _LOAD.match(op)
        if load:
            width = _WIDTHS[load.group("type")]
            loads[width] = loads.get(width, 0) + 1
            pending |= _registers(destination, width)
            issued += 1
    return loads, issued / max(waits, 1)


@functools.cache
def sass_profile(source_name: str, instantiations: tuple[tuple[str, torch.dtype, tuple[str, ...]], ...],
                 arch: str = "sm_90") -> dict[str, SassProfile]:
    """Compile ``instantiations`` ((kernel, dtype, specialisation) tuples) of the source
    ``source_name`` (as ``load_source`` names it) for ``arch`` with NVRTC and CuPy's options,
    disassemble the cubin with nvdisasm, and profile each: name expression -> SassProfile. The
    compile keeps line information (``-lineinfo``, the same machine code) so that the code of the
    source's cold blocks (``cold_lines``) is left out with the subroutines; a kernel that calls a
    function of the source outside its cold blocks is refused (that code lies among the
    subroutines)."""
    from ..kernels.cuda_source import INCLUDE_DIR, load_source, name_expression
    from .nvrtc import compile_source

    tool = nvdisasm()
    if tool is None:
        raise RuntimeError("nvdisasm not found: pip install nvidia-cuda-nvdisasm")
    names = tuple(name_expression(*instantiation) for instantiation in instantiations)
    source = load_source(source_name)
    compiled = compile_source(source, arch, extra_options=("-lineinfo",), names=names)
    lowered, log, cubin = compiled.lowered_names, compiled.log, compiled.cubin
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "kernels.cubin"
        path.write_bytes(cubin)
        sass = subprocess.run([tool, "-c", "-g", "-gi", str(path)], check=True, capture_output=True, text=True).stdout
    cold = {source.path.name: cold_lines(source.text),
            **{header.name: cold_lines(header.read_text()) for header in sorted(INCLUDE_DIR.glob("*.cuh"))}}
    cold_callees = cold_functions(source.text)
    functions = dict(zip(*[iter(re.split(r"^\s*\.text\.(\S+):\s*$", sass, flags=re.MULTILINE)[1:])] * 2))
    reports = {m.group(1): m.group(2) for m in re.finditer(
        r"Compiling entry function '(\w+)' for '\w+'(.*?)(?=Compiling entry function|\Z)", log, re.DOTALL)}
    profiles = {}
    for name in names:
        mangled = lowered[name]
        code = hot_code(kernel_code(functions[mangled]), cold)
        outside = outside_calls(code, cold_callees)
        if outside:  # their code lies among the subroutines kernel_code leaves out
            raise ValueError(f"{name} calls {sorted(outside)} outside its cold blocks: the model "
                             "counts a kernel's own code only")
        loads, in_flight = _profile_function(code)
        report = reports[mangled]
        shared = re.search(r"(\d+) bytes smem", report)
        profiles[name] = SassProfile(name, arch, int(re.search(r"Used (\d+) registers", report).group(1)),
                                     int(shared.group(1)) if shared else 0, loads, in_flight, instruction_ratio(code))
    return profiles


# ---------------------------------------------------------------------------------------
# Time
# ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Constants:
    """The model's fitted constants, each with a physical reading:

    - ``request_cycles``: cycles an SM's load/store pipe spends per warp-level memory
      instruction (address generation and issue);
    - ``line_cycles``: cycles the L1 spends per 128-byte line an instruction touches (its tag
      and data stages: the cost of scattered lanes);
    - ``latency_cycles``: the mean latency of a load, as Little's law sees it (a mix of L1 and
      L2 hits and DRAM);
    - ``launch_seconds``: the floor of one kernel in a CUDA graph (launch, first and last
      wave's ramp);
    - ``dependent_issue_cycles``: the mean cycles between two instructions of one warp (the
      latency of the results each waits for, over the independent instructions between): a
      scheduler holding fewer warps than this leaves issue slots empty.
    """

    request_cycles: float
    line_cycles: float
    latency_cycles: float
    launch_seconds: float
    dependent_issue_cycles: float = 1.0


# Where ``fit`` searches: bounds that keep each constant physical (a request costs at least
# one issue slot and at most the 8 of a fully serialised one; a latency between an L1 hit's
# and DRAM's; a launch floor a graph-launched kernel shows).
BOUNDS = {
    "request_cycles": (0.5, 8.0),
    "line_cycles": (0.25, 8.0),
    "latency_cycles": (30.0, 1000.0),
    "launch_seconds": (1e-6, 5e-6),
    # From back-to-back independent instructions (1) to every one waiting on a shared-memory
    # load's latency (about 30 cycles on Hopper).
    "dependent_issue_cycles": (1.0, 32.0),
}


@dataclass(frozen=True)
class LaunchInputs:
    """What ``predict`` needs of one launch, as plain numbers (what bench/results/cuda-model.json
    keeps): the instantiation, its launch shape and machine code, and its traced work."""

    kernel: str
    blocks: int
    threads_per_block: int
    shared_bytes: int
    registers: int
    loads_in_flight: float
    widest_load: int
    work: KernelWork
    instruction_ratio: float = 1.0

    @staticmethod
    def of(launch: Launch, profile: SassProfile, gpu: GPU = H200) -> LaunchInputs:
        return LaunchInputs(launch.name, launch.blocks, launch.threads_per_block,
                            launch.shared_bytes + profile.shared_bytes, profile.registers, profile.loads_in_flight,
                            profile.widest_load, kernel_work(launch, gpu), profile.instruction_ratio)

    def to_json(self) -> dict:
        return dataclasses.asdict(self)

    @staticmethod
    def from_json(data: dict) -> LaunchInputs:
        return LaunchInputs(**{**data, "work": KernelWork(**data["work"])})


@dataclass(frozen=True)
class Terms:
    """One launch's time terms in seconds (the launch floor aside), and the one that binds."""

    dram: float
    l1: float
    latency: float
    fma: float
    shared: float = 0.0
    issue: float = 0.0
    tensor: float = 0.0

    @property
    def bound(self) -> str:
        return max(("dram", "l1", "latency", "fma", "shared", "issue", "tensor"), key=lambda name: getattr(self, name))

    @property
    def seconds(self) -> float:
        return max(self.dram, self.l1, self.latency, self.fma, self.shared, self.issue, self.tensor)


def launch_terms(inputs: LaunchInputs, gpu: GPU, constants: Constants, dram_bytes_per_s: float) -> Terms:
    """The time terms of one launch on ``gpu`` (see the module docstring).

    The busiest SM runs ``ceil(blocks / SMs)`` blocks (the tail of the last wave), in waves of
    the blocks that fit at once (``resident_blocks``); its share of the launch's requests and
    lines passes its load/store pipe and L1; each wave takes, by Little's law, the dependent
    round trips of a warp (its loads over the loads it keeps in flight) times the latency."""
    work = inputs.work
    resident = resident_blocks(inputs.registers, inputs.threads_per_block, inputs.shared_bytes, gpu)
    if resident == 0:
        raise ValueError(f"{inputs.kernel}: no block of {inputs.threads_per_block} threads fits on an SM of {gpu.name}")
    per_sm = -(-inputs.blocks // gpu.sms)
    share = per_sm / inputs.blocks
    waves = -(-per_sm // resident)
    pipe = max((work.load_requests + work.store_requests) * constants.request_cycles,
               work.lines * constants.line_cycles)
    round_trips = work.load_requests / work.warps / max(inputs.loads_in_flight, 1.0)
    # the warps the busiest SM holds at once: a grid of fewer blocks than its SMs can hold
    # leaves them fewer than its occupancy allows
    warps_per_scheduler = min(resident, per_sm) * -(-inputs.threads_per_block // 32) / _SCHEDULERS
    cycles_per_instruction = max(1.0, constants.dependent_issue_cycles / warps_per_scheduler)
    return Terms(
        dram=work.dram_bytes / dram_bytes_per_s,
        l1=share * pipe / gpu.clock_hz,
        latency=waves * round_trips * constants.latency_cycles / gpu.clock_hz,
        fma=share * work.fma_requests * 32 / (gpu.fma_per_clock * gpu.clock_hz),
        shared=share * work.shared_wavefronts / (gpu.shared_wavefronts_per_clock * gpu.clock_hz),
        issue=share * work.instructions * inputs.instruction_ratio * cycles_per_instruction / (_SCHEDULERS * gpu.clock_hz),
        tensor=share * work.tensor_macs / (gpu.tensor_macs_per_clock * gpu.clock_hz),
    )



def predict(events: Sequence[Any], gpu: GPU, constants: Constants, dram_bytes_per_s: Optional[float] = None) -> float:
    """Seconds of device time of a call: its launches (``LaunchInputs``) and torch's copies
    around them (``Copy``: bytes over the DRAM bandwidth), each with the launch floor.
    ``dram_bytes_per_s``: the effective DRAM bandwidth (default: ``DRAM_FRACTION`` of the peak)."""
    bandwidth = dram_bytes_per_s or DRAM_FRACTION * gpu.dram_bytes_per_s
    total = 0.0
    for event in events:
        if isinstance(event, Copy):
            total += constants.launch_seconds + event.bytes / bandwidth
        else:
            total += constants.launch_seconds + launch_terms(event, gpu, constants, bandwidth).seconds
    return total


# The fraction of the datasheet's DRAM bandwidth a device-to-device copy reaches, where no run
# measured it: the H200 run of bench/results/involution-cuda.md measured its copy bandwidth,
# and bench/cuda_model.py passes that (and this ratio of it, for an H100).
DRAM_FRACTION = 0.6


def fit(rows: Sequence[tuple[Sequence[Any], float]], gpu: GPU, dram_bytes_per_s: float,
        bounds: dict[str, tuple[float, float]] = BOUNDS) -> Constants:
    """The constants that minimise the sum of squared log(predicted / measured) over ``rows``
    ((events, measured seconds) pairs), within ``bounds``: a pattern search in log space from
    the middle of the box, halving its step until it is below 0.1 %. Deterministic.

    The latency enters only through rows that are latency-bound, so a table whose rows all
    bind elsewhere leaves it free below some value: it is then set to the largest latency
    whose loss is within ``LATENCY_SLACK`` of the best (bisection), the most pessimistic one
    the table allows, rather than to wherever the search stopped."""
    names = [field.name for field in dataclasses.fields(Constants)]
    low = [math.log(bounds[name][0]) for name in names]
    high = [math.log(bounds[name][1]) for name in names]

    def loss(point: Sequence[float]) -> float:
        constants = Constants(*(math.exp(v) for v in point))
        return sum(math.log(predict(events, gpu, constants, dram_bytes_per_s) / measured) ** 2
                   for events, measured in rows)

    point = [(lo + hi) / 2 for lo, hi in zip(low, high)]
    best, step = loss(point), 1.0
    while step > 1e-3:
        improved = False
        for index, sign in itertools.product(range(len(point)), (1, -1)):
            trial = list(point)
            trial[index] = min(high[index], max(low[index], trial[index] + sign * step))
            value = loss(trial)
            if value < best - 1e-12:
                point, best, improved = trial, value, True
        if not improved:
            step /= 2
    latency = names.index("latency_cycles")
    below, above = point[latency], high[latency]
    if loss([*point[:latency], above, *point[latency + 1:]]) <= best * (1 + LATENCY_SLACK):
        below = above
    while above - below > 1e-3:
        middle = (below + above) / 2
        if loss([*point[:latency], middle, *point[latency + 1:]]) <= best * (1 + LATENCY_SLACK):
            below = middle
        else:
            above = middle
    point[latency] = below
    return Constants(*(math.exp(v) for v in point))


# How much worse than the best fit the latency may make the loss (see ``fit``).
LATENCY_SLACK = 0.01
