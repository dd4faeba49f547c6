import importlib.util

import pytest
import torch


def _timm_imports() -> bool:
    try:
        import timm  # noqa: F401
    except Exception:  # absent, or present with a torchvision that does not load beside this torch
        return False
    return True


# oplib/models/_timm.py imports timm at the top (oplib.models imports it only where timm imports):
# the doctest collection of oplib/ leaves it alone where timm does not import.
collect_ignore = [] if importlib.util.find_spec("timm") and _timm_imports() else ["oplib/models/_timm.py"]


def pytest_configure(config):
    # The tests' tensors are tiny: intra-op threads only add synchronisation, and when another
    # process holds a core, every parallel region of a 2-thread pool stalls (a conv2d
    # gradgradcheck took 315 s instead of 17 s). Correctness does not depend on the count.
    torch.set_num_threads(1)
    config.addinivalue_line("markers", "needs_cuda: needs a CUDA GPU; skipped where none is present")
    config.addinivalue_line(
        "markers", "needs_compiler: torch.compile's inductor generates CPU code; skipped where it finds no C++ compiler"
    )
    config.addinivalue_line(
        "markers",
        "integration: the long tier (whole models exported, trained or packaged, wheels built, torchrun, "
        "every sample compiled): run by `make test-all` and CI, left out of `make test`",
    )


def pytest_collection_modifyitems(config, items):
    from oplib.testing.toolchain import missing_inductor_compiler

    skips = {}
    if not torch.cuda.is_available():
        skips["needs_cuda"] = "needs a CUDA GPU; torch.cuda.is_available() is False on this machine"
    if missing_inductor_compiler() is not None:
        skips["needs_compiler"] = missing_inductor_compiler()
    for item in items:
        for marker, reason in skips.items():
            if marker in item.keywords:
                item.add_marker(pytest.mark.skip(reason=reason))


@pytest.fixture(autouse=True)
def _seeded_rng():
    """Each test starts from the same seed and leaves the global RNG as it found it."""
    state = torch.get_rng_state()
    torch.manual_seed(0)
    yield
    torch.set_rng_state(state)
