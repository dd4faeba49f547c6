"""The CUDA kernels compiled for the host (oplib.testing.cuda_emulation) and run through the
ops' real dispatch code on CPU tensors, against the float64 reference: every op's kernels on
registry and random samples, grid-stride loops, gradcheck, each specialised kernel, the 64-bit
instantiations, the launch policy read from the source, channels_last operands; and the bugs
planted in the real kernels fail that check."""

from __future__ import annotations

import dataclasses
import itertools
import random

import pytest
import torch

import oplib.kernels
from oplib.kernels import cuda_launch
from oplib import registry
from oplib._memory_format import is_channels_last
from oplib._torch_private import FakeTensorMode, maybe_get_opdef
from oplib.kernels.involution import cuda as involution_cuda
from oplib.kernels import CUDA_DISPATCH, KernelSource, load_source
from oplib.testing import assert_matches_reference
from oplib.testing.cuda_emulation import EmulatedLauncher
from oplib.testing.toolchain import require_host_compiler

from cuda_test_helpers import LAUNCHES, planted_generated_column_bound, planted_tap_bound, random_samples


# The unit tier's dtypes: one of each width the kernels convert from (float16 takes
# bfloat16's 16-bit paths, float64 its own instantiations, which the unit tier runs below and
# through gradcheck); the integration tier all four (32 s of the unit tier's CPU time here).
UNIT_DTYPES = (torch.float32, torch.bfloat16)


@pytest.mark.parametrize("dtype", [dtype if dtype in UNIT_DTYPES else pytest.param(dtype, marks=pytest.mark.integration)
                                   for dtype in registry.FLOAT_DTYPES], ids=str)
@pytest.mark.parametrize("name", list(LAUNCHES))
def test_emulated_kernels_match_reference(name, dtype):
    """Registry samples plus random shapes, through the dispatch code the CUDA registration
    uses; only the kernels the dispatch declares are launched."""
    require_host_compiler()
    spec = registry.get(name)
    launcher = EmulatedLauncher()
    samples = [*spec.sample_inputs("cpu", dtype, False), *random_samples(spec, dtype, 40, seed=hash(name) % 1000)]
    for sample in samples:
        out = LAUNCHES[name](*sample.args, launcher)
        assert_matches_reference(spec, sample, out, dtype)
    launched = {launch[0] for launch in launcher.launches}
    assert launched and launched <= set(LAUNCHES[name].kernels), launched


@pytest.mark.parametrize("name", list(LAUNCHES))
def test_grid_stride_loops_cover_tensors_larger_than_the_grid(monkeypatch, name):
    require_host_compiler()
    monkeypatch.setattr(cuda_launch, "MAX_BLOCKS", 2)
    spec = registry.get(name)
    launcher = EmulatedLauncher()
    samples = random_samples(spec, torch.float64, 10, seed=7)
    if not samples:
        pytest.skip(f"{name}'s spec has no random_sample, whose shapes outgrow a two-block grid")
    for sample in samples:
        assert_matches_reference(spec, sample, LAUNCHES[name](*sample.args, launcher), torch.float64)
    assert launcher.launches and all(launch[2] <= 2 for launch in launcher.launches)


@pytest.fixture
def emulated_cpu_kernels():
    """Route every op with CUDA kernels through its CUDA dispatch on CPU tensors, with the
    host emulation's launcher in place of CuPy's."""
    require_host_compiler()
    launcher = EmulatedLauncher()
    opdefs = [maybe_get_opdef(qualname) for qualname in CUDA_DISPATCH]
    for opdef, dispatch in zip(opdefs, CUDA_DISPATCH.values()):
        opdef.register_kernel("cpu")(lambda *args, dispatch=dispatch: dispatch(*args, launcher))
    yield launcher
    # Back to each op's own CPU kernel: the function custom_op was given (what torch itself
    # falls back to when a device kernel is disabled). Without this the emulated kernels stay
    # registered for the rest of the session; they skip the argument checks and return
    # tensors over the emulation's buffers.
    for opdef in opdefs:
        opdef.register_kernel("cpu")(opdef._init_fn)


@pytest.mark.parametrize("name", list(LAUNCHES))
def test_gradcheck_through_emulated_kernels(name, emulated_cpu_kernels):
    spec = registry.get(name)
    # Three samples: the full Jacobians take thousands of kernel launches each.
    for sample in list(spec.sample_inputs("cpu", torch.float64, True))[1:4]:
        assert torch.autograd.gradcheck(spec.op, sample.args), sample.name
        assert torch.autograd.gradgradcheck(spec.op, sample.args, fast_mode=True), sample.name
    launched = {launch[0] for launch in emulated_cpu_kernels.launches}
    # the op's own kernels ran (involution_generated's float64 calls go to the tiled or the
    # generic kernel, whichever serves the window; its tensor-core one takes 16-bit values only)
    assert launched & set(LAUNCHES[name].kernels), launched
    assert launched <= {kernel for dispatch in LAUNCHES.values() for kernel in dispatch.kernels}, launched


# ---------------------------------------------------------------------------------------
# The specialised involution kernels (involution_*_chunked in involution.cu)
# ---------------------------------------------------------------------------------------

INVOLUTION_SPECS = [registry.get(name) for name in ("involution", "involution_backward_input", "involution_backward_weight")]


def _chunked_case(rng: random.Random, kernel: int, stride: int, dtype: torch.dtype, channels_last: bool):
    """Random involution operands of one specialised geometry: (input, weight, grad_output,
    stride, padding, groups), in the layout a channels_last model hands the kernels or in
    contiguous NCHW."""
    groups = rng.choice([1, 2, 3])
    per_group = rng.choice([1, 2, 3, 4, 8, 16, 24, 32])
    n, height, width = rng.choice([1, 2]), rng.randint(1, 12), rng.randint(1, 12)
    pad = [rng.randint(0, kernel - 1), rng.randint(0, kernel - 1)]
    height, width = max(height, kernel - 2 * pad[0]), max(width, kernel - 2 * pad[1])
    out_h, out_w = (height + 2 * pad[0] - kernel) // stride + 1, (width + 2 * pad[1] - kernel) // stride + 1
    channels = groups * per_group
    x = torch.randn(n, channels, height, width, dtype=torch.float64).to(dtype)
    w = torch.randn(n, groups, kernel, kernel, out_h, out_w, dtype=torch.float64).to(dtype)
    g = torch.randn(n, channels, out_h, out_w, dtype=torch.float64).to(dtype)
    if channels_last:
        x, g = x.contiguous(memory_format=torch.channels_last), g.contiguous(memory_format=torch.channels_last)
        w = w.permute(0, 4, 5, 1, 2, 3).contiguous().permute(0, 3, 4, 5, 1, 2)
    return x, w, g, [stride, stride], pad, groups


def _three_ops(x, w, g, stride, pad, groups, launcher, policy=involution_cuda.CHUNKED, ops=(0, 1, 2)):
    """The three involution ops (those of ``ops``: 0 forward, 1 grad_input, 2 grad_weight)
    through their CUDA dispatch code, with ``launcher`` and ``policy`` (default: the chunked
    kernels wherever they serve, involution_vectors.cu's tested in test_cuda_vectors.py)."""
    kernel, (height, width) = w.shape[2], x.shape[2:]
    calls = (
        lambda: involution_cuda.launch_involution(x, w, stride, pad, [1, 1], launcher, policy),
        lambda: involution_cuda.launch_involution_backward_input(g, w, [height, width], stride, pad, [1, 1], launcher,
                                                                 policy),
        lambda: involution_cuda.launch_involution_backward_weight(g, x, [kernel, kernel], stride, pad, [1, 1], groups,
                                                                  launcher, policy),
    )
    return tuple(calls[op]() for op in ops)


def _check_chunked_against_reference(launcher, cases: int, seed: int, policy=involution_cuda.CHUNKED,
                                     ops=(0, 1, 2)) -> set:
    """``cases`` random specialised geometries per (kernel, stride, layout), every dtype,
    against the float64 reference, for the ops of ``ops`` (``_three_ops``); returns the
    specialisations launched."""
    rng = random.Random(seed)
    for kernel, stride, channels_last in itertools.product((3, 5, 7), (1, 2), (False, True)):
        for case in range(cases):
            dtype = registry.FLOAT_DTYPES[case % len(registry.FLOAT_DTYPES)]
            x, w, g, stride_pair, pad, groups = _chunked_case(rng, kernel, stride, dtype, channels_last)
            outs = _three_ops(x, w, g, stride_pair, pad, groups, launcher, policy, ops)
            args = ((x, w, stride_pair, pad, [1, 1]),
                    (g, w, list(x.shape[2:]), stride_pair, pad, [1, 1]),
                    (g, x, [kernel, kernel], stride_pair, pad, [1, 1], groups))
            for op, out in zip(ops, outs):
                sample = registry.SampleInput(args[op], f"k{kernel}-s{stride}-cl{channels_last}-{dtype}-{case}")
                assert_matches_reference(INVOLUTION_SPECS[op], sample, out, dtype)
    return {(launch[0], launch[4]) for launch in launcher.launches}


def test_every_specialised_kernel_matches_the_reference():
    """Every kernel size, stride and layout the specialised kernels cover, all four dtypes,
    random sizes, groups, channels per group and padding, against the float64 reference; every
    32-bit instantiation of the three kernels is launched."""
    require_host_compiler()
    launched = _check_chunked_against_reference(EmulatedLauncher(), cases=8, seed=11)
    for kernel in ("involution_forward_chunked", "involution_backward_input_chunked", "involution_backward_weight_chunked"):
        for specialisation in load_source(involution_cuda.SOURCE).specialisations[kernel]:
            if specialisation[0] == "int":
                assert (kernel, specialisation) in launched, (kernel, specialisation)


def test_the_64_bit_instantiations_match_the_reference():
    """With the 32-bit limit at zero every launch takes the long long instantiations, which
    tensors past 2^31 elements get on a GPU."""
    require_host_compiler()
    policy = dataclasses.replace(involution_cuda.CHUNKED, index32_limit=0)
    launched = _check_chunked_against_reference(EmulatedLauncher(), cases=2, seed=12, policy=policy)
    assert launched and all(specialisation[0] == "long long" for _, specialisation in launched if specialisation)


def test_huge_tensors_take_the_64_bit_instantiations():
    """Meta tensors of 2^31 elements and more (no memory) choose long long offsets; one
    element fewer than the limit still chooses int."""
    policy = involution_cuda.POLICY
    limit = policy.index32_limit
    small = torch.empty(limit, device="meta")
    big = torch.empty(limit + 1, device="meta")
    huge = torch.empty(2**31 + 5, device="meta")
    window = ((7, 7), (2, 2), (1, 1))
    assert policy.specialisation(*window, False, small)[0] == "int"
    assert policy.specialisation(*window, True, small, big)[0] == "long long"
    assert policy.specialisation(*window, False, huge)[0] == "long long"
    # And the limit leaves a whole grid of room below 2^31, so a grid-stride index never wraps.
    assert limit + oplib.kernels.MAX_BLOCKS * oplib.kernels.BLOCK_SIZE <= 2**31 - 1


def test_the_launch_policy_is_read_from_the_source(tmp_path):
    """The policy's facts come from involution.cu's own lines (its oplib-template lists and
    constexpr constants, and element.cuh's VECTOR_BYTES): a source that says otherwise gives
    another policy, and the chunked kernels then serve only what it lists."""
    source = load_source(involution_cuda.SOURCE)
    policy = involution_cuda.LaunchPolicy.from_source(source)
    assert (policy.kernel_sizes, policy.strides) == ((3, 5, 7), (1, 2))
    assert (policy.max_channels, policy.max_channels_8_byte, policy.vector_bytes) == (16, 8, 16)
    assert policy.lanes(torch.float16) == 8 and policy.lanes(torch.float64) == 2
    changed = source.text.replace("// oplib-template: KERNEL = 3 | 5 | 7", "// oplib-template: KERNEL = 3 | 7")
    changed = changed.replace("constexpr int CHUNK_MAX_CHANNELS = 16;", "constexpr int CHUNK_MAX_CHANNELS = 12;")
    assert changed.count("KERNEL = 3 | 7") == 1 and changed.count("CHUNK_MAX_CHANNELS = 12;") == 1, "update the test"
    other = involution_cuda.LaunchPolicy.from_source(KernelSource(tmp_path / "involution.cu", changed))
    assert other.kernel_sizes == (3, 7) and other.max_channels == 12
    tensor = torch.empty(8)
    assert other.specialisation((5, 5), (1, 1), (1, 1), False, tensor) is None
    assert policy.specialisation((5, 5), (1, 1), (1, 1), False, tensor) == ("int", "5", "1", "false")
    assert dataclasses.replace(other, target_threads=1).channels_per_thread(24, 1, torch.float32, 1) == 12


def test_specialised_kernels_give_the_generic_kernels_bits():
    """Each sum adds its terms in the generic kernel's order, so the specialised kernels'
    results are bit-identical to the generic ones, in every dtype and both layouts."""
    require_host_compiler()
    rng = random.Random(13)
    chunked, generic = EmulatedLauncher(), EmulatedLauncher()
    for case in range(36):
        kernel, stride, channels_last = rng.choice((3, 5, 7)), rng.choice((1, 2)), case % 2 == 1
        dtype = registry.FLOAT_DTYPES[case % len(registry.FLOAT_DTYPES)]
        x, w, g, stride_pair, pad, groups = _chunked_case(rng, kernel, stride, dtype, channels_last)
        fast = _three_ops(x, w, g, stride_pair, pad, groups, chunked)
        generic_only = dataclasses.replace(involution_cuda.POLICY, kernel_sizes=())
        slow = _three_ops(x, w, g, stride_pair, pad, groups, generic, generic_only)
        for a, b in zip(fast, slow):
            assert torch.equal(a, b), (kernel, stride, channels_last, dtype)
    assert all(launch[0].endswith("_chunked") for launch in chunked.launches)
    assert not any(launch[0].endswith("_chunked") for launch in generic.launches)


class _RecordingLauncher(EmulatedLauncher):
    """The emulation, also keeping each launch's tensor arguments."""

    def __init__(self):
        super().__init__()
        self.tensors: list[list[torch.Tensor]] = []

    def launch(self, source, kernel, dtype, config, args, specialisation=()):
        self.tensors.append([a for a in args if isinstance(a, torch.Tensor)])
        super().launch(source, kernel, dtype, config, args, specialisation)


def test_channels_last_operands_are_read_in_place_and_results_keep_the_layout():
    """A channels_last model's operands (activations channels_last, the weight pixel-major, as a
    channels_last convolution's output views into it) go to the channels_last kernels as they
    are, no copy, and every result comes back in the same layout, as the fakes say."""
    require_host_compiler()
    launcher = _RecordingLauncher()
    x = torch.randn(2, 32, 14, 14).contiguous(memory_format=torch.channels_last)
    # RedNet's weight: a channels_last convolution's (N, G*K*K, Ho, Wo) output, viewed.
    w = torch.randn(2, 2 * 49, 7, 7).contiguous(memory_format=torch.channels_last).view(2, 2, 7, 7, 7, 7)
    g = torch.randn(2, 32, 7, 7).contiguous(memory_format=torch.channels_last)
    out, grad_input, grad_weight = _three_ops(x, w, g, [2, 2], [3, 3], 2, launcher)
    assert [launch[4][3] for launch in launcher.launches] == ["true"] * 3
    reads = [{t.data_ptr() for t in tensors} for tensors in launcher.tensors]
    assert {x.data_ptr(), w.data_ptr()} <= reads[0]
    assert {g.data_ptr(), w.data_ptr()} <= reads[1]
    assert {g.data_ptr(), x.data_ptr()} <= reads[2]
    assert out.is_contiguous(memory_format=torch.channels_last) and not out.is_contiguous()
    assert grad_input.is_contiguous(memory_format=torch.channels_last) and not grad_input.is_contiguous()
    assert grad_weight.permute(0, 4, 5, 1, 2, 3).is_contiguous() and grad_weight.stride() == w.stride()
    for op, args, result in (
        (torch.ops.oplib.involution, (x, w, [2, 2], [3, 3], [1, 1]), out),
        (torch.ops.oplib.involution_backward_input, (g, w, [14, 14], [2, 2], [3, 3], [1, 1]), grad_input),
        (torch.ops.oplib.involution_backward_weight, (g, x, [7, 7], [2, 2], [3, 3], [1, 1], 2), grad_weight),
    ):
        cpu = op(*args)
        with FakeTensorMode() as mode:
            fake = op(*(mode.from_tensor(a) if isinstance(a, torch.Tensor) else a for a in args))
        assert cpu.stride() == fake.stride() == result.stride(), op
        torch.testing.assert_close(result, cpu, atol=1e-4, rtol=1e-4)


def test_misaligned_channels_last_takes_the_contiguous_kernels():
    """The channels_last kernels move 16-byte vectors; an input whose data does not start on a
    16-byte boundary (a view at an odd offset into a buffer) goes to the contiguous layout's
    kernels instead, and the result is still right and still channels_last."""
    require_host_compiler()
    launcher = EmulatedLauncher()
    buffer = torch.randn(32 * 9 * 9 + 1)
    x = buffer[1:].view(1, 9, 9, 32).permute(0, 3, 1, 2)  # channels_last, one float past an aligned address
    assert is_channels_last(x) and x.data_ptr() % 16 != 0
    w = torch.randn(1, 2, 7, 7, 9, 9)
    out = involution_cuda.launch_involution(x, w, [1, 1], [3, 3], [1, 1], launcher)
    assert launcher.launches[-1][4][3] == "false"
    assert out.is_contiguous(memory_format=torch.channels_last)
    torch.testing.assert_close(out, torch.ops.oplib.involution(x.contiguous(), w, [1, 1], [3, 3], [1, 1]),
                               atol=1e-4, rtol=1e-4)


def test_a_planted_off_by_one_tap_bound_fails_the_reference_check(tmp_path, monkeypatch):
    require_host_compiler()
    monkeypatch.setattr(involution_cuda, "load_source", lambda filename: planted_tap_bound(tmp_path))
    with pytest.raises(AssertionError, match="Tensor-likes are not close"):
        # The forward alone: the bound is the three kernels' shared helper, and each kernel
        # compiled for the plant costs seconds.
        _check_chunked_against_reference(EmulatedLauncher(), cases=2, seed=15, ops=(0,))


def _generic_generated_forward(args: tuple, launcher) -> torch.Tensor:
    """involution_generated's generic kernel (the op's CUDA forward where neither fused kernel
    serves the call), called directly."""
    from oplib.kernels.involution.layouts import result_like

    out = result_like(args[0], args[1].shape[2:])
    return involution_cuda._generated("involution_generated_forward", *args, out, launcher)


@pytest.mark.parametrize("dtype", registry.FLOAT_DTYPES, ids=str)
def test_the_generic_generated_forward_matches_the_reference(dtype):
    """The generic kernel on every sample, also those the fused kernels serve in the op's
    dispatch (which takes it only where they decline: float64's wide windows, geometries past
    the tiles)."""
    require_host_compiler()
    spec = registry.get("involution_generated")
    launcher = EmulatedLauncher()
    for sample in [*spec.sample_inputs("cpu", dtype, False), *random_samples(spec, dtype, 20, seed=23)]:
        assert_matches_reference(spec, sample, _generic_generated_forward(sample.args, launcher), dtype)
    assert {launch[0] for launch in launcher.launches} == {"involution_generated_forward"}


@pytest.mark.parametrize("dtype", registry.FLOAT_DTYPES, ids=str)
def test_the_generic_generated_grad_input_matches_the_reference(dtype):
    """involution_generated_backward_input's generic kernel, called directly: the op's CUDA
    grad_input goes through the span conv's map and involution's grad_input kernels, and the
    benches time this kernel beside it."""
    from oplib.kernels.involution.layouts import result_like

    require_host_compiler()
    spec = registry.get("involution_generated_backward_input")
    launcher = EmulatedLauncher()
    for sample in [*spec.sample_inputs("cpu", dtype, False), *random_samples(spec, dtype, 20, seed=29)]:
        grad_output, feature, span_weight, span_bias, input_size, *window = sample.args
        out = result_like(grad_output, input_size)
        involution_cuda.involution_generated_backward_input_generic(grad_output, feature, span_weight, span_bias,
                                                                    input_size, *window, out, launcher)
        assert_matches_reference(spec, sample, out, dtype)
    assert {launch[0] for launch in launcher.launches} == {"involution_generated_backward_input"}


def test_the_generated_grad_input_goes_through_the_map():
    """The op's CUDA grad_input: no kernel of its own, the span conv's weight then involution's
    grad_input kernel that serves the call (the vectors kernel at a contiguous NCHW call it
    serves, the chunked kernel in channels_last), with the same result as the span conv's
    weight handed to involution_backward_input."""
    from oplib.kernels.involution.cpu import generated_weight
    from oplib.testing.device_model import RecordingLauncher

    require_host_compiler()
    for layout, kernel in ((torch.contiguous_format, "involution_backward_input_vectors"),
                           (torch.channels_last, "involution_backward_input_chunked")):
        g = torch.randn(2, 32, 8, 8).contiguous(memory_format=layout)
        f = torch.randn(2, 8, 8, 8).contiguous(memory_format=layout)
        span, bias = torch.randn(2 * 49, 8), torch.randn(2 * 49)
        window = ([7, 7], [1, 1], [3, 3], [1, 1])
        recording = RecordingLauncher()
        LAUNCHES["involution_generated_backward_input"](g, f, span, bias, [8, 8], *window, recording)
        assert [launch.kernel for launch in recording.launches] == [kernel]
        got = LAUNCHES["involution_generated_backward_input"](g, f, span, bias, [8, 8], *window, EmulatedLauncher())
        expected = LAUNCHES["involution_backward_input"](g, generated_weight(f, span, bias, [7, 7]), [8, 8], *window[1:],
                                                         EmulatedLauncher())
        assert torch.equal(got, expected)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_the_generated_grad_input_keeps_its_16_bit_map_route_well_inside_the_tolerance(dtype):
    """16-bit operands go through the map in float32, rounded once at the end. A 16-bit map
    (each weight rounded before grad_input's sums over the taps) came up to 0.9x of the op's
    tolerance of the float64 reference here, by the thread count, and past it in one run of the
    sanitizer's tier: every registry sample and random ones must stay under half of it, at one
    thread and at two (this failed before)."""
    require_host_compiler()
    from oplib.testing.helpers import reference_output

    spec = registry.get("involution_generated_backward_input")
    atol, rtol = spec.tolerance(dtype)
    threads = torch.get_num_threads()
    try:
        for count in (1, 2):
            torch.set_num_threads(count)
            for sample in [*spec.sample_inputs("cpu", dtype, False), *random_samples(spec, dtype, 10, seed=31)]:
                out = LAUNCHES["involution_generated_backward_input"](*sample.args, EmulatedLauncher())
                expected = reference_output(spec, sample)
                if out.numel() == 0:  # the empty batch
                    continue
                share = ((out.double() - expected).abs() / (atol + rtol * expected.abs())).max().item()
                assert share <= 0.5, (sample.name, count, share)
    finally:
        torch.set_num_threads(threads)


def test_the_op_dispatch_takes_the_fused_kernel_that_serves_the_call():
    """Tensor cores for 16-bit values where an output row fills a 16-pixel run or a folded one
    (a 7x7 map), the tile where it does neither (a 12-wide map), the tile for float32, the
    generic kernel where the tile declines (float64's 7x7 windows, past its shared memory)."""
    from oplib.testing.device_model import RecordingLauncher

    def kernel(dtype, size, window):
        x, f = torch.randn(1, 32, size, size, dtype=dtype), torch.randn(1, 8, size, size, dtype=dtype)
        span, bias = torch.randn(2 * window * window, 8, dtype=dtype), torch.randn(2 * window * window, dtype=dtype)
        recording = RecordingLauncher()
        LAUNCHES["involution_generated"](x, f, span, bias, [window] * 2, [1, 1], [window // 2] * 2, [1, 1], recording)
        return [launch.kernel.split("<")[0] for launch in recording.launches]

    assert kernel(torch.bfloat16, 16, 7) == ["involution_generated_mma"]
    assert kernel(torch.float16, 28, 3) == ["involution_generated_mma"]
    assert kernel(torch.bfloat16, 7, 7) == ["involution_generated_mma"]
    assert kernel(torch.bfloat16, 12, 7) == ["involution_generated_tile"]
    assert kernel(torch.float32, 16, 7) == ["involution_generated_tile"]
    assert kernel(torch.float64, 16, 3) == ["involution_generated_tile"]
    assert kernel(torch.float64, 16, 7) == ["involution_generated_forward"]


def test_a_planted_off_by_one_in_the_generated_kernels_fails_the_reference_check(tmp_path, monkeypatch):
    require_host_compiler()
    planted = planted_generated_column_bound(tmp_path)
    real = involution_cuda.load_source
    monkeypatch.setattr(involution_cuda, "load_source",
                        lambda filename: planted if filename == involution_cuda.GENERATED_SOURCE else real(filename))
    spec = registry.get("involution_generated")
    with pytest.raises(AssertionError, match="Tensor-likes are not close"):
        for sample in spec.sample_inputs("cpu", torch.float64, False):
            assert_matches_reference(spec, sample, _generic_generated_forward(sample.args, EmulatedLauncher()), torch.float64)


_TWO_KERNELS = """
template <typename scalar_t>
__global__ void add_one(const scalar_t* x, scalar_t* out, int n) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = x[i] + scalar_t(1);
}

template <typename scalar_t>
__global__ void add_two(const scalar_t* x, scalar_t* out, int n) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = x[i] + scalar_t(2);
}
"""


def test_a_launch_builds_only_its_kernel_in_its_dtype(tmp_path, monkeypatch):
    """One host library a kernel and dtype: a launch compiles what it runs (a planted bug's test
    compiles one kernel of involution.cu in one dtype, not its 300 instantiations), and a second
    launch of another kernel or dtype adds its own library beside the first."""
    require_host_compiler()
    from oplib.testing import cuda_emulation

    monkeypatch.setattr(cuda_emulation, "_CACHE_DIR", tmp_path / "cache")
    path = tmp_path / "two.cu"
    path.write_text(_TWO_KERNELS)
    source = KernelSource(path, path.read_text())
    launcher = EmulatedLauncher()
    x = torch.arange(10.0)
    for kernel, dtype, added in [("add_two", torch.float64, 2), ("add_two", torch.float32, 2), ("add_one", torch.float32, 1)]:
        out = torch.empty_like(x, dtype=dtype)
        launcher.launch(source, kernel, dtype, oplib.kernels.linear_config(10), (x.to(dtype), out, 10))
        torch.testing.assert_close(out, x.to(dtype) + added)
    libraries = sorted(library.name.split("-")[1:3] for library in (tmp_path / "cache").glob("*.so"))
    assert libraries == [["add_one", "float"], ["add_two", "double"], ["add_two", "float"]]
