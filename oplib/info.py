"""``python -m oplib info``: the environment oplib runs in, the first thing to paste into a bug
report: oplib, Python, torch and the C++ compiler; which CPU kernels involution takes and
where the native ones are cached; CUDA, CuPy, NVRTC and the GPUs; the optional extras
installed. It builds nothing, compiles nothing and downloads nothing.

    python -m oplib info           # the report
    python -m oplib info --json    # the same, machine-readable
"""

from __future__ import annotations

import functools
import importlib.metadata
import json
import os
import platform
import sys
from pathlib import Path
from typing import Optional

Report = dict[str, dict[str, str]]


def _distribution_version(name: str) -> Optional[str]:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


@functools.cache
def _providers() -> dict[str, list[str]]:
    """Import name -> the distributions providing it: a walk of every installed distribution's
    file list (a second here), so read once per report (``collect`` clears it) where each of
    the report's ten lookups read it again (10 s for ``info``)."""
    return importlib.metadata.packages_distributions()


def _distributions_of(module: str) -> list[str]:
    """The installed distributions that provide the import name ``module``, with versions."""
    names = _providers().get(module, [])
    return [f"{name} {_distribution_version(name)}" for name in dict.fromkeys(names)]


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _oplib_section() -> dict[str, str]:
    from . import __version__

    return {
        "oplib": f"{__version__} ({Path(__file__).resolve().parent})",
        "Python": f"{platform.python_version()} ({platform.python_implementation()}, {sys.executable})",
        "platform": f"{platform.platform()}; {_cpu_name()}; {os.cpu_count()} logical CPUs",
    }


def _torch_section() -> dict[str, str]:
    import torch

    numpy = _distribution_version("numpy")
    return {
        "torch": f"{torch.__version__} ({Path(torch.__file__).resolve().parent})",
        "torch's CUDA": torch.version.cuda or "none (a CPU build of torch)",
        "CPU threads": str(torch.get_num_threads()),
        "numpy": numpy or "not installed (torch warns at import: pip install numpy)",
    }


def _native_section() -> dict[str, str]:
    from .kernels import native

    compiler = native.compiler_command()
    missing = native._missing_tool()
    section = {
        "C++ compiler": missing or native._compiler_identity(compiler),
        native.ENV: os.environ.get(native.ENV, f"{native.DEFAULT} (the default)"),
        "extension cache": str(native.cache_dir()),
    }
    if missing:
        section["native CPU kernels"] = "unavailable: no C++ compiler; involution runs its plain-PyTorch CPU kernels"
        return section
    try:
        name = native.module_name(native.SOURCE_DIR, native.Target(compiler))
    except Exception as error:  # noqa: BLE001  (reported, not raised: the report is for bug reports)
        section["native CPU kernels"] = f"unknown ({type(error).__name__}: {error})"
        return section
    library, failed_log = native.cached_files(name)
    if library.exists():
        section["native CPU kernels"] = f"built for this machine: {library}"
    elif failed_log.exists():
        section["native CPU kernels"] = f"the last build failed (its log: {failed_log}); involution runs its plain-PyTorch kernels"
    else:
        section["native CPU kernels"] = (
            "not built yet: the first involution call on CPU builds them (about a minute); "
            "`python -m oplib build` builds them now"
        )
    return section


def _cuda_section() -> dict[str, str]:
    import torch

    section: dict[str, str] = {}
    if torch.cuda.is_available():
        devices = []
        for index in range(torch.cuda.device_count()):
            props = torch.cuda.get_device_properties(index)
            devices.append(f"{index}: {props.name} (sm_{props.major}{props.minor}, {props.total_memory / 2**30:.0f} GiB)")
        section["GPUs"] = "; ".join(devices)
    else:
        section["GPUs"] = "none (torch.cuda.is_available() is False)"
    from .kernels.cuda_plan import cuda_tuning_enabled

    section["kernel tuning"] = ("on (each call signature's candidate kernels timed, the fastest kept)"
                                if cuda_tuning_enabled() else
                                "off (oplib.kernels.set_cuda_tuning(True) or OPLIB_CUDA_TUNING=1 turns it on)")
    cupy = _distributions_of("cupy")
    if not cupy:
        from ._extras import install_hint

        section["CuPy"] = f"not installed (involution's CUDA kernels need it: {install_hint('cuda12')}, or cuda13)"
        return section
    section["CuPy"] = ", ".join(cupy)
    try:
        from cupy.cuda import nvrtc

        major, minor = nvrtc.getVersion()
        section["NVRTC"] = f"{major}.{minor}"
    except Exception as error:  # noqa: BLE001  (a missing library is a fact to report)
        section["NVRTC"] = f"unavailable ({type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''})"
    section["CuPy kernel cache"] = os.environ.get("CUPY_CACHE_DIR", str(Path.home() / ".cupy" / "kernel_cache"))
    return section


def _extras_section() -> dict[str, str]:
    from ._extras import DISTRIBUTIONS, EXTRAS, installed

    present = installed()
    section = {}
    for extra, (purpose, modules) in EXTRAS.items():
        if present[extra]:
            versions = ([f"{DISTRIBUTIONS[extra]} {_distribution_version(DISTRIBUTIONS[extra])}"] if extra in DISTRIBUTIONS
                        else [v for module in modules for v in _distributions_of(module)])
            section[extra] = "installed: " + ", ".join(dict.fromkeys(versions))
        else:
            section[extra] = f"not installed ({purpose})"
    return section


def collect() -> Report:
    """The report: section -> (item -> text). Each section that fails says why instead."""
    sections = {
        "oplib": _oplib_section,
        "torch": _torch_section,
        "CPU kernels": _native_section,
        "CUDA": _cuda_section,
        "extras": _extras_section,
    }
    _providers.cache_clear()  # what is installed now, not at an earlier report
    report: Report = {}
    for title, gather in sections.items():
        try:
            report[title] = gather()
        except Exception as error:  # noqa: BLE001  (the rest of the report still helps)
            report[title] = {"error": f"{type(error).__name__}: {error}"}
    return report


def format_report(report: Report) -> str:
    width = max(len(key) for section in report.values() for key in section)
    lines = []
    for title, section in report.items():
        lines.append(f"{title}:")
        lines += [f"  {key + ':':<{width + 1}} {value}" for key, value in section.items()]
    return "\n".join(lines)


def main(argv: Optional[list[str]] = None) -> int:
    from ._cli import parser as cli_parser

    parser = cli_parser("python -m oplib info", __doc__)
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    args = parser.parse_args(argv)
    report = collect()
    print(json.dumps(report, indent=2) if args.json else format_report(report))
    return 0
