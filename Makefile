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

.PHONY: demo test lint typecheck bench bench-quick check-backends clean otelcol soak soak-fleet

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

bench: $(TESTING)
	@bin=$$(sh collector-config/build-otelcol.sh | tail -n 1) && \
	OTELCOL_BIN="$$bin" $(BIN)/python bench/run_all.py

bench-quick: $(TESTING)
	@bin=$$(sh collector-config/build-otelcol.sh | tail -n 1) && \
	OTELCOL_BIN="$$bin" $(BIN)/python bench/run_all.py --quick

# The fleet soak, long (`make test` runs a short one): producers, the load
# balancer, gateway + serve backends sharing a fleet folder, the fake
# platform; random kill -9 of serve, gateway and load balancer, a backend
# added and one removed mid-run; exact books per run. Three seeds in turn.
SOAK_FLEET_RUNS ?= 20
SOAK_FLEET_EPISODES ?= 500
soak-fleet: $(TESTING)
	@bin=$$(sh collector-config/build-otelcol.sh | tail -n 1) && \
	for seed in 1 2 3; do \
	  OTELCOL_BIN="$$bin" SOAK_FLEET=long SOAK_FLEET_SEED=$$seed \
	  SOAK_FLEET_RUNS=$(SOAK_FLEET_RUNS) SOAK_FLEET_EPISODES=$(SOAK_FLEET_EPISODES) \
	  $(BIN)/python -m pytest -q -s -p no:cacheprovider tests/test_fleet_soak.py || exit 1; \
	done

soak: soak-fleet

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
