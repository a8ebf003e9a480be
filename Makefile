# Two commands after cloning: `make run` and `make test`.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP_RUN := $(VENV)/.installed-run
STAMP_DEV := $(VENV)/.installed-dev
export ENGINECACHE_HOME ?= $(CURDIR)/engines
PORT ?= 8501

.PHONY: run test lint typecheck clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip

$(STAMP_RUN): pyproject.toml | $(BIN)/python
	$(BIN)/pip install --quiet -e .
	touch $@

$(STAMP_DEV): pyproject.toml | $(BIN)/python
	$(BIN)/pip install --quiet -e '.[dev,modelopt]'
	touch $@ $(STAMP_RUN)

run: $(STAMP_RUN)
	$(BIN)/enginecache serve --port $(PORT)

lint: $(STAMP_DEV)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/lint-imports

typecheck: $(STAMP_DEV)
	$(BIN)/mypy enginecache

test: $(STAMP_DEV) lint typecheck
	$(BIN)/pytest -q -p no:cacheprovider

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache
