"""``serve`` past its concurrency limits, driven by the real OpenTelemetry
Collector (``OTELCOL_BIN``): a collector with far more queue consumers than
``serve`` admits at once gets a retryable answer to every call it is refused
(``UNAVAILABLE`` with ``RetryInfo`` over gRPC, 503 with ``Retry-After`` over
HTTP), retries, and every episode arrives.

The OTLP specification makes ``RESOURCE_EXHAUSTED`` without ``RetryInfo``
permanent: a collector answered that way logs "Permanent error" and drops
the batch. So the test also fails the moment the collector's log says it
dropped anything.
"""

from __future__ import annotations

import signal
import threading
from pathlib import Path
from typing import Any

import grpc
import httpx
import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceResponse,
)
from test_collector import Producer, resource
from test_otelcol import Otelcol, overlay
from test_receiver import ServeProcess, protobuf_body, run_spans, serve_env, wait_for
from test_serve_metrics import scrape

from prime_runs_otel import emit_run_end, emit_run_start
from prime_runs_otel.config import DEFAULT_SPOOL_MAX_BYTES
from prime_runs_otel.deliver.spool import Spool
from prime_runs_otel.produce.synthetic import synthetic_episodes

TOKEN = "overload-test-token"
RUNS = 24
EPISODES_PER_RUN = 5
#: Far more calls at once than ``serve --workers 1`` admits (4).
CONSUMERS = 40


def _collector_to_serve(
    root: Path, serve: ServeProcess, protocol: str, started: list[Any]
) -> Otelcol:
    """A collector whose exporter sends to ``serve`` with many consumers and
    tiny batches: many calls at once, each one refused only for the moment."""
    if protocol == "grpc":
        exporter_name = "otlp/serve"
        exporter: dict[str, Any] = {
            "endpoint": f"127.0.0.1:{serve.grpc_port}",
            "tls": {"insecure": True},
            "headers": {"authorization": f"Bearer {TOKEN}"},
        }
    else:
        exporter_name = "otlphttp/serve"
        exporter = {"endpoint": serve.url, "headers": {"Authorization": f"Bearer {TOKEN}"}}
    exporter.update(
        timeout="30s",
        retry_on_failure={
            "enabled": True,
            "initial_interval": "100ms",
            "max_interval": "1s",
            "max_elapsed_time": "0s",
        },
        sending_queue={
            "enabled": True,
            "num_consumers": CONSUMERS,
            "queue_size": 100_000,
            "batch": {"flush_timeout": "10ms", "sizer": "items", "min_size": 1, "max_size": 2},
        },
    )
    config = overlay(
        root,
        f"overload-{protocol}",
        {
            "extensions": {"health_check": {"endpoint": "${env:PRIME_RUNS_OTEL_HEALTH_ENDPOINT}"}},
            "receivers": {
                "otlp": {
                    "protocols": {
                        "grpc": {"endpoint": "${env:PRIME_RUNS_OTEL_OTLP_GRPC_ENDPOINT}"},
                    }
                }
            },
            "exporters": {exporter_name: exporter},
            "service": {
                "extensions": ["health_check"],
                "pipelines": {"traces": {"receivers": ["otlp"], "exporters": [exporter_name]}},
            },
        },
    )
    collector = Otelcol(root, f"overload-{protocol}", [config], {})
    started.append(collector)
    return collector.start()


def _episodes_in_spool(serve: ServeProcess) -> dict[str, int]:
    path = serve.root / "serve-spool" / "spool.sqlite3"
    if not path.exists():
        return {}
    spool = Spool(path, max_bytes=DEFAULT_SPOOL_MAX_BYTES)
    try:
        return {run.local_id: run.episodes for run in spool.reading.runs()}
    finally:
        spool.close()


@pytest.mark.parametrize("protocol", ["grpc", "http"])
def test_a_collector_past_serve_concurrency_delivers_every_episode(
    tmp_path: Path, protocol: str, started: list[Any]
) -> None:
    serve = ServeProcess(
        tmp_path, serve_env(tmp_path, None), "--token", TOKEN, "--workers", "1"
    ).start()
    started.append(serve)
    collector = _collector_to_serve(tmp_path, serve, protocol, started)

    names = [f"overload-{protocol}-{n}" for n in range(RUNS)]

    def produce(index: int, name: str) -> None:
        producer = Producer(collector.endpoint, resource(name))
        emit_run_start(producer.tracer, {"n": index})
        producer.episodes(list(synthetic_episodes(EPISODES_PER_RUN, seed=100 + index)))
        emit_run_end(producer.tracer, "completed", episodes_recorded=EPISODES_PER_RUN)
        producer.close()

    threads = [threading.Thread(target=produce, args=item) for item in enumerate(names)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    total = RUNS * EPISODES_PER_RUN

    def arrived() -> int:
        return sum(min(count, EPISODES_PER_RUN) for count in _episodes_in_spool(serve).values())

    def arrived_or_dropped() -> bool:
        dropped = _dropped(collector.log())
        assert not dropped, (
            f"the collector dropped {len(dropped)} batch(es) serve refused "
            f"({arrived()}/{total} episodes arrived); the first:\n{dropped[0][:600]}"
        )
        return arrived() == total

    wait_for(arrived_or_dropped, 120, f"every episode of {RUNS} runs to arrive")
    counts = _episodes_in_spool(serve)
    assert all(counts.get(name) == EPISODES_PER_RUN for name in names), counts


def _dropped(log: str) -> list[str]:
    return [line for line in log.splitlines() if "Dropping data" in line]


# -- the answer itself ----------------------------------------------------------------


def test_grpc_overload_is_unavailable_with_retry_info(tmp_path: Path) -> None:
    """Many calls at once: those past the limit are answered ``UNAVAILABLE``
    with a ``RetryInfo``, never ``RESOURCE_EXHAUSTED`` without one."""
    serve = ServeProcess(tmp_path, serve_env(tmp_path, None), "--workers", "1").start()
    try:
        body = protobuf_body(run_spans(list(synthetic_episodes(40, seed=9)), run_id="burst"))
        channel = grpc.insecure_channel(f"127.0.0.1:{serve.grpc_port}")
        export = channel.unary_unary(
            "/opentelemetry.proto.collector.trace.v1.TraceService/Export",
            request_serializer=None,
            response_deserializer=ExportTraceServiceResponse.FromString,
        )
        futures = [export.future(body, timeout=60) for _ in range(40)]
        refused = []
        for future in futures:
            try:
                future.result()
            except grpc.RpcError as exc:
                refused.append(exc)
        channel.close()
        counted = scrape(serve).get('prime_runs_otel_requests_total{outcome="overloaded"}', 0)
    finally:
        serve.stop(signal.SIGKILL)
    assert refused, "40 calls at once against --workers 1 were all admitted"
    for exc in refused:
        assert exc.code() == grpc.StatusCode.UNAVAILABLE, exc
        details = dict(exc.trailing_metadata() or ())
        assert "grpc-status-details-bin" in details, "no RetryInfo in the refusal"
    assert counted == len(refused), "/metrics counts every overload refusal"


def test_http_overload_is_503_with_retry_after(tmp_path: Path) -> None:
    serve = ServeProcess(tmp_path, serve_env(tmp_path, None), "--workers", "1").start()
    try:
        body = protobuf_body(run_spans(list(synthetic_episodes(40, seed=9)), run_id="burst"))
        answers: list[httpx.Response] = []

        def send() -> None:
            answers.append(
                httpx.post(
                    serve.traces_url,
                    content=body,
                    headers={"content-type": "application/x-protobuf"},
                    timeout=60,
                )
            )

        threads = [threading.Thread(target=send) for _ in range(40)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        counted = scrape(serve).get('prime_runs_otel_requests_total{outcome="overloaded"}', 0)
    finally:
        serve.stop(signal.SIGKILL)
    statuses = {answer.status_code for answer in answers}
    assert statuses <= {200, 503}, statuses
    refused = [answer for answer in answers if answer.status_code == 503]
    assert refused, "40 requests at once against --workers 1 were all admitted"
    assert all(answer.headers.get("retry-after") for answer in refused)
    assert counted == len(refused), "/metrics counts every overload refusal"
