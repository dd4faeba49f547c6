"""The op registry: one ``OpSpec`` per op, read by the tests, the benchmarks and the CLI.

    >>> import oplib
    >>> [spec.name for spec in oplib.registry.all_specs()]
    ['conv2d', 'exp', 'involution', 'involution_backward_input', 'involution_backward_weight', 'involution_generated', 'involution_generated_backward_input', 'involution_generated_backward_generator', 'linear']

An ``OpSpec`` is a public contract: it says what the op is (its ``torch.ops`` overload), how
to check it (a plain-torch float64 reference, sample inputs, error inputs, a random-input
builder for property tests) and what it supports (dtypes per device, tolerances). Facts the
op states itself are read from it, not restated: its schema, whether it has a fake, an
autograd and a vmap rule, and its autocast policy (``oplib.ops.register_autocast_policy``).

oplib's own specs live in ``oplib/testing/specs/``, one module per op file, and are imported
the first time the registry is read, so ``import oplib`` loads no test data. Any custom op,
oplib's or not, can be described by the same type and checked by the same generated tests
(``oplib.testing.generated_tests``) and self-check (``python -m oplib check --import``):
see "Adding an op" in the README and docs/adding-an-op.md.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Optional

import torch
from torch import Tensor

from ._torch_private import OpOverload, dispatch_has_kernel_for_dispatch_key, dispatch_key_for_device, maybe_get_opdef

FLOAT_DTYPES = (torch.float64, torch.float32, torch.bfloat16, torch.float16)

# (atol, rtol) against the float64 reference, per dtype of the inputs.
DEFAULT_TOLERANCES: Mapping[torch.dtype, tuple[float, float]] = {
    torch.float64: (1e-10, 1e-7),
    torch.float32: (1e-4, 1e-4),
    torch.bfloat16: (5e-2, 2e-2),
    torch.float16: (5e-3, 5e-3),
}

# ``draw(low, high)`` returns an int in [low, high]; property tests pass a hypothesis
# draw so that failing cases shrink, without oplib importing hypothesis.
Draw = Callable[[int, int], int]

# The modules holding oplib's own specs, imported by the first read of the registry.
BUILTIN_SPEC_MODULES = ("oplib.testing.specs",)


@dataclass(frozen=True)
class SampleInput:
    """Positional arguments of one call of the op, with a name for test ids."""

    args: tuple
    name: str


@dataclass(frozen=True)
class ErrorInput:
    """A call that must raise ``error_type`` with a message matching the regex ``match``
    (``oplib.testing.expect_message`` builds one from the op's own message template)."""

    sample: SampleInput
    error_type: type[Exception]
    match: str


@dataclass(frozen=True)
class OpSpec:
    """How to check one custom op.

    sample_inputs(device, dtype, requires_grad) and error_inputs(device) yield calls;
    random_sample(draw, device, dtype, requires_grad) builds one valid call from ``draw``.
    """

    name: str
    op: OpOverload
    reference: Callable[..., Tensor]
    sample_inputs: Callable[[str, torch.dtype, bool], Iterator[SampleInput]]
    error_inputs: Callable[[str], Iterator[ErrorInput]] = lambda device: iter(())
    random_sample: Optional[Callable[[Draw, str, torch.dtype, bool], SampleInput]] = None
    dtypes: Mapping[str, tuple[torch.dtype, ...]] = field(default_factory=lambda: {"cpu": FLOAT_DTYPES})
    # The torch function whose autocast policy the op follows (called with the same args).
    torch_equivalent: Optional[Callable[..., Tensor]] = None
    tolerances: Mapping[torch.dtype, tuple[float, float]] = field(default_factory=lambda: dict(DEFAULT_TOLERANCES))
    # gradgradcheck builds full second-order Jacobians; fast mode checks random projections
    # of them instead, for ops where the full matrices take minutes.
    fast_gradgradcheck: bool = False
    # gradcheck's tolerance for a backward that differs between two runs on the same inputs
    # (0: bit-identical). Non-zero for ops whose backward uses non-deterministic kernels,
    # as torch's own OpInfos declare it (cuDNN's convolution backward, for one).
    gradcheck_nondet_tol: float = 0.0
    # Autocast policy per device ("lower_precision" or "fp32"), for an op that registers its
    # autocast kernels by other means than oplib.ops.register_autocast_policy; None reads
    # the policies the op declared through that helper.
    declared_autocast_policy: Optional[Mapping[str, str]] = None

    @property
    def qualname(self) -> str:
        return self.op.name().removesuffix(".default")

    @property
    def schema(self) -> str:
        return str(self.op._schema)

    @property
    def devices(self) -> tuple[str, ...]:
        return tuple(self.dtypes)

    @property
    def autocast_policy(self) -> Mapping[str, str]:
        """Device -> "lower_precision" (runs in the autocast dtype) or "fp32" (runs in
        float32); a device absent here passes the op through autocast, dtypes unchanged."""
        if self.declared_autocast_policy is not None:
            return self.declared_autocast_policy
        from .ops._common import AUTOCAST_POLICIES

        return AUTOCAST_POLICIES.get(self.qualname, {})

    def _opdef(self):
        return maybe_get_opdef(self.qualname)

    @property
    def has_fake(self) -> bool:
        return self._opdef()._abstract_fn is not None

    @property
    def has_autograd(self) -> bool:
        return self._opdef()._backward_fn is not None

    @property
    def has_vmap(self) -> bool:
        return self._opdef()._vmap_fn is not None

    @property
    def has_flop_formula(self) -> bool:
        """Whether torch.utils.flop_counter.FlopCounterMode can count the op."""
        from torch.utils.flop_counter import flop_registry

        return self.op.overloadpacket in flop_registry

    def autocast_devices(self) -> tuple[str, ...]:
        """Devices with an autocast kernel; elsewhere autocast passes the op through."""
        return tuple(
            device
            for device in ("cpu", "cuda")
            if dispatch_has_kernel_for_dispatch_key(self.qualname, "Autocast" + dispatch_key_for_device(device))
        )

    def tolerance(self, dtype: torch.dtype) -> tuple[float, float]:
        return self.tolerances[dtype]


_REGISTRY: dict[str, OpSpec] = {}
_builtins_loaded = False


def _load_builtin_specs() -> None:
    global _builtins_loaded
    if not _builtins_loaded:
        _builtins_loaded = True
        for module in BUILTIN_SPEC_MODULES:
            importlib.import_module(module)


def register(spec: OpSpec) -> OpSpec:
    """Add ``spec`` to the registry that ``all_specs`` and the self-check read."""
    if spec.name in _REGISTRY:
        raise ValueError(f"an op named {spec.name!r} is already registered")
    _REGISTRY[spec.name] = spec
    return spec


def all_specs() -> list[OpSpec]:
    _load_builtin_specs()
    return list(_REGISTRY.values())


def get(name: str) -> OpSpec:
    _load_builtin_specs()
    return _REGISTRY[name]


def available_devices() -> list[str]:
    return ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


def cast_sample(sample: SampleInput, dtype: torch.dtype, requires_grad: Optional[bool] = None) -> SampleInput:
    """The same call with every floating tensor cast to ``dtype`` (strides kept)."""

    def cast(value: Any):
        if isinstance(value, Tensor) and value.is_floating_point():
            grad = value.requires_grad if requires_grad is None else requires_grad
            return value.detach().to(dtype).requires_grad_(grad)
        return value

    return SampleInput(tuple(cast(a) for a in sample.args), sample.name)
