"""A real Apache Kafka broker and ``serve --kafka`` members on loopback, for
the Kafka fleet's tests, its soak and its bench.

The broker is started as ``make kafka`` starts it
(:mod:`prime_runs_otel.testing.kafka_broker`): once per test worker, and a
test that needs it fails (never skips) where Java or the broker's jars are
missing, with the error saying what to install.
"""

from __future__ import annotations

import random
import threading
import uuid
from collections.abc import Iterator, Sequence
from concurrent import futures
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from test_receiver import (
    ENVIRONMENT,
    ServeProcess,
    post,
    protobuf_body,
    serve_env,
    wait_for,
)

from prime_runs_otel import emit_run_end, emit_run_start, record_episode, run_resource
from prime_runs_otel.testing import FakePlatform
from prime_runs_otel.testing.kafka_broker import Cluster, start


@pytest.fixture(scope="session")
def kafka(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """One single-node KRaft broker for the worker's tests (each test uses a
    topic prefix of its own)."""
    cluster = start(tmp_path_factory.mktemp("kafka"))
    try:
        yield cluster
    finally:
        cluster.stop()


def member_env(root: Path, platform: FakePlatform) -> dict[str, str]:
    (root / "home").mkdir(parents=True, exist_ok=True)
    return serve_env(root, platform, PRIME_RUNS_OTEL_RETRY_MAX_DELAY="0.5")


class Fleet:
    """Members of one fleet (one topic prefix) on one broker."""

    def __init__(self, root: Path, cluster: Cluster, platform: FakePlatform, partitions: int = 6):
        self.root = root
        self.cluster = cluster
        self.platform = platform
        self.prefix = f"t{uuid.uuid4().hex[:10]}"
        self.partitions = partitions
        self.members: list[ServeProcess] = []
        self._count = 0
        self._lock = threading.Lock()

    def add_many(self, count: int) -> list[ServeProcess]:
        """``count`` members started at once (each start waits on Kafka, not on the CPU)."""
        with futures.ThreadPoolExecutor(count) as pool:
            return list(pool.map(lambda _: self.add(), range(count)))

    def add(
        self,
        *,
        name: str | None = None,
        root: Path | None = None,
        env: dict[str, str] | None = None,
    ) -> ServeProcess:
        with self._lock:
            self._count += 1
            number = self._count
        where = root or self.root / f"member-{number}"
        args = [
            "--kafka",
            self.cluster.bootstrap,
            "--kafka-topic-prefix",
            self.prefix,
            "--kafka-partitions",
            str(self.partitions),
            "--straggler-wait",
            "5",
            "--no-grpc",
        ]
        if name is not None:
            args += ["--kafka-member", name]
        member = ServeProcess(where, {**member_env(where, self.platform), **(env or {})}, *args)
        member.ready_timeout = 120.0  # joining the group on a loaded machine
        member.start()
        with self._lock:
            self.members.append(member)
        return member

    def alive(self) -> list[ServeProcess]:
        return [member for member in self.members if member.process is not None]

    def send(self, body: bytes, rng: random.Random) -> None:
        """To a random live member; an overload answer is retried (as a collector does)."""
        for _ in range(200):
            member = rng.choice(self.alive())
            try:
                answer = post(member.traces_url, body)
            except Exception:  # a member being killed: the collector retries elsewhere
                continue
            if answer.status_code == 200:
                return
        raise AssertionError("no member took the request")

    def stop_all(self) -> None:
        """Kill every member, and print the end of each one's log: pytest
        shows it only when the test failed, where it says what went wrong."""
        for member in self.alive():
            member.stop(9)
        for member in self.members:
            lines = member.log().splitlines()[-60:]
            print(f"--- {member.log_path.name} (last {len(lines)} lines)", *lines, sep="\n")


@pytest.fixture
def fleet(tmp_path: Path, kafka: Cluster) -> Iterator[Fleet]:
    with FakePlatform() as platform:
        members = Fleet(tmp_path, kafka, platform)
        try:
            yield members
        finally:
            members.stop_all()


def run_bodies(records: Sequence[dict[str, Any]], run_id: str, pieces: int) -> list[bytes]:
    """A run as ``pieces`` requests: the start with the first, the end (which
    counts every episode of the run) with the last."""
    size = max(1, -(-len(records) // pieces))
    chunks = [records[i : i + size] for i in range(0, len(records), size)]
    resource = run_resource(run_id=run_id, environments=[ENVIRONMENT], name=run_id)
    bodies = []
    for index, chunk in enumerate(chunks):
        memory = InMemorySpanExporter()
        provider = TracerProvider(resource=resource)
        provider.add_span_processor(SimpleSpanProcessor(memory))
        tracer = provider.get_tracer("kafka-fleet")
        if index == 0:
            emit_run_start(tracer, {"temperature": 0.5})
        for record in chunk:
            record_episode(tracer, record)
        if index == len(chunks) - 1:
            emit_run_end(tracer, "completed", episodes_recorded=len(records))
        provider.shutdown()
        bodies.append(protobuf_body(memory.get_finished_spans()))
    return bodies


def assert_books(platform: FakePlatform, runs: dict[str, Sequence[dict[str, Any]]]) -> None:
    """Every run created once and completed once, every episode stored exactly once."""
    on_platform = platform.runs()
    by_key: dict[str, list[Any]] = {}
    for run in on_platform:
        key = run.metadata.get("prime_runs_otel", {}).get("run_key") or run.create_payload.get(
            "metadata", {}
        ).get("prime_runs_otel", {}).get("run_key")
        by_key.setdefault(key, []).append(run)
    for key, records in runs.items():
        created = by_key.get(key, [])
        assert len(created) == 1, f"run {key} was created {len(created)} times"
        (run,) = created
        assert run.status == "COMPLETED", (key, run.status, run.error_message)
        assert run.finalize_calls == 1, (key, run.finalize_calls)
        written = run.metrics.get("prime_runs", {}).get("traces_episodes_written")
        assert written == len(records), (key, "episodes the close counted", written)
        stored = sorted(episode["id"] for episode in platform.episodes(run.id))
        assert stored == sorted(record["id"] for record in records), key
        deliveries = platform.episode_deliveries(run.id)
        twice = {episode: n for episode, n in deliveries.items() if n != 1}
        assert not twice, f"run {key}: episodes stored more than once: {twice}"


def all_closed(platform: FakePlatform, keys: Sequence[str]) -> bool:
    closed = {
        run.metadata.get("prime_runs_otel", {}).get("run_key")
        for run in platform.runs()
        if run.closed
    }
    return set(keys) <= closed


__all__ = ["Fleet", "all_closed", "assert_books", "kafka", "run_bodies", "wait_for"]
