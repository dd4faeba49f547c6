"""The distribution as users get it: the sdist and the wheel built by the standard build
frontend, their metadata checked as the package index checks it, and the wheel installed
into a fresh virtual environment, outside the source tree and not editable, where
``python -m oplib list`` and involution's self-check (which compiles the installed CUDA
sources) must pass. Every op's self-check is proven in the source tree (tests/cli/test_cli.py and
the generated tests run the same checks); here what is proven is the installed files."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import torch

import oplib
from oplib import registry

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.integration


def _run(command: list, cwd: Path, timeout: int = 900) -> subprocess.CompletedProcess:
    result = subprocess.run([str(c) for c in command], cwd=cwd, capture_output=True, text=True, timeout=timeout)
    assert result.returncode == 0, f"{' '.join(map(str, command))} failed:\n{result.stdout[-4000:]}\n{result.stderr[-4000:]}"
    return result


def _project_files() -> list[str]:
    """The files of the project as a clone has them: tracked, or new and not ignored."""
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard"], cwd=ROOT, capture_output=True, text=True, check=True
    )
    return [name for name in listed.stdout.splitlines() if (ROOT / name).is_file()]


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> dict[str, Path]:
    """The sdist and the wheel built from it (what `make dist` makes), and a wheel built
    straight from the sources. Built from a copy of the project's files: setuptools would
    otherwise reuse the file list of the editable install's egg-info in the working tree,
    which can name files the package data no longer declares."""
    source = tmp_path_factory.mktemp("source")
    for name in _project_files():
        (source / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / name, source / name)
    from_sdist = tmp_path_factory.mktemp("dist")
    _run([sys.executable, "-m", "build", "--outdir", from_sdist, source], cwd=from_sdist)
    direct = tmp_path_factory.mktemp("direct")
    _run([sys.executable, "-m", "build", "--wheel", "--outdir", direct, source], cwd=direct)
    (sdist,) = from_sdist.glob("*.tar.gz")
    (wheel,) = from_sdist.glob("*.whl")
    (direct_wheel,) = direct.glob("*.whl")
    return {"sdist": sdist, "wheel": wheel, "direct wheel": direct_wheel}


def _members(wheel: Path) -> dict[str, bytes]:
    with zipfile.ZipFile(wheel) as archive:
        return {name: archive.read(name) for name in archive.namelist()}


def test_distribution_names_and_version(built):
    version = oplib.__version__
    assert built["sdist"].name == f"torch_oplib-{version}.tar.gz"
    assert built["wheel"].name == f"torch_oplib-{version}-py3-none-any.whl"


def test_sdist_rebuilds_the_same_wheel(built):
    assert _members(built["wheel"]) == _members(built["direct wheel"])


def test_metadata_passes_twine_check(built):
    _run([sys.executable, "-m", "twine", "check", "--strict", built["sdist"], built["wheel"]], cwd=ROOT)
    metadata = _members(built["wheel"])[f"torch_oplib-{oplib.__version__}.dist-info/METADATA"].decode()
    assert "License-Expression: MIT" in metadata
    assert "Description-Content-Type: text/markdown" in metadata
    assert f"torch-oplib/{oplib.__version__}" not in metadata  # no placeholder URLs


def test_wheel_holds_every_file_of_the_package(built):
    """Every file of oplib/ (the .cu and .cuh sources and the emulation's header included)
    is in the wheel."""
    files = {name for name in _project_files() if name.startswith("oplib/")}
    assert any(name.endswith(".cu") for name in files)
    missing = files - set(_members(built["wheel"]))
    assert not missing, f"not in the wheel: {sorted(missing)}"


def test_installed_wheel_runs_the_self_check(built, tmp_path):
    """A fresh virtual environment with torch and the wheel (no source tree on the path):
    ``python -m oplib --version``, ``list`` (every op registered from the installed files) and
    involution's self-check (its installed ``.cu`` through the host emulation) pass there."""
    venv = tmp_path / "venv"
    _run([sys.executable, "-m", "venv", venv], cwd=tmp_path)
    python = venv / "bin" / "python"
    torch_spec = f"torch=={torch.__version__.split('+')[0]}"
    _run([python, "-m", "pip", "install", "--quiet", torch_spec, built["wheel"]], cwd=tmp_path)
    located = _run([python, "-c", "import oplib; print(oplib.__file__)"], cwd=tmp_path).stdout.strip()
    assert Path(located).is_relative_to(venv), located
    version = _run([python, "-m", "oplib", "--version"], cwd=tmp_path).stdout.strip()
    assert version == f"torch-oplib {oplib.__version__}"
    listed = " ".join(_run([python, "-m", "oplib", "list"], cwd=tmp_path).stdout.split())
    for spec in registry.all_specs():
        assert spec.schema in listed, listed
    check = _run([python, "-m", "oplib", "check", "--op", "involution"], cwd=tmp_path, timeout=1800).stdout
    assert re.search(r"\n\d+ passed, 0 failed, 0 not applicable", check), check[-3000:]
    assert re.search(r"  involution\s+cpu\s+CUDA sources\s+pass", check), check[-3000:]


def _readme_checkout_installs() -> list[str]:
    """The README's install-from-a-checkout commands (``pip install .`` and its extras)."""
    text = (ROOT / "README.md").read_text()
    section = text[text.index("## Install") :]
    block = section[section.index("```") + 3 :]
    block = block[: block.index("```")]
    commands = [line.split("#")[0].strip() for line in block.splitlines()]
    return [command for command in commands if command.startswith(("pip install .", "pip install '.["))]


def test_install_from_a_checkout_as_the_readme_says(tmp_path):
    """The README's first install command, ``pip install .`` in a copy of the checkout, into a
    fresh virtual environment that has the pinned torch: oplib imports from there and runs."""
    commands = _readme_checkout_installs()
    assert commands[0] == "pip install .", commands
    checkout = tmp_path / "oplib"
    for name in _project_files():
        (checkout / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / name, checkout / name)
    venv = tmp_path / "venv"
    _run([sys.executable, "-m", "venv", venv], cwd=tmp_path)
    python = venv / "bin" / "python"
    _run([python, "-m", "pip", "install", "--quiet", f"torch=={torch.__version__.split('+')[0]}"], cwd=tmp_path)
    pip, install, *arguments = commands[0].split()
    _run([python, "-m", pip, install, "--quiet", *arguments], cwd=checkout)
    located = _run([python, "-c", "import oplib; print(oplib.__file__)"], cwd=tmp_path).stdout.strip()
    assert Path(located).is_relative_to(venv), located
    listed = " ".join(_run([python, "-m", "oplib", "list"], cwd=tmp_path).stdout.split())
    assert all(spec.schema in listed for spec in registry.all_specs()), listed
    # No warning on a plain install: before numpy was a dependency, torch warned "Failed to
    # initialize NumPy" at every import.
    quiet = _run([python, "-W", "error", "-c", "import oplib, oplib.models, oplib.onnx"], cwd=tmp_path)
    assert quiet.stderr == "", quiet.stderr
