"""The spool's cap is shared fairly: what delivery frees is room again, and
runs whose delivery stopped (an environment that does not exist, a key
refused) cannot take the room the others need."""

from __future__ import annotations

import pytest

import prime_runs_otel as pro
from prime_runs_otel.produce.synthetic import synthetic_episodes
from prime_runs_otel.run import RunResult
from prime_runs_otel.testing import FakePlatform

CAP = 2 * 1024 * 1024


@pytest.fixture(autouse=True)
def small_cap(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PRIME_RUNS_OTEL_SPOOL_MAX_BYTES", str(CAP))


def _record(name: str, environment: str, count: int, seed: int) -> RunResult:
    run = pro.start_run(name=name, environments=[environment], finish_timeout=60)
    for record in synthetic_episodes(count, seed=seed):
        run.record_episode(record)
    return run.finish()


def test_room_freed_by_delivery_takes_episodes_again(online: FakePlatform) -> None:
    with online.outage():
        run = pro.start_run(name="fills-the-cap", environments=["gsm8k"], finish_timeout=60)
        for record in synthetic_episodes(400, seed=1):
            run.record_episode(record)
        run.wait_delivered(0)
    first = run.finish()
    assert first.rejected > 0 and first.pending == 0

    after = _record("after-delivery", "gsm8k", 100, seed=2)

    assert (after.episodes, after.failed, after.pending) == (100, 0, 0)


def test_a_run_that_cannot_be_created_does_not_block_the_others(online: FakePlatform) -> None:
    stuck = _record("no-such-env", "nobody/no-such-env", 400, seed=3)
    assert stuck.stopped and stuck.rejected > 0, "held to its share of the cap"
    assert stuck.episodes + stuck.rejected == 400, "every episode stored or counted"

    healthy = _record("healthy", "gsm8k", 50, seed=4)

    assert (healthy.closed, healthy.episodes, healthy.failed) == (True, 50, 0)
    platform_run = next(run for run in online.runs() if run.id == healthy.platform_id)
    assert len(online.episodes(platform_run.id)) == 50
