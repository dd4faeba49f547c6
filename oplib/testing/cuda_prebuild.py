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
from ..kernels.cuda_source import KernelSource, cuda_sources, load_source, name_expressions
from .nvrtc import NvrtcError, _check, _in_child, cupy_options, nvrtc_version


def _compile_cubin(source: KernelSource, arch: str) -> tuple[bytes, dict[str, str]]:
    """NVRTC's cubin of every instantiation of ``source`` and each one's lowered name (in the
    child process: see ``oplib.testing.nvrtc._in_child``)."""
    from cuda.bindings import nvrtc

    names = name_expressions(source)
    options = [option.encode() for option in cupy_options(arch)]
    (program,) = _check(nvrtc.nvrtcCreateProgram(source.text.encode(), source.path.name.encode(), 0, [], []),
                        "nvrtcCreateProgram")
    try:
        for name in names:
            _check(nvrtc.nvrtcAddNameExpression(program, name.encode()), "nvrtcAddNameExpression")
        (status,) = nvrtc.nvrtcCompileProgram(program, len(options), options)
        if status != nvrtc.nvrtcResult.NVRTC_SUCCESS:
            (size,) = _check(nvrtc.nvrtcGetProgramLogSize(program), "nvrtcGetProgramLogSize")
            log = b" " * size
            _check(nvrtc.nvrtcGetProgramLog(program, log), "nvrtcGetProgramLog")
            text = log.rstrip(b"\0").decode()
            raise NvrtcError(f"NVRTC cannot compile {source.path.name} for {arch}:\n{text}")
        lowered = {name: _check(nvrtc.nvrtcGetLoweredName(program, name.encode()), "nvrtcGetLoweredName")[0].decode()
                   for name in names}
        (size,) = _check(nvrtc.nvrtcGetCUBINSize(program), "nvrtcGetCUBINSize")
        cubin = b" " * size
        _check(nvrtc.nvrtcGetCUBIN(program, cubin), "nvrtcGetCUBIN")
        return cubin, lowered
    finally:
        nvrtc.nvrtcDestroyProgram(program)


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
        cubin, lowered = _in_child(_compile_cubin, source, arch)
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
