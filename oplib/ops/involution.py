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

CPU kernels: the native ones (``oplib/kernels/cpu/``, built on first use by
``oplib.kernels.native``), else the plain-PyTorch strategies, both through
``oplib.kernels.involution_cpu`` (its docstring describes the strategies); the forward and
grad_input write into a result allocated here in the fake's layout. CUDA kernels live in
``oplib/kernels/involution.cu`` and run through ``oplib.kernels.CuPyLauncher``.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor
from torch.utils.flop_counter import register_flop_formula

from ..kernels import (
    BLOCK_SIZE,
    MAX_BLOCKS,
    Launcher,
    cuda_dispatch,
    cupy_launcher,
    involution_cpu,
    launch_elementwise,
    load_source,
)
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
    is_channels_last,
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


# Memory formats, the same on every device and in the fakes: the output of the forward is
# channels_last when its input is, grad_input when grad_output is, and grad_weight pixel-major,
# (N, Ho, Wo, G, KH, KW) in memory, when the input is (the layout of a channels_last
# convolution's output viewed as the weight), so that a channels_last model never copies.


def _empty_activation(like: Tensor, shape: Sequence[int], channels_last: bool) -> Tensor:
    memory_format = torch.channels_last if channels_last else torch.contiguous_format
    return torch.empty(shape, dtype=like.dtype, device=like.device, memory_format=memory_format)


def result_like(activation: Tensor, size: Sequence[int]) -> Tensor:
    """An uninitialised (N, C, *size) result in ``activation``'s layout (channels_last where it
    is): what the fakes return and the kernels write into."""
    return _empty_activation(activation, (activation.shape[0], activation.shape[1], *size), is_channels_last(activation))


def _empty_weight(like: Tensor, shape: Sequence[int], pixel_major: bool) -> Tensor:
    """An uninitialised (N, G, KH, KW, Ho, Wo) tensor, pixel-major in memory if asked."""
    if not pixel_major:
        return like.new_empty(shape)
    n, groups, kh, kw, out_h, out_w = shape
    return like.new_empty((n, out_h, out_w, groups, kh, kw)).permute(0, 3, 4, 5, 1, 2)


def _is_pixel_major(weight: Tensor) -> bool:
    return weight.permute(0, 4, 5, 1, 2, 3).is_contiguous()


def _as_pixel_major(weight: Tensor) -> Tensor:
    return weight if _is_pixel_major(weight) else weight.permute(0, 4, 5, 1, 2, 3).contiguous().permute(0, 3, 4, 5, 1, 2)


def _in_format(activation: Tensor, channels_last: bool) -> Tensor:
    return activation.contiguous(memory_format=torch.channels_last) if channels_last else activation.contiguous()


def _weight_in_format(weight: Tensor, pixel_major: bool) -> Tensor:
    return _as_pixel_major(weight) if pixel_major else weight.contiguous()


# The specialised kernels of involution.cu (its oplib-template lines): square kernels of
# these sizes, equal strides of these, dilation 1.
TILED_KERNEL_SIZES = (3, 5, 7)
TILED_STRIDES = (1, 2)
# The 32-bit kernels serve tensors up to this many elements: a grid-stride index then stays
# below 2^31 even one whole grid past the last element.
INDEX32_LIMIT = 2**31 - 1 - MAX_BLOCKS * BLOCK_SIZE
# Channels per thread trade weight reuse (more) against parallelism (fewer): the most channels
# that still leave this many threads. A guess for an H100 (132 SMs of 2048 threads) until
# make gpu-check measures it.
TARGET_THREADS = 1 << 17


def _max_channels(dtype: torch.dtype) -> int:
    """Tile<scalar_t>::max_channels in involution.cu: accumulators per thread."""
    return 8 if dtype.itemsize == 8 else 16


def _tiled_specialisation(kernel_size, stride, dilation, channels_last: bool, *tensors: Tensor):
    """The template arguments after scalar_t of the specialised kernel for this geometry, or
    None when only the generic kernel serves it."""
    kh, kw = kernel_size
    if kh != kw or kh not in TILED_KERNEL_SIZES or stride[0] != stride[1] or stride[0] not in TILED_STRIDES:
        return None
    if tuple(dilation) != (1, 1):
        return None
    offset = "int" if max(t.numel() for t in tensors) <= INDEX32_LIMIT else "long long"
    return (offset, str(kh), str(stride[0]), "true" if channels_last else "false")


def _lanes(dtype: torch.dtype) -> int:
    """Elements of ``dtype`` in the kernels' 16-byte vectors."""
    return 16 // dtype.itemsize


def _vectors_fit(channels: int, per_group: int, *tensors: Tensor) -> bool:
    """Whether the channels_last kernels' 16-byte vectors fit: each pixel's channels and each
    group's start at a multiple of the vector, from 16-byte aligned tensors."""
    lanes = _lanes(tensors[0].dtype)
    return channels % lanes == 0 and per_group % lanes == 0 and all(t.data_ptr() % 16 == 0 for t in tensors)


def _channels_per_thread(per_group: int, threads_per_channel: int, dtype: torch.dtype, multiple: int) -> int:
    """The most channels (a divisor of ``per_group``, a multiple of ``multiple``) a thread can own
    while the launch keeps TARGET_THREADS threads; the fewest when none can."""
    candidates = [d for d in range(_max_channels(dtype), 0, -1) if per_group % d == 0 and d % multiple == 0]
    for count in candidates:
        if threads_per_channel * (per_group // count) >= TARGET_THREADS:
            return count
    return candidates[-1]


def _run(launcher: Launcher, kernel: str, out: Tensor, writes_out: bool, operands: tuple, scalars: tuple,
         threads: int | None = None, specialisation: tuple = (), source: str = _SOURCE) -> Tensor:
    """Launch ``kernel`` of ``source`` (operands, then its result, then the scalars) into ``out``
    when ``writes_out`` (it writes ``out``'s layout), else into a contiguous buffer copied into ``out``."""
    result = out if writes_out else out.new_empty(out.shape)
    args = (*operands, result, *scalars)
    launch_elementwise(launcher, load_source(source), kernel, result, args, threads, specialisation)
    return out if result is out else out.copy_(result)


def _run_generic(launcher: Launcher, kernel: str, out: Tensor, operands: tuple, scalars: tuple) -> Tensor:
    """A generic kernel of involution.cu: contiguous operands, one thread per element of its
    contiguous result."""
    operands = tuple(operand.contiguous() for operand in operands)
    return _run(launcher, kernel, out, out.is_contiguous(), operands, (out.numel(), *scalars))


def _launch_channel_tiled(
    launcher: Launcher, kernel: str, activation: Tensor, weight: Tensor, out_size, stride, padding, dilation
) -> Tensor:
    """The forward (``kernel`` "involution_forward") or grad_input ("involution_backward_input"):
    each reads an activation (input or grad_output) and the weight and writes an activation of
    ``out_size`` (H, W), channels_last when ``activation`` is; the specialised kernel where one
    serves the geometry, one thread per pixel and chunk of a group's channels, else the generic one."""
    n, channels = activation.shape[:2]
    groups, kh, kw, out_h, out_w = weight.shape[1:]
    channels_last = is_channels_last(activation)
    out = _empty_activation(activation, (n, channels, *out_size), channels_last)
    # The kernels' scalars name the input's size and the output's, whichever of them is read.
    height, width = out_size if kernel == "involution_backward_input" else activation.shape[2:]
    per_group = channels // groups
    layout_last = channels_last and _vectors_fit(channels, per_group, activation, out)
    specialisation = _tiled_specialisation((kh, kw), stride, dilation, layout_last, activation, weight, out)
    if specialisation is None:
        scalars = _kernel_args(channels, height, width, weight.shape, stride, padding, dilation)
        return _run_generic(launcher, kernel, out, (activation, weight), scalars)
    activation, weight = _in_format(activation, layout_last), _weight_in_format(weight, layout_last)
    pixels = out_size[0] * out_size[1]
    lanes = _lanes(activation.dtype) if layout_last else 1
    per_thread = _channels_per_thread(per_group, n * groups * pixels, activation.dtype, lanes)
    threads = n * groups * (per_group // per_thread) * pixels
    scalars = (threads, channels, height, width, groups, out_h, out_w, *padding, per_thread)
    return _run(launcher, f"{kernel}_tiled", out, layout_last == channels_last, (activation, weight), scalars,
                threads, specialisation)


@cuda_dispatch("oplib::involution", _SOURCE, ["involution_forward", "involution_forward_tiled"])
def launch_involution(input: Tensor, weight: Tensor, stride, padding, dilation, launcher: Launcher) -> Tensor:
    """input: (N, C, H, W), weight: (N, G, KH, KW, Ho, Wo) -> (N, C, Ho, Wo), channels_last when
    the input is."""
    return _launch_channel_tiled(
        launcher, "involution_forward", input, weight, weight.shape[4:], stride, padding, dilation
    )


@cuda_dispatch("oplib::involution_backward_input", _SOURCE, ["involution_backward_input", "involution_backward_input_tiled"])
def launch_involution_backward_input(
    grad_output: Tensor, weight: Tensor, input_size, stride, padding, dilation, launcher: Launcher
) -> Tensor:
    """grad_output: (N, C, Ho, Wo), weight: (N, G, KH, KW, Ho, Wo) -> grad_input: (N, C, H, W),
    channels_last when grad_output is."""
    return _launch_channel_tiled(
        launcher, "involution_backward_input", grad_output, weight, tuple(input_size), stride, padding, dilation
    )


@cuda_dispatch(
    "oplib::involution_backward_weight", _SOURCE, ["involution_backward_weight", "involution_backward_weight_tiled"]
)
def launch_involution_backward_weight(
    grad_output: Tensor, input: Tensor, kernel_size, stride, padding, dilation, groups: int, launcher: Launcher
) -> Tensor:
    """grad_output: (N, C, Ho, Wo), input: (N, C, H, W) -> grad_weight: (N, G, KH, KW, Ho, Wo),
    pixel-major in memory when the input is channels_last."""
    n, channels, height, width = input.shape
    out_h, out_w = grad_output.shape[2:]
    pixel_major = is_channels_last(input)
    grad_weight = _empty_weight(input, (n, groups, *kernel_size, out_h, out_w), pixel_major)
    per_group = channels // groups
    # A grad_output in the other layout is copied into this one below, and a fresh copy is aligned.
    aligned = [input, grad_output] if is_channels_last(grad_output) else [input]
    layout_last = pixel_major and _vectors_fit(channels, per_group, *aligned)
    specialisation = _tiled_specialisation(kernel_size, stride, dilation, layout_last, grad_output, input, grad_weight)
    if specialisation is None:
        scalars = _kernel_args(channels, height, width, grad_weight.shape, stride, padding, dilation)
        return _run_generic(launcher, "involution_backward_weight", grad_weight, (grad_output, input), scalars)
    grad_output, input = _in_format(grad_output, layout_last), _in_format(input, layout_last)
    threads = n * groups * kernel_size[0] * out_h * out_w
    scalars = (channels, height, width, groups, out_h, out_w, *padding)
    return _run(launcher, "involution_backward_weight_tiled", grad_weight, layout_last == pixel_major,
                (grad_output, input), (threads, *scalars), threads, specialisation)


# ---------------------------------------------------------------------------------------
# The three custom ops
# ---------------------------------------------------------------------------------------


def _involution_kernel(
    input: Tensor, weight: Tensor, stride: list[int], padding: list[int], dilation: list[int]
) -> Tensor:
    """input: (N, C, H, W), weight: (N, G, KH, KW, Ho, Wo) -> (N, C, Ho, Wo), channels_last
    when the input is (the fake's layout, written in place by the CPU kernels)."""
    if not _involution_args_valid(input, weight, stride, padding, dilation):
        _check_involution_args(input, weight, stride, padding, dilation)
    out = result_like(input, weight.shape[4:])
    return involution_cpu.involution(input, weight, stride, padding, dilation, out=out)


# The CPU kernel; CUDA registers its own below. Any other device type gets torch's own
# "could not run ... with arguments from the ... backend" error.
involution = torch.library.custom_op("oplib::involution", _involution_kernel, mutates_args=(), device_types="cpu")


@involution.register_fake
def _involution_fake(input, weight, stride, padding, dilation) -> Tensor:
    _check_involution_args(input, weight, stride, padding, dilation)
    return result_like(input, weight.shape[4:])


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
    grad_input = result_like(grad_output, input_size)
    return involution_cpu.involution_backward_input(grad_output, weight, input_size, stride, padding, dilation, out=grad_input)


# The CPU kernel; CUDA registers its own below.
involution_backward_input = torch.library.custom_op(
    "oplib::involution_backward_input", _involution_backward_input_kernel, mutates_args=(), device_types="cpu"
)


@involution_backward_input.register_fake
def _involution_backward_input_fake(grad_output, weight, input_size, stride, padding, dilation) -> Tensor:
    _check_backward_input_args(grad_output, weight, input_size, stride, padding, dilation)
    return result_like(grad_output, input_size)


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
    grad_weight = involution_cpu.involution_backward_weight(
        grad_output, input, kernel_size, stride, padding, dilation, groups
    )
    return _as_pixel_major(grad_weight) if is_channels_last(input) else grad_weight


# The CPU kernel; CUDA registers its own below.
involution_backward_weight = torch.library.custom_op(
    "oplib::involution_backward_weight", _involution_backward_weight_kernel, mutates_args=(), device_types="cpu"
)


@involution_backward_weight.register_fake
def _involution_backward_weight_fake(grad_output, input, kernel_size, stride, padding, dilation, groups) -> Tensor:
    _check_backward_weight_args(grad_output, input, kernel_size, stride, padding, dilation, groups)
    n, _, out_h, out_w = grad_output.shape
    return _empty_weight(grad_output, (n, groups, *kernel_size, out_h, out_w), is_channels_last(input))


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
