"""What differs across the torch releases oplib supports, from the oldest (pyproject.toml's
``dependencies``; ``make test-oldest`` runs the suite on it) to the newest (``make test``).
Each entry names the releases it is for and does nothing on the others.
"""

from __future__ import annotations

import torch

from ._torch_private import meta_registrations


def _floor_div(x, y):
    return x // y


def pooling_sizes_without_parity_guard() -> None:
    """torch < 2.13 (div_rtn reads the same in 2.10, 2.11 and 2.12): the shape function of
    the pooling ops (``max_pool2d``, ``avg_pool2d``) rounds the output size with
    ``torch._meta_registrations.div_rtn``, which asks whether a remainder is zero. With a
    symbolic image size that question becomes a guard on the size's parity, so
    ``torch.export`` with a dynamic height and width (a RedNet's stem pool) fails with
    "Constraints violated". Python's ``//`` already rounds toward minus infinity, so the
    remainder never changes the result: torch 2.13's div_rtn is ``x // y``, and this puts
    that in place on older releases."""
    if torch.__version__ < (2, 13):
        meta_registrations.div_rtn = _floor_div
