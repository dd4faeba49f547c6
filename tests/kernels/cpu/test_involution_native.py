"""The native CPU kernels of involution (``oplib/kernels/involution/csrc/cpu/``): every registry
sample of the three ops in every dtype against the float64 reference through the ops
themselves; the generated checks of the three ops once more on the plain-PyTorch path; and what
happens where they cannot be built (a fallback with one warning, or a clear error)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from oplib import registry
from oplib.kernels import native
from oplib.kernels.involution import cpu as involution_cpu
from oplib.ops import involution_generated
from oplib.testing import assert_matches_reference
from oplib.testing.native import force_native, require_native_build

ROOT = Path(__file__).resolve().parents[3]
INVOLUTION_OPS = ("involution", "involution_backward_input", "involution_backward_weight", "involution_generated",
                  "involution_generated_backward_input", "involution_generated_backward_generator")


@pytest.mark.parametrize("dtype", registry.FLOAT_DTYPES, ids=str)
@pytest.mark.parametrize("name", INVOLUTION_OPS)
def test_registry_samples_match_the_reference(monkeypatch, name, dtype):
    force_native(monkeypatch)
    spec = registry.get(name)
    for sample in spec.sample_inputs("cpu", dtype, False):
        assert_matches_reference(spec, sample, spec.op(*sample.args), dtype)


# grad_weight's pixel-lane paths (AVX-512 builds; other builds run these on the channel-lane
# kernel): maps up to 8 wide row by row in half-width vectors; wider ones by padded row, with
# a partial last block, the result staged in the cache (an item's result up to 256 KB) or
# stored in place (40x40 at K = 7: 314 KB); kernels 3, 5 and 7, strides 1 and 2, paddings
# other than K // 2 and unequal along the axes, 8 to 32 channels a group.
PIXEL_LANE_GEOMETRIES = {
    # name: (n, channels, height, width, groups, kernel, stride, padding)
    "narrow-7x7": (2, 32, 7, 7, 2, 7, 1, (3, 3)),
    "narrow-stride2-odd": (1, 16, 14, 13, 1, 7, 2, (3, 2)),
    "wide-partial-block": (2, 48, 9, 19, 3, 5, 1, (1, 2)),
    "wide-stride2": (1, 32, 21, 33, 2, 3, 2, (0, 1)),
    "wide-in-place": (1, 16, 40, 40, 1, 7, 1, (3, 3)),
    "wide-wide-padding": (2, 16, 12, 30, 2, 7, 2, (4, 3)),
}


def _pixel_lane_operands(geometry, dtype, channels_last):
    n, channels, height, width, groups, kernel, stride, padding = geometry
    out = [(size + 2 * pad - kernel) // stride + 1 for size, pad in zip((height, width), padding)]
    x = torch.randn(n, channels, height, width, dtype=torch.float64).to(dtype)
    grad = torch.randn(n, channels, *out, dtype=torch.float64).to(dtype)
    if channels_last:
        x, grad = x.to(memory_format=torch.channels_last), grad.to(memory_format=torch.channels_last)
    return x, grad, [kernel, kernel], [stride, stride], list(padding), [1, 1], groups


@pytest.mark.parametrize("channels_last", [False, True], ids=["nchw", "channels_last"])
@pytest.mark.parametrize("dtype", registry.FLOAT_DTYPES, ids=str)
@pytest.mark.parametrize("geometry", PIXEL_LANE_GEOMETRIES.values(), ids=PIXEL_LANE_GEOMETRIES.keys())
def test_grad_weight_pixel_lane_windows_match_the_reference(monkeypatch, geometry, dtype, channels_last):
    force_native(monkeypatch)
    torch.manual_seed(0)
    x, grad, kernel, stride, padding, dilation, groups = _pixel_lane_operands(geometry, dtype, channels_last)
    got = torch.ops.oplib.involution_backward_weight(grad, x, kernel, stride, padding, dilation, groups)
    expected = registry.get("involution_backward_weight").reference(grad.double(), x.double(), kernel, stride, padding, dilation, groups)
    atol, rtol = registry.get("involution_backward_weight").tolerance(dtype)
    assert got.dtype == dtype
    torch.testing.assert_close(got.double(), expected, atol=atol, rtol=rtol)


@pytest.mark.parametrize("geometry", PIXEL_LANE_GEOMETRIES.values(), ids=PIXEL_LANE_GEOMETRIES.keys())
def test_grad_weight_pixel_lane_windows_keep_the_reference_nan_and_inf(monkeypatch, geometry):
    """inf in the input's first and last columns and a nan in grad_output: every output the
    padded (unfold) reference makes nan or inf is nan or inf here, in the same places."""
    force_native(monkeypatch)
    torch.manual_seed(0)
    x, grad, kernel, stride, padding, dilation, groups = _pixel_lane_operands(geometry, torch.float32, False)
    x[0, 0, 0, 0], x[-1, -1, -1, -1], grad[0, -1, -1, 0] = float("inf"), float("-inf"), float("nan")
    got = torch.ops.oplib.involution_backward_weight(grad, x, kernel, stride, padding, dilation, groups)
    expected = registry.get("involution_backward_weight").reference(grad.double(), x.double(), kernel, stride, padding, dilation, groups)
    assert expected.isnan().any() and expected.isinf().any()
    torch.testing.assert_close(got.double(), expected, atol=1e-4, rtol=1e-4, equal_nan=True)


def test_auto_without_a_compiler_falls_back_with_one_warning(monkeypatch):
    monkeypatch.setenv("CXX", "/nonexistent/c++")
    with pytest.warns(native.NativeBuildWarning, match=r"no C\+\+ compiler \('/nonexistent/c\+\+'\) on the PATH"):
        assert native._load.__wrapped__("auto") is None


def test_native_without_a_compiler_is_a_clear_error(monkeypatch):
    monkeypatch.setenv("CXX", "/nonexistent/c++")
    with pytest.raises(RuntimeError, match=r"OPLIB_CPU_KERNELS=native, but the native CPU kernels are unavailable: no C\+\+"):
        native._load.__wrapped__("native")


def test_an_unknown_choice_is_refused(monkeypatch):
    monkeypatch.setenv(native.ENV, "fast")
    with pytest.raises(ValueError, match=r"OPLIB_CPU_KERNELS='fast': expected one of pytorch, auto, native"):
        native.involution()


def test_a_broken_compiler_falls_back_to_correct_results(tmp_path):
    """A compiler on the PATH that fails every build (and an empty build cache): the ops warn
    once, naming the failed build, and give the reference's results."""
    compiler = tmp_path / "c++"
    compiler.write_text("#!/bin/sh\necho 'broken compiler' >&2\nexit 1\n")
    compiler.chmod(0o755)
    script = textwrap.dedent(
        """
        import warnings, torch
        from oplib import registry
        from oplib.testing import assert_matches_reference
        spec = registry.get("involution")
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            for sample in spec.sample_inputs("cpu", torch.float32, False):
                assert_matches_reference(spec, sample, spec.op(*sample.args), torch.float32)
        messages = [str(w.message) for w in caught if "plain-PyTorch CPU kernels" in str(w.message)]
        assert len(messages) == 1, messages
        print(messages[0])
        """
    )
    env = dict(os.environ, CXX=str(compiler), OPLIB_CPU_KERNELS="auto", TORCH_EXTENSIONS_DIR=str(tmp_path / "cache"))
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    # The warning quotes the compiler's own output.
    assert "building the native CPU kernels failed: broken compiler" in result.stdout, result.stdout


@pytest.mark.integration
def test_generated_checks_of_the_involution_ops_pass_on_the_plain_pytorch_path():
    """tests/ops/test_ops.py's checks of the three ops (eager, layouts, gradcheck, gradgradcheck,
    opcheck, vmap, autocast, error inputs, random shapes) with OPLIB_CPU_KERNELS=pytorch, the
    fallback: the unit tier runs them on the default path, the native kernels where they build."""
    env = dict(os.environ, OPLIB_CPU_KERNELS="pytorch")
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/ops/test_ops.py", "-k", "involution"],
        cwd=ROOT, capture_output=True, text=True, env=env, timeout=1800,
    )
    assert result.returncode == 0, result.stdout[-5000:]
    assert " passed" in result.stdout and " failed" not in result.stdout


# A native module built from the source tree argv[1] (-march argv[2], compiler argv[3] or
# $CXX, AddressSanitizer where argv[4] is "1"), checked against the float64 reference, the ops
# argv[5:] first.
CHECK_SCRIPT = textwrap.dedent(
    """
    import sys
    from pathlib import Path
    from oplib.kernels import native
    from oplib.testing.native import check_module

    source, march, compiler, sanitize, *first = sys.argv[1:]
    module = native.build(Path(source), march=march, compiler=compiler or None, sanitize=sanitize == "1")
    print("checked: clean,", check_module(module, first=first), "calls")
    """
)


@pytest.fixture(scope="session")
def asan_cache(tmp_path_factory) -> Path:
    """One build cache for every AddressSanitizer build of the run (the workers' common
    folder under xdist): a planted bug's tree differs from the clean one in one unit, and the
    build keeps the other units' objects, so each plant compiles one unit and links."""
    base = tmp_path_factory.getbasetemp()
    return (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "native-asan-cache"


def _run_under_asan(source: Path, cache: Path, first: tuple[str, ...] = ()) -> subprocess.CompletedProcess:
    from oplib.testing.cuda_emulation import asan_environment

    env = dict(asan_environment(), TORCH_EXTENSIONS_DIR=str(cache))
    return subprocess.run(
        [sys.executable, "-c", CHECK_SCRIPT, str(source), "native", "", "1", *first], capture_output=True, text=True,
        env=env, timeout=1200,
    )


@pytest.mark.integration
def test_native_kernels_are_clean_under_address_sanitizer(asan_cache):
    """Every registry sample and 15 random geometries per op and dtype, through the kernels
    built with AddressSanitizer: no invalid access, and the reference's results."""
    require_native_build()
    result = _run_under_asan(native.SOURCE_DIR, asan_cache)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-5000:]
    assert "checked: clean" in result.stdout


# The plants in code that only AVX-512 builds compile (grad_weight's pixel-lane kernels).
AVX512_ONLY_PLANTS = ("pixel-lane-grad-rows",)


def native_cpu_flags() -> str:
    """The flags line of this CPU, which the native build's -march=native compiles for."""
    try:
        return next((line for line in Path("/proc/cpuinfo").read_text().splitlines() if line.startswith("flags")), "")
    except OSError:
        return ""


# The ops whose calls reach a plant, checked first in its run (else the run checks every op
# before it, under ASan); a plant that no op named here reaches is still caught, later.
PLANT_OPS = {
    "gather-block-bound": ("involution_backward_input",),
    "pixel-lane-grad-rows": ("involution_backward_weight",),
    "generator-feature-row": ("involution_generated",),
    "generator-grads-feature-row": ("involution_generated_backward_generator",),
}

# Off-by-ones planted one at a time in a copy of the source: grad_input's unrolled blocks
# reading one grad_output column past the last; the channel-row copy's partial block reading
# one column past each input row's end; grad_weight's pixel-lane scratch for grad_output short of the zero
# rows that the last padded rows read; involution_generated's feature rows read one past their end.
PLANTED_OVER_READS = {
    "gather-block-bound": ("if (j < first || j > last) continue;", "if (j < first || j > last + 1) continue;"),
    "channel-row-tail": ("count = std::min<int64_t>(LANES, end - x);", "count = std::min<int64_t>(LANES, end - x + 1);"),
    "pixel-lane-grad-rows": ("g_rows = geo.out_h + 2 * R + K,", "g_rows = geo.out_h + R,"),
    # the pixel-major weight read in place where rows end in a partial block, whose reads
    # past Wo leave the tensor at the last row of the last sample
    "pixel-major-partial-block": (
        "std::is_same_v<scalar_t, acc_t> && geo.out_w % kPixelBlock == 0 &&",
        "std::is_same_v<scalar_t, acc_t> &&",
    ),
    # the store of a channels_last result writing one pixel past each row (past the tensor's
    # end at the last row of the last sample): an over-write, which ASan catches the same way
    "channels-last-store-row": (
        "for (int64_t j = 0; j < count; ++j) {\n      for (int64_t k = 0; k < cpg; k += LANES) store_first<LANES>(dst",
        "for (int64_t j = 0; j <= count; ++j) {\n      for (int64_t k = 0; k < cpg; k += LANES) store_first<LANES>(dst",
    ),
    # the copy of a channels_last input into channel rows reading one pixel past each row (past
    # the tensor's end at the last row of the last sample)
    "channels-last-fill-row": (
        "for (int64_t x = begin; x < end; ++x) {\n        __builtin_prefetch",
        "for (int64_t x = begin; x <= end; ++x) {\n        __builtin_prefetch",
    ),
    # involution_generated's feature rows, read one value past each row's end (past the
    # tensor's end at the last row of the last channel)
    "generator-feature-row": (
        "convert(feature.at(n, r, first + i), feature.stride_w, out_w, row + i * out_w);",
        "convert(feature.at(n, r, first + i), feature.stride_w, out_w + 1, row + i * out_w);",
    ),
    # the generator's gradients: the tile's feature transposed one pixel past each row (past the
    # tensor's end at the last row of the last channel, and past the buffer at a full tile)
    "generator-grads-feature-row": (
        "for (int64_t j = 0; j < geo.out_w; ++j) {\n              features[",
        "for (int64_t j = 0; j <= geo.out_w; ++j) {\n              features[",
    ),
}


def native_entry(op: str) -> str:
    """The native module's entry point of an op (its forward's name ends in _forward)."""
    return f"{op}_forward" if op in ("involution", "involution_generated") else op


class _FirstCall(Exception):
    pass


class _RecordingModule:
    """A stand-in for a native module whose every entry point raises, saying which was called."""

    def __getattr__(self, entry: str):
        def call(*args):
            raise _FirstCall(entry)

        return call


@pytest.mark.parametrize("first, entry", [((), "involution_forward"),
                                          (("involution_generated_backward_generator",), "involution_generated_backward_generator"),
                                          (("involution_backward_input", "involution"), "involution_backward_input")])
def test_the_check_takes_the_ops_named_first_first(first, entry):
    from oplib.testing.native import check_module

    with pytest.raises(_FirstCall, match=f"^{entry}$"):
        check_module(_RecordingModule(), first=first)
    with pytest.raises(ValueError, match="no entry point for \\['conv2d'\\]"):
        check_module(_RecordingModule(), first=("conv2d",))


def test_each_plant_names_ops_the_check_knows():
    """A plant's ops, taken first by its run: each plant one of PLANTED_OVER_READS, each op one
    the check has an entry point for (the check raises on any other)."""
    from oplib.testing.native import check_module

    for plant, ops in PLANT_OPS.items():
        assert plant in PLANTED_OVER_READS and ops, plant
        with pytest.raises(_FirstCall, match=f"^{native_entry(ops[0])}$"):
            check_module(_RecordingModule(), first=ops)


@pytest.mark.integration
@pytest.mark.parametrize("plant", PLANTED_OVER_READS)
def test_address_sanitizer_catches_a_planted_off_by_one_in_the_native_kernels(tmp_path, asan_cache, plant):
    """The same run over a copy of the source with one planted over-read: the read past the
    end of a tensor or buffer must abort with a heap-buffer-overflow."""
    require_native_build()
    if plant in AVX512_ONLY_PLANTS and "avx512f" not in native_cpu_flags():
        pytest.skip(f"{plant}: the pixel-lane kernels are compiled only for AVX-512 CPUs (-march=native) and this CPU "
                    "has none, so the planted line never runs")
    exact, wrong = PLANTED_OVER_READS[plant]
    planted = tmp_path / "cpu"
    shutil.copytree(native.SOURCE_DIR, planted)
    holders = [path for path in planted.iterdir() if exact in path.read_text()]
    assert len(holders) == 1 and holders[0].read_text().count(exact) == 1, holders
    holders[0].write_text(holders[0].read_text().replace(exact, wrong))
    result = _run_under_asan(planted, asan_cache, PLANT_OPS.get(plant, ()))
    assert result.returncode != 0
    # A write of a whole vector that starts inside the tensor and ends past it is reported as
    # an "unknown-crash" with the address past the region's end (a 16-bit store of two lanes
    # at a row's end): a heap overflow either way.
    overflow = re.search(r"heap-buffer-overflow|is located \d+ bytes to the right of \d+-byte region", result.stderr)
    assert overflow, result.stderr[-3000:]
    assert "checked: clean" not in result.stdout


def test_generator_gradients_are_the_same_bits_on_every_run_with_the_same_threads(monkeypatch):
    """The workers' sums of grad_span_weight and grad_span_bias are added in tile order: the same
    bits on every run with a given thread count (another thread count rounds differently, within
    float32's tolerance of the reference)."""
    force_native(monkeypatch)
    op = torch.ops.oplib.involution_generated_backward_generator
    torch.manual_seed(0)
    x, grad = torch.randn(4, 32, 14, 14), torch.randn(4, 32, 14, 14)
    feature, span = torch.randn(4, 8, 14, 14), torch.randn(2 * 49, 8)
    args = (grad, feature, span, x, [7, 7], [1, 1], [3, 3], [1, 1])
    threads = torch.get_num_threads()
    try:
        results = {}
        for count in (1, 2):
            torch.set_num_threads(count)
            first, second = op(*args), op(*args)
            for a, b in zip(first, second):
                assert torch.equal(a, b), f"{count} threads: two runs differ"
            results[count] = first
    finally:
        torch.set_num_threads(threads)
    for a, b in zip(results[1], results[2]):
        torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-4)


GENERATED_OPS = ("involution_generated", "involution_generated_backward_input", "involution_generated_backward_generator")


@pytest.mark.parametrize("chunk_bytes", [1, 8 << 20], ids=["sample-chunks", "one-chunk"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
@pytest.mark.parametrize("name", GENERATED_OPS)
def test_the_small_map_route_matches_the_reference(monkeypatch, name, dtype, chunk_bytes):
    """The fused ops through a transient map (the span conv, then involution's native kernels)
    on every registry sample, the whole batch at once and a sample at a time (the parameters'
    gradients then summed over the chunks)."""
    force_native(monkeypatch, small_maps=True)
    monkeypatch.setattr(involution_cpu, "SMALL_MAP_PIXELS", dict.fromkeys(involution_cpu.SMALL_MAP_PIXELS, (0, 10**9)))
    monkeypatch.setattr(involution_cpu, "SMALL_MAP_CHUNK_BYTES", chunk_bytes)
    chunked = []
    chunks = involution_cpu._sample_chunks
    monkeypatch.setattr(involution_cpu, "_sample_chunks", lambda *a: chunked.append(1) or chunks(*a))
    spec = registry.get(name)
    for sample in spec.sample_inputs("cpu", dtype, False):
        assert_matches_reference(spec, sample, spec.op(*sample.args), dtype)
    assert chunked, "the small-map route was not taken"


def test_small_maps_of_float32_and_float64_take_the_map_route():
    def feature(size, dtype=torch.float32):
        return torch.empty(2, 8, size, size, dtype=dtype)

    assert involution_cpu.through_small_map("forward", feature(7))
    assert involution_cpu.through_small_map("forward", feature(2))
    assert involution_cpu.through_small_map("forward", feature(14, torch.float64))
    assert not involution_cpu.through_small_map("backward_input", feature(14))
    assert involution_cpu.through_small_map("backward_generator", feature(7))
    assert not involution_cpu.through_small_map("backward_input", feature(4))
    assert not involution_cpu.through_small_map("backward_generator", feature(2))
    assert not involution_cpu.through_small_map("forward", feature(28))
    assert not involution_cpu.through_small_map("forward", feature(7, torch.bfloat16))
    assert not involution_cpu.through_small_map("forward", feature(0))
    sixteen_samples = torch.empty(16, 8, 7, 7)
    assert [p.stop - p.start for p in involution_cpu._sample_chunks(sixteen_samples, torch.empty(5349, 8))] == [8, 8]  # 1 MB a sample


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
@pytest.mark.parametrize("by_matmul", [False, True], ids=["convolution-backward", "matmuls"])
def test_both_contractions_of_the_generator_map_match_the_reference(monkeypatch, by_matmul, dtype):
    """The map route of the generator's gradients with either contraction of gw (the span conv's
    backward, as on the CPU, or the batched matmuls over pixel rows that CUDA takes) on every
    registry sample, channels_last ones included."""
    contract = involution_cpu._contract_generator_map
    routes = []
    monkeypatch.setattr(involution_cpu, "_contract_generator_map",
                        lambda *a: routes.append(by_matmul) or contract(*a, by_matmul=by_matmul))
    spec = registry.get("involution_generated_backward_generator")
    for sample in spec.sample_inputs("cpu", dtype, False):
        out = involution_generated._generator_grads_result(*sample.args)
        assert_matches_reference(spec, sample, involution_cpu.generator_grads_through_map(*sample.args, out), dtype)
    assert routes == [by_matmul] * len(routes) and routes


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16], ids=str)
@pytest.mark.parametrize("layout", ["NCHW", "channels_last", "strided"])
def test_the_generated_weight_by_matmul_is_the_span_conv(layout, dtype):
    """The span conv's weight by batched products over pixel rows (CUDA's route, where cuDNN's
    convolution would take TF32 for float32): the 1x1 convolution's values, with and without a
    bias, pixel-major when the feature is channels_last (what involution's channels_last
    kernels read in place), NCHW otherwise."""
    generator = torch.Generator().manual_seed(7)
    feature = torch.randn(2, 8, 5, 6, generator=generator, dtype=torch.float64)
    feature = {"NCHW": feature, "channels_last": feature.contiguous(memory_format=torch.channels_last),
               "strided": torch.cat([feature, feature], 3)[..., ::2]}[layout].to(dtype)
    span, bias = torch.randn(2 * 9, 8, generator=generator).to(dtype), torch.randn(2 * 9, generator=generator).to(dtype)
    for span_bias in (None, bias):
        weight = involution_cpu.generated_weight(feature, span, span_bias, [3, 3], by_matmul=True)
        expected = torch.nn.functional.conv2d(feature.double(), span.double()[:, :, None, None],
                                              None if span_bias is None else span_bias.double())
        assert weight.shape == (2, 2, 3, 3, 5, 6) and weight.dtype == dtype
        atol, rtol = (1e-12, 1e-12) if dtype == torch.float64 else (1e-5, 1e-5) if dtype == torch.float32 else (3e-2, 2e-2)
        torch.testing.assert_close(weight.double(), expected.view(2, 2, 3, 3, 5, 6), atol=atol, rtol=rtol)
        assert weight.permute(0, 4, 5, 1, 2, 3).is_contiguous() == (layout == "channels_last")
        assert weight.is_contiguous() == (layout != "channels_last")
