# `make demo` and `make test` are the whole setup: each creates .venv when it is missing.
PY      ?= python3.11
VENV    := .venv
PYTHON  := $(VENV)/bin/python
STAMP   := $(VENV)/.installed
# torch is pinned: a CPU wheel of exactly this version lies on every machine; anything
# else downloads a multi-GB CUDA build.
PINS    := torch==2.13.0 jax==0.10.2 jaxlib==0.10.2 helion==1.5.1
DEPS    := numpy psutil
# ruff and pytest-randomly are pinned: a new ruff release adds rules, a new randomly
# release may reseed differently, a new transformers release changes the models' code
# (5.25 broke fullgraph compiles of checkpointed layers for every backend). libtpu: the
# TPU compiler, compile-only here (tests compile every kernel for v5e/v6e/v7x); the
# release jax 0.10.2 pairs with (jax's `tpu` extra).
TESTDEPS := hypothesis pytest pytest-xdist pytest-randomly==5.1.0 ruff==0.17.6 expecttest transformers==5.24.0 matplotlib 'libtpu==0.0.42.*'
JOBS    ?= 2

.PHONY: demo test lint test-thorough bench coverage clean

$(STAMP): pyproject.toml Makefile
	test -x $(PYTHON) || $(PY) -m venv $(VENV)
	$(PYTHON) -m pip install -q --upgrade pip
	$(PYTHON) -m pip install -q $(PINS) $(DEPS) $(TESTDEPS)
	$(PYTHON) -m pip install -q --no-deps -e .
	touch $(STAMP)

demo: $(STAMP)
	$(PYTHON) -m tpu_kernels demo

# Lint first (seconds), then the suite in a random order (pytest-randomly; the seed is
# printed in the header: rerun that order with --randomly-seed=N). worksteal: a worker that
# runs out takes tests queued for the other (a 60 s test near the end no longer idles one).
test: $(STAMP)
	$(PYTHON) -m ruff check .
	$(PYTHON) -m pytest -q -n $(JOBS) --dist worksteal -p no:cacheprovider -p randomly tests

lint: $(STAMP)
	$(PYTHON) -m ruff check .

# Many more Hypothesis examples and the big shapes; not run by CI.
test-thorough: $(STAMP)
	TPU_KERNELS_HYPOTHESIS_PROFILE=thorough $(PYTHON) -m pytest -q -n $(JOBS) -p no:cacheprovider -m "thorough or not thorough" tests --thorough

bench: $(STAMP)
	$(PYTHON) -m tpu_kernels bench --quick

coverage: $(STAMP)
	$(PYTHON) -m tpu_kernels coverage

clean:
	rm -rf $(VENV) .tpu_kernels build *.egg-info
