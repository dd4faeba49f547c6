"""involution_rows.cu (involution's NCHW forward, a run of output pixels a thread) through the
host emulation: against the float64 reference on the registry's samples and random geometries
(runs that end past a row, borders on every side, both strides, every kernel size, every
dtype), the same bits as involution.cu's chunked kernel, the cases it declines, AddressSanitizer,
and planted bugs that these checks catch."""

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


def _rows(x, w, stride, padding, launcher) -> torch.Tensor | None:
    out_h, out_w = w.shape[4:]
    out = x.new_empty(x.shape[0], x.shape[1], out_h, out_w)
    return involution_cuda.involution_rows(x, w, stride, padding, [1, 1], out, launcher)


def _case(rng: random.Random, kernel: int, stride: int, dtype: torch.dtype):
    """Random contiguous operands of one instantiated window: (input, weight, stride, padding);
    widths from one pixel to a few runs, so that runs end inside, at and past a row's end."""
    groups = rng.choice([1, 2, 3])
    per_group = rng.choice([1, 2, 3, 16])
    n, height, width = rng.choice([1, 2]), rng.randint(1, 12), rng.randint(1, 40)
    pad = [rng.randint(0, kernel - 1), rng.randint(0, kernel - 1)]
    height, width = max(height, kernel - 2 * pad[0]), max(width, kernel - 2 * pad[1])
    out_h, out_w = (height + 2 * pad[0] - kernel) // stride + 1, (width + 2 * pad[1] - kernel) // stride + 1
    x = torch.randn(n, groups * per_group, height, width, dtype=dtype)
    w = torch.randn(n, groups, kernel, kernel, out_h, out_w, dtype=dtype)
    return x, w, [stride, stride], pad


def _check_random(launcher, cases: int, seed: int, dtypes=registry.FLOAT_DTYPES) -> set:
    """``cases`` random geometries per (kernel size, stride) and dtype against the float64
    reference and against the chunked kernel's bits; returns the instantiations launched."""
    rng = random.Random(seed)
    chunked = EmulatedLauncher()
    for kernel, stride in load_source(involution_cuda.ROWS_SOURCE).specialisations["involution_forward_rows"]:
        for dtype in dtypes:
            for case in range(cases):
                x, w, stride_pair, pad = _case(rng, int(kernel), int(stride), dtype)
                out = _rows(x, w, stride_pair, pad, launcher)
                assert out is not None
                sample = registry.SampleInput((x, w, stride_pair, pad, [1, 1]), f"k{kernel}-s{stride}-{dtype}-{case}")
                assert_matches_reference(SPEC, sample, out, dtype)
                expected = involution_cuda.involution(x, w, stride_pair, pad, [1, 1], torch.empty_like(out), chunked)
                assert torch.equal(out, expected), sample.name
    return {(launch[0], launch[4]) for launch in launcher.launches}


def test_rows_match_the_reference_and_the_chunked_kernels_bits():
    """Every instantiation, every dtype, random geometries: the float64 reference, and the
    chunked kernel's very bits (both add the taps in the same order)."""
    require_host_compiler()
    launched = _check_random(EmulatedLauncher(), cases=3, seed=5)
    instantiations = load_source(involution_cuda.ROWS_SOURCE).specialisations["involution_forward_rows"]
    assert launched == {("involution_forward_rows", s) for s in instantiations}


@pytest.mark.parametrize("dtype", registry.FLOAT_DTYPES, ids=str)
def test_rows_match_the_reference_on_the_registry_samples(dtype):
    """The registry's contiguous samples the kernel serves, the float64 reference; the rest
    declined (None), none silently computed."""
    require_host_compiler()
    launcher, served = EmulatedLauncher(), 0
    for sample in SPEC.sample_inputs("cpu", dtype, False):
        x, w, stride, padding, dilation = sample.args
        out = x.new_empty(x.shape[0], x.shape[1], *w.shape[4:])
        result = involution_cuda.involution_rows(x, w, stride, padding, dilation, out, launcher)
        if result is None:
            continue
        served += result.numel() > 0  # (an empty output launches nothing)
        assert_matches_reference(SPEC, sample, result, dtype)
    assert served and len(launcher.launches) == served


def test_rows_decline_what_they_do_not_serve():
    """Channels_last operands, dilation, a non-square kernel, unequal strides, a kernel size
    without an instantiation: None, the output untouched."""
    x, w = torch.randn(1, 6, 9, 9), torch.randn(1, 2, 3, 3, 9, 9)
    out = torch.full((1, 6, 9, 9), 7.0)
    launcher = EmulatedLauncher()
    declined = [
        (x.to(memory_format=torch.channels_last), w, [1, 1], [1, 1], [1, 1]),
        (x, w, [1, 1], [2, 2], [2, 2]),
        (x, torch.randn(1, 2, 3, 5, 9, 9), [1, 1], [1, 2], [1, 1]),
        (x, torch.randn(1, 2, 3, 3, 9, 5), [1, 2], [1, 1], [1, 1]),
        (x, torch.randn(1, 2, 9, 9, 9, 9), [1, 1], [4, 4], [1, 1]),
    ]
    for args in declined:
        assert involution_cuda.involution_rows(*args, out, launcher) is None
    assert not launcher.launches and torch.equal(out, torch.full_like(out, 7.0))


# Bugs a review could miss. Two change values, which the reference check must catch: the
# interior test one column generous (a run whose window ends one past the row takes the
# untested path and adds the next row's first value), and the bottom border one row late (the
# next channel's first row). One only reads too far, which ASan must catch: the vector path
# taken for a run the row's end cuts short (the weights past it are loaded, never used).
PLANTS = {
    "interior-one-past": ("x0 + SPAN <= W;", "x0 + SPAN <= W + 1;"),
    "row-bound-one-past": ("if (y < 0 || y >= H) continue;", "if (y < 0 || y > H) continue;"),
    "vectors-short-run": ("if (vectors && valid == PIXELS) {", "if (vectors && valid >= PIXELS / 2) {"),
}
VALUE_PLANTS = ["interior-one-past", "row-bound-one-past"]
ASAN_PLANTS = ["interior-one-past", "vectors-short-run"]


@pytest.mark.parametrize("plant", VALUE_PLANTS)
def test_a_planted_bug_fails_the_reference_check(plant, tmp_path, monkeypatch):
    require_host_compiler()
    planted = _planted(tmp_path, involution_cuda.ROWS_SOURCE, *PLANTS[plant])
    real_load = involution_cuda.load_source
    monkeypatch.setattr(involution_cuda, "load_source",
                        lambda name: planted if name == involution_cuda.ROWS_SOURCE else real_load(name))
    with pytest.raises(AssertionError):
        _check_random(EmulatedLauncher(), cases=12, seed=5, dtypes=(torch.float32,))


_RUN_RANDOM = """
import sys
sys.path.insert(0, {tests!r})
from oplib.testing.cuda_emulation import EmulatedLauncher
from test_cuda_rows import _check_random
launcher = EmulatedLauncher(sanitize=True)
_check_random(launcher, cases=2, seed=9)
print("clean:", len(launcher.launches), "launches")
"""


@pytest.mark.integration
def test_rows_are_clean_under_address_sanitizer():
    """Every instantiation in every dtype on random geometries: no access outside the tensors
    (the emulation's buffers are exact-size heap blocks)."""
    require_host_compiler()
    result = run_under_asan(_RUN_RANDOM.format(tests=str(Path(__file__).parent)))
    assert result.returncode == 0, result.stderr[-5000:]
    assert "clean:" in result.stdout


# Per plant, a call whose over-read leaves the tensor: the last tap's last row's last run
# (float32: 4 lanes a vector, so a 12-pixel row ends in a run of 4 that the planted vector path
# reads as 8; no padding at the bottom, so that the last output row reads the last tap), and a
# run whose window ends one column past a 16-column image in its last row.
ASAN_CALLS = {
    "interior-one-past": """
        x, w = torch.randn(1, 2, 4, 16), torch.randn(1, 1, 3, 3, 4, 16)
        ops.involution_rows(x, w, [1, 1], [1, 1], [1, 1], torch.empty(1, 2, 4, 16), launcher)
    """,
    "vectors-short-run": """
        x, w = torch.randn(1, 2, 14, 12), torch.randn(1, 1, 3, 3, 12, 12)
        ops.involution_rows(x, w, [1, 1], [0, 1], [1, 1], torch.empty(1, 2, 12, 12), launcher)
    """,
}


@pytest.mark.integration
@pytest.mark.parametrize("plant", ASAN_PLANTS)
def test_address_sanitizer_catches_a_planted_over_read(plant, tmp_path):
    require_host_compiler()
    assert_asan_catches(_planted(tmp_path, involution_cuda.ROWS_SOURCE, *PLANTS[plant]), ASAN_CALLS[plant])
