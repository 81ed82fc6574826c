# Every target bootstraps .venv itself, so `make demo` and `make test` work on a fresh clone.
SHELL := /bin/bash
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
PYTEST_ARGS ?=
SOURCES := airflow_provider_datagen dev tests benchmarks
WHEEL_CHECK := .wheel-check

.PHONY: demo test lint docs bench bench-scale airflow airflow-celery chromium redis postgres clean format unit wheel-check

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

# redis-server for the shared rate limit tests (Debian's package; the tests start and stop their own).
redis:
	@command -v redis-server >/dev/null 2>&1 || { apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server >/dev/null; }

# PostgreSQL for the distributed suite (tests/e2e/celery), `make airflow-celery` and DATAGEN_E2E_POSTGRES=1
# runs of the end-to-end suite (Debian's packages).
postgres:
	@command -v pg_ctlcluster >/dev/null 2>&1 || { apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql >/dev/null; }

lint: $(STAMP)
	$(BIN)/ruff check $(SOURCES)
	$(BIN)/ruff format --check $(SOURCES)
	$(BIN)/mypy

# The documentation site (mkdocs.yml, docs/) into .site/; --strict: a warning (a broken link or anchor, a
# docstring the API reference cannot render) fails the build. NO_MKDOCS_2_WARNING hushes Material's banner.
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict -d .site

format: $(STAMP)
	$(BIN)/ruff check --fix $(SOURCES)
	$(BIN)/ruff format $(SOURCES)

# pytest exits 5 when it collects nothing; make treats that as a failure, so "no tests" never passes.
# Two phases (dev/test_suite.py): everything but the end-to-end tests on two xdist workers, then the end-to-end
# tests alone and serial (their stacks never share the cores with another stack or with the rest).
test: $(STAMP) chromium redis postgres lint docs
	DATAGEN_HYPOTHESIS_PROFILE=full $(BIN)/python -m dev.test_suite $(PYTEST_ARGS)

# Everything but the end-to-end (celery included) and slow tests (no Airflow components, no crash schedules or
# killed workers), on three xdist workers: 3:46 here on 2 cores, against 4:48 on two (the tests wait on I/O).
unit: $(STAMP) redis
	$(BIN)/python -m pytest -ra -n 3 --dist worksteal -m "not e2e and not slow" $(PYTEST_ARGS)

demo: $(STAMP)
	$(BIN)/python -m dev.demo

bench: $(STAMP)
	$(BIN)/python -m benchmarks.run

# Planning at size (benchmarks/scale.py): 1M, 3M and 10M-item Parquet sources with logs 95% done.
# Building the inputs takes ~3 min per million items on 2 shared cores (cached in benchmarks/.data/scale,
# so a second run only measures); the measures ~1 min per million.
bench-scale: $(STAMP)
	$(BIN)/python -m benchmarks.scale $(SCALE_ARGS)

# Airflow components on 127.0.0.1:8080 with the example DAGs, for clicking through by hand.
airflow: $(STAMP)
	$(BIN)/python -m dev.devserver

# The distributed stack on 127.0.0.1 for clicking through by hand: CeleryExecutor on Redis, PostgreSQL, the
# datagen root on a moto S3 server, two Celery worker hosts, the example DAGs. Ctrl-C stops it (by PID).
airflow-celery: $(STAMP) redis postgres
	$(BIN)/python -m dev.celery_stack

# The wheel as a user gets it: built, installed into a fresh venv (packages from PyPI), and listed by
# `airflow providers list` there. tests/test_packaging.py checks the wheel's file list without installing.
wheel-check: $(STAMP)
	rm -rf $(WHEEL_CHECK)
	$(BIN)/uv build -q --wheel -o $(WHEEL_CHECK)/dist
	$(BIN)/python -m zipfile -l $(WHEEL_CHECK)/dist/*.whl
	$(BIN)/uv venv -q --python $(BIN)/python $(WHEEL_CHECK)/venv
	$(BIN)/uv pip install -q --python $(WHEEL_CHECK)/venv/bin/python $(WHEEL_CHECK)/dist/*.whl
	AIRFLOW_HOME=$(CURDIR)/$(WHEEL_CHECK)/home $(WHEEL_CHECK)/venv/bin/airflow providers list \
	  | tee $(WHEEL_CHECK)/providers.txt
	grep -q '^airflow-provider-datagen ' $(WHEEL_CHECK)/providers.txt
	rm -rf $(WHEEL_CHECK)/venv

clean:
	rm -rf $(VENV) .demo .airflow .airflow-celery .pytest_cache .mypy_cache .ruff_cache $(WHEEL_CHECK)
