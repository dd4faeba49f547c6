"""CUDA kernels compiled ahead of time, on a machine without a GPU, and loaded instead of
compiled on first use.

A prebuilt folder holds one cubin per CUDA source, with every instantiation of it (every
kernel, dtype and specialisation), and ``manifest.json``: for each cubin the
``KernelSource.sha256`` of the source it was compiled from (its text and the shared headers),
the lowered (mangled) name of each instantiation and the cubin's own hash; for the folder, the
architecture, the NVRTC release and the options. ``python -m oplib.testing.cuda_prebuild``
writes one (``make gpu-prebuild``: every source for sm_90, into ``build/cuda-sm_90``).

``CuPyLauncher.load`` takes a source's module from the folder that ``OPLIB_CUDA_PREBUILT``
names (``load_functions``) only when its entry is for this very source (the hash), the GPU's
architecture and the options the launcher compiles with, holds every instantiation of the
source and its cubin is the one the manifest hashed; anything else compiles with NVRTC as
without the folder, so a stale cubin never loads. The NVRTC release is recorded, not
required: a cubin is machine code for one architecture, and whether the driver accepts one
from a newer CUDA 13 release is the driver's to say; a cubin it refuses also falls back to
NVRTC, with a warning.
"""

from __future__ import annotations

import hashlib
import json
import os
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from .cuda_source import INCLUDE_DIR, NVRTC_OPTIONS, KernelSource, instantiations, name_expression

ENVIRONMENT = "OPLIB_CUDA_PREBUILT"
MANIFEST = "manifest.json"
FORMAT = 1
# The include folder in recorded options: its path differs between machines.
_INCLUDE_MARK = "<oplib/kernels/csrc/cuda>"


def portable_options(options: Sequence[str]) -> list[str]:
    """``options`` with this checkout's include folder written as a mark, so that a folder built
    in one checkout matches the options of another."""
    return [option.replace(str(INCLUDE_DIR), _INCLUDE_MARK) for option in options]


def file_sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def cubin_name(source: KernelSource) -> str:
    """The cubin's file name: the source's stem and its hash, so that two builds never collide."""
    return f"{source.path.stem}-{source.sha256[:16]}.cubin"


def write_manifest(directory: Path, arch: str, nvrtc: str, nvrtc_options: Sequence[str],
                   modules: dict[str, dict[str, Any]]) -> Path:
    """Write ``directory/manifest.json``. ``modules``: source hash -> {"source": its name,
    "cubin": file name, "cubin_sha256", "lowered_names": {name expression: mangled name}}."""
    manifest = {
        "format": FORMAT, "arch": arch, "nvrtc": nvrtc,
        "launcher_options": portable_options(NVRTC_OPTIONS), "nvrtc_options": portable_options(nvrtc_options),
        "modules": modules,
    }  # fmt: skip
    path = directory / MANIFEST
    path.write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n")
    return path


@dataclass(frozen=True)
class Lookup:
    """What a prebuilt folder offers for one source: its cubin and lowered names, or ``None``
    and ``reason``, why not."""

    cubin: Optional[Path]
    lowered_names: dict[str, str]
    reason: str = ""


def lookup(source: KernelSource, arch: str, directory: Optional[Path] = None) -> Lookup:
    """The prebuilt module of ``source`` for ``arch`` (``sm_90``) in ``directory`` (default: the
    folder ``OPLIB_CUDA_PREBUILT`` names), if every check passes: the folder's architecture and
    launcher options, an entry for this source's hash holding every instantiation, the cubin's
    hash. Reads the manifest each time (a load is once per source and device)."""
    directory = directory or os.environ.get(ENVIRONMENT)
    if not directory:
        return Lookup(None, {}, f"{ENVIRONMENT} is not set")
    manifest_path = Path(directory) / MANIFEST
    if not manifest_path.is_file():
        return Lookup(None, {}, f"no {MANIFEST} in {directory}")
    manifest = json.loads(manifest_path.read_text())
    if manifest.get("format") != FORMAT:
        return Lookup(None, {}, f"manifest format {manifest.get('format')}, expected {FORMAT}")
    if manifest.get("arch") != arch:
        return Lookup(None, {}, f"built for {manifest.get('arch')}, the GPU is {arch}")
    if manifest.get("launcher_options") != portable_options(NVRTC_OPTIONS):
        return Lookup(None, {}, f"built with options {manifest.get('launcher_options')}, the launcher's are "
                                f"{portable_options(NVRTC_OPTIONS)}")
    entry = manifest.get("modules", {}).get(source.sha256)
    if entry is None:
        return Lookup(None, {}, f"no cubin of {source.path.name} with this source's hash ({source.sha256[:16]})")
    names = entry["lowered_names"]
    missing = [n for n in (name_expression(*i) for i in instantiations(source)) if n not in names]
    if missing:
        return Lookup(None, {}, f"{len(missing)} instantiations of {source.path.name} missing, {missing[0]} first")
    cubin = Path(directory) / entry["cubin"]
    if not cubin.is_file() or file_sha256(cubin) != entry["cubin_sha256"]:
        return Lookup(None, {}, f"{cubin} is missing or not the file the manifest hashed")
    return Lookup(cubin, dict(names))


def load_functions(cupy: Any, source: KernelSource, device: int) -> Optional[tuple[Any, dict[tuple, int]]]:
    """With ``OPLIB_CUDA_PREBUILT`` set and a matching cubin (``lookup``): the loaded module and
    the CUfunction of every instantiation ((kernel, dtype, specialisation) -> handle) on
    ``device``, whose scope the caller has entered. ``None`` where the folder is not set or does
    not match (warning which check failed) or the driver refuses the cubin (warning why)."""
    if not os.environ.get(ENVIRONMENT):
        return None
    arch = f"sm_{cupy.cuda.Device(device).compute_capability}"
    found = lookup(source, arch)
    if found.cubin is None:
        warnings.warn(f"{ENVIRONMENT}: {found.reason}; compiling {source.path.name} with NVRTC", stacklevel=3)
        return None
    try:
        module = cupy.RawModule(path=str(found.cubin))
        functions = {
            instantiation: module.get_function(found.lowered_names[name_expression(*instantiation)]).kernel.ptr
            for instantiation in instantiations(source)
        }
    except Exception as error:  # noqa: BLE001  (the driver's refusal, whatever its type: NVRTC then serves)
        warnings.warn(f"{ENVIRONMENT}: the driver refused {found.cubin.name} ({error}); compiling "
                      f"{source.path.name} with NVRTC", stacklevel=3)
        return None
    return module, functions
