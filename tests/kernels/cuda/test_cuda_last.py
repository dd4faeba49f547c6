"""A lane a 16-byte vector of a group's channels in channels_last calls (the ``LAST`` policy,
DCNv4's mapping). involution_last.cu's forward (two adjacent pixels a lane, or one, the warp's
weights staged in shared memory) and grad_weight (two adjacent pixels a lane, or one, the group
summed by shuffles) through the host emulation, each pixel count, the warps one after another
and in turns: against the float64 reference on random geometries (every instantiation and dtype, any padding, groups of 2
to 32 lanes, partial last warps, weights aligned to a vector and not, odd widths: a pair with a
pixel past the row; warps that take part of a pair's groups), the forward bit for bit
against involution.cu's chunked kernel, infinite values at taps outside the image, the
registry's samples and the calls they decline, the ops' dispatch under the policy,
AddressSanitizer, and planted bugs these checks catch; and on a GPU. grad_input (a block a
segment of a band of input rows, for each output row the band's kernel rows of its weights
staged in shared memory) likewise, bit for bit against the chunked kernel; where it declines,
the chunked kernel at one vector a thread, with the ops' bits."""

from __future__ import annotations

import dataclasses
import random
from dataclasses import dataclass
from typing import Callable, Optional

import pytest
import torch

from oplib import registry
from oplib.kernels import CUDA_DISPATCH, load_source
from oplib.kernels.cuda_launch import BLOCK_SIZE
from oplib.kernels.involution import cuda as involution_cuda
from oplib.kernels.involution.layouts import as_pixel_major, is_pixel_major, weight_result
from oplib.testing import assert_matches_reference, device_model
from oplib.testing.cuda_emulation import INTERLEAVED, ORDERS, EmulatedLauncher
from oplib.testing.toolchain import require_host_compiler

from cuda_test_helpers import _planted, assert_asan_catches, assert_clean_under_asan

LAST = torch.channels_last


@dataclass(frozen=True)
class Kind:
    """One of the source's kernels: its name, the op whose reference it is checked against, the
    host function that launches it and the pixels of a row a lane takes (None: the kernel has
    no choice)."""

    kernel: str
    op: str
    launch: Callable
    pixels: Optional[int] = None

    @property
    def grad_weight(self) -> bool:
        return self.op == "involution_backward_weight"

    @property
    def grad_input(self) -> bool:
        return self.op == "involution_backward_input"


# The forward and grad_weight with a lane's pixels fixed (``last_pixels``), so that each kind
# launches its own pixels whatever the launcher: on a GPU the host's choice would take a pixel a
# lane at every small random geometry, and the pairs would go untested there.
PAIRS, ONE_PIXEL = involution_cuda.LAST_PAIRS, involution_cuda.LAST_ONE_PIXEL


def _with_policy(launch: Callable, policy: involution_cuda.LaunchPolicy) -> Callable:
    """``launch`` (a host function taking ``out``, then ``launcher``, which a GPU call leaves
    out, then ``policy``) under ``policy``."""
    return lambda *args: launch(*args, policy=policy)


FORWARD = Kind("involution_forward_last", "involution", _with_policy(involution_cuda.involution_last, PAIRS), 2)
GRAD_WEIGHT = Kind("involution_backward_weight_last", "involution_backward_weight",
                   _with_policy(involution_cuda.involution_last_backward_weight, PAIRS), 2)
FORWARD_ONE = Kind(FORWARD.kernel, FORWARD.op, _with_policy(involution_cuda.involution_last, ONE_PIXEL), 1)
GRAD_WEIGHT_ONE = Kind(GRAD_WEIGHT.kernel, GRAD_WEIGHT.op,
                       _with_policy(involution_cuda.involution_last_backward_weight, ONE_PIXEL), 1)
GRAD_INPUT = Kind("involution_backward_input_last", "involution_backward_input",
                  involution_cuda.involution_last_backward_input)
KINDS = {"forward": FORWARD, "forward, a pixel a lane": FORWARD_ONE, "grad_weight": GRAD_WEIGHT,
         "grad_weight, a pixel a lane": GRAD_WEIGHT_ONE, "grad_input": GRAD_INPUT}


def _specialisations(kind: Kind) -> set[tuple[str, ...]]:
    """The kernel's instantiations that ``kind`` launches: those of its pixels a lane."""
    return {s for s in load_source(involution_cuda.LAST_SOURCE).specialisations[kind.kernel]
            if kind.pixels is None or s[2] == str(kind.pixels)}


def _instantiations(kind: Kind = GRAD_WEIGHT) -> list[tuple[int, int]]:
    """(kernel size, stride) of each instantiated window."""
    return sorted({(int(s[0]), int(s[1])) for s in _specialisations(kind)})


def _result(args: tuple, kind: Kind = GRAD_WEIGHT) -> torch.Tensor:
    """The result the op allocates for ``args`` (the op's arguments): pixel-major for
    grad_weight, channels_last for the forward and grad_input."""
    if kind.grad_weight:
        grad_output, input, kernel_size, *_, groups = args
        return weight_result(grad_output, (input.shape[0], groups, *kernel_size, *grad_output.shape[2:]), True)
    if kind.grad_input:
        grad_output, _, input_size = args[:3]
        return grad_output.new_empty(*grad_output.shape[:2], *input_size).to(memory_format=LAST)
    input, weight = args[:2]
    return input.new_empty(input.shape[0], input.shape[1], *weight.shape[4:]).to(memory_format=LAST)


def _case(rng: random.Random, kernel: int, stride: int, dtype: torch.dtype, kind: Kind = GRAD_WEIGHT) -> tuple:
    """The op's arguments for random channels_last operands of one instantiated window (the
    weight pixel-major): 16, 32 or 64 channels a group (2 to 32 lanes; at 64 the warp's records
    start off a vector's alignment at K = 3 and 5), one to three groups (grad_input: one, two or
    four, a pixel's vectors a power of two; up to 256 channels, a segment of one pixel), any
    padding on either axis, sizes from one output pixel up (work items rarely a multiple of a
    warp; rows rarely a multiple of grad_input's segment); grad_input's 16-bit weights of an
    even count of values (two samples where one would give an odd count, which it declines)."""
    groups, per_group = rng.choice([1, 2, 4] if kind.grad_input else [1, 2, 3]), rng.choice([16, 16, 32, 64])
    pad = [rng.randint(0, kernel - 1), rng.randint(0, kernel - 1)]
    height = max(rng.randint(1, 9), kernel - 2 * pad[0])
    width = max(rng.randint(1, 9), kernel - 2 * pad[1])
    n = rng.choice([1, 2])
    out_h, out_w = (height + 2 * pad[0] - kernel) // stride + 1, (width + 2 * pad[1] - kernel) // stride + 1
    if kind.grad_input and dtype.itemsize == 2 and n * groups * out_h * out_w % 2:
        n = 2
    channels = groups * per_group
    input = torch.randn(n, channels, height, width, dtype=dtype).to(memory_format=LAST)
    window = ([stride, stride], pad, [1, 1])
    if kind.grad_weight:
        grad_output = torch.randn(n, channels, out_h, out_w, dtype=dtype).to(memory_format=LAST)
        return grad_output, input, [kernel, kernel], *window, groups
    weight = as_pixel_major(torch.randn(n, groups, kernel, kernel, out_h, out_w, dtype=dtype))
    if kind.grad_input:
        grad_output = torch.randn(n, channels, out_h, out_w, dtype=dtype).to(memory_format=LAST)
        return grad_output, weight, [height, width], *window
    return input, weight, *window


def _chunked(kind: Kind, args: tuple, launcher=None) -> torch.Tensor:
    """involution.cu's chunked forward or grad_input on the same call (the ``CHUNKED`` policy),
    through ``launcher`` (default: the emulation; on a GPU, None, CuPy's)."""
    launcher = EmulatedLauncher() if launcher is None and args[0].device.type == "cpu" else launcher
    if kind.grad_input:
        return involution_cuda.involution_backward_input(*args, _result(args, kind), launcher, involution_cuda.CHUNKED)
    return involution_cuda.involution(*args, _result(args, FORWARD), launcher, involution_cuda.CHUNKED)


def _check_random(launcher, cases: int, seed: int, dtypes=registry.FLOAT_DTYPES, kind: Kind = GRAD_WEIGHT) -> set:
    """``cases`` random geometries per instantiation and dtype against the float64 reference
    (the forward and grad_input also against the chunked kernel's bits); returns the
    instantiations launched."""
    rng, spec = random.Random(seed), registry.get(kind.op)
    for kernel, stride in _instantiations(kind):
        for dtype in dtypes:
            for case in range(cases):
                args = _case(rng, kernel, stride, dtype, kind)
                out = kind.launch(*args, _result(args, kind), launcher)
                assert out is not None
                name = f"k{kernel}-s{stride}-{dtype}-{case}"
                assert_matches_reference(spec, registry.SampleInput(args, name), out, dtype)
                if kind.grad_weight:
                    assert is_pixel_major(out)
                else:
                    assert out.is_contiguous(memory_format=LAST) and torch.equal(out, _chunked(kind, args)), name
    return {(launch[0], launch[4]) for launch in launcher.launches}


def test_the_block_is_the_launch_size():
    """The kernel's warps and staging are sized by LAST_THREADS, the block every grid-stride
    launch takes."""
    assert load_source(involution_cuda.LAST_SOURCE).constants["LAST_THREADS"] == BLOCK_SIZE


@pytest.mark.parametrize("order", [ORDERS[0], INTERLEAVED])
@pytest.mark.parametrize("kind", KINDS)
def test_last_matches_the_reference(kind, order):
    """Every instantiation, every dtype, random geometries: the float64 reference, and for the
    forward the chunked kernel's very bits (the same taps added in the same order); the warps
    run one after another, and in turns (a warp's staging that runs into the next warp's shows
    only there: the forward's did, at three groups of 16 channels)."""
    require_host_compiler()
    kind = KINDS[kind]
    launched = _check_random(EmulatedLauncher(order=order), cases=3, seed=5, kind=kind)
    assert launched == {(kind.kernel, s) for s in _specialisations(kind)}


def test_every_grouping_and_both_copies_are_exercised():
    """The random cases above reach 2 to 32 lanes a group, and warps whose results start off a
    16-byte boundary (the value-a-lane copy) as well as on one."""
    rng, parts, misaligned = random.Random(5), set(), set()
    source = load_source(involution_cuda.LAST_SOURCE)
    for kernel, stride in _instantiations():
        for dtype in registry.FLOAT_DTYPES:
            for _ in range(3):
                grad_output, input, *_, groups = _case(rng, kernel, stride, dtype)
                p = involution_cuda.last_parts(source, input.shape[1], groups, dtype)
                parts.add(p)
                misaligned.add((32 // p) * kernel * kernel * dtype.itemsize % 16 != 0)
    assert {2, 4, 8, 16, 32} <= parts and misaligned == {True, False}


def pairs_of_many_groups():
    """(name, the forward's arguments on the CPU) where a warp takes part of a pair's groups: 32
    groups of 16 channels (RedNet-50's stage 4; a warp half a pair's in bfloat16, a quarter in
    float32) and 5 (a warp's units straddle pairs, from a group past the first pair's first to
    one before the last pair's last), an odd width (a last pair of one pixel), every
    instantiation and dtype. Staged as the span from the warp's first record to its last, these
    warps overran their staging (a crash in the emulation)."""
    for kernel, stride in _instantiations(FORWARD):
        for dtype in registry.FLOAT_DTYPES:
            for groups in (5, 32):
                generator = torch.Generator().manual_seed(groups * 100 + kernel * 10 + stride)
                pad = (kernel - 1) // 2
                input = torch.randn(2, groups * 16, 3, 5, dtype=dtype, generator=generator)
                out_h, out_w = (3 + 2 * pad - kernel) // stride + 1, (5 + 2 * pad - kernel) // stride + 1
                weight = torch.randn(2, groups, kernel, kernel, out_h, out_w, dtype=dtype, generator=generator)
                yield (f"k{kernel}-s{stride}-{dtype}-{groups}-groups",
                       (input.to(memory_format=LAST), as_pixel_major(weight), [stride, stride], [pad, pad], [1, 1]))


def _check_pairs_of_many_groups(launcher, device: str = "cpu") -> None:
    """The forward on ``pairs_of_many_groups``, two pixels a lane and one: the float64 reference
    and the chunked kernel's bits."""
    spec = registry.get(FORWARD.op)
    for name, cpu_args in pairs_of_many_groups():
        args = tuple(a.to(device) if isinstance(a, torch.Tensor) else a for a in cpu_args)
        for kind in (FORWARD, FORWARD_ONE):
            out = kind.launch(*args, _result(args, FORWARD), launcher)
            assert out is not None
            assert_matches_reference(spec, registry.SampleInput(cpu_args, name), out.cpu(), cpu_args[0].dtype)
            assert torch.equal(out, _chunked(FORWARD, args)), (name, kind.pixels)


@pytest.mark.parametrize("order", [ORDERS[0], INTERLEAVED])
def test_the_forward_stages_warps_that_take_part_of_a_pair(order):
    _check_pairs_of_many_groups(EmulatedLauncher(order=order))


def _infinite_grad_output(launcher, dtypes=registry.FLOAT_DTYPES) -> None:
    """An infinite grad_output in one channel at the corner pixel: its taps inside the image
    are infinite, with the chunked kernel's signs, and those outside are +0 (bits zero), what
    the chunked kernel writes; never NaN (a tap outside reads some pixel, not zeros)."""
    for dtype in dtypes:
        bits = {2: torch.int16, 4: torch.int32, 8: torch.int64}[dtype.itemsize]
        for kernel, stride in _instantiations():
            pad = kernel // 2
            x = torch.randn(1, 32, 12, 10, dtype=dtype)
            g = torch.randn(1, 32, (12 + 2 * pad - kernel) // stride + 1, (10 + 2 * pad - kernel) // stride + 1,
                            dtype=dtype)
            g[0, 21, 0, 0] = float("inf")
            args = (g.to(memory_format=LAST), x.to(memory_format=LAST), [kernel, kernel], [stride, stride], [pad, pad],
                    [1, 1], 2)
            expected = involution_cuda.involution_backward_weight(*args, _result(args), EmulatedLauncher(),
                                                                  involution_cuda.CHUNKED)
            for kind in (GRAD_WEIGHT, GRAD_WEIGHT_ONE):
                case = (dtype, kernel, stride, kind.pixels)
                out = kind.launch(*args, _result(args), launcher)
                assert torch.isinf(expected).any() and not torch.isnan(out).any(), case
                assert torch.equal(torch.isinf(out), torch.isinf(expected)), case
                infinite = torch.isinf(expected)
                assert torch.equal(out[infinite], expected[infinite])
                zero = expected.view(bits) == 0
                assert zero.any() and torch.equal(out.view(bits)[zero], expected.view(bits)[zero]), case


def sixteen_bit_weight_views(samples: int, offset: int):
    """(name, grad_input's arguments on the CPU) for every instantiation in bfloat16 and
    float16: ``samples`` samples of one group of 16 channels and a 3 x 3 output (9 K^2 values
    of weight a sample: an odd count), the weight a view from value ``offset`` of its storage,
    no padding."""
    for kernel, stride in _instantiations(GRAD_INPUT):
        size = kernel + 2 * stride
        for dtype in (torch.bfloat16, torch.float16):
            generator = torch.Generator().manual_seed(kernel * 10 + stride + offset)
            values = samples * 9 * kernel * kernel
            storage = torch.randn(values + offset, dtype=dtype, generator=generator)
            weight = storage[offset:].view(samples, 3, 3, 1, kernel, kernel).permute(0, 3, 4, 5, 1, 2)
            grad_output = torch.randn(samples, 16, 3, 3, dtype=dtype, generator=generator).to(memory_format=LAST)
            yield (f"k{kernel}-s{stride}-{dtype}-{samples}-samples-from-value-{offset}",
                   (grad_output, weight, [size, size], [stride, stride], [0, 0], [1, 1]))


def test_grad_input_declines_weights_that_start_or_end_mid_unit():
    """grad_input's staging copies whole 4-byte units of 16-bit weights, so the kernel declines
    a weight that starts or ends inside one (an odd count of values from the storage's first,
    any count from its second: None, untouched, nothing launched), and the op under ``LAST``
    takes the chunked kernel at a vector a thread, with the reference's values and the ops'
    bits; a weight of an even count from the storage's first or third value is served."""
    require_host_compiler()
    dispatch, spec = CUDA_DISPATCH["oplib::involution_backward_input"], registry.get(GRAD_INPUT.op)
    for samples, offset in [(1, 0), (1, 1), (2, 1)]:
        for name, args in sixteen_bit_weight_views(samples, offset):
            launcher = EmulatedLauncher()
            out = _result(args, GRAD_INPUT).fill_(7)
            assert GRAD_INPUT.launch(*args, out, launcher) is None and not launcher.launches, name
            assert torch.equal(out, torch.full_like(out, 7)), name
            recorded = device_model.RecordingLauncher()
            dispatch(*args, recorded, involution_cuda.LAST)
            assert [launch.kernel for launch in recorded.launches] == ["involution_backward_input_chunked"], name
            routed = dispatch(*args, EmulatedLauncher(), involution_cuda.LAST)
            assert_matches_reference(spec, registry.SampleInput(args, name), routed, args[0].dtype)
            assert torch.equal(routed, _chunked(GRAD_INPUT, args)), name
    for offset in (0, 2):
        for name, args in sixteen_bit_weight_views(2, offset):
            out = GRAD_INPUT.launch(*args, _result(args, GRAD_INPUT), EmulatedLauncher())
            assert out is not None, name
            assert_matches_reference(spec, registry.SampleInput(args, name), out, args[0].dtype)
            assert torch.equal(out, _chunked(GRAD_INPUT, args)), name


def test_infinite_grad_output_makes_no_nan_at_taps_outside():
    require_host_compiler()
    _infinite_grad_output(EmulatedLauncher())


def _infinite_weights_outside(launcher, dtypes=registry.FLOAT_DTYPES) -> None:
    """The forward with weights of +-inf at every tap that reads padding: the chunked kernel
    skips those taps, so its results are finite, and so must these be, bit for bit (a tap
    outside reads some pixel of the image, which an infinite weight would turn into inf or NaN)."""
    for dtype in dtypes:
        for kernel, stride in _instantiations(FORWARD):
            pad = kernel // 2
            out_h, out_w = (6 + 2 * pad - kernel) // stride + 1, (16 + 2 * pad - kernel) // stride + 1
            rows = torch.arange(out_h) * stride - pad + torch.arange(kernel).view(kernel, 1)
            columns = torch.arange(out_w) * stride - pad + torch.arange(kernel).view(kernel, 1)
            outside = (((rows < 0) | (rows >= 6)).view(kernel, 1, -1, 1)
                       | ((columns < 0) | (columns >= 16)).view(1, kernel, 1, -1))
            w = torch.randn(1, 2, kernel, kernel, out_h, out_w, dtype=dtype)
            w[0, 0] = torch.where(outside, torch.tensor(float("inf"), dtype=dtype), w[0, 0])
            w[0, 1] = torch.where(outside, torch.tensor(float("-inf"), dtype=dtype), w[0, 1])
            args = (torch.randn(1, 32, 6, 16, dtype=dtype).to(memory_format=LAST), as_pixel_major(w),
                    [stride, stride], [pad, pad], [1, 1])
            expected = _chunked(FORWARD, args)
            for kind in (FORWARD, FORWARD_ONE):
                out = kind.launch(*args, _result(args, FORWARD), launcher)
                assert torch.isfinite(expected).all() and torch.equal(out, expected), (dtype, kernel, stride, kind.pixels)


def test_infinite_weights_at_taps_outside_add_nothing():
    require_host_compiler()
    _infinite_weights_outside(EmulatedLauncher())


def _infinite_grad_input(launcher, dtypes=registry.FLOAT_DTYPES) -> None:
    """grad_input with an infinite grad_output (+inf in one channel at an inner pixel, -inf in
    another at the corner): the chunked kernel's very bits, NaN-free where its are. A band's
    row past a record's kernel rows, or a tap with no output pixel, reads a staged value no one
    wrote for it, or a zero; with a zero it would add 0 * inf = NaN."""
    for dtype in dtypes:
        bits = {2: torch.int16, 4: torch.int32, 8: torch.int64}[dtype.itemsize]
        for kernel, stride in _instantiations(GRAD_INPUT):
            pad = kernel // 2
            out_h, out_w = (12 + 2 * pad - kernel) // stride + 1, (10 + 2 * pad - kernel) // stride + 1
            g = torch.randn(2, 32, out_h, out_w, dtype=dtype)
            g[0, 21, 1, 1], g[1, 3, 0, 0] = float("inf"), float("-inf")
            w = as_pixel_major(torch.randn(2, 2, kernel, kernel, out_h, out_w, dtype=dtype))
            args = (g.to(memory_format=LAST), w, [12, 10], [stride, stride], [pad, pad], [1, 1])
            out = GRAD_INPUT.launch(*args, _result(args, GRAD_INPUT), launcher)
            expected = _chunked(GRAD_INPUT, args)
            assert torch.isinf(expected).any() and not torch.isnan(expected).any(), (dtype, kernel, stride)
            assert torch.equal(out.view(bits), expected.view(bits)), (dtype, kernel, stride)


def test_infinite_grad_output_in_grad_input_adds_no_nan():
    require_host_compiler()
    _infinite_grad_input(EmulatedLauncher())


@pytest.mark.parametrize("kind", KINDS)
def test_last_declines_the_registry_samples_it_does_not_serve(kind):
    """The registry's samples (in both layouts) have fewer than LAST_MIN_GROUP_CHANNELS
    channels a group, so the kernels decline every one: None, the result untouched, nothing
    launched; the random geometries above are their proof."""
    require_host_compiler()
    kind = KINDS[kind]
    spec, launcher = registry.get(kind.op), EmulatedLauncher()
    minimum = load_source(involution_cuda.LAST_SOURCE).constants["LAST_MIN_GROUP_CHANNELS"]
    for dtype in registry.FLOAT_DTYPES:
        for sample in spec.sample_inputs("cpu", dtype, False):
            first, second, *rest = sample.args
            groups = rest[-1] if kind.grad_weight else second.shape[1]
            assert first.shape[1] // groups < minimum
            args = (first.to(memory_format=LAST), second.to(memory_format=LAST) if kind.grad_weight
                    else as_pixel_major(second), *rest)
            out = _result(args, kind).fill_(7)
            assert kind.launch(*args, out, launcher) is None
            assert torch.equal(out, torch.full_like(out, 7))
    assert not launcher.launches


def test_last_declines_what_it_does_not_serve():
    """NCHW operands, a weight or result not pixel-major, dilation, a non-square kernel,
    unequal strides, a kernel size without an instantiation, a group of 8 bfloat16 channels
    (one lane: below the minimum), of 48 (three lanes: not a power of two), a misaligned
    operand: None, untouched, nothing launched."""
    g = torch.randn(1, 32, 8, 8, dtype=torch.bfloat16).to(memory_format=LAST)
    x = torch.randn(1, 32, 8, 8, dtype=torch.bfloat16).to(memory_format=LAST)
    launcher = EmulatedLauncher()
    misaligned = torch.empty(x.numel() + 1, dtype=x.dtype)[1:].view(1, 8, 8, 32).permute(0, 3, 1, 2).copy_(x)
    wide = torch.randn(1, 48, 8, 8, dtype=torch.bfloat16).to(memory_format=LAST)
    window = ([3, 3], [1, 1], [1, 1], [1, 1])
    declined = [
        (g.contiguous(), x.contiguous(), *window, 2),
        (g, x, [3, 3], [1, 1], [2, 2], [2, 2], 2),
        (g, x, [3, 5], [1, 1], [1, 2], [1, 1], 2),
        (g[..., ::2], x, [3, 3], [1, 2], [1, 1], [1, 1], 2),
        (g, x, [9, 9], [1, 1], [4, 4], [1, 1], 2),
        (g, x, *window, 4),
        (wide, wide, *window, 1),
        (g, misaligned, *window, 2),
    ]
    for args in declined:
        out = _result(args).fill_(7)
        assert involution_cuda.involution_last_backward_weight(*args, out, launcher) is None
        assert torch.equal(out, torch.full_like(out, 7))
    out = torch.empty(1, 2, 3, 3, 8, 8, dtype=torch.bfloat16)  # contiguous, not pixel-major
    assert involution_cuda.involution_last_backward_weight(g, x, *window, 2, out, launcher) is None

    def weight(groups, kernel=(3, 3), size=(8, 8)):
        return as_pixel_major(torch.randn(1, groups, *kernel, *size, dtype=torch.bfloat16))

    declined_forward = [  # (input, weight, stride, padding, dilation)
        (x.contiguous(), weight(2), [1, 1], [1, 1], [1, 1]),
        (x, weight(2).contiguous(), [1, 1], [1, 1], [1, 1]),
        (x, weight(2), [1, 1], [2, 2], [2, 2]),
        (x, weight(2, (3, 5)), [1, 1], [1, 2], [1, 1]),
        (x, weight(2, size=(8, 4)), [1, 2], [1, 1], [1, 1]),
        (x, weight(2, (9, 9)), [1, 1], [4, 4], [1, 1]),
        (x, weight(4), [1, 1], [1, 1], [1, 1]),
        (wide, weight(1), [1, 1], [1, 1], [1, 1]),
        (misaligned, weight(2), [1, 1], [1, 1], [1, 1]),
    ]
    for args in declined_forward:
        out = _result(args, FORWARD).fill_(7)
        assert involution_cuda.involution_last(*args, out, launcher) is None
        assert torch.equal(out, torch.full_like(out, 7))
    nchw_out = torch.empty(1, 32, 8, 8, dtype=torch.bfloat16)
    assert involution_cuda.involution_last(x, weight(2), [1, 1], [1, 1], [1, 1], nchw_out, launcher) is None
    assert not launcher.launches


def _narrow(kind: Kind, args: tuple) -> tuple:
    """``args`` with 8 channels a group: a call the kernel declines and the chunked one serves."""
    if kind.grad_weight:
        g, x, *rest, groups = args
        return (g[:, :8 * groups].contiguous(memory_format=LAST), x[:, :8 * groups].contiguous(memory_format=LAST),
                *rest, groups)
    x, w, *rest = args
    return (x[:, :8 * w.shape[1]].contiguous(memory_format=LAST), w, *rest)


@pytest.mark.parametrize("kind", KINDS)
def test_the_op_takes_the_last_kernel_under_its_policy(kind):
    """The op's CUDA dispatch under ``LAST`` runs the kernel for every channels_last call it
    serves (the reference's values; with the kind's pixels a lane), the chunked kernel for the
    calls it declines; the ops' default policy keeps the chunked kernel until a draw has timed
    the two."""
    require_host_compiler()
    kind = KINDS[kind]
    policy = ONE_PIXEL if kind.pixels == 1 else involution_cuda.LAST
    dispatch = CUDA_DISPATCH[f"oplib::{kind.op}"]
    spec, rng = registry.get(kind.op), random.Random(3)
    chunked = kind.kernel.replace("_last", "_chunked")
    assert not involution_cuda.POLICY.lanes_on_channels and involution_cuda.LAST.lanes_on_channels
    for kernel, stride in _instantiations(kind):
        for dtype in (torch.float32, torch.bfloat16):
            args = _case(rng, kernel, stride, dtype, kind)
            routed, default = EmulatedLauncher(), EmulatedLauncher()
            out = dispatch(*args, routed, policy)
            assert [launch[0] for launch in routed.launches] == [kind.kernel]
            assert kind.pixels is None or routed.launches[0][4][2] == str(kind.pixels)
            assert_matches_reference(spec, registry.SampleInput(args, "routed"), out, dtype)
            dispatch(*args, default)
            assert [launch[0] for launch in default.launches] == [chunked]
            narrow, fallback = _narrow(kind, args), EmulatedLauncher()
            result = dispatch(*narrow, fallback, policy)
            assert [launch[0] for launch in fallback.launches] == [chunked]
            assert_matches_reference(spec, registry.SampleInput(narrow, "narrow"), result, dtype)


class _Occupancy(device_model.RecordingLauncher):
    """A recording launcher whose GPU holds ``blocks`` blocks an SM on ``sms`` SMs, as CuPy's
    asks the driver's occupancy calculator; ``asked`` the instantiations asked about."""

    def __init__(self, blocks: int, sms: int):
        super().__init__()
        self.blocks, self.sms, self.asked = blocks, sms, []

    def occupancy(self, source, kernel, dtype, specialisation, device, threads, shared_bytes):
        self.asked.append((kernel, specialisation, threads, shared_bytes))
        return self.blocks, self.sms


@pytest.mark.parametrize("kind", [FORWARD, GRAD_WEIGHT], ids=["forward", "grad_weight"])
def test_a_lane_takes_one_pixel_where_pairs_leave_the_gpu_short_of_a_wave(kind):
    """``last_pixels``: with the GPU's occupancy known, a lane takes a pixel where the grid of
    pairs is under ``LAST_PAIRS_MIN_WAVES`` waves of resident blocks (RedNet-50's last stage in
    bfloat16, batch 32, on an H200's 132 SMs of four blocks: 224 blocks of pairs), two where it
    fills them or nothing tells (no occupancy); a policy's ``last_pixels`` decides alone. The
    launch covers the row's pixels either way (its work items' count)."""
    source = load_source(involution_cuda.LAST_SOURCE)
    assert source.constants["LAST_PAIRS_MIN_WAVES"] == 1
    dispatch = CUDA_DISPATCH[f"oplib::{kind.op}"]
    x = torch.randn(32, 512, 7, 7, dtype=torch.bfloat16).to(memory_format=LAST)
    window = ([1, 1], [3, 3], [1, 1])
    args = ((x, x, [7, 7], *window, 32) if kind.grad_weight
            else (x, as_pixel_major(torch.randn(32, 32, 7, 7, 7, 7, dtype=torch.bfloat16)), *window))
    pairs = 32 * 7 * 4 * 32 * 2  # samples x rows x pairs of a row x groups x lanes a group

    def launched(launcher, policy=involution_cuda.LAST):
        dispatch(*args, launcher, policy)
        (launch,) = launcher.launches
        assert launch.kernel == kind.kernel
        return int(launch.specialisation[2]), launch.scalars[0]

    assert launched(device_model.RecordingLauncher()) == (2, pairs)
    h200 = _Occupancy(4, 132)
    assert launched(h200) == (1, 32 * 7 * 7 * 32 * 2) and -(-pairs // BLOCK_SIZE) == 224
    assert h200.asked == [(kind.kernel, ("7", "1", "2"), BLOCK_SIZE, 0)]
    assert launched(_Occupancy(1, 132)) == (2, pairs)  # 224 blocks fill a wave of 132
    assert launched(_Occupancy(4, 132), PAIRS) == (2, pairs)
    assert launched(device_model.RecordingLauncher(), ONE_PIXEL)[0] == 1
    assert launched(_Occupancy(0, 132)) == (2, pairs)  # the calculator finds no room: no basis


def test_lanes_on_channels_grad_input_takes_the_segment_kernel_or_a_vector_a_thread():
    """Under ``LAST`` a channels_last grad_input runs involution_backward_input_last where it
    serves, and where it declines (three groups: a pixel's vectors not a power of two) the
    chunked kernel with one 16-byte vector of a group's channels a thread (its last argument;
    the ops' policy gives a thread 16 channels at RedNet's first stages), which
    ``LAST_VECTOR_GRAD_INPUT`` runs everywhere; all with the very bits of the ops' policy: each channel's sum takes the same taps in the same order, whichever
    thread owns it. NCHW calls launch what they launch under the ops' policy."""
    require_host_compiler()
    dispatch, rng = CUDA_DISPATCH["oplib::involution_backward_input"], random.Random(7)
    for kernel, stride in [(3, 1), (7, 1), (7, 2)]:
        for dtype in registry.FLOAT_DTYPES:
            lanes = 16 // dtype.itemsize
            for groups in (rng.choice([1, 2]), 3):
                per_group = rng.choice([16, 32])
                height, width = rng.randint(kernel, 12), rng.randint(kernel, 12)
                out_h = (height + 2 * (kernel // 2) - kernel) // stride + 1
                out_w = (width + 2 * (kernel // 2) - kernel) // stride + 1
                w = as_pixel_major(torch.randn(2, groups, kernel, kernel, out_h, out_w, dtype=dtype))
                grad_output = torch.randn(2, groups * per_group, out_h, out_w, dtype=dtype)
                args = (grad_output.to(memory_format=LAST), w, [height, width], [stride, stride], [kernel // 2] * 2,
                        [1, 1])
                recorded = device_model.RecordingLauncher()
                dispatch(*args, recorded, involution_cuda.LAST)
                (launch,) = recorded.launches
                case = (dtype, kernel, stride, groups)
                if groups == 3:
                    assert launch.kernel.endswith("_chunked") and launch.scalars[-1] == lanes, case
                else:
                    assert launch.kernel == GRAD_INPUT.kernel, case
                # the policy's other grad_input candidate: the chunked kernel at a vector a thread
                recorded = device_model.RecordingLauncher()
                dispatch(*args, recorded, involution_cuda.LAST_VECTOR_GRAD_INPUT)
                (launch,) = recorded.launches
                assert launch.kernel.endswith("_chunked") and launch.scalars[-1] == lanes, case
                vector = dispatch(*args, EmulatedLauncher(), involution_cuda.LAST_VECTOR_GRAD_INPUT)
                # the ops' policy as it launches at RedNet's sizes: the most channels a thread
                many = dataclasses.replace(involution_cuda.POLICY, target_threads=1)
                recorded = device_model.RecordingLauncher()
                dispatch(*args, recorded, many)
                assert recorded.launches[0].scalars[-1] > lanes
                routed = dispatch(*args, EmulatedLauncher(), involution_cuda.LAST)
                assert torch.equal(routed, dispatch(*args, EmulatedLauncher(), many)), case
                assert torch.equal(vector, routed), case
                nchw = (grad_output, *args[1:])
                default, lanes_on_channels = device_model.RecordingLauncher(), device_model.RecordingLauncher()
                dispatch(*nchw, default)
                dispatch(*nchw, lanes_on_channels, involution_cuda.LAST)
                assert [(l.kernel, l.scalars) for l in default.launches] == [
                    (l.kernel, l.scalars) for l in lanes_on_channels.launches]


@pytest.mark.needs_cuda
@pytest.mark.parametrize("kind", KINDS)
def test_last_on_a_gpu_matches_the_reference(kind):
    """CuPy's launch on a GPU, what NVRTC makes of the kernels: random geometries of every
    instantiation and dtype against the float64 reference, the forward bit for bit against the
    chunked kernel on the same GPU, and the op's dispatch under ``LAST`` with the same bits."""
    kind = KINDS[kind]
    rng, spec = random.Random(21), registry.get(kind.op)
    dispatch = CUDA_DISPATCH[f"oplib::{kind.op}"]
    from oplib.kernels import cupy_launcher

    for kernel, stride in _instantiations(kind):
        for dtype in registry.FLOAT_DTYPES:
            for case in range(2):
                cpu_args = _case(rng, kernel, stride, dtype, kind)
                args = tuple(a.cuda() if isinstance(a, torch.Tensor) else a for a in cpu_args)
                out = kind.launch(*args, _result(args, kind))
                assert out is not None
                name = f"k{kernel}-s{stride}-{dtype}-{case}"
                assert_matches_reference(spec, registry.SampleInput(cpu_args, name), out.cpu(), dtype)
                assert torch.equal(out, dispatch(*args, cupy_launcher(), involution_cuda.LAST)), name
                if not kind.grad_weight:
                    assert torch.equal(out, _chunked(kind, args)), name


@pytest.mark.needs_cuda
def test_the_forward_stages_warps_that_take_part_of_a_pair_on_a_gpu():
    from oplib.kernels import cupy_launcher

    _check_pairs_of_many_groups(cupy_launcher(), "cuda")


# Bugs a review could miss, and the kernels each reaches. All but those of ACCESS_ONLY change
# values, which the reference check must catch (those of SIXTEEN_BIT only in 16-bit values); the
# two bounds also read past the input (the row below the image, the pixel past a row's end, past
# the tensor at the last sample), the copy one value past a warp's records reads past the weight
# (forward) or writes past grad_weight at the last warp, and grad_input's staging of every unit
# reads past the weight at the last record, which ASan must catch (elsewhere each only stages
# or rewrites a value no one reads).
PLANTS = {
    "row-bound-one-past": (("forward", "grad_weight"), "return y >= 0 && y < height;", "return y >= 0 && y <= height;"),
    "column-bound-one-past": (("forward", "grad_weight"), "x0 + b >= 0 && x0 + b < width", "x0 + b >= 0 && x0 + b <= width"),
    "outside-taps-added": (("forward",), "if (!((inside >> c) & 1u)) continue;", ";"),
    # the forward's second pixel: its weights, and a second pixel past the row stored (into the
    # next row's first pixel, and past the tensor at the last row)
    "second-pixel-weights-of-the-first": (("forward",), "widen(second_taps[a * KERNEL + c - STRIDE])",
                                          "widen(((void)second_taps, taps)[a * KERNEL + c - STRIDE])"),
    # the warp's runs of records: the last ending at its last pair's first pixel, the second
    # starting a record late (the first pair's second pixel's record after the hole not staged)
    # and ending a record early (the last pair's first pixel's last record not staged)
    "warp-records-end-at-a-first-pixel": (("forward",), "runs.end[2] = (two1 ? pixel1 + 1 : pixel1) * G",
                                          "runs.end[2] = pixel1 * G"),
    "second-run-a-record-late": (("forward",), "runs.start[1] = (pixel0 + 1) * G + group0;",
                                 "runs.start[1] = (pixel0 + 1) * G + group0 + 1;"),
    "second-run-a-record-short": (("forward",), "runs.end[1] = pixel1 * G + group1 + 1;",
                                  "runs.end[1] = pixel1 * G + group1;"),
    "second-pixel-past-the-row-stored": (("forward",),
                                         "const bool second = PIXELS == 2 && it.active && it.j + 1 < launch.OW;",
                                         "const bool second = PIXELS == 2 && it.active;"),
    "outside-sums-kept": (("grad_weight",), "if (!((inside >> c) & 1u)) sum[r] = 0;", ";"),
    "last-shuffle-skipped": (("grad_weight",), "if (offset >= parts) continue;", "if (offset >= parts / 2) continue;"),
    "next-row-not-advanced": (("grad_weight",), "row += W * C;  // the next kernel row", ";"),
    # grad_weight's second pixel: its sums of the first pixel's grad_output, its tap stored at
    # the first's place in its record, and a second pixel past the row stored
    "second-pixel-sums-of-the-first": (("grad_weight",), "sum[r] = oplib_fma(grad[r][e], x[e], sum[r]);",
                                       "sum[r] = oplib_fma(grad[0][e], x[e], sum[r]);"),
    "second-pixel-tap-misplaced": (("grad_weight",), "second_taps[a * KERNEL + c - STRIDE] = Element",
                                   "second_taps[a * KERNEL + c - (STRIDE > 1)] = Element"),
    "grad-weight-second-pixel-past-the-row-stored": (
        ("grad_weight",), "second = PIXELS == 2 && active && it.j + 1 < launch.OW;", "second = PIXELS == 2 && active;"),
    # a pixel a lane: the forward's sums taking a second pixel's taps, and the warp's records
    # staged and read as a pair's (runs past its last pixel's)
    "one-pixel-sums-a-second-pixel": (("forward, a pixel a lane",), "if (PIXELS == 2 && c >= STRIDE) {",
                                      "if (c >= STRIDE) {"),
    "one-pixel-records-as-pairs": (("forward, a pixel a lane", "grad_weight, a pixel a lane"),
                                   "const bool two0 = PIXELS == 2 && j0 + 1 < OW, two1 = PIXELS == 2 && j1 + 1 < OW;",
                                   "const bool two0 = j0 + 1 < OW, two1 = j1 + 1 < OW;"),
    "copy-one-past": (("forward", "grad_weight"), "v < count; v += 32) to[v] = from[v];",
                      "v <= count; v += 32) to[v] = from[v];"),
    "window-one-column-late": (("grad_input",), "x_first + pw - (KERNEL - 1);", "x_first + pw - (KERNEL - 2);"),
    "pieces-a-row-apart": (("grad_input",), "records + copied * TAPS + value - shift",
                           "records + copied * (TAPS - KERNEL) + value - shift"),
    "restaged-before-all-read": (("grad_input",), "__syncthreads();  // the staging is free for the next output row",
                                 ";"),
    # grad_input's staging: every unit of a piece read, those of rows past the record's too
    # (past the weight at the last record), the record's last value left out, and 16-bit units
    # not realigned where a piece starts at a unit's second value, or realigned with their own
    # first value in place of the next lane's
    "staging-past-the-record": (("grad_input",), "unit_t unit = own ? from[0] : 0;",
                                "unit_t unit = ((void)own, from[0]);"),
    "record-end-one-short": (("grad_input",), "inside = (unsigned int)value < TAPS,",
                             "inside = (unsigned int)value < TAPS - 1,"),
    "pieces-never-realigned": (("grad_input",), "if (UNIT_VALUES > 1 && shift) unit =", "if (false) unit ="),
    "realigned-with-its-own-value": (("grad_input",), "(unit >> 16) | ((next ? from[1] : 0) << 16);",
                                     "(unit >> 16) | ((void)next, unit << 16);"),
    # the band's rows: each its own kernel row of the staged pieces, a kernel row past the last
    # read, the output rows in the chunked kernel's order (the same values, other bits), and the
    # last band's row past the image stored (past the tensor at the last sample; elsewhere into
    # the next sample's first row, which its own block writes after, in the emulation's order)
    "band-rows-one-kernel-row": (("grad_input",), "first_weight[r * KERNEL - t * weight_step]",
                                 "first_weight[-t * weight_step]"),
    "band-kernel-row-one-past": (("grad_input",), "(unsigned int)(a_first + r) >= (unsigned int)KERNEL",
                                 "(unsigned int)(a_first + r) > (unsigned int)KERNEL"),
    "output-rows-first-first": (("grad_input",), "int i = i_high; i >= i_low; --i", "int i = i_low; i <= i_high; ++i"),
    "band-row-past-the-image-stored": (("grad_input",), "if (!active || y_first + r >= H) continue;",
                                       "if (!active) continue;"),
}
# (the copy one value past and the staging past the record read past a tensor, and change no
# value read; the band's row past the image and the second pixel past the row write past one)
ACCESS_ONLY = {"copy-one-past", "staging-past-the-record", "band-row-past-the-image-stored",
               "second-pixel-past-the-row-stored"}
# (a band's kernel row past the record reads staged zeros in float32: only an infinite
# grad_output shows them, as NaN)
INFINITE_ONLY = {"band-kernel-row-one-past"}
# (grad_input's staging takes 4-byte units of two values in 16-bit dtypes only)
SIXTEEN_BIT = {"pieces-never-realigned", "realigned-with-its-own-value"}
VALUE_PLANTS = [(kind, plant) for plant, (kinds, *_) in PLANTS.items() if plant not in ACCESS_ONLY | SIXTEEN_BIT
                for kind in kinds]
ACCESS_PLANTS = [(kind, plant) for plant, (kinds, *_) in PLANTS.items()
                 if "bound" in plant or plant in ACCESS_ONLY for kind in kinds]


def _use(monkeypatch, planted) -> None:
    real_load = involution_cuda.load_source
    monkeypatch.setattr(involution_cuda, "load_source",
                        lambda name: planted if name == involution_cuda.LAST_SOURCE else real_load(name))


def _plant(tmp_path, plant: str):
    _, text, bug = PLANTS[plant]
    return _planted(tmp_path, involution_cuda.LAST_SOURCE, text, bug)


@pytest.mark.parametrize("kind, plant", VALUE_PLANTS, ids="-".join)
def test_a_planted_bug_fails_the_reference_check(kind, plant, tmp_path, monkeypatch):
    require_host_compiler()
    _use(monkeypatch, _plant(tmp_path, plant))
    with pytest.raises(AssertionError):
        if plant in INFINITE_ONLY:
            _infinite_grad_input(EmulatedLauncher(), dtypes=(torch.float32,))
        else:
            _check_random(EmulatedLauncher(), cases=4, seed=5, dtypes=(torch.float32,), kind=KINDS[kind])


@pytest.mark.parametrize("plant", sorted(SIXTEEN_BIT))
def test_a_planted_bug_in_sixteen_bit_staging_fails_the_checks(plant, tmp_path, monkeypatch):
    """grad_input's 16-bit staging, on random bfloat16 geometries."""
    require_host_compiler()
    _use(monkeypatch, _plant(tmp_path, plant))
    with pytest.raises(AssertionError):
        _check_random(EmulatedLauncher(), cases=4, seed=5, dtypes=(torch.bfloat16,), kind=GRAD_INPUT)


_RUN_RANDOM = """
from oplib.testing.cuda_emulation import EmulatedLauncher
from test_cuda_last import KINDS, _check_random
launcher = EmulatedLauncher(sanitize=True)
for kind in KINDS.values():
    _check_random(launcher, cases=2, seed=9, kind=kind)
print("clean:", len(launcher.launches), "launches")
"""


@pytest.mark.integration
def test_last_is_clean_under_address_sanitizer():
    """The three kernels, every instantiation in every dtype on random geometries: no access
    outside the tensors (the emulation's buffers are exact-size heap blocks)."""
    require_host_compiler()
    assert_clean_under_asan(_RUN_RANDOM)


# Per kernel, a call whose over-reads leave the input or the weight: the last pixel's taps below
# and right of the image, and the last warp's records end at the weight's end (grad_weight's
# copy writes past its end; grad_input's last band, of an odd height and no padding, has a row
# past the image, whose kernel row at the last output row lies past the last record, the
# weight's last; the forward's last pair, of an odd width, has a pixel past the row).
ASAN_CALLS = {
    "forward": """
    last = torch.channels_last
    x = torch.randn(1, 16, 4, 5).to(memory_format=last)
    w = torch.randn(1, 4, 5, 1, 3, 3).permute(0, 3, 4, 5, 1, 2)
    ops.involution_last(x, w, [1, 1], [1, 1], [1, 1], torch.empty(1, 16, 4, 5).to(memory_format=last), launcher)
""",
    "grad_weight": """
    last = torch.channels_last
    g, x = torch.randn(1, 16, 4, 4).to(memory_format=last), torch.randn(1, 16, 4, 4).to(memory_format=last)
    out = torch.empty(1, 4, 4, 1, 3, 3).permute(0, 3, 4, 5, 1, 2)
    ops.involution_last_backward_weight(g, x, [3, 3], [1, 1], [1, 1], [1, 1], 1, out, launcher)
""",
    "grad_input": """
    last = torch.channels_last
    g = torch.randn(1, 16, 3, 2).to(memory_format=last)
    w = torch.randn(1, 3, 2, 1, 3, 3).permute(0, 3, 4, 5, 1, 2)
    out = torch.empty(1, 16, 5, 4).to(memory_format=last)
    ops.involution_last_backward_input(g, w, [5, 4], [1, 1], [0, 0], [1, 1], out, launcher)
""",
}


@pytest.mark.integration
@pytest.mark.parametrize("kind, plant", ACCESS_PLANTS, ids="-".join)
def test_address_sanitizer_catches_a_planted_out_of_bounds_access(kind, plant, tmp_path):
    require_host_compiler()
    assert_asan_catches(_plant(tmp_path, plant), ASAN_CALLS[kind])
