"""The fleet's topics, and the table of every run's state read from
``<prefix>.runs``.

Every member reads the whole compacted topic (no group: each needs every
state, since any partition may come its way), so the member that takes a
partition over knows what the previous owner committed for each of its runs
before it reads a record of them.
"""

from __future__ import annotations

import logging
import time
import zlib

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, KafkaException
from confluent_kafka import TopicPartition as Partition
from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

from .._text import shown
from ..deliver.kafka.settings import MAX_RECORD_BYTES, KafkaSettings
from ..deliver.kafka.state import RunState
from ..errors import ConfigError

logger = logging.getLogger(__name__)

#: Partitions of ``<prefix>.runs`` (compacted; one record per run).
RUNS_PARTITIONS = 6
#: How long taking a partition over may wait for the run states to be read.
TABLE_TIMEOUT = 30.0


class RunTable:
    """Every run state of the fleet, as committed to ``<prefix>.runs``."""

    def __init__(self, settings: KafkaSettings) -> None:
        self._settings = settings
        self._consumer = Consumer(settings.table_consumer() | {"enable.partition.eof": True})
        self._consumer.assign(
            [Partition(settings.runs_topic, p, OFFSET_BEGINNING) for p in range(RUNS_PARTITIONS)]
        )
        #: The last state of each run, by run key.
        self.states: dict[str, RunState] = {}
        self._end: dict[int, int] = {}

    def close(self) -> None:
        self._consumer.close()

    def read(self, timeout: float) -> None:
        """The states committed since the last read (waiting up to ``timeout``)."""
        for message in self._consumer.consume(1000, timeout):
            error = message.error()
            partition, offset, value = message.partition(), message.offset(), message.value()
            if partition is None or offset is None:
                continue
            if error is not None:
                if error.code() == KafkaError._PARTITION_EOF:
                    self._end[partition] = offset
                continue
            self._end[partition] = offset + 1
            key = (message.key() or b"").decode("utf-8", "replace")
            if value is None:
                self.states.pop(key, None)
                continue
            try:
                self.states[key] = RunState.decode(value)
            except (ValueError, TypeError) as exc:
                logger.warning("Run %s: its state in Kafka cannot be read: %s", shown(key), exc)

    def read_to_end(self) -> None:
        """Every state committed so far (the previous owner's last included)."""
        ends = {}
        for partition in range(RUNS_PARTITIONS):
            _, high = self._consumer.get_watermark_offsets(
                Partition(self._settings.runs_topic, partition), timeout=10, cached=False
            )
            ends[partition] = high
        deadline = time.monotonic() + TABLE_TIMEOUT
        while time.monotonic() < deadline:
            if all(self._end.get(p, 0) >= end for p, end in ends.items() if end > 0):
                return
            self.read(0.1)
        logger.warning("Reading the run states took over %gs; going on", TABLE_TIMEOUT)


def runs_partition(key: str) -> int:
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
