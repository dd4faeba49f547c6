"""The op registry: one ``OpSpec`` per op, read by the tests, the benchmarks and the CLI.

>>> import oplib
>>> [spec.name for spec in oplib.registry.all_specs()]
['exp', 'linear', 'conv2d', 'involution', 'involution_backward_input', 'involution_backward_weight']

A spec says what the op is (its ``torch.ops`` overload), how to check it (a plain-torch
float64 reference, sample inputs, error inputs, a random-input builder for property
tests) and what it supports (dtypes per device, tolerances). Adding an op means one op
file under ``oplib/ops/`` plus one ``register(OpSpec(...))`` here.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Optional

import torch
import torch.nn.functional as F
from torch import Tensor

from . import ops  # noqa: F401  (the specs point at registered ops)

FLOAT_DTYPES = (torch.float64, torch.float32, torch.bfloat16, torch.float16)

# (atol, rtol) against the float64 reference, per dtype of the inputs.
DEFAULT_TOLERANCES: Mapping[torch.dtype, tuple[float, float]] = {
    torch.float64: (1e-10, 1e-7),
    torch.float32: (1e-4, 1e-4),
    torch.bfloat16: (5e-2, 2e-2),
    torch.float16: (5e-3, 5e-3),
}

# ``draw(low, high)`` returns an int in [low, high]; property tests pass a hypothesis
# draw so that failing cases shrink, without oplib importing hypothesis.
Draw = Callable[[int, int], int]


@dataclass(frozen=True)
class SampleInput:
    """Positional arguments of one call of the op, with a name for test ids."""

    args: tuple
    name: str


@dataclass(frozen=True)
class ErrorInput:
    """A call that must raise ``error_type`` with a message matching ``match``."""

    sample: SampleInput
    error_type: type[Exception]
    match: str


@dataclass(frozen=True)
class OpSpec:
    name: str
    op: torch._ops.OpOverload
    reference: Callable[..., Tensor]
    sample_inputs: Callable[[str, torch.dtype, bool], Iterator[SampleInput]]
    error_inputs: Callable[[str], Iterator[ErrorInput]]
    random_sample: Callable[[Draw, str, torch.dtype, bool], SampleInput]
    dtypes: Mapping[str, tuple[torch.dtype, ...]]
    # Autocast policy per device: "lower_precision" (runs in the autocast dtype), "fp32"
    # (runs in float32), or absent (autocast passes the op through, dtypes unchanged).
    autocast_policy: Mapping[str, str] = field(default_factory=dict)
    # The torch function whose autocast policy the op follows (called with the same args).
    torch_equivalent: Optional[Callable[..., Tensor]] = None
    tolerances: Mapping[torch.dtype, tuple[float, float]] = field(default_factory=lambda: dict(DEFAULT_TOLERANCES))
    double_backward: bool = True
    # gradgradcheck builds full second-order Jacobians; fast mode checks random projections
    # of them instead, for ops where the full matrices take minutes.
    fast_gradgradcheck: bool = False

    @property
    def qualname(self) -> str:
        return self.op.name().removesuffix(".default")

    @property
    def schema(self) -> str:
        return str(self.op._schema)

    @property
    def devices(self) -> tuple[str, ...]:
        return tuple(self.dtypes)

    def _opdef(self):
        return torch._library.custom_ops._maybe_get_opdef(self.qualname)

    @property
    def has_fake(self) -> bool:
        return self._opdef()._abstract_fn is not None

    @property
    def has_autograd(self) -> bool:
        return self._opdef()._backward_fn is not None

    @property
    def has_vmap(self) -> bool:
        return self._opdef()._vmap_fn is not None

    @property
    def has_flop_formula(self) -> bool:
        """Whether torch.utils.flop_counter.FlopCounterMode can count the op."""
        from torch.utils.flop_counter import flop_registry

        return self.op._overloadpacket in flop_registry

    def autocast_devices(self) -> tuple[str, ...]:
        """Devices with an autocast kernel; elsewhere autocast passes the op through."""
        return tuple(
            device
            for device in ("cpu", "cuda")
            if torch._C._dispatch_has_kernel_for_dispatch_key(
                self.qualname, "Autocast" + torch._C._dispatch_key_for_device(device)
            )
        )

    def tolerance(self, dtype: torch.dtype) -> tuple[float, float]:
        return self.tolerances[dtype]


_REGISTRY: dict[str, OpSpec] = {}


def register(spec: OpSpec) -> OpSpec:
    if spec.name in _REGISTRY:
        raise ValueError(f"an op named {spec.name!r} is already registered")
    _REGISTRY[spec.name] = spec
    return spec


def all_specs() -> list[OpSpec]:
    return list(_REGISTRY.values())


def get(name: str) -> OpSpec:
    return _REGISTRY[name]


def available_devices() -> list[str]:
    return ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


# ---------------------------------------------------------------------------------------
# Tensor makers shared by the specs
# ---------------------------------------------------------------------------------------

LAYOUTS = ("contiguous", "noncontiguous", "transposed", "channels_last")


def make(
    shape,
    device: str,
    dtype: torch.dtype,
    requires_grad: bool = False,
    layout: str = "contiguous",
    low: float = -2.0,
    high: float = 2.0,
) -> Tensor:
    """A random tensor of ``shape`` laid out as ``layout``; always a leaf.

    ``noncontiguous``: every other element of a larger buffer; ``transposed``: the last
    two dims swapped in memory; ``channels_last``: NHWC strides (4-D only).
    """
    shape = tuple(shape)
    if layout == "transposed" and len(shape) >= 2:
        swapped = (*shape[:-2], shape[-1], shape[-2])
        t = torch.testing.make_tensor(swapped, device=device, dtype=dtype, low=low, high=high).transpose(-1, -2)
    elif layout == "channels_last" and len(shape) == 4:
        t = torch.testing.make_tensor(shape, device=device, dtype=dtype, low=low, high=high)
        t = t.contiguous(memory_format=torch.channels_last)
    else:
        t = torch.testing.make_tensor(
            shape, device=device, dtype=dtype, low=low, high=high, noncontiguous=layout == "noncontiguous"
        )
    return t.detach().requires_grad_(requires_grad)


# ---------------------------------------------------------------------------------------
# exp
# ---------------------------------------------------------------------------------------


def _exp_reference(x: Tensor) -> Tensor:
    return torch.pow(math.e, x)


def _exp_samples(device: str, dtype: torch.dtype, requires_grad: bool) -> Iterator[SampleInput]:
    for shape, layout in (
        ((), "contiguous"),
        ((7,), "contiguous"),
        ((1, 1, 1023), "contiguous"),
        ((3, 5), "transposed"),
        ((2, 3, 4), "noncontiguous"),
        ((2, 3, 4, 5), "channels_last"),
        ((0, 4), "contiguous"),
    ):
        x = make(shape, device, dtype, requires_grad, layout, low=-3, high=3)
        yield SampleInput((x,), f"{'x'.join(map(str, shape)) or 'scalar'}-{layout}")


def _exp_errors(device: str) -> Iterator[ErrorInput]:
    ints = torch.arange(4, device=device)
    yield ErrorInput(SampleInput((ints,), "integer"), RuntimeError, r"oplib\.exp: expected x to have a floating-point dtype, got torch\.int64")


def _exp_random(draw: Draw, device: str, dtype: torch.dtype, requires_grad: bool) -> SampleInput:
    shape = [draw(0, 5) for _ in range(draw(0, 4))]
    x = make(shape, device, dtype, requires_grad, LAYOUTS[draw(0, 3)], low=-4, high=4)
    return SampleInput((x,), f"random-{shape}")


register(
    OpSpec(
        name="exp",
        op=torch.ops.oplib.exp.default,
        reference=_exp_reference,
        torch_equivalent=torch.exp,
        autocast_policy={"cuda": "fp32"},
        sample_inputs=_exp_samples,
        error_inputs=_exp_errors,
        random_sample=_exp_random,
        dtypes={"cpu": FLOAT_DTYPES, "cuda": FLOAT_DTYPES},
    )
)


# ---------------------------------------------------------------------------------------
# linear
# ---------------------------------------------------------------------------------------


def _linear_reference(input: Tensor, weight: Tensor, bias: Optional[Tensor]) -> Tensor:
    out = (input.unsqueeze(-2) * weight).sum(-1)  # (*, 1, in) * (out, in) summed over in
    return out if bias is None else out + bias


def _linear_samples(device: str, dtype: torch.dtype, requires_grad: bool) -> Iterator[SampleInput]:
    in_features, out_features = 5, 3
    for leading, layout, with_bias, weight_layout in (
        ((4,), "contiguous", True, "contiguous"),
        ((), "contiguous", True, "contiguous"),
        ((2, 3), "contiguous", False, "contiguous"),
        ((4,), "transposed", True, "noncontiguous"),
        ((2, 3), "noncontiguous", True, "transposed"),
        ((0,), "contiguous", True, "contiguous"),
        ((2, 0, 3), "contiguous", False, "contiguous"),
    ):
        input = make((*leading, in_features), device, dtype, requires_grad, layout)
        weight = make((out_features, in_features), device, dtype, requires_grad, weight_layout)
        bias = make((out_features,), device, dtype, requires_grad) if with_bias else None
        name = f"{list(leading)}-{layout}-weight_{weight_layout}-{'bias' if with_bias else 'nobias'}"
        yield SampleInput((input, weight, bias), name)


def _linear_errors(device: str) -> Iterator[ErrorInput]:
    f32 = dict(device=device, dtype=torch.float32)
    w = torch.randn(3, 5, **f32)
    x = torch.randn(4, 5, **f32)
    cases = (
        ((torch.randn((), **f32), w, None), "scalar-input", r"expected input to be at least 1-D .* got a 0-D tensor"),
        ((x, torch.randn(15, **f32), None), "1d-weight", r"expected weight to be 2-D .* got a 1-D tensor of size \[15\]"),
        ((torch.randn(4, 6, **f32), w, None), "in-features", r"input's last dimension .* input of size \[4, 6\] and weight of size \[3, 5\]"),
        ((x, w, torch.randn(4, **f32)), "bias-size", r"expected bias of size \[3\] .* got bias of size \[4\]"),
        ((x, w.double(), None), "dtype-mismatch", r"weight and input to have the same dtype, got weight\.dtype=torch\.float64 and input\.dtype=torch\.float32"),
        ((x.long(), w.long(), None), "integer", r"expected input to have a floating-point dtype, got torch\.int64"),
    )
    for args, name, match in cases:
        yield ErrorInput(SampleInput(args, name), RuntimeError, match)


def _linear_random(draw: Draw, device: str, dtype: torch.dtype, requires_grad: bool) -> SampleInput:
    leading = [draw(0, 4) for _ in range(draw(0, 3))]
    in_features, out_features = draw(1, 9), draw(1, 9)
    input = make((*leading, in_features), device, dtype, requires_grad, LAYOUTS[draw(0, 2)])
    weight = make((out_features, in_features), device, dtype, requires_grad, LAYOUTS[draw(0, 2)])
    bias = make((out_features,), device, dtype, requires_grad) if draw(0, 1) else None
    return SampleInput((input, weight, bias), f"random-{leading}-{in_features}-{out_features}")


register(
    OpSpec(
        name="linear",
        op=torch.ops.oplib.linear.default,
        reference=_linear_reference,
        torch_equivalent=F.linear,
        autocast_policy={"cpu": "lower_precision", "cuda": "lower_precision"},
        sample_inputs=_linear_samples,
        error_inputs=_linear_errors,
        random_sample=_linear_random,
        dtypes={"cpu": FLOAT_DTYPES, "cuda": FLOAT_DTYPES},
    )
)


# ---------------------------------------------------------------------------------------
# conv2d
# ---------------------------------------------------------------------------------------


def _conv2d_reference(input, weight, bias, stride, padding, dilation, groups) -> Tensor:
    """Direct summation over kernel taps: out += W[:, :, a, b] . (shifted, strided input)."""
    unbatched = input.dim() == 3
    x = input.unsqueeze(0) if unbatched else input
    (sh, sw), (ph, pw), (dh, dw) = stride, padding, dilation
    n, channels, height, width = x.shape
    out_channels, group_channels, kh, kw = weight.shape
    out_h = (height + 2 * ph - dh * (kh - 1) - 1) // sh + 1
    out_w = (width + 2 * pw - dw * (kw - 1) - 1) // sw + 1
    x = F.pad(x, (pw, pw, ph, ph)).unflatten(1, (groups, group_channels))  # (N, G, C/G, Hp, Wp)
    w = weight.unflatten(0, (groups, out_channels // groups))  # (G, O/G, C/G, KH, KW)
    out = x.new_zeros(n, groups, out_channels // groups, out_h, out_w)
    for a in range(kh):
        for b in range(kw):
            rows = slice(a * dh, a * dh + sh * (out_h - 1) + 1, sh)
            cols = slice(b * dw, b * dw + sw * (out_w - 1) + 1, sw)
            out = out + torch.einsum("ngchw,goc->ngohw", x[..., rows, cols], w[..., a, b])
    out = out.flatten(1, 2)
    if bias is not None:
        out = out + bias[:, None, None]
    return out.squeeze(0) if unbatched else out


# (name, input shape, weight shape, bias, stride, padding, dilation, groups, input layout, weight layout)
_CONV2D_CASES = (
    ("3x3-pad1", (2, 4, 7, 6), (6, 4, 3, 3), True, [1, 1], [1, 1], [1, 1], 1, "contiguous", "contiguous"),
    ("rect-kernel-stride-dilation", (2, 4, 9, 8), (6, 4, 3, 2), False, [2, 1], [0, 2], [1, 2], 1, "contiguous", "contiguous"),
    ("groups2-stride3", (2, 4, 8, 7), (6, 2, 3, 3), True, [3, 2], [1, 1], [1, 1], 2, "contiguous", "contiguous"),
    ("depthwise", (1, 4, 5, 5), (4, 1, 3, 3), True, [1, 1], [1, 1], [1, 1], 4, "contiguous", "contiguous"),
    ("1x1-stride2", (2, 5, 5, 5), (3, 5, 1, 1), False, [2, 2], [0, 0], [1, 1], 1, "contiguous", "contiguous"),
    ("unbatched", (4, 6, 5), (3, 4, 3, 3), True, [1, 1], [1, 1], [1, 1], 1, "contiguous", "contiguous"),
    ("empty-batch", (0, 4, 5, 5), (3, 4, 3, 3), True, [1, 1], [1, 1], [1, 1], 1, "contiguous", "contiguous"),
    ("channels_last", (2, 4, 6, 5), (6, 4, 3, 3), True, [1, 1], [1, 1], [1, 1], 1, "channels_last", "contiguous"),
    ("channels_last-weight", (2, 4, 6, 5), (6, 4, 3, 3), False, [1, 2], [1, 0], [1, 1], 1, "contiguous", "channels_last"),
    ("transposed", (2, 4, 6, 5), (6, 2, 2, 3), True, [1, 1], [1, 1], [2, 1], 2, "transposed", "noncontiguous"),
)


def _conv2d_samples(device: str, dtype: torch.dtype, requires_grad: bool) -> Iterator[SampleInput]:
    for name, in_shape, w_shape, with_bias, stride, padding, dilation, groups, layout, w_layout in _CONV2D_CASES:
        input = make(in_shape, device, dtype, requires_grad, layout)
        weight = make(w_shape, device, dtype, requires_grad, w_layout)
        bias = make((w_shape[0],), device, dtype, requires_grad) if with_bias else None
        yield SampleInput((input, weight, bias, stride, padding, dilation, groups), name)


def _conv2d_errors(device: str) -> Iterator[ErrorInput]:
    f32 = dict(device=device, dtype=torch.float32)
    x = torch.randn(2, 4, 6, 6, **f32)
    w = torch.randn(6, 4, 3, 3, **f32)
    ones, zeros = [1, 1], [0, 0]
    cases = (
        ((torch.randn(4, 6, **f32), w, None, ones, zeros, ones, 1), RuntimeError, "2d-input",
         r"expected input to be 3-D \(C, H, W\) or 4-D \(N, C, H, W\), got a 2-D tensor of size \[4, 6\]"),
        ((x, torch.randn(6, 4, 3, **f32), None, ones, zeros, ones, 1), RuntimeError, "3d-weight",
         r"expected weight to be 4-D .* got a 3-D tensor of size \[6, 4, 3\]"),
        ((torch.randn(2, 5, 6, 6, **f32), w, None, ones, zeros, ones, 1), RuntimeError, "channels",
         r"expected input of size \[2, 5, 6, 6\] to have 4 channels .* got 5 channels"),
        ((x, torch.randn(6, 2, 3, 3, **f32), None, ones, zeros, ones, 3), RuntimeError, "groups-divide",
         r"input channels \(4\) to be divisible by groups \(3\)"),
        ((x, w, None, [0, 1], zeros, ones, 1), ValueError, "zero-stride", r"expected stride to be positive, got stride=\[0, 1\]"),
        ((x, w, None, ones, zeros, [1, -1], 1), ValueError, "negative-dilation", r"expected dilation to be positive, got dilation=\[1, -1\]"),
        ((x, w, None, ones, [-1, 0], ones, 1), ValueError, "negative-padding", r"expected padding to be non-negative, got padding=\[-1, 0\]"),
        ((x, w, None, [1, 1, 1], zeros, ones, 1), ValueError, "3-stride", r"expected stride to have 2 elements"),
        ((x, w, None, ones, zeros, ones, 0), ValueError, "zero-groups", r"expected groups to be positive, got groups=0"),
        ((x, w.double(), None, ones, zeros, ones, 1), RuntimeError, "dtype-mismatch",
         r"weight and input to have the same dtype, got weight\.dtype=torch\.float64 and input\.dtype=torch\.float32"),
        ((x.long(), w.long(), None, ones, zeros, ones, 1), RuntimeError, "integer",
         r"expected input to have a floating-point dtype, got torch\.int64"),
        ((x, w, torch.randn(5, **f32), ones, zeros, ones, 1), RuntimeError, "bias-size",
         r"expected bias of size \[6\] \(out_channels\), got bias of size \[5\]"),
        ((torch.randn(1, 4, 2, 6, **f32), w, None, ones, zeros, ones, 1), RuntimeError, "kernel-too-big",
         r"input height with padding \(2 \+ 2\*0\) is smaller than the dilated kernel height \(3\)"),
    )
    for args, error_type, name, match in cases:
        yield ErrorInput(SampleInput(args, name), error_type, match)


def _draw_window(draw: Draw) -> tuple:
    """A random sliding window: kernel 1-4, stride 1-3, padding 0-2, dilation 1-2 per axis,
    and an input (H, W) of the smallest valid size plus a random margin, so every drawn
    case is a valid call."""
    kernel = [draw(1, 4), draw(1, 4)]
    stride, padding, dilation = [draw(1, 3), draw(1, 3)], [draw(0, 2), draw(0, 2)], [draw(1, 2), draw(1, 2)]
    size = [max(1, dilation[a] * (kernel[a] - 1) + 1 - 2 * padding[a]) + draw(0, 6) for a in (0, 1)]
    return kernel, stride, padding, dilation, size


def _conv2d_random(draw: Draw, device: str, dtype: torch.dtype, requires_grad: bool) -> SampleInput:
    groups = draw(1, 3)
    channels, out_channels = groups * draw(1, 3), groups * draw(1, 3)
    kernel, stride, padding, dilation, size = _draw_window(draw)
    batch_shape = [] if draw(0, 4) == 0 else [draw(0, 3)]
    layout = LAYOUTS[draw(0, 3)] if batch_shape else LAYOUTS[draw(0, 2)]
    input = make((*batch_shape, channels, *size), device, dtype, requires_grad, layout)
    weight = make((out_channels, channels // groups, *kernel), device, dtype, requires_grad, LAYOUTS[draw(0, 3)])
    bias = make((out_channels,), device, dtype, requires_grad) if draw(0, 1) else None
    name = f"random-{list(input.shape)}-k{kernel}-s{stride}-p{padding}-d{dilation}-g{groups}"
    return SampleInput((input, weight, bias, stride, padding, dilation, groups), name)


register(
    OpSpec(
        name="conv2d",
        op=torch.ops.oplib.conv2d.default,
        reference=_conv2d_reference,
        torch_equivalent=F.conv2d,
        autocast_policy={"cpu": "lower_precision", "cuda": "lower_precision"},
        sample_inputs=_conv2d_samples,
        error_inputs=_conv2d_errors,
        random_sample=_conv2d_random,
        dtypes={"cpu": FLOAT_DTYPES, "cuda": FLOAT_DTYPES},
    )
)


def cast_sample(sample: SampleInput, dtype: torch.dtype, requires_grad: Optional[bool] = None) -> SampleInput:
    """The same call with every floating tensor cast to ``dtype`` (strides kept)."""

    def cast(value: Any):
        if isinstance(value, Tensor) and value.is_floating_point():
            grad = value.requires_grad if requires_grad is None else requires_grad
            return value.detach().to(dtype).requires_grad_(grad)
        return value

    return SampleInput(tuple(cast(a) for a in sample.args), sample.name)


# ---------------------------------------------------------------------------------------
# involution and its backward ops
# ---------------------------------------------------------------------------------------


def _involution_reference(input, weight, stride, padding, dilation) -> Tensor:
    """The unfold formulation of the paper's reference code: every output pixel's K*K
    neighbourhood, weighted by that pixel's kernel."""
    n, channels = input.shape[:2]
    _, groups, kh, kw, out_h, out_w = weight.shape
    columns = F.unfold(input, (kh, kw), dilation=dilation, padding=padding, stride=stride)
    columns = columns.view(n, groups, channels // groups, kh * kw, out_h, out_w)
    return (columns * weight.view(n, groups, 1, kh * kw, out_h, out_w)).sum(3).view(n, channels, out_h, out_w)


def _involution_backward_input_reference(grad_output, weight, input_size, stride, padding, dilation) -> Tensor:
    """The vector-Jacobian product of the reference with respect to its input."""
    n, channels = grad_output.shape[:2]
    with torch.enable_grad():
        input = grad_output.new_zeros((n, channels, *input_size), requires_grad=True)
        out = _involution_reference(input, weight, stride, padding, dilation)
        (grad,) = torch.autograd.grad(out, input, grad_output, create_graph=True)
    return grad


def _involution_backward_weight_reference(grad_output, input, kernel_size, stride, padding, dilation, groups):
    """The vector-Jacobian product of the reference with respect to its weight."""
    n, _, out_h, out_w = grad_output.shape
    with torch.enable_grad():
        weight = input.new_zeros((n, groups, *kernel_size, out_h, out_w), requires_grad=True)
        out = _involution_reference(input, weight, stride, padding, dilation)
        (grad,) = torch.autograd.grad(out, weight, grad_output, create_graph=True)
    return grad


# (name, (N, C, H, W), groups, kernel, stride, padding, dilation, input layout, weight layout)
_INVOLUTION_CASES = (
    ("3x3-g2", (2, 4, 9, 8), 2, (3, 3), [1, 1], [1, 1], [1, 1], "contiguous", "contiguous"),
    ("rect-kernel-hw-params", (2, 4, 9, 8), 1, (3, 2), [2, 1], [1, 0], [1, 2], "contiguous", "contiguous"),
    ("stride2-odd-size-g=c", (1, 4, 7, 7), 4, (3, 3), [2, 2], [1, 1], [1, 1], "contiguous", "contiguous"),
    ("dilation2", (1, 2, 8, 8), 1, (3, 3), [1, 1], [2, 2], [2, 2], "contiguous", "contiguous"),
    ("stride3-wide-kernel", (2, 6, 10, 11), 3, (2, 4), [3, 2], [2, 1], [1, 1], "contiguous", "contiguous"),
    ("empty-batch", (0, 4, 6, 6), 2, (3, 3), [1, 1], [1, 1], [1, 1], "contiguous", "contiguous"),
    ("channels_last", (2, 4, 6, 5), 2, (3, 3), [1, 1], [1, 1], [1, 1], "channels_last", "noncontiguous"),
    ("transposed", (1, 4, 6, 7), 1, (3, 3), [2, 1], [1, 1], [1, 1], "transposed", "contiguous"),
)


def _involution_case_tensors(case, device, dtype, requires_grad):
    _, (n, channels, height, width), groups, kernel, stride, padding, dilation, layout, w_layout = case
    out_size = [
        (size + 2 * padding[a] - dilation[a] * (kernel[a] - 1) - 1) // stride[a] + 1
        for a, size in enumerate((height, width))
    ]
    input = make((n, channels, height, width), device, dtype, requires_grad, layout)
    weight = make((n, groups, *kernel, *out_size), device, dtype, requires_grad, w_layout)
    grad_output = make((n, channels, *out_size), device, dtype, requires_grad, layout)
    return input, weight, grad_output


def _involution_samples(device, dtype, requires_grad) -> Iterator[SampleInput]:
    for case in _INVOLUTION_CASES:
        input, weight, _ = _involution_case_tensors(case, device, dtype, requires_grad)
        yield SampleInput((input, weight, *case[4:7]), case[0])


def _involution_backward_input_samples(device, dtype, requires_grad) -> Iterator[SampleInput]:
    for case in _INVOLUTION_CASES:
        input, weight, grad_output = _involution_case_tensors(case, device, dtype, requires_grad)
        yield SampleInput((grad_output, weight, list(input.shape[2:]), *case[4:7]), case[0])


def _involution_backward_weight_samples(device, dtype, requires_grad) -> Iterator[SampleInput]:
    for case in _INVOLUTION_CASES:
        input, weight, grad_output = _involution_case_tensors(case, device, dtype, requires_grad)
        yield SampleInput((grad_output, input, list(case[3]), *case[4:7], case[2]), case[0])


def _random_involution_case(draw: Draw) -> tuple:
    groups = draw(1, 3)
    kernel, stride, padding, dilation, size = _draw_window(draw)
    shape = (draw(0, 3), groups * draw(1, 3), *size)
    return ("random", shape, groups, kernel, stride, padding, dilation, LAYOUTS[draw(0, 3)], LAYOUTS[draw(0, 2)])


def _random_name(case) -> str:
    return f"random-{list(case[1])}-g{case[2]}-k{list(case[3])}-s{case[4]}-p{case[5]}-d{case[6]}"


def _involution_random(draw, device, dtype, requires_grad) -> SampleInput:
    case = _random_involution_case(draw)
    input, weight, _ = _involution_case_tensors(case, device, dtype, requires_grad)
    return SampleInput((input, weight, *case[4:7]), _random_name(case))


def _involution_backward_input_random(draw, device, dtype, requires_grad) -> SampleInput:
    case = _random_involution_case(draw)
    input, weight, grad_output = _involution_case_tensors(case, device, dtype, requires_grad)
    return SampleInput((grad_output, weight, list(input.shape[2:]), *case[4:7]), _random_name(case))


def _involution_backward_weight_random(draw, device, dtype, requires_grad) -> SampleInput:
    case = _random_involution_case(draw)
    input, weight, grad_output = _involution_case_tensors(case, device, dtype, requires_grad)
    return SampleInput((grad_output, input, list(case[3]), *case[4:7], case[2]), _random_name(case))


def _involution_errors(device: str) -> Iterator[ErrorInput]:
    f32 = dict(device=device, dtype=torch.float32)
    x = torch.randn(2, 4, 7, 7, **f32)
    w = torch.randn(2, 2, 3, 3, 7, 7, **f32)
    same = ([1, 1], [1, 1], [1, 1])
    cases = (
        ((torch.randn(4, 7, 7, **f32), w, *same), RuntimeError, "3d-input",
         r"expected input to be 4-D \(N, C, H, W\), got a 3-D tensor of size \[4, 7, 7\]"),
        ((x, torch.randn(2, 2, 9, 7, 7, **f32), *same), RuntimeError, "5d-weight",
         r"expected weight to be 6-D \(N, G, KH, KW, Ho, Wo\), got a 5-D tensor of size \[2, 2, 9, 7, 7\]"),
        ((x, torch.randn(3, 2, 3, 3, 7, 7, **f32), *same), RuntimeError, "batch-mismatch",
         r"weight's batch size to equal input's, got input of size \[2, 4, 7, 7\] and weight of size \[3, 2, 3, 3, 7, 7\]"),
        ((x, torch.randn(2, 3, 3, 3, 7, 7, **f32), *same), RuntimeError, "groups-divide",
         r"input channels \(4\) to be divisible by the groups of weight \(3\)"),
        ((x, w, [2, 2], [1, 1], [1, 1]), RuntimeError, "output-size",
         r"expected weight's output size \(Ho, Wo\) to be \(4, 4\), .* got \(7, 7\)"),
        ((x, w.double(), *same), RuntimeError, "dtype-mismatch",
         r"weight and input to have the same dtype, got weight\.dtype=torch\.float64 and input\.dtype=torch\.float32"),
        ((x.long(), w.long(), *same), RuntimeError, "integer", r"expected input to have a floating-point dtype, got torch\.int64"),
        ((x, w, [0, 1], [1, 1], [1, 1]), ValueError, "zero-stride", r"expected stride to be positive, got stride=\[0, 1\]"),
        ((x, w, [1, 1], [1, 1], [1, 0]), ValueError, "zero-dilation", r"expected dilation to be positive, got dilation=\[1, 0\]"),
        ((x, w, [1, 1], [-1, 1], [1, 1]), ValueError, "negative-padding", r"expected padding to be non-negative, got padding=\[-1, 1\]"),
        ((x, torch.randn(2, 2, 0, 3, 10, 7, **f32), *same), RuntimeError, "zero-kernel-height",
         r"oplib\.involution: expected weight's kernel size \(KH, KW\) to be positive, got weight of size \[2, 2, 0, 3, 10, 7\]"),
        ((x, torch.randn(2, 2, 3, 0, 7, 10, **f32), *same), RuntimeError, "zero-kernel-width",
         r"expected weight's kernel size \(KH, KW\) to be positive, got weight of size \[2, 2, 3, 0, 7, 10\]"),
    )
    for args, error_type, name, match in cases:
        yield ErrorInput(SampleInput(args, name), error_type, match)


def _involution_backward_input_errors(device: str) -> Iterator[ErrorInput]:
    f32 = dict(device=device, dtype=torch.float32)
    g = torch.randn(2, 4, 7, 7, **f32)
    w = torch.randn(2, 2, 3, 3, 7, 7, **f32)
    same = ([1, 1], [1, 1], [1, 1])
    cases = (
        ((g, w, [8, 7], *same), RuntimeError, "input-size",
         r"expected grad_output and weight to have the output size \[8, 7\] of input size \[8, 7\]"),
        ((g, w, [7], *same), ValueError, "input-size-length", r"expected input_size to be \(H, W\), got \[7\]"),
        ((g, torch.randn(2, 3, 3, 3, 7, 7, **f32), [7, 7], *same), RuntimeError, "groups-divide",
         r"G dividing its channels, got grad_output of size \[2, 4, 7, 7\] and weight of size \[2, 3, 3, 3, 7, 7\]"),
        ((g.long(), w.long(), [7, 7], *same), RuntimeError, "integer",
         r"expected grad_output to have a floating-point dtype, got torch\.int64"),
        ((g, torch.randn(2, 2, 0, 3, 7, 7, **f32), [4, 7], *same), RuntimeError, "zero-kernel-height",
         r"oplib\.involution_backward_input: expected weight's kernel size \(KH, KW\) to be positive"),
    )
    for args, error_type, name, match in cases:
        yield ErrorInput(SampleInput(args, name), error_type, match)


def _involution_backward_weight_errors(device: str) -> Iterator[ErrorInput]:
    f32 = dict(device=device, dtype=torch.float32)
    g = torch.randn(2, 4, 7, 7, **f32)
    x = torch.randn(2, 4, 7, 7, **f32)
    same = ([1, 1], [1, 1], [1, 1])
    cases = (
        ((g, x, [3, 3], *same, 3), RuntimeError, "groups-divide", r"input channels \(4\) to be divisible by groups \(3\)"),
        ((g, x, [3, 3], [2, 2], [1, 1], [1, 1], 2), RuntimeError, "grad-size",
         r"expected grad_output of size \[2, 4, 4, 4\], got \[2, 4, 7, 7\]"),
        ((g, x, [3, 0], *same, 2), ValueError, "kernel-size", r"expected kernel_size to be a positive \(KH, KW\), got \[3, 0\]"),
        ((g, x.double(), [3, 3], *same, 2), RuntimeError, "dtype-mismatch",
         r"input and grad_output to have the same dtype"),
    )
    for args, error_type, name, match in cases:
        yield ErrorInput(SampleInput(args, name), error_type, match)


_INVOLUTION_AUTOCAST = {"cpu": "lower_precision", "cuda": "lower_precision"}

register(
    OpSpec(
        name="involution",
        fast_gradgradcheck=True,
        op=torch.ops.oplib.involution.default,
        reference=_involution_reference,
        sample_inputs=_involution_samples,
        error_inputs=_involution_errors,
        random_sample=_involution_random,
        dtypes={"cpu": FLOAT_DTYPES, "cuda": FLOAT_DTYPES},
        autocast_policy=_INVOLUTION_AUTOCAST,
    )
)
register(
    OpSpec(
        name="involution_backward_input",
        fast_gradgradcheck=True,
        op=torch.ops.oplib.involution_backward_input.default,
        reference=_involution_backward_input_reference,
        sample_inputs=_involution_backward_input_samples,
        error_inputs=_involution_backward_input_errors,
        random_sample=_involution_backward_input_random,
        dtypes={"cpu": FLOAT_DTYPES, "cuda": FLOAT_DTYPES},
        autocast_policy=_INVOLUTION_AUTOCAST,
    )
)
register(
    OpSpec(
        name="involution_backward_weight",
        fast_gradgradcheck=True,
        op=torch.ops.oplib.involution_backward_weight.default,
        reference=_involution_backward_weight_reference,
        sample_inputs=_involution_backward_weight_samples,
        error_inputs=_involution_backward_weight_errors,
        random_sample=_involution_backward_weight_random,
        dtypes={"cpu": FLOAT_DTYPES, "cuda": FLOAT_DTYPES},
        autocast_policy=_INVOLUTION_AUTOCAST,
    )
)
