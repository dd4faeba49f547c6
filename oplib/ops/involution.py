"""Involution (Li et al., CVPR 2021) and its two backward ops.

    out[n, c, i, j] = sum_{a < KH, b < KW} weight[n, c // (C/G), a, b, i, j]
                      * input[n, c, i*sh - ph + a*dh, j*sw - pw + b*dw]     (0 outside the image)

input: (N, C, H, W); weight: (N, G, KH, KW, Ho, Wo), the layout of the paper's code, so the
output (N, G*KH*KW, Ho, Wo) of a kernel-generating conv views into it.

Involution is bilinear in (input, weight), so every derivative of the three ops here is
again one of them:

    involution(x, w)               d/dx: backward_input(g, w)     d/dw: backward_weight(g, x)
    backward_input(g, w)  (-> dx)  d/dg: involution(u, w)         d/dw: backward_weight(g, u)
    backward_weight(g, x) (-> dw)  d/dg: involution(x, u)         d/dx: backward_input(g, u)

(u is the incoming gradient). Each op registers that rule, so derivatives of any order
work in eager mode.

CPU kernels are plain PyTorch, in ``oplib.kernels.involution_cpu`` (its docstring describes
the strategies). CUDA kernels live in ``oplib/kernels/involution.cu`` and run through
``oplib.kernels.CuPyLauncher``.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor
from torch.utils.flop_counter import register_flop_formula

from ..kernels import Launcher, cuda_dispatch, cupy_launcher, involution_cpu, launch_elementwise, load_source
from ._common import (
    CHANNELS_DIVISIBLE,
    GROUPS_POSITIVE,
    argument_predicate,
    check,
    check_value,
    check_dim,
    check_floating,
    check_same_dtype_and_device,
    check_window_fits,
    check_window_params,
    register_autocast_policy,
    window_fits,
    window_output_size,
    window_params_valid,
)
from ._transforms import register_jvp, sum_tangents

# ---------------------------------------------------------------------------------------
# Argument checks shared by the kernels and the fakes
# ---------------------------------------------------------------------------------------


# The layouts the dimension checks name.
INPUT_LAYOUT = "4-D (N, C, H, W)"
WEIGHT_LAYOUT = "6-D (N, G, KH, KW, Ho, Wo)"
GRAD_OUTPUT_LAYOUT = "4-D (N, C, Ho, Wo)"

KERNEL_SIZE = "oplib.{op}: expected weight's kernel size (KH, KW) to be positive, got weight of size {weight_size}"
BATCH = (
    "oplib.involution: expected weight's batch size to equal input's, "
    "got input of size {input_size} and weight of size {weight_size}"
)
NO_GROUPS = "oplib.involution: expected at least one group, got weight of size {weight_size}"
GROUPS_DIVIDE = (
    "oplib.involution: expected input channels ({channels}) to be divisible by the groups of weight ({groups}), "
    "got input of size {input_size} and weight of size {weight_size}"
)
OUTPUT_SIZE = (
    "oplib.involution: expected weight's output size (Ho, Wo) to be {expected}, the output size of input "
    "{input_size} with kernel {kernel}, stride {stride}, padding {padding}, dilation {dilation}; got {got}"
)
INPUT_SIZE_PAIR = "oplib.involution_backward_input: expected input_size to be (H, W), got {input_size}"
WEIGHT_FOR_GRAD = (
    "oplib.involution_backward_input: expected weight (N, G, ...) with the batch size of grad_output and G "
    "dividing its channels, got grad_output of size {grad_size} and weight of size {weight_size}"
)
OUTPUT_SIZE_OF_INPUT = (
    "oplib.involution_backward_input: expected grad_output and weight to have the output size {expected} of "
    "input size {input_size}, got grad_output of size {grad_size} and weight of size {weight_size}"
)
KERNEL_SIZE_PAIR = "oplib.involution_backward_weight: expected kernel_size to be a positive (KH, KW), got {kernel_size}"
GRAD_OUTPUT_SIZE = "oplib.involution_backward_weight: expected grad_output of size {expected}, got {got} (input of size {input_size})"


def _check_output_size(op, size, kernel_size, stride, padding, dilation) -> tuple:
    """Check that the window fits the padded input; return the output size (Ho, Wo)."""
    check_window_fits(op, size, kernel_size, padding, dilation)
    return window_output_size(size, kernel_size, stride, padding, dilation)


def _check_kernel_size(op: str, weight: Tensor) -> None:
    """The kernel dims (KH, KW) of a (N, G, KH, KW, Ho, Wo) weight must be positive."""
    check(
        (weight.shape[2] > 0) & (weight.shape[3] > 0),
        lambda: KERNEL_SIZE.format(op=op, weight_size=list(weight.shape)),
    )


def _check_involution_args(input: Tensor, weight: Tensor, stride, padding, dilation) -> None:
    check_dim("involution", "input", input, (4,), INPUT_LAYOUT)
    check_dim("involution", "weight", weight, (6,), WEIGHT_LAYOUT)
    check_floating("involution", "input", input)
    check_same_dtype_and_device("involution", "input", input, weight=weight)
    check_window_params("involution", stride, padding, dilation)
    n, channels, height, width = input.shape
    groups = weight.shape[1]
    sizes = dict(input_size=list(input.shape), weight_size=list(weight.shape))
    check(weight.shape[0] == n, lambda: BATCH.format(**sizes))
    check(groups > 0, lambda: NO_GROUPS.format(**sizes))
    _check_kernel_size("involution", weight)
    check(channels % groups == 0, lambda: GROUPS_DIVIDE.format(channels=channels, groups=groups, **sizes))
    out_h, out_w = _check_output_size("involution", (height, width), weight.shape[2:4], stride, padding, dilation)
    check(
        (weight.shape[4] == out_h) & (weight.shape[5] == out_w),
        lambda: OUTPUT_SIZE.format(
            expected=(out_h, out_w),
            input_size=list(input.shape),
            kernel=list(weight.shape[2:4]),
            stride=list(stride),
            padding=list(padding),
            dilation=list(dilation),
            got=(weight.shape[4], weight.shape[5]),
        ),
    )


def _check_backward_input_args(grad_output, weight, input_size, stride, padding, dilation) -> None:
    op = "involution_backward_input"
    check_dim(op, "grad_output", grad_output, (4,), GRAD_OUTPUT_LAYOUT)
    check_dim(op, "weight", weight, (6,), WEIGHT_LAYOUT)
    check_floating(op, "grad_output", grad_output)
    check_same_dtype_and_device(op, "grad_output", grad_output, weight=weight)
    check_window_params(op, stride, padding, dilation)
    check_value(len(input_size) == 2, lambda: INPUT_SIZE_PAIR.format(input_size=list(input_size)))
    n, channels, out_h, out_w = grad_output.shape
    groups = weight.shape[1]
    sizes = dict(grad_size=list(grad_output.shape), weight_size=list(weight.shape))
    check((weight.shape[0] == n) & (groups > 0), lambda: WEIGHT_FOR_GRAD.format(**sizes))
    check(channels % groups == 0, lambda: WEIGHT_FOR_GRAD.format(**sizes))
    _check_kernel_size(op, weight)
    expected = _check_output_size(op, input_size, weight.shape[2:4], stride, padding, dilation)
    check(
        (weight.shape[4] == out_h) & (weight.shape[5] == out_w) & (expected[0] == out_h) & (expected[1] == out_w),
        lambda: OUTPUT_SIZE_OF_INPUT.format(expected=list(expected), input_size=list(input_size), **sizes),
    )


def _check_backward_weight_args(grad_output, input, kernel_size, stride, padding, dilation, groups) -> None:
    op = "involution_backward_weight"
    check_dim(op, "grad_output", grad_output, (4,), GRAD_OUTPUT_LAYOUT)
    check_dim(op, "input", input, (4,), INPUT_LAYOUT)
    check_floating(op, "grad_output", grad_output)
    check_same_dtype_and_device(op, "grad_output", grad_output, input=input)
    check_window_params(op, stride, padding, dilation)
    check_value(
        len(kernel_size) == 2 and kernel_size[0] > 0 and kernel_size[1] > 0,
        lambda: KERNEL_SIZE_PAIR.format(kernel_size=list(kernel_size)),
    )
    check_value(groups > 0, lambda: GROUPS_POSITIVE.format(op=op, groups=groups))
    n, channels, height, width = input.shape
    check(channels % groups == 0, lambda: CHANNELS_DIVISIBLE.format(op=op, channels=channels, groups=groups))
    expected = _check_output_size(op, (height, width), kernel_size, stride, padding, dilation)
    check(
        (grad_output.shape[0] == n)
        & (grad_output.shape[1] == channels)
        & (grad_output.shape[2] == expected[0])
        & (grad_output.shape[3] == expected[1]),
        lambda: GRAD_OUTPUT_SIZE.format(
            expected=[n, channels, *expected], got=list(grad_output.shape), input_size=list(input.shape)
        ),
    )


# ---------------------------------------------------------------------------------------
# CUDA dispatch: output allocation, argument order and launch, through a launcher
# (CuPy on a GPU; the host emulation of oplib.testing in the tests)
# ---------------------------------------------------------------------------------------

_SOURCE = "involution.cu"


def _kernel_args(channels, height, width, weight_shape, stride, padding, dilation) -> tuple:
    """The kernels' shared trailing arguments, in their order."""
    _, groups, kh, kw, out_h, out_w = weight_shape
    return (channels, height, width, groups, kh, kw, out_h, out_w, *stride, *padding, *dilation)


# Eager fast paths of the three checks above (see ARGUMENT_PREDICATES in _common.py).


def _operands_valid(first: Tensor, first_dims: int, second: Tensor, second_dims: int, stride, padding, dilation) -> bool:
    """The checks every involution op starts with: the operands' dims, a floating dtype shared
    by both, one device, and the window parameters."""
    return (
        first.dim() == first_dims
        and second.dim() == second_dims
        and first.is_floating_point()
        and second.dtype == first.dtype
        and second.device == first.device
        and window_params_valid(stride, padding, dilation)
    )


@argument_predicate("oplib::involution")
def _involution_args_valid(input: Tensor, weight: Tensor, stride, padding, dilation) -> bool:
    if not _operands_valid(input, 4, weight, 6, stride, padding, dilation):
        return False
    n, channels, height, width = input.shape
    weight_n, groups, kernel_h, kernel_w, out_h, out_w = weight.shape
    size, kernel = (height, width), (kernel_h, kernel_w)
    return (
        weight_n == n
        and groups > 0
        and kernel_h > 0
        and kernel_w > 0
        and channels % groups == 0
        and window_fits(size, kernel, padding, dilation)
        and window_output_size(size, kernel, stride, padding, dilation) == (out_h, out_w)
    )


@argument_predicate("oplib::involution_backward_input")
def _backward_input_args_valid(grad_output, weight, input_size, stride, padding, dilation) -> bool:
    if not (_operands_valid(grad_output, 4, weight, 6, stride, padding, dilation) and len(input_size) == 2):
        return False
    n, channels, out_h, out_w = grad_output.shape
    weight_n, groups, kernel_h, kernel_w, weight_h, weight_w = weight.shape
    kernel = (kernel_h, kernel_w)
    return (
        weight_n == n
        and groups > 0
        and channels % groups == 0
        and kernel_h > 0
        and kernel_w > 0
        and window_fits(input_size, kernel, padding, dilation)
        and (weight_h, weight_w) == (out_h, out_w)
        and window_output_size(input_size, kernel, stride, padding, dilation) == (out_h, out_w)
    )


@argument_predicate("oplib::involution_backward_weight")
def _backward_weight_args_valid(grad_output, input, kernel_size, stride, padding, dilation, groups) -> bool:
    if not (
        _operands_valid(grad_output, 4, input, 4, stride, padding, dilation)
        and len(kernel_size) == 2
        and kernel_size[0] > 0
        and kernel_size[1] > 0
        and groups > 0
    ):
        return False
    n, channels, height, width = input.shape
    size = (height, width)
    return (
        channels % groups == 0
        and window_fits(size, kernel_size, padding, dilation)
        and tuple(grad_output.shape) == (n, channels, *window_output_size(size, kernel_size, stride, padding, dilation))
    )


@cuda_dispatch("oplib::involution", _SOURCE, ["involution_forward"])
def launch_involution(input: Tensor, weight: Tensor, stride, padding, dilation, launcher: Launcher) -> Tensor:
    """input: (N, C, H, W), weight: (N, G, KH, KW, Ho, Wo) -> (N, C, Ho, Wo) by the
    ``involution_forward`` kernel. Strided inputs are made contiguous first."""
    input, weight = input.contiguous(), weight.contiguous()
    n, channels, height, width = input.shape
    out = input.new_empty((n, channels, weight.shape[4], weight.shape[5]))
    args = _kernel_args(channels, height, width, weight.shape, stride, padding, dilation)
    launch_elementwise(launcher, load_source(_SOURCE), "involution_forward", out, (input, weight, out, out.numel(), *args))
    return out


@cuda_dispatch("oplib::involution_backward_input", _SOURCE, ["involution_backward_input"])
def launch_involution_backward_input(
    grad_output: Tensor, weight: Tensor, input_size, stride, padding, dilation, launcher: Launcher
) -> Tensor:
    """grad_output: (N, C, Ho, Wo), weight: (N, G, KH, KW, Ho, Wo) -> grad_input: (N, C, H, W)."""
    grad_output, weight = grad_output.contiguous(), weight.contiguous()
    n, channels = grad_output.shape[:2]
    grad_input = grad_output.new_empty((n, channels, *input_size))
    args = _kernel_args(channels, *input_size, weight.shape, stride, padding, dilation)
    launch_elementwise(
        launcher,
        load_source(_SOURCE),
        "involution_backward_input",
        grad_input,
        (grad_output, weight, grad_input, grad_input.numel(), *args),
    )
    return grad_input


@cuda_dispatch("oplib::involution_backward_weight", _SOURCE, ["involution_backward_weight"])
def launch_involution_backward_weight(
    grad_output: Tensor, input: Tensor, kernel_size, stride, padding, dilation, groups: int, launcher: Launcher
) -> Tensor:
    """grad_output: (N, C, Ho, Wo), input: (N, C, H, W) -> grad_weight: (N, G, KH, KW, Ho, Wo)."""
    grad_output, input = grad_output.contiguous(), input.contiguous()
    n, channels, height, width = input.shape
    grad_weight = input.new_empty((n, groups, *kernel_size, *grad_output.shape[2:]))
    args = _kernel_args(channels, height, width, grad_weight.shape, stride, padding, dilation)
    launch_elementwise(
        launcher,
        load_source(_SOURCE),
        "involution_backward_weight",
        grad_weight,
        (grad_output, input, grad_weight, grad_weight.numel(), *args),
    )
    return grad_weight


# ---------------------------------------------------------------------------------------
# The three custom ops
# ---------------------------------------------------------------------------------------


def _involution_kernel(
    input: Tensor, weight: Tensor, stride: list[int], padding: list[int], dilation: list[int]
) -> Tensor:
    """input: (N, C, H, W), weight: (N, G, KH, KW, Ho, Wo) -> (N, C, Ho, Wo), contiguous."""
    if not _involution_args_valid(input, weight, stride, padding, dilation):
        _check_involution_args(input, weight, stride, padding, dilation)
    return involution_cpu.involution(input, weight, stride, padding, dilation)


# The default kernel (CPU); CUDA registers its own below.
involution = torch.library.custom_op("oplib::involution", _involution_kernel, mutates_args=())


@involution.register_fake
def _involution_fake(input, weight, stride, padding, dilation) -> Tensor:
    _check_involution_args(input, weight, stride, padding, dilation)
    return input.new_empty((input.shape[0], input.shape[1], weight.shape[4], weight.shape[5]))


def _involution_backward_input_kernel(
    grad_output: Tensor,
    weight: Tensor,
    input_size: list[int],
    stride: list[int],
    padding: list[int],
    dilation: list[int],
) -> Tensor:
    """grad_output: (N, C, Ho, Wo), weight: (N, G, KH, KW, Ho, Wo), input_size: (H, W)
    -> grad_input: (N, C, H, W)."""
    if not _backward_input_args_valid(grad_output, weight, input_size, stride, padding, dilation):
        _check_backward_input_args(grad_output, weight, input_size, stride, padding, dilation)
    return involution_cpu.involution_backward_input(grad_output, weight, input_size, stride, padding, dilation)


# The default kernel (CPU); CUDA registers its own below.
involution_backward_input = torch.library.custom_op(
    "oplib::involution_backward_input", _involution_backward_input_kernel, mutates_args=()
)


@involution_backward_input.register_fake
def _involution_backward_input_fake(grad_output, weight, input_size, stride, padding, dilation) -> Tensor:
    _check_backward_input_args(grad_output, weight, input_size, stride, padding, dilation)
    return grad_output.new_empty((grad_output.shape[0], grad_output.shape[1], *input_size))


def _involution_backward_weight_kernel(
    grad_output: Tensor,
    input: Tensor,
    kernel_size: list[int],
    stride: list[int],
    padding: list[int],
    dilation: list[int],
    groups: int,
) -> Tensor:
    """grad_output: (N, C, Ho, Wo), input: (N, C, H, W) -> grad_weight: (N, G, KH, KW, Ho, Wo)."""
    if not _backward_weight_args_valid(grad_output, input, kernel_size, stride, padding, dilation, groups):
        _check_backward_weight_args(grad_output, input, kernel_size, stride, padding, dilation, groups)
    return involution_cpu.involution_backward_weight(
        grad_output, input, kernel_size, stride, padding, dilation, groups
    )


# The default kernel (CPU); CUDA registers its own below.
involution_backward_weight = torch.library.custom_op(
    "oplib::involution_backward_weight", _involution_backward_weight_kernel, mutates_args=()
)


@involution_backward_weight.register_fake
def _involution_backward_weight_fake(grad_output, input, kernel_size, stride, padding, dilation, groups) -> Tensor:
    _check_backward_weight_args(grad_output, input, kernel_size, stride, padding, dilation, groups)
    n, _, out_h, out_w = grad_output.shape
    return grad_output.new_empty((n, groups, *kernel_size, out_h, out_w))


@involution.register_kernel("cuda")
def _involution_cuda(input, weight, stride, padding, dilation) -> Tensor:
    if not _involution_args_valid(input, weight, stride, padding, dilation):
        _check_involution_args(input, weight, stride, padding, dilation)
    return launch_involution(input, weight, stride, padding, dilation, cupy_launcher())


@involution_backward_input.register_kernel("cuda")
def _involution_backward_input_cuda(grad_output, weight, input_size, stride, padding, dilation) -> Tensor:
    if not _backward_input_args_valid(grad_output, weight, input_size, stride, padding, dilation):
        _check_backward_input_args(grad_output, weight, input_size, stride, padding, dilation)
    return launch_involution_backward_input(grad_output, weight, input_size, stride, padding, dilation, cupy_launcher())


@involution_backward_weight.register_kernel("cuda")
def _involution_backward_weight_cuda(grad_output, input, kernel_size, stride, padding, dilation, groups) -> Tensor:
    if not _backward_weight_args_valid(grad_output, input, kernel_size, stride, padding, dilation, groups):
        _check_backward_weight_args(grad_output, input, kernel_size, stride, padding, dilation, groups)
    return launch_involution_backward_weight(
        grad_output, input, kernel_size, stride, padding, dilation, groups, cupy_launcher()
    )


# ---------------------------------------------------------------------------------------
# Autograd: the bilinear rules of the module docstring
# ---------------------------------------------------------------------------------------


def _save_operands(ctx, first: Tensor, second: Tensor, params: tuple) -> None:
    """Save the first operand only if the second needs a gradient and vice versa: the
    derivative with respect to one operand of a bilinear op needs only the other."""
    needs_first, needs_second = ctx.needs_input_grad[:2]
    ctx.save_for_backward(first if needs_second else None, second if needs_first else None)
    ctx.shapes = (first.shape, second.shape)
    ctx.params = params


def _involution_setup_context(ctx, inputs, output) -> None:
    input, weight, stride, padding, dilation = inputs
    _save_operands(ctx, input, weight, (stride, padding, dilation))


def _involution_backward(ctx, grad: Tensor):
    input, weight = ctx.saved_tensors
    (input_shape, weight_shape), (stride, padding, dilation) = ctx.shapes, ctx.params
    grad_input = grad_weight = None
    if ctx.needs_input_grad[0]:
        grad_input = involution_backward_input(grad, weight, list(input_shape[2:]), stride, padding, dilation)
    if ctx.needs_input_grad[1]:
        grad_weight = involution_backward_weight(
            grad, input, list(weight_shape[2:4]), stride, padding, dilation, weight_shape[1]
        )
    return grad_input, grad_weight, None, None, None


def _backward_input_setup_context(ctx, inputs, output) -> None:
    grad_output, weight, input_size, stride, padding, dilation = inputs
    _save_operands(ctx, grad_output, weight, (stride, padding, dilation))


def _backward_input_backward(ctx, upstream: Tensor):
    grad_output, weight = ctx.saved_tensors
    (_, weight_shape), (stride, padding, dilation) = ctx.shapes, ctx.params
    d_grad_output = d_weight = None
    if ctx.needs_input_grad[0]:
        d_grad_output = involution(upstream, weight, stride, padding, dilation)
    if ctx.needs_input_grad[1]:
        d_weight = involution_backward_weight(
            grad_output, upstream, list(weight_shape[2:4]), stride, padding, dilation, weight_shape[1]
        )
    return d_grad_output, d_weight, None, None, None, None


def _backward_weight_setup_context(ctx, inputs, output) -> None:
    grad_output, input, kernel_size, stride, padding, dilation, groups = inputs
    _save_operands(ctx, grad_output, input, (stride, padding, dilation))


def _backward_weight_backward(ctx, upstream: Tensor):
    grad_output, input = ctx.saved_tensors
    (_, input_shape), (stride, padding, dilation) = ctx.shapes, ctx.params
    d_grad_output = d_input = None
    if ctx.needs_input_grad[0]:
        d_grad_output = involution(input, upstream, stride, padding, dilation)
    if ctx.needs_input_grad[1]:
        d_input = involution_backward_input(grad_output, upstream, list(input_shape[2:]), stride, padding, dilation)
    return d_grad_output, d_input, None, None, None, None, None


involution.register_autograd(_involution_backward, setup_context=_involution_setup_context)
involution_backward_input.register_autograd(_backward_input_backward, setup_context=_backward_input_setup_context)
involution_backward_weight.register_autograd(_backward_weight_backward, setup_context=_backward_weight_setup_context)


# ---------------------------------------------------------------------------------------
# vmap: fold the vmapped dimension into N (every operand has N first)
# ---------------------------------------------------------------------------------------


def _fold_batch(info, in_dims: Sequence, tensors: Sequence[Tensor]) -> list[Tensor]:
    """Move each vmapped dim to the front (expanding unbatched operands) and merge it into N."""
    folded = []
    for tensor, dim in zip(tensors, in_dims):
        t = tensor.movedim(dim, 0) if dim is not None else tensor.expand(info.batch_size, *tensor.shape)
        folded.append(t.flatten(0, 1))
    return folded


def _unfold_batch(info, out: Tensor):
    return out.unflatten(0, (info.batch_size, out.shape[0] // info.batch_size)), 0


def _involution_vmap(info, in_dims, input, weight, stride, padding, dilation):
    x, w = _fold_batch(info, in_dims[:2], (input, weight))
    return _unfold_batch(info, involution(x, w, stride, padding, dilation))


def _backward_input_vmap(info, in_dims, grad_output, weight, input_size, stride, padding, dilation):
    g, w = _fold_batch(info, in_dims[:2], (grad_output, weight))
    return _unfold_batch(info, involution_backward_input(g, w, input_size, stride, padding, dilation))


def _backward_weight_vmap(info, in_dims, grad_output, input, kernel_size, stride, padding, dilation, groups):
    g, x = _fold_batch(info, in_dims[:2], (grad_output, input))
    out = involution_backward_weight(g, x, kernel_size, stride, padding, dilation, groups)
    return _unfold_batch(info, out)


involution.register_vmap(_involution_vmap)
involution_backward_input.register_vmap(_backward_input_vmap)
involution_backward_weight.register_vmap(_backward_weight_vmap)


# ---------------------------------------------------------------------------------------
# Forward-mode AD: each op is bilinear, so its tangent is the op applied to one tangent and
# the other primal, summed over the two operands
# ---------------------------------------------------------------------------------------


def _involution_jvp(inputs, output, tangents) -> Tensor:
    input, weight, stride, padding, dilation = inputs
    input_dot, weight_dot = tangents[:2]
    return sum_tangents(
        involution(input_dot, weight, stride, padding, dilation) if input_dot is not None else None,
        involution(input, weight_dot, stride, padding, dilation) if weight_dot is not None else None,
    )


def _backward_input_jvp(inputs, output, tangents) -> Tensor:
    grad_output, weight, input_size, stride, padding, dilation = inputs
    grad_output_dot, weight_dot = tangents[:2]
    return sum_tangents(
        involution_backward_input(grad_output_dot, weight, input_size, stride, padding, dilation)
        if grad_output_dot is not None
        else None,
        involution_backward_input(grad_output, weight_dot, input_size, stride, padding, dilation)
        if weight_dot is not None
        else None,
    )


def _backward_weight_jvp(inputs, output, tangents) -> Tensor:
    grad_output, input, kernel_size, stride, padding, dilation, groups = inputs
    grad_output_dot, input_dot = tangents[:2]
    return sum_tangents(
        involution_backward_weight(grad_output_dot, input, kernel_size, stride, padding, dilation, groups)
        if grad_output_dot is not None
        else None,
        involution_backward_weight(grad_output, input_dot, kernel_size, stride, padding, dilation, groups)
        if input_dot is not None
        else None,
    )


register_jvp(involution, _involution_jvp)
register_jvp(involution_backward_input, _backward_input_jvp)
register_jvp(involution_backward_weight, _backward_weight_jvp)

for _qualname in ("oplib::involution", "oplib::involution_backward_input", "oplib::involution_backward_weight"):
    register_autocast_policy(_qualname, "cpu", "lower_precision")
    register_autocast_policy(_qualname, "cuda", "lower_precision")


def _involution_flop_count(output_shape, kernel_size) -> int:
    """FLOPs as FlopCounterMode counts convolutions, 2 per multiply-add: each of the three ops
    does one multiply-add per (element of the (N, C, Ho, Wo) output or grad_output, kernel tap)."""
    n, channels, out_h, out_w = output_shape
    return 2 * n * channels * out_h * out_w * kernel_size[0] * kernel_size[1]


@register_flop_formula(torch.ops.oplib.involution)
def _involution_flops(input_shape, weight_shape, stride, padding, dilation, out_shape=None, **kwargs) -> int:
    return _involution_flop_count(out_shape, weight_shape[2:4])


@register_flop_formula(torch.ops.oplib.involution_backward_input)
def _involution_backward_input_flops(grad_output_shape, weight_shape, *args, out_shape=None, **kwargs) -> int:
    return _involution_flop_count(grad_output_shape, weight_shape[2:4])


@register_flop_formula(torch.ops.oplib.involution_backward_weight)
def _involution_backward_weight_flops(grad_output_shape, input_shape, kernel_size, *args, out_shape=None, **kwargs) -> int:
    return _involution_flop_count(grad_output_shape, kernel_size)
