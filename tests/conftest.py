"""Shared fixtures: every test runs with its own HOME and spool folder, no
PRIME_* or OTEL_* setting leaks in from the machine, and the fake platform
runs on loopback."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import settings

from prime_runs_otel.testing import FakePlatform

#: No time limit per generated example: hypothesis' default (200 ms) is a
#: speed assertion, and on two cores shared with the rest of the suite an
#: example that takes milliseconds alone took over 400 ms. What each example
#: checks is unchanged; the test-wide time limit still catches a hang.
settings.register_profile("suite", deadline=None)
settings.load_profile("suite")

#: pydantic loads the plugins installed beside it when it builds its first
#: model, and the test extra installs logfire (for one instrumentation test),
#: whose pydantic plugin imports all of logfire and the OpenTelemetry SDK's
#: log and metrics parts: 0.7 s of CPU in every process that defines a
#: pydantic model (prime-traces' and verifiers' do), hundreds of processes
#: in the suite. It records nothing unless logfire is told to instrument
#: pydantic, which no test does, and a user's install has no logfire: off,
#: here and in every process a test starts (they inherit the environment).
os.environ.setdefault("PYDANTIC_DISABLE_PLUGINS", "__all__")

#: Modules whose tests take the longest, longest first, so that parallel
#: workers do not end the run on one of them while the others sit idle: the
#: prime-rl stand-in's tests (each with its own platform, spool and output
#: folder, so spread over the workers), the real vf-eval run several times,
#: a Kafka fleet, prime-runs' SDK beside ours, the docs' commands, Ctrl-C
#: into real processes, a fuzzed serve process.
SLOWEST_FIRST = (
    "test_prime_rl.py",
    "test_vf_eval.py",
    "test_kafka_fleet.py",
    "test_instrumentation.py",
    "test_docs_commands.py",
    "test_interrupt_soak.py",
    "test_fuzz_serve.py",
)
#: Single tests that took the longest in a full run (tens of seconds to
#: minutes each under four workers on two cores), longest first: they go
#: before their modules' other tests, so that none of them starts last and
#: keeps one worker busy after the rest are done.
SLOWEST_TESTS = (
    "test_serve_survives_hostile_input",
    "test_a_resumed_eval_lands_as_with_push",
    "test_the_trainer_adds_its_metrics_to_the_run_when_asked",
    "test_a_clean_run_leaves_what_prime_rl_leaves_and_every_rollout",
    "test_the_prime_rl_quickstart_runs_as_written",
    "test_an_interrupted_eval_ends_as_with_push_or_better",
    "test_a_multi_turn_eval_with_a_judge_lands_as_with_push",
    "test_behind_a_collector_serve_leaves_what_prime_rl_leaves",
    "test_sigkill_leaves_prime_rl_s_run_running_and_ours_closed_as_crashed",
    "test_ctrl_c_cancels_the_run",
    "test_an_exception_fails_the_run_with_its_reason",
    "test_ctrl_c_at_random_moments_leaves_every_run_ended_and_every_episode_counted",
)
#: Modules that run the collector distribution, which `make test` builds in
#: the background meanwhile: last, to give the build the most time. Their
#: first test in a worker may wait for the build (or, without `make test`,
#: build it), so their time limit has the minutes of a build on top.
COLLECTOR_LAST = ("test_collector_config.py", "test_otelcol.py")
COLLECTOR_TIMEOUT = 1800
#: Modules whose tests run real programs end to end several times over
#: (vf-eval, prime-runs' own SDK beside ours, the prime-rl stand-in, a Kafka
#: fleet, the docs' commands): each takes seconds of CPU, so on a machine
#: busy with other work a test may take many minutes. The suite-wide limit
#: (pyproject.toml) is a guard against a hang, not a speed; these get a limit
#: that a loaded machine stays within.
LONG_RUNNING = (
    "test_vf_eval.py",
    "test_instrumentation.py",
    "test_prime_rl.py",
    "test_docs_commands.py",
    "test_kafka_fleet.py",
)
LONG_RUNNING_TIMEOUT = 1200
#: The fixtures that import verifiers into the test process (9 CPU-s each
#: time: thousands of pydantic models of the SDKs it imports). A worker pays
#: it once, on the first test that asks; spread over every worker, the tests
#: that ask would have each of them pay it. On one worker (their own
#: xdist_group) it is paid once a run; they are in-process tests of seconds.
IMPORTS_VERIFIERS = frozenset(
    {"wire_episode", "load_wire_episode", "round_trip", "verifiers_episode", "chat"}
)
VERIFIERS_GROUP = "verifiers-in-process"


@pytest.hookimpl(tryfirst=True)  # before xdist names the groups in the node ids
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    def rank(item: pytest.Item) -> tuple[int, int]:
        name = getattr(item, "originalname", item.name)
        if name in SLOWEST_TESTS:
            return 0, SLOWEST_TESTS.index(name)
        if item.path.name in SLOWEST_FIRST:
            return 1, SLOWEST_FIRST.index(item.path.name)
        return 2, 1 if item.path.name in COLLECTOR_LAST else 0

    items.sort(key=rank)
    for item in items:
        fixtures = set(getattr(item, "fixturenames", ()))
        if fixtures & IMPORTS_VERIFIERS and item.get_closest_marker("xdist_group") is None:
            item.add_marker(pytest.mark.xdist_group(VERIFIERS_GROUP))
        if item.path.name in COLLECTOR_LAST:
            item.add_marker(pytest.mark.timeout(COLLECTOR_TIMEOUT))
        elif item.path.name in LONG_RUNNING and item.get_closest_marker("timeout") is None:
            item.add_marker(pytest.mark.timeout(LONG_RUNNING_TIMEOUT))


@pytest.fixture(autouse=True)
def isolated_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    for name in list(os.environ):
        if name.startswith(("PRIME_", "OTEL_", "EVALUATION_ID")):
            monkeypatch.delenv(name, raising=False)
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("PRIME_RUNS_OTEL_DIR", str(tmp_path / "spool"))
    # Backoff stays real, only shorter: outages in tests last seconds, not minutes.
    monkeypatch.setenv("PRIME_RUNS_OTEL_RETRY_MAX_DELAY", "0.3")
    return tmp_path


@pytest.fixture
def platform() -> Iterator[FakePlatform]:
    with FakePlatform() as fake:
        yield fake


@pytest.fixture
def online(platform: FakePlatform, monkeypatch: pytest.MonkeyPatch) -> FakePlatform:
    """The process talks to the fake platform, as it would to the real one."""
    for name, value in platform.client_env().items():
        monkeypatch.setenv(name, value)
    return platform


@pytest.fixture
def started() -> Iterator[list[Any]]:
    """The processes a test started (collectors, ``serve``), killed when it
    ends, the last started first: each has its ``process`` and ``stop()``."""
    things: list[Any] = []
    yield things
    for thing in reversed(things):
        if thing.process is not None:
            thing.process.kill()
            thing.stop()


@pytest.fixture(scope="session")
def wire_episode() -> Any:
    """verifiers' record loader, the oracle's way to rebuild episode objects
    (imported once: it takes seconds)."""
    from verifiers.v1 import WireEpisode

    return WireEpisode
