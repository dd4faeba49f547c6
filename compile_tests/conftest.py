import pytest
import torch


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    """Each test compiles or exports new functions and models; dynamo's caches (and its
    per-function recompile limit) start empty for each."""
    torch.compiler.reset()
    yield
    torch.compiler.reset()
