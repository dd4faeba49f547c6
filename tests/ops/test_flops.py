"""FLOP formulas: every registered op has one, the counts match hand counts, and models
built from oplib count exactly as the same models built from torch.nn."""

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

import oplib
from oplib import registry
from oplib.models import RedNet
from oplib.nn import Involution2d


def _flops(fn) -> int:
    with FlopCounterMode(display=False) as counter:
        fn()
    return counter.get_total_flops()


@pytest.mark.parametrize("spec", registry.all_specs(), ids=lambda spec: spec.name)
def test_every_op_has_a_flop_formula(spec):
    assert spec.has_flop_formula


def test_involution_counts_two_flops_per_tap_in_each_op():
    # N=2, C=6, 5x4 output (stride 2, padding 1 on 9x7), 3x2 kernel: 2 * (2*6*5*4) * (3*2) = 2880 per op.
    x = torch.randn(2, 6, 9, 7, requires_grad=True)
    w = torch.randn(2, 3, 3, 2, 5, 4, requires_grad=True)
    hand = 2 * (2 * 6 * 5 * 4) * (3 * 2)
    assert _flops(lambda: oplib.involution(x, w, 2, 1, 1)) == hand
    assert _flops(lambda: oplib.involution(x, w, 2, 1, 1).sum().backward()) == 3 * hand
    w.requires_grad_(False)
    assert _flops(lambda: oplib.involution(x, w, 2, 1, 1).sum().backward()) == 2 * hand


def test_linear_and_conv2d_hand_counts():
    x = torch.randn(3, 5, 7)
    assert _flops(lambda: oplib.linear(x, torch.randn(11, 7), torch.randn(11))) == 2 * 15 * 7 * 11
    image = torch.randn(2, 4, 10, 10)
    weight = torch.randn(6, 2, 3, 3)  # groups=2, stride 2, padding 1: 5x5 output
    assert _flops(lambda: oplib.conv2d(image, weight, None, 2, 1, 1, 2)) == 2 * 2 * 25 * (6 * 2 * 3 * 3)
    assert _flops(lambda: oplib.conv2d(image[0], weight, None, 2, 1, 1, 2)) == 2 * 25 * (6 * 2 * 3 * 3)
    assert _flops(lambda: oplib.exp(x)) == _flops(lambda: torch.exp(x)) == 0


@pytest.mark.parametrize("backward", [False, True], ids=["forward", "forward+backward"])
def test_dense_modules_count_as_torch_modules(backward):
    def model(conv, linear):
        torch.manual_seed(0)
        return torch.nn.Sequential(conv(3, 8, 3, stride=2, padding=1, groups=1), torch.nn.ReLU(), torch.nn.Flatten(), linear(8 * 5 * 5, 10))

    x = torch.randn(4, 3, 10, 10, requires_grad=True)
    counts = []
    for conv, linear in [(torch.nn.Conv2d, torch.nn.Linear), (oplib.nn.Conv2d, oplib.nn.Linear)]:
        net = model(conv, linear)
        run = (lambda: net(x).sum().backward()) if backward else (lambda: net(x))
        counts.append(_flops(run))
    assert counts[0] == counts[1] > 0


def test_rednet_counts_its_involutions_by_hand():
    net = RedNet((1, 1, 1, 1), num_classes=10, in_channels=1, width=16, group_channels=8).eval()
    hand = []

    def count(module, inputs, output):
        n, _, out_h, out_w = output.shape
        taps = module.kernel_size[0] * module.kernel_size[1]
        # the involution's multiply-adds, then the weight generation's (G*KH*KW weights per
        # pixel, each a sum over the R reduced channels)
        hand.append(2 * output.numel() * taps + 2 * n * out_h * out_w * module.groups * taps * module.span.in_channels)

    for module in net.modules():
        if isinstance(module, Involution2d):
            module.register_forward_hook(count)
    with FlopCounterMode(display=False) as counter:
        net(torch.randn(2, 1, 19, 17))
    assert counter.get_flop_counts()["Global"][torch.ops.oplib.involution_generated] == sum(hand) > 0
