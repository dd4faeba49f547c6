"""oplib.nn modules and the oplib.* Python API are drop-in for their torch counterparts."""

import pytest
import torch
import torch.nn.functional as F

import oplib

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
