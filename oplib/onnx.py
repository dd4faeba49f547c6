"""Export oplib models to standard ONNX, which ONNX Runtime, TensorRT, OpenVINO and browsers run.

    import oplib.onnx
    oplib.onnx.export(model, (x,), "model.onnx", dynamic_shapes=...)   # checked, optionally in ONNX Runtime

``translation_table()`` maps every oplib op to an ONNX translation written with standard ONNX
operators only (opset 18; no custom domain, which would run nowhere), for
``torch.onnx.export(..., dynamo=True, custom_translation_table=...)``. The ops' non-tensor
arguments (stride, padding, ...) arrive as Python values. It also replaces torch.onnx's
translation of aten's avg_pool2d, which drops ``divisor_override`` (``Involution2d`` at
stride 2 uses it).

Involution (and its two backward ops) is written as ``K*K`` shifted, strided slices of one padded
input, each multiplied by its tap of the weight and accumulated: exact for any stride,
padding, dilation, groups and non-square kernel, with memory that does not grow with ``K*K``. The
backward ops can appear in an inference graph when a model calls them directly (a
transposed involution, for one), so they are translated too.

Needs the ``onnx`` extra (onnx, onnxscript, onnxruntime): ``pip install 'torch-oplib[onnx]'``.
``import oplib`` does not import this module.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from typing import Any, Optional

import torch

from ._extras import require
from ._torch_private import OpOverload


OPSET = 18


_PURPOSE = "ONNX export (oplib.onnx)"


def _opset():
    return require("onnxscript", "onnx", _PURPOSE).opset18


def _ints(values: Sequence[int]):
    return _opset().Constant(value_ints=[int(v) for v in values])


def _static(value, axis: int, what: str) -> int:
    """The static size of ``value``'s dim ``axis`` (an ONNX IR value's shape), else a clear error."""
    dim = value.shape[axis] if value.shape is not None else None
    if not isinstance(dim, int):
        raise ValueError(f"oplib.onnx: {what} must have a static size along dim {axis} to be exported, got {dim}")
    return dim


# ---------------------------------------------------------------------------------------
# Translations
# ---------------------------------------------------------------------------------------


def _exp(x):
    return _opset().Exp(x)


def _linear(input, weight, bias):
    op = _opset()
    out = op.MatMul(input, op.Transpose(weight, perm=[1, 0]))  # (*, in) @ (in, out)
    return out if bias is None else op.Add(out, bias)


def _conv2d(input, weight, bias, stride, padding, dilation, groups):
    op = _opset()
    unbatched = len(input.shape) == 3
    x = op.Unsqueeze(input, _ints([0])) if unbatched else input
    args = (x, weight) if bias is None else (x, weight, bias)
    out = op.Conv(
        *args,
        strides=list(stride),
        pads=[padding[0], padding[1], padding[0], padding[1]],
        dilations=list(dilation),
        group=int(groups),
    )
    return op.Squeeze(out, _ints([0])) if unbatched else out


def _grouped(x, groups: int):
    """(N, C, H, W) -> (N, G, C/G, H, W), sizes taken at run time (no -1 in the target: N may be 0)."""
    op = _opset()
    shape = op.Shape(x)
    group_channels = op.Div(op.Slice(shape, _ints([1]), _ints([2])), _ints([groups]))
    target = op.Concat(
        op.Slice(shape, _ints([0]), _ints([1])), _ints([groups]), group_channels, op.Slice(shape, _ints([2]), _ints([4])), axis=0
    )
    return op.Reshape(x, target)


def _padded(x, padding):
    return _opset().Pad(x, _ints([0, 0, padding[0], padding[1], 0, 0, padding[0], padding[1]]))


def _taps(padded_grouped, out_size, kernel, stride, dilation):
    """For each tap (a, b): the (N, G, C/G, Ho, Wo) slice of the padded, grouped input that it
    reads, rows a*dh + i*sh and columns b*dw + j*sw. ``out_size`` is the 1-D tensor [Ho, Wo]."""
    op = _opset()
    # Each slice spans (Ho - 1) * sh + 1 rows (and likewise columns) from its start.
    span = op.Add(op.Mul(op.Sub(out_size, _ints([1, 1])), _ints(stride)), _ints([1, 1]))
    for a in range(kernel[0]):
        for b in range(kernel[1]):
            starts = _ints([a * dilation[0], b * dilation[1]])
            yield a, b, op.Slice(padded_grouped, starts, op.Add(starts, span), _ints([3, 4]), _ints(stride))


def _weight_tap(weight, a: int, b: int):
    """(N, G, KH, KW, Ho, Wo) -> tap (a, b) as (N, G, 1, Ho, Wo), broadcast over a group's channels."""
    op = _opset()
    tap = op.Gather(op.Gather(weight, op.Constant(value_int=a), axis=2), op.Constant(value_int=b), axis=2)
    return op.Unsqueeze(tap, _ints([2]))


def _involution(input, weight, stride, padding, dilation):
    groups = _static(weight, 1, "involution's weight (N, G, KH, KW, Ho, Wo)")
    kernel = (_static(weight, 2, "involution's weight"), _static(weight, 3, "involution's weight"))
    return _aggregate(input, weight, groups, kernel, stride, padding, dilation)


def _aggregate(input, weight, groups: int, kernel: Sequence[int], stride, padding, dilation):
    """involution's forward with the weight's groups and kernel size given."""
    op = _opset()
    out_size = op.Slice(op.Shape(weight), _ints([4]), _ints([6]))
    source = _grouped(_padded(input, padding), groups)
    out = None
    for a, b, tap in _taps(source, out_size, kernel, stride, dilation):
        term = op.Mul(tap, _weight_tap(weight, a, b))
        out = term if out is None else op.Add(out, term)
    batch_and_channels = op.Slice(op.Shape(input), _ints([0]), _ints([2]))
    return op.Reshape(out, op.Concat(batch_and_channels, out_size, axis=0))


def _involution_backward_weight(grad_output, input, kernel_size, stride, padding, dilation, groups):
    op = _opset()
    out_size = op.Slice(op.Shape(grad_output), _ints([2]), _ints([4]))
    source = _grouped(_padded(input, padding), int(groups))
    grad = _grouped(grad_output, int(groups))
    rows = []
    for a, b, tap in _taps(source, out_size, kernel_size, stride, dilation):
        # d out[n, c, i, j] / d weight[n, g, a, b, i, j] = x at tap (a, b), summed over the group's channels
        tap_grad = op.ReduceSum(op.Mul(tap, grad), _ints([2]), keepdims=1)  # (N, G, 1, Ho, Wo)
        if b == 0:
            rows.append([])
        rows[-1].append(tap_grad)
    per_row = [op.Unsqueeze(op.Concat(*row, axis=2), _ints([2])) for row in rows]  # (N, G, 1, KW, Ho, Wo)
    return op.Concat(*per_row, axis=2)


def _involution_backward_input(grad_output, weight, input_size, stride, padding, dilation):
    groups = _static(weight, 1, "involution_backward_input's weight")
    kernel = (_static(weight, 2, "involution_backward_input's weight"), _static(weight, 3, "involution_backward_input's weight"))
    return _scatter(grad_output, weight, groups, kernel, input_size, stride, padding, dilation)


def _scatter(grad_output, weight, groups: int, kernel: Sequence[int], input_size, stride, padding, dilation):
    """involution's grad_input with the weight's groups and kernel size given. Each tap's grad_output * weight, spread back to the rows and columns it read: dilated by
    the stride (zeros between), cropped to the padded image, shifted to the tap's offset by
    padding; summed over taps, then the padding cut away."""
    op = _opset()
    grad = _grouped(grad_output, groups)  # (N, G, C/G, Ho, Wo)
    grad_shape = op.Shape(grad)
    out_size = op.Slice(grad_shape, _ints([3]), _ints([5]))
    padded_size = op.Add(_ints(input_size), _ints([2 * padding[0], 2 * padding[1]]))
    sh, sw = stride
    total = None
    for a in range(kernel[0]):
        for b in range(kernel[1]):
            spread = op.Mul(grad, _weight_tap(weight, a, b))
            if (sh, sw) != (1, 1):
                # (N, G, C/G, Ho, Wo) -> (N, G, C/G, Ho*sh, Wo*sw), the values at multiples of the stride
                expanded = op.Unsqueeze(op.Unsqueeze(spread, _ints([4])), _ints([6]))
                expanded = op.Pad(expanded, _ints([0] * 7 + [0, 0, 0, 0, sh - 1, 0, sw - 1]))
                size = op.Mul(out_size, _ints(stride))
                spread = op.Reshape(expanded, op.Concat(op.Slice(grad_shape, _ints([0]), _ints([3])), size, axis=0))
            offset = _ints([a * dilation[0], b * dilation[1]])
            room = op.Sub(padded_size, offset)
            spread = op.Slice(spread, _ints([0, 0]), room, _ints([3, 4]))  # the trailing zeros past the image
            kept = op.Slice(op.Shape(spread), _ints([3]), _ints([5]))
            after = op.Sub(room, kept)
            pads = op.Concat(_ints([0, 0, 0]), offset, _ints([0, 0, 0]), after, axis=0)
            spread = op.Pad(spread, pads)  # (N, G, C/G, Hp, Wp)
            total = spread if total is None else op.Add(total, spread)
    ends = op.Add(_ints(padding), _ints(input_size))
    cropped = op.Slice(total, _ints(padding), ends, _ints([3, 4]))
    batch_and_channels = op.Slice(op.Shape(grad_output), _ints([0]), _ints([2]))
    return op.Reshape(cropped, op.Concat(batch_and_channels, _ints(input_size), axis=0))


def _generated_weight(feature, span_weight, span_bias, kernel_size) -> tuple:
    """The span 1x1 conv (an ONNX Conv) of involution_generated: (N, R, Ho, Wo) -> the weight
    (N, G, KH, KW, Ho, Wo), with G."""
    op = _opset()
    groups = _static(span_weight, 0, "involution_generated's span_weight (G*KH*KW, R)") // (kernel_size[0] * kernel_size[1])
    kernel = op.Unsqueeze(span_weight, _ints([2, 3]))
    conv = op.Conv(feature, kernel) if span_bias is None else op.Conv(feature, kernel, span_bias)
    feature_shape = op.Shape(feature)
    shape = op.Concat(op.Slice(feature_shape, _ints([0]), _ints([1])), _ints([groups, *kernel_size]),
                      op.Slice(feature_shape, _ints([2]), _ints([4])), axis=0)
    return op.Reshape(conv, shape), groups


def _involution_generated(input, feature, span_weight, span_bias, kernel_size, stride, padding, dilation):
    weight, groups = _generated_weight(feature, span_weight, span_bias, kernel_size)
    return _aggregate(input, weight, groups, kernel_size, stride, padding, dilation)


def _involution_generated_backward_input(grad_output, feature, span_weight, span_bias, input_size, kernel_size, stride,
                                         padding, dilation):
    weight, groups = _generated_weight(feature, span_weight, span_bias, kernel_size)
    return _scatter(grad_output, weight, groups, kernel_size, input_size, stride, padding, dilation)


def _involution_generated_backward_generator(grad_output, feature, span_weight, input, kernel_size, stride, padding,
                                             dilation):
    """The generated weight's gradient (involution_backward_weight's translation), contracted
    by MatMuls: (grad_feature, grad_span_weight, grad_span_bias)."""
    op = _opset()
    what = "involution_generated_backward_generator's span_weight (G*KH*KW, R)"
    rows, reduced = _static(span_weight, 0, what), _static(span_weight, 1, what)
    groups = rows // (kernel_size[0] * kernel_size[1])
    gw = _involution_backward_weight(grad_output, input, kernel_size, stride, padding, dilation, groups)
    batch = op.Slice(op.Shape(feature), _ints([0]), _ints([1]))
    # The pixels counted, not -1: an empty batch has no size to infer.
    pixels = op.ReduceProd(op.Slice(op.Shape(feature), _ints([2]), _ints([4])), keepdims=1)
    gw = op.Reshape(gw, op.Concat(batch, _ints([rows]), pixels, axis=0))  # (N, G*KH*KW, Ho*Wo)
    f = op.Reshape(feature, op.Concat(batch, _ints([reduced]), pixels, axis=0))  # (N, R, Ho*Wo)
    grad_feature = op.Reshape(op.MatMul(op.Transpose(span_weight, perm=[1, 0]), gw), op.Shape(feature))
    grad_span = op.ReduceSum(op.MatMul(gw, op.Transpose(f, perm=[0, 2, 1])), _ints([0]), keepdims=0)
    grad_bias = op.ReduceSum(gw, _ints([0, 2]), keepdims=0)
    return grad_feature, grad_span, grad_bias


def _pair(values: Sequence[int]) -> list[int]:
    """aten's int[2] argument (one value for both dims, or two) as two ints."""
    values = [int(v) for v in values]
    return values * 2 if len(values) == 1 else values


def _avg_pool2d(input, kernel_size, stride=(), padding=(0, 0), ceil_mode=False, count_include_pad=True, divisor_override=None):
    """aten's avg_pool2d, ``divisor_override`` included: torch.onnx's own translation drops it
    and divides every window's sum by the window's size. ``Involution2d`` pools its kernel
    source with a divisor of 1 and divides by the in-image count clamped to 1, so at odd sizes
    the stride-2 cells partly outside the image (the last row and column) came out halved, the
    corner quartered, and the layer's output there far off."""
    op = _opset()
    kernel, pads = _pair(kernel_size), _pair(padding)
    strides = _pair(stride) if len(stride) else kernel  # aten's default stride: the kernel's size
    unbatched = len(input.shape) == 3
    x = op.Unsqueeze(input, _ints([0])) if unbatched else input
    out = op.AveragePool(
        x, kernel_shape=kernel, strides=strides, pads=pads + pads, ceil_mode=int(ceil_mode),
        count_include_pad=int(count_include_pad),
    )
    if divisor_override is not None:
        if ceil_mode or not (count_include_pad or pads == [0, 0]):
            raise ValueError(
                "oplib.onnx: avg_pool2d with divisor_override exports only without ceil_mode and with "
                "count_include_pad or no padding (every window then holds kernel_size's count)"
            )
        # AveragePool divided each window's sum by KH * KW.
        scale = op.CastLike(op.Constant(value_float=kernel[0] * kernel[1] / int(divisor_override)), out)
        out = op.Mul(out, scale)
    return op.Squeeze(out, _ints([0])) if unbatched else out


# aten ops whose torch.onnx translation is wrong for what oplib's modules call them with.
_ATEN_FIXES: dict[str, Callable[..., Any]] = {
    "aten::avg_pool2d": _avg_pool2d,
}

_TRANSLATIONS: dict[str, Callable[..., Any]] = {
    "oplib::exp": _exp,
    "oplib::linear": _linear,
    "oplib::conv2d": _conv2d,
    "oplib::involution": _involution,
    "oplib::involution_backward_input": _involution_backward_input,
    "oplib::involution_backward_weight": _involution_backward_weight,
    "oplib::involution_generated": _involution_generated,
    "oplib::involution_generated_backward_input": _involution_generated_backward_input,
    "oplib::involution_generated_backward_generator": _involution_generated_backward_generator,
}


def translation_table() -> dict[OpOverload, Callable[..., Any]]:
    """``{torch.ops.oplib.<op>.default: translation}`` for every op of oplib, and aten's
    avg_pool2d (torch.onnx's own translation drops ``divisor_override``), for
    ``torch.onnx.export(..., dynamo=True, custom_translation_table=...)``.

    Only oplib's own ops: an op registered from outside oplib (``oplib.registry.register``)
    brings its own translation through ``export``'s ``custom_translation_table``."""
    return {_overload(qualname): translation for qualname, translation in (_TRANSLATIONS | _ATEN_FIXES).items()}


def _overload(qualname: str) -> OpOverload:
    namespace, name = qualname.split("::")
    try:
        return getattr(getattr(torch.ops, namespace), name).default
    except AttributeError:
        raise RuntimeError(f"oplib.onnx: a translation is registered for {qualname}, which is not a registered op") from None


class UntranslatedOpError(RuntimeError):
    """The program holds a custom op that no ONNX translation covers."""


def _check_translated(program: torch.export.ExportedProgram, table) -> None:
    for node in program.graph.nodes:
        target = node.target
        if node.op != "call_function" or not isinstance(target, OpOverload):
            continue
        if target.namespace in ("aten", "prims") or target in table:
            continue
        raise UntranslatedOpError(
            f"oplib.onnx: {target.name()} has no ONNX translation: oplib.onnx.translation_table() covers "
            f"{', '.join(sorted(str(op) for op in table))}; pass custom_translation_table={{{target}: fn, ...}} "
            "for other custom ops"
        )


def export(
    model: torch.nn.Module,
    args: tuple,
    path: str | os.PathLike,
    dynamic_shapes: Optional[Any] = None,
    check: bool = True,
    rtol: float = 1e-4,
    custom_translation_table: Optional[dict] = None,
    **kwargs: Any,
):
    """Export ``model`` called on ``args`` to an ONNX file at ``path`` (opset 18, standard
    operators) and check it: the ONNX checker, and with ``check`` one run in ONNX Runtime (CPU)
    on ``args`` against eager, within ``rtol`` of each output's largest magnitude. Returns the
    ``torch.onnx.ONNXProgram``. A model returning a list or tuple of tensors (a RedNet
    backbone's maps) gives one ONNX output per tensor, in order; ``output_names=[...]`` names
    them. ``dynamic_shapes`` as for ``torch.export.export``; ``custom_translation_table`` adds
    translations for other custom ops; ``kwargs`` go to ``torch.onnx.export``."""
    onnx = require("onnx", "onnx", _PURPOSE)
    require("onnxscript", "onnx", _PURPOSE)  # torch.onnx.export's dynamo exporter needs it
    if check:
        require("onnxruntime", "onnx", _PURPOSE)

    table = translation_table() | dict(custom_translation_table or {})
    program = torch.export.export(model, args, dynamic_shapes=dynamic_shapes)
    _check_translated(program, table)
    onnx_program = torch.onnx.export(
        program, args, dynamo=True, custom_translation_table=table, opset_version=OPSET, **kwargs
    )
    onnx_program.save(os.fspath(path))
    onnx.checker.check_model(os.fspath(path), full_check=True)
    if check:
        # Not torch.onnx.verification.verify_onnx_program: it runs the in-memory program
        # against the ExportedProgram's module, while this checks the file as written (what a
        # user ships) against the eager model, with a tolerance relative to each output's
        # largest value (its max_rel_diff is element by element, unbounded near zero).
        with torch.no_grad():
            expected = model(*args)
        got = run(path, args)
        expected = expected if isinstance(expected, (tuple, list)) else (expected,)
        for index, (e, g) in enumerate(zip(expected, got, strict=True)):
            scale = float(e.abs().max()) if e.numel() else 0.0
            error = float((g - e).abs().max()) if e.numel() else 0.0
            if error > rtol * max(scale, 1e-30):
                which = f"output {index} of {len(expected)}" if len(expected) > 1 else "the output"
                raise RuntimeError(
                    f"oplib.onnx: ONNX Runtime differs from eager by {error:.3g} in {which} (largest value {scale:.3g})"
                )
    return onnx_program


def run(path: str | os.PathLike, args: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """Run the ONNX file at ``path`` in ONNX Runtime (CPU) on the tensors ``args``."""
    onnxruntime = require("onnxruntime", "onnx", "running an ONNX file (oplib.onnx.run)")
    session = onnxruntime.InferenceSession(os.fspath(path), providers=["CPUExecutionProvider"])
    tensors = [a for a in args if isinstance(a, torch.Tensor)]
    feeds = {i.name: t.detach().cpu().numpy() for i, t in zip(session.get_inputs(), tensors, strict=True)}
    return [torch.from_numpy(out) for out in session.run(None, feeds)]


__all__ = ["OPSET", "UntranslatedOpError", "export", "run", "translation_table"]
