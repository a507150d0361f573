# leaklab: `make test` and `make audit` install into .venv first when needed.
PYTHON ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
export MPLCONFIGDIR ?= $(CURDIR)/.cache/mpl
export XDG_CACHE_HOME ?= $(CURDIR)/.cache/xdg
export TORCH_HOME ?= $(CURDIR)/.cache/torch

.PHONY: install test audit bench clean

install: $(STAMP)

$(STAMP): pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q --no-compile -c constraints.txt -e '.[test]'
	@# byte-compile on every core (pip compiles on one: a fresh install took 84-108 s, now 63 s),
	@# skipping the one torch test file written for Python 3.12 (pip skips it too)
	$(BIN)/python -m compileall -q -j 0 -x 'py312_intrinsics\.py$$' $(VENV)/lib > /dev/null
	touch $(STAMP)

test: $(STAMP)
	$(BIN)/python -m pytest -n 2 tests

audit: $(STAMP)
	$(BIN)/leaklab audit

bench: $(STAMP)
	$(BIN)/python benchmarks/run.py --out benchmarks/results

clean:  # the venv and caches, and runs/: every audit and reproduction written there, with their resume journals
	rm -rf $(VENV) .cache .pytest_cache runs
