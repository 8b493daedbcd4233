"""OTLP requests → ``<prefix>.episodes``: the ingest side of a Kafka fleet.

A member checks a request as it would commit it (the fronts decoded it and
held it to their limits already), splits it by run key (``prime.run.id`` on
each Resource) and produces one record per run, keyed by the run key, so
every span of a run lands in one partition whichever member received it. The
request is answered only once the brokers acknowledged every record of it
(idempotent producer, ``acks=all``); a broker that is down or slow is
overload, answered with the same retryable status as a full spool, so the
client sends the request again: never a loss, at worst a duplicate, which the
owner's spool takes once (episodes are keyed on run and episode id).

Episode spans without a run key belong to no run and are refused as they
are without a fleet; the episodes are read (and a damaged one refused) by
the member that owns the run, which logs it.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import defaultdict
from typing import Any

from confluent_kafka import KafkaError, KafkaException, Producer
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.resource.v1.resource_pb2 import Resource
from opentelemetry.proto.trace.v1.trace_pb2 import ResourceSpans

from .. import semconv
from ..deliver.kafka.settings import MAX_RECORD_BYTES, KafkaSettings
from .intake import Verdict, episode_spans
from .kafka_stages import STATS_INTERVAL_MS, Stages

logger = logging.getLogger(__name__)

#: How long a request waits for the brokers' acknowledgement before it is
#: answered as overload (the client retries it).
ACK_TIMEOUT = 10.0
#: Retry hint when the brokers did not acknowledge in time.
KAFKA_RETRY_AFTER = 2
#: A run's spans of one request are cut into records of about this size.
RECORD_TARGET_BYTES = 4 * 1024 * 1024
#: Header naming what a record holds.
KIND_HEADER = "prime-runs-otel"
TRACES, LOGS = b"traces", b"logs"


class KafkaIngest:
    """The producer of one member, shared by its request threads.

    The GIL's switch interval stays Python's (5 ms). A shorter one was meant
    to let request threads take the GIL from the delivery work sooner, but
    interleaved with the default (two runs of four rounds each, either
    member first, 1,000 episodes/s paced for 10 s, load average 1.1-7.4 on
    two cores) 1 ms had the higher sender p99 in 7 of 8 pairs (median 319
    against 264 ms), no shorter ``wake`` (p99 median 40 against 38 ms) and
    no less CPU per episode: the tail is not the request threads waiting a
    switch interval, it is the cores (see :mod:`.kafka_stages`)."""

    def __init__(self, settings: KafkaSettings) -> None:
        self._settings = settings
        self.stages = Stages()
        self._producer = Producer(
            {
                # The brokers' part of an acknowledgement, as librdkafka saw it
                # (a statistics interval of the user's own is kept).
                "statistics.interval.ms": STATS_INTERVAL_MS,
                "stats_cb": self.stages.librdkafka_statistics,
                **settings.ingest_producer(),
            }
        )
        self._stopping = threading.Event()
        self._poller = threading.Thread(target=self._poll, name="kafka-ingest", daemon=True)
        self._poller.start()

    def _poll(self) -> None:
        """Serve the delivery reports (the acknowledgements) as they come."""
        while not self._stopping.is_set():
            self._producer.poll(0.05)

    def close(self, timeout: float = 10.0) -> None:
        self._producer.flush(timeout)
        self._stopping.set()
        self._poller.join(timeout)

    # -- requests -----------------------------------------------------------------------

    def hand_off(self, request: ExportTraceServiceRequest, wire: bytes | None = None) -> Verdict:
        """``request`` into its runs' records, answered once they are all
        acknowledged. ``wire``: the request's own protobuf encoding, when it
        came as one; a request of one run's spans only (as an SDK or a
        collector batching one run sends) is produced as those bytes,
        without encoding it again (a copy and an encoding of ~125 KB held
        the interpreter lock for ~3 ms on a request thread)."""
        began = time.monotonic()
        by_run: dict[str, list[ResourceSpans]] = defaultdict(list)
        unattributed = 0
        for resource_spans in request.resource_spans:
            key = _run_key(resource_spans.resource)
            if key is None:
                unattributed += episode_spans(resource_spans)
                continue
            by_run[key].append(resource_spans)
        if unattributed and not by_run:
            return Verdict(
                "invalid",
                f"{unattributed} episode span(s) carry no {semconv.RUN_ID} on their Resource, "
                f"so they belong to no run; set it with run_resource(...) or "
                f"OTEL_RESOURCE_ATTRIBUTES={semconv.RUN_ID}=<run key>",
            )
        records: list[tuple[str, bytes]] = []
        oversized = 0
        for key, parts in by_run.items():
            whole = wire if len(parts) == len(request.resource_spans) else None
            values, dropped = _records_of(parts, whole)
            oversized += dropped
            records += [(key, value) for value in values]
        verdict, stamps = self._produce(records, TRACES, began)
        if verdict is not None:
            return verdict
        rejected = unattributed + oversized
        message = []
        if unattributed:
            message.append(f"{unattributed} episode span(s) without {semconv.RUN_ID}")
        if oversized:
            message.append(f"{oversized} span(s) larger than a Kafka record may be")
        return Verdict("accepted", "; ".join(message), rejected=rejected, stamps=stamps)

    def hand_off_logs(
        self, request: ExportLogsServiceRequest, wire: bytes | None = None
    ) -> Verdict:
        """Span events sent as log records go to their run's partition too
        (keyed by the Resource's run key), so they meet their spans there;
        a request of one Resource's is produced as its own bytes (``wire``)."""
        began = time.monotonic()
        records: list[tuple[str, bytes]] = []
        for resource_logs in request.resource_logs:
            key = _run_key(resource_logs.resource) or ""
            if wire is not None and len(request.resource_logs) == 1:
                records.append((key, wire))
                continue
            single = ExportLogsServiceRequest(resource_logs=[resource_logs])
            records.append((key, single.SerializeToString()))
        verdict, stamps = self._produce(records, LOGS, began)
        return verdict or Verdict("accepted", stamps=stamps)

    def _produce(
        self, records: list[tuple[str, bytes]], kind: bytes, began: float
    ) -> tuple[Verdict | None, tuple[float, ...]]:
        """``None`` once every record is acknowledged, else the overload
        verdict; and the times of the request's stages in the producer."""
        if not records:
            return None, ()
        waiting = _Acks(len(records))
        try:
            for key, value in records:
                self._producer.produce(
                    self._settings.episodes_topic,
                    value=value,
                    key=key.encode(),
                    headers=[(KIND_HEADER, kind)],
                    on_delivery=waiting.report,
                )
        except (BufferError, KafkaException) as exc:
            waiting.fail(f"the producer refused a record: {exc}")
        produced = time.monotonic()
        if not waiting.done.wait(ACK_TIMEOUT):
            waiting.fail(f"the Kafka brokers did not acknowledge within {ACK_TIMEOUT:g}s")
        if waiting.error is None:
            return None, (began, produced, waiting.acked_at, time.monotonic())
        logger.warning("Answered an OTLP request as overload: %s", waiting.error)
        return Verdict(
            "unavailable",
            f"{waiting.error}; retry later",
            retry_after=KAFKA_RETRY_AFTER,
        ), ()


class _Acks:
    """The acknowledgements one request waits for."""

    def __init__(self, count: int) -> None:
        self._left = count
        self._lock = threading.Lock()
        self.error: str | None = None
        self.done = threading.Event()
        #: When the last acknowledgement was served (``time.monotonic()``).
        self.acked_at = 0.0

    def report(self, error: KafkaError | None, _message: Any) -> None:
        with self._lock:
            if error is not None and self.error is None:
                self.error = f"Kafka did not take a record: {error.str()}"
            self._left -= 1
            if self._left <= 0 or self.error is not None:
                self.acked_at = time.monotonic()
                self.done.set()

    def fail(self, reason: str) -> None:
        with self._lock:
            if self.error is None:
                self.error = reason
            self.done.set()


def _run_key(resource: Resource) -> str | None:
    for pair in resource.attributes:
        if pair.key == semconv.RUN_ID:
            value = pair.value.string_value
            return value or None
    return None


def _records_of(parts: list[ResourceSpans], whole: bytes | None = None) -> tuple[list[bytes], int]:
    """One run's spans of a request as record values of about
    :data:`RECORD_TARGET_BYTES`; and how many spans were too large alone.
    ``whole``: those spans' request encoded already (the request's own bytes)."""
    if whole is None:
        whole = ExportTraceServiceRequest(resource_spans=parts).SerializeToString()
    if len(whole) <= RECORD_TARGET_BYTES:
        return [whole], 0
    values: list[bytes] = []
    oversized = 0
    for resource_spans in parts:
        for scope_spans in resource_spans.scope_spans:
            chunk: list[Any] = []
            size = 0
            for span in scope_spans.spans:
                span_size = span.ByteSize()
                if span_size > MAX_RECORD_BYTES - 65536:
                    oversized += 1
                    continue
                if chunk and size + span_size > RECORD_TARGET_BYTES:
                    values.append(_one(resource_spans, scope_spans, chunk))
                    chunk, size = [], 0
                chunk.append(span)
                size += span_size
            if chunk:
                values.append(_one(resource_spans, scope_spans, chunk))
    return values, oversized


def _one(resource_spans: ResourceSpans, scope_spans: Any, spans: list[Any]) -> bytes:
    piece = ResourceSpans(resource=resource_spans.resource, schema_url=resource_spans.schema_url)
    scope = piece.scope_spans.add()
    scope.scope.CopyFrom(scope_spans.scope)
    scope.schema_url = scope_spans.schema_url
    scope.spans.extend(spans)
    return ExportTraceServiceRequest(resource_spans=[piece]).SerializeToString()
