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
    # The -k expression of the tests to run; by default the planted op's (see _selection).
    selection: str = ""


ZEROED = "[None if d is None else 0 for d in in_dims{}]"
EXP, LINEAR, CONV2D, INVOLUTION, GENERATED = (
    f"oplib/ops/{op}.py" for op in ("exp", "linear", "conv2d", "involution", "involution_generated"))
# The pieces the involution ops share: their derivative, vmap and jvp rules (_bilinear.py: one
# body, so one planted bug reaches all three ops) and their fake and argument rules (_rules.py).
BILINEAR, RULES = "oplib/ops/_bilinear.py", "oplib/ops/_rules.py"
INVOLUTION_OPS = "involution-cpu or involution_backward_input-cpu or involution_backward_weight-cpu"

BUGS = [
    Bug("exp-backward", EXP, "    return grad * y\n", "    return 2 * grad * y\n"),
    Bug("exp-fake", EXP, "    _EXP_RULES.enforce(x)\n    return torch.empty_like(x)",
        "    _EXP_RULES.enforce(x)\n    return torch.empty(x.shape, dtype=x.dtype, device=x.device)"),
    Bug("exp-vmap", EXP, "return exp(x), in_dims[0]", "return exp(x), 0"),
    Bug("exp-jvp", EXP, "return x_dot * output  #", "return 2 * x_dot * output  #"),
    Bug("exp-error", EXP, 'tensor_rules("exp", (0, "x",', 'tensor_rules("exp", (0, "input",'),
    Bug("linear-backward", LINEAR, "grad_input = grad @ weight", "grad_input = 2 * grad @ weight"),
    Bug("linear-fake", LINEAR, "new_empty((*input.shape[:-1], weight.shape[0]))",
        "new_empty((*input.shape[:-1], weight.shape[1]))"),
    Bug("linear-vmap", LINEAR, "bias_dim = in_dims\n", f"bias_dim = {ZEROED.format('')}\n"),
    Bug("linear-jvp", LINEAR, "linear(input, weight_dot, None)", "linear(input, 2 * weight_dot, None)"),
    Bug("linear-error", LINEAR, "IN_FEATURES.format(input_size=list(x.shape), weight_size=list(w.shape))",
        "IN_FEATURES.format(input_size=list(w.shape), weight_size=list(x.shape))"),
    Bug("conv2d-backward", CONV2D, "return grad_input, grad_weight, grad_bias, None",
        "return grad_input, grad_weight, None if grad_bias is None else 2 * grad_bias, None"),
    Bug("conv2d-fake", CONV2D, "device=input.device, memory_format=_output_memory_format(input, weight)",
        "device=input.device, memory_format=torch.contiguous_format"),
    Bug("conv2d-vmap", CONV2D, "bias_dim = in_dims[:3]", f"bias_dim = {ZEROED.format('[:3]')}"),
    Bug("conv2d-jvp", CONV2D, "bias_dot = bias_dot[:, None, None]", "bias_dot = 2 * bias_dot[:, None, None]"),
    Bug("conv2d-error", CONV2D, "OUT_CHANNELS_DIVISIBLE.format(out_channels=w.shape[0], groups=a[-1])",
        "OUT_CHANNELS_DIVISIBLE.format(out_channels=a[-1], groups=w.shape[0])"),
    # The shared rules of the involution ops.
    Bug("bilinear-saved", BILINEAR, "(first if needs_second else None, second if needs_first else None)",
        "(first if needs_first else None, second if needs_second else None)", INVOLUTION_OPS),
    Bug("bilinear-vmap", BILINEAR, "fold_batch(info, in_dims[:2], (first, second))",
        f"fold_batch(info, {ZEROED.format('[:2]')}, (first, second))", INVOLUTION_OPS),
    Bug("bilinear-jvp", BILINEAR, "op(first, second_dot, *params)", "op(first, 2 * second_dot, *params)",
        INVOLUTION_OPS),
    Bug("contract-fake", RULES, "        self.rules.enforce(*args)\n        return self.result(*args)",
        "        self.rules.enforce(*args)\n        return self.result(*args).contiguous()", INVOLUTION_OPS),
    Bug("rules-signature", RULES, "key.append((arg.shape, arg.dtype, arg.device))",
        "key.append((arg.shape, arg.device))", f"{INVOLUTION_OPS} or remember"),
    # Each row of involution.py's table of derivatives, each op's result and one message of each.
    Bug("involution-backward", INVOLUTION, "x_shape, w_shape, p: involution_backward_input(u, w,",
        "x_shape, w_shape, p: 2 * involution_backward_input(u, w,"),
    Bug("involution-result", INVOLUTION, "result_like(input, weight.shape[4:])",
        "result_like(input, weight.shape[4:][::-1])"),
    Bug("involution-error", INVOLUTION, "w.shape[0] == x.shape[0], lambda *a: BATCH.format(**_sizes(*a))",
        "w.shape[0] == x.shape[0], lambda x, w, *_: BATCH.format(**_sizes(w, x))"),
    Bug("involution_backward_input-backward", INVOLUTION, "g_shape, w_shape, p: involution(u, w, *p[1:])",
        "g_shape, w_shape, p: 2 * involution(u, w, *p[1:])"),
    Bug("involution_backward_input-result", INVOLUTION, "size, *__: result_like(grad, size)",
        "size, *__: result_like(grad, size[::-1])"),
    Bug("involution_backward_input-error", INVOLUTION, "input_size=list(size), **_grad_sizes(g, w))",
        "input_size=list(g.shape[2:]), **_grad_sizes(g, w))"),
    Bug("involution_backward_weight-backward", INVOLUTION, "g_shape, x_shape, p: involution(x, u, *p[1:4])",
        "g_shape, x_shape, p: 2 * involution(x, u, *p[1:4])"),
    Bug("involution_backward_weight-result", INVOLUTION, "(n, groups, *kernel_size, out_h, out_w)",
        "(n, groups, *kernel_size, out_w, out_h)"),
    Bug("involution_backward_weight-error", INVOLUTION, "got=list(g.shape),\n             input_size=list(x.shape)",
        "got=list(x.shape),\n             input_size=list(g.shape)"),
    Bug("involution_generated-backward", GENERATED, "input_shape, p: involution_generated_backward_input(u,",
        "input_shape, p: 2 * involution_generated_backward_input(u,"),
    Bug("involution_generated-generator", GENERATED, "return tuple(g if need else None for g, need in zip(grads, needs))",
        "return tuple(2 * g if need else None for g, need in zip(grads, needs))"),
    Bug("involution_generated-vmap", GENERATED, "weight = weight + spans[1][:, None, :, None, None]",
        "weight = weight + spans[1][:1, None, :, None, None]"),
    Bug("involution_generated-jvp", GENERATED, "op(activation, feature_dot, span_weight, None)",
        "op(activation, feature_dot, span_weight, span_bias)"),
    Bug("involution_generated_backward_input-backward", GENERATED,
        "grad_shape, p: involution_generated(u,", "grad_shape, p: 2 * involution_generated(u,"),
    Bug("involution_generated_backward_input-generator", GENERATED,
        "lambda u, grad_output: (grad_output, u)", "lambda u, grad_output: (u, grad_output)"),
    Bug("involution_generated_backward_generator-backward", GENERATED,
        "d_u = involution_generated(x, f2, s2, grad_bias_up, *params)", "d_u = involution_generated(x, f2, s2, None, *params)"),
    Bug("involution_generated_backward_generator-vmap", GENERATED,
        'grad_span = torch.einsum("bnkp,bnrp->bkr", gw, f_flat)', 'grad_span = torch.einsum("bnkp,bnrp->bkr", gw, f_flat.flip(0))'),
    Bug("involution_generated_backward_generator-native", "oplib/kernels/involution/csrc/cpu/backward_generator.cpp",
        "for (int64_t p = 0; p < pixels; ++p) total += gw[t * columns + p];",
        "for (int64_t p = 1; p < pixels; ++p) total += gw[t * columns + p];"),
    Bug("involution_generated_backward_generator-jvp", GENERATED,
        "terms.append((by_f, by_s, torch.zeros_like(bias)))", "terms.append((by_f, by_s, bias))"),
]


def _selection(bug: Bug) -> str:
    """The -k expression of the planted op's tests: their ids hold "<op>-cpu" or "[<op>]"."""
    if bug.selection:
        return bug.selection
    op = bug.name.rsplit("-", 1)[0]
    return f"{op}-cpu or [{op}]"


def check_bug_texts() -> list[str]:
    """The bugs whose text to replace does not occur exactly once in their file (stale after an
    edit of the op): tests/project/ holds the list empty, so no bug silently stops planting."""
    return [f"{bug.name}: {bug.path} holds the text {(ROOT / bug.path).read_text().count(bug.old)} times"
            for bug in BUGS if (ROOT / bug.path).read_text().count(bug.old) != 1]


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
