"""Every op on CUDA streams and in CUDA graphs (needs a GPU): a side stream's order is kept,
capture and replay match eager, the first call of a process may come inside a capture (with or
without ``oplib.kernels.load`` ahead), and tensors on another GPU launch there."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
import torch

from oplib import registry
from oplib._torch_private import cuda_sleep
from oplib.kernels import CUDA_DISPATCH
from oplib.testing import tensor_args

CUDA_SPECS = [pytest.param(spec, id=spec.name) for spec in registry.all_specs() if "cuda" in spec.dtypes]
# The ops with CUDA kernels of their own. The others run torch's (cuBLAS, cuDNN), whose first
# call inside a capture fails as torch's own ops do: torch's docs ask for a warm-up first.
OWN_KERNEL_SPECS = [pytest.param(spec, id=spec.name) for spec in registry.all_specs() if spec.qualname in CUDA_DISPATCH]
pytestmark = pytest.mark.needs_cuda


def _samples(spec, device="cuda"):
    # Non-empty samples: an empty one launches nothing, so it proves nothing about streams.
    return [s for s in spec.sample_inputs(device, torch.float32, False) if all(
        a.numel() for a in s.args if isinstance(a, torch.Tensor))]


def _with_new_values(sample):
    return [torch.randn_like(a) if isinstance(a, torch.Tensor) else a for a in sample.args]


@pytest.mark.parametrize("spec", CUDA_SPECS)
def test_side_stream_keeps_its_order(spec):
    """On a side stream, the op must read its inputs after the writes queued before it on that
    stream: a 50 ms sleep delays those writes, so a launch on any other stream reads stale values."""
    side = torch.cuda.Stream()
    for sample in _samples(spec):
        fresh = _with_new_values(sample)
        expected = spec.op(*fresh)
        args = list(sample.args)
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            cuda_sleep(50_000_000)
            for i in tensor_args(sample):
                args[i].copy_(fresh[i])
            out = spec.op(*args)
        torch.cuda.current_stream().wait_stream(side)
        torch.testing.assert_close(out, expected, msg=sample.name)


@pytest.mark.parametrize("spec", CUDA_SPECS)
def test_graph_capture_and_replay_match_eager(spec):
    for sample in _samples(spec):
        static = list(sample.args)
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):  # warm-up outside the capture, as torch's docs advise
            spec.op(*static)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = spec.op(*static)
        for _ in range(2):
            fresh = _with_new_values(sample)
            for i in tensor_args(sample):
                static[i].copy_(fresh[i])
            graph.replay()
            torch.testing.assert_close(out, spec.op(*fresh), msg=sample.name)


_FIRST_CALL_IN_CAPTURE = textwrap.dedent(
    """
    import sys, torch, oplib
    from oplib import registry
    spec = registry.get(sys.argv[1])
    sample = next(s for s in spec.sample_inputs("cuda", torch.float32, False) if s.args[0].numel())
    if sys.argv[2] == "load":
        oplib.kernels.load("cuda")
    graph = torch.cuda.CUDAGraph()
    try:
        with torch.cuda.graph(graph):
            out = spec.op(*sample.args)
    except RuntimeError as error:
        print("RAISED:", error)
        sys.exit(0)
    graph.replay()
    torch.testing.assert_close(out, spec.op(*sample.args))
    print("REPLAYED")
    """
)


def _first_call_in_capture(name: str, load: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", _FIRST_CALL_IN_CAPTURE, name, load], capture_output=True, text=True, timeout=600
    )


@pytest.mark.parametrize("load", ["load", "none"])
@pytest.mark.parametrize("spec", OWN_KERNEL_SPECS)
def test_first_call_of_a_process_inside_capture(spec, load):
    """A fresh process whose first call of the op is inside a capture: the kernels compile and
    load during the capture (or were loaded ahead by oplib.kernels.load), and replay matches."""
    result = _first_call_in_capture(spec.name, load)
    assert result.returncode == 0 and "REPLAYED" in result.stdout, result.stdout + result.stderr


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs")
@pytest.mark.parametrize("spec", CUDA_SPECS)
def test_tensors_on_the_second_gpu_launch_there(spec):
    with torch.cuda.device(0):
        for sample in _samples(spec, "cuda:1"):
            out = spec.op(*sample.args)
            assert out.device == torch.device("cuda", 1)
            cpu = [a.cpu() if isinstance(a, torch.Tensor) else a for a in sample.args]
            atol, rtol = spec.tolerance(torch.float32)
            torch.testing.assert_close(out.cpu(), spec.op(*cpu), atol=atol, rtol=rtol, msg=sample.name)
