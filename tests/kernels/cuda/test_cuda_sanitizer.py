"""The CUDA kernels compiled for the host under AddressSanitizer: every op's kernels and each
specialised kernel run clean, and a planted read past a tensor (a test kernel, and the bugs
planted in the real kernels) aborts with a heap-buffer-overflow report. The integration tier:
minutes of sanitized builds and runs (the unit tier runs the same kernels unsanitized against
the reference, test_cuda_emulation.py)."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from oplib.kernels import KernelSource
from oplib.testing.toolchain import require_host_compiler

from cuda_test_helpers import assert_asan_catches, planted_generated_column_bound, planted_tap_bound, run_under_asan

pytestmark = pytest.mark.integration


_PLANTED_PATH = Path(__file__).parent / "cuda_sources" / "planted_overrun.cu"
PLANTED = KernelSource(_PLANTED_PATH, _PLANTED_PATH.read_text())


_ASAN_SCRIPT = textwrap.dedent(
    """
    import dataclasses, random, sys, torch
    from oplib import registry
    from oplib.kernels import CUDA_DISPATCH
    from oplib.testing import assert_matches_reference
    from oplib.testing.cuda_emulation import EmulatedLauncher
    launcher = EmulatedLauncher(sanitize=True)
    rng = random.Random(0)
    for spec in registry.all_specs():
        dispatch = CUDA_DISPATCH.get(spec.qualname)
        if dispatch is None:
            continue
        for dtype in registry.FLOAT_DTYPES:
            samples = list(spec.sample_inputs("cpu", dtype, False))
            if spec.random_sample is not None:
                samples += [spec.random_sample(rng.randint, "cpu", dtype, False) for _ in range(15)]
            for sample in samples:
                assert_matches_reference(spec, sample, dispatch(*sample.args, launcher), dtype)
    # The specialised kernels: each kernel size, stride and layout, 32- and 64-bit offsets.
    from oplib.kernels.involution import cuda as ops
    for limit in (ops.POLICY.index32_limit, 0):
        policy = dataclasses.replace(ops.POLICY, index32_limit=limit)
        for kernel in (3, 5, 7):
            for stride in (1, 2):
                for channels_last in (False, True):
                    for dtype in registry.FLOAT_DTYPES:
                        groups, per_group = rng.choice([1, 2]), rng.choice([1, 4, 8, 16, 32])
                        pad = [rng.randint(0, kernel - 1), rng.randint(0, kernel - 1)]
                        height = max(rng.randint(1, 11), kernel - 2 * pad[0])
                        width = max(rng.randint(1, 11), kernel - 2 * pad[1])
                        out_h, out_w = (height + 2 * pad[0] - kernel) // stride + 1, (width + 2 * pad[1] - kernel) // stride + 1
                        x = torch.randn(2, groups * per_group, height, width).to(dtype)
                        w = torch.randn(2, groups, kernel, kernel, out_h, out_w).to(dtype)
                        g = torch.randn(2, groups * per_group, out_h, out_w).to(dtype)
                        if channels_last:
                            x = x.contiguous(memory_format=torch.channels_last)
                            g = g.contiguous(memory_format=torch.channels_last)
                            w = w.permute(0, 4, 5, 1, 2, 3).contiguous().permute(0, 3, 4, 5, 1, 2)
                        window = ([stride, stride], pad, [1, 1])
                        ops.launch_involution(x, w, *window, launcher, policy)
                        ops.launch_involution_backward_input(g, w, [height, width], *window, launcher, policy)
                        ops.launch_involution_backward_weight(g, x, [kernel, kernel], *window, groups, launcher, policy)
    chunked = {launch[4] for launch in launcher.launches if launch[0].endswith("_chunked")}
    assert len(chunked) == 24, sorted(chunked)
    print("asan: clean,", len(launcher.launches), "launches")
    """
)


def test_kernels_are_clean_under_address_sanitizer():
    require_host_compiler()
    result = run_under_asan(_ASAN_SCRIPT)
    assert result.returncode == 0, result.stderr[-5000:]
    assert "asan: clean" in result.stdout


def test_address_sanitizer_catches_a_planted_off_by_one():
    """Proof the harness would catch an illegal address: a kernel reading one element past
    the end of a torch tensor must abort with a heap-buffer-overflow report."""
    require_host_compiler()
    script = textwrap.dedent(
        f"""
        import torch
        from pathlib import Path
        from oplib.kernels import KernelSource, linear_config
        from oplib.testing.cuda_emulation import EmulatedLauncher
        path = Path({str(PLANTED.path)!r})
        source = KernelSource(path, path.read_text())
        x = torch.randn(1000)
        out = torch.empty(1000)
        EmulatedLauncher(sanitize=True).launch(source, "copy_next", torch.float32, linear_config(4), (x, out, 1000))
        print("no error reported")
        """
    )
    result = run_under_asan(script)
    assert result.returncode != 0
    assert "heap-buffer-overflow" in result.stderr
    assert "no error reported" not in result.stdout


def test_address_sanitizer_catches_a_planted_off_by_one_tap_bound(tmp_path):
    """The same planted bug, where the extra tap reads past the end of the tensor: the last
    pixel of the last sample's last row reads one element beyond the input. The chunked kernel
    (the ``CHUNKED`` policy: the op's dispatch gives this call to involution_vectors.cu's)."""
    require_host_compiler()
    planted = planted_tap_bound(tmp_path)
    assert_asan_catches(planted, """
        x, w = torch.randn(1, 4, 8, 8), torch.randn(1, 1, 3, 3, 8, 8)
        ops.launch_involution(x, w, [1, 1], [1, 1], [1, 1], launcher, ops.CHUNKED)
    """)


def test_address_sanitizer_catches_a_planted_off_by_one_in_the_generated_kernels(tmp_path):
    """The same planted bug: the last pixel of the last sample's last row reads one element
    beyond the input. The generic kernel called itself (the op's dispatch gives this call to the
    tiled kernel, which serves it)."""
    require_host_compiler()
    planted = planted_generated_column_bound(tmp_path)
    assert_asan_catches(planted, """
        x, f, s = torch.randn(1, 4, 8, 8), torch.randn(1, 2, 8, 8), torch.randn(9, 2)
        ops._generated("involution_generated_forward", x, f, s, None, [3, 3], [1, 1], [1, 1], [1, 1],
                       torch.empty(1, 4, 8, 8), launcher)
    """)
