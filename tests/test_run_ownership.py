"""Whose word ends a run, and which platform runs ``serve`` adds to.

Anyone holding ``serve``'s token may send spans, and a run key is no secret
(it is on the platform, in logs, often chosen by hand). So a run's end is
taken only from the producer that owns the run (its ``service.instance.id``
on the run's start), and a run that names a platform run to attach to is
refused unless ``serve`` was started with ``--allow-attach``."""

from __future__ import annotations

import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceResponse
from opentelemetry.sdk.resources import Resource
from test_receiver import (
    ServeProcess,
    assert_delivered_once,
    closed_run,
    post,
    protobuf_body,
    run_spans,
    serve_env,
    wait_for,
)

from prime_runs_otel import run_resource
from prime_runs_otel.config import DEFAULT_SPOOL_MAX_BYTES
from prime_runs_otel.deliver.spool import Spool
from prime_runs_otel.produce.synthetic import synthetic_episodes
from prime_runs_otel.read.records import RunBatch, RunEnd, RunIdentity, RunStart
from prime_runs_otel.testing import FakePlatform


def _producer(run_id: str, instance: str, **fields: Any) -> Resource:
    return run_resource(
        run_id=run_id,
        name=run_id,
        environments=["gsm8k-demo"],
        extra={"service.instance.id": instance},
        **fields,
    )


def _answer(response: httpx.Response) -> ExportTraceServiceResponse:
    assert response.status_code == 200, response.text
    return ExportTraceServiceResponse.FromString(response.content)


@pytest.fixture
def serve(tmp_path: Path, platform: FakePlatform) -> Iterator[ServeProcess]:
    process = ServeProcess(tmp_path, serve_env(tmp_path, platform), "--no-grpc").start()
    try:
        yield process
    finally:
        if process.process is not None:
            process.stop(signal.SIGKILL)


def test_an_end_from_another_producer_leaves_the_run_open_for_its_owner(
    serve: ServeProcess, platform: FakePlatform
) -> None:
    records = list(synthetic_episodes(20, seed=5))
    owner = _producer("victim-run", "owner-process")
    first = run_spans(records[:10], run_id="victim-run", end=False, resource=owner)
    _answer(post(serve.traces_url, protobuf_body(first)))
    wait_for(platform.runs, 30, "the run to be created")

    intruder = _producer("victim-run", "intruder-process")
    forged = [s for s in run_spans([], run_id="victim-run", resource=intruder) if "end" in s.name]
    refused = _answer(post(serve.traces_url, protobuf_body(forged)))
    assert refused.partial_success.rejected_spans == 1
    assert "does not own the run" in refused.partial_success.error_message

    rest = run_spans(records[10:], run_id="victim-run", start=False, end=False, resource=owner)
    _answer(post(serve.traces_url, protobuf_body(rest)))
    end = [s for s in run_spans(records, run_id="victim-run", resource=owner) if "end" in s.name]
    _answer(post(serve.traces_url, protobuf_body(end)))

    run = closed_run(platform, "victim-run")
    assert run.status == "COMPLETED", run.error_message
    assert_delivered_once(platform, run, records)
    assert "intruder-process" in serve.log()


def _create_platform_run(platform: FakePlatform) -> str:
    answer = httpx.post(
        f"{platform.url}/api/v1/evaluations/",
        json={"name": "launched", "environments": [{"id": "env-launcher"}], "tags": []},
        headers={"Authorization": "Bearer test-key"},
    )
    answer.raise_for_status()
    return str(answer.json()["evaluation_id"])


def test_attach_is_refused_unless_serve_allows_it(
    serve: ServeProcess, platform: FakePlatform
) -> None:
    target = _create_platform_run(platform)
    injected = run_spans(
        list(synthetic_episodes(3, seed=8)),
        run_id="injector",
        resource=_producer("injector", "someone", attach=target),
    )
    refused = _answer(post(serve.traces_url, protobuf_body(injected)))
    assert refused.partial_success.rejected_spans == 3 + 2  # the episodes, start and end
    assert "--allow-attach" in refused.partial_success.error_message
    run = platform.run(target)
    assert run.status not in ("COMPLETED", "FAILED") and platform.episodes(target) == []
    assert "--allow-attach" in serve.log()


def test_attach_goes_through_with_allow_attach(tmp_path: Path, platform: FakePlatform) -> None:
    target = _create_platform_run(platform)
    records = list(synthetic_episodes(3, seed=8))
    serve = ServeProcess(
        tmp_path, serve_env(tmp_path, platform), "--no-grpc", "--allow-attach"
    ).start()
    try:
        spans = run_spans(
            records, run_id="hosted", resource=_producer("hosted", "launcher", attach=target)
        )
        assert not _answer(
            post(serve.traces_url, protobuf_body(spans))
        ).partial_success.rejected_spans
        wait_for(lambda: platform.run(target).status == "COMPLETED", 60, "the attached run")
        assert_delivered_once(platform, platform.run(target), records)
    finally:
        serve.stop(signal.SIGKILL)


# -- the rule itself, in the spool ---------------------------------------------------------


def _end(producer: str | None, status: str = "completed") -> RunEnd:
    return RunEnd(status=status, error=None, episodes_recorded=0, producer=producer)


def _ingest(spool: Spool, *batches: RunBatch, check: bool = True) -> tuple[tuple[str, str], ...]:
    return spool.intake.ingest(
        batches, mode="local", register_producer=False, check_owner=check
    ).foreign_ends


def _end_status(spool: Spool, key: str) -> str | None:
    (row,) = [run for run in spool.reading.runs() if run.local_id == key]
    return row.end_status


@pytest.fixture
def spool(tmp_path: Path) -> Iterator[Spool]:
    opened = Spool(tmp_path / "spool.sqlite3", max_bytes=DEFAULT_SPOOL_MAX_BYTES)
    try:
        yield opened
    finally:
        opened.close()


def test_the_owning_start_claims_the_run_and_a_co_producer_start_does_not(spool: Spool) -> None:
    run = RunIdentity(local_id="claimed")
    worker = RunStart({}, owner=False, producer="worker")
    owner = RunStart({"a": 1}, producer="owner")
    assert _ingest(spool, RunBatch(run, start=worker), RunBatch(run, start=owner)) == ()
    assert _ingest(spool, RunBatch(run, end=_end("worker"))) == (("claimed", "worker"),)
    assert _end_status(spool, "claimed") is None
    assert _ingest(spool, RunBatch(run, end=_end("owner"))) == ()
    assert _end_status(spool, "claimed") == "completed"


def test_the_owners_config_replaces_a_workers_until_the_run_is_sent(spool: Spool) -> None:
    """A worker's start may arrive first (a prime-rl trainer's before its
    orchestrator's): the run must still register with what its owner says,
    its config as well as its identity, and never change once sent."""
    run = RunIdentity(local_id="worker-first")
    worker = RunStart({"from": "worker"}, owner=False, producer="worker")
    owner = RunStart({"from": "owner", "max_steps": 3}, producer="owner")
    _ingest(spool, RunBatch(run, start=worker))
    _ingest(spool, RunBatch(run, start=owner))
    _ingest(spool, RunBatch(run, start=worker))  # a worker's copy after it changes nothing
    assert _config(spool, "worker-first") == {"from": "owner", "max_steps": 3}

    assert spool.delivery.claim_create("worker-first")
    _ingest(spool, RunBatch(run, start=RunStart({"from": "a later owner"}, producer="owner")))
    assert _config(spool, "worker-first") == {"from": "owner", "max_steps": 3}


def test_a_damaged_owner_config_does_not_replace_a_workers(spool: Spool) -> None:
    run = RunIdentity(local_id="damaged-owner")
    _ingest(spool, RunBatch(run, start=RunStart({"w": 1}, owner=False, producer="worker")))
    damaged = RunStart({}, corrupt_reason="the run config is damaged", producer="owner")
    _ingest(spool, RunBatch(run, start=damaged))
    assert _config(spool, "damaged-owner") == {"w": 1}


def _config(spool: Spool, key: str) -> Any:
    row = spool.reading.run(key)
    assert row is not None
    return row.config


def test_an_end_before_any_start_claims_the_run(spool: Spool) -> None:
    run = RunIdentity(local_id="early-end")
    assert _ingest(spool, RunBatch(run, end=_end("owner"))) == ()
    assert _ingest(spool, RunBatch(run, start=RunStart({}, producer="owner"))) == ()
    assert _end_status(spool, "early-end") == "completed"


def test_in_process_every_end_is_the_process_own(spool: Spool) -> None:
    run = RunIdentity(local_id="in-process")
    _ingest(spool, RunBatch(run, start=RunStart({}, producer="a")), check=False)
    assert _ingest(spool, RunBatch(run, end=_end(None)), check=False) == ()
    assert _end_status(spool, "in-process") == "completed"


def test_every_run_resource_of_a_process_names_the_same_producer() -> None:
    first, second = run_resource(run_id="one"), run_resource(run_id="two")
    instance = first.attributes["service.instance.id"]
    assert instance and second.attributes["service.instance.id"] == instance
    given = run_resource(run_id="three", extra={"service.instance.id": "kept"})
    assert given.attributes["service.instance.id"] == "kept"
