# The two commands of the README: `make up` runs the seed pipeline, `make test` runs every test.
# `make check` holds the house rules (lint, format, types, layers); CI runs it before the tests.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin

$(BIN)/reconciler: pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[test,check]'
	touch $@

.PHONY: install bytecode up test check bench crds
install: $(BIN)/reconciler

# Our own modules' bytecode, as pip leaves an installed package's (the editable install does
# not, and a machine with PYTHONDONTWRITEBYTECODE set never writes it): without it every
# command compiles the whole source again, a third of `up`'s fixed cost. Incremental: only
# what changed is compiled again.
bytecode: install
	$(BIN)/python -m compileall -q reconciler

up: bytecode
	$(BIN)/reconciler up -f examples/shards

test: bytecode
	$(BIN)/pytest -q

check: install
	$(BIN)/ruff check reconciler tests bench
	$(BIN)/ruff format --check reconciler tests bench
	$(BIN)/mypy
	$(BIN)/lint-imports

bench: bytecode
	$(BIN)/python bench/run.py

crds: install
	$(BIN)/python -m reconciler.api.schema crds
