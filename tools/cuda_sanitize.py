"""Every op with CUDA kernels of its own, under compute-sanitizer (``make gpu-check`` runs it):

    compute-sanitizer --tool memcheck --error-exitcode 9 python tools/cuda_sanitize.py

Each registry sample and a few random geometries, forward and (where the op has one) backward,
float32 and bfloat16, NCHW and channels_last inputs; then the kernels no op takes by default
(involution_last.cu's channels_last kernels, under the ``LAST`` policy) on random geometries
of every instantiation and the forward where a warp takes part of a pair's groups (shared
memory the emulation does not bound), and generated_mma.cu's generator gradients (which the
ops take in bfloat16 backward) on its tests' RedNet geometries: both stagings of the input,
both loads of grad_output, R over two ranges. The sanitizer reports any out-of-bounds or misaligned access
of the kernels. The values are checked by the tests; this only launches. ``--device cpu``
makes the same calls on CPU tensors (``tools/gpu_check.py --dry``), the unrouted kernels
through the host emulation."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "kernels" / "cuda"))

from cuda_test_helpers import LAUNCHES, random_samples  # noqa: E402
import test_cuda_generated_mma_generator  # noqa: E402
import test_cuda_last  # noqa: E402

from oplib import registry  # noqa: E402


def launch_every_op(device: str = "cuda") -> int:
    launches = 0
    for name in LAUNCHES:
        spec = registry.get(name)
        for dtype in (torch.float32, torch.bfloat16):
            for sample in [*spec.sample_inputs(device, dtype, True), *random_samples(spec, dtype, 4, seed=11)]:
                for layout in (torch.contiguous_format, torch.channels_last):
                    args = [
                        a.to(device).contiguous(memory_format=layout).detach().requires_grad_(a.requires_grad)
                        if isinstance(a, torch.Tensor) and a.dim() == 4 else
                        a.to(device) if isinstance(a, torch.Tensor) else a
                        for a in sample.args
                    ]  # fmt: skip
                    out = spec.op(*args)
                    if out.requires_grad:
                        out.backward(torch.randn_like(out))
                    launches += 1
    if device == "cuda":
        torch.cuda.synchronize()
    return launches + launch_unrouted_kernels(device)


def launch_unrouted_kernels(device: str = "cuda", cases: int = 2) -> int:
    """involution_last.cu's kernels on ``cases`` random channels_last geometries of each
    instantiation, float32 and bfloat16 (``test_cuda_last``'s), its forward on
    ``test_cuda_last.pairs_of_many_groups``, and the generator gradients'
    tensor-core kernel on ``test_cuda_generated_mma_generator``'s geometries: CuPy's launch on a
    GPU, the host emulation on CPU tensors."""
    import random


    launcher = None
    if device == "cpu":
        from oplib.testing.cuda_emulation import EmulatedLauncher

        launcher = EmulatedLauncher()
    rng, launches = random.Random(13), 0
    for kind in test_cuda_last.KINDS.values():
        for kernel, stride in test_cuda_last._instantiations(kind):
            for dtype in (torch.float32, torch.bfloat16):
                for _ in range(cases):
                    args = tuple(a.to(device) if isinstance(a, torch.Tensor) else a
                                 for a in test_cuda_last._case(rng, kernel, stride, dtype, kind))
                    assert kind.launch(*args, test_cuda_last._result(args, kind), launcher) is not None
                    launches += 1
    forward = test_cuda_last.FORWARD
    for _, cpu_args in test_cuda_last.pairs_of_many_groups():
        args = tuple(a.to(device) if isinstance(a, torch.Tensor) else a for a in cpu_args)
        assert forward.launch(*args, test_cuda_last._result(args, forward), launcher) is not None
        launches += 1
    from oplib.kernels.involution import cuda as involution_cuda
    from oplib.ops.involution_generated import _generator_grads_result

    for case in test_cuda_generated_mma_generator.GENERATOR_CASES:
        args = tuple(a.to(device) if isinstance(a, torch.Tensor) else a
                     for a in test_cuda_generated_mma_generator.generator_arguments(case.arguments(torch.bfloat16)))
        out = _generator_grads_result(*args)
        assert involution_cuda.involution_generated_mma_backward_generator(*args, out, launcher) is not None
        launches += 1
    if device == "cuda":
        torch.cuda.synchronize()
    return launches


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda", choices=("cuda", "cpu"),
                        help="cpu: the same calls on CPU tensors, without the sanitizer (tools/gpu_check.py --dry)")
    print(f"{launch_every_op(parser.parse_args().device)} calls, forward and backward, synchronised", flush=True)
