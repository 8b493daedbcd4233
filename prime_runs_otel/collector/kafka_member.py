"""``<prefix>.episodes`` → this member's spool: the delivery side of a Kafka fleet.

Members form one consumer group (cooperative-sticky, static membership when
named); the member that owns a partition commits the records of its runs to
its spool through the same intake as a request (synthesis, checks, the
spool's idempotent ingest) and its uploader delivers them. The spool is only
the working store of the partitions owned now: it is emptied at start and a
run leaves it with its partition.

Offsets are committed in a Kafka transaction together with the state of the
partition's runs (:class:`~..deliver.kafka.state.RunState` in
``<prefix>.runs``), and only up to what the platform has confirmed: a record
counts as done once none of its episodes waits for delivery (and, for a run's
start, end or metrics, once the run is closed). The member that takes a
partition over (after a rebalance or a kill -9) reads the states, starts at
the committed offset, skips the records of a run up to its ``through``, marks
the episodes the previous owner delivered as delivered, sends again the
uploads it began with the same bytes (Prime Traces replays the receipt) and
adopts its platform run: no run created twice, no episode uploaded twice,
none skipped.

Platform calls never run on this thread: the uploader makes them, and it
asks :class:`~..deliver.kafka.owner.FleetOwnership` first. A revoked
partition's runs stop being delivered from their next step on, without
waiting for a request in flight: what such a request may store was recorded
before it went out, so the new owner sends the same upload again.
"""

from __future__ import annotations

import logging
import threading
import time
import zlib
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, KafkaException, Producer
from confluent_kafka import TopicPartition as Partition
from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from .. import semconv
from .._text import shown
from ..deliver.kafka.owner import FleetOwnership, Intent
from ..deliver.kafka.settings import MAX_RECORD_BYTES, KafkaSettings
from ..deliver.kafka.spool import FleetSpool
from ..deliver.kafka.state import RunState
from ..deliver.spool import RunRow
from ..errors import ConfigError
from .intake import SpanIntake
from .kafka_ingest import KIND_HEADER, LOGS
from .logs_intake import LogIntake

logger = logging.getLogger(__name__)

#: How often the offsets and run states are committed when nothing asks sooner.
COMMIT_INTERVAL = 0.5
#: How long one poll waits for records: an intent that arrives meanwhile
#: waits for its commit at most this long.
POLL_SECONDS = 0.01
#: Partitions of ``<prefix>.runs`` (compacted; one record per run).
RUNS_PARTITIONS = 6
#: How long taking a partition over may wait for the run states to be read.
TABLE_TIMEOUT = 30.0
#: Span names whose records are done only once their run is closed.
CONTROL_SPANS = frozenset({semconv.RUN_START_SPAN, semconv.RUN_END_SPAN, semconv.RUN_METRICS_SPAN})


@dataclass
class _Record:
    offset: int
    episode_ids: frozenset[str]
    #: Carries a run's start, end or metrics (or an episode without an id).
    control: bool


@dataclass
class _RunBook:
    """One run of an owned partition: its records not done yet."""

    partition: int
    through: int = -1
    records: deque[_Record] = field(default_factory=deque)
    #: Uploads recorded before they went out, not yet in the spool's books.
    intents: dict[str, list[str]] = field(default_factory=dict)
    creating_at: float | None = None
    finalizing: bool = False
    #: Delivered elsewhere and not yet marked so here.
    delivered_elsewhere: set[str] = field(default_factory=set)
    adopted: bool = False
    written: bytes = b""


@dataclass
class _Owned:
    """An assigned partition: how far it is read, and when it is caught up."""

    end_at_assignment: int
    position: int | None = None
    ready: bool = False
    blocked_until: float = 0.0


class KafkaMember:
    """The consumer loop of one member, on a thread of its own."""

    def __init__(
        self,
        settings: KafkaSettings,
        member: str,
        spool: FleetSpool,
        intake: SpanIntake,
        logs: LogIntake,
        ownership: FleetOwnership,
    ) -> None:
        self._settings = settings
        self._member = member
        self._spool = spool
        self._intake = intake
        self._logs = logs
        self._ownership = ownership
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self._owned: dict[int, _Owned] = {}
        self._books: dict[str, _RunBook] = {}
        #: Every run state of the fleet read from ``<prefix>.runs``.
        self._states: dict[str, RunState] = {}
        self._table_end: dict[int, int] = {}
        self._last_commit = 0.0
        self._consumer: Consumer | None = None
        self._producer: Producer | None = None
        self._table: Consumer | None = None
        #: What /metrics reports: records behind the end of owned partitions.
        self.lag = 0
        self.error: str | None = None

    # -- start and stop -----------------------------------------------------------------

    def start(self) -> None:
        """Create the topics if needed, join the group and start consuming."""
        ensure_topics(self._settings)
        self._purge_spool()
        try:
            self._state_producer()
        except KafkaException as exc:
            raise ConfigError(
                f"Kafka at {self._settings.bootstrap} refused this member's transactions "
                f"({exc}); check the cluster allows transactions (a single broker needs "
                "transaction.state.log.replication.factor=1)"
            ) from exc
        self._table = Consumer(self._settings.table_consumer() | {"enable.partition.eof": True})
        self._table.assign(
            [
                Partition(self._settings.runs_topic, p, OFFSET_BEGINNING)
                for p in range(RUNS_PARTITIONS)
            ]
        )
        self._consumer = Consumer(self._settings.group_consumer(self._settings.member))
        self._consumer.subscribe(
            [self._settings.episodes_topic],
            on_assign=self._on_assign,
            on_revoke=self._on_revoke,
            on_lost=self._on_lost,
        )
        self._thread = threading.Thread(target=self._loop, name="kafka-member", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 30.0) -> None:
        """Commit what is delivered, leave the group (its partitions go to
        the other members at once) and close the clients."""
        self._stopping.set()
        if self._thread is not None:
            self._thread.join(timeout)
        if self._consumer is not None:
            try:
                self._commit(force=True)
            except Exception as exc:
                logger.warning("The last commit before leaving failed: %s", shown(exc))
            self._consumer.close()
        if self._table is not None:
            self._table.close()
        if self._producer is not None:
            self._producer.flush(5)

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def _purge_spool(self) -> None:
        """The spool holds the partitions owned now only: what an earlier
        process left is in Kafka, and is read again with its partition."""
        for run in self._spool.reading.runs():
            self._spool.housekeeping.delete_run(run.local_id)

    # -- the loop -----------------------------------------------------------------------

    def _loop(self) -> None:
        assert self._consumer is not None
        while not self._stopping.is_set():
            try:
                if self._ownership.wanted.is_set():
                    self._commit_intents()  # an upload, create or finalize waits for it
                self._read_table(0)
                messages = self._consumer.consume(500, POLL_SECONDS)
                self._take(messages)
                self._check_ready()
                if time.monotonic() - self._last_commit >= COMMIT_INTERVAL:
                    self._commit()
                elif self._ownership.wanted.is_set():
                    self._commit_intents()
                self.error = None
            except Exception as exc:
                if self.error is None:
                    logger.exception("The Kafka consumer loop failed; going on")
                self.error = f"{type(exc).__name__}: {shown(exc)}"
                time.sleep(0.5)

    def _take(self, messages: Iterable[Any]) -> None:
        blocked: set[int] = set()
        for message in messages:
            error = message.error()
            if error is not None:
                if error.code() != KafkaError._PARTITION_EOF:
                    logger.warning("Kafka: %s", error.str())
                continue
            partition = message.partition()
            owned = self._owned.get(partition)
            if owned is None or partition in blocked:
                continue
            if not self._take_one(message, partition):
                # Not taken now (the spool is full or failing): read again later.
                assert self._consumer is not None
                self._consumer.seek(
                    Partition(self._settings.episodes_topic, partition, message.offset())
                )
                owned.blocked_until = time.monotonic() + 1.0
                blocked.add(partition)
                continue
            owned.position = message.offset() + 1
            if self._ownership.wanted.is_set():
                self._commit_between_records()

    def _commit_between_records(self) -> None:
        """An upload, create or finalize waits for a commit: it gets one
        now, not after the rest of a batch of up to 500 records is read into
        the spool (which took seconds while a backlog was read). A failure
        is the intents' (they are refused and tried again); the batch goes on."""
        try:
            self._commit_intents()
        except Exception as exc:
            logger.warning("Kafka: a commit between records failed (%s)", shown(exc))

    def _take_one(self, message: Any, partition: int) -> bool:
        key = (message.key() or b"").decode("utf-8", "replace")
        offset = message.offset()
        book = self._book(key, partition)
        if offset <= book.through:
            return True  # delivered by an earlier owner
        kind = dict(message.headers() or ()).get(KIND_HEADER)
        if kind == LOGS:
            self._logs.accept(ExportLogsServiceRequest.FromString(message.value()), owned=True)
            return True
        request = ExportTraceServiceRequest.FromString(message.value())
        verdict = self._intake.accept(request, owned=True)
        if verdict.outcome in ("full", "unavailable"):
            return False
        ids, control = _episode_ids(request)
        if key:
            book.records.append(_Record(offset, ids, control))
            self._adopt(key, book)
        return True

    def _book(self, key: str, partition: int) -> _RunBook:
        book = self._books.get(key)
        if book is None or book.partition != partition:
            book = _RunBook(partition)
            state = self._states.get(key)
            if state is not None and state.partition == partition:
                book.through = state.through
                book.delivered_elsewhere = set(state.delivered)
                book.creating_at = state.creating_at
                book.finalizing = state.finalizing
                self._ownership.inherit(state)
            self._books[key] = book
            self._ownership.bind(key, partition)
        return book

    def _adopt(self, key: str, book: _RunBook) -> None:
        """What the previous owner did with the run, applied to this spool."""
        state = self._ownership.inherited(key)
        if state is None:
            return
        run = self._spool.reading.run(key)
        if run is None:
            return
        if not book.adopted:
            book.adopted = True
            values: dict[str, Any] = {}
            if state.platform_id and not run.platform_id:
                values.update(
                    platform_id=state.platform_id,
                    url=state.url,
                    create_state="created",
                    traces_written=state.traces_written,
                )
            if state.closed and not run.closed:
                values.update(close_state="closed", closed_at=time.time())
            elif state.finalizing and not run.closed:
                values.update(close_state="finalizing")
            self._spool.adopt(key, **values)
            logger.info(
                "Run %s: taken over (platform run %s, %d episode(s) delivered before, %d "
                "upload(s) to send again)",
                shown(key),
                state.platform_id,
                len(state.delivered),
                len(state.sending),
            )
        if book.delivered_elsewhere:
            self._spool.handover.delivered_elsewhere(key, book.delivered_elsewhere)
            stored = self._spool.handover.stored_ids(key, book.delivered_elsewhere)
            book.delivered_elsewhere -= {i for i, s in stored.items() if s == "delivered"}

    # -- the run states -----------------------------------------------------------------

    def _read_table(self, timeout: float) -> None:
        assert self._table is not None
        for message in self._table.consume(1000, timeout):
            error = message.error()
            partition, offset, value = message.partition(), message.offset(), message.value()
            if partition is None or offset is None:
                continue
            if error is not None:
                if error.code() == KafkaError._PARTITION_EOF:
                    self._table_end[partition] = offset
                continue
            self._table_end[partition] = offset + 1
            key = (message.key() or b"").decode("utf-8", "replace")
            if value is None:
                self._states.pop(key, None)
                continue
            try:
                self._states[key] = RunState.decode(value)
            except (ValueError, TypeError) as exc:
                logger.warning("Run %s: its state in Kafka cannot be read: %s", shown(key), exc)

    def _read_table_to_end(self) -> None:
        """Every state committed so far (the previous owner's last included)."""
        assert self._table is not None
        ends = {}
        for partition in range(RUNS_PARTITIONS):
            _, high = self._table.get_watermark_offsets(
                Partition(self._settings.runs_topic, partition), timeout=10, cached=False
            )
            ends[partition] = high
        deadline = time.monotonic() + TABLE_TIMEOUT
        while time.monotonic() < deadline:
            if all(self._table_end.get(p, 0) >= end for p, end in ends.items() if end > 0):
                return
            self._read_table(0.1)
        logger.warning("Reading the run states took over %gs; going on", TABLE_TIMEOUT)

    # -- rebalancing --------------------------------------------------------------------

    def _on_assign(self, consumer: Consumer, partitions: list[Partition]) -> None:
        """Take partitions over; never half-way.

        The client has assigned them whatever this callback does: one that
        failed here (the brokers not answering within a call's timeout) left
        them unknown to this member, which then read their records and
        skipped every one for good. So the setup is tried until it is done
        (the group waits up to ``max.poll.interval.ms`` for it)."""
        if not partitions:
            return
        attempt = 0
        while True:
            try:
                self._take_over(consumer, partitions)
                return
            except KafkaException as exc:
                if self._stopping.is_set():
                    raise
                attempt += 1
                logger.warning(
                    "Kafka: taking partition(s) %s over failed (%s); trying again",
                    ", ".join(str(tp.partition) for tp in partitions),
                    shown(exc),
                )
                time.sleep(min(5.0, 0.5 * attempt))

    def _take_over(self, consumer: Consumer, partitions: list[Partition]) -> None:
        self._read_table_to_end()
        committed = consumer.committed(partitions, timeout=30)
        for tp, done in zip(partitions, committed, strict=True):
            _, high = consumer.get_watermark_offsets(tp, timeout=10, cached=False)
            start = done.offset if done.offset >= 0 else 0
            owned = _Owned(end_at_assignment=high)
            self._owned[tp.partition] = owned
            if start >= high:
                owned.ready = True
                self._ownership.ready(tp.partition)
        logger.info(
            "Kafka: this member now delivers partition(s) %s",
            ", ".join(str(tp.partition) for tp in partitions),
        )

    def _check_ready(self) -> None:
        now = time.monotonic()
        lag = 0
        for partition, owned in self._owned.items():
            if owned.blocked_until and owned.blocked_until <= now:
                owned.blocked_until = 0.0
            if owned.position is not None and self._consumer is not None:
                tp = Partition(self._settings.episodes_topic, partition)
                _, high = self._consumer.get_watermark_offsets(tp, cached=True)
                end = max(high, owned.end_at_assignment)
                lag += max(0, end - owned.position)
            if owned.ready:
                continue
            if owned.position is not None and owned.position >= owned.end_at_assignment:
                owned.ready = True
                self._ownership.ready(partition)
        self.lag = lag

    def _on_revoke(self, consumer: Consumer, partitions: list[Partition]) -> None:
        numbers = {tp.partition for tp in partitions}
        for partition in numbers:
            self._release(partition)
        try:
            self._commit(force=True, only=numbers)
        except Exception as exc:
            logger.warning("Committing revoked partitions failed (%s)", shown(exc))
        self._forget(numbers)

    def _on_lost(self, consumer: Consumer, partitions: list[Partition]) -> None:
        numbers = {tp.partition for tp in partitions}
        for partition in numbers:
            self._release(partition)
        self._forget(numbers)

    def _release(self, partition: int) -> None:
        owned = self._owned.get(partition)
        if owned is not None:
            owned.ready = False

    def _forget(self, partitions: set[int]) -> None:
        """The partitions went to another member: their runs leave this spool."""
        for partition in partitions:
            self._owned.pop(partition, None)
            for key in self._ownership.revoke(partition):
                self._books.pop(key, None)
                try:
                    self._spool.housekeeping.delete_run(key)
                except Exception as exc:
                    logger.warning("Run %s: could not leave the spool: %s", shown(key), exc)
        if partitions:
            logger.info(
                "Kafka: partition(s) %s went to another member",
                ", ".join(str(p) for p in sorted(partitions)),
            )

    # -- committing ---------------------------------------------------------------------

    def _commit_intents(self) -> None:
        """The waiting intents, and the states of their runs only, in one
        transaction; then their calls go ahead. Every intent that arrived
        while the previous transaction was in flight rides this one.

        The offsets are left to the periodic commit (:meth:`_commit`): sending
        them is the costlier half of a transaction here, and a state ahead of
        the committed offset is what a new owner expects anyway (it skips a
        run's records up to the state's ``through``)."""
        intents = self._ownership.take_intents()
        if not intents:
            return
        for intent in intents:
            self._note(intent)
        keys = {intent.run_key for intent in intents if intent.error is None}
        held = self._intake.held_episode_ids() if keys else {}
        states = []
        for key in keys:
            book = self._books[key]
            state = self._settle(key, book, held.get(key, set()))
            if state.encode() != book.written:
                states.append(state)
        self._finish(intents, states, [])

    def _commit(self, *, force: bool = False, only: set[int] | None = None) -> None:
        """One transaction: the changed run states and the offsets up to
        which everything is delivered; then the waiting intents go ahead."""
        assert self._consumer is not None
        self._last_commit = time.monotonic()
        # A commit of revoked partitions only must not let other runs' intents go.
        intents = self._ownership.take_intents() if only is None else []
        for intent in intents:
            self._note(intent)
        held = self._intake.held_episode_ids()
        states: list[RunState] = []
        offsets: list[Partition] = []
        for partition, owned in self._owned.items():
            if only is not None and partition not in only:
                continue
            if owned.position is None:
                continue
            runs = [(key, book) for key, book in self._books.items() if book.partition == partition]
            first = owned.position
            for key, book in runs:
                state = self._settle(key, book, held.get(key, set()))
                if book.records:
                    first = min(first, book.records[0].offset)
                value = state.encode()
                if value != book.written:
                    states.append(state)
            offsets.append(Partition(self._settings.episodes_topic, partition, first))
        if not states and not (offsets and (force or self._offsets_moved(offsets))):
            offsets = []
        self._finish(intents, states, offsets)

    def _finish(
        self, intents: list[Intent], states: list[RunState], offsets: list[Partition]
    ) -> None:
        """The transaction, if there is anything to write; then the intents
        go ahead, or are refused when it failed (the calls must not go out)."""
        if states or offsets:
            try:
                self._transaction(states, offsets)
            except Exception as exc:
                for intent in intents:
                    intent.error = str(exc)
                    intent.done.set()
                raise
        for intent in intents:
            intent.done.set()

    def _offsets_moved(self, offsets: list[Partition]) -> bool:
        moved = False
        for tp in offsets:
            previous = getattr(self, "_committed", {}).get(tp.partition)
            if previous != tp.offset:
                moved = True
        return moved

    def _transaction(self, states: list[RunState], offsets: list[Partition]) -> None:
        assert self._consumer is not None
        producer = self._state_producer()
        try:
            producer.begin_transaction()
            for state in states:
                producer.produce(
                    self._settings.runs_topic,
                    key=state.run.encode(),
                    value=state.encode(),
                    partition=_runs_partition(state.run),
                )
            if offsets:
                producer.send_offsets_to_transaction(
                    offsets, self._consumer.consumer_group_metadata(), 30
                )
            producer.commit_transaction(30)
        except KafkaException as exc:
            self._recover(exc.args[0])
            raise RuntimeError(f"committing to Kafka failed: {exc}") from exc
        committed = getattr(self, "_committed", {})
        committed.update({tp.partition: tp.offset for tp in offsets})
        self._committed = committed
        for state in states:
            book = self._books.get(state.run)
            if book is not None:
                book.written = state.encode()

    def _state_producer(self) -> Producer:
        """The transactional producer, a new one after one was given up."""
        if self._producer is None:
            producer = Producer(self._settings.state_producer(self._member))
            producer.init_transactions(30)  # fences an earlier one of this member
            self._producer = producer
        return self._producer

    def _recover(self, error: KafkaError) -> None:
        """After a failed transaction (a broker lost, a coordinator moving):
        abort it; a producer that cannot abort (a fatal error, or the abort
        failing too) is given up, and the next commit starts a new one under
        the same transactional id."""
        if self._producer is None:
            return
        if not error.fatal():
            try:
                self._producer.abort_transaction(30)
                return
            except KafkaException as exc:
                logger.warning("Aborting a Kafka transaction failed (%s); starting over", exc)
        self._producer = None

    def _note(self, intent: Intent) -> None:
        book = self._books.get(intent.run_key)
        owned = None if book is None else self._owned.get(book.partition)
        if book is None or owned is None or not owned.ready:
            intent.error = "the run's partition is not this member's"
            return
        if intent.kind == "upload":
            book.intents[intent.upload_id] = intent.episode_ids
        elif intent.kind == "close":
            book.finalizing = True
        else:
            book.creating_at = intent.at

    def _settle(self, key: str, book: _RunBook, held: set[str]) -> RunState:
        """The run's state now, its done records dropped from ``book``."""
        run = self._spool.reading.run(key)
        waiting = held | (self._spool.handover.undelivered_ids(key) if run is not None else set())
        while book.records and _done(book.records[0], run, waiting):
            book.through = book.records.popleft().offset
        remaining = {i for record in book.records for i in record.episode_ids}
        delivered = (
            sorted(
                i
                for i, s in self._spool.handover.stored_ids(key, remaining).items()
                if s == "delivered"
            )
            if run is not None and remaining
            else []
        )
        opened = self._spool.handover.open_traces_uploads(key) if run is not None else []
        open_ids = {upload for upload, _ in opened}
        for upload in list(book.intents):
            if upload not in open_ids and self._spool.handover.upload_state(upload) is not None:
                del book.intents[upload]  # confirmed, or given up: in the books now
        sending = [*opened, *((u, i) for u, i in book.intents.items() if u not in open_ids)]
        known = {upload for upload, _ in sending}
        sending += [item for item in self._ownership.inherited_uploads(key) if item[0] not in known]
        platform_id = run.platform_id if run is not None else None
        inherited = self._ownership.inherited(key)
        if platform_id is None and inherited is not None:
            platform_id = inherited.platform_id
        return RunState(
            run=key,
            partition=book.partition,
            through=book.through,
            platform_id=platform_id,
            url=run.url if run is not None else None,
            closed=bool(run is not None and run.closed),
            traces_written=run.traces_written if run is not None else 0,
            delivered=delivered,
            sending=[(u, list(i)) for u, i in sending],
            creating_at=None if platform_id else book.creating_at,
            finalizing=book.finalizing and not (run is not None and run.closed),
        )


def _done(record: _Record, run: RunRow | None, waiting: set[str]) -> bool:
    if run is None:
        return not record.episode_ids & waiting and not record.control
    if record.episode_ids & waiting:
        return False
    return not record.control or run.settled or run.stopped


def _episode_ids(request: ExportTraceServiceRequest) -> tuple[frozenset[str], bool]:
    """The episode ids a record carries, and whether it carries more than
    episodes (a run's start, end or metrics, or an episode known by no id)."""
    ids: set[str] = set()
    control = False
    for resource_spans in request.resource_spans:
        for scope_spans in resource_spans.scope_spans:
            for span in scope_spans.spans:
                if span.name in CONTROL_SPANS:
                    control = True
                    continue
                episode_id = None
                example = False
                for pair in span.attributes:
                    if pair.key == semconv.EPISODE_ID:
                        episode_id = pair.value.string_value
                    elif pair.key == semconv.EPISODE_EXAMPLE_ID:
                        example = True
                if episode_id:
                    ids.add(episode_id)
                elif example:
                    control = True
    return frozenset(ids), control


def _runs_partition(key: str) -> int:
    """A run's partition of ``<prefix>.runs``: fixed by its key, so its
    states follow one another and compaction keeps the last."""
    return zlib.crc32(key.encode()) % RUNS_PARTITIONS


def ensure_topics(settings: KafkaSettings) -> None:
    """Create the fleet's topics where they do not exist yet."""
    admin = AdminClient(settings.common())
    try:
        metadata = admin.list_topics(timeout=30)
    except KafkaException as exc:
        raise ConfigError(
            f"cannot reach Kafka at {settings.bootstrap}: {exc}. Check --kafka (host:port, "
            "comma-separated) and --kafka-config for the cluster's security settings"
        ) from exc
    replicas = min(3, len(metadata.brokers))
    insync = {"min.insync.replicas": "2"} if replicas >= 3 else {}
    wanted = [
        NewTopic(
            settings.episodes_topic,
            num_partitions=settings.partitions,
            replication_factor=replicas,
            config={"max.message.bytes": str(MAX_RECORD_BYTES), **insync},
        ),
        NewTopic(
            settings.runs_topic,
            num_partitions=RUNS_PARTITIONS,
            replication_factor=replicas,
            config={"cleanup.policy": "compact", **insync},
        ),
    ]
    missing = [topic for topic in wanted if topic.topic not in metadata.topics]
    if not missing:
        return
    for topic, future in admin.create_topics(missing).items():
        try:
            future.result(30)
        except KafkaException as exc:
            if exc.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
                raise ConfigError(f"cannot create the Kafka topic {topic}: {exc}") from exc
