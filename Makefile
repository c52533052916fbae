# The front door. `make demo` runs the local cluster; `make test` is what CI runs.
# The first target that needs Python builds .venv once (torch: the CPU wheel, pinned, installed first
# so nothing can pull a CUDA build).

PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp
WORKERS ?= 3

.PHONY: setup demo test test-slow test-all lint bench-broadcast clean help

help:
	@echo "make demo       run the local cluster (Redis, coordinator, reward, learner, $(WORKERS) workers) and write runs/latest/report.json"
	@echo "make test       the default test suite (what CI runs)"
	@echo "make test-slow  the long suites (marked slow)"
	@echo "make lint       ruff"

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet torch==2.13.0
	$(PY) -m pip install --quiet -e ".[train,dev]"
	touch $(STAMP)

setup: $(STAMP)

demo: $(STAMP)
	$(PY) -m cluster.local --config configs/demo.toml --workers $(WORKERS)

test: $(STAMP)
	$(PY) -m pytest

test-slow: $(STAMP)
	$(PY) -m pytest -m slow

test-all: $(STAMP)
	$(PY) -m pytest -m ""

lint: $(STAMP)
	$(VENV)/bin/ruff check shared services cluster tests benchmarks

clean:
	rm -rf runs .pytest_cache
