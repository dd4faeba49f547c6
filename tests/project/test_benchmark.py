"""``python -m oplib bench`` and the measuring code it shares with bench/involution.py
(``oplib.benchmark``): the command on a tiny shape, its JSON and its argument errors; the
interleaving, the ratios and the blocks with fake clocks; the statements against the
unfold formulation."""

import json
import re

import pytest
import torch

from oplib import __main__ as cli
import oplib
from oplib import benchmark
from oplib.kernels import native

TINY = ["--shape", "2x32x10x10", "--device", "cpu", "--quick", "--min-run-time", "0.005"]


@pytest.fixture
def plain_cpu_kernels(monkeypatch):
    """The plain-PyTorch CPU path: these tests are about the command, not the native kernels'
    first build (a minute)."""
    monkeypatch.setenv(native.ENV, "pytorch")


@pytest.fixture(autouse=True)
def _restore_threads():
    """--threads sets torch's thread count for the whole process."""
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


def test_bench_prints_a_row_per_op_with_its_ratios(plain_cpu_kernels, capsys):
    assert cli.main(["bench", *TINY]) == 0
    out = capsys.readouterr().out
    assert f"involution's CPU kernels: {native.status()}" in out
    assert "oplib/depthwise" in out and "unfold/oplib" in out
    rows = [line.split() for line in out.splitlines() if line.startswith("cpu ")]
    assert [row[6] for row in rows] == list(benchmark.OPS)
    for row in rows:
        assert row[1:6] == ["32@10", "k7", "s1", "g16", "2"]
        assert re.fullmatch(r"\d+\.\d{2}x", row[9]), row
    # Unfold only for the forward and forward+backward.
    assert [row[10:] != ["-", "-"] for row in rows] == [True, False, False, True, False, False]


def test_bench_json_holds_the_geometry_times_and_ratios(plain_cpu_kernels, capsys):
    args = [*TINY, "--shape", "1x16x9x12", "--kernel", "3", "--stride", "2", "--ops", "grad_weight,forward", "--json"]
    assert benchmark.main([*args, "--threads", "2"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["threads"] == 2 and summary["dtype"] == "float32" and summary["rounds"] == 1
    assert summary["cpu_kernels"] == native.status()
    results = summary["results"]
    assert [(r["shape"]["height"], r["shape"]["width"], r["op"]) for r in results] == [
        (10, 10, "grad_weight"), (10, 10, "forward"), (9, 12, "grad_weight"), (9, 12, "forward"),
    ]  # fmt: skip
    assert {(r["shape"]["kernel"], r["shape"]["stride"], r["shape"]["group_channels"]) for r in results} == {(3, 2, 16)}
    for r in results:
        assert r["device"] == "cpu" and r["oplib_ms"] > 0 and r["depthwise_ms"] > 0
        # One round: the ratio of the round is the ratio of the times.
        assert r["oplib_over_depthwise"] == pytest.approx(r["oplib_ms"] / r["depthwise_ms"])
        if r["op"] == "forward":
            assert r["unfold_over_oplib"] == pytest.approx(r["unfold_ms"] / r["oplib_ms"])
        else:
            assert r["unfold_ms"] is None and r["unfold_over_oplib"] is None


@pytest.mark.parametrize(
    "flags,message",
    [
        (["--shape", "8x64x56"], r"argument --shape: expected NxCxHxW, four positive integers such as 8x64x56x56, got '8x64x56'"),
        (["--shape", "8x64x0x56"], r"argument --shape: expected NxCxHxW, .* got '8x64x0x56'"),
        (["--shape", "8x64x56xW"], r"argument --shape: expected NxCxHxW, .* got '8x64x56xW'"),
        (["--shape", "8x60x56x56"], r"--shape 8x60x56x56: 60 channels are not divisible by --group-channels 16"),
        (["--kernel", "3"], r"--kernel, --stride and --group-channels describe the shapes of --shape: give --shape too"),
        (["--ops", "forward,backward"], r"argument --ops: expected some of forward,grad_input,grad_weight,forward\+backward"),
        (["--threads", "0"], r"argument --threads: expected a positive int, got 0"),
        (["--device", "cuda"], r"--device cuda: no GPU \(torch.cuda.is_available\(\) is False\)"),
    ],
)
def test_bench_rejects_bad_flags_with_a_usage_error(flags, message, monkeypatch, capsys):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(SystemExit) as exit_info:
        benchmark.parse_args(flags)
    assert exit_info.value.code == 2
    error = capsys.readouterr().err.strip().splitlines()[-1]
    assert error.startswith("python -m oplib bench: error: ")
    assert re.search(message, error), error


def test_help_lists_bench(capsys):
    with pytest.raises(SystemExit):
        cli.main(["--help"])
    assert re.search(r"^\s+bench\s+time involution", capsys.readouterr().out, re.MULTILINE)


def _fake_clocks(readings: dict[str, list[float]], log: list[str]) -> dict[str, benchmark.Clock]:
    """A clock per name that logs its name and returns its next reading."""

    def clock(name: str) -> benchmark.Clock:
        values = iter(readings[name])

        def read() -> float:
            log.append(name)
            return next(values)

        return read

    return {name: clock(name) for name in readings}


def test_interleave_rotates_the_order_and_keeps_each_candidates_rounds():
    log: list[str] = []
    clocks = _fake_clocks({"a": [1.0, 2.0, 3.0], "b": [10.0, 20.0, 30.0], "c": [5.0, 6.0, 7.0]}, log)
    times = benchmark.interleave(clocks, rounds=3)
    assert log == ["a", "b", "c", "b", "c", "a", "c", "a", "b"]
    # Readings go to their own candidate and round, whatever the order they were taken in.
    assert {name: t.rounds for name, t in times.items()} == {"a": (1.0, 2.0, 3.0), "b": (10.0, 20.0, 30.0), "c": (5.0, 6.0, 7.0)}


def test_interleave_runs_each_round_through_the_callers_round_function():
    firsts = []

    def one_round(clocks, first):
        firsts.append(first)
        return benchmark.run_round(clocks, first)

    benchmark.interleave(_fake_clocks({"a": [1.0, 1.0], "b": [2.0, 2.0]}, []), rounds=2, one_round=one_round)
    assert firsts == [0, 1]


def test_ratio_is_the_median_of_the_per_round_ratios():
    """Not the ratio of the medians: a round's readings were taken under the same load."""
    a, b = benchmark.Timing((1.0, 4.0, 9.0)), benchmark.Timing((2.0, 2.0, 10.0))
    assert benchmark.round_ratios(a, b) == [0.5, 2.0, 0.9]
    assert benchmark.ratio(a, b) == 0.9
    assert a.median / b.median == 2.0


def test_blocked_drops_the_warm_up_and_grows_blocks_to_a_tenth_of_the_run_time():
    numbers = []

    def time_block(number: int) -> float:
        numbers.append(number)
        return 5.0 if len(numbers) == 1 else number * 1e-3  # the first call compiles

    assert benchmark.blocked(time_block, min_run_time=0.1) == pytest.approx(1e-3)
    # Warm-up, doubling until a block takes 10 ms (16 calls), then blocks of 16 up to 100 ms.
    assert numbers == [1, 1, 2, 4, 8, 16] + [16] * 6


def test_blocked_counts_wall_seconds_when_a_unit_holds_several_calls():
    """A replayed CUDA graph of 20 calls is one unit: the blocks stop at min_run_time of wall
    time (the clock once divided each block by the calls in a unit, so a reading ran 20 times
    its min_run_time: the H200's layer readings of 0.05 s took 1.2 s each)."""
    numbers = []

    def time_block(units: int) -> float:
        numbers.append(units)
        return units * 20e-3  # 20 calls of 1 ms a unit

    assert benchmark.blocked(time_block, min_run_time=0.1, calls_per_unit=20) == pytest.approx(1e-3)
    # Warm-up, a unit already takes 10 ms or more, then units up to 100 ms of wall time.
    assert numbers == [1, 1] + [1] * 4
    assert sum(units * 20e-3 for units in numbers[1:]) == pytest.approx(0.1)


def test_statements_compute_what_their_names_say():
    """oplib's forward and gradients against the unfold formulation's (autograd), on a
    non-square map at stride 2, where a swapped height and width or a wrong argument order
    would show."""
    shape = benchmark.Shape("odd", 32, 9, 12, 2, batch=2, kernel=3)
    inputs = shape.inputs(dtype=torch.float64)
    stmts = {**benchmark.OPLIB.stmts(shape, inputs, benchmark.OPS), **benchmark.UNFOLD.stmts(shape, inputs, benchmark.OPS)}
    stmts |= benchmark.depthwise_stmts(shape, inputs, benchmark.OPS)
    torch.manual_seed(0)
    stmts |= benchmark.layer_stmts(shape, inputs, benchmark.OPS)
    assert set(stmts) == {("oplib", op) for op in benchmark.OPS} | {
        ("unfold", "forward"), ("unfold", "forward+backward"),
        ("depthwise", "forward"), ("depthwise", "grad_input"), ("depthwise", "forward+backward"),
    }  # fmt: skip
    x, w = (t.detach().requires_grad_() for t in inputs[:2])
    expected = benchmark.unfold_involution(x, w, *shape.params)
    grad_input, grad_weight = torch.autograd.grad(expected, (x, w), inputs.grad_output)
    torch.testing.assert_close(stmts["oplib", "forward"].run(), expected)
    torch.testing.assert_close(stmts["unfold", "forward"].run(), expected)
    torch.testing.assert_close(stmts["oplib", "grad_input"].run(), grad_input)
    torch.testing.assert_close(stmts["oplib", "grad_weight"].run(), grad_weight)
    grad_input_only = stmts["depthwise", "grad_input"].run()[0]
    depthwise_x = inputs.input.detach().requires_grad_()
    depthwise = torch.nn.functional.conv2d(depthwise_x, inputs.depthwise_weight, None, *shape.params, shape.channels)
    torch.testing.assert_close(grad_input_only, torch.autograd.grad(depthwise, depthwise_x, inputs.grad_output)[0])
    for key in [("oplib", "forward+backward"), ("unfold", "forward+backward"), ("depthwise", "forward+backward"),
                ("oplib", "layer+backward")]:
        assert stmts[key].run() is None
    # the layer: Involution2d of the shape's geometry, built from the same seed, in eval mode
    torch.manual_seed(0)
    layer = oplib.nn.Involution2d(32, 3, 2, group_channels=shape.group_channels).double().eval()
    torch.testing.assert_close(stmts["oplib", "layer"].run(), layer(inputs.input))
