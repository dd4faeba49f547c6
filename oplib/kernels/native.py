"""The native CPU kernels (the sources in ``oplib/kernels/involution/csrc/cpu/``), compiled on first use.

The build is oplib's own, not ``torch.utils.cpp_extension.load``, for what a user meets on
first use:

- it speaks: one line on stderr when a build starts and one when it ends (or when it waits
  for another process's build);
- it survives: the lock is an ``fcntl.flock`` on a file in the cache, released by the kernel
  when its holder dies, so a build killed at any instant (SIGKILL, the OOM killer, a
  scheduler's time limit) never blocks a later one; each build works in a private directory
  and moves the finished module into the cache with one rename, so the cache holds either
  nothing or a whole module, and concurrent first calls (a DDP job's ranks) build once and
  all load it;
- it is quick: the kernel units include no ATen tensor header and compile in parallel, one
  compiler process per core (``MAX_JOBS``, as torch reads it, caps them), each unit's object
  is kept by what it is compiled from (a build that changes one unit compiles that one), and
  it needs no ninja;
- a failure says why: the fallback warning quotes the compiler's first error line, and the
  whole log is kept beside the cache.

``OPLIB_CPU_KERNELS`` picks the path, read at each call:

- ``auto`` (the default): the native kernels, built on first use; where there is no compiler
  or the build fails, the plain-PyTorch kernels, with one warning saying why and what to do.
  The native kernels are faster at every RedNet shape (``bench/results/involution.md``).
- ``native``: the native kernels, and an error where they cannot be built.
- ``pytorch``: the plain-PyTorch kernels of ``oplib.kernels.involution.cpu``.

The compiler is ``$CXX`` (else ``c++``): GCC or clang, on x86-64 or aarch64. ``involution()``
returns the built module, or None where the plain-PyTorch kernels run; ``build()`` builds (or
finds) a module for a given source tree, target and compiler, which the tests use for the
sanitized, clang, AVX2-only and baseline builds.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import os
import platform
import re
import shlex
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import threading
import time
import warnings
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Optional

KERNEL_DIR = Path(__file__).resolve().parent
SOURCE_DIR = KERNEL_DIR / "involution" / "csrc" / "cpu"
# The units that take longest to compile, longest first (each unit's time alone, measured by
# bench/build.py): the parallel compiles start with them, so that they end together. The
# others follow by name. backward_weight_pixels.cpp is long only where -march=native compiles
# its AVX-512 kernels (18 s on such a machine, 2 s on one without): the two row units after it
# keep either machine's two compile slots ending within a second of the floor (without them, a
# machine without AVX-512 compiled forward_rows.cpp last, 5 s past it).
LONGEST_UNITS = ("bindings.cpp", "backward_weight_pixels.cpp", "backward_generator.cpp", "backward_input_rows.cpp",
                 "forward_rows.cpp")
ENV = "OPLIB_CPU_KERNELS"
CHOICES = ("pytorch", "auto", "native")
DEFAULT = "auto"
# Compiler processes at once: torch's own knob for its extension builds.
JOBS_ENV = "MAX_JOBS"
# The most memory one compiler process of these sources takes (the bindings unit, measured
# with GCC 12 at -O3: 0.76 GB); parallel compiles are limited to what the machine has free.
UNIT_MEMORY_BYTES = 800 << 20
# AddressSanitizer builds (the tests): such a module loads only into a process started with
# the ASan runtime preloaded (oplib.testing.cuda_emulation.asan_environment). -O1, ASan's own
# advice, replaces -O3 (the last -O counts): the kernels' vector code is explicit, so the
# accesses checked are the same, and the build is much quicker. -g1: the line tables a report's
# stack names (the build 70 s where -g took 102; with either, a report in an inlined header
# function names its caller's line).
SANITIZE_FLAGS = ("-fsanitize=address", "-fno-omit-frame-pointer", "-g1", "-O1")
# The unit with the largest compiler (the bindings: torch's and pybind11's headers), and the
# GCC parameters that make its garbage collector run sooner (its defaults suit more memory).
MEMORY_BOUND_UNIT = "bindings.cpp"
# The unit that defines the Python module (PYBIND11_MODULE(TORCH_EXTENSION_NAME, ...)).
MODULE_UNIT = "bindings.cpp"
GCC_LOW_MEMORY_FLAGS = ("--param", "ggc-min-expand=20", "--param", "ggc-min-heapsize=65536")
# The bindings unit holds no compute loop (argument checks, views, the dtype switch, the calls into
# the kernel units): -O1 after the build's -O3 (the last -O counts). GCC 12 here: 37.4 s of
# CPU at -O3 with the parameters above, 27.5 s at -O1, and 0.67 -> 0.65 GB.
BINDINGS_OPTIMIZATION = "-O1"


class NativeBuildWarning(UserWarning):
    """The native CPU kernels could not be built; the plain-PyTorch kernels run instead."""


class NativeBuildError(RuntimeError):
    """A build of the native CPU kernels failed; ``first_error`` is the compiler's first
    error line, ``log`` the path of the whole log."""

    def __init__(self, first_error: str, log: Path):
        super().__init__(f"{first_error} (the whole log: {log})")
        self.first_error, self.log = first_error, log


def requested() -> str:
    choice = os.environ.get(ENV, DEFAULT).strip().lower() or DEFAULT
    if choice not in CHOICES:
        raise ValueError(f"{ENV}={choice!r}: expected one of {', '.join(CHOICES)}")
    return choice


def compiler_command() -> str:
    return os.environ.get("CXX", "c++")


def _announce(message: str) -> None:
    print(f"oplib: {message}", file=sys.stderr, flush=True)


def _cpu_identity() -> str:
    """What -march=native compiles for: the CPU's model and instruction-set flags."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return platform.processor() or platform.machine()
    keep = [line for line in lines if line.startswith(("model name", "flags", "Features", "CPU part"))]
    return "\n".join(dict.fromkeys(keep))


@functools.cache
def _compiler_identity(compiler: str) -> str:
    """The compiler's version line (part of the cache key: another compiler, another module)."""
    try:
        result = subprocess.run([*shlex.split(compiler), "--version"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError) as error:
        return f"{compiler}: {error}"
    return f"{compiler}: " + (result.stdout.strip().splitlines() or [""])[0]


def cache_dir() -> Path:
    """Where built modules are kept: torch's extension cache (``TORCH_EXTENSIONS_DIR``, else
    ``~/.cache/torch_extensions``), in its own ``oplib`` folder."""
    from torch.utils import cpp_extension

    return Path(os.environ.get("TORCH_EXTENSIONS_DIR") or cpp_extension.get_default_build_root()) / "oplib"


@functools.cache
def _is_gcc(compiler: str) -> bool:
    """Whether ``compiler`` is GCC (its predefined macros: GCC's own, not clang's, which also
    defines __GNUC__), where ``--param`` takes GCC's parameters."""
    try:
        result = subprocess.run([*shlex.split(compiler), "-dM", "-E", "-x", "c++", "-"], input="", capture_output=True,
                                text=True, timeout=60)  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return False
    macros = result.stdout
    return result.returncode == 0 and "#define __GNUC__" in macros and "__clang__" not in macros and "__INTEL" not in macros


@dataclass(frozen=True)
class Target:
    """What one build compiles for and with. ``march``: ``-march``'s value (``native``: this
    machine's CPU; ``x86-64-v3``: AVX2; ``x86-64``: the baseline; ``armv8-a``: aarch64)."""

    compiler: str
    march: str = "native"
    sanitize: bool = False

    def compile_flags(self, name: Optional[str]) -> list[str]:
        """The flags of every unit; the module's ``name`` (TORCH_EXTENSION_NAME) only where
        given: the bindings unit's (``MODULE_UNIT``), the one unit that reads it, so that the
        others' objects do not depend on it (``_compile`` reuses them across modules)."""
        import torch
        from torch.utils import cpp_extension

        includes = [*cpp_extension.include_paths(), sysconfig.get_paths()["include"]]
        flags = ["-std=c++20", "-fPIC", "-O3", f"-march={self.march}", "-fopenmp"]
        flags += [f"-DTORCH_EXTENSION_NAME={name}"] if name is not None else []
        flags += ["-DTORCH_API_INCLUDE_EXTENSION_H"]
        flags += [f"-D_GLIBCXX_USE_CXX11_ABI={int(torch.compiled_with_cxx11_abi())}"]
        flags += [f for include in includes for f in ("-isystem", include)]
        return flags + (list(SANITIZE_FLAGS) if self.sanitize else [])

    def unit_flags(self, unit: str) -> list[str]:
        """Flags for one unit beyond compile_flags: the bindings unit (torch's and pybind11's
        headers, no compute loop) at ``BINDINGS_OPTIMIZATION``, and with GCC collecting its garbage
        more often there, the unit whose memory sets the build's peak beside another compile
        (0.81 -> 0.66 GB for 5 s more of CPU)."""
        if unit != MEMORY_BOUND_UNIT:
            return []
        return [BINDINGS_OPTIMIZATION, *(GCC_LOW_MEMORY_FLAGS if _is_gcc(self.compiler) else ())]

    def link_flags(self) -> list[str]:
        from torch.utils import cpp_extension

        flags = ["-shared", "-fopenmp", *(f"-L{path}" for path in cpp_extension.library_paths())]
        flags += ["-lc10", "-ltorch_cpu", "-ltorch", "-ltorch_python"]
        return flags + (["-fsanitize=address"] if self.sanitize else [])


def units(source_dir: Path = SOURCE_DIR) -> list[Path]:
    """The translation units of a source tree, the longest first."""
    rank = {name: i for i, name in enumerate(LONGEST_UNITS)}
    return sorted(source_dir.glob("*.cpp"), key=lambda path: (rank.get(path.name, len(rank)), path.name))


def _texts(paths) -> list[str]:
    return [path.name + "\0" + path.read_text() for path in sorted(paths)]


def _environment_key(target: Target) -> list[str]:
    """What a build depends on besides its sources and flags: the compiler, the CPU where
    -march=native, the torch and the Python it is built against."""
    import torch

    return [_compiler_identity(target.compiler), _cpu_identity() if target.march == "native" else platform.machine(),
            torch.__version__, sysconfig.get_config_var("EXT_SUFFIX")]


def module_name(source_dir: Path, target: Target) -> str:
    """The module's name, a digest of everything it is built from: the sources, the flags, the
    compiler, the CPU where -march=native, the torch and the Python it is built against."""
    key = _texts(source_dir.glob("*.[ch]*"))
    key += [*target.compile_flags("{name}"), *target.unit_flags(MEMORY_BOUND_UNIT), *target.link_flags()]
    key += _environment_key(target)
    return f"oplib_cpu_{hashlib.sha256(chr(0).join(key).encode()).hexdigest()[:16]}"


_LOCAL_INCLUDE = re.compile(r'^\s*#\s*include\s*"([^"]+)"', re.MULTILINE)


def local_includes(source: Path) -> set[Path]:
    """The headers beside ``source`` that it includes, directly or through one another (every
    quoted include counted, inside an #if or not: a superset is safe)."""
    found, pending = set(), [source]
    while pending:
        for name in _LOCAL_INCLUDE.findall(pending.pop().read_text()):
            header = source.parent / name
            if header.is_file() and header not in found:
                found.add(header)
                pending.append(header)
    return found


def object_key(target: Target, source: Path, command: list[str]) -> str:
    """The digest of everything one unit's object is compiled from: its text, the headers of
    its own it includes (``local_includes``; torch's and the system's go with the
    environment), its compile command (the paths of the source and the object aside) and the
    environment (``_environment_key``)."""
    key = [*_texts([source, *local_includes(source)]), *command, *_environment_key(target)]
    return hashlib.sha256(chr(0).join(key).encode()).hexdigest()[:24]


def cached_files(name: str) -> tuple[Path, Path]:
    """Where the module ``name`` lies in the cache once built, and where its last failed
    build's log is kept."""
    root = cache_dir()
    return root / f"{name}{sysconfig.get_config_var('EXT_SUFFIX')}", root / f"{name}.log"


_LOADED: dict[Path, ModuleType] = {}


def load_module(path: Path) -> ModuleType:
    """The built module at ``path`` (``<name>.<ABI tag>.so``), imported once per process."""
    if path not in _LOADED:
        import torch  # noqa: F401  (torch's libraries are loaded before the module that links them)

        spec = importlib.util.spec_from_file_location(path.name.split(".")[0], path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        _LOADED[path] = module
    return _LOADED[path]


def _jobs(count: int) -> int:
    if os.environ.get(JOBS_ENV, "").strip().isdigit():
        return max(1, min(count, int(os.environ[JOBS_ENV])))
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    try:
        free = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        free = cores * UNIT_MEMORY_BYTES
    return max(1, min(count, cores, free // UNIT_MEMORY_BYTES))


_ERROR_LINE = re.compile(r"(^|: )(fatal error|error)\b", re.IGNORECASE)


def first_error_line(log: str) -> str:
    """The compiler's first error line in a build log (else its last line)."""
    lines = [line.strip() for line in log.splitlines() if line.strip()]
    return next((line for line in lines if _ERROR_LINE.search(line)), lines[-1] if lines else "no output")


def compiler_environment() -> dict[str, str]:
    """This process's environment less AddressSanitizer's runtime in LD_PRELOAD: a sanitized
    build run from a process that loads sanitized modules (the tests') would otherwise run
    every compiler under ASan's allocator, its build 138 s where it takes 102 s."""
    env = dict(os.environ)
    kept = [entry for entry in env.get("LD_PRELOAD", "").replace(":", " ").split() if "libasan" not in Path(entry).name]
    if kept:
        env["LD_PRELOAD"] = " ".join(kept)
    else:
        env.pop("LD_PRELOAD", None)
    return env


def _compile(target: Target, name: str, sources: list[Path], workdir: Path, progress: bool = False,
             objects_dir: Optional[Path] = None) -> Path:
    """The module built from sources in workdir; raises NativeBuildError with the log.
    ``progress``: a line on stderr as each unit is compiled. ``objects_dir``: where compiled
    objects are kept by ``object_key``, a unit whose object is there not compiled again (a
    source tree that differs from a built one in one unit, as the tests' planted bugs do,
    compiles that unit and links)."""
    compiler = shlex.split(target.compiler)
    start, done, lock = time.monotonic(), [0], threading.Lock()

    def run(command: list[str]) -> tuple[int, str]:
        result = subprocess.run(command, cwd=workdir, capture_output=True, text=True, env=compiler_environment())
        return result.returncode, f"$ {shlex.join(command)}\n{result.stdout}{result.stderr}"

    def compile_unit(source: Path, object_file: Path) -> tuple[int, str]:
        command = [*compiler, *target.compile_flags(name if source.name == MODULE_UNIT else None),
                   *target.unit_flags(source.name), "-c"]
        kept = objects_dir / f"{source.stem}-{object_key(target, source, command)}.o" if objects_dir else None
        if kept is not None and kept.exists():
            shutil.copyfile(kept, object_file)
            code, text, outcome = 0, f"{source.name}: the object kept as {kept}", "kept"
        else:
            code, text = run([*command, str(source), "-o", str(object_file)])
            outcome = "compiled" if code == 0 else "FAILED"
            if code == 0 and kept is not None:
                objects_dir.mkdir(parents=True, exist_ok=True)
                partial = kept.with_name(f"{kept.name}.{os.getpid()}-{threading.get_ident()}")
                shutil.copyfile(object_file, partial)
                os.replace(partial, kept)  # whole or absent, for a build beside this one
        if progress:
            with lock:
                done[0] += 1
                _announce(f"  [{done[0]}/{len(sources)}] {outcome} {source.name} ({time.monotonic() - start:.0f} s)")
        return code, text

    objects = [workdir / f"{source.stem}.o" for source in sources]
    with ThreadPoolExecutor(_jobs(len(sources))) as pool:
        results = list(pool.map(compile_unit, sources, objects))
    library = workdir / f"{name}{sysconfig.get_config_var('EXT_SUFFIX')}"
    if all(code == 0 for code, _ in results):
        results.append(run([*compiler, *map(str, objects), *target.link_flags(), "-o", str(library)]))
    log = "\n".join(text for _, text in results)
    (workdir / "build.log").write_text(log)
    if any(code != 0 for code, _ in results):
        failed = "\n".join(text for code, text in results if code != 0)
        raise NativeBuildError(first_error_line(failed), workdir / "build.log")
    return library


def _lock(path: Path, name: str):
    """An exclusive flock on path (a file object; closing it, or the process's death, releases
    it), announced when another process holds it."""
    handle = open(path, "a+")
    try:
        import fcntl
    except ImportError:  # no flock (Windows): each build still works in its own directory
        return handle
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        _announce(f"waiting for another process building the native CPU kernels ({name}) ...")
        fcntl.flock(handle, fcntl.LOCK_EX)
    return handle


def build(
    source_dir: Path = SOURCE_DIR,
    *,
    march: str = "native",
    compiler: Optional[str] = None,
    sanitize: bool = False,
    quiet: bool = False,
) -> ModuleType:
    """Build (or find in the cache) and import the module of ``source_dir``; raises
    NativeBuildError on a failed build. ``quiet`` drops the start and end lines."""
    target = Target(compiler or compiler_command(), march, sanitize)
    name = module_name(source_dir, target)
    library, failure_log = cached_files(name)
    root = library.parent
    if library.exists():
        return load_module(library)
    root.mkdir(parents=True, exist_ok=True)
    with _lock(root / f"{name}.lock", name):
        if not library.exists():
            # Under the lock no other process builds this module: what a killed build left is debris.
            for debris in root.glob(f"{name}.build-*"):
                shutil.rmtree(debris, ignore_errors=True)
            workdir = Path(tempfile.mkdtemp(prefix=f"{name}.build-", dir=root))
            if not quiet:
                _announce(
                    f"building the native CPU kernels once for this machine (about a minute; "
                    f"`python -m oplib build` builds them ahead) in {root} ..."
                )
            start = time.monotonic()
            try:
                # Progress per unit only on a terminal: a log keeps the two lines.
                built = _compile(target, name, units(source_dir), workdir, progress=not quiet and sys.stderr.isatty(),
                                 objects_dir=root / "objects")
            except NativeBuildError as error:
                shutil.copyfile(error.log, failure_log)
                shutil.rmtree(workdir, ignore_errors=True)
                raise NativeBuildError(error.first_error, failure_log) from None
            os.replace(built, library)
            shutil.rmtree(workdir, ignore_errors=True)
            if not quiet:
                _announce(f"built the native CPU kernels in {time.monotonic() - start:.0f} s; cached as {library}")
    return load_module(library)


def _missing_tool() -> Optional[str]:
    compiler = compiler_command()
    if shutil.which(shlex.split(compiler)[0] if compiler.strip() else "c++") is None:
        return f"no C++ compiler ({compiler!r}) on the PATH"
    return None


def involution() -> Optional[ModuleType]:
    """The built module, or None where the plain-PyTorch kernels run (see the module docstring)."""
    return _load(requested())


@functools.cache
def _load(choice: str) -> Optional[ModuleType]:
    """Built once per process and choice; a fallback warns once."""
    if choice == "pytorch":
        return None
    reason = _missing_tool()
    if reason is None:
        try:
            return build()
        except NativeBuildError as error:
            reason = f"building the native CPU kernels failed: {error.first_error} (the whole log: {error.log})"
        except Exception as error:  # noqa: BLE001  (any other failure falls back too, with its reason)
            lines = str(error).strip().splitlines() or [repr(error)]
            reason = f"building the native CPU kernels failed: {lines[0]}"
    if choice == "native":
        raise RuntimeError(f"{ENV}=native, but the native CPU kernels are unavailable: {reason}")
    warnings.warn(
        f"oplib: involution runs its plain-PyTorch CPU kernels (slower): {reason}. A C++ compiler (GCC or clang, "
        f"with OpenMP) gives the native kernels, built once on first use; {ENV}=pytorch silences this.",
        NativeBuildWarning,
        stacklevel=3,
    )
    return None


def main(argv: Optional[list[str]] = None) -> int:
    """``python -m oplib build``: build (or find) the native CPU kernels now, not at the first
    involution call, and say where they are cached. The build takes about a minute, once per
    machine, torch and compiler; it needs a C++ compiler with OpenMP (``$CXX``, else ``c++``).
    Without one, involution runs its plain-PyTorch CPU kernels (slower).

        python -m oplib build                       # for this CPU, with $CXX or c++
        python -m oplib build --compiler clang++    # another compiler
    """

    from .._cli import parser as cli_parser

    parser = cli_parser("python -m oplib build", main.__doc__)
    parser.add_argument("--march", default="native", help="the -march to compile for (default: native, this CPU)")
    parser.add_argument("--compiler", default=None, help="the C++ compiler (default: $CXX, else c++)")
    args = parser.parse_args(argv)
    try:
        module = build(march=args.march, compiler=args.compiler)
    except NativeBuildError as error:
        print(f"python -m oplib build: the build failed: {error}", file=sys.stderr)
        return 1
    print(f"native CPU kernels: {module.__file__}")
    if args.march == "native" and args.compiler is None and requested() == "pytorch":
        print(f"note: {ENV}=pytorch in this environment, so the ops will not use them")
    return 0


def status() -> str:
    """One line for ``python -m oplib``: which CPU path involution takes here, and why."""
    choice = requested()
    module = involution()
    if module is not None:
        default = "" if ENV in os.environ else ", the default"
        return f"native ({ENV}={choice}{default}; built in {Path(module.__file__).parent})"
    if choice == "pytorch":
        return f"plain PyTorch ({ENV}=pytorch)"
    return f"plain PyTorch ({_missing_tool() or 'the native build failed'})"
