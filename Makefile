# The two set-up commands (see README): `make lab` (a learner's install) and `make test`
# (the same plus the `dev` extra: test runners, linters, browser driver, site builder).
# Both create .venv and install on first use; later runs reuse it and install nothing
# new (the stamp files are only remade when pyproject.toml changes).

PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
DEV_STAMP := $(VENV)/.installed-dev

NBVAL_FLAGS := --nbval --nbval-current-env --nbval-cell-timeout=300 \
               --nbval-sanitize-with tests/nbval_sanitize.cfg

.PHONY: lab test lint bench install install-dev build check site portability clean

# Python 3.11-3.13 (pyproject.toml's requires-python): checked before .venv is made, and a .venv
# left broken or on another Python by an earlier failed install is made again.
PY_OK := import sys; v = sys.version_info[:2]; sys.exit(0 if (3, 11) <= v < (3, 14) else 1)
define make_venv
	@$(PYTHON) -c '$(PY_OK)' 2>/dev/null || { echo "make: '$(PYTHON)' is not Python 3.11-3.13 (or not found); name one, e.g. make lab PYTHON=python3.12" >&2; exit 1; }
	rm -rf $(VENV)
	@$(PYTHON) -m venv $(VENV) || { rm -rf $(VENV); echo "make: '$(PYTHON) -m venv' failed; on Debian or Ubuntu: sudo apt install python3-venv (or python3.12-venv)" >&2; exit 1; }
endef

$(BIN)/python:
	$(make_venv)

# WHEELHOUSE=DIR: install with no network from a folder made by `course wheelhouse DIR`
# (pip gets --no-index --find-links DIR); unset, pip uses its indexes as before.
WHEELHOUSE ?=
PIP_OFFLINE := $(if $(WHEELHOUSE), --no-index --find-links "$(WHEELHOUSE)")

$(STAMP): pyproject.toml | $(BIN)/python
	@$(BIN)/python -c '$(PY_OK)' 2>/dev/null && $(BIN)/python -m pip --version >/dev/null 2>&1 || { \
		echo "make: $(VENV) is broken or on another Python (an earlier failed install?): making it again" >&2; \
		$(MAKE) --no-print-directory -B $(BIN)/python PYTHON=$(PYTHON); }
	$(BIN)/python -m pip install --quiet --disable-pip-version-check$(PIP_OFFLINE) -e .
	touch $(STAMP)

$(DEV_STAMP): $(STAMP)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check$(PIP_OFFLINE) -e ".[dev]"
	touch $(DEV_STAMP)

## install: create .venv and install the course (idempotent); WHEELHOUSE=DIR installs from a wheelhouse, offline
install: $(STAMP)

## install-dev: install plus the `dev` extra (what test, lint, site and portability need)
install-dev: $(DEV_STAMP)

## lab: open JupyterLab on the course and print its URL
lab: install
	$(BIN)/course lab

## lint: static checks of course_lib, bench and tests (ruff lint, ruff format, mypy; configured in pyproject.toml)
lint: install-dev
	$(BIN)/ruff check
	$(BIN)/ruff format --check
	$(BIN)/mypy

## test: static checks, notebook sync check, unit tests, grader tests, browser test, nbval on every notebook
# pytest runs in a network namespace where only loopback is up (course_lib/runtime/netns.py):
# Ray's tests and lesson 12 run only there, so no socket leaves this machine (CONTRIBUTING.md, "Tests").
test: lint
	$(BIN)/course build --check
	$(BIN)/python -m course_lib.runtime.netns --require -- \
		$(BIN)/python -m pytest -q --durations=30 tests lessons exercises solutions $(NBVAL_FLAGS)

## build: regenerate and execute every notebook from its text source
build: install
	$(BIN)/course build

## check: only the notebook sync check
check: install
	$(BIN)/course build --check

## site: build the course website (offline) into outputs/site; CONTRIBUTING.md, "The website"
site: install-dev
	$(BIN)/course site

## portability: strict nbval on every notebook under another instruction set, then under a CPU hog; prints what differs (CONTRIBUTING.md, "Platforms")
portability: install-dev
	$(BIN)/course portability

## bench: run bench/ and rewrite the tables in BENCHMARKS.md
bench: install-dev
	$(BIN)/python bench/run.py

clean:
	rm -rf $(VENV) outputs .mypy_cache .ruff_cache
