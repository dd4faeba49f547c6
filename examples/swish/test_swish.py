"""A custom op written outside oplib, checked through oplib's public path: the generated test
class and the command-line self-check."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from oplib.testing import generated_tests
from swish_spec import SPECS

TestSwish = generated_tests(SPECS)


# The command's whole self-check, compiled rows included, in the integration tier: the unit
# tier runs the generated class above, and tests/cli the check command itself.
@pytest.mark.integration
def test_self_check_of_an_imported_spec():
    result = subprocess.run(
        [sys.executable, "-m", "oplib", "check", "--import", "swish_spec", "--op", "swish", "--device", "cpu"],
        cwd=Path(__file__).parent, capture_output=True, text=True, timeout=600,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "swish" in result.stdout and " 0 failed" in result.stdout, result.stdout
