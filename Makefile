# Two commands for a newcomer: `make demo` and `make test`. Each sets itself up.
SHELL := /bin/bash
PYTHON ?= python3.11
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.amflow-installed
export PATH := $(CURDIR)/$(VENV)/bin:$(PATH)

.PHONY: setup system-deps demo test test-fast airflow bench clean

$(STAMP): pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[test,bench]'
	@touch $(STAMP)

system-deps:
	@bash scripts/system-deps.sh

setup: $(STAMP) system-deps

demo: setup
	bash scripts/demo.sh

# Tests marked `isolated` need a process in which no in-process Ray ever ran.
test: setup
	$(VENV)/bin/pytest -q -rs -m "not isolated" tests
	$(VENV)/bin/pytest -q -rs -m isolated tests

test-fast: setup
	$(VENV)/bin/pytest -q -rs -m "not slow and not isolated" tests

airflow: setup
	bash scripts/airflow.sh

bench: setup
	$(VENV)/bin/amflow bench features --run-id bench

clean:
	rm -rf data/runs .pytest_cache
