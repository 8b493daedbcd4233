"""One ``serve`` process: the spool, the uploader and the span intake behind
the two fronts, and the order in which they start and stop.

The HTTP front is :mod:`.http_front`, the gRPC front :mod:`.grpc_front`
(each needs of this process only what it names); what a body must be before
it is decoded is :mod:`.bodies`, what becomes of a decoded request is
:mod:`.intake`, and how the process is configured :mod:`.receiver_config`.
This module owns what outlives any one request: the workers, readiness, the
timer that releases settled episodes, and a shutdown that still commits what
is held and closes the spool whatever failed before it.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

import grpc

from .._text import shown
from ..config import Settings
from ..deliver.kafka.owner import FleetOwnership
from ..deliver.kafka.spool import FleetSpool
from ..deliver.spool import Spool
from ..deliver.uploader import Uploader
from ..errors import ConfigError
from .admission import admitted_calls
from .bodies import DecodeBudget
from .grpc_front import GrpcFront, grpc_server
from .http_connections import connection_cap, raise_descriptor_limit
from .http_front import http_server, listen
from .intake import SpanIntake, Verdict
from .logs_intake import LogIntake
from .metrics import render as render_metrics
from .receiver_config import TRACES_PATH, ReceiverConfig

if TYPE_CHECKING:  # confluent-kafka is an extra: imported only with --kafka
    from .kafka_ingest import KafkaIngest
    from .kafka_member import KafkaMember

logger = logging.getLogger(__name__)


class Receiver:
    """One ``serve`` process: spool, uploader, HTTP and gRPC fronts."""

    def __init__(self, config: ReceiverConfig, settings: Settings) -> None:
        _refuse_unservable(config, settings)
        self.config = config
        self.settings = settings
        self.ownership = FleetOwnership() if config.kafka is not None else None
        self.spool = _open_spool(settings, self.ownership)
        self._http_socket = listen(config.host, config.http_port)
        self.http_port: int = self._http_socket.getsockname()[1]
        self.uploader = Uploader(
            self.spool,
            settings,
            idle_timeout=config.idle_timeout,
            straggler_wait=config.straggler_wait,
            owner=self.ownership,
            behind_collector=True,
        )
        self.ingest: KafkaIngest | None = None
        if config.kafka is not None:
            kafka_ingest, _ = _kafka_modules()
            self.ingest = kafka_ingest.KafkaIngest(config.kafka)
        self.intake = SpanIntake(
            self.spool,
            settings,
            self.uploader,
            settle_seconds=config.settle_seconds,
            max_held_spans=config.max_held_spans,
            allow_attach=config.allow_attach,
            handoff=None if self.ingest is None else self.ingest.hand_off,
        )
        self.logs = LogIntake(
            self.intake, handoff=None if self.ingest is None else self.ingest.hand_off_logs
        )
        self.member = self._fleet_member()
        self.memory = DecodeBudget(config.memory_bytes)
        self._releasing = threading.Event()
        self._releaser = threading.Thread(
            target=self._release_loop, name="otlp-synthesis", daemon=True
        )
        self._executor = ThreadPoolExecutor(config.intake_threads, thread_name_prefix="otlp-intake")
        self.grpc_port: int | None = None
        self._grpc: grpc.Server | None = None
        self._grpc_front: GrpcFront | None = None
        if config.grpc_port is not None:
            self._open_grpc(config.grpc_port)
        self._stopped: threading.Event | None = None
        #: OTLP/HTTP requests being read or committed (shown on /healthz).
        self.in_flight = 0
        self.descriptors = raise_descriptor_limit()
        self.connection_cap = connection_cap(config.max_connections, self.descriptors)
        self._server = http_server(self, self.connection_cap, self.descriptors)

    def _fleet_member(self) -> KafkaMember | None:
        """With ``--kafka``: the consumer loop that feeds this member's spool."""
        kafka = self.config.kafka
        if kafka is None:
            return None
        assert self.ownership is not None and isinstance(self.spool, FleetSpool)
        _, kafka_member = _kafka_modules()
        member: KafkaMember = kafka_member.KafkaMember(
            kafka,
            kafka.member or f"{socket.gethostname()}:{self.http_port}",
            self.spool,
            self.intake,
            self.logs,
            self.ownership,
        )
        return member

    def _open_grpc(self, port: int) -> None:
        try:
            self._grpc_front = grpc_server(self, port)
        except ConfigError:
            self._http_socket.close()  # the HTTP port is bound already
            raise
        self._grpc, self.grpc_port = self._grpc_front.server, self._grpc_front.port

    # -- running ------------------------------------------------------------------

    async def serve(self) -> None:
        """Serve until SIGINT/SIGTERM or :meth:`stop`, then drain and stop."""
        if self.member is not None:
            try:
                self.member.start()
            except BaseException:
                self._http_socket.close()
                self.spool.close()
                raise
            assert self.config.kafka is not None
            logger.info(
                "serve is a member of the Kafka fleet at %s (topics %s.*)",
                self.config.kafka.bootstrap,
                self.config.kafka.prefix,
            )
        self.uploader.start()
        self._releaser.start()
        if self._grpc is not None:
            self._grpc.start()
        logger.info(
            "prime-runs-otel serve: OTLP/HTTP on http://%s:%d%s%s; runs go to %s (spool %s); "
            "%d export calls at once per port, %d HTTP connections",
            self.config.host,
            self.http_port,
            TRACES_PATH,
            f", OTLP/gRPC on {self.config.host}:{self.grpc_port}" if self.grpc_port else "",
            "the platform" if self.settings.mode == "online" else "the local store",
            self.spool.path,
            admitted_calls(self.config.workers),
            self.connection_cap,
        )
        try:
            await self._server.serve(sockets=[self._http_socket])
        finally:
            # Each step on its own: whatever went wrong while serving, the
            # held episodes are still committed and the spool still closed.
            for step in (
                lambda: self.begin_stop().wait(self.config.shutdown_grace + 1),
                lambda: self._executor.shutdown(wait=True),
                self._shutdown_grpc_pools,
                self._close_ingest,
                self._stop_releasing,
                self.intake.flush,
                lambda: self.uploader.stop(timeout=self.config.shutdown_grace),
                self._leave_fleet,
                self._http_socket.close,
                self.spool.close,
            ):
                try:
                    step()
                except Exception as exc:
                    logger.error(
                        "Stopping: a step failed (%s: %s); going on", type(exc).__name__, shown(exc)
                    )

    def _close_ingest(self) -> None:
        if self.ingest is not None:
            self.ingest.close()

    def _leave_fleet(self) -> None:
        if self.member is not None:
            self.member.stop()

    def stop(self) -> None:
        """Ask a running :meth:`serve` to drain and return (thread-safe)."""
        self._server.should_exit = True

    def begin_stop(self) -> threading.Event:
        """Stop taking new requests; returns an event set once gRPC is drained."""
        if self._stopped is None:
            if self._grpc is None:
                self._stopped = threading.Event()
                self._stopped.set()
            else:
                self._stopped = self._grpc.stop(self.config.shutdown_grace)
        return self._stopped

    def _shutdown_grpc_pools(self) -> None:
        if self._grpc_front is not None:
            self._grpc_front.shutdown_pools()

    def _release_loop(self) -> None:
        """Let settled episodes go between requests: a trace's last spans may
        be the last thing a producer ever sends."""
        interval = min(1.0, max(0.05, self.config.settle_seconds / 4))
        while not self._releasing.wait(interval):
            try:
                self.intake.release_settled()
            except Exception:  # the loop must outlive any one bad tree
                logger.exception("Releasing held episodes failed; trying again")

    def _stop_releasing(self) -> None:
        self._releasing.set()
        if self._releaser.is_alive():
            self._releaser.join()

    def metrics_text(self) -> str:
        """``GET /metrics``: this process's counters and the spool's state."""
        return render_metrics(
            self.intake.counters,
            self.spool.housekeeping.counts(),
            spool_bytes=self.spool.housekeeping.used_bytes(),
            spool_max_bytes=self.spool.max_bytes,
            kafka_lag=None if self.member is None else self.member.lag,
            kafka_loop_cpu=None if self.member is None else self.member.cpu_seconds,
            kafka_stages=None if self.ingest is None else self.ingest.stages.quantiles(),
        )

    def note_stages(self, received: float, stamps: tuple[float, ...], answered: float) -> None:
        """An OTLP/HTTP request handed to Kafka was answered: its stages."""
        if self.ingest is not None:
            self.ingest.stages.observe(received, stamps, answered)

    def not_ready_reason(self) -> str | None:
        if self._stopped is not None:
            return "shutting down"
        if not self.uploader.running:
            return "the uploader is not running"
        if self.member is not None and self.member.error is not None:
            return f"the Kafka consumer fails: {self.member.error}"
        if self.intake.commit_problem is not None:
            return self.intake.commit_problem
        if not self.intake.has_room():
            return (
                self.spool.housekeeping.room_problem()
                or "the spool is at its cap; delivery frees room"
            )
        return None

    async def run_blocking(self, function: Callable[..., Verdict], *args: Any) -> Verdict:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, function, *args)


def _refuse_unservable(config: ReceiverConfig, settings: Settings) -> None:
    """Settings this process cannot serve with, refused before anything opens."""
    config.validate()
    if settings.mode == "disabled":
        raise ConfigError(
            "serve cannot run with PRIME_RUNS_MODE=disabled: it would accept spans and "
            "drop them. Use online (with an API key) or local."
        )
    if config.kafka is not None and settings.mode != "online":
        raise ConfigError(
            "serve --kafka delivers runs to the platform: set PRIME_API_KEY (a fleet "
            "keeps no local store), or run serve without --kafka for PRIME_RUNS_MODE=local"
        )


def _open_spool(settings: Settings, ownership: FleetOwnership | None) -> Spool:
    """The spool; a fleet member's has the gate of its ownership in front."""
    options = {"max_bytes": settings.spool_max_bytes, "keep_delivered": settings.keep_delivered}
    if ownership is None:
        return Spool(settings.spool_path, **options)  # type: ignore[arg-type]
    return FleetSpool(settings.spool_path, ownership, **options)


def _kafka_modules() -> tuple[Any, Any]:
    """The Kafka fleet's modules, which need the ``kafka`` extra."""
    try:
        from . import kafka_ingest, kafka_member
    except ImportError as exc:
        raise ConfigError(
            f"serve --kafka needs confluent-kafka ({exc}): pip install 'prime-runs-otel[kafka]'"
        ) from exc
    return kafka_ingest, kafka_member


def run_receiver(config: ReceiverConfig, settings: Settings) -> None:
    """Run ``serve`` in this thread until a stop signal."""
    receiver = Receiver(config, settings)
    asyncio.run(receiver.serve())
