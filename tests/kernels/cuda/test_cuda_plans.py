"""Launch plans (oplib.kernels.cuda_plan): each op's CUDA kernel, run on CPU tensors through
the host emulation, gives the whole path's result on the first call of a signature and the
same launches, with the new call's pointers, on every later one; a signature whose writer
copies or uses a temporary is never planned."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from oplib import benchmark, registry
from oplib.kernels.cuda_plan import LaunchPlans, plan_key
from oplib.ops._rules import CONTRACTS, CUDA_KERNELS, cuda_kernel
from oplib.testing.cuda_emulation import EmulatedLauncher
from oplib.testing.recording_launcher import RecordingCuPyLauncher
from oplib.testing.specs.involution import reference
from oplib.testing.toolchain import require_host_compiler

from cuda_test_helpers import window_operands

WINDOW = ([1, 1], [3, 3], [1, 1])


def _kernel(qualname: str) -> tuple[LaunchPlans, EmulatedLauncher]:
    launcher = EmulatedLauncher()
    return cuda_kernel(CONTRACTS[qualname], lambda: launcher), launcher


def test_a_repeated_signature_replays_the_same_launches_on_the_new_tensors():
    require_host_compiler()
    kernel, launcher = _kernel("oplib::involution")
    calls = []
    writer = kernel.writer
    kernel.writer = lambda *args: (calls.append(1), writer(*args))[1]
    for channels_last in (False, True):
        for seed in range(3):
            x, w = window_operands(seed, channels_last)
            out = kernel(x, w, *WINDOW)
            torch.testing.assert_close(out, reference(x, w, *WINDOW))
            assert out.is_contiguous(memory_format=torch.channels_last) == channels_last
    # One full path per layout; the other four calls were replays of the same kernel launches.
    assert len(calls) == 2 and len(kernel.plans) == 2 and all(kernel.plans.values())
    assert [launch[0] for launch in launcher.launches] == ["involution_forward_chunked"] * 6
    assert launcher.launches[0] == launcher.launches[2] and launcher.launches[3] == launcher.launches[5]


def test_a_copy_or_a_temporary_is_never_planned():
    """A strided input is copied by the writer (a tensor the plan could not name), and
    involution_generated without a bias launches on a temporary of zeros: both signatures run
    the whole path on every call, and give the reference's result each time."""
    require_host_compiler()
    kernel, _ = _kernel("oplib::involution")
    x, w = window_operands(0)
    strided = torch.randn(2, 16, 9, 18)[..., ::2]
    for _ in range(2):
        torch.testing.assert_close(kernel(strided, w, *WINDOW), reference(strided, w, *WINDOW))
    assert list(kernel.plans.values()) == [None]
    generated, _ = _kernel("oplib::involution_generated")
    feature, span_weight = torch.randn(2, 4, 9, 9), torch.randn(49, 4)
    for _ in range(2):
        out = generated(x, feature, span_weight, None, [7, 7], *WINDOW)
        weight = torch.einsum("or,nrhw->nohw", span_weight, feature).view(2, 1, 7, 7, 9, 9)
        torch.testing.assert_close(out, reference(x, weight, *WINDOW), rtol=1e-4, atol=1e-4)
    assert list(generated.plans.values()) == [None]


def test_the_key_holds_everything_a_launch_decision_reads():
    """Strides, alignment, dtype and the int arguments each make another signature; a tensor
    subclass (a fake tensor while tracing) is never planned; invalid arguments still raise."""
    x, w = window_operands(0)
    base = plan_key((x, w, *WINDOW))
    offset = torch.empty(x.numel() + 1)[1:].view_as(x)
    others = [
        (x.contiguous(memory_format=torch.channels_last), w, *WINDOW),
        (offset, w, *WINDOW),
        (x.double(), w.double(), *WINDOW),
        (x, w, [2, 2], *WINDOW[1:]),
    ]
    keys = {plan_key(args) for args in others}
    assert base not in keys and len(keys) == len(others)

    class Subclass(torch.Tensor):
        pass

    assert plan_key((x.as_subclass(Subclass), w, *WINDOW)) is None
    kernel, _ = _kernel("oplib::involution")
    require_host_compiler()
    kernel(x, w, *WINDOW)
    try:
        kernel(x, w[:, :, :5], *WINDOW)
    except RuntimeError as error:
        assert "oplib.involution" in str(error)
    else:
        raise AssertionError("a weight of the wrong shape was accepted")


@pytest.mark.integration
def test_the_planned_host_path_costs_at_most_1_3x_a_bare_custom_op():
    """bench/host_launch.py's bar, held every session on the CPU: involution's CUDA kernel over
    the recording launcher, against a bare custom op of its schema that allocates its result
    and makes the same launch through the same launcher (interleaved rounds, median ratio)."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "bench"))
    import host_launch

    launcher = RecordingCuPyLauncher()
    sample = next(iter(registry.get("involution").sample_inputs("cpu", torch.float32, False)))
    impls = host_launch.candidates("oplib::involution", sample.args, launcher)
    clocks = {name: benchmark.clock(benchmark.call(impls[name], *sample.args), "cpu", 0.05) for name in ("bare", "oplib")}
    times = benchmark.interleave(clocks, 7)
    ratio = benchmark.ratio(times["oplib"], times["bare"])
    assert launcher.launches > 0
    assert ratio <= host_launch.MAX_RATIO, f"oplib / bare = {ratio:.3f}"


@pytest.mark.needs_cuda
def test_the_registered_cuda_kernel_plans_and_replays_on_a_gpu():
    """On a GPU: the second call of a signature is a replay (one plan, no second one made),
    and both calls give the CPU path's result."""
    kernel = CUDA_KERNELS["oplib::involution"]
    x, w = window_operands(5)
    expected = reference(x.double(), w.double(), *WINDOW).float()
    kernel.plans.clear()
    first = torch.ops.oplib.involution(x.cuda(), w.cuda(), *WINDOW)
    plans = dict(kernel.plans)
    second = torch.ops.oplib.involution(x.cuda() * 2, w.cuda(), *WINDOW)
    assert len(plans) == 1 and all(plans.values()) and kernel.plans == plans
    torch.testing.assert_close(first.cpu(), expected, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(second.cpu(), 2 * expected, rtol=1e-4, atol=1e-4)


def test_every_op_of_the_host_launch_table_runs_over_the_recording_launcher():
    """bench/host_launch.py's candidates for every op it times, each called once on CPU over the
    recording launcher. Before: involution_generated's kernel opts into more than 48 KiB of
    shared memory, the opt-in asked torch.cuda for the GPU's limit, and the benchmark failed on
    every machine without a GPU."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "bench"))
    import host_launch

    launcher = RecordingCuPyLauncher()
    timed = [spec for spec in registry.all_specs() if spec.qualname in host_launch.CUDA_DISPATCH]
    assert timed
    not_planned = []
    for spec in timed:
        sample = next(iter(spec.sample_inputs("cpu", torch.float32, False)))
        before = launcher.launches
        try:
            impls = host_launch.candidates(spec.qualname, sample.args, launcher)
        except host_launch.NotPlanned:
            not_planned.append(spec.name)
            continue
        for impl in impls.values():
            impl(*sample.args)
        assert launcher.launches >= before + 3, spec.name
    assert launcher._driver.opt_ins >= 1  # what failed before
    # the fused op's grad_input writes the span conv's map (a temporary), so it is never planned
    assert not_planned == ["involution_generated_backward_input"]


@pytest.mark.integration
def test_host_launch_times_the_ops_as_a_step_calls_them(tmp_path):
    """bench/host_launch.py --quick, in a process of its own (it registers the CUDA kernels on
    the real ops' CPU key): its second table has every op and way of calling it, through the
    CPU kernels and the CUDA host path, each timed with direct calls and through the dispatcher;
    its third every model's step in each task."""
    import json
    import subprocess

    bench = Path(__file__).resolve().parents[3] / "bench"
    output = tmp_path / "host_launch.md"
    subprocess.run([sys.executable, str(bench / "host_launch.py"), "--quick", "--output", str(output)], check=True,
                   capture_output=True, text=True, timeout=600)
    tables = json.loads(output.with_suffix(".json").read_text())["tables"]
    table = next(t for t in tables if t["heading"].startswith("Per call in a training step"))
    sys.path.insert(0, str(bench))
    import host_launch

    assert len(table["rows"]) == 2 * len(host_launch.STEP_OPS) * len(host_launch.STEP_MODES)
    assert {row[1] for row in table["rows"]} == {"CPU", "CUDA host path"}
    assert {row[2] for row in table["rows"]} == set(host_launch.STEP_MODES)
    assert all(float(row[3]) > 0 and float(row[4]) > 0 for row in table["rows"])
    # the third: each model's step in each task, its host path's work in its columns
    models = next(t for t in tables if t["heading"].startswith("RedNet-50 against ResNet-50"))
    rows = {(row[0], row[1]): row for row in models["rows"]}
    assert set(rows) == {(task, name) for task in host_launch.MODEL_TASKS for name in host_launch.MODEL_CANDIDATES}
    for task in host_launch.MODEL_TASKS:
        assert rows[task, "ResNet-50"][3] == "**1.00x**"
        assert float(rows[task, "ResNet-50"][5]) == 0 and float(rows[task, "RedNet-50, free involutions"][5]) == 0
        # the involution layers are there, through oplib's ops, and cost the host their ops
        assert float(rows[task, "RedNet-50"][5]) > 0 and float(rows[task, "RedNet-50, fused"][5]) > 0
        assert int(rows[task, "RedNet-50"][4]) > int(rows[task, "RedNet-50, free involutions"][4])
