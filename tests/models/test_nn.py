"""oplib.nn modules and the oplib.* Python API are drop-in for their torch counterparts."""

import pytest
import torch
import torch.nn.functional as F

import oplib
from oplib.testing.specs.involution import reference as involution_reference

MODULE_PAIRS = [
    (lambda nn: nn.Linear(5, 3), (4, 5)),
    (lambda nn: nn.Linear(5, 3, bias=False), (2, 3, 5)),
    (lambda nn: nn.Conv2d(4, 6, 3, padding=1), (2, 4, 7, 6)),
    (lambda nn: nn.Conv2d(4, 6, (3, 2), stride=(2, 1), padding="valid", dilation=(1, 2), groups=2, bias=False), (2, 4, 9, 8)),
    (lambda nn: nn.Conv2d(4, 6, 4, padding="same", dilation=2), (2, 4, 9, 8)),
    (lambda nn: nn.Conv2d(4, 4, 3, padding=1, padding_mode="reflect", groups=4), (4, 6, 5)),
    (lambda nn: nn.Conv2d(4, 4, 3, padding=(1, 2), padding_mode="circular"), (1, 4, 6, 5)),
]


@pytest.mark.parametrize("make,input_shape", MODULE_PAIRS)
def test_module_matches_torch_and_state_dicts_move_both_ways(make, input_shape):
    torch.manual_seed(1)
    ours = make(oplib.nn)
    torch.manual_seed(1)
    theirs = make(torch.nn)
    # Same initialisation from the same seed, same parameter names.
    assert ours.state_dict().keys() == theirs.state_dict().keys()
    for key, value in theirs.state_dict().items():
        torch.testing.assert_close(ours.state_dict()[key], value, atol=0, rtol=0)
    x = torch.randn(input_shape)
    torch.testing.assert_close(ours(x), theirs(x))
    # A state dict from the other side loads and gives the other side's output.
    theirs.load_state_dict({k: torch.randn_like(v) for k, v in theirs.state_dict().items()})
    ours.load_state_dict(theirs.state_dict())
    torch.testing.assert_close(ours(x), theirs(x))
    fresh = make(torch.nn)
    fresh.load_state_dict(ours.state_dict())
    torch.testing.assert_close(fresh(x), ours(x))


def test_exp_module():
    x = torch.randn(3, 4)
    torch.testing.assert_close(oplib.nn.Exp()(x), torch.exp(x))


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(),
        dict(stride=2, padding=1),
        dict(stride=(2, 1), padding=(0, 2), dilation=(1, 2)),
        dict(padding="valid"),
        dict(padding="same"),
        dict(padding="same", dilation=(2, 1)),
        dict(padding=[1], stride=[2]),
    ],
)
@pytest.mark.parametrize("kernel", [(3, 3), (4, 2), (1, 1)])
def test_conv2d_api_accepts_what_torch_accepts(kwargs, kernel):
    x = torch.randn(2, 4, 9, 8, dtype=torch.float64)
    w = torch.randn(6, 4, *kernel, dtype=torch.float64)
    b = torch.randn(6, dtype=torch.float64)
    torch.testing.assert_close(oplib.conv2d(x, w, b, **kwargs), F.conv2d(x, w, b, **kwargs))


def test_conv2d_api_errors():
    x, w = torch.randn(1, 2, 5, 5), torch.randn(2, 2, 3, 3)
    with pytest.raises(ValueError, match="padding='same' is not supported for strided convolutions"):
        oplib.conv2d(x, w, stride=2, padding="same")
    with pytest.raises(ValueError, match="padding must be an int, a pair, 'valid' or 'same', got 'full'"):
        oplib.conv2d(x, w, padding="full")
    with pytest.raises(ValueError, match="expected stride to be an int or a pair, got"):
        oplib.conv2d(x, w, stride=(1, 1, 1))


def test_linear_api_optional_bias():
    x, w = torch.randn(4, 5), torch.randn(3, 5)
    torch.testing.assert_close(oplib.linear(x, w), F.linear(x, w))


def _cell_means(layer: oplib.nn.Involution2d, x: torch.Tensor, out_h: int, out_w: int) -> torch.Tensor:
    """Pixel by pixel: the mean over the in-image part of the stride x stride cell at each
    output pixel's window centre."""
    source = x.new_zeros(*x.shape[:2], out_h, out_w)
    offsets = [d * (k - 1) // 2 - p for d, k, p in zip(layer.dilation, layer.kernel_size, layer.padding)]
    (sh, sw), (height, width) = layer.stride, x.shape[2:]
    for i in range(out_h):
        for j in range(out_w):
            rows = slice(max(0, offsets[0] + i * sh), max(0, min(height, offsets[0] + (i + 1) * sh)))
            cols = slice(max(0, offsets[1] + j * sw), max(0, min(width, offsets[1] + (j + 1) * sw)))
            cell = x[:, :, rows, cols]
            if cell.numel():
                source[:, :, i, j] = cell.mean((-2, -1))
    return source


def _involution_layer_reference(layer: oplib.nn.Involution2d, x: torch.Tensor) -> torch.Tensor:
    """The layer in plain torch: the same sub-modules' parameters, and the registry's unfold
    reference of the op on the input zero-padded by hand (top and left ``padding``, bottom
    and right ``padding + extra_padding``)."""
    out_h, out_w = layer.output_size(*x.shape[2:])
    source = _cell_means(layer, x, out_h, out_w) if layer.pools else x
    hidden = F.relu(layer.norm(F.conv2d(source, layer.reduce.weight)))
    weight = F.conv2d(hidden, layer.span.weight, layer.span.bias)
    shape = (x.shape[0], layer.groups, *layer.kernel_size, out_h, out_w)
    (top, left), (bottom, right) = layer.padding, layer.extra_padding
    padded = F.pad(x, (left, left + right, top, top + bottom))
    return involution_reference(padded, weight.view(shape), layer.stride, (0, 0), layer.dilation)


@pytest.mark.parametrize(
    "kwargs,size",
    [
        (dict(channels=32, kernel_size=7), (9, 11)),
        (dict(channels=32, kernel_size=7, stride=2), (7, 9)),  # odd sizes at stride 2
        (dict(channels=16, kernel_size=3, stride=2), (8, 8)),
        (dict(channels=16, kernel_size=(3, 5), stride=(2, 1), dilation=(1, 2), group_channels=4), (9, 10)),
        (dict(channels=8, kernel_size=3, padding=0, group_channels=8, reduction_ratio=2), (6, 7)),
        (dict(channels=8, kernel_size=4, stride=2, padding=3, group_channels=4), (7, 8)),
        (dict(channels=8, kernel_size=4, group_channels=2), (5, 6)),  # keeps the size (was 4 x 5)
        (dict(channels=8, kernel_size=(2, 3), dilation=(1, 2), padding="same", group_channels=4), (7, 8)),
        (dict(channels=8, kernel_size=(4, 2), stride=2, dilation=(2, 1), group_channels=4), (7, 9)),  # 4 x 5
        (dict(channels=8, kernel_size=(3, 4), padding="valid", group_channels=4), (6, 7)),
    ],
)
@pytest.mark.parametrize("train", [True, False])
@pytest.mark.parametrize(
    "path",
    [
        dict(fused=True),
        dict(fused=False),
        dict(fused=True, checkpoint_generation=True),
        dict(fused=True, channels_last=True),
    ],
    ids=["fused", "unfused", "fused-generation-checkpointed", "fused-channels_last"],
)
def test_involution2d_matches_plain_torch(kwargs, size, train, path):
    """The layer's output and the gradients of its input and every parameter (reduce, norm,
    span) against plain torch in float64, on each path the layer can take."""
    torch.manual_seed(0)
    path = dict(path)
    channels_last = path.pop("channels_last", False)
    layer = oplib.nn.Involution2d(**kwargs, **path).double().train(train)
    x = torch.randn(3, kwargs["channels"], *size, dtype=torch.float64)
    if channels_last:
        x = x.contiguous(memory_format=torch.channels_last)
    x.requires_grad_()
    out = layer(x)
    expected = _involution_layer_reference(layer, x)
    assert out.shape == (3, kwargs["channels"], *layer.output_size(*size))
    torch.testing.assert_close(out, expected)
    grad = torch.randn_like(out)
    params = [x, *layer.parameters()]
    # the backward (a recomputation where checkpointed) leaves the running statistics alone
    statistics = [b.clone() for b in layer.buffers()]
    grads = torch.autograd.grad(out, params, grad)
    for buffer, before in zip(layer.buffers(), statistics):
        torch.testing.assert_close(buffer, before, rtol=0, atol=0)
    for got, want in zip(grads, torch.autograd.grad(expected, params, grad)):
        torch.testing.assert_close(got, want)


def test_involution2d_takes_each_devices_faster_path_unless_forced(monkeypatch):
    """fused=None (the default) follows oplib.nn.FUSED_BY_DEVICE per call: the fused op on
    CPU, span conv + involution on CUDA (where the fused kernels are slower) and on a device
    type it does not list; fused=True / False force a path."""
    assert oplib.nn.Involution2d(8, 3, group_channels=4).fused is None
    assert oplib.nn.FUSED_BY_DEVICE == {"cpu": True, "cuda": False}
    for fused, expected in ((None, {"cpu": True, "cuda": False, "mps": False}),
                            (True, {"cpu": True, "cuda": True, "mps": True}),
                            (False, {"cpu": False, "cuda": False, "mps": False})):
        layer = oplib.nn.Involution2d(8, 3, group_channels=4, fused=fused)
        assert {device: layer.fused_on(device) for device in expected} == expected
    calls = []
    for name in ("involution", "involution_generated"):
        op = getattr(oplib.functional, name)
        monkeypatch.setattr(oplib.functional, name, lambda *args, _op=op, _name=name, **kwargs: (
            calls.append(_name), _op(*args, **kwargs))[1])
    x = torch.randn(2, 8, 6, 6)
    layer = oplib.nn.Involution2d(8, 3, group_channels=4)
    layer(x)
    monkeypatch.setitem(oplib.nn.FUSED_BY_DEVICE, "cpu", False)
    layer(x)
    layer.fused = True
    layer(x)
    assert calls == ["involution_generated", "involution", "involution_generated"]


def test_involution2d_default_padding_keeps_size_and_rejects_bad_groups():
    layer = oplib.nn.Involution2d(32, kernel_size=7, dilation=2)
    assert layer.padding == (6, 6) and layer.extra_padding == (0, 0) and not layer.pools
    assert layer(torch.randn(2, 32, 13, 10)).shape == (2, 32, 13, 10)
    with pytest.raises(ValueError, match=r"channels \(24\) must be divisible by group_channels \(16\)"):
        oplib.nn.Involution2d(24)


def test_involution_api_accepts_ints():
    x = torch.randn(1, 4, 7, 7, dtype=torch.float64)
    w = torch.randn(1, 2, 3, 3, 4, 4, dtype=torch.float64)
    torch.testing.assert_close(oplib.involution(x, w, 2, 1), torch.ops.oplib.involution(x, w, [2, 2], [1, 1], [1, 1]))


@pytest.mark.parametrize(
    "kwargs,match",
    [
        (dict(channels=16, stride=0), r"expected stride to be positive ints, got stride=0"),
        (dict(channels=16, kernel_size=(3, 0)), r"expected kernel_size to be positive ints, got kernel_size=\(3, 0\)"),
        (dict(channels=16, dilation=-1), r"expected dilation to be positive ints"),
        (dict(channels=16, padding=(1, -1)), r"expected padding to be non-negative ints"),
        (dict(channels=16, group_channels=0), r"expected group_channels to be a positive int, got group_channels=0"),
        (dict(channels=16, reduction_ratio=0), r"expected reduction_ratio to be a positive int, got reduction_ratio=0"),
        (dict(channels=0), r"expected channels to be a positive int, got channels=0"),
    ],
    ids=["stride-0", "kernel-0", "dilation-negative", "padding-negative", "group-channels-0", "reduction-0", "channels-0"],
)
def test_involution2d_rejects_bad_configuration_at_construction(kwargs, match):
    """Before: stride=0, group_channels=0 and reduction_ratio=0 constructed and then raised
    ZeroDivisionError in forward."""
    with pytest.raises(ValueError, match=match):
        oplib.nn.Involution2d(**kwargs)


@pytest.mark.parametrize(
    "shape,match",
    [
        ((16, 9), r"Involution2d: expected input to be 3-D \(C, H, W\) or 4-D \(N, C, H, W\), got a 2-D tensor of size \[16, 9\]"),
        ((1, 1, 16, 9, 9), r"got a 5-D tensor of size \[1, 1, 16, 9, 9\]"),
        ((2, 8, 9, 9), r"Involution2d: expected input with 16 channels, got input of size \[2, 8, 9, 9\]"),
    ],
    ids=["2d", "5d", "channels"],
)
def test_involution2d_rejects_bad_input_shapes(shape, match):
    """Before: 3-D or 5-D input raised "not enough values to unpack"."""
    with pytest.raises(RuntimeError, match=match):
        oplib.nn.Involution2d(16, kernel_size=3)(torch.randn(shape))


def test_involution2d_input_smaller_than_kernel_names_the_sizes():
    """Before: "narrow(): length must be non-negative" from the pooling code."""
    layer = oplib.nn.Involution2d(16, kernel_size=7, padding=0)
    with pytest.raises(RuntimeError, match=r"input height with padding \(5 \+ 2\*0\) is smaller than the dilated kernel height \(7\)"):
        layer(torch.randn(1, 16, 5, 9))
    compiled = torch.compile(layer, fullgraph=True, backend="eager")
    with pytest.raises(Exception, match=r"input height with padding \(H \+ 2\*0\) is smaller than the dilated kernel height \(7\)"):
        compiled(torch.randn(1, 16, 5, 9))


def test_involution2d_accepts_unbatched_input_like_conv2d():
    torch.manual_seed(0)
    layer = oplib.nn.Involution2d(8, kernel_size=3, stride=2, group_channels=4).double().eval()
    x = torch.randn(8, 7, 9, dtype=torch.float64)
    torch.testing.assert_close(layer(x), layer(x.unsqueeze(0)).squeeze(0))


@pytest.mark.parametrize("channels_last", [False, True], ids=["nchw", "channels_last"])
def test_strided_involution2d_keeps_no_input_sized_map_for_its_pooling(channels_last):
    """A strided layer pools its kernel source over disjoint cells; the pooling's backward
    needs no saved input (avg_pool2d's kept a C-channel map at the input's size in every
    strided involution of a training step). The gradients and the forward-mode and
    second-order derivatives through the pooling still match plain torch in float64."""
    torch.manual_seed(0)
    layer = oplib.nn.Involution2d(16, kernel_size=3, stride=2, group_channels=4).double().train()
    x = torch.randn(2, 16, 9, 8, dtype=torch.float64)
    if channels_last:
        x = x.contiguous(memory_format=torch.channels_last)
    x.requires_grad_()
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(tuple(t.shape)) or t, lambda t: t):
        out = layer(x)
    input_sized = [shape for shape in saved if shape[:2] == (2, 16) and shape[2:] != out.shape[2:]]
    assert input_sized in ([], [tuple(x.shape)]), saved  # at most the input itself (the op keeps it)
    expected = _involution_layer_reference(layer, x)
    grad = torch.randn_like(out)
    params = [x, *layer.parameters()]
    for got, want in zip(torch.autograd.grad(out, params, grad), torch.autograd.grad(expected, params, grad)):
        torch.testing.assert_close(got, want)

    source = lambda t: layer._pool(t, *layer.output_size(*t.shape[2:]))  # noqa: E731
    cells = lambda t: _cell_means(layer, t, *layer.output_size(*t.shape[2:]))  # noqa: E731
    probe = x.detach().clone().requires_grad_()
    torch.autograd.gradgradcheck(source, (probe,))
    tangent = torch.randn_like(probe)
    got = torch.func.jvp(source, (probe.detach(),), (tangent,))[1]
    want = torch.func.jvp(cells, (probe.detach(),), (tangent,))[1]
    torch.testing.assert_close(got, want)
    got = torch.func.vmap(source)(probe.detach().unsqueeze(1)).squeeze(1)
    torch.testing.assert_close(got, cells(probe.detach()))


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("kernel,stride,size", [(7, 2, (8, 12)), (3, 3, (12, 6)), (3, (2, 3), (8, 9))],
                         ids=["k7-s2", "k3-s3", "k3-s2x3"])
@pytest.mark.parametrize("channels_last", [False, True], ids=["nchw", "channels_last"])
def test_strided_pooling_of_whole_cells_makes_no_count_map(dtype, kernel, stride, size, channels_last):
    """Eager, where every cell lies inside the image (the default padding at sizes the stride
    divides: RedNet-50's stride-2 layers), the pooling divides each cell's sum by the cell's
    size: the bits the division by the count map gave, without making the map (the ones, their
    padding, their sums, the clamp: four ops a call); forward-mode, second-order and vmapped
    derivatives through it match the cells' means in float64."""
    torch.manual_seed(0)
    layer = oplib.nn.Involution2d(8, kernel_size=kernel, stride=stride, group_channels=4)
    x = torch.randn(2, 8, *size, dtype=dtype)
    if channels_last:
        x = x.contiguous(memory_format=torch.channels_last)
    out_size = layer.output_size(*size)
    assert [o * s for o, s in zip(out_size, layer.stride)] == list(size)  # whole cells, no padding
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as recorded:
        got = layer._pool(x, *out_size)
    ran = {event.key for event in recorded.key_averages()}
    assert not ran & {"aten::new_ones", "aten::clamp", "aten::constant_pad_nd"}, ran
    summed = F.avg_pool2d(x, layer.stride, divisor_override=1)
    count = F.avg_pool2d(x.new_ones((1, 1, *size)), layer.stride, divisor_override=1)
    assert torch.equal(got, summed / count.clamp(min=1))
    if dtype == torch.float64:
        source = lambda t: layer._pool(t, *out_size)  # noqa: E731
        cells = lambda t: _cell_means(layer, t, *out_size)  # noqa: E731
        torch.testing.assert_close(got, cells(x))
        probe = x.detach().clone().requires_grad_()
        torch.autograd.gradgradcheck(source, (probe,))
        tangent = torch.randn_like(probe)
        torch.testing.assert_close(torch.func.jvp(source, (x,), (tangent,))[1], torch.func.jvp(cells, (x,), (tangent,))[1])
        torch.testing.assert_close(torch.func.vmap(source)(x.unsqueeze(1)).squeeze(1), cells(x))


@pytest.mark.parametrize("padding", [None, "same"], ids=["default", "same"])
@pytest.mark.parametrize("dilation", [1, 2])
@pytest.mark.filterwarnings("ignore:Using padding='same' with even kernel lengths")
@pytest.mark.parametrize("kernel", [2, 4, (2, 3), (3, 3)], ids=["k2", "k4", "k2x3", "k3"])
@pytest.mark.parametrize("size", [(8, 8), (7, 6)], ids=["8x8", "7x6"])
@pytest.mark.parametrize("fused", [True, False], ids=["fused", "unfused"])
def test_involution2d_even_kernel_keeps_the_size_as_torch_same_conv(fused, size, kernel, dilation, padding):
    """Before: Involution2d(16, 4) mapped 8 x 8 to 7 x 7 at stride 1 (padding (K - 1) // 2 on
    each side), and padding="same" was refused. Now the output keeps the input's size for
    even kernels too, padded as torch's padding="same": with one kernel for every pixel (span
    weight 0, bias = the kernel) the layer is a depthwise conv, and it equals torch's
    conv2d(padding="same"); with generated kernels it matches the plain-torch layer in float64,
    forward and gradients."""
    torch.manual_seed(0)
    layer = oplib.nn.Involution2d(8, kernel, dilation=dilation, padding=padding, group_channels=4, fused=fused)
    layer = layer.double()
    x = torch.randn(2, 8, *size, dtype=torch.float64, requires_grad=True)
    out = layer(x)
    assert out.shape == x.shape
    assert not layer.pools  # stride 1, size kept: output pixel (i, j) generates from input pixel (i, j)
    expected = _involution_layer_reference(layer, x)
    torch.testing.assert_close(out, expected)
    grad = torch.randn_like(out)
    params = [x, *layer.parameters()]
    for got, want in zip(torch.autograd.grad(out, params, grad), torch.autograd.grad(expected, params, grad)):
        torch.testing.assert_close(got, want)

    with torch.no_grad():
        layer.span.weight.zero_()
        kernels = layer.span.bias.view(layer.groups, 1, *layer.kernel_size)
        depthwise = kernels.repeat_interleave(8 // layer.groups, dim=0)  # (C, 1, KH, KW), shared in a group
        want = F.conv2d(x, depthwise, padding="same", dilation=dilation, groups=8)
        torch.testing.assert_close(layer(x), want)


@pytest.mark.parametrize("fused", [True, False], ids=["fused", "unfused"])
def test_involution2d_even_kernel_gradcheck(fused):
    """Finite differences in float64 through the extra bottom/right padding, for the input and
    the span conv's weight (the generated kernels), on a tiny input."""
    torch.manual_seed(0)
    layer = oplib.nn.Involution2d(4, (2, 3), dilation=(1, 2), group_channels=2, reduction_ratio=2, fused=fused)
    layer = layer.double().eval()
    assert layer.extra_padding == (1, 0)
    x = torch.randn(1, 4, 4, 5, dtype=torch.float64, requires_grad=True)
    span = layer.span.weight.detach().clone().requires_grad_()

    def run(x, span):
        return torch.func.functional_call(layer, {"span.weight": span}, (x,))

    assert run(x, span).shape == x.shape
    torch.autograd.gradcheck(run, (x, span))


def test_involution2d_default_padding_gives_ceil_size_at_every_stride():
    """The default is torch's "same" padding at any stride: Ho = ceil(H / s) for odd and even
    kernels (an even kernel at stride 2 gave floor(H / 2) rows before), and at stride 1 the
    sizes of torch's conv2d(padding="same")."""
    for kernel in (1, 2, 3, 4, 5):
        for stride in (1, 2, 3):
            for dilation in (1, 2):
                layer = oplib.nn.Involution2d(4, kernel, stride, dilation=dilation, group_channels=4)
                for height, width in ((5, 6), (7, 9), (8, 8)):
                    assert layer.output_size(height, width) == (-(-height // stride), -(-width // stride))
    layer = oplib.nn.Involution2d(4, (4, 2), 2, group_channels=4).eval()
    assert layer(torch.randn(1, 4, 7, 9)).shape == (1, 4, 4, 5)


def test_involution2d_valid_padding_is_zero_padding():
    torch.manual_seed(0)
    valid = oplib.nn.Involution2d(8, 4, padding="valid", group_channels=4).eval()
    torch.manual_seed(0)
    zero = oplib.nn.Involution2d(8, 4, padding=0, group_channels=4).eval()
    assert (valid.padding, valid.extra_padding) == (zero.padding, zero.extra_padding) == ((0, 0), (0, 0))
    assert repr(valid) == repr(zero)
    x = torch.randn(2, 8, 9, 7)
    torch.testing.assert_close(valid(x), zero(x), rtol=0, atol=0)
    assert valid(x).shape == (2, 8, 6, 4)


def test_involution2d_padding_errors():
    with pytest.raises(ValueError, match=r"Involution2d: padding='same' is not supported for strided involutions, got stride=\(2, 2\)"):
        oplib.nn.Involution2d(16, 3, stride=2, padding="same")
    with pytest.raises(ValueError, match=r"Involution2d: padding must be an int, a pair, 'valid' or 'same', got 'full'"):
        oplib.nn.Involution2d(16, 3, padding="full")
    with pytest.raises(ValueError, match=r"Involution2d: padding must be an int, a pair, 'valid' or 'same', got 'SAME'"):
        oplib.nn.Involution2d(16, 3, padding="SAME")


def test_involution2d_even_kernel_traces_with_dynamic_sizes():
    """The extra bottom/right padding is decided by the configuration, never by the input
    size: torch.compile(fullgraph=True, dynamic=True) and torch.export with a dynamic batch
    and size keep the output at the input's size (inductor, and the ONNX export of
    docs/deploying.md, are exercised by compile_tests/ and tests/deploy/)."""
    torch.manual_seed(0)
    layer = oplib.nn.Involution2d(8, (4, 2), dilation=(1, 3), group_channels=4).double().eval()
    compiled = torch.compile(layer, fullgraph=True, dynamic=True, backend="aot_eager")
    dims = {"input": {0: torch.export.Dim("batch", max=64), 2: torch.export.Dim("height", min=4, max=128),
                      3: torch.export.Dim("width", min=4, max=128)}}
    exported = torch.export.export(layer, (torch.randn(2, 8, 10, 10, dtype=torch.float64),), dynamic_shapes=dims)
    for shape in [(2, 8, 9, 8), (1, 8, 12, 7), (3, 8, 5, 16)]:
        x = torch.randn(shape, dtype=torch.float64)
        expected = layer(x)
        assert expected.shape == x.shape
        torch.testing.assert_close(compiled(x), expected)
        torch.testing.assert_close(exported.module()(x), expected)
