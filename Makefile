# The two commands of the README: `make demo` and `make test`. Each creates
# .venv on first use and installs what it needs (the demo only the package,
# the tests also the test tools and the prime-runs/verifiers oracle).
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
RUNTIME := $(VENV)/.installed-runtime
TESTING := $(VENV)/.installed-test

.PHONY: demo test lint typecheck bench bench-quick clean

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

test: lint typecheck
	$(BIN)/python -m pytest -q

bench: $(TESTING)
	$(BIN)/python bench/run_all.py

bench-quick: $(TESTING)
	$(BIN)/python bench/run_all.py --quick

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
