"""Direct calls (``oplib.ops._common.DIRECT_CALLS``): where an eager call's next stop below
oplib's autocast or autograd kernel is a kernel oplib registered in Python, the layer calls it
itself instead of going back through the dispatcher. Proven on a test op registered exactly as
oplib registers its CUDA kernels (``register_device_kernel``), here on the CPU key so that this
machine runs it: the same results, gradients and graph as through the dispatcher, the kernel
reached without a redispatch, and every mode, tracer and transform that stands between still
seeing the call (a direct call past them would be a silent wrong result)."""

from __future__ import annotations

import inspect
from contextlib import contextmanager

import pytest
import torch
from oplib._torch_private import DispatchKey, FakeTensorMode, TorchDispatchMode
from oplib.ops import _common
from oplib.ops._bilinear import register_bilinear
from oplib.ops._common import AUTOGRAD_KERNELS, DIRECT_KERNELS, register_autocast_policy, register_device_kernel
from oplib.ops._rules import CUDA_KERNELS

QUALNAME = "oplib_direct_test::scaled_product"
# (how the kernel was reached, the dtypes it saw) per call
CALLS: list[tuple[bool, tuple]] = []
# per call, the op entries above the kernel (``_op_entries``)
ENTRIES: list[int] = []


def _reached_directly() -> bool:
    """Whether the running kernel was called by oplib's autograd kernel itself (a direct call)
    rather than by the dispatcher (OpOverload.redispatch's frame between the two, or no
    autograd kernel above it: inference_mode skips autograd)."""
    for frame in inspect.stack()[2:]:
        if frame.function == "redispatch":
            return False
        if frame.filename.endswith("_transforms.py"):
            return True
    return False


def _op_entries() -> int:
    """How many times the running call entered an op from Python (OpOverload.__call__ frames):
    one for the call itself, one more where autocast's kernel called the op again."""
    return sum(frame.function == "__call__" and frame.filename.endswith("_ops.py") for frame in inspect.stack())


def _scaled_product_kernel(x: torch.Tensor, w: torch.Tensor, scale: list[float]) -> torch.Tensor:
    CALLS.append((_reached_directly(), (x.dtype, w.dtype)))
    ENTRIES.append(_op_entries())
    return x * w * scale[0]


def _cuda_only(x: torch.Tensor, w: torch.Tensor, scale: list[float]) -> torch.Tensor:
    return x * w * scale[0]


def _fake(x, w, scale):
    return torch.empty_like(x)


# out = x * w * scale: bilinear in (x, w), its kernel oplib-registered on CPU.
scaled_product = torch.library.custom_op(QUALNAME, _cuda_only, mutates_args=(), device_types="cuda",
                                         schema="(Tensor x, Tensor w, float[] scale) -> Tensor")
scaled_product.register_fake(_fake)
register_device_kernel(QUALNAME, "cpu", _scaled_product_kernel)
register_bilinear(scaled_product, lambda u, w, xs, ws, p: scaled_product(u, w, *p),
                  lambda u, x, xs, ws, p: scaled_product(u, x, *p))
register_autocast_policy(QUALNAME, "cpu", "lower_precision")
OP = torch.ops.oplib_direct_test.scaled_product.default


@contextmanager
def direct_calls(enabled: bool):
    saved = _common.DIRECT_CALLS
    _common.DIRECT_CALLS = enabled
    try:
        yield
    finally:
        _common.DIRECT_CALLS = saved


def _operands(dtype=torch.float64, requires_grad=True):
    """x, w (leaves) and an output gradient u, (3, 5) each."""
    generator = torch.Generator().manual_seed(0)
    x, w, u = (torch.randn(3, 5, generator=generator, dtype=dtype) for _ in range(3))
    return x.requires_grad_(requires_grad), w.requires_grad_(requires_grad), u


def _run(enabled: bool, dtype=torch.float64, autocast: bool = False, create_graph: bool = False):
    """The op's output, its grad_fn's name, the gradients of x and w (and with ``create_graph``
    the gradient of their sum of squares again), and how each kernel call was reached."""
    CALLS.clear()
    x, w, u = _operands(dtype)
    with direct_calls(enabled), torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        out = OP(x, w, [2.0])
        gx, gw = torch.autograd.grad(out, (x, w), u.to(out.dtype), create_graph=create_graph)
        again = torch.autograd.grad((gx.square().sum() + gw.square().sum()), (x, w)) if create_graph else None
    return out, type(out.grad_fn).__name__, (gx, gw), again, list(CALLS)


def test_direct_kernels_are_the_registered_ones():
    """Each op with a CUDA kernel of oplib's (and the generator's, registered the same way) has
    its direct kernel on CUDA, and each op with a jvp its autograd kernel, in the tables; the CPU
    kernels stay custom_op's (its register_kernel("cpu") replaces them: the CUDA emulation tests
    route the CUDA kernels through it)."""
    for qualname in [*CUDA_KERNELS, "oplib::involution_generated_backward_generator"]:
        assert (qualname, DispatchKey.CUDA) in DIRECT_KERNELS, qualname
        assert qualname in AUTOGRAD_KERNELS, qualname
    assert not any(key == DispatchKey.CPU and qualname.startswith("oplib::") for qualname, key in DIRECT_KERNELS)
    assert (QUALNAME, DispatchKey.CPU) in DIRECT_KERNELS


@pytest.mark.parametrize("create_graph", [False, True])
def test_same_results_gradients_and_graph(create_graph):
    """Through the direct path and through the dispatcher: the same output, grad_fn name and
    gradients (twice over with create_graph), against the product rule."""
    direct, through = _run(True, create_graph=create_graph), _run(False, create_graph=create_graph)
    x, w, u = _operands()
    torch.testing.assert_close(direct[0], 2 * x * w, rtol=0, atol=0)
    torch.testing.assert_close(direct[2], (2 * u * w, 2 * u * x), rtol=0, atol=0)
    for ours, theirs in zip(direct[2:4], through[2:4]):
        torch.testing.assert_close(ours, theirs, rtol=0, atol=0)
    assert direct[1] == through[1] == "GeneratedBackwardFor_oplib_direct_test_scaled_product_defaultBackward"


def test_kernel_reached_directly_only_when_enabled():
    """Forward and both backward calls reach the kernel straight from oplib's autograd kernel
    with direct calls on, and through a redispatch with them off (which the check must see)."""
    assert [how for how, _ in _run(True)[4]] == [True, True, True]
    assert [how for how, _ in _run(False)[4]] == [False, False, False]
    CALLS.clear()
    x, w, _ = _operands(requires_grad=False)
    OP(x, w, [2.0])
    with torch.no_grad():
        OP(*_operands()[:2], [2.0])
    assert [how for how, _ in CALLS] == [True, True]


def test_autocast_direct_and_through_agree():
    """Under autocast float32 operands, cast, reach the autograd kernel directly (the op not
    entered a second time), then the kernel: in bfloat16, the output bfloat16, the gradients
    float32 as the leaves are, the same as through the dispatcher."""
    ENTRIES.clear()
    direct = _run(True, torch.float32, autocast=True)
    direct_entries = list(ENTRIES)
    ENTRIES.clear()
    through = _run(False, torch.float32, autocast=True)
    # the forward: autocast's kernel calls the autograd kernel itself, or enters the op again
    assert direct_entries[0] == 1 and ENTRIES[0] == 2, (direct_entries, ENTRIES)
    assert direct[0].dtype == torch.bfloat16
    assert direct[4][0] == (True, (torch.bfloat16, torch.bfloat16))
    assert all(how for how, _ in direct[4]) and not any(how for how, _ in through[4])
    torch.testing.assert_close(direct[0], through[0], rtol=0, atol=0)
    for ours, theirs in zip(direct[2], through[2]):
        assert ours.dtype == torch.float32
        torch.testing.assert_close(ours, theirs, rtol=0, atol=0)


class _Seen(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.ops = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.append(func)
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("requires_grad", [False, True])
def test_a_dispatch_mode_still_sees_the_call(requires_grad):
    """A TorchDispatchMode sorts above the kernel's key: the call must reach it (a direct call
    past it would hide the op from every mode, the tracers' included)."""
    x, w, _ = _operands(requires_grad=requires_grad)
    with _Seen() as seen:
        out = OP(x, w, [2.0])
    assert OP in seen.ops
    torch.testing.assert_close(out, 2 * x * w)


def test_fake_tensors_take_the_fake():
    """Under FakeTensorMode the fake kernel runs, never the CPU kernel on fake tensors."""
    CALLS.clear()
    with FakeTensorMode():
        x, w = torch.randn(3, 5, requires_grad=True), torch.randn(3, 5)
        out = OP(x, w, [2.0])
    assert type(out).__name__ == "FakeTensor" and not CALLS


def test_compiled_matches_eager():
    """torch.compile (aot_eager: AOTAutograd traces the op with fake tensors, then runs it)
    gives the eager output and gradients."""
    x, w, u = _operands()

    def f(x, w):
        return OP(x, w, [2.0]).sin()

    compiled = torch.compile(f, backend="aot_eager", fullgraph=True)
    out = compiled(x, w)
    expected = f(x, w)
    torch.testing.assert_close(out, expected)
    torch.testing.assert_close(torch.autograd.grad(out, (x, w), u), torch.autograd.grad(expected, (x, w), u))


def test_inference_mode_and_functional_transforms():
    """inference_mode (autograd keys excluded) and torch.func.grad / vmap (functorch's own
    kernel) give the plain results."""
    x, w, _ = _operands(requires_grad=False)
    with torch.inference_mode():
        torch.testing.assert_close(OP(x, w, [2.0]), 2 * x * w)
    grad_x = torch.func.grad(lambda x: OP(x, w, [2.0]).sum())(x)
    torch.testing.assert_close(grad_x, 2 * w)
    torch.testing.assert_close(torch.vmap(lambda a, b: OP(a, b, [2.0]))(x, w), 2 * x * w)


def test_jit_trace_under_autocast_records_the_op():
    """torch.jit.trace's key sorts between autocast's and autograd's: an autocast call must go
    back through the dispatcher so that the trace records the op (a direct call to the autograd
    kernel would record the kernel's own ops instead)."""
    x, w, _ = _operands(torch.float32, requires_grad=False)

    def f(x, w):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return OP(x, w, [2.0])

    graph = str(torch.jit.trace(f, (x, w)).graph)
    assert QUALNAME in graph and "aten::mul" not in graph, graph


@pytest.mark.needs_cuda
@pytest.mark.parametrize("autocast", [False, True])
def test_involution_on_a_gpu_direct_and_through_agree(autocast):
    """On a GPU: involution's output and gradients (bfloat16 under autocast, float32 without)
    the same bits with direct calls and through the dispatcher."""
    generator = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(2, 16, 9, 9, device="cuda", generator=generator)
    w = torch.randn(2, 1, 3, 3, 9, 9, device="cuda", generator=generator)
    u = torch.randn(2, 16, 9, 9, device="cuda", generator=generator)
    results = []
    for enabled in (True, False):
        leaves = (x.clone().requires_grad_(), w.clone().requires_grad_())
        with direct_calls(enabled), torch.autocast("cuda", dtype=torch.bfloat16, enabled=autocast):
            out = torch.ops.oplib.involution(*leaves, [1, 1], [1, 1], [1, 1])
            grads = torch.autograd.grad(out, leaves, u.to(out.dtype))
        results.append((out, *grads))
    assert results[0][0].dtype == (torch.bfloat16 if autocast else torch.float32)
    for ours, theirs in zip(*results):
        torch.testing.assert_close(ours, theirs, rtol=0, atol=0)


def test_a_kernel_registered_over_oplibs_is_the_one_that_runs():
    """torch.library.register_kernel over a kernel oplib registered: the dispatcher runs the new
    kernel, and so must every call (a direct call to the old one would be a silent wrong result),
    with a gradient or without."""
    qualname = "oplib_direct_test::overridden_product"
    product = torch.library.custom_op(qualname, _cuda_only, mutates_args=(), device_types="cuda",
                                      schema="(Tensor x, Tensor w, float[] scale) -> Tensor")
    product.register_fake(_fake)
    register_device_kernel(qualname, "cpu", _scaled_product_kernel)
    register_bilinear(product, lambda u, w, xs, ws, p: product(u, w, *p), lambda u, x, xs, ws, p: product(u, x, *p))
    op = torch.ops.oplib_direct_test.overridden_product.default
    x, w, _ = _operands()
    torch.testing.assert_close(op(x, w, [2.0]), 2 * x * w)
    torch.library.register_kernel(qualname, "cpu", lambda x, w, scale: x * w * scale[0] + 1)
    torch.testing.assert_close(op(x, w, [2.0]), 2 * x * w + 1)
    with torch.no_grad():
        torch.testing.assert_close(op(x, w, [2.0]), 2 * x * w + 1)
