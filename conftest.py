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
    # The marks (integration, needs_cuda, needs_compiler) and their skips are oplib's pytest
    # plugin's (oplib/testing/plugin.py), loaded through its entry point as in a user's project,
    # or by name (-p oplib.testing.plugin) where the checkout is on the path but not installed.
    if not any(config.pluginmanager.has_plugin(name) for name in ("oplib", "oplib.testing.plugin")):
        raise pytest.UsageError(
            "oplib's pytest plugin is not loaded: install oplib (pip install -e .) so that its pytest11 entry point "
            "exists, or name it: pytest -p oplib.testing.plugin"
        )


@pytest.fixture(autouse=True)
def _seeded_rng():
    """Each test starts from the same seed and leaves the global RNG as it found it."""
    state = torch.get_rng_state()
    torch.manual_seed(0)
    yield
    torch.set_rng_state(state)
