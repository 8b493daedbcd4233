"""A refusal that retrying cannot fix (a wrong key, an environment that does
not exist) ends ``finish()``'s wait at once, with the reason and a next step
that works; only retryable trouble is waited out."""

from __future__ import annotations

import threading
import time

import pytest

import prime_runs_otel as pro
from prime_runs_otel.deliver.spool import Spool
from prime_runs_otel.produce.synthetic import synthetic_episodes
from prime_runs_otel.run import RunResult
from prime_runs_otel.testing import FakePlatform

#: finish() is allowed this long; the test gives it a small fraction of it.
FINISH_TIMEOUT = 600.0
#: Far beyond the second a refusal takes, far below the finish timeout.
BOUND = 60.0


def _wait_for(condition: object, what: str) -> None:
    deadline = time.monotonic() + BOUND
    while not condition():  # type: ignore[operator]
        assert time.monotonic() < deadline, f"never saw {what}"
        time.sleep(0.05)


def _finish_in_thread(run: pro.Run) -> RunResult:
    results: list[RunResult] = []
    thread = threading.Thread(target=lambda: results.append(run.finish()), daemon=True)
    thread.start()
    thread.join(BOUND)
    assert not thread.is_alive(), "finish() kept waiting on a run whose delivery stopped for good"
    return results[0]


@pytest.mark.parametrize(
    ("key", "environment", "advice"),
    [
        ("not-the-key", "gsm8k", "PRIME_API_KEY"),
        (None, "nobody/no-such-env", "--environment OWNER/NAME"),
    ],
    ids=["wrong-key", "unknown-environment"],
)
def test_permanent_refusal_ends_the_wait_with_the_next_step(
    platform: FakePlatform,
    monkeypatch: pytest.MonkeyPatch,
    key: str | None,
    environment: str,
    advice: str,
) -> None:
    for name, value in platform.client_env().items():
        monkeypatch.setenv(name, value)
    if key is not None:
        monkeypatch.setenv("PRIME_API_KEY", key)
    run = pro.start_run(name="refused", environments=[environment], finish_timeout=FINISH_TIMEOUT)
    for record in synthetic_episodes(5, seed=3):
        run.record_episode(record)
    run.tracer_provider.force_flush()
    spool = Spool(run.settings.spool_path, max_bytes=run.settings.spool_max_bytes)
    # The refusal lands before the run ends: the case that used to wait it all out.
    _wait_for(lambda: (row := spool.reading.run(run.id)) is not None and row.stopped, "the refusal")

    result = _finish_in_thread(run)

    assert result.stopped and not result.closed
    assert result.pending == 5  # nothing lost: the episodes wait in the spool
    described = result.describe()
    assert "Delivery stopped" in described and advice in described
    assert result.next_step is not None and f"push {run.id}" in result.next_step
    assert platform.runs() == []


def test_retryable_trouble_is_still_waited_out(
    online: FakePlatform,
) -> None:
    """An outage is not a refusal: the run is delivered once it ends."""
    run = pro.start_run(name="patient", environments=["gsm8k"], finish_timeout=FINISH_TIMEOUT)
    with online.outage():
        for record in synthetic_episodes(5, seed=4):
            run.record_episode(record)
        run.tracer_provider.force_flush()
        time.sleep(1.0)  # let the uploader meet the outage at least once
    result = _finish_in_thread(run)
    assert result.closed and not result.stopped and result.pending == 0
    [platform_run] = online.runs()
    assert platform_run.status == "COMPLETED"
