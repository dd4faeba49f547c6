"""The Python API: argument normalisation in front of ``torch.ops.oplib.*``.

Custom ops take only explicit pairs (no list defaults, no strings), so ints, pairs and
``padding="same"/"valid"`` are resolved here, as ``torch.nn.functional`` accepts them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Optional, Union

import torch
from torch import Tensor

from .ops._common import as_pair

IntOrPair = Union[int, Sequence[int]]


def exp(x: Tensor) -> Tensor:
    """e^x elementwise. x: any shape."""
    return torch.ops.oplib.exp(x)


def linear(input: Tensor, weight: Tensor, bias: Optional[Tensor] = None) -> Tensor:
    """input: ``(*, in_features)``, weight: (out_features, in_features), bias: (out_features,)
    -> ``(*, out_features)``."""
    return torch.ops.oplib.linear(input, weight, bias)


def conv2d(
    input: Tensor,
    weight: Tensor,
    bias: Optional[Tensor] = None,
    stride: IntOrPair = 1,
    padding: Union[IntOrPair, str] = 0,
    dilation: IntOrPair = 1,
    groups: int = 1,
) -> Tensor:
    """input: (N, C, H, W) or (C, H, W); weight: (O, C / groups, KH, KW); bias: (O,).
    Returns (N, O, Ho, Wo) (or (O, Ho, Wo)). ``padding`` may be an int, a pair,
    ``"valid"`` (no padding) or ``"same"`` (output size = input size; stride 1 only)."""
    stride = as_pair("conv2d", "stride", stride)
    dilation = as_pair("conv2d", "dilation", dilation)
    if isinstance(padding, str):
        input, padding = _resolve_string_padding(input, weight, padding, stride, dilation)
    else:
        padding = as_pair("conv2d", "padding", padding)
    return torch.ops.oplib.conv2d(input, weight, bias, stride, padding, dilation, groups)


def _resolve_string_padding(input, weight, padding: str, stride, dilation):
    if padding == "same" and weight.dim() != 4:
        raise ValueError(f"oplib.conv2d: expected weight to be 4-D, got size {list(weight.shape)}")
    symmetric, extra = _string_padding("oplib.conv2d", "convolutions", padding, weight.shape[2:], stride, dilation)
    if any(extra):
        input = torch.nn.functional.pad(input, [0, extra[1], 0, extra[0]])
    return input, symmetric


def _string_padding(
    name: str, windows: str, padding: str, kernel_size: Sequence[int], stride: Sequence[int], dilation: Sequence[int]
) -> tuple[list[int], list[int]]:
    """``padding="valid"`` or ``"same"`` (stride 1 only, else ValueError naming ``windows``) for
    the op or module ``name``: (symmetric (height, width), extra (bottom, right)) as
    ``_same_padding`` gives them."""
    if padding == "valid":
        return [0, 0], [0, 0]
    if padding != "same":
        raise ValueError(f"{name}: padding must be an int, a pair, 'valid' or 'same', got {padding!r}")
    if any(s != 1 for s in stride):
        raise ValueError(f"{name}: padding='same' is not supported for strided {windows}, got stride={stride}")
    return _same_padding(kernel_size, dilation)


def _same_padding(kernel_size: Sequence[int], dilation: Sequence[int]) -> tuple[list[int], list[int]]:
    """The padding of torch's ``padding="same"``: a dilated kernel of extent d (K - 1) + 1 needs
    d (K - 1) rows in all, half above and half below. Where that is odd, the extra row goes at
    the bottom (columns likewise, at the right), which symmetric padding cannot express: the
    caller pads that side explicitly, as torch does. -> (symmetric (height, width), extra
    (bottom, right))."""
    totals = [d * (k - 1) for k, d in zip(kernel_size, dilation)]
    return [t // 2 for t in totals], [t % 2 for t in totals]


def involution(
    input: Tensor,
    weight: Tensor,
    stride: IntOrPair = 1,
    padding: IntOrPair = 0,
    dilation: IntOrPair = 1,
) -> Tensor:
    """input: (N, C, H, W); weight: (N, G, KH, KW, Ho, Wo), one ``K*K`` kernel per output pixel,
    shared by the C/G channels of a group. Returns (N, C, Ho, Wo) with
    Ho = (H + 2 ph - dh (KH - 1) - 1) // sh + 1 (likewise Wo)."""
    return torch.ops.oplib.involution(
        input,
        weight,
        as_pair("involution", "stride", stride),
        as_pair("involution", "padding", padding),
        as_pair("involution", "dilation", dilation),
    )


def involution_generated(
    input: Tensor,
    feature: Tensor,
    span_weight: Tensor,
    span_bias: Optional[Tensor],
    kernel_size: IntOrPair,
    stride: IntOrPair = 1,
    padding: IntOrPair = 0,
    dilation: IntOrPair = 1,
) -> Tensor:
    """Involution whose weight is generated inside the op from ``feature``, never stored.

    Arguments:
        input: (N, C, H, W).
        feature: (N, R, Ho, Wo), the kernel-generation branch's output at the output size.
        span_weight: (G*KH*KW, R), or the span 1x1 conv's weight (G*KH*KW, R, 1, 1).
        span_bias: (G*KH*KW,) or None.
        kernel_size: an int or a (height, width) pair.
        stride: an int or a (height, width) pair.
        padding: an int or a (height, width) pair.
        dilation: an int or a (height, width) pair.

    Returns:
        (N, C, Ho, Wo): ``involution(input, weight, ...)`` with
        ``weight = conv2d(feature, span_weight, span_bias).view(N, G, KH, KW, Ho, Wo)``.
    """
    if span_weight.dim() == 4:
        span_weight = span_weight.flatten(1)
    return torch.ops.oplib.involution_generated(
        input,
        feature,
        span_weight,
        span_bias,
        as_pair("involution_generated", "kernel_size", kernel_size),
        as_pair("involution_generated", "stride", stride),
        as_pair("involution_generated", "padding", padding),
        as_pair("involution_generated", "dilation", dilation),
    )
