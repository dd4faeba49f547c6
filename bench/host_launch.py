#!/usr/bin/env python
"""The CUDA host path's per-call time, measured on any machine: every op with CUDA kernels of
its own, on its first registry sample (float32), through its real CUDA kernel
(``oplib.ops._rules.cuda_kernel``: launch plans over the rules, the result and the backend's
launch policy) built over ``oplib.testing.recording_launcher.RecordingCuPyLauncher`` (CuPy's
launcher up to the driver call, which it counts instead of making), registered as a custom op
of the op's schema on CPU. Against it, interleaved in the same rounds:

- ``bare``: a custom op of the same schema whose kernel allocates its result and launches
  the same kernel with the same arguments through the same launcher (``launch``: the config
  checked, the kernel looked up, the parameters packed), deciding nothing: the floor of any
  custom op that launches a kernel from Python;
- ``unplanned``: the op's CUDA host path as it was before launch plans: the rules, the
  result allocated, the backend's writer deciding and launching, on every call, registered
  through custom_op's ``register_kernel`` as it was.

``oplib`` is registered as oplib registers its CUDA kernels (``register_device_kernel``:
``Library.impl``, without custom_op's per-call wrappers); ``bare`` and ``unplanned`` with
custom_op's own registration.

The bar (issue "The GPU path ready for fast kernels"): oplib / bare <= 1.3 on every row. An op
whose CUDA path writes a temporary (``involution_generated_backward_input``: the span conv's
weight map, then involution's grad_input kernel) is never planned and has no one launch to
set beside a bare op's: the report names it under the table (``NotPlanned``).
On a GPU ``make gpu-check`` measures the same row with real launches (bench/_cuda.py).

A second table times the ops themselves (``torch.ops.oplib.*``) as a training step calls them,
through their CPU kernels and then with their CUDA kernels registered on CPU over the same
launcher: with no gradient, forward and
backward (the backward ops' calls included), and both under autocast (bfloat16 operands), each
with direct calls (``oplib.ops._common.DIRECT_CALLS``: oplib's autocast and autograd kernels
call the next kernel themselves where nothing stands between) and through the dispatcher,
interleaved. Each layer of Python kernels a call crosses costs a crossing from the dispatcher
into Python; the table says what the direct calls save of them.

A third table times whole steps of RedNet-50 and ResNet-50 (bf16 autocast, channels_last),
both narrowed until their CPU compute is small, with the same kernels registered on CPU: what a
step costs the host, which a GPU step waits for wherever its kernels are faster than their
launches (RedNet-50's eager steps at batch 32 on an H200). Beside them RedNet-50 on the fused
op and RedNet-50 with its involution layers free, the most any involution kernel could give.

Usage (from the repo root)::

    python bench/host_launch.py           # about two minutes; bench/results/host_launch.md
    python bench/host_launch.py --quick   # smoke test
"""

from __future__ import annotations

import sys
from collections.abc import Callable

import torch
from torch import Tensor

import _cuda
import _harness
from oplib import benchmark, registry
from oplib.kernels import CUDA_DISPATCH
from oplib.kernels.cuda_plan import LaunchRecorder
from oplib.ops import _common
from oplib.ops._common import register_device_kernel
from oplib.ops._rules import CONTRACTS, cuda_kernel
from oplib.testing.recording_launcher import RecordingCuPyLauncher

MAX_RATIO = 1.3
IMPLS = ("bare", "oplib", "unplanned")


def _schema(qualname: str) -> str:
    namespace, name = qualname.split("::")
    return "(" + str(getattr(getattr(torch.ops, namespace), name).default._schema).split("(", 1)[1]


def _custom_op(name: str, kernel: Callable[..., Tensor], qualname: str,
               as_oplib: bool = False) -> Callable[..., Tensor]:
    """A custom op of ``qualname``'s schema running ``kernel`` on CPU: registered as oplib
    registers its CUDA kernels (``register_device_kernel``) where ``as_oplib``, else with
    custom_op's own registration, as a user's op would be."""
    torch.library.custom_op(f"oplib_host::{name}", kernel, mutates_args=(), device_types="cuda" if as_oplib else "cpu",
                            schema=_schema(qualname))
    if as_oplib:
        register_device_kernel(f"oplib_host::{name}", "cpu", kernel)
    return getattr(torch.ops.oplib_host, name).default


class NotPlanned(Exception):
    """The op's CUDA path for the sample's signature is not planned (it copies an operand or
    writes a temporary), so there is no one launch a bare op could copy."""


def candidates(qualname: str, args: tuple, launcher: RecordingCuPyLauncher) -> dict[str, Callable[..., Tensor]]:
    """The three custom ops of the module docstring for ``qualname``, each launching through
    ``launcher``; ``NotPlanned`` where the sample's signature is not planned."""
    contract = CONTRACTS[qualname]
    planned = cuda_kernel(contract, lambda: launcher)
    planned(*args)  # the first call records the plan the bare op copies its launch from
    (plan,) = planned.plans.values()
    if plan is None:
        raise NotPlanned(f"{qualname}: the sample's signature is not planned, so there is no launch to compare")
    recorder = LaunchRecorder(launcher)
    contract.writers["cuda"](*args, contract.result(*args), recorder)
    source, kernel, dtype, config, kernel_args, specialisation = recorder.launches[0]
    scalars = [a for a in kernel_args if not isinstance(a, Tensor)]
    shape, stride = plan.shape, plan.stride

    def bare(*call_args):
        out = torch.empty_strided(shape, stride, dtype=dtype)
        tensors = [a for a in call_args if isinstance(a, Tensor)]
        launcher.launch(source, kernel, dtype, config, (*tensors, out, *scalars), specialisation)
        return out

    def unplanned(*call_args):
        contract.rules.enforce(*call_args)
        return contract.writers["cuda"](*call_args, contract.result(*call_args), launcher)

    name = qualname.split("::")[1]
    return {
        "bare": _custom_op(f"{name}_bare", bare, qualname),
        "oplib": _custom_op(f"{name}_planned", planned, qualname, as_oplib=True),
        "unplanned": _custom_op(f"{name}_unplanned", unplanned, qualname),
    }


# The ops a training step calls (the backward ops through their backward), and how: no
# gradient; forward + backward; forward + backward under autocast, the operands bfloat16.
STEP_OPS = ("oplib::involution", "oplib::involution_generated")
STEP_MODES = ("no grad", "forward + backward", "forward + backward, autocast")
def _step(op, args: tuple, mode: str, direct: bool) -> Callable[[], None]:
    """One call of ``op`` as ``mode`` says, ``DIRECT_CALLS`` set to ``direct`` first; under
    autocast through its thread-local switch (torch.autocast's context manager costs more than
    a call)."""
    if mode == "no grad":
        plain = tuple(a.detach() if isinstance(a, Tensor) else a for a in args)

        def call() -> None:
            _common.DIRECT_CALLS = direct
            op(*plain)

        return call
    autocast = mode.endswith("autocast")
    dtype = torch.bfloat16 if autocast else None
    leaves = tuple(a.detach().to(dtype or a.dtype).requires_grad_() if isinstance(a, Tensor) and a.is_floating_point()
                   else a for a in args)
    grad = torch.randn_like(op(*leaves).detach())
    step = benchmark.fwd_bwd_step(op, leaves, grad)

    def call() -> None:
        _common.DIRECT_CALLS = direct
        if autocast:
            torch.set_autocast_enabled("cpu", True)
            torch.set_autocast_dtype("cpu", torch.bfloat16)
        try:
            step()
        finally:
            if autocast:
                torch.set_autocast_enabled("cpu", False)

    return call


def step_rows(section: _harness.Section, launcher: RecordingCuPyLauncher) -> list[tuple]:
    """The second table's rows: per op and mode, direct calls against the dispatcher's way;
    first through the ops' CPU kernels (the native ones), then through their CUDA host path."""
    rows = []
    try:
        for kernels in ("CPU", "CUDA host path"):
            if kernels != "CPU":
                _cuda.cuda_kernels_on_cpu(launcher)
            for qualname in STEP_OPS:
                spec = next(s for s in registry.all_specs() if s.qualname == qualname)
                sample = next(iter(spec.sample_inputs("cpu", torch.float32, False)))
                op = getattr(torch.ops.oplib, spec.name).default
                for mode in STEP_MODES:
                    stmts = {name: benchmark.call(_step(op, sample.args, mode, name == "direct"))
                             for name in ("direct", "dispatcher")}
                    before = launcher.launches
                    times = section.measure(f"{spec.name} {sample.name}, {kernels}, {mode}", stmts)
                    assert kernels == "CPU" or launcher.launches > before, "the calls launched nothing"
                    direct, through = (times[name].median * 1e6 for name in ("direct", "dispatcher"))
                    rows.append((f"{spec.name} ({sample.name})", kernels, mode, f"{direct:.1f}", f"{through:.1f}",
                                 f"**{benchmark.ratio(times['direct'], times['dispatcher']):.3f}**"))
    finally:
        _common.DIRECT_CALLS = True
    return rows


# RedNet-50 and ResNet-50 steps as the host runs them: both models narrowed to MODEL_WIDTH
# channels (RedNet-50 with MODEL_GROUP_CHANNELS a group: the GPU command's dry run's sizes) and fed
# MODEL_BATCH images of MODEL_SIZE px, so that their CPU compute is small beside the host's
# work, which does not shrink with them (every layer's ops, oplib's CUDA host path). Smaller
# images would not shrink all of it: the weights' gradients and the optimizer's update grow with
# the width squared, whatever the images, which is why the width is narrowed, not the images.
MODEL_WIDTH, MODEL_GROUP_CHANNELS, MODEL_BATCH, MODEL_SIZE = 16, 8, 2, 32
MODEL_CANDIDATES = ("RedNet-50", "RedNet-50, fused", "RedNet-50, free involutions", "ResNet-50")
MODEL_TASKS = ("train", "inference")


def _model(name: str) -> torch.nn.Module:
    """``name`` of ``MODEL_CANDIDATES`` at ``MODEL_WIDTH``, channels_last. RedNet-50's layers
    take the path CUDA takes (``FUSED_BY_DEVICE``: unfused), or the fused op where the name
    says so, whatever the device."""
    from rednet import rednet50_free_involutions, resnet50

    from oplib.models import rednet50
    from oplib.nn import FUSED_BY_DEVICE, Involution2d

    torch.manual_seed(0)
    if name == "ResNet-50":
        model = resnet50(width=MODEL_WIDTH)
    elif name.endswith("free involutions"):
        model = rednet50_free_involutions(width=MODEL_WIDTH, group_channels=MODEL_GROUP_CHANNELS)
    else:
        model = rednet50(width=MODEL_WIDTH, group_channels=MODEL_GROUP_CHANNELS)
        for module in model.modules():
            if isinstance(module, Involution2d):
                module.fused = name.endswith("fused") or FUSED_BY_DEVICE.get("cuda", False)
    return model.to(memory_format=torch.channels_last)


def model_rows(section: _harness.Section, launcher: RecordingCuPyLauncher) -> list[tuple]:
    """The third table's rows: per task, the candidates' steps interleaved (oplib's CUDA kernels
    registered on CPU over ``launcher``), then each profiled once (``_cuda.profile_steps``: its aten
    ops and the host time inside oplib's ops)."""
    _cuda.cuda_kernels_on_cpu(launcher)
    # the GPU command's steps (bench/_cuda.py: bfloat16 autocast, SGD), on the CPU and eager
    host = _cuda.Target("cpu", launcher, "the CPU")
    images = torch.randn(MODEL_BATCH, 3, MODEL_SIZE, MODEL_SIZE).contiguous(memory_format=torch.channels_last)
    labels = torch.randint(0, 1000, (MODEL_BATCH,))
    rows = []
    for task in MODEL_TASKS:
        models = {name: _model(name) for name in MODEL_CANDIDATES}
        steps = {name: _cuda._model_step(host, model, model, task, "eager", images, labels)
                 for name, model in models.items()}
        for step in steps.values():
            step()  # the launch plans, the autocast casts' caches, the optimizer's state
        before = launcher.launches
        times = section.measure(f"models, {task}", {name: benchmark.call(step) for name, step in steps.items()})
        assert launcher.launches > before, "RedNet-50's steps launched nothing"
        for name, step in steps.items():
            profiled = _cuda.profile_steps(step, 1, host)
            rows.append((task, name, f"{times[name].median * 1e3:.2f}",
                         f"**{benchmark.ratio(times[name], times['ResNet-50']):.2f}x**", f"{profiled['aten_ops']:.0f}",
                         f"{profiled['oplib_host_us'] / 1e3:.2f}"))
    return rows


def main() -> int:
    args = _harness.parser(__doc__, rounds=7, min_run_time=0.3, quick_rounds=2, quick_min_run_time=0.05).parse_args()
    settings = _harness.start(args, __file__)
    section = _harness.Section(settings)
    launcher = RecordingCuPyLauncher()
    cells = []
    failed, not_planned = [], []
    for spec in registry.all_specs():
        if spec.qualname not in CUDA_DISPATCH:
            continue
        sample = next(iter(spec.sample_inputs("cpu", torch.float32, False)))
        try:
            impls = candidates(spec.qualname, sample.args, launcher)
        except NotPlanned:
            not_planned.append(spec.name)
            continue
        before = launcher.launches
        stmts = {name: benchmark.call(impls[name], *sample.args) for name in IMPLS}
        times = section.measure(f"{spec.name} {sample.name}", stmts)
        assert launcher.launches > before, "the candidates launched nothing"
        medians = {name: times[name].median * 1e6 for name in IMPLS}
        ratio = benchmark.ratio(times["oplib"], times["bare"])
        before_ratio = benchmark.ratio(times["unplanned"], times["bare"])
        if ratio > MAX_RATIO:
            failed.append(spec.name)
        cells.append((f"{spec.name} ({sample.name})", *(f"{medians[name]:.1f}" for name in IMPLS),
                      f"**{ratio:.3f}**", f"{before_ratio:.3f}", "PASS" if ratio <= MAX_RATIO else "FAIL"))
    step_cells = step_rows(section, launcher)
    model_cells = model_rows(section, launcher)
    verdict = (f"**PASS**: every oplib / bare ratio is <= {MAX_RATIO:g}." if not failed
               else f"**FAIL**: oplib / bare > {MAX_RATIO:g} for {', '.join(failed)}.")
    lines = [
        *_harness.header(
            settings, "CUDA host path per call, timed on the CPU",
            "each op's CUDA kernel as registered (launch plans, `register_device_kernel`) over CuPy's launcher "
            "with the driver call counted instead of made (`oplib.testing.recording_launcher`), on the op's first "
            "float32 registry sample, as a custom op of the op's schema; no grad",
            "`bare`: a custom op of the same schema (custom_op's `register_kernel`) that allocates its result and "
            "launches the same kernel through the same launcher; `unplanned`: the host path without launch plans "
            "(rules, allocation, launch policy on every call) registered with `register_kernel`, as it was before",
            "medians of interleaved rounds, microseconds per call; ratios are medians of the per-round ratios",
        ),
        section.load_line(),
        "",
        "## Per call",
        "",
        *_harness.table(("op (sample)", "bare (us)", "oplib (us)", "unplanned (us)", "oplib / bare",
                         "unplanned / bare", f"<= {MAX_RATIO:g}"), "lrrrrrc", cells),
        "",
        verdict,
        *(["", f"Not planned, so not in the table: {', '.join(not_planned)} (its CUDA path writes the span conv's "
                "weight map, a temporary, then launches involution's grad_input kernel: every call runs the whole "
                "host path)."] if not_planned else []),
        "",
        "## Per call in a training step: direct calls",
        "",
        "The ops as a step calls them (`torch.ops.oplib.*`), on the same samples, through their CPU kernels (the "
        "native ones, their compute included; custom_op registers them, so a direct call reaches only their autograd "
        "kernel, from the autocast one) and through their CUDA host path (their CUDA kernels registered on CPU "
        "as oplib registers them on CUDA, over the same launcher): no gradient; forward and backward "
        "(`out.backward(grad)`, the backward ops' "
        "calls included, the leaves' gradients reset); the same under autocast with bfloat16 operands. `direct`: "
        "oplib's autocast and autograd kernels call the next kernel themselves where nothing stands between "
        "(`oplib.ops._common.DIRECT_CALLS`, the default); `dispatcher`: each goes back through the dispatcher, as "
        "before. Medians of interleaved rounds, microseconds per call or step. involution_generated's CUDA host path "
        "runs torch's own ops on its CPU tensors in the backward (the span conv's weight map, the map route's "
        "contractions), whose CPU time its rows include.",
        "",
        *_harness.table(("op (sample)", "kernels", "calls", "direct (us)", "dispatcher (us)", "direct / dispatcher"),
                        "lllrrr", step_cells),
        "",
        "## RedNet-50 against ResNet-50: a step's host time",
        "",
        f"Both models narrowed to width {MODEL_WIDTH} (the stem's channels and the first stage's bottleneck width; "
        f"64 in the paper and in torchvision; RedNet-50 with {MODEL_GROUP_CHANNELS} channels a group), "
        f"{MODEL_BATCH} images of {MODEL_SIZE} x {MODEL_SIZE} px, channels_last, bfloat16 autocast: every layer's "
        "ops are there, their CPU compute is small, so a step's time is mostly what the host spends on it, which "
        "a GPU step that outruns its launches waits for. oplib's CUDA kernels are registered on CPU over the same "
        "launcher. train: forward + cross-entropy + backward + SGD step; inference: "
        "eval mode under no_grad. RedNet-50: its involution layers unfused (span conv + `involution`), as on CUDA; "
        "fused: `involution_generated`, whose CUDA host path runs torch's ops for its backward (the span conv's "
        "weight map, the map route); free involutions: every involution layer, generation branch and all, replaced "
        "by its input (strided where the layer is), the most any involution implementation could bring RedNet-50 "
        "to. / ResNet-50: the median of the per-round ratios of the step times (below 1: faster than ResNet-50). "
        "aten ops: a step's `aten::` events (those inside others included); oplib host: the time inside oplib's "
        "ops (`oplib::` events), both from one step under torch.profiler, which slows it.",
        "",
        *_harness.table(("task", "model", "step (ms)", "/ ResNet-50", "aten ops a step", "oplib host (ms)"),
                        "llrrrr", model_cells),
    ]
    print(_harness.write_report(settings, lines))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
