"""Whatever the platform answers to a run's uploads, in any order, every
episode ends delivered exactly once, or counted as failed for a reason that
is about it, or kept for ``push``; and the run is never closed as completed
while episodes wait for a set-up fix.

The answers come from the fake platform (hypothesis picks them); the spool
is a real SQLite file and the delivery loop the real one.
"""

from __future__ import annotations

import dataclasses
import os
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import prime_runs_otel as pro
from prime_runs_otel.config import resolve_settings
from prime_runs_otel.deliver.refusals import CONTENT_STATUSES
from prime_runs_otel.deliver.spool import Spool
from prime_runs_otel.deliver.uploader import Uploader
from prime_runs_otel.produce.synthetic import synthetic_episodes
from prime_runs_otel.testing import FakePlatform

EPISODES = 12
TRACES_UPLOAD = r"^/api/v1/traces$"

#: One answer to one upload: an error status said before acting, or a
#: gateway's 502 after the upload was stored.
ANSWERS = st.one_of(
    st.sampled_from([308, 400, 401, 403, 404, 408, 409, 413, 422, 429, 500, 502, 503]),
    st.just("ambiguous"),
)


@pytest.fixture(scope="module")
def fake() -> Iterator[FakePlatform]:
    with FakePlatform() as platform:
        yield platform


def _stored_run(spool_dir: Path, seed: int) -> str:
    """A run of ``EPISODES`` episodes, ended, in a spool of its own."""
    run = pro.start_run(name="sequences", environments=["gsm8k"], mode="local", spool_dir=spool_dir)
    for record in synthetic_episodes(EPISODES, seed=seed):
        run.record_episode(record)
    run.finish()
    return run.id


def _deliver(spool: Spool, uploader: Uploader, local_id: str) -> None:
    """Delivery passes until the run is closed or stopped."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        uploader.deliver_once(only=[local_id])
        run = spool.reading.run(local_id)
        assert run is not None
        if run.settled:
            return
        time.sleep(0.01)
    raise AssertionError("delivery neither closed nor stopped the run")


@settings(
    max_examples=8,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(answers=st.lists(ANSWERS, max_size=5), seed=st.integers(0, 2**16))
def test_any_sequence_of_answers_loses_nothing_and_fails_only_what_it_is_about(
    fake: FakePlatform, answers: list[int | str], seed: int
) -> None:
    for name, value in fake.client_env().items():
        os.environ[name] = value
    with tempfile.TemporaryDirectory() as folder:
        spool_dir = Path(folder)
        local_id = _stored_run(spool_dir, seed)
        online = dataclasses.replace(
            resolve_settings(spool_dir=spool_dir, mode="online"), retry_max_delay=0.02
        )
        spool = Spool(online.spool_path, max_bytes=online.spool_max_bytes)
        spool.delivery.set_mode(local_id, "online")
        for answer in answers:
            if answer == "ambiguous":
                fake.ambiguous_next(1, method="POST", path=TRACES_UPLOAD)
            else:
                fake.fail_next(1, status=int(answer), method="POST", path=TRACES_UPLOAD)
        uploader = Uploader(spool, online, poll_interval=0.01)
        try:
            _deliver(spool, uploader, local_id)
            run = spool.reading.run(local_id)
            assert run is not None and run.platform_id is not None
            pending = spool.reading.pending_count(local_id)
            for _ in range(len(answers)):
                if not run.stopped:
                    break
                # Stopped on a set-up answer: kept, and the run left open.
                assert fake.run(run.platform_id).status == "RUNNING"
                assert pending > 0
                spool.delivery.reopen_failed(local_id)  # what `push` does
                _deliver(spool, uploader, local_id)
                run = spool.reading.run(local_id)
                assert run is not None and run.platform_id is not None
                pending = spool.reading.pending_count(local_id)
            assert run.closed and spool.reading.pending_count(local_id) == 0
            assert fake.run(run.platform_id).status == "COMPLETED"
            deliveries = fake.episode_deliveries(run.platform_id)
            assert set(deliveries.values()) <= {1}, "no episode stored twice"
            assert len(deliveries) + run.failed == EPISODES, "delivered or counted"
            # Only an answer about the episodes fails one, and only one it
            # narrowed the upload down to.
            assert run.failed <= sum(answer in CONTENT_STATUSES for answer in answers)
        finally:
            uploader.stop()
            spool.close()
            fake.clear_faults()  # those no request used must not leak into the next
