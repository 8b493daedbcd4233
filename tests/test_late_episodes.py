"""A run closes only whole, whatever order its spans arrive in.

Behind a collector the run's end can reach ``serve`` before some of its
episodes (a queue with several consumers, retries after a restart). The end
span says how many episodes the producer recorded, and the run is not
closed while any of them is missing or pending, until the run has gone
``--straggler-wait`` seconds without news; time ``serve`` was down does not
count. Episodes that still arrive after the close are delivered to the
closed run if the platform takes them, and otherwise counted late and
undelivered; ``runs`` and ``show`` never call a run delivered while any is
pending.
"""

from __future__ import annotations

import json
import signal
import sqlite3
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from test_receiver import (
    ENVIRONMENT,
    ServeProcess,
    assert_delivered_once,
    closed_run,
    episodes,
    post,
    protobuf_body,
    run_spans,
    serve_env,
    start_serve,
    wait_for,
)

from prime_runs_otel import emit_run_end, run_resource
from prime_runs_otel.config import DEFAULT_SPOOL_MAX_BYTES
from prime_runs_otel.deliver.spool import Spool
from prime_runs_otel.read.episodes import EpisodeArrival
from prime_runs_otel.read.records import RunBatch, RunEnd, RunIdentity
from prime_runs_otel.testing import FakePlatform
from prime_runs_otel.view.runs import run_view

__all__ = ["start_serve"]  # the fixture, shared with test_receiver


def end_spans(run_id: str, recorded: int, resource: Resource | None = None) -> list[ReadableSpan]:
    """The run's end alone, counting ``recorded`` episodes."""
    memory = InMemorySpanExporter()
    provider = TracerProvider(
        resource=resource or run_resource(run_id=run_id, environments=[ENVIRONMENT], name=run_id)
    )
    provider.add_span_processor(SimpleSpanProcessor(memory))
    emit_run_end(provider.get_tracer("test"), "completed", episodes_recorded=recorded)
    provider.shutdown()
    return list(memory.get_finished_spans())


def send(serve: ServeProcess, spans: Sequence[ReadableSpan]) -> None:
    assert post(serve.traces_url, protobuf_body(spans)).status_code == 200


def spool_of(serve: ServeProcess) -> Spool:
    return Spool(serve.root / "serve-spool" / "spool.sqlite3", max_bytes=DEFAULT_SPOOL_MAX_BYTES)


def backdate(serve: ServeProcess, seconds: float) -> None:
    """Move every run's end and last news ``seconds`` into the past: the spool
    as a ``serve`` killed that long ago left it."""
    with sqlite3.connect(serve.root / "serve-spool" / "spool.sqlite3") as db:
        db.execute(
            "UPDATE runs SET ended_at = ended_at - ?, last_seen = last_seen - ?",
            (seconds, seconds),
        )


def test_the_end_before_the_last_episodes_waits_for_them_across_a_restart(
    start_serve: Callable[..., ServeProcess], tmp_path: Path, platform: FakePlatform
) -> None:
    serve = start_serve(serve_env(tmp_path, platform))
    records = episodes(40, seed=61)

    # The end (40 episodes) comes with the first 30; the collector still
    # holds the other 10 when serve is killed.
    send(serve, [*run_spans(records[:30], run_id="out-of-order", end=False)])
    send(serve, end_spans("out-of-order", len(records)))
    (run,) = wait_for(platform.runs, 60, "the run to be created")
    wait_for(lambda: len(platform.episodes(run.id)) == 30, 60, "the first 30 to arrive")
    serve.stop(signal.SIGKILL)

    # serve stays down a minute; then it and the collector come back, and
    # the collector's next retry brings the rest a moment later.
    backdate(serve, 60)
    serve.start()
    time.sleep(2)
    assert platform.run(run.id).status == "RUNNING", "closed without 10 of its episodes"
    send(serve, run_spans(records[30:], run_id="out-of-order", start=False, end=False))

    run = closed_run(platform, "out-of-order", timeout=60)
    assert run.status == "COMPLETED"
    assert_delivered_once(platform, run, records)
    [finalize] = [r for r in platform.requests() if r.path.endswith("/finalize")]
    uploads = [r for r in platform.requests() if r.path == "/api/v1/traces" and r.status == 201]
    assert max(upload.received_at for upload in uploads) < finalize.received_at
    spool = spool_of(serve)
    try:
        # The spool marks the run closed once the platform's finalize answered.
        row = wait_for(
            lambda: (r := spool.reading.runs()[0]).closed and r, 30, "the close in the spool"
        )
        view = run_view(spool, row)
    finally:
        spool.close()
    assert (view["state"], view["pending"], view["late"], view["episodes"]) == (
        "delivered",
        0,
        0,
        40,
    )


def test_an_episode_after_the_close_is_delivered_late(
    start_serve: Callable[..., ServeProcess], tmp_path: Path, platform: FakePlatform
) -> None:
    serve = start_serve(serve_env(tmp_path, platform), "--straggler-wait", "0.5")
    records = episodes(10, seed=62)

    send(serve, run_spans(records[:9], run_id="late-one", end=False))
    send(serve, end_spans("late-one", len(records)))
    run = closed_run(platform, "late-one", timeout=60)
    assert len(platform.episodes(run.id)) == 9  # the wait for the tenth ran out

    send(serve, run_spans(records[9:], run_id="late-one", start=False, end=False))
    wait_for(lambda: len(platform.episodes(run.id)) == 10, 60, "the late episode to arrive")
    assert_delivered_once(platform, run, records)
    spool = spool_of(serve)
    try:
        view = wait_for(
            lambda: (v := run_view(spool, spool.reading.runs()[0]))["pending"] == 0 and v,
            30,
            "pending 0",
        )
    finally:
        spool.close()
    assert (view["state"], view["late"], view["late_refused"]) == ("delivered", 1, 0)


def test_a_late_episode_the_platform_refuses_is_counted_late_and_undelivered(
    start_serve: Callable[..., ServeProcess], tmp_path: Path, platform: FakePlatform
) -> None:
    platform.closed_runs_take_episodes = False
    serve = start_serve(serve_env(tmp_path, platform), "--straggler-wait", "0.5")
    records = episodes(6, seed=63)

    send(serve, run_spans(records[:5], run_id="late-refused", end=False))
    send(serve, end_spans("late-refused", len(records)))
    run = closed_run(platform, "late-refused", timeout=60)

    send(serve, run_spans(records[5:], run_id="late-refused", start=False, end=False))
    spool = spool_of(serve)
    try:
        row = wait_for(lambda: (r := spool.reading.runs()[0]).late_refused and r, 30, "the refusal")
        view = run_view(spool, row)
    finally:
        spool.close()
    assert len(platform.episodes(run.id)) == 5
    assert (view["late"], view["late_refused"], view["failed"], view["pending"]) == (1, 1, 1, 0)
    assert view["state"] == "delivered" and view["status"] == "completed"


@pytest.mark.parametrize("arrival", ["after the close", "during the close"])
def test_a_closed_run_with_a_late_episode_pending_is_not_called_delivered(
    tmp_path: Path, arrival: str
) -> None:
    """An episode stored between the check that let the run close and the
    platform's answer to the close is late too: not part of the closed run,
    and delivered to it like any late episode (not left pending for ever)."""
    spool = Spool(tmp_path / "spool.sqlite3", max_bytes=DEFAULT_SPOOL_MAX_BYTES)
    try:
        identity = RunIdentity(local_id="closed-with-pending", environments=(ENVIRONMENT,))
        spool.intake.ingest(
            [RunBatch(identity=identity, end=RunEnd("completed", None, 0))], mode="online"
        )
        closing = arrival == "during the close"
        state = "finalizing" if closing else "closed"
        spool.delivery.update_run(identity.local_id, close_state=state, platform_id="p-1")
        [record] = episodes(1, seed=64)
        late = EpisodeArrival.of(record, json.dumps(record).encode())
        spool.intake.ingest([RunBatch(identity=identity, episodes=[late])], mode="online")
        if closing:
            spool.delivery.mark_closed(identity.local_id)

        [row] = spool.reading.runs()
        view = run_view(spool, row)
        # Nothing delivers from this spool: the run waits for `push`, not delivered.
        assert (view["state"], view["pending"], view["late"]) == ("paused", 1, 1)
        assert [run.local_id for run in spool.delivery.runs_to_deliver_or_close()] == [
            identity.local_id
        ]
    finally:
        spool.close()
