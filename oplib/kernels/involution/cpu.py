"""involution's CPU backend, for involution, its two backward ops and the fused-generation ops:
the native kernels (``oplib/kernels/involution/csrc/cpu/``, built on first use by ``oplib.kernels.native``,
unless ``OPLIB_CPU_KERNELS`` says otherwise) or plain PyTorch, the strategies below. Each entry
point writes into the ``out`` its op allocated (see ``oplib.kernels.involution``).

    out[n, c, i, j] = sum_{a, b} weight[n, c // (C/G), a, b, i, j] * input[n, c, i*sh - ph + a*dh, j*sw - pw + b*dw]

Never ``unfold``, which would hold K*K copies of the input. Two strategies, each a class
that computes the forward and both backward ops of a geometry, chosen per call by the size
of the map (``strategy_name``):

- Small maps (H*W at most ``DENSE_MAP_MAX_PIXELS_PER_TAP`` times KH*KW per stride phase, e.g.
  RedNet's 7x7 stage and its 14x14 -> 7x7 involution), ``DenseMap``: one matrix product per
  (sample, group), batched.
- Larger maps, ``TapLayout``: K*K elementwise passes, each over one shifted view of the input
  for all samples, groups and channels at once.

Each class's docstring says how it computes the three ops.

Both skip the zero padding, so a non-finite value can meet a zero it would not meet in
the padded formulation (inf * 0 is nan) or miss one it would. With finite values the results
are exact. The dense matrices drop the taps that read padding, so a non-finite value
could vanish: their calls go to ``PaddedFormulation``, which gives the reference's nan and
inf pattern, when an operand is not finite. The taps can only add a nan: their calls go
there when the result is not finite.

The plain-PyTorch functions (``pytorch_*``) return a fresh contiguous tensor of the operands'
dtype, which the entry points copy into ``out``; 16-bit operands are converted to float32 here, and the strategies compute in the dtype they are given. No
atomics and no reduction whose order depends on threads: results are deterministic.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from typing import Optional, Protocol

import torch
from torch import Tensor

from .. import native
from .pytorch.dense_map import DenseMap
from .pytorch.geometry import Geometry
from .pytorch.padded import PaddedFormulation
from .pytorch.taps import TapLayout

__all__ = [
    "DenseMap",
    "Geometry",
    "PaddedFormulation",
    "Strategy",
    "TapLayout",
    "involution",
    "involution_backward_input",
    "involution_backward_weight",
    "involution_generated",
    "involution_generated_backward_input",
    "involution_generated_backward_generator",
    "generator_grads_through_map",
    "generated_weight",
    "pytorch_involution",
    "pytorch_involution_backward_input",
    "pytorch_involution_backward_weight",
    "strategy_name",
]

# A map is "small" when its pixels are at most this many times the kernel's taps per stride
# phase (sh*sw phases): the dense matrix then holds at most that many times the weight's
# elements. The tap passes pay for their buffers once per phase, so strided maps stay dense
# up to larger sizes. Set by timing the dense matrices against the taps, forward+backward,
# at RedNet-50's shapes (each forced through this limit as tests/kernels/cpu/test_involution_cpu.py
# does); bench/results/involution.md holds the chosen strategies' times.
DENSE_MAP_MAX_PIXELS_PER_TAP = 2


class Strategy(Protocol):
    """What ``DenseMap``, ``TapLayout`` and ``PaddedFormulation`` have in common: built once
    per ``Geometry``, they compute the three ops in the dtype they are given and may return a
    view, or a layout other than contiguous."""

    # What ``strategy_name`` reports.
    name: str
    # Whether taps that read the padding drop out of the products, so that a non-finite
    # operand could vanish instead of making the reference's nan (see ``_exact``).
    drops_padding_taps: bool

    def forward(self, input: Tensor, weight: Tensor) -> Tensor:
        """input: (N, C, H, W), weight: (N, G, KH, KW, Ho, Wo) -> out: (N, C, Ho, Wo)."""

    def backward_input(self, grad_output: Tensor, weight: Tensor) -> Tensor:
        """grad_output: (N, C, Ho, Wo), weight: (N, G, KH, KW, Ho, Wo) -> grad_input: (N, C, H, W)."""

    def backward_weight(self, grad_output: Tensor, input: Tensor, groups: int) -> Tensor:
        """grad_output: (N, C, Ho, Wo), input: (N, C, H, W) -> grad_weight: (N, G, KH, KW, Ho, Wo)."""


# The backend's entry points, one per op, each writing the op's result into ``out`` (allocated
# by the op in its fake's layout; any strides) as the CUDA backend's do.


def involution(input: Tensor, weight: Tensor, stride, padding, dilation, out: Tensor) -> Tensor:
    """input: (N, C, H, W), weight: (N, G, KH, KW, Ho, Wo) -> out: (N, C, Ho, Wo)."""
    module = native.involution()
    if module is not None:
        return module.involution_forward(input, weight, stride, padding, dilation, out=out)
    return out.copy_(pytorch_involution(input, weight, stride, padding, dilation))


def involution_backward_input(grad_output: Tensor, weight: Tensor, input_size, stride, padding, dilation,
                              out: Tensor) -> Tensor:
    """grad_output: (N, C, Ho, Wo), weight: (N, G, KH, KW, Ho, Wo) -> out: grad_input (N, C, H, W)."""
    module = native.involution()
    if module is not None:
        return module.involution_backward_input(grad_output, weight, input_size, stride, padding, dilation, out=out)
    return out.copy_(pytorch_involution_backward_input(grad_output, weight, input_size, stride, padding, dilation))


def involution_backward_weight(grad_output: Tensor, input: Tensor, kernel_size, stride, padding, dilation, groups,
                               out: Tensor) -> Tensor:
    """grad_output: (N, C, Ho, Wo), input: (N, C, H, W) -> out: grad_weight (N, G, KH, KW, Ho, Wo).
    The native kernels write a contiguous ``out`` in place; a pixel-major one receives a copy."""
    module = native.involution()
    if module is not None:
        return module.involution_backward_weight(grad_output, input, kernel_size, stride, padding, dilation, groups,
                                                 out=out)
    return out.copy_(pytorch_involution_backward_weight(grad_output, input, kernel_size, stride, padding, dilation,
                                                        groups))


def involution_generated(input: Tensor, feature: Tensor, span_weight: Tensor, span_bias: Optional[Tensor], kernel_size,
                         stride, padding, dilation, out: Tensor) -> Tensor:
    """input: (N, C, H, W), feature: (N, R, Ho, Wo), span_weight: (G*KH*KW, R), span_bias:
    (G*KH*KW,) or None -> out: (N, C, Ho, Wo). The native kernels form the weights in cache;
    the plain-PyTorch route materialises them with the span conv."""
    module = native.involution()
    if module is not None:
        return module.involution_generated_forward(input, feature, span_weight, span_bias, kernel_size, stride, padding,
                                                   dilation, out=out)
    weight = generated_weight(feature, span_weight, span_bias, kernel_size)
    return out.copy_(pytorch_involution(input, weight, stride, padding, dilation))


def involution_generated_backward_input(grad_output: Tensor, feature: Tensor, span_weight: Tensor,
                                        span_bias: Optional[Tensor], input_size, kernel_size, stride, padding, dilation,
                                        out: Tensor) -> Tensor:
    """grad_output: (N, C, Ho, Wo) and the generator as above -> out: grad_input (N, C, H, W)."""
    module = native.involution()
    if module is not None:
        return module.involution_generated_backward_input(grad_output, feature, span_weight, span_bias, input_size,
                                                          kernel_size, stride, padding, dilation, out=out)
    weight = generated_weight(feature, span_weight, span_bias, kernel_size)
    return out.copy_(pytorch_involution_backward_input(grad_output, weight, input_size, stride, padding, dilation))


def involution_generated_backward_generator(grad_output: Tensor, feature: Tensor, span_weight: Tensor, input: Tensor,
                                            kernel_size, stride, padding, dilation,
                                            out: tuple[Tensor, Tensor, Tensor]) -> tuple[Tensor, Tensor, Tensor]:
    """grad_output: (N, C, Ho, Wo), feature: (N, R, Ho, Wo), span_weight: (G*KH*KW, R), input:
    (N, C, H, W) -> out: (grad_feature, grad_span_weight, grad_span_bias). The native kernel
    contracts each block of the generated weight's gradient while it is in cache; the
    plain-PyTorch route makes the whole map (``generator_grads_through_map``)."""
    module = native.involution()
    if module is not None:
        return tuple(module.involution_generated_backward_generator(grad_output, feature, span_weight, input, kernel_size,
                                                                    stride, padding, dilation, *out))
    return generator_grads_through_map(grad_output, feature, span_weight, input, kernel_size, stride, padding, dilation,
                                       out)


def generator_grads_through_map(grad_output: Tensor, feature: Tensor, span_weight: Tensor, input: Tensor, kernel_size,
                                stride, padding, dilation,
                                out: tuple[Tensor, Tensor, Tensor]) -> tuple[Tensor, Tensor, Tensor]:
    """involution_generated_backward_generator on any device through the whole map: gw =
    oplib::involution_backward_weight(grad_output, input), (N, G*KH*KW, Ho, Wo), then its three
    contractions by the span 1x1 conv's own backward (aten.convolution_backward: one GEMM each,
    no transposed copy of the map), written into ``out``. All in the accumulation dtype: a
    16-bit gw would be rounded before its sums over samples and pixels (grad_span_bias, a sum
    that cancels, then misses bfloat16's tolerance of the float64 reference), so 16-bit
    operands pay a float32 map until the tiled CUDA backward removes it."""
    n, _, out_h, out_w = feature.shape
    rows = span_weight.shape[0]
    groups = rows // (kernel_size[0] * kernel_size[1])
    dtype = _accumulation_dtype(grad_output.dtype)
    gw = torch.ops.oplib.involution_backward_weight(grad_output.to(dtype), input.to(dtype), kernel_size, stride, padding,
                                                    dilation, groups)
    sums = torch.ops.aten.convolution_backward(
        gw.reshape(n, rows, out_h, out_w), feature.to(dtype), span_weight.to(dtype)[:, :, None, None], [rows], [1, 1],
        [0, 0], [1, 1], False, [0, 0], 1, [True, True, True])
    for result, value in zip(out, (sums[0], sums[1].flatten(1), sums[2]), strict=True):
        result.copy_(value)
    return out


def generated_weight(feature: Tensor, span_weight: Tensor, span_bias: Optional[Tensor], kernel_size) -> Tensor:
    """feature: (N, R, Ho, Wo), span_weight: (G*KH*KW, R), span_bias: (G*KH*KW,) or None
    -> the weight (N, G, KH, KW, Ho, Wo) of ``oplib::involution``, as ``Involution2d``'s span
    conv computes it (pixel-major in memory when ``feature`` is channels_last)."""
    n, _, out_h, out_w = feature.shape
    kh, kw = kernel_size
    weight = torch.nn.functional.conv2d(feature, span_weight[:, :, None, None], span_bias)
    return weight.view(n, span_weight.shape[0] // (kh * kw), kh, kw, out_h, out_w)


# The plain-PyTorch kernels, whatever OPLIB_CPU_KERNELS says (the benchmarks compare the paths).


def pytorch_involution(input: Tensor, weight: Tensor, stride, padding, dilation) -> Tensor:
    """input: (N, C, H, W), weight: (N, G, KH, KW, Ho, Wo) -> (N, C, Ho, Wo)."""
    geometry = Geometry.of_call(input.shape[2:], weight.shape, stride, padding, dilation)
    return _exact(geometry, lambda strategy, x, w: strategy.forward(x, w), input, weight)


def pytorch_involution_backward_input(grad_output: Tensor, weight: Tensor, input_size, stride, padding, dilation) -> Tensor:
    """grad_output: (N, C, Ho, Wo), weight: (N, G, KH, KW, Ho, Wo) -> grad_input: (N, C, H, W)."""
    geometry = Geometry.of_call(input_size, weight.shape, stride, padding, dilation)
    return _exact(geometry, lambda strategy, g, w: strategy.backward_input(g, w), grad_output, weight)


def pytorch_involution_backward_weight(
    grad_output: Tensor, input: Tensor, kernel_size, stride, padding, dilation, groups
) -> Tensor:
    """grad_output: (N, C, Ho, Wo), input: (N, C, H, W) -> grad_weight: (N, G, KH, KW, Ho, Wo)."""
    weight_shape = (input.shape[0], groups, *kernel_size, *grad_output.shape[2:])
    geometry = Geometry.of_call(input.shape[2:], weight_shape, stride, padding, dilation)
    return _exact(geometry, lambda strategy, g, x: strategy.backward_weight(g, x, groups), grad_output, input)


def strategy_name(input_size: Sequence[int], weight_shape: Sequence[int], stride, padding, dilation) -> str:
    """"dense" or "taps": how the three kernels compute this geometry
    (weight_shape: (N, G, KH, KW, Ho, Wo)).

    >>> strategy_name((56, 56), (8, 4, 7, 7, 28, 28), [2, 2], [3, 3], [1, 1])
    'taps'
    """
    return _chosen_strategy(Geometry.of_call(input_size, weight_shape, stride, padding, dilation)).name


def _chosen_strategy(geometry: Geometry) -> DenseMap | TapLayout:
    """The strategy for this geometry's map size (the limit is read on every call, so that
    the tests can force each strategy)."""
    (height, width), (kh, kw), (sh, sw) = geometry.input_size, geometry.kernel_size, geometry.stride
    if height * width <= DENSE_MAP_MAX_PIXELS_PER_TAP * kh * kw * sh * sw:
        return _cached_strategy(DenseMap, geometry)
    return _cached_strategy(TapLayout, geometry)


@functools.lru_cache(maxsize=64)
def _cached_strategy(kind: type, geometry: Geometry) -> Strategy:
    """``kind`` built for ``geometry``, once: the index tables are reused by every call."""
    return kind(geometry)


def _exact(geometry: Geometry, compute: Callable[..., Tensor], *operands: Tensor) -> Tensor:
    """compute(chosen strategy, *operands), or compute(PaddedFormulation, *operands) where a
    non-finite value could make the two differ (see the module docstring)."""
    chosen = _chosen_strategy(geometry)
    if chosen.drops_padding_taps:
        if _finite(*operands):
            return _in_operand_dtype(compute, chosen, operands)
    else:
        result = _in_operand_dtype(compute, chosen, operands)
        if _finite(result):
            return result
    return _in_operand_dtype(compute, _cached_strategy(PaddedFormulation, geometry), operands)


def _in_operand_dtype(compute: Callable[..., Tensor], strategy: Strategy, operands: tuple[Tensor, ...]) -> Tensor:
    """compute(strategy, *operands) in the accumulation dtype, as a fresh contiguous tensor of
    the operands' dtype (a strategy's own result when it already is one: no copy)."""
    dtype = operands[0].dtype
    accumulate = _accumulation_dtype(dtype)
    values = compute(strategy, *(operand.to(accumulate) for operand in operands))
    if values.dtype == dtype and values.is_contiguous():
        return values
    return torch.empty(values.shape, dtype=dtype, device=values.device).copy_(values)


def _accumulation_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


def _finite(*tensors: Tensor) -> bool:
    """True when no element is inf or nan (a sum is non-finite if any element is; one that
    overflows only sends a call to the exact path)."""
    return all(math.isfinite(t.sum(dtype=_accumulation_dtype(t.dtype)).item()) for t in tensors)
