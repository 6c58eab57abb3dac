# Two entry points for a fresh machine: `make demo` and `make test`.
# Each creates .venv when missing and installs what it needs first.
PY ?= python3
VENV := .venv
VPY := $(VENV)/bin/python
STAMP_BASE := $(VENV)/.esmjac-base
STAMP_TEST := $(VENV)/.esmjac-test

.PHONY: demo test check lint clean-cache docs goldens bench clean

$(VPY):
	$(PY) -m venv $(VENV)
	$(VPY) -m pip install -q --upgrade pip

$(STAMP_BASE): pyproject.toml | $(VPY)
	$(VPY) -m pip install -q -e .
	touch $@

# SUNDIALS headers are needed to build scikits.odes (the `sundials` extra).
sundials-sys:
	@if ! dpkg -s libsundials-dev >/dev/null 2>&1; then \
	  if [ "$$(id -u)" = "0" ]; then \
	    apt-get update -qq && apt-get install -y -qq libsundials-dev; \
	  else \
	    echo "libsundials-dev is missing: run 'sudo apt-get install -y libsundials-dev'"; exit 1; \
	  fi; \
	fi

$(STAMP_TEST): pyproject.toml | $(VPY) sundials-sys
	$(VPY) -m pip install -q -e '.[test,sundials,dask]'
	touch $@

# One BLAS thread: SciPy's dense peer is 3-4x slower with OpenBLAS threads
# fighting numba's on a small machine (README, performance notes).
demo: $(STAMP_BASE)
	OPENBLAS_NUM_THREADS=1 $(VPY) -m esmjac demo

# The tests' own cache (never the user's ~/.cache/esmjac): kept between runs,
# so a second run is warm; keys follow content, so a stale entry is never
# reused. `make clean-cache` (or `make clean`) empties it: `make clean-cache
# test` is a cold run, as CI's.
TEST_CACHE := $(CURDIR)/.esmjac-cache/tests
PYTEST := ESMJAC_CACHE_DIR=$(TEST_CACHE) $(VPY) -m pytest -q -n auto --maxprocesses=4 --dist loadfile --durations=15 --cpu-durations=15

# Layer contracts, lint and types first (pyproject [tool.importlinter],
# [tool.ruff], [tool.mypy]), then every test, the 15 slowest named.
test: lint
	$(PYTEST)

lint: $(STAMP_TEST)
	$(VENV)/bin/lint-imports
	$(VENV)/bin/ruff check .
	$(VPY) -m mypy

# The fast loop: no child processes, corpus, peers or docs build.
check: $(STAMP_TEST)
	$(PYTEST) -m "not slow"

clean-cache:
	rm -rf $(TEST_CACHE)

# The documentation (the tests build it too, warnings as errors).
docs: $(STAMP_TEST)
	$(VPY) -m sphinx -b html -W --keep-going docs docs/_build/html

# Regenerate our own goldens (explicit; tests never rewrite them).
goldens: $(STAMP_BASE)
	$(VPY) -m tests.support.goldens --write

bench: $(STAMP_TEST)
	$(VPY) benchmarks/run.py

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis docs/_build .esmjac-cache
