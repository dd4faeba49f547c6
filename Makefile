# The two commands of the README: `make run` (the main job) and `make test` (the suite).
# Each creates .venv and installs what it needs; torch is pinned to the CPU build that
# lies on this kind of machine's disk (a plain `torch` requirement pulls a CUDA build).

PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
TORCH_SPEC ?= torch==2.13.0

.PHONY: run test bench dist clean

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

# The three benchmarks always run and write their tables (bench/results/); the target fails if
# dense.py or involution.py misses its bar (rednet.py has none: it fails only if a step fails).
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
	rm -rf $(VENV) build dist *.egg-info
