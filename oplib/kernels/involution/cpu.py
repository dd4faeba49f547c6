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
    "through_small_map",
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
    (G*KH*KW,) or None -> out: (N, C, Ho, Wo). The native kernels form the weights in cache,
    except on small maps (``through_small_map``), where a chunk of samples' map is formed and
    involution's native forward takes it; the plain-PyTorch route materialises the whole map."""
    module = native.involution()
    if module is not None and not through_small_map("forward", feature):
        return module.involution_generated_forward(input, feature, span_weight, span_bias, kernel_size, stride, padding,
                                                   dilation, out=out)
    if module is not None:
        return _through_map_in_chunks(module.involution_forward, input, feature, span_weight, span_bias, kernel_size,
                                      (stride, padding, dilation), out)
    weight = generated_weight(feature, span_weight, span_bias, kernel_size)
    return out.copy_(pytorch_involution(input, weight, stride, padding, dilation))


def involution_generated_backward_input(grad_output: Tensor, feature: Tensor, span_weight: Tensor,
                                        span_bias: Optional[Tensor], input_size, kernel_size, stride, padding, dilation,
                                        out: Tensor) -> Tensor:
    """grad_output: (N, C, Ho, Wo) and the generator as above -> out: grad_input (N, C, H, W)."""
    module = native.involution()
    if module is not None and not through_small_map("backward_input", feature):
        return module.involution_generated_backward_input(grad_output, feature, span_weight, span_bias, input_size,
                                                          kernel_size, stride, padding, dilation, out=out)
    if module is not None:
        return _through_map_in_chunks(module.involution_backward_input, grad_output, feature, span_weight, span_bias,
                                      kernel_size, (input_size, stride, padding, dilation), out)
    weight = generated_weight(feature, span_weight, span_bias, kernel_size)
    return out.copy_(pytorch_involution_backward_input(grad_output, weight, input_size, stride, padding, dilation))


def involution_generated_backward_generator(grad_output: Tensor, feature: Tensor, span_weight: Tensor, input: Tensor,
                                            kernel_size, stride, padding, dilation,
                                            out: tuple[Tensor, Tensor, Tensor]) -> tuple[Tensor, Tensor, Tensor]:
    """grad_output: (N, C, Ho, Wo), feature: (N, R, Ho, Wo), span_weight: (G*KH*KW, R), input:
    (N, C, H, W) -> out: (grad_feature, grad_span_weight, grad_span_bias). The native kernel
    contracts each block of the generated weight's gradient while it is in cache, except on
    small maps (``through_small_map``: the map route a chunk of samples at a time); the
    plain-PyTorch route makes the whole map (``generator_grads_through_map``)."""
    module = native.involution()
    if module is not None and through_small_map("backward_generator", feature):
        return _generator_grads_in_chunks(grad_output, feature, span_weight, input, kernel_size, stride, padding,
                                          dilation, out)
    if module is not None:
        return tuple(module.involution_generated_backward_generator(grad_output, feature, span_weight, input, kernel_size,
                                                                    stride, padding, dilation, *out))
    return generator_grads_through_map(grad_output, feature, span_weight, input, kernel_size, stride, padding, dilation,
                                       out)


# Output maps of (low, high] pixels a sample go through a transient weight map in float32 and
# float64 (per op): the span conv's product forms it for a chunk of samples as one BLAS call,
# and involution's native kernels (or, for the generator's gradients, involution_backward_weight
# and the span conv's backward) take it from there. On such maps the fused kernels' per-tile
# products are too small to reach the GEMM rate, and the map is small enough to stay in cache.
# Set from bench/layer.py's route table (bench/results/layer.md): RedNet-50's shapes and the
# tiny maps of RedNet-26 on 64x64 images. The forward is faster through the map at every size
# up to 14x14; the backward ops only at 7x7 (at 4x4 and below, grad_input through the map is
# the slower by far, and the generator's gradients lose at 4x4 and 8x8). 16-bit operands keep
# the fused kernels, which form the weights in float32 (a 16-bit map would round them). Tests
# that mean the fused kernels set every range empty (``oplib.testing.native``).
SMALL_MAP_PIXELS = {"forward": (0, 196), "backward_input": (16, 49), "backward_generator": (16, 49)}
# The transient map of one chunk of samples, at most (a chunk holds one sample at least).
SMALL_MAP_CHUNK_BYTES = 8 << 20


def through_small_map(op: str, feature: Tensor) -> bool:
    """Whether ``op`` (a key of ``SMALL_MAP_PIXELS``) takes the small-map route for this
    feature map, (N, R, Ho, Wo)."""
    low, high = SMALL_MAP_PIXELS[op]
    return feature.dtype in (torch.float32, torch.float64) and low < feature.shape[2] * feature.shape[3] <= high


def _sample_chunks(feature: Tensor, span_weight: Tensor) -> list[slice]:
    """Slices of the batch whose transient maps, (n, G*KH*KW, Ho, Wo), hold at most
    ``SMALL_MAP_CHUNK_BYTES`` each."""
    n = feature.shape[0]
    per_sample = span_weight.shape[0] * feature.shape[2] * feature.shape[3] * feature.element_size()
    step = max(1, SMALL_MAP_CHUNK_BYTES // max(1, per_sample))
    return [slice(start, min(n, start + step)) for start in range(0, n, step)]


def _through_map_in_chunks(kernel: Callable[..., Tensor], activation: Tensor, feature: Tensor, span_weight: Tensor,
                           span_bias: Optional[Tensor], kernel_size, params: tuple, out: Tensor) -> Tensor:
    """The small-map route of the forward and grad_input: per chunk of samples, the map
    (``generated_weight``) and involution's native ``kernel(activation, map, *params, out=)``
    writing the chunk's rows of ``out``."""
    for part in _sample_chunks(feature, span_weight):
        kernel(activation[part], generated_weight(feature[part], span_weight, span_bias, kernel_size), *params,
               out=out[part])
    return out


def _generator_grads_in_chunks(grad_output: Tensor, feature: Tensor, span_weight: Tensor, input: Tensor, kernel_size,
                               stride, padding, dilation,
                               out: tuple[Tensor, Tensor, Tensor]) -> tuple[Tensor, Tensor, Tensor]:
    """``generator_grads_through_map`` a chunk of samples at a time: grad_feature's rows are the
    chunk's own, the parameters' gradients the sum of the chunks' in chunk order."""
    grad_feature, grad_span_weight, grad_span_bias = out
    parts = _sample_chunks(feature, span_weight)
    if len(parts) == 1:
        return generator_grads_through_map(grad_output, feature, span_weight, input, kernel_size, stride, padding,
                                           dilation, out)
    weight_sum, bias_sum = torch.zeros_like(grad_span_weight), torch.zeros_like(grad_span_bias)
    weight_part, bias_part = torch.empty_like(grad_span_weight), torch.empty_like(grad_span_bias)
    for part in parts:
        generator_grads_through_map(grad_output[part], feature[part], span_weight, input[part], kernel_size, stride,
                                    padding, dilation, (grad_feature[part], weight_part, bias_part))
        weight_sum += weight_part
        bias_sum += bias_part
    grad_span_weight.copy_(weight_sum)
    grad_span_bias.copy_(bias_sum)
    return out


def generator_grads_through_map(grad_output: Tensor, feature: Tensor, span_weight: Tensor, input: Tensor, kernel_size,
                                stride, padding, dilation,
                                out: tuple[Tensor, Tensor, Tensor]) -> tuple[Tensor, Tensor, Tensor]:
    """involution_generated_backward_generator on any device through the whole map: gw =
    oplib::involution_backward_weight(grad_output, input), (N, G*KH*KW, Ho, Wo), then its three
    contractions (``_contract_generator_map``), written into ``out``. All in the accumulation
    dtype: a 16-bit gw would be rounded before its sums over samples and pixels (grad_span_bias,
    a sum that cancels, then misses bfloat16's tolerance of the float64 reference), so 16-bit
    operands pay a float32 map until the tiled CUDA backward removes it."""
    n, _, out_h, out_w = feature.shape
    rows = span_weight.shape[0]
    groups = rows // (kernel_size[0] * kernel_size[1])
    dtype = _accumulation_dtype(grad_output.dtype)
    gw = torch.ops.oplib.involution_backward_weight(grad_output.to(dtype), input.to(dtype), kernel_size, stride, padding,
                                                    dilation, groups)
    return contract_generator_map_into(gw.reshape(n, rows, out_h, out_w), feature, span_weight, out)


def contract_generator_map_into(gw: Tensor, feature: Tensor, span_weight: Tensor,
                                out: tuple[Tensor, Tensor, Tensor]) -> tuple[Tensor, Tensor, Tensor]:
    """gw: (N, rows, Ho, Wo)'s three contractions (``_contract_generator_map``) with the feature
    and span_weight in gw's dtype, written into ``out`` (grad_feature, grad_span_weight,
    grad_span_bias): the last step of every route through the map."""
    sums = _contract_generator_map(gw, feature.to(gw.dtype), span_weight.to(gw.dtype))
    for result, value in zip(out, sums, strict=True):
        result.copy_(value)
    return out


def _contract_generator_map(gw: Tensor, feature: Tensor, span_weight: Tensor,
                            by_matmul: Optional[bool] = None) -> tuple[Tensor, Tensor, Tensor]:
    """gw: (N, rows, Ho, Wo), feature: (N, R, Ho, Wo), span_weight: (rows, R) -> (span_weight^T gw
    (N, R, Ho, Wo), sum of gw feature^T (rows, R), sum of gw (rows,)). On the CPU the span 1x1
    conv's own backward (oneDNN: one GEMM each, no transposed copy of the map). On CUDA batched
    matmuls over pixel-row views of either layout instead: cuDNN's convolution backward takes
    TF32 for float32 by default (``torch.backends.cudnn.allow_tf32``), which put channels_last
    float32 results outside float32's tolerance of the float64 reference on an H200
    (bench/results/h200/draw3/gpu-check.md), where cuBLAS's matmuls keep float32 unless the
    user asks otherwise (``torch.backends.cuda.matmul``). ``by_matmul`` overrides the choice
    (tests run the CUDA route on the CPU)."""
    rows = span_weight.shape[0]
    if not (gw.device.type == "cuda" if by_matmul is None else by_matmul):
        sums = torch.ops.aten.convolution_backward(gw, feature, span_weight[:, :, None, None], [rows], [1, 1], [0, 0],
                                                   [1, 1], False, [0, 0], 1, [True, True, True])
        return sums[0], sums[1].flatten(1), sums[2]
    map_by_pixel, feature_by_pixel = _pixel_rows(gw), _pixel_rows(feature)     # (N, P, rows), (N, P, R)
    n, reduced, out_h, out_w = feature.shape
    grad_feature = torch.matmul(map_by_pixel, span_weight)                    # (N, P, R)
    grad_feature = grad_feature.view(n, out_h, out_w, reduced).permute(0, 3, 1, 2)
    grad_span_weight = torch.matmul(map_by_pixel.transpose(1, 2), feature_by_pixel).sum(0)
    return grad_feature, grad_span_weight, map_by_pixel.sum((0, 1))


def _pixel_rows(maps: Tensor) -> Tensor:
    """maps: (N, C, H, W) -> (N, H*W, C), a view (no copy) when ``maps`` is NCHW- or
    channels_last-contiguous."""
    n, channels, height, width = maps.shape
    if maps.is_contiguous(memory_format=torch.channels_last):
        return maps.permute(0, 2, 3, 1).view(n, height * width, channels)
    return maps.reshape(n, channels, height * width).transpose(1, 2)


def generated_weight(feature: Tensor, span_weight: Tensor, span_bias: Optional[Tensor], kernel_size,
                     by_matmul: Optional[bool] = None) -> Tensor:
    """feature: (N, R, Ho, Wo), span_weight: (G*KH*KW, R), span_bias: (G*KH*KW,) or None
    -> the weight (N, G, KH, KW, Ho, Wo) of ``oplib::involution``, as ``Involution2d``'s span
    conv computes it (pixel-major in memory when ``feature`` is channels_last). A contiguous
    float32/float64 feature on the CPU goes through one batched product instead: oneDNN's 1x1
    conv of an NCHW map to the many more rows of the weight spends twice the product's time or
    more reordering the result (bench/layer.py's route table times both routes). On CUDA
    (``by_matmul``: the same route anywhere, for the tests) batched products over the feature's
    pixel rows in either layout, as ``_contract_generator_map`` takes for the same reason: cuDNN's
    convolution takes TF32 for float32 by default, cuBLAS's products keep float32."""
    n, reduced, out_h, out_w = feature.shape
    kh, kw = kernel_size
    rows = span_weight.shape[0]
    by_matmul = feature.device.type == "cuda" if by_matmul is None else by_matmul
    if by_matmul and feature.is_contiguous(memory_format=torch.channels_last) and not feature.is_contiguous():
        by_pixel = _pixel_rows(feature)  # (N, P, R): the weight pixel-major, (N, P, rows)
        span = span_weight.t().expand(n, reduced, rows)
        weight = (torch.bmm(by_pixel, span) if span_bias is None
                  else torch.baddbmm(span_bias.expand(n, out_h * out_w, rows), by_pixel, span))
        return weight.view(n, out_h, out_w, rows // (kh * kw), kh, kw).permute(0, 3, 4, 5, 1, 2)
    if by_matmul or (feature.device.type == "cpu" and feature.is_contiguous()
                     and feature.dtype in (torch.float32, torch.float64)):
        flat = feature.contiguous().view(n, reduced, out_h * out_w)
        span = span_weight.expand(n, rows, reduced)
        weight = (torch.bmm(span, flat) if span_bias is None
                  else torch.baddbmm(span_bias[:, None].expand(n, rows, out_h * out_w), span, flat))
    else:
        weight = torch.nn.functional.conv2d(feature, span_weight[:, :, None, None], span_bias)
    return weight.view(n, rows // (kh * kw), kh, kw, out_h, out_w)


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
