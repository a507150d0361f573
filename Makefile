# leaklab: `make test` and `make audit` install into .venv first when needed.
PYTHON ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
COMPILED := $(VENV)/.compiled
export MPLCONFIGDIR ?= $(CURDIR)/.cache/mpl
export XDG_CACHE_HOME ?= $(CURDIR)/.cache/xdg
export TORCH_HOME ?= $(CURDIR)/.cache/torch
# what `leaklab audit`'s processes import: its command line (whose options' types name the image attacks' config)
# and progress bars, captures, attacks (torch.optim imports torch._dynamo at an optimiser's first step) and report
# (matplotlib's PNG writer, PIL's formats); tests/test_room_audit.py checks that a quick audit imports no more
AUDIT_IMPORTS := leaklab.cli.progress, leaklab.attacks.inversion.config, leaklab.experiments.room_audit, \
	leaklab.experiments.attack_pool, leaklab.report.html, leaklab.report.plots, torch._dynamo, rich.progress, \
	matplotlib.backends.backend_agg, PIL.Image

.PHONY: install test audit bench clean

install: $(COMPILED)

$(STAMP): pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q --no-compile -c constraints.txt -e '.[test]'
	@# byte-compile what the audit imports by importing it, bytecode written whatever PYTHONDONTWRITEBYTECODE says:
	@# a fifth of the venv's files, 27 s on one core against 43 s for all of them on two (session 68); the rest is
	@# compiled for the tests ($(COMPILED))
	PYTHONDONTWRITEBYTECODE= $(BIN)/python -c 'import $(AUDIT_IMPORTS); PIL.Image.init()'
	touch $(STAMP)

$(COMPILED): $(STAMP)
	@# byte-compile the rest on every core (pip compiles on one: a fresh install took 84-108 s, then 63 s),
	@# skipping the one torch test file written for Python 3.12 (pip skips it too)
	$(BIN)/python -m compileall -q -j 0 -x 'py312_intrinsics\.py$$' $(VENV)/lib > /dev/null
	touch $(COMPILED)

test: $(COMPILED)
	$(BIN)/python -m pytest -n 2 tests

audit: $(STAMP)
	$(BIN)/leaklab audit

bench: $(COMPILED)
	$(BIN)/python benchmarks/run.py --out benchmarks/results

clean:  # the venv and caches, and runs/: every audit and reproduction written there, with their resume journals
	rm -rf $(VENV) .cache .pytest_cache runs
