"""Every private torch entry point oplib uses, in one place.

Each may change or vanish in any torch release. oplib's other modules import them from
here, never from torch directly (``tests/project/test_torch_private.py`` checks both: each entry
below resolves on the torch under test, which ``make test`` and ``make test-oldest`` cover,
and no other module of oplib names a private torch symbol). Each entry says why no public
API serves, the releases it was checked on, and what stops working without it.

Symbols that are cheap to import are imported here; those in heavy modules (inductor,
dynamo, fake tensors) resolve on first use through the module's ``__getattr__``.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any

import torch
import torch._meta_registrations as meta_registrations
import torch.autograd.forward_ad as _forward_ad
from torch._C import DispatchKey, DispatchKeySet
from torch._C import _after_autograd_keyset as after_autograd_keyset
from torch._C import _any_requires_grad as any_requires_grad
from torch._C import _dispatch_get_all_op_names as dispatch_get_all_op_names
from torch._C import _AutoDispatchBelowAutograd as AutoDispatchBelowAutograd
from torch._C import _dispatch_has_kernel_for_dispatch_key as dispatch_has_kernel_for_dispatch_key
from torch._C import _dispatch_key_for_device as dispatch_key_for_device
from torch._C import _ExcludeDispatchKeyGuard as ExcludeDispatchKeyGuard
from torch._compile import _disable_dynamo as disable_dynamo_lazily
from torch._functorch.autograd_function import custom_function_call
from torch._library.autograd import make_autograd_impl
from torch._library.custom_ops import CustomOpDef
from torch._library.custom_ops import _maybe_get_opdef as maybe_get_opdef
from torch._ops import OpOverload


@dataclass(frozen=True)
class PrivateSymbol:
    """``path``: where torch keeps it; ``why``: why no public API serves; ``checked``: the
    oldest and newest torch it was checked on; ``without``: what stops working without it."""

    path: str
    why: str
    without: str
    checked: tuple[str, str] = ("2.12", "2.13")


SYMBOLS: dict[str, PrivateSymbol] = {
    "custom_function_call": PrivateSymbol(
        "torch._functorch.autograd_function.custom_function_call",
        "the only way for a dispatcher kernel (FuncTorchDynamicLayerFrontMode) to run an "
        "autograd.Function under torch.func's transforms; custom_op registers none",
        "torch.func.jvp / jacfwd / jacrev / vmap over oplib ops",
    ),
    "make_autograd_impl": PrivateSymbol(
        "torch._library.autograd.make_autograd_impl",
        "custom_op's own reverse-mode kernel, reused when oplib's Autograd kernel adds forward "
        "AD; torch.library has no register_jvp",
        "forward-mode AD (torch.autograd.forward_ad, jvp) of oplib ops",
    ),
    "CustomOpDef": PrivateSymbol(
        "torch._library.custom_ops.CustomOpDef",
        "the type of what torch.library.custom_op returns (annotations only)",
        "nothing at run time; type annotations of register_jvp",
    ),
    "maybe_get_opdef": PrivateSymbol(
        "torch._library.custom_ops._maybe_get_opdef",
        "the CustomOpDef behind a qualified name; torch.library has no lookup",
        "the registry's has_fake / has_autograd / has_vmap and the checks built on them",
    ),
    "AutoDispatchBelowAutograd": PrivateSymbol(
        "torch._C._AutoDispatchBelowAutograd",
        "redispatching below Autograd from a replacement Autograd kernel, as custom_op's does",
        "calls of oplib ops with no grad needed (the forward-AD kernel's plain path)",
    ),
    "after_autograd_keyset": PrivateSymbol(
        "torch._C._after_autograd_keyset",
        "the key set to redispatch with below Autograd",
        "as AutoDispatchBelowAutograd",
    ),
    "any_requires_grad": PrivateSymbol(
        "torch._C._any_requires_grad",
        "the dispatcher-side test custom_op's Autograd kernel uses (nested lists of tensors)",
        "as AutoDispatchBelowAutograd",
    ),
    "dispatch_key_for_device": PrivateSymbol(
        "torch._C._dispatch_key_for_device",
        "the dispatch key name of a device type (Autocast<key>); no public mapping",
        "oplib's autocast kernels and the registry's autocast_devices",
    ),
    "DispatchKey": PrivateSymbol(
        "torch._C.DispatchKey",
        "dispatch keys are named in torch.library's docs but not exported publicly",
        "oplib's autocast kernels",
    ),
    "DispatchKeySet": PrivateSymbol(
        "torch._C.DispatchKeySet",
        "as DispatchKey",
        "oplib's autocast kernels",
    ),
    "ExcludeDispatchKeyGuard": PrivateSymbol(
        "torch._C._ExcludeDispatchKeyGuard",
        "an autocast kernel must call the op below Autocast; torch.library.register_autocast "
        "would fix the dtype at registration and ignore torch.autocast(dtype=...)",
        "autocast with a dtype other than the device's default",
    ),
    "dispatch_has_kernel_for_dispatch_key": PrivateSymbol(
        "torch._C._dispatch_has_kernel_for_dispatch_key",
        "whether an op has a kernel for a key; no public query",
        "the registry's autocast_devices, read by the generated autocast checks",
    ),
    "OpOverload": PrivateSymbol(
        "torch._ops.OpOverload",
        "the type of torch.ops.<ns>.<op>.<overload>; torch exports no public alias",
        "the registry's and ONNX translation table's type checks",
    ),
    "meta_registrations": PrivateSymbol(
        "torch._meta_registrations.div_rtn",
        "the pooling shape functions call it; patched on torch < 2.13 (see oplib._compat)",
        "torch.export of a RedNet with a dynamic image size on torch 2.12",
    ),
    "forward_ad_level": PrivateSymbol(
        "torch.autograd.forward_ad._current_level",
        "whether a forward-AD level is open; forward_ad has no public query",
        "forward-mode AD of oplib ops (every call would take the dual-tensor path)",
    ),
    "FakeTensorMode": PrivateSymbol(
        "torch._subclasses.fake_tensor.FakeTensorMode",
        "running an op's fake kernel outside compile/export; no public entry",
        "the generated fake-kernel checks (oplib.testing)",
    ),
    "TorchDispatchMode": PrivateSymbol(
        "torch.utils._python_dispatch.TorchDispatchMode",
        "a mode that sees every op below autograd, as the tracers' modes do; "
        "torch.overrides.TorchFunctionMode sees calls above the dispatcher only",
        "the test that oplib's direct calls leave a dispatch mode in the call's way (tests only)",
    ),
    "disable_dynamo_lazily": PrivateSymbol(
        "torch._compile._disable_dynamo",
        "torch.compiler.disable imports torch._dynamo when it wraps (2 s of every `import oplib`, "
        "GPU or not, for the CUDA kernels' registration); this wrapper, the one torch's own "
        "custom_op kernels get, imports it at the first call",
        "a 2 s faster `import oplib` (the CUDA kernels registered with the public disable instead)",
    ),
    "maybe_mark_dynamic": PrivateSymbol(
        "torch._dynamo.maybe_mark_dynamic",
        "torch.compiler has no public mark_dynamic",
        "the self-check's dynamic-shape compile cell",
    ),
    "aoti_compile_and_package": PrivateSymbol(
        "torch._inductor.aoti_compile_and_package",
        "AOTInductor's documented entry point lives under torch._inductor",
        "python -m oplib export --format aoti",
    ),
    "aoti_load_package": PrivateSymbol(
        "torch._inductor.aoti_load_package",
        "as aoti_compile_and_package",
        "python -m oplib export --format aoti (its check against eager)",
    ),
    "get_cpp_compiler": PrivateSymbol(
        "torch._inductor.cpp_builder.get_cpp_compiler",
        "inductor's own compiler search, so a missing compiler is reported as torch.compile "
        "would meet it",
        "the no-compiler skips of the compile tests and self-check (they would fail instead)",
    ),
    "dispatch_get_all_op_names": PrivateSymbol(
        "torch._C._dispatch_get_all_op_names",
        "every operator the dispatcher knows; torch.ops.<ns> lists only what was accessed",
        "the test that every oplib op has a forward-mode rule and a registry spec (tests only)",
    ),
    "dynamo_counters": PrivateSymbol(
        "torch._dynamo.utils.counters",
        "dynamo's tally of unique graphs; torch.compiler exposes no compile count",
        "the recompilation counts of compile_tests/ops/test_compile.py (tests only)",
    ),
    "aot_autograd": PrivateSymbol(
        "torch._dynamo.backends.common.aot_autograd",
        "a torch.compile backend that hands a custom compiler the AOTAutograd graph; the "
        "public backends hide the graph",
        "the checks that oplib ops stay single nodes in a compiled RedNet's graph (tests only)",
    ),
    "inductor_config": PrivateSymbol(
        "torch._inductor.config",
        "freezing must be set while dynamo traces (it keeps parameters as graph constants); "
        "torch.compile(options=...) reaches only inductor",
        "the frozen rows of bench/rednet.py (benchmarks only)",
    ),
    "cuda_sleep": PrivateSymbol(
        "torch.cuda._sleep",
        "a GPU-side wait of a given number of cycles, to keep a stream busy; no public one",
        "the side-stream test of the CUDA ops (a launch on the wrong stream would pass unseen); "
        "tuning's timing (CuPyLauncher.time_calls) would read the host's launch rate where a "
        "writer's kernels are shorter than its launches",
    ),
    "get_allowed_globals": PrivateSymbol(
        "torch._weights_only_unpickler._get_allowed_globals",
        "the weights_only allowlist, so that unknown globals in the paper's (legacy-format) "
        "checkpoints load as inert placeholders; torch.serialization.safe_globals can only "
        "allow named globals, and get_unsafe_globals_in_checkpoint, which would name them, "
        "reads only zipfile checkpoints (it raises ValueError on the legacy format)",
        "loading the paper's RedNet checkpoints (oplib.checkpoints)",
    ),
    "make_wrapper_subclass": PrivateSymbol(
        "torch.Tensor._make_wrapper_subclass",
        "a tensor of a device type this machine lacks (XPU, MTIA), holding no data, whose ops "
        "reach that device's dispatch key: the only way to show, without the device, that an "
        "op registered for CPU and CUDA gives torch's own error there",
        "the test that another device type gets torch's \"could not run\" error (tests/kernels/cpu/test_native_build.py)",
    ),
    "BatchNormBase": PrivateSymbol(
        "torch.nn.modules.batchnorm._BatchNorm",
        "the one base class of every BatchNorm with running statistics (BatchNorm1d/2d/3d, "
        "SyncBatchNorm, the lazy ones); no public class or predicate names that family",
        "checkpointed recomputation (oplib.nn.checkpoint_module) updating a BatchNorm's running "
        "statistics a second time",
    ),
}

# CustomOpDef attributes oplib reads (ops/_transforms.py, registry.py; ``_init_fn``, the
# function custom_op was given, in the CUDA emulation tests and bench/dense.py; ``_backend_fns``,
# the kernels register_kernel gave it, which the direct calls leave to the dispatcher); the test
# checks them on oplib's own ops. Without them: forward AD and the torch.func transforms of
# oplib ops.
OPDEF_ATTRIBUTES = ("_opoverload", "_setup_context_fn", "_backward_fn", "_vmap_fn", "_abstract_fn", "_qualname", "_name",
                    "_init_fn", "_backend_fns")


def resolve(path: str) -> Any:
    """The object at a dotted ``path`` (the longest importable module prefix, then attributes)."""
    parts = path.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            found: Any = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for name in parts[cut:]:
            found = getattr(found, name)
        return found
    raise ImportError(path)


def forward_ad_level() -> int:
    """The innermost open forward-AD level, -1 where none is open (read at each call)."""
    return _forward_ad._current_level


def __getattr__(name: str) -> Any:
    # Only the entries not imported above reach here: those in heavy modules.
    if name in SYMBOLS:
        value = globals()[name] = resolve(SYMBOLS[name].path)  # resolved once
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
