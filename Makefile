# The two commands of the README: `make demo` and `make test`. Each creates
# .venv on first use and installs what it needs (the demo only the package,
# the tests also the test tools and the prime-runs/verifiers oracle).
# `make otelcol` builds the collector distribution of
# collector-config/builder.yaml (cached; OTELCOL_BIN overrides) and prints its
# path last; `make test` builds it first so the collector tests run on it.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
RUNTIME := $(VENV)/.installed-runtime
TESTING := $(VENV)/.installed-test

.PHONY: demo test lint typecheck bench bench-quick check-backends clean otelcol soak

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

$(RUNTIME): pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet -e .
	@touch $(RUNTIME)

$(TESTING): pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet -e '.[test]'
	@touch $(TESTING) $(RUNTIME)

demo: $(RUNTIME)
	$(BIN)/prime-runs-otel demo

lint: $(TESTING)
	$(BIN)/ruff check prime_runs_otel tests bench examples
	$(BIN)/ruff format --check prime_runs_otel tests bench examples

typecheck: $(TESTING)
	$(BIN)/mypy

otelcol:
	@sh collector-config/build-otelcol.sh

# The collector is built (or found in the cache) before the tests, and its
# path exported: with OTELCOL_BIN set, a missing binary fails the collector
# tests instead of skipping them.
test: lint typecheck
	@bin=$$(sh collector-config/build-otelcol.sh | tail -n 1) && \
	echo "collector: $$bin" && \
	OTELCOL_BIN="$$bin" $(BIN)/python -m pytest -q

# Long soak runs, not part of `make test` (the suite runs each at a size that
# takes seconds): platform faults, overload and kills together, at scale,
# with exact accounting. Add a soak test to SOAK_TESTS; each reads SOAK=long.
SOAK_TESTS := tests/test_soak.py

soak: $(TESTING)
	@bin=$$(sh collector-config/build-otelcol.sh | tail -n 1) && \
	OTELCOL_BIN="$$bin" SOAK=long $(BIN)/python -m pytest -q $(SOAK_TESTS)

bench: $(TESTING)
	@bin=$$(sh collector-config/build-otelcol.sh | tail -n 1) && \
	OTELCOL_BIN="$$bin" $(BIN)/python bench/run_all.py

bench-quick: $(TESTING)
	@bin=$$(sh collector-config/build-otelcol.sh | tail -n 1) && \
	OTELCOL_BIN="$$bin" $(BIN)/python bench/run_all.py --quick

# A run as Arize Phoenix shows it (not part of `make test`): Phoenix is large,
# so it gets a virtualenv of its own.
PHOENIX_VENV := .venv-phoenix
PHOENIX := $(PHOENIX_VENV)/.installed

$(PHOENIX):
	$(PYTHON) -m venv $(PHOENIX_VENV)
	$(PHOENIX_VENV)/bin/python -m pip install --quiet --upgrade pip
	$(PHOENIX_VENV)/bin/python -m pip install --quiet 'arize-phoenix>=20,<21'
	@touch $(PHOENIX)

check-backends: $(TESTING) $(PHOENIX)
	$(BIN)/python bench/check_backends.py --phoenix $(PHOENIX_VENV)/bin/phoenix

clean:
	rm -rf $(VENV) $(PHOENIX_VENV) .pytest_cache .mypy_cache .ruff_cache
