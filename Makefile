# The commands of the README: `make run` (the main job), `make test` (the unit tier, for
# every change), `make test-all` (every test: the unit tier plus the integration tier,
# what CI runs) and `make docs` (the documentation site, into site/). Each creates .venv and
# installs what it needs; torch is pinned to the CPU build that lies on this kind of
# machine's disk (a plain `torch` requirement pulls a CUDA build). `make test-oldest` runs
# the whole suite in .venv-oldest on the oldest torch that pyproject.toml accepts (from the
# package index: a CUDA build of a few GB, run on CPU).

PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
TORCH_SPEC ?= torch==2.13.0
TORCH_OLDEST ?= torch==2.12.0
# pytest-xdist workers: one per core (conftest.py gives each one torch thread). worksteal: a
# worker that runs out takes queued tests from the other, where the default hands out fixed
# shares and one core could idle at the end (the unit tier here: 471 s with it; 489 and 518 s
# without, on nearly the same tests).
WORKERS ?= auto
# Extra pytest arguments, e.g. `make test PYTEST_ARGS="-x -k involution"`.
PYTEST_ARGS ?=
PYTEST := $(PY) -m pytest -n $(WORKERS) --dist worksteal --durations=15 $(PYTEST_ARGS)

.PHONY: run test test-all test-oldest docs bench dist clean gpu-check gpu-prebuild toolchains

# Two steps, so that `make run` installs only what it runs (torch, oplib and the `train`
# extra): the test and docs extras (CuPy, NVRTC, ONNX Runtime, mkdocs, ...) are a minute or
# more of downloads that the main job never imports.
$(VENV)/.installed-run: pyproject.toml Makefile
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet "$(TORCH_SPEC)"
	$(PY) -m pip install --quiet -e ".[train]"
	touch $@

$(VENV)/.installed: $(VENV)/.installed-run
	$(PY) -m pip install --quiet -e ".[test,train,docs]"
	touch $@

# The main job: the op table and self-check, then the RedNet training run on the digits.
run: $(VENV)/.installed-run
	$(PY) -m oplib check
	$(PY) -m oplib train --out runs/digits

# The unit tier: every test not marked `integration` (tests/README.md says what each tier holds).
test: $(VENV)/.installed
	$(PYTEST) -m "not integration"

test-all: $(VENV)/.installed toolchains
	$(PYTEST)

# The integration tier also builds the native CPU kernels with clang (and its OpenMP) and
# compiles them for aarch64: Debian's packages, installed here where this runs as root with
# apt-get (CI, the dev containers) and they are missing; elsewhere those tests skip, naming
# what to install. A failed install fails nothing: the tests say what is absent.
TOOLCHAIN_PACKAGES ?= clang libomp-dev g++-aarch64-linux-gnu
toolchains:
	@if command -v clang++ >/dev/null && command -v aarch64-linux-gnu-g++ >/dev/null \
	    && echo '#include <omp.h>' | clang++ -fopenmp -x c++ -fsyntax-only - 2>/dev/null; then \
	  echo "toolchains: clang++ (with OpenMP) and aarch64-linux-gnu-g++ are installed"; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
	    $(TOOLCHAIN_PACKAGES) >/dev/null) || echo "toolchains: could not install $(TOOLCHAIN_PACKAGES); their tests skip"; \
	else \
	  echo "toolchains: not root or no apt-get: install $(TOOLCHAIN_PACKAGES) for the clang and aarch64 tests"; \
	fi

test-oldest:
	$(MAKE) test-all VENV=.venv-oldest TORCH_SPEC="$(TORCH_OLDEST)"

# The site of docs/ (mkdocs.yml) into site/, every warning an error: a link to a missing page
# or anchor, a page left out of the nav, a missing bench/results/ table. NO_MKDOCS_2_WARNING
# quiets the Material theme's banner about its end of life (May 2027), printed on every build.
docs: $(VENV)/.installed
	NO_MKDOCS_2_WARNING=1 $(PY) -m mkdocs build --strict --site-dir site

# Every benchmark always runs and writes its table (bench/results/); the target fails if
# dense.py, involution.py or host_launch.py misses its bar, or if any step fails (layer.py, rednet.py,
# backbone.py and cuda_resources.py have no bar).
bench: $(VENV)/.installed
	status=0; $(PY) bench/dense.py || status=1; $(PY) bench/involution.py || status=1; \
	$(PY) bench/involution.py --layouts-only || status=1; $(PY) bench/layer.py || status=1; \
	$(PY) bench/rednet.py || status=1; $(PY) bench/backbone.py || status=1; $(PY) bench/host_launch.py || status=1; $(PY) bench/cuda_resources.py || status=1; $(PY) bench/cuda_model.py || status=1; \
	exit $$status

# The sdist, then the wheel built from it, by the standard frontend; metadata checked as the
# package index checks it. (tests/project/test_package.py also installs that wheel and runs it.)
dist: $(VENV)/.installed
	rm -rf dist build
	$(PY) -m build --outdir dist .
	$(PY) -m twine check --strict dist/*

# On a machine with a GPU, with the Python that holds its CUDA torch (GPU_PYTHON; CuPy installed
# if missing, the only download): tools/gpu_check.py's stages in order, each under a time budget
# (8 minutes in all on an H100 or H200; docs/development.md): the kernels loaded, every needs_cuda
# test, the kernel, layer and launch tables, Nsight Compute, compute-sanitizer's memcheck, the
# models. Each writes its table to bench/results/ as it ends, with the summary gpu-check.md.
# OUT=DIR (a lent device's $OUT): the tables into a temporary folder and every file the run
# wrote into DIR/gpu-check.tar.gz, rewritten after each stage. STAGES=a,b: those stages only;
# GPU_BUDGET=seconds: the total (default: the stages' budgets summed).
# DRY=1: every stage on this machine's CPU with tiny sizes, into a temporary folder (no GPU).
# OPLIB_CUDA_PREBUILT=build/cuda-sm_90 loads the kernels that `make gpu-prebuild` compiled here.
GPU_PYTHON ?= python3
CUDA_EXTRA ?= cupy-cuda13x>=13
GPU_ARCH ?= sm_90
OUT ?=
STAGES ?=
GPU_BUDGET ?=
DRY ?=
GPU_CHECK_ARGS = $(if $(DRY),--dry) $(if $(OUT),--out $${TMPDIR:-/tmp}/oplib-gpu-check --archive $(OUT)/gpu-check.tar.gz) \
	$(if $(STAGES),--stages $(STAGES)) $(if $(GPU_BUDGET),--budget $(GPU_BUDGET))
gpu-check: $(if $(DRY),$(VENV)/.installed)
	$(if $(DRY),,$(GPU_PYTHON) -c "import cupy" 2>/dev/null || $(GPU_PYTHON) -m pip install "$(CUDA_EXTRA)")
	PYTHONPATH=$(CURDIR) $(if $(DRY),$(PY),$(GPU_PYTHON)) tools/gpu_check.py $(GPU_CHECK_ARGS)

# Every CUDA kernel compiled here for GPU_ARCH by NVRTC (no GPU needed; two minutes), into
# build/cuda-$(GPU_ARCH)/ with its manifest: carried to a GPU machine, OPLIB_CUDA_PREBUILT names it.
gpu-prebuild: $(VENV)/.installed
	$(PY) -m oplib.testing.cuda_prebuild --arch $(GPU_ARCH) --out build/cuda-$(GPU_ARCH)

clean:
	rm -rf $(VENV) .venv-oldest build dist site *.egg-info
