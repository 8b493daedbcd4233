"""A request ``serve`` refuses for want of room is refused whole.

A collector retries a request answered 503 (or gRPC UNAVAILABLE) as a
whole, so ``serve`` commits none of it and counts none of it lost: the
sender owns what was never acknowledged. Were part of it committed and the
rest counted ``rejected``, the retry would store the rest, and the run
would end with every episode stored and a loss reported that never
happened.

Real parts only: a ``serve`` process with a small spool cap
(``PRIME_RUNS_OTEL_SPOOL_MAX_BYTES``), real OTLP requests, and the cap
raised by restarting ``serve`` on the same spool, as an operator would.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import grpc
import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceResponse
from test_receiver import (
    ServeProcess,
    episodes,
    post,
    protobuf_body,
    run_spans,
    serve_env,
    start_serve,
)

from prime_runs_otel.deliver.spool import Spool

__all__ = ["start_serve"]  # the fixture, shared with test_receiver

#: Requests sent, and the episodes in each (about 9 KB each).
REQUESTS = 12
PER_REQUEST = 10
#: A cap the first requests fit under, and one request crosses midway.
SMALL_CAP = 400_000
LARGE_CAP = 10 * 1024**2


def _spool(root: Path) -> Spool:
    return Spool(root / "serve-spool" / "spool.sqlite3", max_bytes=LARGE_CAP)


def _send(serve: ServeProcess, body: bytes, transport: str = "http") -> bool:
    """Export ``body`` as a collector would; whether it was acknowledged.
    A refusal must be one every OTLP client retries, saying it is the cap."""
    if transport == "http":
        answer = post(serve.traces_url, body)
        assert answer.status_code in (200, 503), answer.text
        assert answer.status_code == 200 or "cap" in answer.text, answer.text
        return answer.status_code == 200
    with grpc.insecure_channel(f"127.0.0.1:{serve.grpc_port}") as channel:
        export = channel.unary_unary(
            "/opentelemetry.proto.collector.trace.v1.TraceService/Export",
            request_serializer=None,
            response_deserializer=ExportTraceServiceResponse.FromString,
        )
        try:
            export(body, timeout=60)
        except grpc.RpcError as exc:
            assert exc.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, exc
            assert "grpc-status-details-bin" in dict(exc.trailing_metadata() or ()), exc
            return False
    return True


def _fill(serve: ServeProcess, bodies: list[bytes], transport: str = "http") -> int:
    """Send ``bodies`` in order until one is refused; the index of that one."""
    for index, body in enumerate(bodies):
        if not _send(serve, body, transport):
            return index
    raise AssertionError(f"the {SMALL_CAP}-byte cap was meant to refuse a request")


def test_a_request_past_the_cap_is_refused_whole_and_its_retry_stores_it_without_a_loss(
    start_serve: Callable[..., ServeProcess], tmp_path: Path
) -> None:
    bodies = [
        protobuf_body(run_spans(episodes(PER_REQUEST, seed=index), run_id=f"whole-{index}"))
        for index in range(REQUESTS)
    ]
    env = serve_env(tmp_path, None, PRIME_RUNS_OTEL_SPOOL_MAX_BYTES=str(SMALL_CAP))
    serve = start_serve(env)
    refused_at = _fill(serve, bodies)
    assert refused_at >= 1, "the first request fits under the cap"
    serve.stop()

    # The cap raised, the collector's retry (and the requests after it) fit.
    env["PRIME_RUNS_OTEL_SPOOL_MAX_BYTES"] = str(LARGE_CAP)
    serve = start_serve(env)
    for body in bodies[refused_at:]:
        assert _send(serve, body), "the retry fits under the raised cap"
    serve.stop()

    spool = _spool(tmp_path)
    for index in range(REQUESTS):
        run = spool.reading.run(f"whole-{index}")
        assert run is not None, index
        assert (run.episodes, run.rejected) == (PER_REQUEST, 0), (index, run)
    spool.close()


@pytest.mark.parametrize("transport", ["http", "grpc"])
def test_a_request_refused_at_the_cap_and_never_retried_is_not_counted_by_serve(
    start_serve: Callable[..., ServeProcess], tmp_path: Path, transport: str
) -> None:
    bodies = [
        protobuf_body(run_spans(episodes(PER_REQUEST, seed=index), run_id=f"given-up-{index}"))
        for index in range(REQUESTS)
    ]
    serve = start_serve(serve_env(tmp_path, None, PRIME_RUNS_OTEL_SPOOL_MAX_BYTES=str(SMALL_CAP)))
    refused_at = _fill(serve, bodies, transport)
    # Refused again while the cap holds: still nothing committed or counted.
    assert not _send(serve, bodies[refused_at], transport)
    serve.stop()

    spool = _spool(tmp_path)
    for index in range(refused_at):
        run = spool.reading.run(f"given-up-{index}")
        assert run is not None and (run.episodes, run.rejected) == (PER_REQUEST, 0), run
    refused = spool.reading.run(f"given-up-{refused_at}")
    assert refused is None or (refused.episodes, refused.rejected) == (0, 0), (
        "never acknowledged, the request is the sender's: serve neither stores part of it "
        "nor counts it lost",
        refused,
    )
    spool.close()
