# Every target bootstraps .venv itself, so `make demo` and `make test` work on a fresh clone.
SHELL := /bin/bash
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
PYTEST_ARGS ?=

.PHONY: demo test lint bench airflow chromium postgres clean format unit

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --disable-pip-version-check uv
	$(BIN)/uv pip install -q --python $(BIN)/python -e '.[dev]'
	touch $(STAMP)

.venv: $(STAMP)

# Headless Chromium for the UI end-to-end test (Debian's package; no browser download).
chromium:
	@command -v chromium >/dev/null 2>&1 || { \
	  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null) \
	  || echo "warning: could not install Debian's chromium"; }

# PostgreSQL for DATAGEN_E2E_POSTGRES=1 runs of the end-to-end suite (Debian's packages).
postgres:
	@command -v pg_ctlcluster >/dev/null 2>&1 || { apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql >/dev/null; }

lint: $(STAMP)
	$(BIN)/ruff check airflow_provider_datagen tests benchmarks
	$(BIN)/ruff format --check airflow_provider_datagen tests benchmarks
	$(BIN)/mypy

format: $(STAMP)
	$(BIN)/ruff check --fix airflow_provider_datagen tests benchmarks
	$(BIN)/ruff format airflow_provider_datagen tests benchmarks

# pytest exits 5 when it collects nothing; make treats that as a failure, so "no tests" never passes.
test: $(STAMP) chromium $(if $(filter 1,$(DATAGEN_E2E_POSTGRES)),postgres) lint
	$(BIN)/python -m pytest -ra $(PYTEST_ARGS)

unit: $(STAMP)
	$(BIN)/python -m pytest -ra tests/unit $(PYTEST_ARGS)

demo: $(STAMP)
	$(BIN)/python -m airflow_provider_datagen.demo

bench: $(STAMP)
	$(BIN)/python -m benchmarks.run

# Airflow components on 127.0.0.1:8080 with the example DAGs, for clicking through by hand.
airflow: $(STAMP)
	$(BIN)/python -m airflow_provider_datagen.devserver

clean:
	rm -rf $(VENV) .demo .airflow .pytest_cache .mypy_cache .ruff_cache
