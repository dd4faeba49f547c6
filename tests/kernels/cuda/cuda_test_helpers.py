"""What the CUDA kernel tests of this folder share: the dispatch of each op with CUDA kernels,
running a script under AddressSanitizer, and the bugs planted in the real kernels (each caught
by the reference check of test_cuda_emulation.py and by test_cuda_sanitizer.py)."""

from __future__ import annotations

import random
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Optional

import pytest
import torch

from oplib import registry
from oplib.kernels import CUDA_DISPATCH, INCLUDE_DIR, KernelSource, load_source
from oplib.kernels.involution import cuda as involution_cuda
from oplib.testing.cuda_emulation import EmulationError, asan_environment


# spec name -> its CUDA dispatch (oplib.kernels.CudaDispatch): the function its CUDA kernel
# registration calls with a launcher last, the .cu file and the kernels it launches.
LAUNCHES = {spec.name: CUDA_DISPATCH[spec.qualname] for spec in registry.all_specs() if spec.qualname in CUDA_DISPATCH}


def planted_bug_caught():
    """What a planted bug must raise: the reference check's mismatch, its finding that finite
    values ran a kernel's code of infs and nans (``no_cold_blocks_on_finite_values``: shared
    memory read before it was written), or, for a warp barrier planted out before a tensor-core
    load, the emulation's stop at that load (warp.cuh's ldmatrix: a lane's row written by
    another lane after that lane reached the load), whichever comes first in the run order."""
    return pytest.raises((AssertionError, EmulationError),
                         match="not close|finite values ran the code of infs and nans|a __syncwarp missing")


def run_under_asan(script: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, env=asan_environment(), timeout=900
    )


# The planted bug: one tap too many at the bottom and right edges of the image (the end of the
# valid tap range, computed once per thread, off by one), in every specialised kernel.
_TAP_BOUND = "*end = room >= KERNEL ? KERNEL : (room > 0 ? (int)room : 0);"
_TAP_BOUND_OFF_BY_ONE = "*end = room >= KERNEL ? KERNEL : (room > 0 ? (int)room + 1 : 0);"


def planted_tap_bound(tmp_path: Path) -> KernelSource:
    return _planted(tmp_path, involution_cuda.SOURCE, _TAP_BOUND, _TAP_BOUND_OFF_BY_ONE)


# involution_generated.cu's forward with its column bound off by one: the tap one column past
# a row's end is taken (the next row's first value, or past the tensor at the last one).
_GENERATED_COLUMN_BOUND = "if (x < 0 || x >= width) continue;"
_GENERATED_COLUMN_BOUND_OFF_BY_ONE = "if (x < 0 || x > width) continue;"


def planted_generated_column_bound(tmp_path: Path) -> KernelSource:
    return _planted(tmp_path, involution_cuda.GENERATED_SOURCE, _GENERATED_COLUMN_BOUND, _GENERATED_COLUMN_BOUND_OFF_BY_ONE)


def _planted(tmp_path: Path, name: str, text: str, bug: str) -> KernelSource:
    """``name``'s source with ``text`` replaced by ``bug``, written to tmp_path."""
    original = load_source(name)
    assert original.text.count(text) == 1, f"the planted bug no longer applies to {name}: update {text!r}"
    path = tmp_path / original.path.name
    path.write_text(original.text.replace(text, bug))
    return KernelSource(path, path.read_text())


def assert_asan_catches(planted: KernelSource, call: str) -> None:
    """``call`` (Python, with ``ops`` the CUDA backend loading ``planted`` and ``launcher`` a
    sanitized emulated launcher) must abort with AddressSanitizer's heap-buffer-overflow."""
    script = textwrap.dedent(
        f"""
        import torch
        from pathlib import Path
        from oplib.kernels import KernelSource
        from oplib.kernels.involution import cuda as ops
        from oplib.testing.cuda_emulation import EmulatedLauncher
        path = Path({str(planted.path)!r})
        ops.load_source = lambda filename: KernelSource(path, path.read_text())
        launcher = EmulatedLauncher(sanitize=True)
        """
    ) + textwrap.dedent(call) + '\nprint("no error reported")\n'
    result = run_under_asan(script)
    assert result.returncode != 0
    assert "heap-buffer-overflow" in result.stderr
    assert "no error reported" not in result.stdout


def assert_clean_under_asan(script: str) -> None:
    """``script`` (Python that may import this folder's test modules, and prints "clean:" at its
    end) must run to its end under AddressSanitizer: no access outside the emulation's tensors,
    which are exact-size heap blocks."""
    result = run_under_asan(f"import sys\nsys.path.insert(0, {str(Path(__file__).parent)!r})\n" + script)
    assert result.returncode == 0, result.stderr[-5000:]
    assert "clean:" in result.stdout


def tensor_core_samples_script(module: str, spec: str, cases: str, arguments: Optional[str], dtypes: str,
                               nan_argument: int) -> str:
    """The script ``assert_clean_under_asan`` runs for one of generated_mma.cu's kernels: test
    module ``module``'s ``_check`` over a sanitized emulated launcher on ``spec``'s samples, its
    ``cases`` (each ``case.arguments(dtype)`` through the module's ``arguments``, or as they are
    with None), random samples and random specialised windows, in each of ``dtypes`` (names in
    the module); then ``_assert_non_finite_as_torch`` with a nan in argument ``nan_argument`` of
    the second case."""
    imported = ", ".join(name for name in (spec, cases, dtypes, arguments) if name)
    arguments = arguments or "tuple"
    return f"""
import torch
from oplib.testing.cuda_emulation import EmulatedLauncher
from {module} import {imported}, _assert_non_finite_as_torch, _check
from test_cuda_tiles import _random_specialised_cases
from cuda_test_helpers import random_samples
launcher = EmulatedLauncher(sanitize=True)  # (the addresses a kernel touches do not depend on its threads' order)
for dtype in {dtypes}:
    for sample in {spec}.sample_inputs("cpu", dtype, False):
        _check(sample.args, launcher, sample.name)
    for case in {cases}:
        _check({arguments}(case.arguments(dtype)), launcher, case.name)
    for index, sample in enumerate(random_samples({spec}, dtype, 6, seed=5)):
        _check(sample.args, launcher, f"random-{{index}}")
    for case in _random_specialised_cases(8, seed=5):
        _check({arguments}(case.arguments(dtype)), launcher, case.name)
    args = list({arguments}({cases}[1].arguments(dtype)))
    args[{nan_argument}] = args[{nan_argument}].clone()
    args[{nan_argument}][0, 3, 4, 4] = float("nan")
    _assert_non_finite_as_torch(tuple(args), launcher, "nan")
print("clean:", len(launcher.launches), "launches")
"""


def window_operands(seed: int, channels_last: bool = False):
    """An input (2, 16, 9, 9) and a 7x7 weight of one group for it, random; channels_last: the
    input so, the weight pixel-major (as a channels_last span conv's output viewed as it)."""
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(2, 16, 9, 9, generator=generator)
    w = torch.randn(2, 1, 7, 7, 9, 9, generator=generator)
    if channels_last:
        x = x.contiguous(memory_format=torch.channels_last)
        w = w.permute(0, 4, 5, 1, 2, 3).contiguous().permute(0, 3, 4, 5, 1, 2)
    return x, w


def random_samples(spec, dtype, count, seed):
    """``count`` random samples, or none for a spec without ``random_sample``."""
    if spec.random_sample is None:
        return []
    rng = random.Random(seed)
    return [spec.random_sample(rng.randint, "cpu", dtype, False) for _ in range(count)]


def planted_span_tile(tmp_path: Path, text: str, bug: str) -> KernelSource:
    """span_tile.cu with ``text`` replaced by ``bug``: in the source, or where the text is
    warp.cuh's, in a copy of that header beside unchanged copies of the source and of the other
    shared headers (a quoted include looks in the including file's folder first, and tile.cuh
    includes warp.cuh)."""
    name = involution_cuda.SPAN_TILE_SOURCE
    if text in load_source(name).text:
        return _planted(tmp_path, name, text, bug)
    header = (INCLUDE_DIR / "warp.cuh").read_text()
    assert header.count(text) == 1, f"the planted bug no longer applies to warp.cuh: update {text!r}"
    for other in INCLUDE_DIR.glob("*.cuh"):
        (tmp_path / other.name).write_text(other.read_text())
    (tmp_path / "warp.cuh").write_text(header.replace(text, bug))
    source = load_source(name)
    path = tmp_path / source.path.name
    path.write_text(source.text)
    return KernelSource(path, source.text)
