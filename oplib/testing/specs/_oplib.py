"""What every spec of oplib's own ops shares (specs of other ops build ``OpSpec`` themselves)."""

from __future__ import annotations

import torch

from ...registry import FLOAT_DTYPES, OpSpec, register


def register_oplib_spec(name: str, reference, sample_inputs, error_inputs, random_sample, **fields) -> OpSpec:
    """Register and return the spec of ``oplib::<name>``: its reference and inputs, every float
    dtype on CPU and CUDA (each of oplib's ops runs them all), and ``fields`` (other OpSpec fields)."""
    return register(OpSpec(
        name=name,
        op=getattr(torch.ops.oplib, name).default,
        reference=reference,
        sample_inputs=sample_inputs,
        error_inputs=error_inputs,
        random_sample=random_sample,
        dtypes={"cpu": FLOAT_DTYPES, "cuda": FLOAT_DTYPES},
        **fields,
    ))
