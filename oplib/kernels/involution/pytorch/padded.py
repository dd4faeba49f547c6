"""The padded formulation: exact for non-finite values, which the strategies hand to it."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from .geometry import Geometry


class PaddedFormulation:
    """Involution as the reference computes it: the input zero-padded, then one pass per tap
    over the window of the padded image it reads. It multiplies every value the reference
    multiplies, a non-finite one by the padding's zeros included, so its nan and inf are the
    reference's; it needs a padded copy of the input and K*K passes over all of it.
    """

    name = "padded"
    drops_padding_taps = False

    def __init__(self, geometry: Geometry):
        self.geometry = geometry

    def forward(self, input: Tensor, weight: Tensor) -> Tensor:
        """input: (N, C, H, W), weight: (N, G, KH, KW, Ho, Wo) -> out: (N, C, Ho, Wo)."""
        n, channels = input.shape[:2]
        groups, kh, kw, out_h, out_w = weight.shape[1:]
        x = self._padded_groups(input, groups)
        out = x.new_zeros(n, groups, channels // groups, out_h, out_w)
        for a in range(kh):
            for b in range(kw):
                out.addcmul_(self._window(x, a, b), weight[:, :, None, a, b])
        return out.view(n, channels, out_h, out_w)

    def backward_input(self, grad_output: Tensor, weight: Tensor) -> Tensor:
        """grad_output: (N, C, Ho, Wo), weight: (N, G, KH, KW, Ho, Wo) -> grad_input: (N, C, H, W)."""
        n, channels, out_h, out_w = grad_output.shape
        groups, kh, kw = weight.shape[1:4]
        (height, width), (ph, pw) = self.geometry.input_size, self.geometry.padding
        g = grad_output.view(n, groups, channels // groups, out_h, out_w)
        grad = g.new_zeros(n, groups, channels // groups, height + 2 * ph, width + 2 * pw)
        for a in range(kh):
            for b in range(kw):
                self._window(grad, a, b).addcmul_(g, weight[:, :, None, a, b])
        return grad[..., ph : ph + height, pw : pw + width].reshape(n, channels, height, width)

    def backward_weight(self, grad_output: Tensor, input: Tensor, groups: int) -> Tensor:
        """grad_output: (N, C, Ho, Wo), input: (N, C, H, W) -> grad_weight: (N, G, KH, KW, Ho, Wo)."""
        n, channels, out_h, out_w = grad_output.shape
        kh, kw = self.geometry.kernel_size
        x = self._padded_groups(input, groups)
        g = grad_output.view(n, groups, channels // groups, out_h, out_w)
        grad = g.new_empty(n, groups, kh, kw, out_h, out_w)
        for a in range(kh):
            for b in range(kw):
                torch.sum(g * self._window(x, a, b), dim=2, out=grad[:, :, a, b])
        return grad

    def _padded_groups(self, input: Tensor, groups: int) -> Tensor:
        """(N, C, H, W) -> (N, G, C/G, H + 2ph, W + 2pw), zero-padded."""
        n, channels, height, width = input.shape
        ph, pw = self.geometry.padding
        return F.pad(input.view(n, groups, channels // groups, height, width), (pw, pw, ph, ph))

    def _window(self, padded: Tensor, a: int, b: int) -> Tensor:
        """The (..., Ho, Wo) view of a padded image (..., H + 2ph, W + 2pw) read by tap (a, b)."""
        (out_h, out_w), (sh, sw), (dh, dw) = self.geometry.output_size, self.geometry.stride, self.geometry.dilation
        return padded[..., a * dh : a * dh + (out_h - 1) * sh + 1 : sh, b * dw : b * dw + (out_w - 1) * sw + 1 : sw]
