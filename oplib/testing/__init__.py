"""Test helpers for oplib's ops and yours: pytest parametrisation over specs, comparison
against the float64 reference (``oplib.testing.helpers``), input builders
(``oplib.testing.inputs``) and the generated test class ``generated_tests``
(``oplib.testing.generated``, imported on first use because it needs pytest, which oplib
does not). This file only hands names on."""

from __future__ import annotations

from .helpers import (  # noqa: F401  (public)
    cpu_and_cuda,
    spec_params,
    spec_dtype_params,
    reference_output,
    assert_matches_reference,
    layout_class,
    representative_samples,
    tensor_args,
    with_batch_norm_statistics,
    OpCall,
)
from .inputs import LAYOUTS, draw_window, expect_message, make  # noqa: F401  (public)


def __getattr__(name: str):
    if name == "generated_tests":
        from .._extras import require

        require("pytest", "testing", "oplib.testing.generated_tests")
        from .generated import generated_tests

        return generated_tests
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
