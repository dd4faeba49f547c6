"""The main job, ``python -m oplib``."""

import argparse
import json
import os
import re
import subprocess
import sys
import sysconfig

import pytest

from oplib import __main__ as cli
from oplib import registry, selfcheck
from oplib.kernels import native
from oplib.testing.toolchain import missing_host_compiler, missing_inductor_compiler


def test_list_prints_every_registered_op_within_100_columns(capsys):
    """Before: one table as wide as the longest schema (351 columns)."""
    assert cli.main(["list"]) == 0
    out = capsys.readouterr().out
    assert max(len(line) for line in out.splitlines()) <= 100
    listed = " ".join(out.split())
    for spec in registry.all_specs():
        assert spec.schema in listed


def test_check_passes_and_prints_each_row_once(capsys, monkeypatch):
    """One op's whole self-check: involution's, the one op where every check applies (its
    CUDA sources run through the host emulation). The generated tests run the same checks on
    every op; this proves the command and its report, a row per check, printed once (before:
    every row again in a matrix at the end)."""
    monkeypatch.delenv("OPLIB_CPU_KERNELS", raising=False)
    assert cli.main(["check", "--op", "involution", "--device", "cpu"]) == 0
    out = capsys.readouterr().out
    for check in selfcheck.CHECKS:
        rows = [line for line in out.splitlines() if re.match(rf"\s+involution\s+cpu\s+{re.escape(check)}\s", line)]
        assert len(rows) == 1, (check, out)
    # Without a C++ compiler, torch.compile and the CUDA sources' host emulation cannot run.
    missing = [reason for reason in (missing_inductor_compiler(), missing_host_compiler()) if reason is not None]
    assert f"{len(selfcheck.CHECKS) - len(missing)} passed, 0 failed, {len(missing)} not applicable" in out
    assert all(reason in out for reason in missing)
    assert all(name in out for name in selfcheck.CHECKS)
    if native._missing_tool() is None:
        assert "involution's CPU kernels: native (OPLIB_CPU_KERNELS=auto, the default; built in " in out
    else:
        assert f"involution's CPU kernels: plain PyTorch ({native._missing_tool()})" in out


def test_a_failing_check_gives_a_nonzero_exit_code(monkeypatch, capsys):
    def broken(spec, device):
        raise AssertionError("planted failure")

    # The broken check alone: the others pass in the test above.
    monkeypatch.setattr(selfcheck, "CHECKS", {"eager vs reference": broken})
    assert cli.main(["check", "--op", "exp"]) == 1
    captured = capsys.readouterr()
    assert "FAIL" in captured.out and "planted failure" in captured.err


def test_check_without_a_compiler_passes_what_it_can(tmp_path):
    """On a machine with no C++ compiler, torch.compile cannot generate CPU code (torch's own
    requirement): the self-check reports that cell as not applicable, with the reason, and
    passes the rest, instead of failing on InvalidCxxCompiler."""
    env = dict(os.environ, CXX=str(tmp_path / "no-such-c++"), TORCHINDUCTOR_CACHE_DIR=str(tmp_path / "inductor"))
    result = subprocess.run(
        [sys.executable, "-m", "oplib", "check", "--op", "exp", "--device", "cpu"],
        capture_output=True, text=True, timeout=600, env=env,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert re.search(r"exp\s+cpu\s+torch\.compile\s+n/a", result.stdout), result.stdout
    assert "inductor) needs a C++ compiler" in result.stdout
    assert re.search(r"exp\s+cpu\s+eager vs reference\s+pass", result.stdout), result.stdout


def test_help_lists_every_command(capsys):
    with pytest.raises(SystemExit) as exited:
        cli.main(["--help"])
    assert exited.value.code == 0
    out = capsys.readouterr().out
    for command in ("list", "check", "info", *cli.DELEGATED):
        assert re.search(rf"^    {command}\s", out, flags=re.MULTILINE), command


def test_a_bare_command_prints_the_help_and_runs_nothing(capsys):
    """Before: a bare ``python -m oplib`` ran the whole self-check (a minute here)."""
    assert cli.main([]) == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: python -m oplib") and "self-check on" not in out


COMMANDS = ["", "list", "check", *cli.DELEGATED]


@pytest.mark.parametrize("command", COMMANDS, ids=[c or "bare" for c in COMMANDS])
def test_every_help_is_plain_text_and_every_argument_has_help(command, monkeypatch, capsys):
    """Before: ``train --help`` stopped mid-sentence (the docstring's first line), the help
    showed RST markup, and ``export``'s OUT, ``--depth`` and ``--format`` had no help."""
    parsers = []
    real_parse = argparse.ArgumentParser.parse_args

    def recording(self, *args, **kwargs):
        parsers.append(self)
        return real_parse(self, *args, **kwargs)

    monkeypatch.setattr(argparse.ArgumentParser, "parse_args", recording)
    with pytest.raises(SystemExit) as exit_info:
        cli.main([*([command] if command else []), "--help"])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    assert not re.search(r"``|:[a-z]+:`", out), out
    parser = parsers[-1] if command in cli.DELEGATED else cli._parser()
    if command in ("list", "check"):
        parser = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices[command]
    undocumented = [a.dest for a in parser._actions if not a.help and not isinstance(a, argparse._SubParsersAction)]
    assert not undocumented, undocumented


def test_the_help_holds_the_whole_docstring(capsys):
    from oplib import train

    with pytest.raises(SystemExit):
        cli.main(["train", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert "every step runs the N shares as separate forwards and averages their losses." in out
    assert "Writes to --out: checkpoint.pt" in out
    assert train.__doc__.splitlines()[1].split()[0] in out


def test_info_reports_the_environment_and_builds_nothing(tmp_path):
    """``python -m oplib info``: the versions, the CPU kernels' state and cache, CUDA and the
    extras; with an empty extension cache it says the kernels are not built, and builds none."""
    env = dict(os.environ, TORCH_EXTENSIONS_DIR=str(tmp_path / "cache"))
    env.pop("OPLIB_CPU_KERNELS", None)
    result = subprocess.run([sys.executable, "-m", "oplib", "info"], capture_output=True, text=True, timeout=300, env=env)
    assert result.returncode == 0, result.stderr
    import oplib
    import torch

    out = result.stdout
    for expected in (f"oplib:              {oplib.__version__}", torch.__version__, "OPLIB_CPU_KERNELS:  auto (the default)",
                     str(tmp_path / "cache" / "oplib"), "GPUs:", "CuPy:", "extras:", "onnx:", "testing:"):
        assert expected in out, (expected, out)
    if native._missing_tool() is None:
        assert "native CPU kernels: not built yet" in out and "python -m oplib build" in out
    assert not list(tmp_path.glob("cache/**/*.so"))


def test_info_as_json_is_the_same_report(capsys, monkeypatch, tmp_path):
    """``info --json``: the report above as JSON (in this process: the fresh process above
    already proves the command builds nothing)."""
    import oplib
    from oplib import info

    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path / "cache"))
    assert info.main(["--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["oplib"]["oplib"].startswith(oplib.__version__) and set(report["extras"]) >= {"onnx", "train", "models"}
    assert "native CPU kernels" in json.dumps(report) and report.keys() == info.collect().keys()


def test_info_says_when_the_kernels_are_built(capsys, monkeypatch, tmp_path):
    from oplib import info

    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    if native._missing_tool() is not None:
        pytest.skip(native._missing_tool())
    name = native.module_name(native.SOURCE_DIR, native.Target(native.compiler_command()))
    library = tmp_path / "oplib" / f"{name}{sysconfig.get_config_var('EXT_SUFFIX')}"  # where build() puts it
    library.parent.mkdir()
    library.touch()
    assert info.collect()["CPU kernels"]["native CPU kernels"] == f"built for this machine: {library}"


@pytest.mark.parametrize(
    "flags,message",
    [
        (["--epochs", "0"], r"--epochs: expected a positive int, got 0"),
        (["--epochs", "-1"], r"--epochs: expected a positive int, got -1"),
        (["--batch-size", "-8"], r"--batch-size: expected a positive int, got -8"),
        (["--batch-size", "0"], r"--batch-size: expected a positive int, got 0"),
        (["--steps", "-3"], r"--steps: expected a positive int, got -3"),
        (["--emulate-world-size", "0"], r"--emulate-world-size: expected a positive int, got 0"),
        (["--group-channels", "0"], r"--group-channels: expected a positive int, got 0"),
        (["--lr", "0"], r"--lr: expected a positive float, got 0"),
        (["--blocks", "1,2"], r"--blocks: expected four positive counts separated by commas, got '1,2'"),
        (["--width", "12", "--group-channels", "4"], r"RedNet: the stem's involution has width // 2 = 6 channels"),
        (["--batch-size", "10", "--emulate-world-size", "3"], r"--batch-size 10 must be divisible by --emulate-world-size 3"),
        (["--batch-size", "100000"], r"--batch-size 100000 is larger than the \d+ training images"),
        (["--resume", "--out", "{tmp}"], r"--resume: no checkpoint at .*checkpoint\.pt"),
    ],
)
def test_train_rejects_bad_flags_with_a_usage_error(flags, message, tmp_path, capsys):
    """Before: --epochs 0/-1, --batch-size -8 and --steps -3 trained nothing and exited 0; the
    others ended in tracebacks."""
    flags = [f.format(tmp=tmp_path / "empty") for f in flags]
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["train", *flags])
    assert exit_info.value.code == 2
    error = capsys.readouterr().err.strip().splitlines()[-1]
    assert error.startswith("python -m oplib train: error: ")
    assert re.search(message, error), error


@pytest.mark.parametrize("short", [False, True], ids=["--version", "-V"])
def test_version_is_the_declared_one(capsys, short):
    import importlib.metadata

    import oplib

    with pytest.raises(SystemExit) as exit_info:
        cli.main(["-V" if short else "--version"])
    assert exit_info.value.code == 0
    assert capsys.readouterr().out.strip() == f"torch-oplib {oplib.__version__}"
    assert importlib.metadata.version("torch-oplib") == oplib.__version__


def test_info_reads_the_installed_distributions_once(monkeypatch):
    """Before: each of the report's ten lookups of an import name's distributions walked every
    installed distribution's file list again (``info`` took 10 s here, 1 s after)."""
    import importlib.metadata

    from oplib import info

    walks = []
    real = importlib.metadata.packages_distributions

    def counting():
        walks.append(1)
        return real()

    monkeypatch.setattr(importlib.metadata, "packages_distributions", counting)
    first = info.collect()
    assert len(walks) == 1
    assert info.collect() == first and len(walks) == 2  # a second report reads them again
