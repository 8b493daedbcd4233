"""``prime-runs-otel serve`` as a real process on loopback: OTLP/HTTP (protobuf,
JSON, gzip, deflate) and OTLP/gRPC in, the fake platform out; bad input,
tokens, health, the idle timeout, a full spool and graceful shutdown."""

from __future__ import annotations

import base64
import gzip
import json
import os
import random
import signal
import socket
import subprocess
import sys
import threading
import time
import zlib
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import grpc
import httpx
import pytest
from google.protobuf import json_format
from google.rpc import error_details_pb2, status_pb2
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import (
    OTLPSpanExporter as GrpcSpanExporter,
)
from opentelemetry.exporter.otlp.proto.http import Compression
from opentelemetry.exporter.otlp.proto.http.trace_exporter import (
    OTLPSpanExporter as HttpSpanExporter,
)
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from prime_runs_otel import emit_run_end, emit_run_start, record_episode, run_resource
from prime_runs_otel.cli.otlp_replay import replay_over_otlp
from prime_runs_otel.deliver.spool import Spool
from prime_runs_otel.produce.synthetic import synthetic_episodes
from prime_runs_otel.testing import FakePlatform

PROTOBUF = "application/x-protobuf"
JSON = "application/json"
ENVIRONMENT = "gsm8k-demo"


# -- a serve process ---------------------------------------------------------------


#: Where free_port looks: below Linux's ephemeral range (32768 and up by
#: default), from which the kernel hands out ports for bind(0) and for every
#: outgoing connection, so another test worker's client could take a port
#: from there between free_port and the server binding it.
PORTS = range(15000, 32768)
_pick = random.SystemRandom()  # hypothesis reseeds the module's own


def free_port() -> int:
    """A loopback port nothing listens on, for a server that must be given
    one (and keep it across restarts)."""
    for _ in range(200):
        port = _pick.choice(PORTS)
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise AssertionError(f"no free loopback port in {PORTS}")


def serve_env(root: Path, platform: FakePlatform | None, **extra: str) -> dict[str, str]:
    """The environment of a serve process: its own HOME and spool, the fake
    platform's credentials, nothing of this machine's PRIME_*/OTEL_* settings."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PRIME_", "OTEL_"))}
    env.update(
        HOME=str(root / "home"),
        PRIME_RUNS_OTEL_DIR=str(root / "serve-spool"),
        PRIME_RUNS_OTEL_RETRY_MAX_DELAY="0.3",
    )
    if platform is not None:
        env.update(platform.client_env())
    else:
        env["PRIME_RUNS_MODE"] = "local"
    env.update(extra)
    return env


class ServeProcess:
    """``python -m prime_runs_otel.cli.serve`` on fixed loopback ports, so a
    restarted instance comes back where clients (and collectors) expect it."""

    def __init__(self, root: Path, env: dict[str, str], *args: str) -> None:
        self.root = root
        self.env = env
        self.args = list(args)
        self.http_port = free_port()
        self.grpc_port = free_port()
        self.process: subprocess.Popen[bytes] | None = None
        #: How long a start may take to answer /healthz: a bound on a hang,
        #: not a speed (a start is a second of CPU, but on two cores shared
        #: with the rest of the suite and other work it took over 30 s).
        self.ready_timeout = 120.0
        #: Run in the child before serve starts (resource limits).
        self.preexec: Callable[[], None] | None = None
        self.log_path = root / f"serve-{self.http_port}.log"

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.http_port}"

    @property
    def traces_url(self) -> str:
        return f"{self.url}/v1/traces"

    def start(self) -> ServeProcess:
        command = [
            sys.executable,
            "-m",
            "prime_runs_otel.cli.serve",
            "--http-port",
            str(self.http_port),
            "--grpc-port",
            str(self.grpc_port),
            "--shutdown-grace",
            "10",
            *self.args,
        ]
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(
                command, env=self.env, stdout=log, stderr=log, preexec_fn=self.preexec
            )
        try:
            self.wait_ready(self.ready_timeout)
        except BaseException:
            self.stop(signal.SIGKILL)
            raise
        return self

    def wait_ready(self, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.process is not None
            if self.process.poll() is not None:
                raise AssertionError(f"serve exited {self.process.returncode}:\n{self.log()}")
            try:
                if httpx.get(f"{self.url}/healthz", timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.05)
        raise AssertionError(f"serve did not become ready:\n{self.log()}")

    def stop(self, sig: int = signal.SIGTERM) -> int:
        assert self.process is not None
        if self.process.poll() is None:
            self.process.send_signal(sig)
        code = self.process.wait(timeout=60)
        self.process = None
        return code

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")


@pytest.fixture
def start_serve(tmp_path: Path) -> Iterator[Callable[..., ServeProcess]]:
    started: list[ServeProcess] = []

    def start(env: dict[str, str], *args: str) -> ServeProcess:
        serve = ServeProcess(tmp_path, env, *args).start()
        started.append(serve)
        return serve

    yield start
    for serve in started:
        if serve.process is not None:
            serve.stop(signal.SIGKILL)


@pytest.fixture(scope="module")
def shared(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ServeProcess, FakePlatform]]:
    """One serve + fake platform for the tests that only need a default one
    (each test uses its own run ids)."""
    root = tmp_path_factory.mktemp("shared-serve")
    with FakePlatform() as platform:
        serve = ServeProcess(root, serve_env(root, platform)).start()
        try:
            yield serve, platform
        finally:
            serve.stop(signal.SIGKILL)


# -- producing spans ----------------------------------------------------------------


def run_spans(
    records: Sequence[dict[str, Any]],
    *,
    run_id: str,
    start: bool = True,
    end: bool = True,
    resource: Resource | None = None,
) -> list[ReadableSpan]:
    """The spans a producer emits for a run, captured in memory."""
    memory = InMemorySpanExporter()
    provider = TracerProvider(
        resource=resource or run_resource(run_id=run_id, environments=[ENVIRONMENT], name=run_id)
    )
    provider.add_span_processor(SimpleSpanProcessor(memory))
    tracer = provider.get_tracer("test")
    if start:
        emit_run_start(tracer, {"temperature": 0.5})
    for record in records:
        record_episode(tracer, record)
    if end:
        emit_run_end(tracer, "completed", episodes_recorded=len(records))
    provider.shutdown()
    return list(memory.get_finished_spans())


def export_with(exporter: SpanExporter, spans: Sequence[ReadableSpan]) -> None:
    """Export in one call through a real SDK exporter; it must succeed."""
    assert exporter.export(spans).name == "SUCCESS"
    exporter.shutdown()


def protobuf_body(spans: Sequence[ReadableSpan]) -> bytes:
    return encode_spans(spans).SerializeToString()


def otlp_json(request: ExportTraceServiceRequest) -> dict[str, Any]:
    """OTLP/JSON as the specification writes it: camelCase, hex ids."""
    document = json_format.MessageToDict(request)
    for resource_spans in document.get("resourceSpans", []):
        for scope_spans in resource_spans.get("scopeSpans", []):
            for span in scope_spans.get("spans", []):
                for key in ("traceId", "spanId", "parentSpanId"):
                    if key in span:
                        span[key] = base64.b64decode(span[key]).hex()
    return document


def post(
    url: str,
    body: bytes,
    content_type: str = PROTOBUF,
    **headers: str,
) -> httpx.Response:
    return httpx.post(
        url, content=body, headers={"content-type": content_type, **headers}, timeout=60
    )


def wait_for(condition: Callable[[], Any], timeout: float = 60.0, what: str = "") -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what or condition}")


def closed_run(platform: FakePlatform, name: str, timeout: float = 60.0) -> Any:
    def find() -> Any:
        for run in platform.runs():
            if run.name == name and run.status in ("COMPLETED", "FAILED", "CANCELLED"):
                return run
        return None

    return wait_for(find, timeout, f"run {name} to close")


def assert_delivered_once(
    platform: FakePlatform, run: Any, records: Sequence[dict[str, Any]]
) -> None:
    stored = platform.episodes(run.id)
    assert sorted(episode["id"] for episode in stored) == sorted(r["id"] for r in records)
    assert set(platform.episode_deliveries(run.id).values()) == {1}
    by_id = {episode["id"]: episode for episode in stored}
    for record in records:
        episode = by_id[record["id"]]
        assert episode["traces"][0]["nodes"] == record["traces"][0]["nodes"]


def episodes(count: int, seed: int) -> list[dict[str, Any]]:
    return list(synthetic_episodes(count, seed=seed))


# -- the happy paths -----------------------------------------------------------------


def test_sdk_http_exporter_gzip_run_lands_once_and_completes(
    shared: tuple[ServeProcess, FakePlatform],
) -> None:
    serve, platform = shared
    records = episodes(12, seed=11)
    spans = run_spans(records, run_id="http-gzip")
    export_with(HttpSpanExporter(endpoint=serve.traces_url, compression=Compression.Gzip), spans)

    run = closed_run(platform, "http-gzip")
    assert run.status == "COMPLETED"
    assert run.metadata["temperature"] == 0.5
    assert_delivered_once(platform, run, records)


def test_sdk_grpc_exporter_run_lands_once(shared: tuple[ServeProcess, FakePlatform]) -> None:
    serve, platform = shared
    records = episodes(8, seed=12)
    spans = run_spans(records, run_id="grpc")
    exporter = GrpcSpanExporter(endpoint=f"127.0.0.1:{serve.grpc_port}", insecure=True)
    export_with(exporter, spans)

    run = closed_run(platform, "grpc")
    assert run.status == "COMPLETED"
    assert_delivered_once(platform, run, records)


@pytest.mark.parametrize("encoding", ["", "gzip", "deflate", "raw-deflate"])
def test_otlp_json_with_hex_ids_in_every_encoding(
    shared: tuple[ServeProcess, FakePlatform], encoding: str
) -> None:
    serve, platform = shared
    name = f"json-{encoding or 'plain'}"
    records = episodes(3, seed=13 + len(encoding))
    document = otlp_json(encode_spans(run_spans(records, run_id=name)))
    body = json.dumps(document).encode()
    headers = {}
    if encoding == "gzip":
        body, headers = gzip.compress(body), {"content-encoding": "gzip"}
    elif encoding == "deflate":
        body, headers = zlib.compress(body), {"content-encoding": "deflate"}
    elif encoding == "raw-deflate":
        squeeze = zlib.compressobj(wbits=-zlib.MAX_WBITS)
        body = squeeze.compress(body) + squeeze.flush()
        headers = {"content-encoding": "deflate"}

    answer = post(serve.traces_url, body, JSON, **headers)

    assert answer.status_code == 200, answer.text
    assert answer.headers["content-type"] == JSON
    assert answer.json() == {}
    run = closed_run(platform, name)
    assert_delivered_once(platform, run, records)


def test_a_retried_request_is_stored_once(shared: tuple[ServeProcess, FakePlatform]) -> None:
    serve, platform = shared
    records = episodes(5, seed=21)
    body = protobuf_body(run_spans(records, run_id="retried"))

    assert [post(serve.traces_url, body).status_code for _ in range(3)] == [200, 200, 200]

    run = closed_run(platform, "retried")
    assert_delivered_once(platform, run, records)


def test_replay_over_otlp_sends_the_run_to_serve(
    shared: tuple[ServeProcess, FakePlatform], tmp_path: Path
) -> None:
    serve, platform = shared
    records = episodes(15, seed=31)
    folder = tmp_path / "replayed-over-otlp"
    folder.mkdir()
    (folder / "traces.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))

    code = replay_over_otlp(folder, serve.url, environments=[ENVIRONMENT], timeout=30)

    assert code == 0
    run = closed_run(platform, "replayed-over-otlp")
    assert run.status == "COMPLETED"
    assert_delivered_once(platform, run, records)


# -- bad input ----------------------------------------------------------------------------


def status_of(answer: httpx.Response) -> Any:
    if answer.headers["content-type"] == PROTOBUF:
        return status_pb2.Status.FromString(answer.content)
    return json_format.Parse(answer.content, status_pb2.Status())


@pytest.mark.parametrize(
    ("body", "content_type", "headers", "status", "says"),
    [
        (b"\xff\xfe not protobuf", PROTOBUF, {}, 400, "not a valid OTLP protobuf"),
        (b"{not json", JSON, {}, 400, "not valid JSON"),
        (b"[1, 2]", JSON, {}, 400, "JSON object"),
        (b'{"resourceSpans": "x"}', JSON, {}, 400, "not a valid OTLP/JSON"),
        (b"{}", "text/plain", {}, 415, "application/x-protobuf or application/json"),
        (b"\x1f\x8b garbage", PROTOBUF, {"content-encoding": "gzip"}, 400, "decompressed"),
        (b"x", PROTOBUF, {"content-encoding": "br"}, 415, "gzip, deflate"),
    ],
)
def test_malformed_requests_get_a_clear_4xx(
    shared: tuple[ServeProcess, FakePlatform],
    body: bytes,
    content_type: str,
    headers: dict[str, str],
    status: int,
    says: str,
) -> None:
    serve, _ = shared
    answer = post(serve.traces_url, body, content_type, **headers)
    assert answer.status_code == status
    assert says in status_of(answer).message


def test_wrong_path_and_method(shared: tuple[ServeProcess, FakePlatform]) -> None:
    serve, _ = shared
    assert post(f"{serve.url}/v1/metrics", b"").status_code == 404
    answer = httpx.get(serve.traces_url)
    assert answer.status_code == 405
    assert answer.headers["allow"] == "POST"


def test_episodes_without_a_run_id_are_refused_with_a_4xx(
    shared: tuple[ServeProcess, FakePlatform],
) -> None:
    serve, _ = shared
    orphan = run_spans(episodes(2, seed=41), run_id="x", resource=Resource({"service.name": "a"}))
    answer = post(serve.traces_url, protobuf_body(orphan))
    assert answer.status_code == 400
    assert "prime.run.id" in status_of(answer).message


def test_bad_spans_are_rejected_and_the_rest_of_the_request_is_kept(
    shared: tuple[ServeProcess, FakePlatform],
) -> None:
    serve, platform = shared
    good = episodes(4, seed=51)
    spans = run_spans(good, run_id="mixed")
    orphans = run_spans(
        episodes(2, seed=52), run_id="-", start=False, end=False, resource=Resource({"a": "b"})
    )
    damaged = run_spans(episodes(1, seed=53), run_id="mixed", start=False, end=False)
    request = encode_spans(damaged)
    for attribute in request.resource_spans[0].scope_spans[0].spans[-1].attributes:
        if attribute.key == "prime.episode.record.sha256":
            attribute.value.string_value = "0" * 64
    request.MergeFrom(encode_spans(orphans + spans))

    answer = post(serve.traces_url, request.SerializeToString())

    assert answer.status_code == 200
    partial = ExportTraceServiceResponse.FromString(answer.content).partial_success
    assert partial.rejected_spans == 3
    assert "without prime.run.id" in partial.error_message
    assert "damaged" in partial.error_message
    run = closed_run(platform, "mixed")
    assert_delivered_once(platform, run, good)


def test_oversized_body_is_refused_with_413(
    start_serve: Callable[..., ServeProcess], tmp_path: Path
) -> None:
    serve = start_serve(serve_env(tmp_path, None), "--max-body-mib", "0.5")
    big = run_spans([next(synthetic_episodes(1, seed=61, target_bytes=700_000))], run_id="big")
    body = protobuf_body(big)
    assert len(body) > 512 * 1024

    answer = post(serve.traces_url, body)
    assert answer.status_code == 413
    assert "--max-body-mib" in status_of(answer).message
    # A small gzip body that would inflate past the limit is refused too.
    answer = post(serve.traces_url, gzip.compress(body + body), **{"content-encoding": "gzip"})
    assert answer.status_code == 413
    # The server is still fine afterwards.
    small = protobuf_body(run_spans(episodes(1, seed=62), run_id="small"))
    assert post(serve.traces_url, small).status_code == 200


def test_grpc_rejects_malformed_requests_with_invalid_argument(
    shared: tuple[ServeProcess, FakePlatform],
) -> None:
    serve, _ = shared
    with grpc.insecure_channel(f"127.0.0.1:{serve.grpc_port}") as channel:
        export = channel.unary_unary("/opentelemetry.proto.collector.trace.v1.TraceService/Export")
        with pytest.raises(grpc.RpcError) as failure:
            export(b"\xff\xfe not protobuf", timeout=10)
    assert failure.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert "not a valid OTLP protobuf" in failure.value.details()


# -- token, health --------------------------------------------------------------------------


def test_token_is_required_when_configured(
    start_serve: Callable[..., ServeProcess], tmp_path: Path
) -> None:
    serve = start_serve(serve_env(tmp_path, None, PRIME_RUNS_OTEL_SERVE_TOKEN="s3cret"))
    body = protobuf_body(run_spans(episodes(1, seed=71), run_id="tok"))

    missing = post(serve.traces_url, body)
    assert missing.status_code == 401
    assert missing.headers["www-authenticate"].startswith("Bearer")
    assert post(serve.traces_url, body, authorization="Bearer wrong").status_code == 401
    assert post(serve.traces_url, body, authorization="Bearer s3cret").status_code == 200
    # Probes need no token.
    assert httpx.get(f"{serve.url}/healthz").json()["status"] == "ok"

    spans = run_spans(episodes(1, seed=72), run_id="tok-grpc")
    refused = GrpcSpanExporter(endpoint=f"127.0.0.1:{serve.grpc_port}", insecure=True, timeout=5)
    assert refused.export(spans).name == "FAILURE"
    refused.shutdown()
    allowed = GrpcSpanExporter(
        endpoint=f"127.0.0.1:{serve.grpc_port}",
        insecure=True,
        headers={"authorization": "Bearer s3cret"},
    )
    export_with(allowed, spans)


def test_binding_beyond_loopback_without_a_token_is_refused(tmp_path: Path) -> None:
    finished = subprocess.run(
        [sys.executable, "-m", "prime_runs_otel.cli.serve", "--host", "0.0.0.0"],
        env=serve_env(tmp_path, None),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert finished.returncode == 2
    assert "needs a bearer token" in finished.stderr
    assert "PRIME_RUNS_OTEL_SERVE_TOKEN" in finished.stderr


def test_health_and_readiness(shared: tuple[ServeProcess, FakePlatform]) -> None:
    serve, _ = shared
    assert httpx.get(f"{serve.url}/healthz").json() == {"status": "ok", "in_flight": 0}
    assert httpx.get(f"{serve.url}/readyz").json() == {"status": "ready"}


# -- lifecycle: idle timeout, full spool, shutdown -------------------------------------------


def test_a_silent_run_without_end_span_is_closed_as_crashed(
    start_serve: Callable[..., ServeProcess], tmp_path: Path, platform: FakePlatform
) -> None:
    serve = start_serve(serve_env(tmp_path, platform), "--idle-timeout", "1")
    records = episodes(3, seed=81)
    body = protobuf_body(run_spans(records, run_id="silent", end=False))
    assert post(serve.traces_url, body).status_code == 200

    run = closed_run(platform, "silent")
    assert run.status == "FAILED"
    assert "crashed" in (run.error_message or "")
    assert_delivered_once(platform, run, records)


def test_a_full_spool_answers_retry_later_and_commits_nothing(
    start_serve: Callable[..., ServeProcess], tmp_path: Path
) -> None:
    env = serve_env(tmp_path, None, PRIME_RUNS_OTEL_SPOOL_MAX_BYTES="1")
    serve = start_serve(env)
    spans = run_spans(episodes(2, seed=91), run_id="full")

    answer = post(serve.traces_url, protobuf_body(spans))
    assert answer.status_code == 503
    assert int(answer.headers["retry-after"]) > 0
    assert "cap" in status_of(answer).message
    ready = httpx.get(f"{serve.url}/readyz")
    assert ready.status_code == 503
    assert "cap" in ready.json()["reason"]

    with grpc.insecure_channel(f"127.0.0.1:{serve.grpc_port}") as channel:
        export = channel.unary_unary("/opentelemetry.proto.collector.trace.v1.TraceService/Export")
        with pytest.raises(grpc.RpcError) as failure:
            export(protobuf_body(spans), timeout=10)
    assert failure.value.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
    details = dict(failure.value.trailing_metadata())["grpc-status-details-bin"]
    hint = error_details_pb2.RetryInfo()
    assert status_pb2.Status.FromString(details).details[0].Unpack(hint)
    assert hint.retry_delay.seconds > 0

    serve.stop()
    # Refused before the commit: the run is not even in the spool, so nothing
    # is counted lost while the collector retries.
    spool = Spool(tmp_path / "serve-spool" / "spool.sqlite3", max_bytes=1)
    assert spool.reading.run("full") is None


def test_sigterm_finishes_the_request_in_flight(
    start_serve: Callable[..., ServeProcess], tmp_path: Path, platform: FakePlatform
) -> None:
    serve = start_serve(serve_env(tmp_path, platform))
    records = episodes(6, seed=101)
    body = protobuf_body(run_spans(records, run_id="in-flight"))
    half = len(body) // 2
    stopping = threading.Event()

    def slow_body() -> Iterator[bytes]:
        yield body[:half]
        stopping.wait(30)
        yield body[half:]

    def listening() -> bool:
        with socket.socket() as probe:
            return probe.connect_ex(("127.0.0.1", serve.http_port)) == 0

    answers: list[httpx.Response] = []
    client = threading.Thread(
        target=lambda: answers.append(
            httpx.post(
                serve.traces_url,
                content=slow_body(),
                headers={"content-type": PROTOBUF, "content-length": str(len(body))},
                timeout=60,
            )
        )
    )
    client.start()
    wait_for(
        lambda: httpx.get(f"{serve.url}/healthz").json()["in_flight"] == 1,
        what="the request to be in flight",
    )
    assert serve.process is not None
    serve.process.send_signal(signal.SIGTERM)
    wait_for(lambda: not listening(), what="serve to stop listening")
    stopping.set()
    client.join(60)

    assert answers and answers[0].status_code == 200
    assert serve.stop() == 0
    # Its spool holds the committed run; a new serve delivers it.
    start_serve(serve_env(tmp_path, platform))
    run = closed_run(platform, "in-flight")
    assert_delivered_once(platform, run, records)
