"""Test helpers for the native CPU kernels (``oplib.kernels.native``)."""

from __future__ import annotations

from ..kernels import native


def force_native(monkeypatch) -> None:
    """Route involution's CPU kernels through the native build for the rest of a test (pytest's
    ``monkeypatch`` undoes it), or skip the test where no compiler or ninja can build them."""
    import pytest

    missing = native._missing_tool()
    if missing is not None:
        pytest.skip(f"the native CPU kernels cannot be built here: {missing}")
    monkeypatch.setenv(native.ENV, "native")
