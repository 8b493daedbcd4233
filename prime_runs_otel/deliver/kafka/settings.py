"""Where a Kafka fleet lives and how its clients are set up.

Every ``serve`` given the same bootstrap servers and topic prefix is one
fleet. Settings for an existing cluster (SASL, TLS, timeouts) are passed
through to librdkafka as they are (``--kafka-config KEY=VALUE``, or a
properties file), so whatever the cluster needs can be said without this
package knowing of it.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ...errors import ConfigError

#: The environment variable behind ``--kafka``.
BOOTSTRAP_ENV = "PRIME_RUNS_KAFKA"
DEFAULT_PREFIX = "prime-runs"
#: Partitions of ``<prefix>.episodes`` when this fleet creates it: the most
#: members that can share the delivery (see docs/scaling.md).
DEFAULT_PARTITIONS = 24
#: A record of one run's spans, at most (the topic is created with it).
MAX_RECORD_BYTES = 64 * 1024 * 1024
#: How long a member that stopped answering keeps its partitions. A killed
#: member's runs resume about this long after the kill (a restarted one with
#: the same --kafka-member at once).
SESSION_TIMEOUT_MS = 8000
#: How long a transaction of a killed member blocks the partitions it wrote
#: before the broker aborts it.
TRANSACTION_TIMEOUT_MS = 10000
#: How often the group consumer asks for the metadata of its topic even when
#: nothing else made it ask (librdkafka's ``topic.metadata.refresh.interval.ms``,
#: 300 s by default). A consumer joining the group waits for that metadata
#: before it sends its JoinGroup, and librdkafka 2.16 does not ask again when
#: the request was lost with the broker connection it went out on (the
#: bootstrap connection, dropped once the brokers are known, or after a
#: re-bootstrap when the brokers stopped answering): the member then waited
#: for the periodic refresh, five minutes without a partition. It waits this
#: long at most now; added partitions are seen as soon.
METADATA_REFRESH_MS = 10000


@dataclass(frozen=True)
class KafkaSettings:
    """One member's view of the fleet."""

    bootstrap: str
    prefix: str = DEFAULT_PREFIX
    #: This member's stable name: its static group membership and its
    #: transactional id (a restart under the same name fences the old one).
    member: str | None = None
    partitions: int = DEFAULT_PARTITIONS
    #: librdkafka settings passed through (security.protocol, sasl.*, ssl.*).
    client: Mapping[str, str] = field(default_factory=dict)

    @property
    def episodes_topic(self) -> str:
        return f"{self.prefix}.episodes"

    @property
    def runs_topic(self) -> str:
        return f"{self.prefix}.runs"

    @property
    def group(self) -> str:
        return f"{self.prefix}.delivery"

    def common(self) -> dict[str, Any]:
        return {"bootstrap.servers": self.bootstrap, **self.client}

    def ingest_producer(self) -> dict[str, Any]:
        """The producer of OTLP requests: idempotent, every replica's ack."""
        return {
            **self.common(),
            "enable.idempotence": True,
            "acks": "all",
            "linger.ms": 2,
            "message.max.bytes": MAX_RECORD_BYTES,
            "compression.type": "lz4",
            # A request is answered 503 long before this; the record is then
            # given up on by the producer too, so it cannot land after the
            # client was told to send it again (that would only be a duplicate).
            "message.timeout.ms": 30000,
            **self.client,
        }

    def state_producer(self, member: str) -> dict[str, Any]:
        return {
            **self.common(),
            "transactional.id": f"{self.prefix}.member.{member}",
            "transaction.timeout.ms": TRANSACTION_TIMEOUT_MS,
            "linger.ms": 0,
            **self.client,
        }

    def group_consumer(self, member: str | None) -> dict[str, Any]:
        config: dict[str, Any] = {
            **self.common(),
            "group.id": self.group,
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
            "isolation.level": "read_committed",
            "partition.assignment.strategy": "cooperative-sticky",
            "session.timeout.ms": SESSION_TIMEOUT_MS,
            "heartbeat.interval.ms": 1000,
            "fetch.message.max.bytes": MAX_RECORD_BYTES,
            # The poll loop hands records to the spool at once; a slow commit
            # must not cost the group membership.
            "max.poll.interval.ms": 300000,
            "topic.metadata.refresh.interval.ms": METADATA_REFRESH_MS,
        }
        if member:
            config["group.instance.id"] = member
        return {**config, **self.client}

    def table_consumer(self) -> dict[str, Any]:
        """The reader of ``<prefix>.runs`` (no group: every member reads all)."""
        return {
            **self.common(),
            "group.id": f"{self.prefix}.table",
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
            "isolation.level": "read_committed",
            **self.client,
        }


def parse_client_config(items: Iterable[str], files: Iterable[str] = ()) -> dict[str, str]:
    """``KEY=VALUE`` settings and Java-style properties files, files first."""
    config: dict[str, str] = {}
    for name in files:
        try:
            text = Path(name).read_text()
        except OSError as exc:
            raise ConfigError(f"cannot read the Kafka client settings {name}: {exc}") from exc
        for line in text.splitlines():
            line = line.strip()
            if not line or line.startswith(("#", "!")):
                continue
            config.update([_pair(line, name)])
    for item in items:
        config.update([_pair(item, "--kafka-config")])
    return config


def _pair(text: str, where: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key.strip():
        raise ConfigError(f"{where}: {text!r} is not KEY=VALUE (e.g. security.protocol=SASL_SSL)")
    return key.strip(), value.strip()


def bootstrap_from_env() -> str | None:
    return os.environ.get(BOOTSTRAP_ENV) or None
