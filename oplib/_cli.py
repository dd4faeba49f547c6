"""What the commands of ``python -m oplib`` share in parsing their flags."""

from __future__ import annotations

import argparse
from collections.abc import Callable


def positive(kind: type) -> Callable[[str], int | float]:
    """An argparse ``type``: ``kind(text)``, refused with a one-line message unless it is > 0."""

    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a positive {kind.__name__}, got {text!r}") from None
        if not value > 0:
            raise argparse.ArgumentTypeError(f"expected a positive {kind.__name__}, got {text}")
        return value

    parse.__name__ = f"positive {kind.__name__}"
    return parse
