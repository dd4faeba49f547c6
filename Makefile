# The two commands of the README: `make run` (the main job) and `make test` (the suite).
# Each creates .venv and installs what it needs; torch is pinned to the CPU build that
# lies on this kind of machine's disk (a plain `torch` requirement pulls a CUDA build).
# `make test-oldest` runs the same suite in .venv-oldest on the oldest torch that
# pyproject.toml accepts (from the package index: a CUDA build of a few GB, run on CPU).

PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
TORCH_SPEC ?= torch==2.13.0
TORCH_OLDEST ?= torch==2.12.0

.PHONY: run test test-oldest bench dist clean

$(VENV)/.installed: pyproject.toml Makefile
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet "$(TORCH_SPEC)"
	$(PY) -m pip install --quiet -e ".[test,train]"
	touch $@

# The main job: the op table and self-check, then the RedNet training run on the digits.
run: $(VENV)/.installed
	$(PY) -m oplib
	$(PY) -m oplib train --out runs/digits

test: $(VENV)/.installed
	$(PY) -m pytest

test-oldest:
	$(MAKE) test VENV=.venv-oldest TORCH_SPEC="$(TORCH_OLDEST)"

# Both benchmarks always run and write their tables; the target fails if either misses its bar.
bench: $(VENV)/.installed
	status=0; $(PY) bench/dense.py || status=1; $(PY) bench/involution.py || status=1; \
	$(PY) bench/rednet.py || status=1; exit $$status

# The sdist, then the wheel built from it, by the standard frontend; metadata checked as the
# package index checks it. (tests/test_package.py also installs that wheel and runs it.)
dist: $(VENV)/.installed
	rm -rf dist build
	$(PY) -m build --outdir dist .
	$(PY) -m twine check --strict dist/*

clean:
	rm -rf $(VENV) .venv-oldest build dist *.egg-info
