"""Test helpers for the native CPU kernels (``oplib.kernels.native``)."""

from __future__ import annotations

from ..kernels import native


def require_native_build() -> None:
    """Skip the calling test where no compiler or ninja can build the native CPU kernels."""
    import pytest

    missing = native._missing_tool()
    if missing is not None:
        pytest.skip(f"the native CPU kernels cannot be built here: {missing}")


def force_native(monkeypatch) -> None:
    """Route involution's CPU kernels through the native build for the rest of a test (pytest's
    ``monkeypatch`` undoes it), or skip the test where they cannot be built."""
    require_native_build()
    monkeypatch.setenv(native.ENV, "native")
