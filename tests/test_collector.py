"""The collector path end to end through a real collector: producer → OTLP/gRPC
→ rotel (configured from collector-config/rotel.env) → OTLP/HTTP → ``serve``
→ the fake platform. A 20 MiB episode, ``serve`` killed and restarted while
rotel retries (nothing lost, nothing twice), and two producers feeding one
run."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
import rotel
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from test_receiver import (
    ServeProcess,
    assert_delivered_once,
    closed_run,
    free_port,
    serve_env,
    wait_for,
)

from prime_runs_otel import emit_run_end, emit_run_start, record_episode, run_resource
from prime_runs_otel.produce.synthetic import synthetic_episode, synthetic_episodes
from prime_runs_otel.testing import FakePlatform

RECIPE = Path(__file__).resolve().parent.parent / "collector-config" / "rotel.env"
ROTEL_AGENT = Path(rotel.__file__).parent / "rotel-agent"
MiB = 1024 * 1024


def recipe() -> dict[str, str]:
    settings: dict[str, str] = {}
    for line in RECIPE.read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            name, _, value = line.partition("=")
            settings[name.strip()] = value.strip()
    return settings


class Rotel:
    """rotel-agent in the foreground, set up by the shipped recipe with only
    the addresses (and, for the test's pace, the backoff) changed."""

    def __init__(self, root: Path, serve_url: str) -> None:
        self.grpc_port = free_port()
        #: In the foreground rotel logs to stdout, which lands here.
        self.log_path = root / "rotel.out"
        env = {k: v for k, v in os.environ.items() if not k.startswith(("ROTEL_", "OTEL_"))}
        env.update(recipe())
        env.update(
            ROTEL_OTLP_GRPC_ENDPOINT=f"127.0.0.1:{self.grpc_port}",
            ROTEL_OTLP_HTTP_ENDPOINT=f"127.0.0.1:{free_port()}",
            ROTEL_OTLP_EXPORTER_ENDPOINT=serve_url,
            ROTEL_OTLP_EXPORTER_RETRY_INITIAL_BACKOFF="100ms",
            ROTEL_OTLP_EXPORTER_RETRY_MAX_BACKOFF="500ms",
            ROTEL_PID_FILE=str(root / "rotel.pid"),
            ROTEL_LOG_FILE=str(root / "rotel.log"),
        )
        with self.log_path.open("ab") as out:
            self.process = subprocess.Popen(
                [str(ROTEL_AGENT), "start"], env=env, stdout=out, stderr=out
            )
        wait_for(self._listening, 30, "rotel to listen")

    def _listening(self) -> bool:
        assert self.process.poll() is None, "rotel exited"
        with socket.socket() as probe:
            return probe.connect_ex(("127.0.0.1", self.grpc_port)) == 0

    @property
    def endpoint(self) -> str:
        return f"127.0.0.1:{self.grpc_port}"

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=15)


class Producer:
    """One producer process's view of a run: its own TracerProvider whose
    Resource names the run, exporting OTLP/gRPC to the collector."""

    def __init__(self, endpoint: str, resource: Resource) -> None:
        self.provider = TracerProvider(resource=resource)
        exporter = OTLPSpanExporter(endpoint=endpoint, insecure=True, timeout=60)
        self.provider.add_span_processor(BatchSpanProcessor(exporter, max_export_batch_size=64))
        self.tracer = self.provider.get_tracer("producer")

    def episodes(self, records: Sequence[dict[str, Any]]) -> None:
        for record in records:
            record_episode(self.tracer, record)
        assert self.provider.force_flush(60_000)

    def close(self) -> None:
        self.provider.shutdown()


@pytest.fixture
def chain(
    tmp_path: Path, platform: FakePlatform
) -> Iterator[tuple[ServeProcess, Rotel, FakePlatform]]:
    serve = ServeProcess(tmp_path, serve_env(tmp_path, platform)).start()
    collector = Rotel(tmp_path, serve.url)
    try:
        yield serve, collector, platform
    finally:
        collector.stop()
        if serve.process is not None:
            serve.stop(signal.SIGKILL)


def resource(run_id: str, instance: str = "a") -> Resource:
    return run_resource(
        run_id=run_id,
        name=run_id,
        environments=["gsm8k-demo"],
        extra={"service.instance.id": instance, "host.name": f"machine-{instance}"},
    )


def test_a_20_mib_episode_passes_through_the_collector(
    chain: tuple[ServeProcess, Rotel, FakePlatform],
) -> None:
    _, collector, platform = chain
    records = [synthetic_episode(1, target_bytes=20 * MiB), *synthetic_episodes(3, seed=2)]
    producer = Producer(collector.endpoint, resource("big-episode"))
    emit_run_start(producer.tracer, {"size": "20MiB"})
    producer.episodes(records)
    emit_run_end(producer.tracer, "completed", episodes_recorded=len(records))
    producer.close()

    run = closed_run(platform, "big-episode", timeout=120)
    assert run.status == "COMPLETED"
    assert_delivered_once(platform, run, records)
    (big,) = [e for e in platform.episodes(run.id) if e["id"] == records[0]["id"]]
    assert big == {**records[0], "run": big["run"], "traces": big["traces"]}
    assert [t["nodes"] for t in big["traces"]] == [t["nodes"] for t in records[0]["traces"]]


def test_serve_killed_and_restarted_while_rotel_retries_loses_nothing_and_doubles_nothing(
    chain: tuple[ServeProcess, Rotel, FakePlatform],
) -> None:
    serve, collector, platform = chain
    records = list(synthetic_episodes(60, seed=7))
    producer = Producer(collector.endpoint, resource("restarted"))
    emit_run_start(producer.tracer, {})
    producer.episodes(records[:30])
    wait_for(lambda: platform.runs(), 60, "the run to be created")

    serve.stop(signal.SIGKILL)
    producer.episodes(records[30:])
    emit_run_end(producer.tracer, "completed", episodes_recorded=len(records))
    producer.close()
    # rotel now holds the second half and keeps retrying a closed port.
    wait_for(lambda: "Err(Connect)" in collector.log_path.read_text(), 60, "rotel to retry")

    serve.start()
    run = closed_run(platform, "restarted", timeout=120)
    assert run.status == "COMPLETED"
    assert len(platform.runs()) == 1
    assert_delivered_once(platform, run, records)


def test_two_producers_on_two_machines_feed_one_run(
    chain: tuple[ServeProcess, Rotel, FakePlatform],
) -> None:
    _, collector, platform = chain
    records = list(synthetic_episodes(40, seed=9))
    first = Producer(collector.endpoint, resource("shared-run", "a"))
    second = Producer(collector.endpoint, resource("shared-run", "b"))
    emit_run_start(first.tracer, {"workers": 2})
    first.episodes(records[0::2])
    second.episodes(records[1::2])
    second.close()  # the second worker exits without ending the run
    emit_run_end(first.tracer, "completed", episodes_recorded=len(records))
    first.close()

    run = closed_run(platform, "shared-run", timeout=120)
    assert run.status == "COMPLETED"
    assert len(platform.runs()) == 1
    assert run.metadata["workers"] == 2
    assert_delivered_once(platform, run, records)
