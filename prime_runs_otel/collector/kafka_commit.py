"""The transactions of a member: run states and consumer offsets written to
Kafka together, each transaction bounded in time.

A transaction whose brokers stop answering half-way (a broker gone
mid-commit, a coordinator moving) must not hold the consumer loop: while it
waits, no record is read, no rebalance is answered and every intent of the
uploader waits too. So a transaction gets :data:`TRANSACTION_BUDGET` seconds
in all (its calls share them), is aborted when it fails or runs out of
time, and a producer that cannot abort is given up and replaced by a new one
under the same transactional id (which fences whatever the old one might
still send). What the failed transaction carried is written again by the
next one: the states and offsets are recomputed from the books each time.

A producer *fenced* by another one under its transactional id means another
process runs under this member's name: this one is the stale one and must
stop delivering at once (:class:`Fenced`), never fence the other back.
"""

from __future__ import annotations

import logging
import time

from confluent_kafka import KafkaError, KafkaException, Producer
from confluent_kafka import TopicPartition as Partition

from ..deliver.kafka.settings import KafkaSettings
from ..deliver.kafka.state import RunState
from .kafka_table import runs_partition

logger = logging.getLogger(__name__)

#: How long one transaction may take, begin to commit: as long as the broker
#: lets a transaction stay open (``transaction.timeout.ms``).
TRANSACTION_BUDGET = 10.0
#: How long aborting a failed transaction may take before its producer is
#: given up.
ABORT_TIMEOUT = 5.0
#: How long a new producer may take to register its transactional id.
INIT_TIMEOUT = 30.0
#: Errors that say another producer took over this member's transactional id.
FENCED_CODES = frozenset(
    {KafkaError._FENCED, KafkaError.PRODUCER_FENCED, KafkaError.INVALID_PRODUCER_EPOCH}
)


class Fenced(RuntimeError):
    """Another process runs under this member's name and now writes its
    transactions: this one must stop delivering."""


class StateWriter:
    """One member's transactional producer of ``<prefix>.runs``."""

    def __init__(self, settings: KafkaSettings, member: str) -> None:
        self._settings = settings
        self._member = member
        self._producer: Producer | None = None
        #: Set once fenced: no new producer may fence the other process back.
        self._fenced: str | None = None
        #: The offset last committed, by partition of ``<prefix>.episodes``.
        self._committed: dict[int, int] = {}
        #: When transactions started failing one after another (``None``: the last one passed).
        self.failing_since: float | None = None

    def producer(self) -> Producer:
        """The transactional producer, a new one after one was given up."""
        if self._fenced is not None:
            raise Fenced(self._fenced)
        if self._producer is None:
            producer = Producer(self._settings.state_producer(self._member))
            producer.init_transactions(INIT_TIMEOUT)  # fences an earlier one of this member
            self._producer = producer
        return self._producer

    def flush(self, timeout: float) -> None:
        if self._producer is not None:
            self._producer.flush(timeout)

    def offsets_moved(self, offsets: list[Partition]) -> bool:
        return any(self._committed.get(tp.partition) != tp.offset for tp in offsets)

    def write(self, states: list[RunState], offsets: list[Partition], group: object) -> None:
        """``states`` and ``offsets`` in one transaction, within
        :data:`TRANSACTION_BUDGET`; :class:`RuntimeError` when it failed
        (aborted: nothing of it is visible), :class:`Fenced` when this
        member's transactional id is another process's now."""
        try:
            self._transaction(states, offsets, group)
        except KafkaException as exc:
            error: KafkaError = exc.args[0]
            if self.failing_since is None:
                self.failing_since = time.monotonic()
            if error.code() in FENCED_CODES:
                self._producer = None
                self._fenced = (
                    f"another process runs under this member's name ({error.str()}); give each "
                    "serve its own --kafka-member"
                )
                raise Fenced(self._fenced) from exc
            self._recover(error)
            raise RuntimeError(f"committing to Kafka failed: {exc}") from exc
        self.failing_since = None
        self._committed.update({tp.partition: tp.offset for tp in offsets})

    def _transaction(self, states: list[RunState], offsets: list[Partition], group: object) -> None:
        deadline = time.monotonic() + TRANSACTION_BUDGET
        producer = self.producer()
        producer.begin_transaction()
        for state in states:
            producer.produce(
                self._settings.runs_topic,
                key=state.run.encode(),
                value=state.encode(),
                partition=runs_partition(state.run),
            )
        if offsets:
            producer.send_offsets_to_transaction(offsets, group, _left(deadline))
        producer.commit_transaction(_left(deadline))

    def _recover(self, error: KafkaError) -> None:
        """After a failed transaction: abort it; a producer that cannot
        abort (a fatal error, or the abort failing too) is given up, and the
        next transaction starts a new one under the same transactional id."""
        if self._producer is None:
            return
        if not error.fatal():
            try:
                self._producer.abort_transaction(ABORT_TIMEOUT)
                return
            except KafkaException as exc:
                logger.warning("Aborting a Kafka transaction failed (%s); starting over", exc)
        self._producer = None


def _left(deadline: float) -> float:
    """The rest of a transaction's budget for its next call (never nothing:
    a call with no time at all fails without asking the broker)."""
    return max(0.5, deadline - time.monotonic())
