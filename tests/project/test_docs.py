"""The documentation as a reader gets it.

Unit tier: every ```python block of README.md and of docs/**/*.md runs, page by page, in order,
in one namespace (in a temporary working directory, so files the examples write land there);
a block marked ``<!-- not-run: why -->`` on the line above its fence is compiled and reported
as skipped with that reason. Every fence names its language, so Python cannot hide in an
unlabelled block, and the README's links into the repository resolve.

Integration tier: the site builds with ``mkdocs build --strict`` (what ``make docs`` runs),
and the same build fails on a planted link to a missing page, a planted link to a missing
anchor, a planted include of a missing benchmark table and a planted link to a missing chart."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import warnings
from pathlib import Path
from typing import NamedTuple, Optional

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
# Languages a fence may name; only python runs.
LANGUAGES = {"python", "console", "text"}
NOT_RUN = re.compile(r"^\s*<!-- not-run: (?P<reason>.+?) -->\s*$")
FENCE = re.compile(r"^(?P<indent>\s*)```(?P<language>\S*)\s*$")


class Block(NamedTuple):
    page: Path
    line: int  # of the first line of code, 1-based
    language: str
    source: str
    not_run: Optional[str]  # the reason, for a block marked not-run

    @property
    def name(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"


def _parse(page: Path) -> tuple[list[Block], list[int]]:
    """The fenced blocks of ``page``, each dedented by its fence's indentation, and the line
    numbers of not-run markers outside any fence that stand above no python fence."""
    lines = page.read_text().splitlines()
    blocks, stray, index = [], [], 0
    while index < len(lines):
        opening = FENCE.match(lines[index])
        if not opening:
            following = lines[index + 1].strip() if index + 1 < len(lines) else ""
            if NOT_RUN.match(lines[index]) and following != "```python":
                stray.append(index + 1)
            index += 1
            continue
        indent, start = len(opening["indent"]), index + 1
        end = next(i for i in range(start, len(lines)) if lines[i].strip() == "```")
        marker = NOT_RUN.match(lines[index - 1]) if index else None
        source = "\n".join(line[indent:] for line in lines[start:end]) + "\n"
        blocks.append(Block(page, start + 1, opening["language"], source, marker["reason"] if marker else None))
        index = end + 1
    return blocks, stray


def _blocks(page: Path) -> list[Block]:
    return _parse(page)[0]


def _python(page: Path) -> list[Block]:
    return [block for block in _blocks(page) if block.language == "python"]


def _page_id(page: Path) -> str:
    return str(page.relative_to(ROOT))


def _page_param(page: Path):
    """A page whose examples call torch.compile needs inductor's C++ compiler (conftest skips
    the ``needs_compiler`` mark, with the reason, where there is none)."""
    compiles = any("torch.compile(" in block.source for block in _python(page) if block.not_run is None)
    return pytest.param(page, id=_page_id(page), marks=[pytest.mark.needs_compiler] if compiles else [])


PYTHON_PAGES = [_page_param(page) for page in PAGES if any(block.not_run is None for block in _python(page))]
NOT_RUN_BLOCKS = [block for page in PAGES for block in _python(page) if block.not_run is not None]


def _compiled(block: Block):
    """The block's code, compiled so that a traceback names the page and the page's own line."""
    return compile("\n" * (block.line - 1) + block.source, str(block.page), "exec")


@pytest.mark.parametrize("page", PYTHON_PAGES)
def test_python_blocks_of_the_page_run(page, tmp_path, monkeypatch):
    """Every block runs; the README's (the quickstart) also without a warning a user would see
    (Python's default filters: deprecations hidden outside __main__)."""
    monkeypatch.chdir(tmp_path)
    namespace = {"__name__": "__docs__"}
    with warnings.catch_warnings(record=True) as caught:
        warnings.resetwarnings()
        warnings.simplefilter("default")
        for category in (DeprecationWarning, PendingDeprecationWarning, ImportWarning, ResourceWarning):
            warnings.filterwarnings("ignore", category=category)
        for number, block in enumerate(_python(page), start=1):
            if block.not_run is not None:
                continue
            try:
                exec(_compiled(block), namespace)
            except Exception as error:
                raise AssertionError(f"{block.name}: python block {number} of the page raised {error!r}") from error
    if page.name == "README.md":
        assert not caught, [f"{w.category.__name__}: {w.message} ({w.filename}:{w.lineno})" for w in caught]


@pytest.mark.parametrize("block", NOT_RUN_BLOCKS, ids=lambda block: block.name)
def test_not_run_block_compiles(block):
    _compiled(block)
    pytest.skip(f"{block.name} not run: {block.not_run}")


@pytest.mark.parametrize("page", PAGES, ids=_page_id)
def test_every_fence_names_its_language(page):
    unnamed = [block.name for block in _blocks(page) if block.language not in LANGUAGES]
    assert not unnamed, f"fences without one of the languages {sorted(LANGUAGES)}: {unnamed}"


@pytest.mark.parametrize("page", PAGES, ids=_page_id)
def test_not_run_markers_sit_above_python_fences(page):
    """A marker anywhere else (a blank line between it and the fence, say) would mark
    nothing, and its block would run."""
    stray = _parse(page)[1]
    assert not stray, f"{_page_id(page)}: not-run markers above no python fence at lines {stray}"


def test_readme_links_resolve():
    """The README is read on the repository page, outside the site's build: its relative
    links must name files that exist."""
    targets = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", (ROOT / "README.md").read_text())
    relative = [target for target in targets if "://" not in target]
    assert relative, "the README links to no page of docs/"
    missing = [target for target in relative if not (ROOT / target).exists()]
    assert not missing, f"README links to missing files: {missing}"


def _mkdocs_build(root: Path, site: Path) -> subprocess.CompletedProcess:
    environment = dict(os.environ, NO_MKDOCS_2_WARNING="1")
    command = [sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file", root / "mkdocs.yml", "--site-dir", site]
    return subprocess.run([str(c) for c in command], cwd=root, env=environment, capture_output=True, text=True, timeout=600)


@pytest.mark.integration
def test_site_builds_strict(tmp_path):
    result = _mkdocs_build(ROOT, tmp_path / "site")
    assert result.returncode == 0, result.stdout + result.stderr
    # The benchmark pages carry the tables of bench/results/ as they are.
    title = (ROOT / "bench" / "results" / "involution.md").read_text().splitlines()[0].removeprefix("# ")
    assert title in (tmp_path / "site" / "benchmarks" / "involution" / "index.html").read_text()
    assert (tmp_path / "site" / "api" / "index.html").is_file()


class PlantedFault(NamedTuple):
    name: str
    line: str  # appended to docs/index.md
    message: str  # a regex the failed build prints


PLANTED_FAULTS = [
    PlantedFault("link to a missing page", "[missing](no-such-page.md)", r"no-such-page\.md"),
    PlantedFault("link to a missing anchor", "[missing](ops.md#no-such-anchor)", r"no-such-anchor"),
    PlantedFault("include of a missing table", '--8<-- "bench/results/no-such-table.md"', r"no-such-table\.md"),
    # The charts reach the site through mkdocs_hooks.py; one the results folder lacks fails.
    PlantedFault("missing chart", "![missing](benchmarks/results/no-such-chart.png)", r"no-such-chart\.png"),
]


def _copy_of_the_sources(tmp_path: Path) -> Path:
    """What the site is built from: its config and hooks, its pages and the files they
    include, and oplib (the API reference reads its docstrings)."""
    copy = tmp_path / "copy"
    for name in ("mkdocs.yml", "mkdocs_hooks.py", "README.md"):
        (copy / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / name, copy / name)
    for folder in ("docs", "bench/results", "oplib"):
        shutil.copytree(ROOT / folder, copy / folder, ignore=shutil.ignore_patterns("__pycache__"))
    return copy


@pytest.mark.integration
def test_copy_of_the_sources_builds(tmp_path):
    """The control of the planted faults below: without one, the copy builds."""
    result = _mkdocs_build(_copy_of_the_sources(tmp_path), tmp_path / "site")
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.integration
@pytest.mark.parametrize("fault", PLANTED_FAULTS, ids=lambda fault: fault.name)
def test_planted_fault_fails_the_build(fault, tmp_path):
    """The copy of the site's sources, with one fault planted in its home page."""
    copy = _copy_of_the_sources(tmp_path)
    with (copy / "docs" / "index.md").open("a") as index:
        index.write(f"\n{fault.line}\n")
    result = _mkdocs_build(copy, tmp_path / "site")
    output = result.stdout + result.stderr
    assert result.returncode != 0, f"the build passed with a {fault.name}:\n{output}"
    assert re.search(fault.message, output), output


# Prose that reads as a measurement: a number with a unit of time, rate or size, or a ratio
# ("2.5x"). Benchmark pages include their tables from bench/results/ (`--8<--` lines, not
# prose), so a measured figure in markdown can only be one typed by hand, and goes stale at
# the next run.
MEASUREMENT = re.compile(r"\b\d+(?:\.\d+)?(?: ?(?:ms|µs|us|ns|s|min|h|seconds|minutes|hours|GB/s|MB/s|img/s|MB|GB|KB)\b|x\b)")
PROSE_PAGES = [*PAGES, ROOT / "CHANGELOG.md", ROOT / "tests" / "README.md"]


def _prose_lines(page: Path):
    inside_fence = False
    for number, line in enumerate(page.read_text().splitlines(), 1):
        if FENCE.match(line):
            inside_fence = not inside_fence
        elif not inside_fence:
            yield number, line


@pytest.mark.parametrize("page", PROSE_PAGES, ids=lambda page: str(page.relative_to(ROOT)))
def test_no_measured_figure_is_typed_into_markdown(page):
    """Figures come from the files in bench/results/ (included, or drawn as charts), never
    retyped: a number with a unit or an 'x' ratio outside code blocks fails, naming the line."""
    typed = [f"{page.relative_to(ROOT)}:{number}: {line.strip()}" for number, line in _prose_lines(page) if MEASUREMENT.search(line)]
    assert not typed, "measured figures typed into markdown (take them from bench/results/):\n" + "\n".join(typed)


def test_the_measurement_pattern_finds_typed_figures():
    assert all(MEASUREMENT.search(text) for text in ("takes 2.35 ms", "1.7x its yardstick", "38.0 GB/s", "15.5 img/s", "20 min"))
    assert not any(MEASUREMENT.search(text) for text in ("K = 7", "batch 8", "RedNet-50", "stage1 64@56 s1", "x86_64"))
