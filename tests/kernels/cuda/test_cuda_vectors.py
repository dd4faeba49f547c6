"""involution_vectors.cu (involution's NCHW forward, stride-1 grad_input and grad_weight, a vector
of pixels a lane; the forward with a thread's channels and with twice as many, its WIDE
instantiations) through the host emulation: against the float64 reference on the registry's samples and
random geometries (borders on every side, every kernel size and, for the forward, both strides;
every dtype), the same bits as involution.cu's chunked kernels, infinite weights at taps
outside the image, the cases they decline, AddressSanitizer, and planted bugs that these checks
catch."""

from __future__ import annotations

import functools
import random
from dataclasses import dataclass
from typing import Callable, Optional

import pytest
import torch

from oplib import registry
from oplib.kernels import CUDA_DISPATCH, load_source
from oplib.kernels.cuda_launch import CuPyLauncher
from oplib.kernels.involution import cuda as involution_cuda
from oplib.testing import assert_matches_reference
from oplib.testing.cuda_emulation import EmulatedLauncher
from oplib.testing.device_model import RecordingLauncher
from oplib.testing.toolchain import require_host_compiler

from cuda_test_helpers import _planted, assert_asan_catches, assert_clean_under_asan


@dataclass(frozen=True)
class Kind:
    """One of the source's kernels: its name, the op whose reference it is checked against,
    the host function that launches it, and the chunked kernel's (same arguments); the forward's
    ``wide``: whether it launches the WIDE instantiations (``vectors_wide``)."""

    kernel: str
    op: str
    launch: Callable
    chunked: Callable
    grad_input: bool = False
    grad_weight: bool = False
    wide: Optional[bool] = None

    @property
    def chunked_kernel(self) -> str:
        """The name of involution.cu's chunked kernel that serves the same calls."""
        return self.kernel.replace("_vectors", "_chunked")

    def instantiations(self) -> list[tuple[str, ...]]:
        """The kernel's instantiations the kind launches (the forward's of its width)."""
        listed = load_source(involution_cuda.VECTORS_SOURCE).specialisations[self.kernel]
        return [s for s in listed if self.wide is None or s[2] == ("true" if self.wide else "false")]

    def specialisations(self) -> list[tuple[int, int]]:
        """(kernel size, stride) of each instantiation (grad_input: stride 1)."""
        return [(int(s[0]), int(s[1]) if len(s) > 1 else 1) for s in self.instantiations()]


def _chunked(function: Callable) -> Callable:
    """``function`` (one of the three ops' host functions) under the policy with no vectors
    kernel: the chunked kernel wherever it serves."""
    return functools.partial(function, policy=involution_cuda.CHUNKED)


# The forward with its width fixed (``vectors_wide``), so that each kind launches its own whatever
# the launcher: on a GPU the host's choice would take the WIDE instantiations wherever they do not
# spill, and the narrow ones would go untested there.
FORWARD = Kind("involution_forward_vectors", "involution",
               functools.partial(involution_cuda.involution_vectors, policy=involution_cuda.VECTORS_NARROW),
               _chunked(involution_cuda.involution), wide=False)
FORWARD_WIDE = Kind(FORWARD.kernel, FORWARD.op,
                    functools.partial(involution_cuda.involution_vectors, policy=involution_cuda.VECTORS_WIDE),
                    FORWARD.chunked, wide=True)
GRAD_INPUT = Kind("involution_backward_input_vectors", "involution_backward_input",
                  involution_cuda.involution_vectors_backward_input, _chunked(involution_cuda.involution_backward_input),
                  grad_input=True)
GRAD_WEIGHT = Kind("involution_backward_weight_vectors", "involution_backward_weight",
                   involution_cuda.involution_vectors_backward_weight,
                   _chunked(involution_cuda.involution_backward_weight), grad_weight=True)
KINDS = {"forward": FORWARD, "forward, wide": FORWARD_WIDE, "grad_input": GRAD_INPUT, "grad_weight": GRAD_WEIGHT}


def _result(kind: Kind, args: tuple) -> torch.Tensor:
    """The result tensor the op allocates for ``args`` (the op's arguments)."""
    if kind.grad_weight:
        grad_output, input, kernel_size, *_, groups = args
        return input.new_empty(input.shape[0], groups, *kernel_size, *grad_output.shape[2:])
    activation, weight = args[:2]
    size = args[2] if kind.grad_input else weight.shape[4:]
    return activation.new_empty(activation.shape[0], activation.shape[1], *size)


def _case(kind: Kind, rng: random.Random, kernel: int, stride: int, dtype: torch.dtype) -> tuple:
    """The op's arguments for random operands of one instantiated window that the kernel serves.
    Widths from one vector of pixels to a few, so that windows cross both borders or neither;
    any vertical padding; a group's channels one or two threads'."""
    source = load_source(involution_cuda.VECTORS_SOURCE)
    pixels = involution_cuda.vectors_pixels(source, dtype)
    per_thread = 1 if kind.grad_weight else involution_cuda.vectors_channels(source, dtype, kind.grad_input,
                                                                             bool(kind.wide))
    groups, per_group = rng.choice([1, 2, 3]), per_thread * rng.choice([1, 2])
    n, height = rng.choice([1, 2]), rng.randint(1, 10)
    width = pixels * stride * rng.randint(1, 5)  # the output width a multiple of the vector too
    pad = [rng.randint(0, kernel - 1), kernel // 2]
    height = max(height, kernel - 2 * pad[0])
    out_h, out_w = (height + 2 * pad[0] - kernel) // stride + 1, (width + 2 * pad[1] - kernel) // stride + 1
    w = torch.randn(n, groups, kernel, kernel, out_h, out_w, dtype=dtype)
    window = ([stride, stride], pad, [1, 1])
    if kind.grad_weight:
        return (torch.randn(n, groups * per_group, out_h, out_w, dtype=dtype),
                torch.randn(n, groups * per_group, height, width, dtype=dtype), [kernel, kernel], *window, groups)
    if kind.grad_input:
        return (torch.randn(n, groups * per_group, out_h, out_w, dtype=dtype), w, [height, width], *window)
    return (torch.randn(n, groups * per_group, height, width, dtype=dtype), w, *window)


def _check_random(kind: Kind, launcher, cases: int, seed: int, dtypes=registry.FLOAT_DTYPES) -> set:
    """``cases`` random geometries per instantiation and dtype against the float64 reference
    and against the chunked kernel's bits; returns the instantiations launched."""
    rng, spec = random.Random(seed), registry.get(kind.op)
    chunked = EmulatedLauncher()
    for kernel, stride in kind.specialisations():
        for dtype in dtypes:
            for case in range(cases):
                args = _case(kind, rng, kernel, stride, dtype)
                out = kind.launch(*args, _result(kind, args), launcher)
                assert out is not None
                sample = registry.SampleInput(args, f"k{kernel}-s{stride}-{dtype}-{case}")
                assert_matches_reference(spec, sample, out, dtype)
                assert torch.equal(out, kind.chunked(*args, _result(kind, args), chunked)), sample.name
    assert {launch[0] for launch in chunked.launches} == {kind.chunked_kernel}
    return {(launch[0], launch[4]) for launch in launcher.launches}


@pytest.mark.parametrize("kind", KINDS)
def test_vectors_match_the_reference_and_the_chunked_kernels_bits(kind):
    """Every instantiation, every dtype, random geometries: the float64 reference, and the
    chunked kernel's very bits (both add the taps in the same order, the taps outside the
    image adding exactly nothing)."""
    require_host_compiler()
    kind = KINDS[kind]
    launched = _check_random(kind, EmulatedLauncher(), cases=3, seed=5)
    assert launched == {(kind.kernel, s) for s in kind.instantiations()}


@pytest.mark.needs_cuda
@pytest.mark.parametrize("kind", KINDS)
def test_vectors_on_a_gpu_match_the_reference_and_the_chunked_kernels_bits(kind):
    """CuPy's launch on a GPU, what NVRTC makes of the kernels: random geometries of every
    instantiation and dtype against the float64 reference, and bit for bit against the chunked
    kernel on the same GPU; and the op (torch.ops.oplib) takes the vectors kernel's result."""
    kind, rng = KINDS[kind], random.Random(21)
    spec = registry.get(kind.op)
    for kernel, stride in kind.specialisations():
        for dtype in registry.FLOAT_DTYPES:
            for case in range(2):
                args = tuple(a.cuda() if isinstance(a, torch.Tensor) else a for a in _case(kind, rng, kernel, stride, dtype))
                out = kind.launch(*args, _result(kind, args))
                assert out is not None
                name = f"k{kernel}-s{stride}-{dtype}-{case}"
                cpu_args = tuple(a.cpu() if isinstance(a, torch.Tensor) else a for a in args)
                assert_matches_reference(spec, registry.SampleInput(cpu_args, name), out.cpu(), dtype)
                assert torch.equal(out, kind.chunked(*args, _result(kind, args))), name
                assert torch.equal(out, getattr(torch.ops.oplib, kind.op)(*args)), name


def _declined_variants(kind: Kind, args: tuple) -> dict[str, tuple]:
    """``args`` (a call the vectors kernel serves) changed into calls it declines, which the
    chunked kernel serves: channels_last operands (where that is another layout: not with one
    channel), and the same window on a width one pixel narrower than a multiple of the vector
    (grad_input: also stride 2)."""
    last = torch.channels_last
    other_layout = args[0].shape[1] > 1
    if kind.grad_weight:
        g, x, *rest = args
        narrow = (g[..., :-1].contiguous(), x[..., :-1].contiguous()) if g.shape[3] == x.shape[3] else None
        variants = {"channels_last": (g.to(memory_format=last), x.to(memory_format=last), *rest)} if other_layout else {}
        return variants | ({"narrow": (*narrow, *rest)} if narrow else {})
    activation, w, *rest = args
    variants = {"channels_last": (activation.to(memory_format=last), w, *rest)} if other_layout else {}
    if kind.grad_input:
        (height, width), *window = rest  # at stride 1 grad_output's width is the input's
        narrow = (activation[..., :-1].contiguous(), w[..., :-1].contiguous(), [height, width - 1], *window)
        strided = (activation[..., ::2, ::2].contiguous(), w[..., ::2, ::2].contiguous(), [height, width], [2, 2],
                   *window[1:])
        return variants | {"narrow": narrow, "stride 2": strided}
    stride = rest[0][1]
    if stride == 1:
        variants["narrow"] = (activation[..., :-1].contiguous(), w[..., :-1].contiguous(), *rest)
    return variants


@pytest.mark.parametrize("kind", KINDS)
def test_the_ops_take_the_vectors_kernels_where_they_serve(kind):
    """The op's CUDA dispatch, what a call on a GPU runs, takes the vectors kernel for every
    contiguous NCHW call it serves, with the chunked kernel's very bits (the CHUNKED policy's
    result), and the chunked kernel for the calls it declines, with the reference's values."""
    require_host_compiler()
    kind = KINDS[kind]
    dispatch, spec, rng = CUDA_DISPATCH[f"oplib::{kind.op}"], registry.get(kind.op), random.Random(3)
    # (the forward's width as the kind's: the emulation, which cannot tell, takes the narrow one)
    policy = (involution_cuda.VECTORS_WIDE,) if kind.wide else ()
    for kernel, stride in kind.specialisations():
        for dtype in (torch.float32, torch.bfloat16):
            args = _case(kind, rng, kernel, stride, dtype)
            routed, chunked = EmulatedLauncher(), EmulatedLauncher()
            out = dispatch(*args, routed, *policy)
            assert [launch[0] for launch in routed.launches] == [kind.kernel]
            assert kind.wide is None or routed.launches[0][4] in kind.instantiations()
            assert torch.equal(out, dispatch(*args, chunked, involution_cuda.CHUNKED))
            assert [launch[0] for launch in chunked.launches] == [kind.chunked_kernel]
            for name, declined in _declined_variants(kind, args).items():
                fallback = EmulatedLauncher()
                result = dispatch(*declined, fallback)
                assert [launch[0] for launch in fallback.launches] == [kind.chunked_kernel], name
                assert_matches_reference(spec, registry.SampleInput(declined, name), result, dtype)


class _Builds(RecordingLauncher):
    """A recording launcher that answers ``local_bytes`` and ``occupancy`` as a GPU of 132 SMs
    whose build of each instantiation takes ``local[specialisation]`` bytes of local memory and
    leaves ``blocks[specialisation]`` blocks an SM would, and keeps what it was asked."""

    def __init__(self, local: dict, blocks: Optional[dict] = None):
        super().__init__()
        self.local, self.blocks, self.asked = local, blocks or {}, []

    def local_bytes(self, source, kernel, dtype, specialisation, device):
        self.asked.append(("local_bytes", kernel, dtype, specialisation, device.type))
        return self.local[specialisation]

    def occupancy(self, source, kernel, dtype, specialisation, device, threads, shared_bytes):
        self.asked.append(("occupancy", kernel, specialisation, threads, shared_bytes))
        return self.blocks.get(specialisation, 2), 132


def test_the_forward_takes_the_wide_instantiation_where_the_gpu_keeps_it_in_registers():
    """``vectors_wide``: the WIDE instantiation where the launcher's GPU builds it without local
    memory (no spill) and holds as many of its blocks at once as of the narrow one's; the narrow
    one where it spilled, where it leaves fewer blocks resident (a 3 x 3 window's on sm_90), where
    the launcher cannot tell (the recording and emulating launchers: no ``local_bytes``) and
    where a group's channels are no multiple of a wide thread's; a policy's ``vectors_wide``
    decides alone. The launch covers the channels either way (its work items' count)."""
    source = load_source(involution_cuda.VECTORS_SOURCE)
    x, w = torch.randn(2, 16, 8, 8, dtype=torch.bfloat16), torch.randn(2, 2, 7, 7, 8, 8, dtype=torch.bfloat16)
    window = ([1, 1], [3, 3], [1, 1])

    def launched(launcher, policy=None, args=(x, w)):
        out = _result(FORWARD, (*args, *window))
        assert involution_cuda.involution_vectors(*args, *window, out, launcher, policy) is out
        (launch,) = launcher.launches
        return launch.specialisation[2], launch.scalars[0]  # (total: the work items)

    per_thread = involution_cuda.vectors_channels(source, torch.bfloat16)
    narrow_items, wide_items = 2 * 16 // per_thread * 8 * 2, 2 * 16 // (2 * per_thread) * 8 * 2
    kept, spilled = _Builds({("7", "1", "true"): 0}), _Builds({("7", "1", "true"): 16})
    assert launched(kept) == ("true", wide_items)
    assert kept.asked == [("local_bytes", "involution_forward_vectors", torch.bfloat16, ("7", "1", "true"), "cpu"),
                          ("occupancy", "involution_forward_vectors", ("7", "1", "true"), 256, 0),
                          ("occupancy", "involution_forward_vectors", ("7", "1", "false"), 256, 0)]
    assert launched(spilled) == ("false", narrow_items)
    fewer = _Builds({("7", "1", "true"): 0}, {("7", "1", "true"): 2, ("7", "1", "false"): 3})
    assert launched(fewer) == ("false", narrow_items)
    assert launched(RecordingLauncher()) == ("false", narrow_items)
    assert launched(_Builds({("7", "1", "true"): 0}), involution_cuda.VECTORS_NARROW) == ("false", narrow_items)
    assert launched(RecordingLauncher(), involution_cuda.VECTORS_WIDE) == ("true", wide_items)
    # a group of 4 channels: one narrow thread's, no wide one's
    four = (torch.randn(2, 8, 8, 8, dtype=torch.bfloat16), w)
    assert launched(_Builds({("7", "1", "true"): 0}), args=four)[0] == "false"


def test_cupys_launcher_asks_the_driver_for_a_builds_local_memory():
    """CuPyLauncher.local_bytes: the driver's CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES (3) of the
    instantiation's own function, in its device's context; None for a device that is no GPU."""
    from oplib.testing.recording_launcher import RecordingCuPyLauncher

    class Driver:
        def __init__(self):
            self.asked = []

        def ctxGetCurrent(self):
            return 0

        def funcGetAttribute(self, attribute, function):
            self.asked.append((attribute, function))
            return 24

    source = load_source(involution_cuda.VECTORS_SOURCE)
    launcher = RecordingCuPyLauncher()  # (which hides local_bytes: no GPU to ask; CuPy's own is called)
    launcher._driver = Driver()
    wide = ("involution_forward_vectors", torch.bfloat16, ("7", "1", "true"))
    launcher.load(source, 0, [wide])
    function = launcher.function(source, *wide, 0)
    assert CuPyLauncher.local_bytes(launcher, source, *wide, torch.device("cuda", 0)) == 24
    assert launcher._driver.asked == [(3, function)]
    assert CuPyLauncher.local_bytes(launcher, source, *wide, torch.device("cpu")) is None


def _infinite_weights_outside(kind: Kind, launcher, dtypes=registry.FLOAT_DTYPES) -> None:
    """Weights of +-inf at every tap that reads padding: the chunked kernels skip those taps
    (in grad_input, the weights whose input pixel is outside the image, which no grad_input
    value inside it uses), so their results are finite, and so must these be, bit for bit. For
    grad_weight, an infinite grad_output at a corner pixel: its taps inside the image are
    infinite, those outside +0 (the chunked kernel never adds to them), never NaN."""
    for dtype in dtypes:
        bits = {2: torch.int16, 4: torch.int32, 8: torch.int64}[dtype.itemsize]
        for _, stride in {s[1:]: s for s in kind.specialisations()}.values():
            w = torch.randn(1, 2, 7, 7, 6 // stride, 16 // stride, dtype=dtype)
            rows = torch.arange(6 // stride) * stride - 3 + torch.arange(7).view(7, 1)
            columns = torch.arange(16 // stride) * stride - 3 + torch.arange(7).view(7, 1)
            outside = ((rows < 0) | (rows >= 6)).view(7, 1, -1, 1) | ((columns < 0) | (columns >= 16)).view(1, 7, 1, -1)
            w[0, 0] = torch.where(outside, torch.tensor(float("inf"), dtype=dtype), w[0, 0])
            w[0, 1] = torch.where(outside, torch.tensor(float("-inf"), dtype=dtype), w[0, 1])
            window = ([stride, stride], [3, 3], [1, 1])
            if kind.grad_weight:  # an infinite grad_output in one channel at the corner pixel
                g = torch.randn(1, 8, 6 // stride, 16 // stride, dtype=dtype)
                g[0, 5, 0, 0] = float("inf")
                args = (g, torch.randn(1, 8, 6, 16, dtype=dtype), [7, 7], *window, 2)
                out = kind.launch(*args, _result(kind, args), launcher)
                expected = kind.chunked(*args, _result(kind, args), EmulatedLauncher())
                assert torch.isinf(expected).any() and not torch.isnan(expected).any()
                assert torch.equal(out.view(bits), expected.view(bits)), (dtype, stride)
                continue
            if kind.grad_input:
                args = (torch.randn(1, 8, 6 // stride, 16 // stride, dtype=dtype), w, [6, 16], *window)
            else:  # (the wide forward's: a 16-bit thread's 8 channels a group)
                args = (torch.randn(1, 16 if kind.wide else 8, 6, 16, dtype=dtype), w, *window)
            out = kind.launch(*args, _result(kind, args), launcher)
            expected = kind.chunked(*args, _result(kind, args), EmulatedLauncher())
            assert torch.isfinite(expected).all()
            assert torch.equal(out.view(bits), expected.view(bits)), (dtype, stride)


@pytest.mark.parametrize("kind", KINDS)
def test_infinite_weights_at_taps_outside_the_image_add_nothing(kind):
    require_host_compiler()
    _infinite_weights_outside(KINDS[kind], EmulatedLauncher())


@pytest.mark.parametrize("kind", KINDS)
def test_vectors_match_the_reference_on_the_registry_samples(kind):
    """The registry's contiguous samples a kernel serves, the float64 reference; the rest
    declined (None), none silently computed. The forward serves the 4-byte and 8-byte dtypes'
    3x3 sample (two channels a group); the 2-byte dtypes take four channels a thread, more than
    any sample's group has, and the random geometries above cover them."""
    require_host_compiler()
    kind = KINDS[kind]
    spec, launcher, served = registry.get(kind.op), EmulatedLauncher(), {}
    for dtype in registry.FLOAT_DTYPES:
        for sample in spec.sample_inputs("cpu", dtype, False):
            result = kind.launch(*sample.args, _result(kind, sample.args), launcher)
            if result is None:
                continue
            served[dtype] = served.get(dtype, 0) + (result.numel() > 0)  # (an empty output launches nothing)
            assert_matches_reference(spec, sample, result, dtype)
    assert len(launcher.launches) == sum(served.values())
    if not kind.grad_input:
        assert served.get(torch.float32) and served.get(torch.float64)


def test_vectors_decline_what_they_do_not_serve():
    """Channels_last operands, dilation, a non-square kernel, unequal strides, a kernel size
    without an instantiation, a horizontal padding other than K // 2, a width or output width
    not a multiple of the vector, a group's channels not a multiple of a thread's (forward and
    grad_input), a pointer not aligned to the vector, and for grad_input any stride but 1: None,
    the output untouched."""
    x, w = torch.randn(1, 8, 8, 8), torch.randn(1, 2, 3, 3, 8, 8)
    out = torch.full((1, 8, 8, 8), 7.0)
    launcher = EmulatedLauncher()
    misaligned = torch.empty(x.numel() + 1)[1:].view(x.shape).copy_(x)
    declined = [
        (x.to(memory_format=torch.channels_last), w, [1, 1], [1, 1], [1, 1]),
        (x, w, [1, 1], [2, 2], [2, 2]),
        (x, torch.randn(1, 2, 3, 5, 8, 8), [1, 1], [1, 2], [1, 1]),
        (x, torch.randn(1, 2, 3, 3, 8, 4), [1, 2], [1, 1], [1, 1]),
        (x, torch.randn(1, 2, 9, 9, 8, 8), [1, 1], [4, 4], [1, 1]),
        (x, torch.randn(1, 2, 3, 3, 8, 8), [1, 1], [1, 0], [1, 1]),  # (its output would be wider)
        (torch.randn(1, 8, 8, 6), torch.randn(1, 2, 3, 3, 8, 6), [1, 1], [1, 1], [1, 1]),
        (x, torch.randn(1, 8, 3, 3, 8, 8), [1, 1], [1, 1], [1, 1]),  # one channel a group
        (misaligned, w, [1, 1], [1, 1], [1, 1]),
    ]
    for x_or_g, weight, stride, padding, dilation in declined:
        assert involution_cuda.involution_vectors(x_or_g, weight, stride, padding, dilation, out, launcher) is None
        assert involution_cuda.involution_vectors_backward_input(x_or_g, weight, [8, 8], stride, padding, dilation, out,
                                                                 launcher) is None
    g = torch.randn(1, 8, 4, 4)
    strided = involution_cuda.involution_vectors_backward_input(g, torch.randn(1, 2, 3, 3, 4, 4), [8, 8], [2, 2],
                                                                [1, 1], [1, 1], out, launcher)
    assert strided is None
    assert not launcher.launches and torch.equal(out, torch.full_like(out, 7.0))
    grad_weight = torch.full((1, 2, 3, 3, 8, 8), 7.0)
    g = torch.randn(1, 8, 8, 8)
    declined_grad_weight = [  # (grad_output, input, kernel size, stride, padding, dilation)
        (g, x.to(memory_format=torch.channels_last), [3, 3], [1, 1], [1, 1], [1, 1]),
        (g, x, [3, 3], [1, 1], [2, 2], [2, 2]),
        (g, x, [3, 5], [1, 1], [1, 2], [1, 1]),
        (g, x, [9, 9], [1, 1], [4, 4], [1, 1]),
        (g, x, [3, 3], [1, 1], [1, 0], [1, 1]),
        (torch.randn(1, 8, 8, 6), torch.randn(1, 8, 8, 6), [3, 3], [1, 1], [1, 1], [1, 1]),
        (g, misaligned, [3, 3], [1, 1], [1, 1], [1, 1]),
    ]
    for args in declined_grad_weight:
        assert involution_cuda.involution_vectors_backward_weight(*args, 2, grad_weight, launcher) is None
    assert not launcher.launches and torch.equal(grad_weight, torch.full_like(grad_weight, 7.0))


# Bugs a review could miss, per kernel. Two change values, which the reference check must
# catch, and that also read past the tensor, which ASan must catch: a bottom border one row late
# (the next channel's first row), and a vector that starts at the row's end taken as inside (the
# next row's first values, under weights not zeroed; the bound is the three kernels' shared
# helper). In the forward, one changes values only where a weight is infinite, which the
# infinite-weight check must catch: the weights of taps outside the image not zeroed (an inf
# times the window's -0 is NaN); in grad_weight, the sums of taps outside not reset to +0 (an
# infinite grad_output times the window's -0). grad_input has no such weight to keep: a tap
# outside its row reads no weight (the vector is not loaded), and its zeroing only keeps a -0
# sum's sign. The forward's WIDE instantiations share its code, so its first plant is checked
# there too.
PLANTS = {
    ("forward", "row-bound-one-past"): ("if (y < 0 || y >= H) continue;", "if (y < 0 || y > H) continue;"),
    ("forward, wide", "row-bound-one-past"): ("if (y < 0 || y >= H) continue;", "if (y < 0 || y > H) continue;"),
    ("forward", "vector-bound-one-past"): ("first + v * PIXELS < width;", "first + v * PIXELS <= width;"),
    ("forward", "outside-weights-kept"): ("if (!vector_inside[(OFFSET + p * STRIDE + b) / PIXELS]) w[b][p] = 0;", ";"),
    ("grad_input", "row-bound-one-past"): ("if (i < 0 || i >= OH) continue;", "if (i < 0 || i > OH) continue;"),
    ("grad_input", "vector-bound-one-past"): ("first + v * PIXELS < width;", "first + v * PIXELS <= width;"),
    ("grad_weight", "row-bound-one-past"): ("if (y >= 0 && y < H) {", "if (y >= 0 && y <= H) {"),
    ("grad_weight", "vector-bound-one-past"): ("first + v * PIXELS < width;", "first + v * PIXELS <= width;"),
    ("grad_weight", "outside-weights-kept"): ("if (!vector_inside[(OFFSET + p * STRIDE + b) / PIXELS]) sum[b][p] = 0;",
                                              ";"),
}
VALUE_PLANTS = [key for key in PLANTS if key[1] != "outside-weights-kept"]
WEIGHT_PLANTS = [key for key in PLANTS if key[1] == "outside-weights-kept"]
# A bug of the WIDE instantiations alone, which the reference check must catch (it reads
# nothing it should not: half of each item's channels are never written): a thread of them
# taking a narrow thread's channels.
WIDE_PLANTS = {("forward, wide", "wide-takes-narrow-channels"): (
    "constexpr int CHANNELS = Vectors<scalar_t>::channels * (WIDE ? VECTORS_WIDE_FACTOR : 1);",
    "constexpr int CHANNELS = Vectors<scalar_t>::channels;")}


def _use(monkeypatch, planted) -> None:
    real_load = involution_cuda.load_source
    monkeypatch.setattr(involution_cuda, "load_source",
                        lambda name: planted if name == involution_cuda.VECTORS_SOURCE else real_load(name))


@pytest.mark.parametrize("plant", VALUE_PLANTS + list(WIDE_PLANTS), ids="-".join)
def test_a_planted_bug_fails_the_reference_check(plant, tmp_path, monkeypatch):
    require_host_compiler()
    _use(monkeypatch, _planted(tmp_path, involution_cuda.VECTORS_SOURCE, *{**PLANTS, **WIDE_PLANTS}[plant]))
    with pytest.raises(AssertionError):
        _check_random(KINDS[plant[0]], EmulatedLauncher(), cases=12, seed=5, dtypes=(torch.float32,))


@pytest.mark.parametrize("plant", WEIGHT_PLANTS, ids="-".join)
def test_kept_outside_weights_fail_the_infinite_weight_check(plant, tmp_path, monkeypatch):
    require_host_compiler()
    _use(monkeypatch, _planted(tmp_path, involution_cuda.VECTORS_SOURCE, *PLANTS[plant]))
    with pytest.raises(AssertionError):
        _infinite_weights_outside(KINDS[plant[0]], EmulatedLauncher(), dtypes=(torch.float32,))


_RUN_RANDOM = """
from oplib.testing.cuda_emulation import EmulatedLauncher
from oplib.testing.device_model import RecordingLauncher
from test_cuda_vectors import KINDS, _check_random
launcher = EmulatedLauncher(sanitize=True)
for kind in KINDS.values():
    _check_random(kind, launcher, cases=2, seed=9)
print("clean:", len(launcher.launches), "launches")
"""


@pytest.mark.integration
def test_vectors_are_clean_under_address_sanitizer():
    """Every instantiation of both kernels in every dtype on random geometries: no access
    outside the tensors (the emulation's buffers are exact-size heap blocks)."""
    require_host_compiler()
    assert_clean_under_asan(_RUN_RANDOM)


# Per plant, a call whose over-read leaves the tensor: the last channel's last row reads the
# row below the image, and the last row's last vector the vector past its end.
_FORWARD_CALL = """
    x, w = torch.randn(1, 4, 4, 8), torch.randn(1, 1, 3, 3, 4, 8)
    ops.involution_vectors(x, w, [1, 1], [1, 1], [1, 1], torch.empty(1, 4, 4, 8), launcher)
"""
_GRAD_INPUT_CALL = """
    g, w = torch.randn(1, 4, 4, 8), torch.randn(1, 1, 3, 3, 4, 8)
    ops.involution_vectors_backward_input(g, w, [4, 8], [1, 1], [1, 1], [1, 1], torch.empty(1, 4, 4, 8), launcher)
"""
_GRAD_WEIGHT_CALL = """
    g, x = torch.randn(1, 4, 4, 8), torch.randn(1, 4, 4, 8)
    ops.involution_vectors_backward_weight(g, x, [3, 3], [1, 1], [1, 1], [1, 1], 1, torch.empty(1, 1, 3, 3, 4, 8),
                                           launcher)
"""
_WIDE_FORWARD_CALL = """
    x, w = torch.randn(1, 4, 4, 8), torch.randn(1, 1, 3, 3, 4, 8)
    ops.involution_vectors(x, w, [1, 1], [1, 1], [1, 1], torch.empty(1, 4, 4, 8), launcher, ops.VECTORS_WIDE)
    assert launcher.launches[-1][4] == ("3", "1", "true")
"""
ASAN_CALLS = {"forward": _FORWARD_CALL, "forward, wide": _WIDE_FORWARD_CALL, "grad_input": _GRAD_INPUT_CALL,
              "grad_weight": _GRAD_WEIGHT_CALL}


@pytest.mark.integration
@pytest.mark.parametrize("plant", VALUE_PLANTS, ids="-".join)
def test_address_sanitizer_catches_a_planted_over_read(plant, tmp_path):
    require_host_compiler()
    assert_asan_catches(_planted(tmp_path, involution_cuda.VECTORS_SOURCE, *PLANTS[plant]), ASAN_CALLS[plant[0]])
