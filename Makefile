# The two commands of the README: `make up` runs the seed pipeline, `make test` runs every test.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin

$(BIN)/reconciler: pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[test]'
	touch $@

.PHONY: install up test bench crds
install: $(BIN)/reconciler

up: install
	$(BIN)/reconciler up -f examples/shards

test: install
	$(BIN)/pytest -q

bench: install
	$(BIN)/python bench/run.py

crds: install
	$(BIN)/python -m reconciler.api.schema crds
