"""Modules over oplib ops, drop-in for their torch.nn counterparts: same constructor
arguments, parameter names and initialisation, so state dicts move both ways."""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable
from typing import Any

import torch
import torch.utils.checkpoint
from torch import Tensor

from . import functional as F
from ._torch_private import BatchNormBase
from .ops._common import as_pair, window_output_size
from .ops.conv2d import INPUT_LAYOUT as BATCHED_OR_NOT
from .ops.involution import INPUT_LAYOUT as INVOLUTION_INPUT


class Exp(torch.nn.Module):
    """y = e^x. input: any shape."""

    def forward(self, input: Tensor) -> Tensor:
        return F.exp(input)


class Linear(torch.nn.Linear):
    """``torch.nn.Linear`` computed by ``torch.ops.oplib.linear``. input: ``(*, in_features)``."""

    def forward(self, input: Tensor) -> Tensor:
        return F.linear(input, self.weight, self.bias)


class Conv2d(torch.nn.Conv2d):
    """``torch.nn.Conv2d`` computed by ``torch.ops.oplib.conv2d``.
    input: (N, C, H, W) or (C, H, W)."""

    def forward(self, input: Tensor) -> Tensor:
        if self.padding_mode != "zeros":
            input = torch.nn.functional.pad(input, self._reversed_padding_repeated_twice, mode=self.padding_mode)
            return F.conv2d(input, self.weight, self.bias, self.stride, 0, self.dilation, self.groups)
        return F.conv2d(input, self.weight, self.bias, self.stride, self.padding, self.dilation, self.groups)


# Which path ``Involution2d`` takes on each device type when its ``fused`` is None (the default):
# the fused op where the committed tables show it faster than span conv + ``involution``, the
# unfused path elsewhere. CPU: fused (bench/results/layer.md, bench/results/backbone.md). CUDA:
# unfused, until a GPU table shows the fused kernels faster at every RedNet-50 shape, forward
# and backward (bench/results/h200/draw6/involution-cuda-layer.md: the fused layer's
# forward+backward slower than the unfused one at every row).
# A device type not listed takes the unfused path, the paper's.
FUSED_BY_DEVICE: dict[str, bool] = {"cpu": True, "cuda": False}


class Involution2d(torch.nn.Module):
    """The involution layer of Li et al. (CVPR 2021). input: (N, C, H, W) -> (N, C, Ho, Wo),
    or unbatched (C, H, W) -> (C, Ho, Wo) as ``torch.nn.Conv2d`` accepts.

    Each output pixel's ``K*K`` kernel is generated from the input: (average-pool to the output
    size when stride > 1) -> 1x1 conv to C / reduction_ratio -> BatchNorm -> ReLU -> 1x1 conv
    to ``G*K*K`` -> viewed as the (N, G, KH, KW, Ho, Wo) weight of ``torch.ops.oplib.involution``,
    G = C / group_channels. The pooling yields exactly the op's output size, so odd sizes at
    stride 2 get a weight of the right size (the published code pooled to floor(H / 2) while
    its output had ceil(H / 2) rows, and read out of bounds).

    ``padding``: an int, a (height, width) pair, ``"valid"`` (0) or ``"same"`` (stride 1 only),
    as ``oplib.conv2d`` takes them, or None (the default): torch's ``"same"`` padding at every
    stride, dilation * (K - 1) rows in all, half above and half below, and where that is odd
    (an even kernel at an odd dilation) the odd row at the bottom (columns likewise, the odd
    one at the right): Ho = ceil(H / stride), H at stride 1. ``padding`` holds the top and left
    amounts (the op's symmetric padding), ``extra_padding`` the (bottom, right) rows and
    columns, 0 or 1, padded with zeros before the op. The kernel source is the unpadded input:
    at stride 1 output pixel (i, j) generates its kernel from input pixel (i, j), as for an
    odd kernel.

    With ``fused=True`` the span conv is not run: its parameters go to
    ``torch.ops.oplib.involution_generated``, which forms each pixel's weights inside the op,
    so the (N, G, KH, KW, Ho, Wo) weight map is neither written nor saved for backward.
    ``fused=False`` runs the span conv and ``torch.ops.oplib.involution``, as the paper's code
    does; both give the same result and have the same parameters. ``fused=None`` (the default)
    takes, on each call, the path ``FUSED_BY_DEVICE`` names for the input's device type: the
    faster one there (fused on CPU, unfused on CUDA for now). ``module.fused`` may be set
    later; ``kernel_weights`` returns the map on every path.

    ``checkpoint_generation=True`` (or ``module.checkpoint_generation = True``; RedNet's
    ``set_generation_checkpointing``) recomputes the generation branch before the span conv
    (pooling, reduce conv, BatchNorm, ReLU) in the backward pass of a training-mode call
    instead of saving its activations (``checkpoint_module``: the running statistics are
    updated once). With the fused op the layer then keeps its input and the R-channel feature
    map.

    The two 1x1 convs are ``torch.nn.Conv2d``, not ``Conv2d`` above (same parameters, so the
    same state dict): inductor sees the reduce conv, and with ``torch._inductor.config.freezing``
    folds the BatchNorm into it and the ReLU into its kernel, which it cannot do through a
    custom op.
    """

    def __init__(
        self,
        channels: int,
        kernel_size: int | tuple[int, int] = 7,
        stride: int | tuple[int, int] = 1,
        padding: int | tuple[int, int] | str | None = None,
        dilation: int | tuple[int, int] = 1,
        group_channels: int = 16,
        reduction_ratio: int = 4,
        fused: bool | None = None,
        checkpoint_generation: bool = False,
    ):
        super().__init__()
        for name, value in (("channels", channels), ("group_channels", group_channels), ("reduction_ratio", reduction_ratio)):
            if not (isinstance(value, int) and value > 0):
                raise ValueError(f"Involution2d: expected {name} to be a positive int, got {name}={value!r}")
        if channels % group_channels != 0:
            raise ValueError(f"Involution2d: channels ({channels}) must be divisible by group_channels ({group_channels})")
        self.channels = channels
        self.kernel_size = _positive_pair("kernel_size", kernel_size, lowest=1)
        self.stride = _positive_pair("stride", stride, lowest=1)
        self.dilation = _positive_pair("dilation", dilation, lowest=1)
        if padding is None:
            symmetric, extra = F._same_padding(self.kernel_size, self.dilation)
        elif isinstance(padding, str):
            symmetric, extra = F._string_padding(
                "Involution2d", "involutions", padding, self.kernel_size, self.stride, self.dilation
            )
        else:
            symmetric, extra = _positive_pair("padding", padding, lowest=0), (0, 0)
        self.padding, self.extra_padding = tuple(symmetric), tuple(extra)
        self.groups = channels // group_channels
        self.fused = fused
        self.checkpoint_generation = checkpoint_generation
        reduced = max(1, channels // reduction_ratio)
        # The output keeps the input's size only at stride 1 with exactly "same" padding; else
        # the kernel source is pooled. Decided by the configuration, never by the input size,
        # so tracing adds no guard.
        keeps_size = all(
            2 * p + e == d * (k - 1)
            for p, e, d, k in zip(self.padding, self.extra_padding, self.dilation, self.kernel_size)
        )
        self.pools = self.stride != (1, 1) or not keeps_size
        self.reduce = torch.nn.Conv2d(channels, reduced, 1, bias=False)
        self.norm = torch.nn.BatchNorm2d(reduced)
        self.span = torch.nn.Conv2d(reduced, self.groups * self.kernel_size[0] * self.kernel_size[1], 1)

    def output_size(self, height, width) -> tuple:
        """(Ho, Wo) for an input of height x width."""
        padded = (height + self.extra_padding[0], width + self.extra_padding[1])
        return window_output_size(padded, self.kernel_size, self.stride, self.padding, self.dilation)

    def kernel_weights(self, input: Tensor) -> Tensor:
        """input: (N, C, H, W) -> the generated weight (N, G, KH, KW, Ho, Wo)."""
        self._check_input(input, (4,), INVOLUTION_INPUT)
        return self._kernel_weights(input)

    def _kernel_weights(self, input: Tensor) -> Tensor:
        """``kernel_weights`` for an input already checked."""
        return self._span(self._feature(input))

    def _span(self, feature: Tensor) -> Tensor:
        """(N, R, Ho, Wo) -> the span conv's output viewed as the weight (N, G, KH, KW, Ho, Wo)."""
        return self.span(feature).view(feature.shape[0], self.groups, *self.kernel_size, *feature.shape[2:])

    def _feature(self, input: Tensor) -> Tensor:
        """(N, C, H, W) -> (N, R, Ho, Wo): the generation branch before the span conv."""
        out_h, out_w = self.output_size(*input.shape[2:])
        source = self._pool(input, out_h, out_w) if self.pools else input
        return torch.relu(self.norm(self.reduce(source)))

    def _pool(self, input: Tensor, out_h, out_w) -> Tensor:
        """(N, C, H, W) -> (N, C, Ho, Wo): output pixel (i, j) gets the mean of the input over
        the stride x stride cell at its window's centre, rows o + i*s ... o + i*s + s - 1 with
        o = d (K - 1) // 2 - p, p the top padding (0 for the default padding: plain s x s
        average pooling, as in the paper). Parts of a cell outside the image are left out of
        its mean, so odd sizes at stride 2 work. Written as a sum over a shifted, zero-extended
        input divided by the in-image count: the output size is then the op's own formula,
        which torch.export can prove equal for every input size, and inductor lowers it with
        dynamic shapes."""
        height, width = input.shape[2:]
        offsets = [d * (k - 1) // 2 - p for d, k, p in zip(self.dilation, self.kernel_size, self.padding)]
        # F.pad crops where an amount is negative.
        pad = (
            -offsets[1], out_w * self.stride[1] + offsets[1] - width,
            -offsets[0], out_h * self.stride[0] + offsets[0] - height,
        )
        # Dynamo refuses an autograd.Function with a jvp; traced, AOTAutograd's partitioner
        # decides what the backward keeps.
        if torch.compiler.is_compiling():
            summed = torch.nn.functional.avg_pool2d(torch.nn.functional.pad(input, pad), self.stride, divisor_override=1)
        elif not any(pad):
            # eager, the amounts ints: 0, as the default padding's at even sizes, leave every cell
            # inside the image, so each counts stride_h * stride_w pixels: no copy and no count
            # map (four small ops fewer a call; traced, a symbolic size would take a guard here)
            return _CellSum.apply(input, self.stride) / (self.stride[0] * self.stride[1])
        else:
            summed = _CellSum.apply(torch.nn.functional.pad(input, pad), self.stride)
        inside = torch.nn.functional.pad(input.new_ones((1, 1, height, width)), pad)
        count = torch.nn.functional.avg_pool2d(inside, self.stride, divisor_override=1)
        return summed / count.clamp(min=1)

    def _check_input(self, input: Tensor, dims: tuple, layout: str) -> None:
        # Checked here, before the pooling and the 1x1 convs, whose own errors would not say
        # what is wrong with the layer's input. Dynamo traces this code (the ops' checks run
        # inside the ops, where it does not look): the number of dims and the channels are
        # static there, and a symbolic size is checked with a message function that does not
        # print the size (printing a symbolic size would specialise it). The function takes its
        # string as a default argument: dynamo in torch 2.10 to 2.12 refuses a message function
        # that refers to a variable of the enclosing function, even when the check passes.
        if input.dim() not in dims:
            raise RuntimeError(
                f"Involution2d: expected input to be {layout}, got a {input.dim()}-D tensor of size {list(input.shape)}"
            )
        if input.shape[-3] != self.channels:
            raise RuntimeError(
                f"Involution2d: expected input with {self.channels} channels, got input of size {list(input.shape)}"
            )
        for size, kernel, padding, extra, dilation, name in zip(
            input.shape[-2:], self.kernel_size, self.padding, self.extra_padding, self.dilation, ("height", "width")
        ):
            extent = dilation * (kernel - 1) + 1
            # (dynamo specialises a size that isinstance looks at, so ask whether it traces first)
            shown = name[0].upper() if torch.compiler.is_compiling() or not isinstance(size, int) else size
            message = (
                f"Involution2d: input {name} with padding ({shown} + 2*{padding}{f' + {extra}' if extra else ''}) "
                f"is smaller than the dilated kernel {name} ({extent})"
            )
            fits = size + 2 * padding + extra >= extent
            # A plain True (a static size) needs no check: inside a checkpointed region dynamo
            # would keep the call, message function and all, in the graph, whose FX-cache key
            # then cannot be pickled.
            if not (isinstance(fits, bool) and fits):
                torch._check(fits, lambda message=message: message)

    def fused_on(self, device_type: str) -> bool:
        """Whether a call on a device of ``device_type`` ("cpu", "cuda", ...) takes the fused op:
        ``fused``, or where it is None the choice of ``FUSED_BY_DEVICE``."""
        if self.fused is not None:
            return self.fused
        return FUSED_BY_DEVICE.get(device_type, False)

    def forward(self, input: Tensor) -> Tensor:
        """input: (N, C, H, W) or (C, H, W) -> (N, C, Ho, Wo) or (C, Ho, Wo)."""
        self._check_input(input, (3, 4), BATCHED_OR_NOT)
        batched = input if input.dim() == 4 else input.unsqueeze(0)
        if self.checkpoint_generation and self.training and torch.is_grad_enabled():
            feature = checkpoint_module(self, self._feature, batched)
        else:
            feature = self._feature(batched)
        if any(self.extra_padding):
            # (the kernel source above is the unpadded input)
            batched = torch.nn.functional.pad(batched, (0, self.extra_padding[1], 0, self.extra_padding[0]))
        if self.fused_on(batched.device.type):
            out = F.involution_generated(batched, feature, self.span.weight, self.span.bias, self.kernel_size,
                                         self.stride, self.padding, self.dilation)
        else:
            out = F.involution(batched, self._span(feature), self.stride, self.padding, self.dilation)
        return out if input.dim() == 4 else out.squeeze(0)

    def extra_repr(self) -> str:
        return (
            f"kernel_size={self.kernel_size}, stride={self.stride}, padding={self.padding}, "
            + (f"extra_padding={self.extra_padding}, " if any(self.extra_padding) else "")
            + f"dilation={self.dilation}, groups={self.groups}, fused={self.fused}"
            + (", checkpoint_generation=True" if self.checkpoint_generation else "")
        )


def checkpoint_module(module: torch.nn.Module, function: Callable[..., Any], *args: Any) -> Any:
    """``function(*args)`` (a part of ``module``'s forward) with its activations recomputed in
    the backward pass instead of saved (``torch.utils.checkpoint``, non-reentrant; eager and
    torch.compile). The BatchNorms of ``module`` update their running statistics once, in the
    first pass, as without checkpointing."""
    if torch.compiler.is_compiling():
        # AOTAutograd recomputes from the traced graph, where the running statistics'
        # update is a single buffer mutation of the forward.
        return torch.utils.checkpoint.checkpoint(function, *args, use_reentrant=False)
    return torch.utils.checkpoint.checkpoint(
        function, *args, use_reentrant=False, context_fn=functools.partial(_recompute_contexts, module)
    )


class _CellSum(torch.autograd.Function):
    """input: (N, C, Ho * sh, Wo * sw), stride (sh, sw) -> (N, C, Ho, Wo), each output the sum
    of its sh x sw cell. ``avg_pool2d`` computes the same, but its backward keeps its input (a
    C-channel map at the input's size, in every strided involution of a training step); the
    cells here are disjoint, so the gradient is each cell's output gradient repeated over the
    cell and nothing is kept."""

    generate_vmap_rule = True

    @staticmethod
    def forward(input: Tensor, stride: tuple[int, int]) -> Tensor:
        return torch.nn.functional.avg_pool2d(input, stride, divisor_override=1)

    @staticmethod
    def setup_context(ctx, inputs, output) -> None:
        ctx.stride = inputs[1]

    @staticmethod
    def backward(ctx, grad: Tensor):
        return _repeat_cells(grad, ctx.stride), None

    @staticmethod
    def jvp(ctx, tangent: Tensor, _stride) -> Tensor:
        return torch.nn.functional.avg_pool2d(tangent, ctx.stride, divisor_override=1)


def _repeat_cells(grad: Tensor, stride: tuple[int, int]) -> Tensor:
    """grad: (N, C, Ho, Wo) -> (N, C, Ho * sh, Wo * sw), each value repeated over its cell, in
    grad's memory format: the copy runs along memory (avg_pool2d's backward, or
    ``interpolate``, whose nearest index is a float product, are no faster here)."""
    n, c, h, w = grad.shape
    sh, sw = stride
    if grad.is_contiguous(memory_format=torch.channels_last) and not grad.is_contiguous():
        pixels = grad.permute(0, 2, 3, 1)[:, :, None, :, None, :].expand(n, h, sh, w, sw, c)
        return pixels.reshape(n, h * sh, w * sw, c).permute(0, 3, 1, 2)
    return grad[:, :, :, None, :, None].expand(n, c, h, sh, w, sw).reshape(n, c, h * sh, w * sw)


class _NoStatUpdates:
    """While a checkpointed block recomputes its forward for the backward pass, its
    BatchNorms in training mode normalise with the batch's statistics, as in the first pass,
    but leave the running statistics alone: the first pass already updated them."""

    def __init__(self, block: torch.nn.Module):
        self.norms = [
            m for m in block.modules() if isinstance(m, BatchNormBase) and m.training and m.track_running_stats
        ]

    def __enter__(self):
        self.saved = [(norm, norm.momentum, norm.num_batches_tracked.clone()) for norm in self.norms]
        for norm in self.norms:
            norm.momentum = 0.0
        return self

    def __exit__(self, *exc):
        for norm, momentum, tracked in self.saved:
            norm.momentum = momentum
            norm.num_batches_tracked.copy_(tracked)
        return False


def _recompute_contexts(block: torch.nn.Module):
    """(the first pass's context, the recomputation's)."""
    return contextlib.nullcontext(), _NoStatUpdates(block)



def _positive_pair(name: str, value, lowest: int) -> tuple[int, int]:
    """``value`` as an (height, width) pair of ints >= ``lowest``, else ValueError."""
    pair = tuple(as_pair("Involution2d", name, value))
    if not all(isinstance(v, int) and v >= lowest for v in pair):
        kind = "positive" if lowest else "non-negative"
        raise ValueError(f"Involution2d: expected {name} to be {kind} ints, got {name}={value!r}")
    return pair


__all__ = ["Conv2d", "Exp", "Involution2d", "Linear", "checkpoint_module"]
