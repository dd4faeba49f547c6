"""oplib's pytest plugin, loaded by pytest wherever oplib is installed (the ``pytest11`` entry
point in pyproject.toml; ``-p no:oplib`` turns it off).

It registers the marks that the tests of ``oplib.testing.generated_tests`` carry, so that a
project using them gets no unknown-mark warning and can select by them (``-m "not
integration"``), and skips the tests a machine cannot run, each with the reason:

- ``integration``: the long tier (every sample compiled and exported, whole models);
- ``needs_cuda``: needs a CUDA GPU;
- ``needs_compiler``: torch.compile's inductor generates C++ for the CPU and finds no compiler.
"""

from __future__ import annotations

MARKS = {
    "integration": "the long tier (whole models exported, trained or packaged, wheels built, torchrun, every sample "
    "compiled): oplib's `make test` leaves it out, `make test-all` runs it",
    "needs_cuda": "needs a CUDA GPU; skipped where none is present",
    "needs_compiler": "torch.compile's inductor generates CPU code; skipped where it finds no C++ compiler",
}


def pytest_configure(config) -> None:
    for name, text in MARKS.items():
        config.addinivalue_line("markers", f"{name}: {text}")


# The marks whose tests a machine may be unable to run (the others only select).
SKIPPING_MARKS = ("needs_cuda", "needs_compiler")


def skip_reasons(marks=SKIPPING_MARKS) -> dict[str, str]:
    """Of ``marks``, those whose tests this machine cannot run, with why. Only the marks asked
    for are probed: inductor's compiler probe imports inductor (3.5 s), which a session whose
    tests need a GPU but no compiler should not pay."""
    reasons = {}
    if "needs_cuda" in marks:
        import torch

        if not torch.cuda.is_available():
            reasons["needs_cuda"] = "needs a CUDA GPU; torch.cuda.is_available() is False on this machine"
    if "needs_compiler" in marks:
        from .toolchain import missing_inductor_compiler

        missing = missing_inductor_compiler()
        if missing is not None:
            reasons["needs_compiler"] = missing
    return reasons


def pytest_collection_modifyitems(config, items) -> None:
    marked = [item for item in items if any(mark in item.keywords for mark in SKIPPING_MARKS)]
    if not marked:
        return
    import pytest

    reasons = skip_reasons([mark for mark in SKIPPING_MARKS if any(mark in item.keywords for item in marked)])
    for item in marked:
        for mark, reason in reasons.items():
            if mark in item.keywords:
                item.add_marker(pytest.mark.skip(reason=reason))
