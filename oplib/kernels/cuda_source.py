"""The ``.cu`` sources of oplib's CUDA kernels as the host reads them: each kernel's
signature, the template arguments a host may launch it with, and the constants its launch
policy needs, all parsed from the source itself so that no fact of a kernel is written twice.

Every kernel is a ``template <typename scalar_t, ...> __global__ void name(...)``, optionally
with ``__launch_bounds__(MAX_THREADS[, MIN_BLOCKS])`` (numbers or constants of the source), whose
arguments are pointers and scalars of the types ``SCALAR_CTYPES`` lists; each launcher passes
every scalar as its declared type. A kernel templated on more than the
storage type lists the values of its other template parameters in ``// oplib-template:``
comment lines of its source, so that every instantiation a host may launch is known here
(``instantiations``) and compiled by the NVRTC tests: ``// oplib-template: NAME = a | b`` for a
parameter whose values combine with every other's, ``// oplib-template: A, B = 1, 2 | 3, 4`` for
parameters that only make sense together (the instantiations take these pairs, not all four).
A top-level ``constexpr int NAME = value;`` is a constant the host may read
(``KernelSource.constants``).
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import itertools
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Union

import torch
from torch import Tensor

KERNEL_DIR = Path(__file__).resolve().parent
# The headers every CUDA source may include (element.cuh, ...); each op's own sources lie in
# ``<op>/csrc/cuda/`` and are named relative to KERNEL_DIR (``load_source``).
INCLUDE_DIR = KERNEL_DIR / "csrc" / "cuda"

# The C++ storage type of each dtype, as the templates are instantiated.
CTYPES: dict[torch.dtype, str] = {
    torch.float32: "float",
    torch.float64: "double",
    torch.float16: "oplib_half",
    torch.bfloat16: "oplib_bfloat16",
}

# What CuPyLauncher hands NVRTC besides the source; the NVRTC tests compile with the same.
NVRTC_OPTIONS: tuple[str, ...] = ("--std=c++17", f"-I{INCLUDE_DIR}")


def name_expression(kernel: str, dtype: torch.dtype, specialisation: Sequence[str] = ()) -> str:
    """The C++ name of one instantiation of ``kernel``: ``involution_forward<float>``, or with
    the template arguments after the storage type, ``involution_forward_chunked<float, int, 7, 1, false>``."""
    return f"{kernel}<{', '.join((CTYPES[dtype], *specialisation))}>"


_LAUNCH_BOUNDS = r"(?:__launch_bounds__\s*\(([^)]*)\)\s*)?"
_KERNEL_PATTERN = re.compile(
    r"template\s*<([^>]*)>\s*__global__\s+" + _LAUNCH_BOUNDS + r"void\s+" + _LAUNCH_BOUNDS + r"(\w+)\s*\(([^)]*)\)"
)
# A source lists the template arguments of its specialised kernels in comment lines (see
# involution.cu): which kernels, then one line per template parameter after scalar_t, or per
# group of parameters that take their values together (span_tile.cu).
_INSTANTIATE_PATTERN = re.compile(r"^// oplib-instantiate:(.*)$", re.MULTILINE)
_TEMPLATE_PATTERN = re.compile(r"^// oplib-template:\s*(\w+(?:\s*,\s*\w+)*)\s*=(.*)$", re.MULTILINE)
_CONSTANT_PATTERN = re.compile(r"^constexpr\s+int\s+(\w+)\s*=\s*(-?\d+)\s*;", re.MULTILINE)

KernelArg = Union[Tensor, int, float]

# The scalar parameter types a kernel may declare, as ctypes passes them: what cuLaunchKernel
# reads from each parameter's address and what the host emulation's entry points take.
SCALAR_CTYPES: dict[str, type] = {
    "index_t": ctypes.c_longlong,
    "long long": ctypes.c_longlong,
    "int": ctypes.c_int,
    "unsigned int": ctypes.c_uint,
    "float": ctypes.c_float,
    "double": ctypes.c_double,
    "bool": ctypes.c_bool,
}


@dataclass(frozen=True)
class KernelSignature:
    name: str
    template_params: tuple[str, ...]  # the parameters after scalar_t, e.g. ("offset_t", "KERNEL")
    params: tuple[tuple[str, str], ...]  # (C++ type, name), as written with scalar_t
    # __launch_bounds__: the most threads a block may have, and the blocks per SM asked for
    # (None where the kernel declares none; the launchers refuse a larger block).
    max_threads: Optional[int] = None
    min_blocks: Optional[int] = None

    def instantiated_params(self, ctype: str) -> str:
        return ", ".join(f"{t.replace('scalar_t', ctype)} {n}" for t, n in self.params)

    @functools.cached_property
    def param_ctypes(self) -> tuple[type, ...]:
        """The ctypes type each parameter is passed as: c_void_p for a pointer, else its scalar type."""
        kinds = []
        for ctype, name in self.params:
            if "*" in ctype:
                kinds.append(ctypes.c_void_p)
                continue
            plain = " ".join(word for word in ctype.split() if word != "const")
            if plain not in SCALAR_CTYPES:
                raise ValueError(f"{self.name}: parameter {name} has type {ctype!r}; a kernel takes pointers and "
                                 f"{', '.join(SCALAR_CTYPES)}")
            kinds.append(SCALAR_CTYPES[plain])
        return tuple(kinds)


@dataclass(frozen=True)
class KernelSource:
    path: Path
    text: str

    @functools.cached_property
    def sha256(self) -> str:
        """Hash of the source and of the shared headers it may include (read once: the
        launchers key their caches by it on every launch)."""
        digest = hashlib.sha256(self.text.encode())
        for header in sorted(INCLUDE_DIR.glob("*.cuh")):
            digest.update(header.read_bytes())
        return digest.hexdigest()

    @functools.cached_property
    def kernels(self) -> dict[str, KernelSignature]:
        signatures = {}
        for match in _KERNEL_PATTERN.finditer(self.text):
            template_text, bounds_before, bounds_after, name, params_text = match.groups()
            template = [" ".join(p.split()) for p in template_text.split(",")]
            if template[0] != "typename scalar_t":
                raise ValueError(f"{self.path.name}: {name}'s first template parameter must be scalar_t")
            params = []
            for param in " ".join(params_text.split()).split(","):
                *type_words, param_name = param.strip().split(" ")
                params.append((" ".join(type_words), param_name))
            template_params = tuple(p.split(" ")[-1] for p in template[1:])
            # (the blocks per SM may name a template: split at the first comma only)
            bounds = [self._bound(v.strip(), i)
                      for i, v in enumerate((bounds_before or bounds_after or "").split(",", 1)) if v.strip()]
            signatures[name] = KernelSignature(name, template_params, tuple(params), *bounds[:2])
        return signatures

    def _bound(self, text: str, position: int) -> Optional[int]:
        """A launch bound: the most threads (position 0) a number or a ``constexpr int``; the
        blocks per SM may also be an expression of the template parameters (None here: its
        value is each instantiation's)."""
        if position == 1 and not re.fullmatch(r"\w+", text):
            return None
        return self._integer(text)

    def _integer(self, text: str) -> int:
        """A number, or a ``constexpr int`` of the source or its headers, as written in a launch bound."""
        if re.fullmatch(r"\d+", text):
            return int(text)
        if text not in self.constants:
            raise ValueError(f"{self.path.name}: __launch_bounds__ names {text!r}, which is no constexpr int here")
        return self.constants[text]

    @functools.cached_property
    def _template_lines(self) -> tuple[tuple[tuple[str, ...], tuple[tuple[str, ...], ...]], ...]:
        """Each ``oplib-template`` line: its parameters, and the tuples of values they take together."""
        lines = []
        for match in _TEMPLATE_PATTERN.finditer(self.text):
            names = tuple(name.strip() for name in match.group(1).split(","))
            choices = tuple(tuple(v.strip() for v in choice.split(",")) for choice in match.group(2).split("|"))
            if any(len(choice) != len(names) for choice in choices):
                raise ValueError(f"{self.path.name}: oplib-template {', '.join(names)} lists a choice of another length")
            lines.append((names, choices))
        return tuple(lines)

    @functools.cached_property
    def template_values(self) -> dict[str, tuple[str, ...]]:
        """Template parameter -> the values its ``oplib-template`` line lists, as written (each once)."""
        return {name: tuple(dict.fromkeys(choice[column] for choice in choices))
                for names, choices in self._template_lines for column, name in enumerate(names)}

    @functools.cached_property
    def constants(self) -> dict[str, int]:
        """The top-level ``constexpr int NAME = value;`` lines of the source and of the shared
        headers it may include."""
        texts = [header.read_text() for header in sorted(INCLUDE_DIR.glob("*.cuh"))] + [self.text]
        return {m.group(1): int(m.group(2)) for text in texts for m in _CONSTANT_PATTERN.finditer(text)}

    def _kernel_lines(self, name: str) -> tuple[tuple[tuple[str, ...], tuple[tuple[str, ...], ...]], ...]:
        """The ``oplib-template`` lines of kernel ``name``'s template parameters after scalar_t,
        in the parameters' order; raises where a parameter is listed by none."""
        params = self.kernels[name].template_params
        listed = {k.strip() for m in _INSTANTIATE_PATTERN.finditer(self.text) for k in m.group(1).split(",")}
        lines = sorted((line for line in self._template_lines if set(line[0]) & set(params)),
                       key=lambda line: min(params.index(p) for p in line[0] if p in params))
        covered = [p for names, _ in lines for p in names]
        if name not in listed or sorted(covered) != sorted(params):
            raise ValueError(f"{self.path.name}: {name}'s template arguments are not all listed (oplib-template)")
        return tuple(lines)

    def _arguments(self, name: str, lines, picks) -> tuple[str, ...]:
        value = {p: v for (names, _), pick in zip(lines, picks) for p, v in zip(names, pick)}
        return tuple(value[p] for p in self.kernels[name].template_params)

    def _specialisations_by(self, picks_of) -> dict[str, tuple[tuple[str, ...], ...]]:
        """Kernel -> its template argument tuples, one per pick (a choice of each of its lines)
        that ``picks_of(lines)`` yields; ``()`` alone for a kernel templated on scalar_t only."""
        result = {}
        for name, signature in self.kernels.items():
            if not signature.template_params:
                result[name] = ((),)
                continue
            lines = self._kernel_lines(name)
            result[name] = tuple(self._arguments(name, lines, picks) for picks in picks_of(lines))
        return result

    @functools.cached_property
    def specialisations(self) -> dict[str, tuple[tuple[str, ...], ...]]:
        """Kernel -> every tuple of template arguments after scalar_t that a host may launch
        (``()`` alone for a kernel templated on scalar_t only)."""
        return self._specialisations_by(lambda lines: itertools.product(*(choices for _, choices in lines)))

    @functools.cached_property
    def covering_specialisations(self) -> dict[str, tuple[tuple[str, ...], ...]]:
        """Kernel -> the fewest of its specialisations in which every choice of each of its
        ``oplib-template`` lines appears (the i-th takes each line's i-th choice, round and round):
        3 of involution.cu's 24 per chunked kernel, where its lines have 2, 3, 2 and 2 choices."""
        def round_and_round(lines):
            count = max(len(choices) for _, choices in lines)
            return ([choices[i % len(choices)] for _, choices in lines] for i in range(count))

        return self._specialisations_by(round_and_round)


def cuda_sources() -> list[str]:
    """Every CUDA source of oplib's ops, as ``load_source`` names them (``involution/csrc/cuda/involution.cu``)."""
    return sorted(path.relative_to(KERNEL_DIR).as_posix() for path in KERNEL_DIR.glob("*/csrc/cuda/*.cu"))


@functools.cache
def load_source(name: str) -> KernelSource:
    """The source ``name``, relative to ``oplib/kernels/`` (``involution/csrc/cuda/involution.cu``)."""
    path = KERNEL_DIR / name
    return KernelSource(path, path.read_text())


def instantiations(source: KernelSource) -> list[tuple[str, torch.dtype, tuple[str, ...]]]:
    """(kernel, dtype, specialisation) of every instantiation a host may launch from ``source``."""
    return [
        (kernel, dtype, specialisation)
        for kernel, specialisations in source.specialisations.items()
        for specialisation in specialisations
        for dtype in CTYPES
    ]


def covering_instantiations(source: KernelSource) -> list[tuple[str, torch.dtype, tuple[str, ...]]]:
    """(kernel, dtype, specialisation): for each kernel, every dtype and every covering
    specialisation (``KernelSource.covering_specialisations``) at least once, paired round and
    round: each storage type's code and each template choice's, without their every product
    (24 of involution.cu's 300 instantiations)."""
    dtypes = list(CTYPES)
    result = []
    for kernel, specialisations in source.covering_specialisations.items():
        for i in range(max(len(dtypes), len(specialisations))):
            result.append((kernel, dtypes[i % len(dtypes)], specialisations[i % len(specialisations)]))
    return result


def name_expressions(source: KernelSource) -> list[str]:
    """Every instantiation of ``source`` (every kernel, dtype and specialisation): what the
    NVRTC tests compile. A GPU compiles only those it launches (CuPyLauncher)."""
    return [name_expression(*instantiation) for instantiation in instantiations(source)]
