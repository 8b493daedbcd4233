"""A fleet member's uploader with the gate of a real ``FleetOwnership`` in
front of its platform calls, no broker: this test plays the consumer loop's
part (it takes the waiting intents and lets them go, as a commit does).

Each upload, create and finalize of a member waits for a Kafka transaction.
Runs advanced one at a time paid one transaction per call; runs advanced
together have their intents wait together, so one transaction carries them
all and their calls go out side by side."""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import prime_runs_otel as pro
from prime_runs_otel.config import resolve_settings
from prime_runs_otel.deliver.kafka.owner import RECORD_TIMEOUT, FleetOwnership, Intent
from prime_runs_otel.deliver.kafka.spool import FleetSpool
from prime_runs_otel.deliver.uploader import Uploader
from prime_runs_otel.produce.synthetic import synthetic_episodes
from prime_runs_otel.testing import FakePlatform

RUNS = 4
EPISODES = 6


@pytest.fixture
def fake() -> Iterator[FakePlatform]:
    with FakePlatform() as platform:
        saved = {name: os.environ.get(name) for name in platform.client_env()}
        os.environ.update(platform.client_env())
        try:
            yield platform
        finally:
            for name, value in saved.items():
                if value is None:
                    os.environ.pop(name, None)
                else:
                    os.environ[name] = value


def _stored_runs(spool_dir: Path) -> dict[str, int]:
    """``RUNS`` ended runs in one spool, by local id, with their episode counts."""
    runs = {}
    for index in range(RUNS):
        run = pro.start_run(
            name=f"member-{index}", environments=["gsm8k"], mode="local", spool_dir=spool_dir
        )
        for record in synthetic_episodes(EPISODES, seed=40 + index):
            run.record_episode(record)
        run.finish()
        runs[run.id] = EPISODES
    return runs


def test_intents_of_several_runs_wait_together_and_every_run_is_delivered_once(
    fake: FakePlatform, tmp_path: Path
) -> None:
    runs = _stored_runs(tmp_path)
    online = dataclasses.replace(
        resolve_settings(spool_dir=tmp_path, mode="online"), retry_max_delay=0.05
    )
    ownership = FleetOwnership()
    spool = FleetSpool(online.spool_path, ownership, max_bytes=online.spool_max_bytes)
    for local_id in runs:
        spool.delivery.set_mode(local_id, "online")
        ownership.bind(local_id, 0)
    ownership.ready(0)
    uploader = Uploader(spool, online, poll_interval=0.01, owner=ownership)
    uploader.start()
    try:
        # Held, not committed: with one run at a time, the second run's
        # first intent would come only once the first run's timed out.
        waiting: list[Intent] = []
        deadline = time.monotonic() + RECORD_TIMEOUT * 2 / 3
        while len({intent.run_key for intent in waiting}) < 2:
            assert time.monotonic() < deadline, "no two runs' intents ever waited together"
            if ownership.wanted.wait(0.05):
                waiting += ownership.take_intents()
        assert all(not intent.done.is_set() for intent in waiting)
        most = len({intent.run_key for intent in waiting})
        # From here on, a commit: every intent waiting goes in one.
        deadline = time.monotonic() + 120
        while not all(_closed(spool, local_id) for local_id in runs):
            assert time.monotonic() < deadline, "the runs were not all delivered"
            for intent in waiting:
                intent.done.set()
            if ownership.wanted.wait(0.05):
                waiting = ownership.take_intents()
                most = max(most, len({intent.run_key for intent in waiting}))
            else:
                waiting = []
    finally:
        uploader.stop(30)
    print(f"at most {most} runs' intents in one commit")
    created = fake.runs()
    assert len(created) == RUNS, "each run created once"
    for platform_run in created:
        assert platform_run.status == "COMPLETED"
        deliveries = fake.episode_deliveries(platform_run.id)
        assert len(deliveries) == EPISODES and set(deliveries.values()) == {1}


def _closed(spool: FleetSpool, local_id: str) -> bool:
    run = spool.reading.run(local_id)
    return run is not None and run.closed
