# kernelsearch: `make run` serves on http://127.0.0.1:8000 (SQLite under ./var, embedded worker);
# `make test` runs the whole suite. Both install into .venv first.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
HOST ?= 127.0.0.1
PORT ?= 8000
PYTEST_ARGS ?=
# `make run`'s store: this checkout's ./var, absolute, unless KS_DATABASE_URL is set already
# (without it, `kernelsearch` commands use the user's data directory: README, "Which database").
KS_DATABASE_URL ?= sqlite:///$(CURDIR)/var/kernelsearch.db

.PHONY: install run test test-fast lint typecheck db-upgrade clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

# Reinstalled whenever pyproject.toml changes. torch first, pinned to the CPU build that lies on
# this kind of machine's disk: asked for by a range, pip would fetch a multi-GB CUDA build.
# The measurement tools (docs/tools, dev only) go in after the package they depend on.
$(VENV)/.installed: pyproject.toml docs/tools/pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q torch==2.13.0
	$(BIN)/python -m pip install -q -e '.[test]'
	$(BIN)/python -m pip install -q --no-deps -e docs/tools
	touch $@

install: $(VENV)/.installed

db-upgrade: install
	KS_DATABASE_URL='$(KS_DATABASE_URL)' $(BIN)/kernelsearch db upgrade

# Ctrl-C stops the server quietly (exit status 130): no traceback from make's child.
run: db-upgrade
	KS_DATABASE_URL='$(KS_DATABASE_URL)' $(BIN)/kernelsearch records import --if-empty service/data/h200_records.json
	KS_DATABASE_URL='$(KS_DATABASE_URL)' $(BIN)/kernelsearch serve --host $(HOST) --port $(PORT)

lint: install
	$(BIN)/ruff check .

# Both gate `make test` (so CI): ruff's checks and mypy's over the four runtime packages.
typecheck: install
	$(BIN)/mypy kernels search_space db service

# The PostgreSQL suites run when a local PostgreSQL answers (as .ci/run does); KS_TEST_POSTGRES_URL
# set already wins. Without one they are skipped, and the summary says how to run them.
PG_TEST_URL := postgresql+psycopg://postgres@127.0.0.1:5432/test

test: lint typecheck
	@if [ -z "$$KS_TEST_POSTGRES_URL" ] && command -v pg_isready >/dev/null \
	    && pg_isready -q -h 127.0.0.1 -p 5432; then export KS_TEST_POSTGRES_URL='$(PG_TEST_URL)'; \
	    echo "make test: PostgreSQL answers at 127.0.0.1:5432: its suites run too"; fi; \
	$(BIN)/python -m pytest -n 2 --dist worksteal --durations=20 $(PYTEST_ARGS)

test-fast: install
	$(BIN)/python -m pytest -n 2 --dist worksteal -m "not slow and not browser" $(PYTEST_ARGS)

clean:
	rm -rf $(VENV) var test-artifacts .pytest_cache
