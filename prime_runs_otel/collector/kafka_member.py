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
uploads it began with the same bytes (Prime Traces replays the receipt),
counts the episodes of the legacy sample requests it began uncertain (the
sample table appends: they are never sent twice) and adopts its platform
run: no run created twice, no episode uploaded twice, none skipped.

This module is the loop, the rebalancing and what goes in each commit; the
books of the runs are :mod:`.kafka_books`, the table of run states and the
topics :mod:`.kafka_table`, the transactions :mod:`.kafka_commit`.

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
from collections.abc import Iterable
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException
from confluent_kafka import TopicPartition as Partition

from .._courtesy import stand_back
from .._text import shown
from ..deliver.kafka.owner import FleetOwnership, Intent
from ..deliver.kafka.settings import KafkaSettings
from ..deliver.kafka.spool import FleetSpool
from ..deliver.kafka.state import RunState
from ..errors import ConfigError
from .intake import SpanIntake
from .kafka_books import Owned, RunBooks
from .kafka_commit import Fenced, StateWriter
from .kafka_records import RecordIntake, passes
from .kafka_table import RunTable, ensure_topics
from .logs_intake import LogIntake

logger = logging.getLogger(__name__)

#: How often the offsets and run states are committed when nothing asks sooner.
COMMIT_INTERVAL = 0.5
#: How long one poll waits for records: an intent that arrives meanwhile
#: waits for its commit at most this long.
POLL_SECONDS = 0.01
#: How long a partition whose records the spool refused (full or failing)
#: waits before they are read again.
REFUSED_PAUSE = 1.0


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
        self._ownership = ownership
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self._owned: dict[int, Owned] = {}
        self._books = RunBooks(spool, ownership)
        self._records = RecordIntake(intake, logs, self._books)
        self._writer = StateWriter(settings, member)
        self._last_commit = 0.0
        self._consumer: Consumer | None = None
        #: Every run state of the fleet read from ``<prefix>.runs``.
        self._table: RunTable | None = None
        #: What /metrics reports: records behind the end of owned partitions.
        self.lag = 0
        #: What /metrics reports: the CPU time of the loop's thread so far.
        self.cpu_seconds = 0.0
        self.error: str | None = None

    # -- start and stop -----------------------------------------------------------------

    def start(self) -> None:
        """Create the topics if needed, join the group and start consuming."""
        ensure_topics(self._settings)
        self._purge_spool()
        try:
            self._writer.producer()
        except KafkaException as exc:
            raise ConfigError(
                f"Kafka at {self._settings.bootstrap} refused this member's transactions "
                f"({exc}); check the cluster allows transactions (a single broker needs "
                "transaction.state.log.replication.factor=1)"
            ) from exc
        self._table = RunTable(self._settings)
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
            try:
                self._consumer.close()
            except (KafkaException, RuntimeError) as exc:  # fenced: it cannot leave cleanly
                logger.warning("Leaving the Kafka group failed: %s", shown(exc))
        if self._table is not None:
            self._table.close()
        self._writer.flush(5)

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
        stand_back()  # the member's requests go first (see .._courtesy)
        while not self._stopping.is_set():
            try:
                if self._ownership.wanted.is_set():
                    self._commit_intents()  # an upload, create or finalize waits for it
                assert self._table is not None
                self._table.read(0)
                messages = self._consumer.consume(500, POLL_SECONDS)
                self._take(messages)
                self._check_ready()
                if time.monotonic() - self._last_commit >= COMMIT_INTERVAL:
                    self._commit()
                elif self._ownership.wanted.is_set():
                    self._commit_intents()
                self.error = None
                self.cpu_seconds = time.thread_time()
            except Fenced as exc:
                self._give_up(str(exc))
                return
            except Exception as exc:
                if self.error is None:
                    logger.exception("The Kafka consumer loop failed; going on")
                self.error = f"{type(exc).__name__}: {shown(exc)}"
                time.sleep(0.5)

    def _give_up(self, reason: str) -> None:
        """Another process writes this member's transactions now: stop
        delivering every run of this member at once, leave their spool, and
        stop reading (health reports why). Fencing the other back would
        have two members deliver the same runs."""
        logger.error("Kafka: this member stops delivering: %s", reason)
        self.error = f"fenced: {reason}"
        self._forget(set(self._owned))
        self._stopping.set()

    def _take(self, messages: Iterable[Any]) -> None:
        """The records of one ``consume()`` into the spool, each partition's
        in as few intake passes as :func:`.kafka_records.passes` cuts them."""
        by_partition: dict[int, list[Any]] = {}
        for message in messages:
            if self._readable(message) and message.partition() in self._owned:
                by_partition.setdefault(message.partition(), []).append(message)
        for partition, records in by_partition.items():
            self._take_partition(partition, records)

    def _readable(self, message: Any) -> bool:
        """A record, not an error event; raises :class:`Fenced` on a fatal one."""
        error = message.error()
        if error is None:
            return True
        # A fatal error arrives as an event of code _FATAL (its flag unset).
        if error.fatal() or error.code() == KafkaError._FATAL:
            raise Fenced(
                f"the Kafka consumer cannot go on ({error.str()}); if another serve runs "
                "under this member's --kafka-member, give each its own"
            )
        if error.code() != KafkaError._PARTITION_EOF:
            logger.warning("Kafka: %s", error.str())
        return False

    def _take_partition(self, partition: int, records: list[Any]) -> None:
        owned = self._owned[partition]
        for batch in passes(records):
            assert self._table is not None
            if not self._records.take(partition, batch, self._table.states):
                self._hold_back(partition, batch[0].offset())
                return
            owned.position = batch[-1].offset() + 1
            if self._ownership.wanted.is_set():
                self._commit_between_passes()

    def _hold_back(self, partition: int, offset: int) -> None:
        """Not taken now (the spool is full or failing): read from ``offset``
        again in :data:`REFUSED_PAUSE` seconds. Paused meanwhile, or the next
        poll (10 ms later) would fetch and refuse the same records again, a
        hundred times a second for as long as the spool stays full."""
        assert self._consumer is not None
        tp = Partition(self._settings.episodes_topic, partition, offset)
        self._consumer.seek(tp)
        self._consumer.pause([tp])
        self._owned[partition].blocked_until = time.monotonic() + REFUSED_PAUSE

    def _resume(self, partition: int, owned: Owned) -> None:
        """Read a partition :meth:`_hold_back` paused again."""
        owned.blocked_until = 0.0
        if self._consumer is None:
            return
        try:
            self._consumer.resume([Partition(self._settings.episodes_topic, partition)])
        except KafkaException as exc:  # no longer assigned: nothing to resume
            logger.debug("Kafka: resuming partition %d: %s", partition, exc)

    def _commit_between_passes(self) -> None:
        """An upload, create or finalize waits for a commit: it gets one
        now, not after the rest of a batch of up to 500 records is read into
        the spool (which took seconds while a backlog was read). A failure
        is the intents' (they are refused and tried again); the batch goes on."""
        try:
            self._commit_intents()
        except Fenced:
            raise
        except Exception as exc:
            logger.warning("Kafka: a commit between records failed (%s)", shown(exc))

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
        assert self._table is not None
        self._table.read_to_end()
        committed = consumer.committed(partitions, timeout=30)
        for tp, done in zip(partitions, committed, strict=True):
            _, high = consumer.get_watermark_offsets(tp, timeout=10, cached=False)
            start = done.offset if done.offset >= 0 else 0
            owned = Owned(end_at_assignment=high)
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
                self._resume(partition, owned)
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
        if owned is None:
            return
        owned.ready = False
        if owned.blocked_until:
            self._resume(partition, owned)  # not paused should it come back to this member

    def _forget(self, partitions: set[int]) -> None:
        """The partitions went to another member: their runs leave this spool."""
        for partition in partitions:
            self._owned.pop(partition, None)
            for key in self._ownership.revoke(partition):
                self._books.books.pop(key, None)
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
            self._books.note(intent, self._owned_of(intent.run_key))
        keys = {intent.run_key for intent in intents if intent.error is None}
        held = self._intake.held_episode_ids() if keys else {}
        states = []
        for key in keys:
            book = self._books.books[key]
            state = self._books.settle(key, book, held.get(key, set()))
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
            self._books.note(intent, self._owned_of(intent.run_key))
        held = self._intake.held_episode_ids()
        states: list[RunState] = []
        offsets: list[Partition] = []
        for partition, owned in self._owned.items():
            if only is not None and partition not in only:
                continue
            if owned.position is None:
                continue
            first = owned.position
            for key, book in self._books.in_partition(partition):
                state = self._books.settle(key, book, held.get(key, set()))
                left = book.first_offset()
                if left is not None:
                    first = min(first, left)
                value = state.encode()
                if value != book.written:
                    states.append(state)
            offsets.append(Partition(self._settings.episodes_topic, partition, first))
        if not states and not (offsets and (force or self._writer.offsets_moved(offsets))):
            offsets = []
        self._finish(intents, states, offsets)

    def _finish(
        self, intents: list[Intent], states: list[RunState], offsets: list[Partition]
    ) -> None:
        """The transaction, if there is anything to write; then the intents
        go ahead, or are refused when it failed (the calls must not go out)."""
        if states or offsets:
            assert self._consumer is not None
            try:
                self._writer.write(states, offsets, self._consumer.consumer_group_metadata())
            except Exception as exc:
                for intent in intents:
                    intent.error = str(exc)
                    intent.done.set()
                raise
            for state in states:
                book = self._books.books.get(state.run)
                if book is not None:
                    book.written = state.encode()
        for intent in intents:
            intent.done.set()

    def _owned_of(self, run_key: str) -> Owned | None:
        book = self._books.books.get(run_key)
        return None if book is None else self._owned.get(book.partition)
