"""Plant one bug at a time in an op's backward, fake, vmap rule (one that ignores ``in_dims``),
forward-mode rule or error message, run the unit tier's checks of that op with ``-x``, and
report whether it failed (it must) and which test caught the bug first.

    python tools/plant_bugs.py            # every planted bug
    python tools/plant_bugs.py exp-fake   # the named ones

Each bug is a text edit of an op file, undone after its run (also on Ctrl-C). The run is
``make test`` (the unit tier: ``-m "not integration"``) restricted to the planted op's tests
in the files that check every op (tests/ops/test_ops.py, tests/ops/test_transforms.py,
compile_tests/ops/test_compile.py), so a bug caught there fails ``make test``.
"""

from __future__ import annotations

import re
import subprocess
import sys
import time
from pathlib import Path
from typing import NamedTuple

ROOT = Path(__file__).resolve().parents[1]
FILES = "tests/ops/test_ops.py tests/ops/test_transforms.py compile_tests/ops/test_compile.py"


class Bug(NamedTuple):
    name: str
    path: str
    old: str
    new: str


ZEROED = "[None if d is None else 0 for d in in_dims{}]"
EXP, LINEAR, CONV2D, INVOLUTION = (f"oplib/ops/{op}.py" for op in ("exp", "linear", "conv2d", "involution"))

BUGS = [
    Bug("exp-backward", EXP, "    return grad * y\n", "    return 2 * grad * y\n"),
    Bug("exp-fake", EXP, "    _check_exp_args(x)\n    return torch.empty_like(x)",
        "    _check_exp_args(x)\n    return torch.empty(x.shape, dtype=x.dtype, device=x.device)"),
    Bug("exp-vmap", EXP, "return exp(x), in_dims[0]", "return exp(x), 0"),
    Bug("exp-jvp", EXP, "return x_dot * output  #", "return 2 * x_dot * output  #"),
    Bug("exp-error", EXP, 'check_floating("exp", "x", x)', 'check_floating("exp", "input", x)'),
    Bug("linear-backward", LINEAR, "grad_input = grad @ weight", "grad_input = 2 * grad @ weight"),
    Bug("linear-fake", LINEAR, "new_empty((*input.shape[:-1], weight.shape[0]))",
        "new_empty((*input.shape[:-1], weight.shape[1]))"),
    Bug("linear-vmap", LINEAR, "bias_dim = in_dims\n", f"bias_dim = {ZEROED.format('')}\n"),
    Bug("linear-jvp", LINEAR, "linear(input, weight_dot, None)", "linear(input, 2 * weight_dot, None)"),
    Bug("linear-error", LINEAR, "IN_FEATURES.format(input_size=list(input.shape), weight_size=list(weight.shape))",
        "IN_FEATURES.format(input_size=list(weight.shape), weight_size=list(input.shape))"),
    Bug("conv2d-backward", CONV2D, "return grad_input, grad_weight, grad_bias, None",
        "return grad_input, grad_weight, None if grad_bias is None else 2 * grad_bias, None"),
    Bug("conv2d-fake", CONV2D, "device=input.device, memory_format=_output_memory_format(input, weight)",
        "device=input.device, memory_format=torch.contiguous_format"),
    Bug("conv2d-vmap", CONV2D, "bias_dim = in_dims[:3]", f"bias_dim = {ZEROED.format('[:3]')}"),
    Bug("conv2d-jvp", CONV2D, "bias_dot = bias_dot[:, None, None]", "bias_dot = 2 * bias_dot[:, None, None]"),
    Bug("conv2d-error", CONV2D, "OUT_CHANNELS_DIVISIBLE.format(out_channels=out_channels, groups=groups)",
        "OUT_CHANNELS_DIVISIBLE.format(out_channels=groups, groups=out_channels)"),
    Bug("involution-backward", INVOLUTION, "grad_input = involution_backward_input(grad, weight,",
        "grad_input = 2 * involution_backward_input(grad, weight,"),
    Bug("involution-fake", INVOLUTION, "input.shape[1], weight.shape[4], weight.shape[5]))",
        "input.shape[1], weight.shape[5], weight.shape[4]))"),
    Bug("involution-vmap", INVOLUTION, "_fold_batch(info, in_dims[:2], (input, weight))",
        f"_fold_batch(info, {ZEROED.format('[:2]')}, (input, weight))"),
    Bug("involution-jvp", INVOLUTION, "involution(input, weight_dot, stride", "involution(input, 2 * weight_dot, stride"),
    Bug("involution-error", INVOLUTION, "check(weight.shape[0] == n, lambda: BATCH.format(**sizes))",
        'check(weight.shape[0] == n, lambda: BATCH.format(input_size=sizes["weight_size"], weight_size=sizes["input_size"]))'),
    Bug("involution_backward_input-backward", INVOLUTION, "d_grad_output = involution(upstream, weight,",
        "d_grad_output = 2 * involution(upstream, weight,"),
    Bug("involution_backward_input-fake", INVOLUTION, "grad_output.shape[1], *input_size))",
        "grad_output.shape[1], *reversed(input_size)))"),
    Bug("involution_backward_input-vmap", INVOLUTION, "_fold_batch(info, in_dims[:2], (grad_output, weight))",
        f"_fold_batch(info, {ZEROED.format('[:2]')}, (grad_output, weight))"),
    Bug("involution_backward_input-jvp", INVOLUTION, "involution_backward_input(grad_output, weight_dot,",
        "involution_backward_input(grad_output, 2 * weight_dot,"),
    Bug("involution_backward_input-error", INVOLUTION, "lambda: WEIGHT_FOR_GRAD.format(**sizes))\n    check(channels",
        'lambda: WEIGHT_FOR_GRAD.format(grad_size=sizes["weight_size"], weight_size=sizes["grad_size"]))\n    check(channels'),
    Bug("involution_backward_weight-backward", INVOLUTION, "d_grad_output = involution(input, upstream,",
        "d_grad_output = 2 * involution(input, upstream,"),
    Bug("involution_backward_weight-fake", INVOLUTION, "(n, groups, *kernel_size, out_h, out_w))",
        "(n, groups, *kernel_size, out_w, out_h))"),
    Bug("involution_backward_weight-vmap", INVOLUTION, "_fold_batch(info, in_dims[:2], (grad_output, input))",
        f"_fold_batch(info, {ZEROED.format('[:2]')}, (grad_output, input))"),
    Bug("involution_backward_weight-jvp", INVOLUTION, "involution_backward_weight(grad_output, input_dot,",
        "involution_backward_weight(grad_output, 2 * input_dot,"),
    Bug("involution_backward_weight-error", INVOLUTION, "got=list(grad_output.shape), input_size=list(input.shape)",
        "got=list(input.shape), input_size=list(grad_output.shape)"),
]


def _selection(bug: Bug) -> str:
    """The -k expression of the planted op's tests: their ids hold "<op>-cpu" or "[<op>]"."""
    op = bug.name.rsplit("-", 1)[0]
    return f"{op}-cpu or [{op}]"


def run(bug: Bug) -> tuple[bool, str, float]:
    """(caught, first failing test, seconds) for ``bug``, planted alone."""
    path = ROOT / bug.path
    original = path.read_text()
    if original.count(bug.old) != 1:
        raise SystemExit(f"{bug.name}: the text to replace occurs {original.count(bug.old)} times in {bug.path}")
    path.write_text(original.replace(bug.old, bug.new))
    start = time.perf_counter()
    try:
        result = subprocess.run(
            ["make", "test", f"PYTEST_ARGS=-x -q -p no:cacheprovider {FILES} -k '{_selection(bug)}'"],
            cwd=ROOT, capture_output=True, text=True,
        )
    finally:
        path.write_text(original)
    failed = re.findall(r"^FAILED (\S+)", result.stdout, re.MULTILINE)
    summary = result.stdout.strip().splitlines()[-1] if result.stdout.strip() else "no output"
    return result.returncode != 0, failed[0] if failed else summary, time.perf_counter() - start


def main(names: list[str]) -> int:
    bugs = [b for b in BUGS if not names or b.name in names]
    missed = 0
    print("| planted bug | caught by make test | first failing test | s |\n|---|---|---|---:|")
    for bug in bugs:
        caught, first, seconds = run(bug)
        missed += not caught
        print(f"| {bug.name} | {'yes' if caught else 'NO'} | `{first}` | {seconds:.0f} |", flush=True)
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
