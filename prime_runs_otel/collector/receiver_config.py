"""How ``serve`` listens and what it allows: :class:`ReceiverConfig`, its
defaults, and the checks that refuse a configuration that would expose the
spool or cannot work.

Its own module because the command line (``serve``'s options and their
defaults), the process and both fronts read it: none of them owns it.
"""

from __future__ import annotations

from dataclasses import dataclass

from .._net import is_loopback
from ..deliver.kafka.settings import KafkaSettings
from ..errors import ConfigError
from .admission import admitted_calls
from .intake import DEFAULT_MAX_HELD_SPANS, DEFAULT_SETTLE_SECONDS

MiB = 1024 * 1024
#: Where OTLP/HTTP traces are posted (the OTLP specification's path).
TRACES_PATH = "/v1/traces"
#: Room for one 64 MiB episode record (the Prime Traces line limit) with its
#: OTLP framing and JSON escaping, plus a few ordinary spans beside it.
DEFAULT_MAX_BODY_BYTES = 256 * MiB
#: A producer that sends nothing for this long and never sent its end span
#: is taken to have crashed. Long enough for slow rollouts between episodes.
DEFAULT_IDLE_TIMEOUT = 3600.0
#: Memory the requests being decoded may take together, each estimated from
#: its size and the values in it (see :func:`.bodies.decode_cost`).
DEFAULT_MEMORY_BYTES = 2048 * MiB
#: Values (spans, attributes, array elements, ...) one request may hold. A
#: collector's batch of a few hundred spans holds tens of thousands; a body
#: of millions of empty attributes is a few hundred KiB of gzip and would take
#: gigabytes to decode. At this bound a request decodes in about 250 MiB.
DEFAULT_MAX_VALUES = 1_000_000
#: How long a request body may take to arrive, from its first byte to its last.
DEFAULT_READ_TIMEOUT = 120.0
#: How long the head of a request (its request line and headers) may take to
#: arrive: a connection that sends nothing, or stops half-way, is closed then.
DEFAULT_HEADER_TIMEOUT = 10.0
#: How long in-flight requests may take to finish after a stop signal.
DEFAULT_SHUTDOWN_GRACE = 30.0
#: After a run's end span, how long the run may go without news of it before
#: it closes although episodes the end span counts have not arrived. Behind
#: a collector the end can arrive first; the rest follows with the
#: collector's next retry (every 30 s at most in the shipped configs), also
#: after a restart of either side.
DEFAULT_STRAGGLER_WAIT = 120.0
#: Requests decoded and committed at once; the rest wait their turn. Spool
#: commits serialise anyway, and each large request holds its body in memory.
DEFAULT_WORKERS = 4
#: HTTP connections open at once (fewer when the descriptor limit is low).
#: Idle ones close after a few seconds, so this is about bursts and abuse.
DEFAULT_MAX_CONNECTIONS = 1000
TOKEN_ENV = "PRIME_RUNS_OTEL_SERVE_TOKEN"


@dataclass(frozen=True)
class ReceiverConfig:
    """How ``serve`` listens. ``grpc_port=None`` turns gRPC off; port 0 picks
    a free port (read it back from :attr:`.receiver.Receiver.http_port`)."""

    host: str = "127.0.0.1"
    http_port: int = 4318
    grpc_port: int | None = 4317
    token: str | None = None
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    idle_timeout: float = DEFAULT_IDLE_TIMEOUT
    shutdown_grace: float = DEFAULT_SHUTDOWN_GRACE
    workers: int = DEFAULT_WORKERS
    memory_bytes: int = DEFAULT_MEMORY_BYTES
    read_timeout: float = DEFAULT_READ_TIMEOUT
    settle_seconds: float = DEFAULT_SETTLE_SECONDS
    max_held_spans: int = DEFAULT_MAX_HELD_SPANS
    max_connections: int = DEFAULT_MAX_CONNECTIONS
    header_timeout: float = DEFAULT_HEADER_TIMEOUT
    #: Whether spans may name a platform run to add to (``prime.run.attach``).
    allow_attach: bool = False
    max_values: int = DEFAULT_MAX_VALUES
    straggler_wait: float = DEFAULT_STRAGGLER_WAIT
    #: In a Kafka fleet: the cluster and topics this member shares (None:
    #: this serve alone, with its spool).
    kafka: KafkaSettings | None = None

    @property
    def intake_threads(self) -> int:
        """Threads that decode and commit requests (per front). Alone,
        ``--workers``: spool commits serialise anyway. In a fleet, one per
        admitted call: a request's thread spends most of its time waiting for
        the brokers' acknowledgement (without the GIL), and with ``--workers``
        threads the calls admitted behind them queued for one: at 1,000
        episodes/s that wait was the largest part of the acknowledgement
        latency (``bench/kafka.py --stages``)."""
        if self.kafka is None:
            return self.workers
        return admitted_calls(self.workers)

    def validate(self) -> None:
        """Refuse settings that would expose the spool or cannot work."""
        if not self.token and not is_loopback(self.host):
            raise ConfigError(
                f"serve listens on {self.host}, beyond this machine, so it needs a bearer "
                f"token: pass --token or set {TOKEN_ENV} (collectors then send "
                "'Authorization: Bearer <token>'), or listen on 127.0.0.1"
            )
        if self.max_body_bytes < 1024:
            raise ConfigError(f"the body limit {self.max_body_bytes} bytes is too small to work")
        if self.idle_timeout <= 0:
            raise ConfigError("the idle timeout must be a positive number of seconds")
        if self.workers < 1:
            raise ConfigError("serve needs at least one worker")
        if self.max_values < 1:
            raise ConfigError("serve must take at least one value per request")
        if self.memory_bytes < 1:
            raise ConfigError("serve needs some memory to decode requests in")
        if self.read_timeout <= 0:
            raise ConfigError("the time a request body may take must be positive")
        if self.settle_seconds < 0:
            raise ConfigError("the wait for an episode's spans cannot be negative")
        if self.straggler_wait < 0:
            raise ConfigError("the wait for an ended run's missing episodes cannot be negative")
        if self.max_held_spans < 1:
            raise ConfigError("serve must be able to hold at least one span for synthesis")
        if self.header_timeout <= 0:
            raise ConfigError("the time a request head may take must be positive")
        if self.max_connections < 1:
            raise ConfigError("serve must take at least one HTTP connection")
