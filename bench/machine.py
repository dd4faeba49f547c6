"""What the benchmark scripts print about the machine they ran on (they import this as a
sibling module: each is run as ``python bench/<name>.py``)."""

from __future__ import annotations

import os
import platform

import torch


def cpu_model() -> str:
    """The CPU's model name from /proc/cpuinfo (platform.processor() elsewhere)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def describe() -> str:
    """One line: CPU, cores, torch version and threads, Python version."""
    return (
        f"{cpu_model()}, {os.cpu_count()} cores, torch {torch.__version__} ({torch.get_num_threads()} threads), "
        f"Python {platform.python_version()}"
    )
