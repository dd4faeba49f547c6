"""Registers, spills and shared memory of every CUDA kernel x dtype x target, as NVRTC compiles
them with CuPy's options (no GPU needed): writes bench/results/cuda-resources.md.

    python bench/cuda_resources.py
"""

from __future__ import annotations

from _harness import RESULTS
from oplib.testing.nvrtc import all_resource_usage, resource_table


def main() -> None:
    path = RESULTS / "cuda-resources.md"
    path.write_text(resource_table(all_resource_usage()))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
