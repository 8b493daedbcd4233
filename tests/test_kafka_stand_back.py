"""A fleet member's delivery (its consumer loop and its uploader) runs at a
lower CPU priority than the threads that answer requests, so that on busy
cores an acknowledgement does not wait behind delivery; a ``serve`` alone,
whose request threads commit to the spool themselves, keeps every thread
at the process's priority.

Read off ``/proc/<pid>/task/*/stat`` of real ``serve`` processes (Linux,
where a thread has a priority of its own)."""

from __future__ import annotations

from pathlib import Path

import pytest
from kafka_fleet import Fleet, all_closed, fleet, kafka, member_env, run_bodies
from test_receiver import ServeProcess, episodes, post, wait_for

from prime_runs_otel.testing import FakePlatform

__all__ = ["fleet", "kafka"]  # the fixtures

pytestmark = pytest.mark.xdist_group("kafka")


def _niceness(stat: Path) -> int:
    return int(stat.read_text().rsplit(")", 1)[1].split()[16])


def _standing_back(serve: ServeProcess) -> int:
    """How many of the process's threads run below its main thread's priority."""
    assert serve.process is not None
    tasks = Path(f"/proc/{serve.process.pid}/task")
    base = _niceness(tasks / str(serve.process.pid) / "stat")
    lower = 0
    for task in tasks.iterdir():
        try:
            lower += _niceness(task / "stat") > base
        except (OSError, IndexError):
            continue  # the thread ended meanwhile
    return lower


def test_a_members_consumer_loop_and_uploader_stand_back(fleet: Fleet) -> None:
    member = fleet.add()
    wait_for(
        lambda: _standing_back(member) >= 2,
        60,
        "the member's consumer loop and uploader at a lower priority",
    )


def test_a_serve_alone_runs_every_thread_at_its_priority(tmp_path: Path) -> None:
    with FakePlatform() as platform:
        serve = ServeProcess(tmp_path, member_env(tmp_path, platform), "--no-grpc").start()
        try:
            (body,) = run_bodies(episodes(2, seed=1700), "alone", 1)
            answer = post(serve.traces_url, body)
            assert answer.status_code == 200, answer.text
            wait_for(lambda: all_closed(platform, ["alone"]), 120, "the run delivered")
            assert _standing_back(serve) == 0
        finally:
            serve.stop()
