# The two commands of the README: `make run` (the main job) and `make test` (the suite).
# Each creates .venv and installs what it needs; torch is pinned to the CPU build that
# lies on this kind of machine's disk (a plain `torch` requirement pulls a CUDA build).

PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
TORCH_SPEC ?= torch==2.13.0

.PHONY: run test bench clean

$(VENV)/.installed: pyproject.toml Makefile
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet "$(TORCH_SPEC)"
	$(PY) -m pip install --quiet -e ".[test]"
	touch $@

run: $(VENV)/.installed
	$(PY) -m oplib

test: $(VENV)/.installed
	$(PY) -m pytest

bench: $(VENV)/.installed
	$(PY) bench/dense.py
	$(PY) bench/involution.py

clean:
	rm -rf $(VENV) build *.egg-info
