"""The run's span batches (``prime_runs_otel.produce.run_batches``, exported by
the run's producer thread with ``OTEL_BSP_*``'s settings): an export that
cannot finish holds the producer, and so the caller, instead of losing
episodes to a full queue, and ``force_flush(timeout)`` returns within its
timeout while an export cannot finish.

An export that cannot finish is made real: another connection holds the
spool's write lock (as a second process writing to the same spool would),
so the exporter's commit waits on SQLite's busy handler.
"""

from __future__ import annotations

import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

import prime_runs_otel as pro
from prime_runs_otel.produce.run_batches import ProducerBatches
from prime_runs_otel.produce.synthetic import synthetic_episode

WAIT = 120.0


def _wait_for(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + WAIT
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)


@contextmanager
def write_lock_held(spool: Path, longest: float) -> Iterator[threading.Event]:
    """The spool's write lock, taken by another connection until the event
    is set (or ``longest`` seconds pass, so a failing test cannot hang)."""
    db = sqlite3.connect(spool, timeout=60, check_same_thread=False)
    db.execute("BEGIN IMMEDIATE")
    release = threading.Event()

    def hold() -> None:
        release.wait(longest)
        db.rollback()
        db.close()

    holder = threading.Thread(target=hold, daemon=True)
    holder.start()
    try:
        yield release
    finally:
        release.set()
        holder.join(timeout=WAIT)


def _queue(run: pro.Run) -> ProducerBatches:
    assert isinstance(run._queue, ProducerBatches)
    return run._queue


def test_the_producer_waits_for_room_and_no_episode_is_lost(
    monkeypatch: pytest.MonkeyPatch, isolated_environment: Path
) -> None:
    """Batches of 8 and an exporter that cannot commit: the producer thread,
    which exports them, waits in the export with no more than a batch
    taken; the hand-off fills up and the caller waits for room. Once the
    commit goes through every episode is stored. The SDK's own processor
    would have dropped all but the newest spans of its queue."""
    monkeypatch.setenv("OTEL_BSP_MAX_QUEUE_SIZE", "40")
    monkeypatch.setenv("OTEL_BSP_MAX_EXPORT_BATCH_SIZE", "8")
    run = pro.start_run(name="backpressure", environments=["env-a"], child_spans=False)
    run.commit()  # the run-start span is in: the spool exists
    queue = _queue(run)
    episodes = 200
    handed = run._handoff._queue
    with write_lock_held(run.settings.spool_path, longest=WAIT) as release:
        recorder = threading.Thread(
            target=lambda: [run.record_episode(synthetic_episode(i)) for i in range(episodes)]
        )
        recorder.start()
        _wait_for(lambda: len(handed._items) >= handed.capacity, "the hand-off to fill up")
        time.sleep(0.5)  # the caller would overrun the hand-off now, if it did not wait
        assert recorder.is_alive()
        assert len(handed._items) <= handed.capacity
        assert queue.queued <= 8
        release.set()
    recorder.join(timeout=WAIT)
    result = run.finish(timeout=60)
    assert result.episodes == episodes and result.failed == 0
    assert queue.queued == 0


def test_force_flush_returns_within_its_timeout_while_an_export_cannot_finish(
    isolated_environment: Path,
) -> None:
    run = pro.start_run(name="flush-timeout", environments=["env-a"], child_spans=False)
    run.commit()
    with write_lock_held(run.settings.spool_path, longest=20.0) as release:
        run.record_episode(synthetic_episode(0))
        run._handoff.drain()  # the episode span is in the queue
        started = time.monotonic()
        flushed = run.tracer_provider.force_flush(timeout_millis=300)
        took = time.monotonic() - started
        release.set()
    assert flushed is False
    assert took < 10.0, f"force_flush(300 ms) took {took:.1f} s"
    # The export went on after the timeout: nothing is lost.
    assert run.tracer_provider.force_flush(timeout_millis=int(WAIT * 1000))
    assert run.finish(timeout=60).episodes == 1


def test_force_flush_flushes_in_place_where_no_thread_can_start(
    isolated_environment: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Python 3.12 and later refuse a new thread in an atexit handler, where a
    run never finished reports its crash; this interpreter does not, so the
    refusal is stood in for (the one stand-in in this file): the flush then
    happens on the calling thread and the episode is kept."""
    run = pro.start_run(name="no-threads", environments=["env-a"], child_spans=False)
    run.record_episode(synthetic_episode(0))
    run._handoff.drain()

    def refused(self: threading.Thread) -> None:
        raise RuntimeError("can't create new thread at interpreter shutdown")

    with monkeypatch.context() as patched:
        patched.setattr(threading.Thread, "start", refused)
        assert run.tracer_provider.force_flush(timeout_millis=30_000)
    assert _queue(run).queued == 0
    assert run.finish(timeout=60).episodes == 1
