# The two commands of the README: `make demo` and `make test`. Each creates
# .venv on first use and installs what it needs (the demo the package with
# its serve and ui extras, the tests also the test tools and the
# prime-runs/verifiers oracle).
# `make otelcol` builds the collector distribution of
# collector-config/builder.yaml (cached; OTELCOL_BIN overrides) and prints its
# path last; `make test` builds it in the background while the rest runs, and
# the collector tests run on it.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
UV := $(BIN)/uv
RUNTIME := $(VENV)/.installed-runtime
TESTING := $(VENV)/.installed-test
# uv installs in seconds what pip takes a minute or more to; it comes from
# PyPI into the virtualenv itself. Compiled to bytecode at install time:
# the tests start many Python processes that import the same packages.
INSTALL := $(UV) pip install --quiet --python $(BIN)/python --compile-bytecode

.PHONY: demo test lint typecheck bench bench-quick bench-compare bench-viewer check-backends clean otelcol chromium semconv soak soak-serve soak-kafka kafka kafka-stop kafka-tools

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

$(UV): | $(BIN)/python
	$(BIN)/python -m pip install --quiet 'uv>=0.5,<1'

# The demo, and what the README has a newcomer run after it: the store
# commands, `ui` (the [ui] extra) and `serve` (the [serve] extra).
$(RUNTIME): pyproject.toml | $(UV)
	$(INSTALL) -e '.[serve,ui]'
	@touch $(RUNTIME)

$(TESTING): pyproject.toml | $(UV)
	$(INSTALL) -e '.[test]'
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

# The prime.* conventions registry (semconv/): checked against semconv.py and
# docs/semconv.md (also part of `make test`), and by OpenTelemetry Weaver
# itself when `weaver` is on PATH (a release binary, or the otel/weaver image).
semconv: $(TESTING)
	$(BIN)/python -m pytest -q tests/test_semconv_registry.py
	@if command -v weaver >/dev/null 2>&1; then \
		weaver registry check -r semconv; \
	else \
		echo "weaver is not on PATH: the registry was checked without it." \
			"Install a release from https://github.com/open-telemetry/weaver/releases" \
			"to run 'weaver registry check -r semconv' too."; \
	fi

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

# Every check, timed (tests/check_all.py): the collector builds in the
# background from the start, Chromium (for the viewer's browser tests) and
# Java, Maven and the Kafka broker's jars (for the Kafka fleet's tests) are
# installed where missing beside the install, lint and typecheck, the tests run
# in parallel workers, and where the time went is printed at the end. A missing
# collector or browser fails its tests, it never skips them. TEST_WORKERS=N sets
# the workers; PYTEST_ARGS goes to pytest.
test:
	@MAKE="$(MAKE)" $(PYTHON) tests/check_all.py $(PYTEST_ARGS)

# Long soak runs, not part of `make test` (the suite runs each at a size that
# takes seconds): `make soak` runs both, soak-serve then soak-kafka.
soak: soak-serve soak-kafka

# serve alone: platform faults, overload and kills together, at scale, with
# exact accounting, hostile input fuzzed with thousands of cases, and Ctrl-C
# at random moments into 135 real processes. Add a soak test to SOAK_TESTS;
# each reads SOAK=long.
SOAK_TESTS := tests/test_soak.py tests/test_interrupt_soak.py

soak-serve: $(TESTING)
	@bin=$$(sh collector-config/build-otelcol.sh | tail -n 1) && \
	OTELCOL_BIN="$$bin" SOAK=long PRIME_RUNS_OTEL_FUZZ_EXAMPLES=2000 \
	$(BIN)/python -m pytest -q $(SOAK_TESTS) tests/test_fuzz_serve.py tests/test_otlp.py

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

# What moved by more than 5 % since BASE (a commit with a file in
# bench/results/, which `make bench` writes): a report, not a test.
bench-compare: $(TESTING)
	@test -n "$(BASE)" || { echo "usage: make bench-compare BASE=<commit> [NEW=<commit>]"; exit 2; }
	$(BIN)/python bench/compare.py $(BASE) $(NEW)

# Apache Kafka's broker for `serve --kafka` (docs/scaling.md): fetched from
# Maven Central once per version (kafka/pom.xml, cached under
# ~/.cache/prime-runs-otel), formatted as a single KRaft node and started on
# a free port of 127.0.0.1; the bootstrap address is printed last. Needs
# Java 17+ and Maven. `make kafka-stop` stops it.
kafka: $(TESTING) kafka-tools
	@$(BIN)/python -m prime_runs_otel.testing.kafka_broker start

# Java and Maven for the broker, installed where missing (apt-get, as root or
# through sudo), and the broker's jars fetched into the cache.
kafka-tools:
	@if ! command -v java >/dev/null 2>&1 || ! command -v mvn >/dev/null 2>&1; then \
	  echo "installing Java and Maven for the Kafka broker (apt-get)"; \
	  as_root=$$( [ "$$(id -u)" -eq 0 ] || echo sudo ); \
	  $$as_root apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive $$as_root apt-get install -y -qq --no-install-recommends \
	    openjdk-17-jre-headless maven; \
	fi
	@$(PYTHON) prime_runs_otel/testing/kafka_broker.py fetch >/dev/null

# The Kafka fleet's soak (tests/kafka_soak.py): 3 members and 24 runs of 30
# episodes sent to random members, members killed -9 (one restarted with its
# spool deleted), added and removed, then a 3-broker cluster with a broker
# killed; exact books on the fake platform.
soak-kafka: $(TESTING) kafka-tools
	$(BIN)/python tests/kafka_soak.py

kafka-stop: $(TESTING)
	@$(BIN)/python -m prime_runs_otel.testing.kafka_broker stop

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
