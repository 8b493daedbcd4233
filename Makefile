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

.PHONY: demo test lint typecheck bench bench-quick bench-viewer check-backends clean otelcol chromium

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

# The viewer's browser tests drive Debian's Chromium (through Playwright,
# which never downloads a browser of its own); installed here where missing,
# with apt-get as root (or through sudo), and nothing done when it is there.
CHROMIUM := /usr/bin/chromium

chromium:
	@if [ ! -x $(CHROMIUM) ]; then \
	  echo "installing chromium for the browser tests (apt-get)"; \
	  as_root=$$( [ "$$(id -u)" -eq 0 ] || echo sudo ); \
	  $$as_root apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive $$as_root apt-get install -y -qq --no-install-recommends chromium; \
	fi

# The collector is built (or found in the cache) before the tests, and its
# path exported: with OTELCOL_BIN set, a missing binary fails the collector
# tests instead of skipping them.
test: lint typecheck chromium
	@bin=$$(sh collector-config/build-otelcol.sh | tail -n 1) && \
	echo "collector: $$bin" && \
	OTELCOL_BIN="$$bin" $(BIN)/python -m pytest -q

bench: $(TESTING)
	@bin=$$(sh collector-config/build-otelcol.sh | tail -n 1) && \
	OTELCOL_BIN="$$bin" $(BIN)/python bench/run_all.py

# The viewer on a million episodes (a few minutes to build the spool, kept in
# .bench-viewer/ for the next run).
bench-viewer: $(TESTING)
	$(BIN)/python bench/viewer.py --spool-dir .bench-viewer

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
