"""What a fleet member consumed → its spool and its runs' books, in passes.

One pass into the spool costs a few milliseconds of the member's CPU however
few episodes it holds (the checks of the spool's room, the run rows, a
handful of statements per run), and the member shares its cores with the
brokers and the senders' acknowledgements. So the records that one
``consume()`` returned for a partition go into the spool together, in
:func:`passes` of at most :data:`MAX_PASS_BYTES`, not one pass per record.

A record of span events (OTLP logs) ends a pass: its events join spans in
the span buffer, and the spans before it must be there first, as they were
when the records were produced.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from .._text import shown
from ..deliver.kafka.state import RunState
from ..read.otlp import span_views
from ..read.spans import SpanView
from .intake import SpanIntake
from .kafka_books import Record, RunBooks, episode_ids_of
from .kafka_ingest import KIND_HEADER, LOGS
from .logs_intake import LogIntake

logger = logging.getLogger(__name__)

#: The most record bytes one pass into the spool takes. A pass reads its
#: spans in pure Python, holding the GIL while the threads that answer
#: requests wait for it: at 2 MiB (some fifteen records of ten episodes,
#: ~125 KB each) the acknowledgements at 1,000 episodes/s were slower than
#: at 512 KiB (about four), which keeps most of the saving (docs/scaling.md).
MAX_PASS_BYTES = 512 * 1024


@dataclass(frozen=True)
class Consumed:
    """One record of an owned partition, decoded: one run's spans, read
    once (their views go into the spool, and their episode ids into the
    run's book), or span events."""

    offset: int
    #: The run the record belongs to (its Kafka key; ``""``: none).
    key: str
    spans: list[SpanView] | None = None
    events: ExportLogsServiceRequest | None = None


def is_events(message: Any) -> bool:
    """The record carries span events (OTLP logs), not spans."""
    return dict(message.headers() or ()).get(KIND_HEADER) == LOGS


def record_key(message: Any) -> str:
    """The run key a record is keyed by (``""``: none)."""
    return (message.key() or b"").decode("utf-8", "replace")


def decode(message: Any, key: str) -> Consumed:
    """``message`` (keyed by ``key``) decoded; raises when its value is not
    a request (a damaged record, or one another producer wrote to the topic)."""
    value = message.value() or b""
    if is_events(message):
        return Consumed(message.offset(), key, events=ExportLogsServiceRequest.FromString(value))
    request = ExportTraceServiceRequest.FromString(value)
    return Consumed(message.offset(), key, spans=list(span_views(request)))


def passes(messages: Sequence[Any], max_bytes: int = MAX_PASS_BYTES) -> Iterator[list[Any]]:
    """``messages`` of one partition, in order, cut into intake passes: at
    most ``max_bytes`` of values each (a larger record goes alone), and a
    record of span events alone."""
    current: list[Any] = []
    size = 0
    for message in messages:
        length = len(message.value() or b"")
        if current and (is_events(message) or size + length > max_bytes):
            yield current
            current, size = [], 0
        current.append(message)
        size += length
        if is_events(message):
            yield current
            current, size = [], 0
    if current:
        yield current


class RecordIntake:
    """One pass of a partition's records → the spool, then the runs' books.

    The books learn of a record only once its pass is committed: the run
    states and offsets a transaction commits describe exactly what the spool
    took. A record an earlier owner did is skipped; a damaged one is counted
    and let go; the rest go in together (:meth:`.intake.SpanIntake.accept_consumed`).
    """

    def __init__(self, intake: SpanIntake, logs: LogIntake, books: RunBooks) -> None:
        self._intake = intake
        self._logs = logs
        self._books = books

    def take(self, partition: int, messages: list[Any], states: dict[str, RunState]) -> bool:
        """``messages`` (one of :func:`passes`) into the spool. ``False``:
        none was taken (the spool is full or failing), all are read again."""
        records = [
            record
            for message in messages
            if (record := self._unread(message, partition, states)) is not None
        ]
        spans = [record for record in records if record.spans is not None]
        stored = self._store(partition, spans) if spans else []
        if stored is None:
            return False
        for record in records:
            if record.events is not None:
                self._logs.accept(record.events, owned=True)
        self._note_in_books(stored)
        return True

    def _unread(self, message: Any, partition: int, states: dict[str, RunState]) -> Consumed | None:
        """``message`` decoded, or ``None``: done by an earlier owner, or
        damaged (it costs itself only: counted, and let go)."""
        key = record_key(message)
        if self._books.book(key, partition, states).skips(message.offset()):
            self._intake.counters.add("kafka_records_total", outcome="skipped")
            return None
        try:
            return decode(message, key)
        except Exception as exc:
            self._let_go(partition, message.offset(), exc)
            return None

    def _store(self, partition: int, records: list[Consumed]) -> list[Consumed] | None:
        """``records`` into the spool in one pass; the records taken, or
        ``None`` when none was (the spool is full or failing: read again).

        Spans that cannot be read or stored are refused alone inside the
        pass; a pass that breaks all the same (something in a request no
        check foresaw) is made again one record at a time, so that the
        record that breaks it costs itself only."""
        try:
            verdict = self._intake.accept_consumed(
                [record.spans for record in records if record.spans is not None]
            )
        except Exception as exc:
            if len(records) > 1:
                return self._store_each(partition, records)
            self._let_go(partition, records[0].offset, exc)
            return []
        if verdict.outcome in ("full", "unavailable"):
            return None
        self._intake.counters.add("kafka_intakes_total")
        self._intake.counters.add("kafka_records_total", len(records), outcome="taken")
        return records

    def _store_each(self, partition: int, records: list[Consumed]) -> list[Consumed] | None:
        stored: list[Consumed] = []
        for record in records:
            alone = self._store(partition, [record])
            if alone is None:
                return None  # read again: what went in already is stored once
            stored += alone
        return stored

    def _let_go(self, partition: int, offset: int, exc: BaseException) -> None:
        self._intake.counters.add("kafka_records_total", outcome="damaged")
        logger.warning(
            "Kafka: record %d of partition %d cannot be read and is let go: %s: %s",
            offset,
            partition,
            type(exc).__name__,
            shown(exc),
        )

    def _note_in_books(self, stored: list[Consumed]) -> None:
        """Each stored record into its run's book, which now waits for its
        episodes; then what a previous owner did with those runs is applied."""
        keys: list[str] = []
        for record in stored:
            if not record.key or record.spans is None:
                continue
            ids, control = episode_ids_of(record.spans)
            self._books.books[record.key].records.append(Record(record.offset, ids, control))
            if record.key not in keys:
                keys.append(record.key)
        for key in keys:
            self._books.adopt(key, self._books.books[key])
