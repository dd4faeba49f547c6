"""Tuning (oplib.kernels.cuda_plan, ``set_cuda_tuning``): with it on, a new call signature
runs each of its op's candidate writers once, drops the ones that decline or repeat another's
launches, times the rest through the launcher's ``time_calls`` and keeps the fastest, planned
where it can be. Run on CPU tensors through the host emulation, with a clock that reads which
kernels a timed call launched; every candidate checked against the float64 reference on the
registry's samples wherever it serves them."""

from __future__ import annotations

import contextlib

import pytest
import torch

from oplib import registry
from oplib.registry import SampleInput
from oplib.kernels import cuda_launch, cuda_plan
from oplib.kernels.cuda_plan import LaunchPlans, cuda_tuning, plan_key
from oplib.kernels.involution import cuda as involution_cuda
from oplib.ops import involution_generated as generated_op
from oplib.ops._rules import CONTRACTS, cuda_kernel
from oplib.testing import assert_matches_reference
from oplib.testing.cuda_emulation import EmulatedLauncher
from oplib.testing.specs.involution import reference
from oplib.testing.toolchain import require_host_compiler

from cuda_test_helpers import random_samples, window_operands

WINDOW = ([1, 1], [3, 3], [1, 1])
GENERATOR = "oplib::involution_generated_backward_generator"


class ClockedEmulation(EmulatedLauncher):
    """The host emulation with a clock for tuning: a timed call that launches a kernel
    ``favoured`` accepts (a launch: (kernel, dtype, blocks, threads, specialisation)) takes 1 s,
    any other 2 s; ``seconds``, where given, is returned instead. ``timed``: the kernels each
    timed call launched, per ``time_calls``."""

    def __init__(self, favoured=lambda launch: False, seconds=None):
        super().__init__()
        self.favoured, self.seconds = favoured, seconds
        self.timed: list[list[str]] = []

    def time_calls(self, calls, device):
        times = []
        for call in calls:
            before = len(self.launches)
            call()
            launched = self.launches[before:]
            self.timed.append([launch[0] for launch in launched])
            times.append(1.0 if any(self.favoured(launch) for launch in launched) else 2.0)
        return self.seconds if self.seconds is not None else times


@pytest.fixture
def tuning():
    with cuda_tuning(True):
        yield


@pytest.mark.parametrize("favoured", [("involution_forward_chunked", None), ("involution_forward_last", "2"),
                                      ("involution_forward_last", "1")], ids=str)
def test_tuning_keeps_the_fastest_candidate_and_replays_it(tuning, favoured):
    """channels_last involution: the op's choice (the chunked kernel) and the lanes-on-channels
    kernel at two pixels and at one a lane are timed; the chunked and vectors policies, which
    make the op's launches here, are not. Whichever the clock favours is kept: its result on the
    first call, and a replay of its launch alone on the next."""
    require_host_compiler()
    kernel_name, pixels = favoured
    launcher = ClockedEmulation(lambda launch: launch[0] == kernel_name and (pixels is None or launch[4][-1] == pixels))
    kernel = cuda_kernel(CONTRACTS["oplib::involution"], lambda: launcher)
    x, w = window_operands(0, True)
    torch.testing.assert_close(kernel(x, w, *WINDOW), reference(x, w, *WINDOW))
    (key, tuned), = kernel.tuned.items()
    assert list(tuned.seconds) == ["the op's choice", "lanes on channels, pairs", "lanes on channels, a pixel a lane"]
    assert set(tuned.skipped) == {"chunked", "vectors, narrow", "vectors, wide"}
    assert tuned.seconds[tuned.chosen] == 1.0 and sum(s == 1.0 for s in tuned.seconds.values()) == 1
    assert kernel.tuned_plans[key] is not None
    timed = len(launcher.timed)
    before = len(launcher.launches)
    x, w = window_operands(1, True)
    torch.testing.assert_close(kernel(x, w, *WINDOW), reference(x, w, *WINDOW))
    assert len(launcher.timed) == timed, "a planned signature was timed again"
    (launch,) = launcher.launches[before:]
    assert launch[0] == kernel_name and (pixels is None or launch[4][-1] == pixels)


def test_a_near_tie_keeps_the_ops_choice(tuning):
    """A candidate within TUNING_MARGIN of the op's choice does not replace it; one past it does."""
    require_host_compiler()
    margin = cuda_plan.TUNING_MARGIN
    for seconds, chosen in (([1.0, (margin + 0.01), 2.0], "the op's choice"),
                            ([1.0, 2.0, margin - 0.01], "lanes on channels, a pixel a lane")):
        kernel = cuda_kernel(CONTRACTS["oplib::involution"], lambda seconds=seconds: ClockedEmulation(seconds=seconds))
        x, w = window_operands(0, True)
        kernel(x, w, *WINDOW)
        assert next(iter(kernel.tuned.values())).chosen == chosen


def test_a_failing_candidate_is_skipped_with_a_warning(tuning):
    """A candidate that raises instead of declining is a bug to report, not the call's failure:
    a RuntimeWarning names it, it is skipped, and the call gives the reference's result."""
    require_host_compiler()
    kernel = cuda_kernel(CONTRACTS["oplib::involution"], lambda: ClockedEmulation())

    def broken(*args):
        raise ValueError("a planted failure")

    kernel.candidates = {"broken": broken, **kernel.candidates}
    x, w = window_operands(0, True)
    with pytest.warns(RuntimeWarning, match="'broken' failed and was skipped .*a planted failure"):
        torch.testing.assert_close(kernel(x, w, *WINDOW), reference(x, w, *WINDOW))
    assert "broken" in next(iter(kernel.tuned.values())).skipped


def test_an_unplannable_winner_is_the_writer_of_its_signature(tuning):
    """involution_generated_backward_input in float32: the op's choice (the map route, through a
    temporary weight) against the generic kernel and the staged one; each kept when favoured,
    the map route as its signature's writer (never planned), a kernel as a plan."""
    require_host_compiler()
    generator = torch.Generator().manual_seed(0)
    grad = torch.randn(2, 16, 14, 16, generator=generator)
    feature, span_weight, span_bias = (torch.randn(2, 8, 14, 16, generator=generator),
                                       torch.randn(49, 8, generator=generator), torch.randn(49, generator=generator))
    args = (grad, feature, span_weight, span_bias, [14, 16], [7, 7], *WINDOW)
    weight = (torch.einsum("or,nrhw->nohw", span_weight, feature) + span_bias[:, None, None]).view(2, 1, 7, 7, 14, 16)
    expected = torch.ops.oplib.involution_backward_input(grad, weight, [14, 16], *WINDOW)
    chosen = {}
    for kernel_name in ("involution_backward_input_vectors", "involution_generated_backward_input",
                        "involution_generated_mma_backward_input_staged"):
        launcher = ClockedEmulation(lambda launch, kernel_name=kernel_name: launch[0] == kernel_name)
        kernel = cuda_kernel(CONTRACTS["oplib::involution_generated_backward_input"],
                             lambda launcher=launcher: launcher)
        for _ in range(2):
            torch.testing.assert_close(kernel(*args), expected, rtol=1e-4, atol=1e-4)
        (key, tuned), = kernel.tuned.items()
        chosen[kernel_name] = tuned.chosen
        planned = kernel.tuned_plans[key] is not None
        assert planned == (tuned.chosen != "the op's choice")
        assert (key in kernel.writers) == (not planned)
        assert launcher.launches[-1][0] == kernel_name
    assert chosen == {"involution_backward_input_vectors": "the op's choice",
                      "involution_generated_backward_input": "generic",
                      "involution_generated_mma_backward_input_staged": "staged"}


def test_the_generators_gradients_are_tuned_never_planned(tuning):
    """The generator's gradients (three results): favoured, the tensor-core kernel is kept as
    the signature's writer and runs again on the next call; the results match the map route's."""
    require_host_compiler()
    launcher = ClockedEmulation(lambda launch: launch[0] == "involution_generated_mma_backward_generator")
    contract = CONTRACTS[GENERATOR]
    kernel = LaunchPlans(contract.rules.enforce, contract.result,
                         involution_cuda.involution_generated_backward_generator, lambda: launcher,
                         involution_cuda.TUNING_CANDIDATES[GENERATOR])
    generator = torch.Generator().manual_seed(0)
    args = (torch.randn(2, 16, 9, 9, generator=generator), torch.randn(2, 4, 9, 9, generator=generator),
            torch.randn(49, 4, generator=generator), torch.randn(2, 16, 9, 9, generator=generator), [7, 7], *WINDOW)
    expected = torch.ops.oplib.involution_generated_backward_generator(*args)
    for _ in range(2):
        for got, want in zip(kernel(*args), expected, strict=True):
            torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
        assert launcher.launches[-1][0] == "involution_generated_mma_backward_generator"
    (key, tuned), = kernel.tuned.items()
    assert tuned.chosen == "tensor cores" and kernel.tuned_plans[key] is None and key in kernel.writers
    assert "dense map" in tuned.skipped  # float32: the dense window's map is 16-bit only


def test_untimed_calls_keep_nothing_and_tuning_off_times_nothing():
    """A launcher that cannot time now (a capture) leaves the signature to be tuned at its next
    call, with the op's choice's result meanwhile; with tuning off nothing is timed at all; the
    plans made with tuning on and off are kept apart, so switching back and forth times nothing
    again and each mode replays its own launches."""
    require_host_compiler()
    x, w = window_operands(0, True)
    launcher = ClockedEmulation(seconds=None)
    launcher.time_calls = lambda calls, device: None
    kernel = cuda_kernel(CONTRACTS["oplib::involution"], lambda: launcher)
    with cuda_tuning(True):
        torch.testing.assert_close(kernel(x, w, *WINDOW), reference(x, w, *WINDOW))
        assert kernel.plans == kernel.tuned_plans == {} and kernel.tuned == {}
    clocked = ClockedEmulation(lambda launch: launch[0] == "involution_forward_last" and launch[4][-1] == "1")
    kernel = cuda_kernel(CONTRACTS["oplib::involution"], lambda: clocked)
    key = plan_key((x, w, *WINDOW))
    with cuda_tuning(False):
        kernel(x, w, *WINDOW)
        assert clocked.timed == [] and kernel.tuned == {} and list(kernel.plans) == [key]
    for _ in range(2):
        with cuda_tuning(True):
            torch.testing.assert_close(kernel(x, w, *WINDOW), reference(x, w, *WINDOW))
            assert clocked.launches[-1][0] == "involution_forward_last"
        with cuda_tuning(False):
            torch.testing.assert_close(kernel(x, w, *WINDOW), reference(x, w, *WINDOW))
            assert clocked.launches[-1][0] == "involution_forward_chunked"
    assert list(kernel.tuned) == list(kernel.tuned_plans) == [key] and list(kernel.plans) == [key]
    assert len(clocked.timed) == 3  # the three candidates, timed once


# The dtypes the candidates serve among them (the tensor-core and dense window kernels take
# 16-bit operands, the staged ones float32 too).
CANDIDATE_DTYPES = (torch.float32, torch.bfloat16)


def _filled_maps(qualname: str, dtype: torch.dtype) -> list[SampleInput]:
    """Maps whose rows the staged kernels' tiles fill (the registry's small samples leave the
    staged grad_input nothing its host takes), both layouts, at strides 1 and 2 (grad_input's
    argument 0 is grad_output, of the output's size)."""
    if qualname not in ("oplib::involution_generated", "oplib::involution_generated_backward_input"):
        return []
    samples = []
    generator = torch.Generator().manual_seed(3)
    for stride, channels_last in ((1, False), (1, True), (2, True)):
        size = (28, 32) if stride == 2 else (14, 16)
        out_size = (size[0] // stride, size[1] // stride)
        activation = torch.randn(2, 16, *(out_size if qualname.endswith("input") else size), generator=generator)
        if channels_last:
            activation = activation.contiguous(memory_format=torch.channels_last)
        feature = torch.randn(2, 8, *out_size, generator=generator)
        span = (torch.randn(98, 8, generator=generator) / 3, torch.randn(98, generator=generator))
        window = ([7, 7], [stride, stride], [3, 3], [1, 1])
        head = (activation, feature, *span) if not qualname.endswith("input") else (activation, feature, *span,
                                                                                    list(size))
        args = tuple(a.to(dtype) if isinstance(a, torch.Tensor) else a for a in (*head, *window))
        samples.append(SampleInput(args, f"filled, stride {stride}, {'channels_last' if channels_last else 'NCHW'}"))
    return samples


@pytest.mark.parametrize("dtypes", [CANDIDATE_DTYPES,
                                    pytest.param(registry.FLOAT_DTYPES, marks=pytest.mark.integration)],
                         ids=("float32, bfloat16", "every dtype"))
@pytest.mark.parametrize("qualname", list(involution_cuda.TUNING_CANDIDATES))
def test_every_candidate_matches_the_reference_wherever_it_serves(qualname, dtypes):
    """Each candidate writer, called as tuning calls it on the registry's samples and random
    ones (float32 and bfloat16, both layouts; the integration tier float64 and float16 too),
    either declines or matches the float64 reference within the op's tolerance, never raising;
    and each serves at least one of them (none is dead)."""
    require_host_compiler()
    spec = registry.get(qualname.split("::")[1])
    contract = CONTRACTS[qualname]
    result = contract.result if qualname != GENERATOR else generated_op._generator_grads_result
    launcher = EmulatedLauncher()
    served = dict.fromkeys(involution_cuda.TUNING_CANDIDATES[qualname], 0)
    for dtype in dtypes:
        samples = [*spec.sample_inputs("cpu", dtype, False), *random_samples(spec, dtype, 6, seed=11),
                   *_filled_maps(qualname, dtype)]
        for sample in samples:
            if not contract.rules.satisfied(*sample.args):
                continue
            for name, writer in involution_cuda.TUNING_CANDIDATES[qualname].items():
                written = writer(*sample.args, result(*sample.args), launcher)
                if written is not None:
                    assert_matches_reference(spec, sample, written, dtype)
                    served[name] += 1
    assert all(served.values()), served


def test_cupy_launchers_clock_reads_device_time_behind_a_spin(monkeypatch):
    """CuPyLauncher.time_calls, with torch.cuda's events, spin and capture query stood in: each
    call runs once, then TIMING_ROUNDS rounds in which each call's run of TIMING_REPEATS calls
    waits behind a spin between two events; a call's least round, per call, in seconds; None
    while the stream captures."""
    log = []
    # each run's duration per call (seconds), round by round, call by call
    durations = iter([0.5, 0.4, 0.3, 0.45, 0.35, 0.1])

    class Event:
        """A CUDA event whose start (recorded right after a spin) opens a run the next
        duration long: the end event reads the start's time plus the run's."""

        def __init__(self, enable_timing=False):
            assert enable_timing

        def record(self):
            self.at = next(durations) * cuda_launch.TIMING_REPEATS if log[-1] == "spin" else None
            log.append("event")

        def synchronize(self):
            pass

        def elapsed_time(self, end):
            return self.at * 1e3  # milliseconds

    calls = [lambda: log.append(0), lambda: log.append(1)]
    capturing = [False]
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: capturing[0])
    monkeypatch.setattr(torch.cuda, "device", lambda device: contextlib.nullcontext())
    monkeypatch.setattr(torch.cuda, "Event", Event)
    monkeypatch.setattr(cuda_launch._torch_private, "cuda_sleep", lambda cycles: log.append("spin"), raising=False)
    monkeypatch.setattr(cuda_launch, "TIMING_ROUNDS", 3)
    launcher = cuda_launch.CuPyLauncher.__new__(cuda_launch.CuPyLauncher)
    assert launcher.time_calls(calls, 0) == pytest.approx([0.3, 0.1])
    repeats = cuda_launch.TIMING_REPEATS
    assert log[:2] == [0, 1]  # each once, untimed
    runs = log[2:]
    assert runs.count("spin") == 3 * len(calls) and runs.count(0) == runs.count(1) == 3 * repeats
    assert runs[:repeats + 3] == ["spin", "event", *[0] * repeats, "event"]
    capturing[0] = True
    assert launcher.time_calls(calls, 0) is None


def _cuda_kernel(qualname: str):
    """The op's registered CUDA kernel (its LaunchPlans)."""
    from oplib.ops._rules import CUDA_KERNELS

    return CUDA_KERNELS.get(qualname) or generated_op.BACKWARD_GENERATOR_CUDA


def _to_cuda(sample: SampleInput) -> SampleInput:
    return SampleInput(tuple(a.cuda() if isinstance(a, torch.Tensor) else a for a in sample.args), sample.name)


@pytest.mark.needs_cuda
@pytest.mark.parametrize("qualname", list(involution_cuda.TUNING_CANDIDATES))
def test_on_a_gpu_tuning_keeps_a_writer_that_matches_the_reference(tuning, qualname):
    """Every op with candidates, tuned on the GPU on the registry's samples and the filled maps
    (float32 and bfloat16): each timed candidate a positive device time, the result the float64
    reference's, and the next call of the signature (the kept writer) the same bits."""
    spec = registry.get(qualname.split("::")[1])
    kernel = _cuda_kernel(qualname)
    for dtype in CANDIDATE_DTYPES:
        for sample in map(_to_cuda, [*spec.sample_inputs("cpu", dtype, False), *_filled_maps(qualname, dtype)]):
            first = spec.op(*sample.args)
            assert_matches_reference(spec, sample, first, dtype)
            again = spec.op(*sample.args)
            for a, b in zip(*(t if isinstance(t, tuple) else (t,) for t in (first, again)), strict=True):
                assert torch.equal(a, b), sample.name
    assert kernel.tuned and all(seconds > 0 for tuned in kernel.tuned.values() for seconds in tuned.seconds.values()
                                if len(tuned.seconds) > 1)


@pytest.mark.needs_cuda
def test_on_a_gpu_a_capture_tunes_nothing_and_the_next_eager_call_does(tuning):
    """A signature first met inside a CUDA graph capture takes the op's choice, unkept; the
    replay matches eager; the next eager call of it tunes."""
    kernel = _cuda_kernel("oplib::involution")
    x, w = (t.cuda() for t in window_operands(5, True))
    key = plan_key((x, w, *WINDOW))
    kernel.clear()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.stream(side), torch.cuda.graph(graph, stream=side):
        out = torch.ops.oplib.involution(x, w, *WINDOW)
    torch.cuda.current_stream().wait_stream(side)
    assert key not in kernel.tuned and key not in kernel.tuned_plans
    graph.replay()
    torch.cuda.synchronize()
    torch.testing.assert_close(out, reference(x, w, *WINDOW))
    torch.testing.assert_close(torch.ops.oplib.involution(x, w, *WINDOW), reference(x, w, *WINDOW))
    assert key in kernel.tuned and len(kernel.tuned[key].seconds) > 1
