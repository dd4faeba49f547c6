"""Compile every instantiation of oplib's CUDA sources for one GPU architecture, here, with
NVRTC and no GPU, into a folder that ``OPLIB_CUDA_PREBUILT`` names on the GPU machine
(``oplib.kernels.cuda_prebuilt`` says what the folder holds and when a cubin loads):

    python -m oplib.testing.cuda_prebuild --arch sm_90 --out build/cuda-sm_90   # make gpu-prebuild

Each source is compiled as CuPy compiles it on a GPU (``oplib.testing.nvrtc.cupy_options``:
the launcher's options, ``-ftz=true``, ``-arch=sm_XY``), with every name expression, in a child
process (``nvrtc._in_child``); its cubin and lowered names are written beside the manifest.
Minutes of NVRTC that a GPU lease would otherwise spend, once per process that launches.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Optional

from ..kernels import cuda_prebuilt
from ..kernels.cuda_source import KernelSource, cuda_sources, load_source
from .nvrtc import compile_source, cupy_options, nvrtc_version


def build(directory: Path, arch: str = "sm_90", sources: Optional[Sequence[KernelSource]] = None) -> Path:
    """Compile ``sources`` (default: every CUDA source of oplib) for ``arch`` into ``directory``:
    one cubin per source and the manifest, written last (a build cut short leaves no manifest,
    so nothing of it loads). Returns the manifest's path."""
    sources = [load_source(name) for name in cuda_sources()] if sources is None else list(sources)
    directory.mkdir(parents=True, exist_ok=True)
    for old in directory.glob("*.cubin"):
        old.unlink()
    (directory / cuda_prebuilt.MANIFEST).unlink(missing_ok=True)
    modules = {}
    for source in sources:
        start = time.perf_counter()
        compiled = compile_source(source, arch)
        cubin, lowered = compiled.cubin, compiled.lowered_names
        path = directory / cuda_prebuilt.cubin_name(source)
        path.write_bytes(cubin)
        modules[source.sha256] = {"source": source.path.name, "cubin": path.name,
                                  "cubin_sha256": cuda_prebuilt.file_sha256(path), "lowered_names": lowered}
        print(f"{source.path.name}: {len(lowered)} instantiations, {len(cubin) / 1e6:.1f} MB, "
              f"{time.perf_counter() - start:.0f} s", flush=True)
    return cuda_prebuilt.write_manifest(directory, arch, nvrtc_version(), cupy_options(arch), modules)


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--arch", default="sm_90", help="the GPU architecture (default: sm_90, the H100 and H200)")
    parser.add_argument("--out", type=Path, help="the folder (default: build/cuda-<arch>)")
    args = parser.parse_args(argv)
    out = args.out or Path("build") / f"cuda-{args.arch}"
    start = time.perf_counter()
    manifest = build(out, args.arch)
    size = sum(path.stat().st_size for path in out.iterdir())
    print(f"{manifest}: NVRTC {nvrtc_version()}, {args.arch}, {size / 1e6:.1f} MB in all, "
          f"{time.perf_counter() - start:.0f} s; on the GPU: OPLIB_CUDA_PREBUILT={out}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
