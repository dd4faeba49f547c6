import gc
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


# Tests of minutes each, started first in this order (the slowest of a make test-all's
# --durations here, slowest first), the rest in collection order after them. pytest-xdist's
# worksteal gives each worker a contiguous share of the collection and an idle worker steals
# the back half of the other's queue, so with these at the front one worker starts on them
# while the other works through the short tests, and the run ends on short tests. In
# collection order several came last (tests/project/ and compile_tests/ end the collection)
# and one worker could wait minutes for the other's last test.
STARTED_FIRST = (
    "tests/project/test_gpu_check.py::test_the_dry_run_runs_every_stage_and_writes_its_table",
    "tests/project/test_package.py::test_installed_wheel_runs_the_self_check",
    "compile_tests/deploy/test_deploy.py::test_export_command_writes_a_checked_backbone[aoti]",
    "tests/kernels/cpu/test_involution_native.py::test_generated_checks_of_the_involution_ops_pass_on_the_plain_pytorch_path",
    "compile_tests/ops/test_compile.py::test_rednet_backbone_compiles_once_over_image_sizes",
    "compile_tests/models/test_training.py::test_torchrun_ddp_matches_one_process_over_the_same_global_batches",
    # The clean AddressSanitizer build before the planted ones, which rebuild only what a plant changes.
    "tests/kernels/cpu/test_involution_native.py::test_native_kernels_are_clean_under_address_sanitizer",
    "tests/kernels/cpu/test_involution_native.py::test_address_sanitizer_catches_a_planted_off_by_one_in_the_native_kernels",
)


def _start_rank(item) -> int:
    return next((rank for rank, prefix in enumerate(STARTED_FIRST) if item.nodeid.startswith(prefix)), len(STARTED_FIRST))


def pytest_collection_modifyitems(config, items):
    items.sort(key=_start_rank)  # stable: the collection's order within a rank


def pytest_collection_finish(session):
    # What the collection imported (torch, the test modules: hundreds of thousands of objects)
    # lives to the end: out of the collector's reach, each full collection walks only what the
    # tests made since. Python's collector was 8% of an emulated kernel test's time here.
    gc.freeze()


@pytest.fixture(autouse=True)
def _seeded_rng():
    """Each test starts from the same seed and leaves the global RNG as it found it."""
    state = torch.get_rng_state()
    torch.manual_seed(0)
    yield
    torch.set_rng_state(state)
