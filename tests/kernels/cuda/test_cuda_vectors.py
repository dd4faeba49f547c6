"""involution_vectors.cu (involution's NCHW forward, a vector of pixels a lane) through the host
emulation: against the float64 reference on the registry's samples and random geometries
(borders on every side, both strides, every kernel size, every dtype), the same bits as
involution.cu's chunked kernel, infinite weights at taps outside the image, the cases it
declines, AddressSanitizer, and planted bugs that these checks catch."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import torch

from oplib import registry
from oplib.kernels import load_source
from oplib.kernels.involution import cuda as involution_cuda
from oplib.testing import assert_matches_reference
from oplib.testing.cuda_emulation import EmulatedLauncher
from oplib.testing.toolchain import require_host_compiler

from cuda_test_helpers import _planted, assert_asan_catches, run_under_asan

SPEC = registry.get("involution")


def _vectors(x, w, stride, padding, launcher) -> torch.Tensor | None:
    out = x.new_empty(x.shape[0], x.shape[1], *w.shape[4:])
    return involution_cuda.involution_vectors(x, w, stride, padding, [1, 1], out, launcher)


def _case(rng: random.Random, kernel: int, stride: int, dtype: torch.dtype):
    """Random operands of one instantiated window that the kernel serves: (input, weight,
    stride, padding). Widths from one vector of output pixels to a few, so that windows cross
    both borders or neither; any vertical padding; a group's channels one or two threads'."""
    source = load_source(involution_cuda.VECTORS_SOURCE)
    pixels = involution_cuda.vectors_pixels(source, dtype)
    per_thread = involution_cuda.vectors_channels(source, dtype)
    groups, per_group = rng.choice([1, 2, 3]), per_thread * rng.choice([1, 2])
    n, height = rng.choice([1, 2]), rng.randint(1, 10)
    width = pixels * stride * rng.randint(1, 5)  # the output width a multiple of the vector too
    pad = [rng.randint(0, kernel - 1), kernel // 2]
    height = max(height, kernel - 2 * pad[0])
    out_h, out_w = (height + 2 * pad[0] - kernel) // stride + 1, (width + 2 * pad[1] - kernel) // stride + 1
    x = torch.randn(n, groups * per_group, height, width, dtype=dtype)
    w = torch.randn(n, groups, kernel, kernel, out_h, out_w, dtype=dtype)
    return x, w, [stride, stride], pad


def _check_random(launcher, cases: int, seed: int, dtypes=registry.FLOAT_DTYPES) -> set:
    """``cases`` random geometries per (kernel size, stride) and dtype against the float64
    reference and against the chunked kernel's bits; returns the instantiations launched."""
    rng = random.Random(seed)
    chunked = EmulatedLauncher()
    for kernel, stride in load_source(involution_cuda.VECTORS_SOURCE).specialisations["involution_forward_vectors"]:
        for dtype in dtypes:
            for case in range(cases):
                x, w, stride_pair, pad = _case(rng, int(kernel), int(stride), dtype)
                out = _vectors(x, w, stride_pair, pad, launcher)
                assert out is not None
                sample = registry.SampleInput((x, w, stride_pair, pad, [1, 1]), f"k{kernel}-s{stride}-{dtype}-{case}")
                assert_matches_reference(SPEC, sample, out, dtype)
                expected = involution_cuda.involution(x, w, stride_pair, pad, [1, 1], torch.empty_like(out), chunked)
                assert torch.equal(out, expected), sample.name
    return {(launch[0], launch[4]) for launch in launcher.launches}


def test_vectors_match_the_reference_and_the_chunked_kernels_bits():
    """Every instantiation, every dtype, random geometries: the float64 reference, and the
    chunked kernel's very bits (both add the taps in the same order, the taps outside the
    image adding exactly nothing)."""
    require_host_compiler()
    launched = _check_random(EmulatedLauncher(), cases=3, seed=5)
    instantiations = load_source(involution_cuda.VECTORS_SOURCE).specialisations["involution_forward_vectors"]
    assert launched == {("involution_forward_vectors", s) for s in instantiations}


def _infinite_weights_outside(launcher, dtypes=registry.FLOAT_DTYPES) -> None:
    """Weights of +-inf at every tap that reads padding: the chunked kernel skips those taps,
    so its results are finite, and so must these be, bit for bit."""
    for dtype in dtypes:
        bits = {2: torch.int16, 4: torch.int32, 8: torch.int64}[dtype.itemsize]
        for stride in (1, 2):
            x = torch.randn(1, 8, 6, 16, dtype=dtype)
            w = torch.randn(1, 2, 7, 7, 6 // stride, 16 // stride, dtype=dtype)
            rows = torch.arange(6 // stride) * stride - 3 + torch.arange(7).view(7, 1)
            columns = torch.arange(16 // stride) * stride - 3 + torch.arange(7).view(7, 1)
            outside = ((rows < 0) | (rows >= 6)).view(7, 1, -1, 1) | ((columns < 0) | (columns >= 16)).view(1, 7, 1, -1)
            w[0, 0] = torch.where(outside, torch.tensor(float("inf"), dtype=dtype), w[0, 0])
            w[0, 1] = torch.where(outside, torch.tensor(float("-inf"), dtype=dtype), w[0, 1])
            out = _vectors(x, w, [stride, stride], [3, 3], launcher)
            expected = involution_cuda.involution(x, w, [stride, stride], [3, 3], [1, 1], torch.empty_like(out),
                                                  EmulatedLauncher())
            assert torch.isfinite(expected).all()
            assert torch.equal(out.view(bits), expected.view(bits)), (dtype, stride)


def test_infinite_weights_at_taps_outside_the_image_add_nothing():
    require_host_compiler()
    _infinite_weights_outside(EmulatedLauncher())


def test_vectors_match_the_reference_on_the_registry_samples():
    """The registry's contiguous samples the kernel serves, the float64 reference; the rest
    declined (None), none silently computed. It serves the 4-byte and 8-byte dtypes' 3x3
    sample (two channels a group); the 2-byte dtypes take four channels a thread, more than any
    sample's group has, and the random geometries above cover them."""
    require_host_compiler()
    launcher, served = EmulatedLauncher(), {}
    for dtype in registry.FLOAT_DTYPES:
        for sample in SPEC.sample_inputs("cpu", dtype, False):
            x, w, stride, padding, dilation = sample.args
            out = x.new_empty(x.shape[0], x.shape[1], *w.shape[4:])
            result = involution_cuda.involution_vectors(x, w, stride, padding, dilation, out, launcher)
            if result is None:
                continue
            served[dtype] = served.get(dtype, 0) + (result.numel() > 0)  # (an empty output launches nothing)
            assert_matches_reference(SPEC, sample, result, dtype)
    assert served.get(torch.float32) and served.get(torch.float64)
    assert len(launcher.launches) == sum(served.values())


def test_vectors_decline_what_they_do_not_serve():
    """Channels_last operands, dilation, a non-square kernel, unequal strides, a kernel size
    without an instantiation, a horizontal padding other than K // 2, a width or output width
    not a multiple of the vector, a group's channels not a multiple of a thread's, a pointer
    not aligned to the vector: None, the output untouched."""
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
    for args in declined:
        assert involution_cuda.involution_vectors(*args, out, launcher) is None
    assert not launcher.launches and torch.equal(out, torch.full_like(out, 7.0))


# Bugs a review could miss. Two change values, which the reference check must catch: the
# bottom border one row late (the next channel's first row), and a vector that starts at the
# row's end taken as inside (the next row's first values, under weights not zeroed). One
# changes values only where a weight is infinite, which the infinite-weight check must catch:
# the weights of taps outside the image not zeroed (an inf times the window's -0 is NaN).
PLANTS = {
    "row-bound-one-past": ("if (y < 0 || y >= H) continue;", "if (y < 0 || y > H) continue;"),
    "vector-bound-one-past": ("x_aligned + v * PIXELS < W;", "x_aligned + v * PIXELS <= W;"),
    "outside-weights-kept": ("if (!vector_inside[(OFFSET + p * STRIDE + b) / PIXELS]) w[b][p] = 0;", ";"),
}
VALUE_PLANTS = ["row-bound-one-past", "vector-bound-one-past"]
ASAN_PLANTS = ["row-bound-one-past", "vector-bound-one-past"]


def _monkeypatch_source(monkeypatch, planted) -> None:
    real_load = involution_cuda.load_source
    monkeypatch.setattr(involution_cuda, "load_source",
                        lambda name: planted if name == involution_cuda.VECTORS_SOURCE else real_load(name))


@pytest.mark.parametrize("plant", VALUE_PLANTS)
def test_a_planted_bug_fails_the_reference_check(plant, tmp_path, monkeypatch):
    require_host_compiler()
    _monkeypatch_source(monkeypatch, _planted(tmp_path, involution_cuda.VECTORS_SOURCE, *PLANTS[plant]))
    with pytest.raises(AssertionError):
        _check_random(EmulatedLauncher(), cases=12, seed=5, dtypes=(torch.float32,))


def test_kept_outside_weights_fail_the_infinite_weight_check(tmp_path, monkeypatch):
    require_host_compiler()
    planted = _planted(tmp_path, involution_cuda.VECTORS_SOURCE, *PLANTS["outside-weights-kept"])
    _monkeypatch_source(monkeypatch, planted)
    with pytest.raises(AssertionError):
        _infinite_weights_outside(EmulatedLauncher(), dtypes=(torch.float32,))


_RUN_RANDOM = """
import sys
sys.path.insert(0, {tests!r})
from oplib.testing.cuda_emulation import EmulatedLauncher
from test_cuda_vectors import _check_random
launcher = EmulatedLauncher(sanitize=True)
_check_random(launcher, cases=2, seed=9)
print("clean:", len(launcher.launches), "launches")
"""


@pytest.mark.integration
def test_vectors_are_clean_under_address_sanitizer():
    """Every instantiation in every dtype on random geometries: no access outside the tensors
    (the emulation's buffers are exact-size heap blocks)."""
    require_host_compiler()
    result = run_under_asan(_RUN_RANDOM.format(tests=str(Path(__file__).parent)))
    assert result.returncode == 0, result.stderr[-5000:]
    assert "clean:" in result.stdout


# Per plant, a call whose over-read leaves the tensor: the last channel's last output row
# reads the row below the image, and the last row's last vector the vector past its end.
ASAN_CALLS = {
    "row-bound-one-past": """
        x, w = torch.randn(1, 4, 4, 8), torch.randn(1, 1, 3, 3, 4, 8)
        ops.involution_vectors(x, w, [1, 1], [1, 1], [1, 1], torch.empty(1, 4, 4, 8), launcher)
    """,
    "vector-bound-one-past": """
        x, w = torch.randn(1, 4, 4, 8), torch.randn(1, 1, 3, 3, 4, 8)
        ops.involution_vectors(x, w, [1, 1], [1, 1], [1, 1], torch.empty(1, 4, 4, 8), launcher)
    """,
}


@pytest.mark.integration
@pytest.mark.parametrize("plant", ASAN_PLANTS)
def test_address_sanitizer_catches_a_planted_over_read(plant, tmp_path):
    require_host_compiler()
    assert_asan_catches(_planted(tmp_path, involution_cuda.VECTORS_SOURCE, *PLANTS[plant]), ASAN_CALLS[plant])
