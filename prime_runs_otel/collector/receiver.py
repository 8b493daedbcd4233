"""The OTLP receiver behind ``prime-runs-otel serve``: OTLP/HTTP and OTLP/gRPC
in front of the same exporter core, spool and uploader as the in-process path.

A collector only forgets a batch once the receiver has answered it, so the
answer is sent after the spool commit and never before: a batch that was not
committed is answered with a retryable status (503 / ``UNAVAILABLE`` or
``RESOURCE_EXHAUSTED`` with a retry hint) and the collector keeps it in its
queue. Ingestion is idempotent on episode id, so the retries and duplicates a
collector produces are stored once.

Bad input is answered with a 4xx (``INVALID_ARGUMENT`` over gRPC) saying what
is wrong, because a collector drops a batch answered that way instead of
retrying it forever. Spans of a request that are fine are kept even when
others in it are not: those are reported as ``partial_success``.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import hmac
import ipaddress
import json
import logging
import re
import signal
import socket
import sqlite3
import threading
import time
import zlib
from collections.abc import Awaitable, Callable, Iterator, Mapping, MutableMapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Literal

import grpc
import uvicorn
from google.protobuf import json_format
from google.protobuf.any_pb2 import Any as AnyProto
from google.protobuf.duration_pb2 import Duration
from google.rpc import (  # type: ignore[import-untyped]  # ships .pyi without py.typed
    code_pb2,
    error_details_pb2,
    status_pb2,
)
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTracePartialSuccess,
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

from .. import semconv
from .._text import shown
from ..config import Settings
from ..deliver.spool import IngestOutcome, Spool, SpoolError
from ..deliver.uploader import Uploader
from ..errors import ConfigError
from ..read.ingest import group_by_run
from ..read.otlp import OtlpDecodeError, decode_json, decode_protobuf, span_views
from ..read.records import RunBatch
from ..read.spans import SpanView
from ..read.synthesis import SpanTree, SpanTreeBuffer

logger = logging.getLogger(__name__)

MiB = 1024 * 1024
#: Room for one 64 MiB episode record (the Prime Traces line limit) with its
#: OTLP framing and JSON escaping, plus a few ordinary spans beside it.
DEFAULT_MAX_BODY_BYTES = 256 * MiB
#: A producer that sends nothing for this long and never sent its end span
#: is taken to have crashed. Long enough for slow rollouts between episodes.
DEFAULT_IDLE_TIMEOUT = 3600.0
#: Memory the requests being decoded may take together, estimated as
#: :data:`DECODE_EXPANSION` times each decompressed body (see :class:`DecodeBudget`).
DEFAULT_MEMORY_BYTES = 2048 * MiB
#: What a decoded request takes in memory, at most, per byte of its body:
#: measured at up to 19 for bodies of nothing but tiny attributes (protobuf
#: and OTLP/JSON alike, message and span views together); an ordinary body,
#: mostly long strings, takes 2-3.
DECODE_EXPANSION = 20
#: How long a request body may take to arrive, from its first byte to its last.
DEFAULT_READ_TIMEOUT = 120.0
#: How long in-flight requests may take to finish after a stop signal.
DEFAULT_SHUTDOWN_GRACE = 30.0
#: Requests decoded and committed at once; the rest wait their turn. Spool
#: commits serialise anyway, and each large request holds its body in memory.
DEFAULT_WORKERS = 4
#: Retry hint when the spool is at its cap: delivery frees room at the pace of
#: the platform, so retrying sooner only repeats the refusal.
FULL_RETRY_AFTER = 30
#: Retry hint when a commit failed (a locked or briefly unavailable disk).
COMMIT_RETRY_AFTER = 5
#: How long an episode span without a record waits for the spans under it.
#: A collector batches and sends a trace's spans within seconds of each other
#: (its batch processor flushes every 200 ms by default, at most a few s).
DEFAULT_SETTLE_SECONDS = 5.0
#: Spans held for synthesis at most; past it the oldest trace is let go, its
#: episodes synthesised from what arrived and counted incomplete.
DEFAULT_MAX_HELD_SPANS = 100_000
TOKEN_ENV = "PRIME_RUNS_OTEL_SERVE_TOKEN"
TRACES_PATH = "/v1/traces"
GRPC_SERVICE = "opentelemetry.proto.collector.trace.v1.TraceService"

_PROTOBUF_TYPES = ("application/x-protobuf", "application/protobuf")
_JSON_TYPE = "application/json"

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]


# -- configuration ----------------------------------------------------------------


@dataclass(frozen=True)
class ReceiverConfig:
    """How ``serve`` listens. ``grpc_port=None`` turns gRPC off; port 0 picks
    a free port (read it back from :attr:`Receiver.http_port`)."""

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
        if self.memory_bytes < 1:
            raise ConfigError("serve needs some memory to decode requests in")
        if self.read_timeout <= 0:
            raise ConfigError("the time a request body may take must be positive")
        if self.settle_seconds < 0:
            raise ConfigError("the wait for an episode's spans cannot be negative")
        if self.max_held_spans < 1:
            raise ConfigError("serve must be able to hold at least one span for synthesis")


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


# -- the transport-free core ----------------------------------------------------------


@dataclass(frozen=True)
class Verdict:
    """What to answer for one export request, whatever the transport.

    ``accepted``: committed (``rejected`` spans, if any, are reported as
    partial success); ``invalid``: nothing of it can ever be accepted;
    ``full`` / ``unavailable``: nothing was committed, retry after
    ``retry_after`` seconds.
    """

    outcome: Literal["accepted", "invalid", "full", "unavailable"]
    message: str = ""
    rejected: int = 0
    retry_after: int | None = None


class _WatchedTrees(SpanTreeBuffer):
    """A span buffer that remembers which episodes its last release let go,
    so a failed commit can keep exactly those: the collector's retry brings
    the request's own spans again, but never an episode already released."""

    released: frozenset[str] = frozenset()

    def release(self, *, flush: bool = False) -> list[SpanTree]:
        trees = super().release(flush=flush)
        self.released = frozenset(tree.root.episode_id for tree in trees)
        return trees


class SpanIntake:
    """Export requests → spool commits, shared by the HTTP and gRPC fronts.

    Episode spans without a record wait in :attr:`trees` for the spans under
    them, which a collector may send in later requests; :meth:`release_settled`
    (on a timer) and :meth:`flush` (at shutdown) let them go. A run's end is
    held back while episodes of the run are, so the run is never closed
    before its last synthesised episode is in the spool. The buffer lives in
    memory only: spans it holds when the process dies are lost with it, which
    is why the wait is seconds, not minutes.

    Buffer work and the commit after it run under one lock, so what the
    buffer releases reaches the spool in order; the spool serialises commits
    anyway, so the lock costs no parallelism beyond the record checks.
    """

    def __init__(
        self,
        spool: Spool,
        settings: Settings,
        uploader: Uploader | None,
        *,
        settle_seconds: float = DEFAULT_SETTLE_SECONDS,
        max_held_spans: int = DEFAULT_MAX_HELD_SPANS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.spool = spool
        self.settings = settings
        self._uploader = uploader
        self.trees = _WatchedTrees(
            settle_seconds=settle_seconds, max_spans=max_held_spans, clock=clock
        )
        self._lock = threading.Lock()
        #: Run ends waiting for the run's held episodes, by run key.
        self._held_ends: dict[str, RunBatch] = {}
        #: Released episodes (and run ends) whose commit failed, retried first.
        self._uncommitted: list[RunBatch] = []
        self._report = _BufferReport(self.trees, clock)
        #: Items of the last commit refused on their own (see :meth:`_commit`).
        self._refused = 0
        #: Why the last commit failed, until one succeeds: readiness says so.
        self.commit_problem: str | None = None

    def has_room(self) -> bool:
        return self.spool.size_bytes() < self.spool.max_bytes

    def accept(self, request: ExportTraceServiceRequest) -> Verdict:
        views = list(span_views(request))
        with self._lock:
            # Checked before the buffer sees the spans, so a refused batch
            # leaves no trace: the collector retries it, and it is not counted
            # lost meanwhile.
            if not self.has_room() and any(map(_is_episode_span, views)):
                return self._full()
            grouped = group_by_run(views, trees=self.trees)
            self._report.update()
            self._refused = 0
            if grouped.unattributed and not grouped.batches and not self._uncommitted:
                return Verdict(
                    "invalid",
                    f"{grouped.unattributed} episode span(s) carry no {semconv.RUN_ID} on "
                    "their Resource, so they belong to no run; set it with run_resource(...) "
                    f"or OTEL_RESOURCE_ATTRIBUTES={semconv.RUN_ID}=<run key>",
                )
            try:
                outcome = self._commit(grouped.batches)
            except _TRANSIENT as exc:
                logger.error("Committing a batch to the spool %s failed: %s", self.spool.path, exc)
                return Verdict(
                    "unavailable",
                    f"the batch could not be committed to the spool ({exc}); retry later",
                    retry_after=COMMIT_RETRY_AFTER,
                )
        if outcome.rejected:
            return self._full()
        corrupt = sum(len(batch.corrupt) for batch in grouped.batches)
        unreadable = grouped.unreadable + self._refused
        self._refused = 0
        return Verdict(
            "accepted",
            _rejection_message(grouped.unattributed, corrupt, unreadable),
            rejected=grouped.unattributed + corrupt + unreadable,
        )

    def release_settled(self) -> None:
        """Commit the episodes that waited long enough for their spans.

        While the spool is full they wait on (the buffer's bound still
        holds): released now, they would only be refused and counted lost.
        """
        with self._lock:
            idle = not (len(self.trees) or self.trees.pending_episodes or self._uncommitted)
            if (idle and not self._held_ends) or not self.has_room():
                return
            grouped = group_by_run((), trees=self.trees)
            self._report.update()
            try:
                self._commit(grouped.batches)
            except _TRANSIENT as exc:
                logger.error(
                    "Committing synthesised episodes to the spool %s failed (%s); retrying",
                    self.spool.path,
                    exc,
                )

    def flush(self) -> None:
        """Commit every episode still held, with the spans that arrived for it
        (the process is stopping), and report what synthesis could not keep."""
        with self._lock:
            grouped = group_by_run((), trees=self.trees, flush=True)
            try:
                self._commit(grouped.batches)
            except _TRANSIENT as exc:
                episodes = sum(len(batch.episodes) for batch in self._uncommitted)
                logger.error(
                    "Stopping: %d synthesised episode(s) could not be committed to the spool "
                    "%s and are lost: %s",
                    episodes,
                    self.spool.path,
                    exc,
                )
            self._report.summary()

    def _commit(self, batches: list[RunBatch]) -> IngestOutcome:
        """Commit ``batches`` after anything whose commit failed before, with
        run ends held back until their runs' episodes are out of the buffer."""
        ends = self._ends_ready(batches)
        pending = [*self._uncommitted, *batches, *ends]
        if not pending:
            return IngestOutcome()
        try:
            outcome = self.spool.ingest(pending, mode=self.settings.mode, register_producer=False)
        except _TRANSIENT as exc:
            # The disk, not the items: keep what nothing else would bring again.
            self._uncommitted = [*self._uncommitted, *_released_part(batches, self.trees), *ends]
            self.commit_problem = f"commits to the spool fail: {exc}"
            raise
        except Exception as exc:
            # Something in the items: commit them one by one, so the one that
            # cannot be stored costs itself only, never the requests after it.
            logger.warning(
                "A batch could not be committed as a whole (%s: %s); committing its items "
                "one by one",
                type(exc).__name__,
                shown(exc),
            )
            outcome = self._commit_each(pending)
        self._uncommitted = []
        self.commit_problem = None
        if self._uploader is not None:
            self._uploader.wake()
        return outcome

    def _commit_each(self, pending: list[RunBatch]) -> IngestOutcome:
        """Commit every item of ``pending`` alone; refuse (count and name) the
        ones that fail on their own. A transient failure stops it, the items
        not yet committed kept for the retry."""
        rejected = refused = 0
        items = [item for batch in pending for item in _items_of(batch)]
        for index, item in enumerate(items):
            try:
                outcome = self.spool.ingest(
                    [item], mode=self.settings.mode, register_producer=False
                )
            except _TRANSIENT as exc:
                self._uncommitted = items[index:]
                self.commit_problem = f"commits to the spool fail: {exc}"
                raise
            except Exception as exc:
                self._refused += 1
                refused += 1
                if refused <= 5:
                    logger.warning(
                        "Run %s: refused %s that cannot be stored: %s: %s",
                        shown(item.identity.local_id),
                        _describe(item),
                        type(exc).__name__,
                        shown(exc),
                    )
                continue
            rejected += outcome.rejected
        if refused > 5:
            logger.warning("%d more item(s) of the batch were refused the same way", refused - 5)
        return IngestOutcome(rejected=rejected)

    def _ends_ready(self, batches: list[RunBatch]) -> list[RunBatch]:
        """Hold back the ends of runs with episodes still in the buffer; return
        the held ends whose runs have none left."""
        waiting = {_run_key(episode.view.resource) for episode in self.trees.held_episodes()}
        for batch in batches:
            key = batch.identity.local_id
            if batch.end is not None and key in waiting:
                self._held_ends[key] = RunBatch(identity=batch.identity, end=batch.end)
                batch.end = None
        ready = [key for key in self._held_ends if key not in waiting]
        return [self._held_ends.pop(key) for key in ready]

    def _full(self) -> Verdict:
        return Verdict(
            "full",
            f"the spool is at its cap of {self.spool.max_bytes} bytes until delivery frees "
            f"room; retry later (or raise PRIME_RUNS_OTEL_SPOOL_MAX_BYTES on the receiver)",
            retry_after=FULL_RETRY_AFTER,
        )


#: Commit failures of the disk or the database, not of what was committed:
#: the batch is kept (or the collector retries it).
_TRANSIENT = (SpoolError, sqlite3.OperationalError, OSError, MemoryError)


def _items_of(batch: RunBatch) -> list[RunBatch]:
    """``batch`` as one batch per item, in the order the spool takes them."""
    identity = batch.identity
    items = [
        RunBatch(
            identity=identity,
            start=batch.start,
            corrupt=batch.corrupt,
            corrupt_metrics=batch.corrupt_metrics,
        )
    ]
    items += [RunBatch(identity=identity, episodes=[episode]) for episode in batch.episodes]
    items += [RunBatch(identity=identity, metrics=[metrics]) for metrics in batch.metrics]
    if batch.end is not None:
        items.append(RunBatch(identity=identity, end=batch.end))
    return items


def _describe(item: RunBatch) -> str:
    if item.episodes:
        return f"episode {shown(item.episodes[0].episode_id)}"
    if item.metrics:
        return f"the metrics of step {item.metrics[0].step}"
    if item.end is not None:
        return "the run's end"
    return "the run's start"


def _is_episode_span(view: SpanView) -> bool:
    attributes = view.attributes
    return semconv.EPISODE_ID in attributes or semconv.EPISODE_EXAMPLE_ID in attributes


def _run_key(resource: Mapping[str, Any]) -> str | None:
    key = resource.get(semconv.RUN_ID)
    return key if isinstance(key, str) and key else None


def _released_part(batches: list[RunBatch], trees: _WatchedTrees) -> list[RunBatch]:
    """The episodes of ``batches`` the buffer released (synthesised ones):
    nothing else would bring them again after a failed commit."""
    kept = []
    for batch in batches:
        episodes = [item for item in batch.episodes if item.episode_id in trees.released]
        if episodes:
            kept.append(RunBatch(identity=batch.identity, episodes=episodes))
    return kept


class _BufferReport:
    """Logs what the span buffer let go unused. Model-call spans under no
    episode span are reported at most once a minute: a collector that also
    forwards an application's other GenAI traces would flood the log."""

    INTERVAL = 60.0

    def __init__(self, trees: SpanTreeBuffer, clock: Callable[[], float]) -> None:
        self._trees = trees
        self._clock = clock
        self._reported_unclaimed = 0
        self._quiet_until = 0.0

    def update(self) -> None:
        stats = self._trees.stats
        unclaimed = stats.unclaimed_model_calls - self._reported_unclaimed
        now = self._clock()
        if unclaimed <= 0 or now < self._quiet_until:
            return
        self._reported_unclaimed = stats.unclaimed_model_calls
        self._quiet_until = now + self.INTERVAL
        logger.warning(
            "%d model-call span(s) arrived under no episode span within %gs and were let go "
            "(%d so far). To report them as episodes, wrap each rollout in "
            "prime_runs_otel.instrument.episode_span(...) in the producer.",
            unclaimed,
            self._trees.max_wait_seconds,
            stats.unclaimed_model_calls,
        )

    def summary(self) -> None:
        stats = self._trees.stats
        self._quiet_until = 0.0
        self.update()
        if stats.incomplete_episodes or stats.late_spans or stats.evicted_spans:
            logger.warning(
                "Episode synthesis: %d episode(s) went out without all of their spans; %d "
                "span(s) arrived after their episode, %d were dropped to stay within %d held "
                "spans",
                stats.incomplete_episodes,
                stats.late_spans,
                stats.evicted_spans,
                self._trees.max_spans,
            )


def _rejection_message(unattributed: int, corrupt: int, unreadable: int = 0) -> str:
    parts = []
    if unreadable:
        parts.append(
            f"{unreadable} span(s) or item(s) that could not be read or stored (the "
            "receiver's log names each and says why)"
        )
    if unattributed:
        parts.append(f"{unattributed} episode span(s) without {semconv.RUN_ID} on their Resource")
    if corrupt:
        parts.append(
            f"{corrupt} episode record(s) damaged on the way (an attribute limit in an SDK or "
            "collector?); they are counted as lost on their run"
        )
    return "; ".join(parts)


def _wire_text(message: str) -> str:
    """``message`` as text protobuf can carry: a message may quote the
    client's input, lone surrogates and all."""
    return message.encode("utf-8", "backslashreplace").decode("utf-8")


def export_response(verdict: Verdict) -> ExportTraceServiceResponse:
    response = ExportTraceServiceResponse()
    if verdict.rejected or verdict.message:
        response.partial_success.CopyFrom(
            ExportTracePartialSuccess(
                rejected_spans=verdict.rejected, error_message=_wire_text(verdict.message)
            )
        )
    return response


# -- request bodies ---------------------------------------------------------------------


class BodyError(Exception):
    """A request the HTTP front refuses before decoding it."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


def decompress(body: bytes, encoding: str, limit: int) -> bytes:
    """Undo ``Content-Encoding``, refusing to inflate past ``limit`` bytes
    (a small gzip body can expand to gigabytes)."""
    encoding = encoding.strip().lower()
    if encoding in ("", "identity"):
        return body
    if encoding == "gzip":
        return _inflate(body, 16 + zlib.MAX_WBITS, limit, "gzip")
    if encoding == "deflate":
        # "deflate" is zlib-wrapped by the HTTP spec; some clients send it raw.
        try:
            return _inflate(body, zlib.MAX_WBITS, limit, "deflate")
        except BodyError as exc:
            if exc.status == 413:
                raise
            return _inflate(body, -zlib.MAX_WBITS, limit, "deflate")
    raise BodyError(
        415,
        f"Content-Encoding {encoding!r} is not supported; send gzip, deflate or no encoding",
    )


def _inflate(body: bytes, wbits: int, limit: int, name: str) -> bytes:
    """Inflate every member of ``body`` in time linear in its length.

    zlib hands back what follows a finished member as a copy
    (``unused_data``); fed the whole rest of the body, a body of many tiny
    members would be copied once per member. So input is fed in pieces that
    start small and grow only while one member goes on: a member costs its
    own length plus one small piece.
    """
    out = bytearray()
    view = memoryview(body)
    position = 0
    members = wbits > zlib.MAX_WBITS  # gzip allows several; a zlib stream ends once
    while position < len(body):
        inflater = zlib.decompressobj(wbits)
        piece = _FIRST_PIECE
        while not inflater.eof:
            if position >= len(body):
                raise BodyError(400, f"the {name} body is truncated")
            chunk = view[position : position + piece]
            position += len(chunk)
            try:
                out += inflater.decompress(chunk, limit + 1 - len(out))
            except zlib.error as exc:
                raise BodyError(400, f"the {name} body cannot be decompressed ({exc})") from None
            if len(out) > limit or inflater.unconsumed_tail:
                raise _too_large(limit, "decompressed")
            piece = min(piece * 2, _LAST_PIECE)
        position -= len(inflater.unused_data)
        if not members:
            break
        padding_end = _NOT_NUL.search(body, position)  # zeros may pad between members
        position = padding_end.start() if padding_end else len(body)
    return bytes(out)


_NOT_NUL = re.compile(rb"[^\0]")
_FIRST_PIECE = 256
_LAST_PIECE = 1024 * 1024


def _too_large(limit: int, what: str) -> BodyError:
    return BodyError(
        413,
        f"the {what} body is over the receiver's limit of {limit} bytes; raise "
        "`serve --max-body-mib`, or lower the collector's batch size",
    )


def decode_body(body: bytes, content_type: str) -> ExportTraceServiceRequest:
    if content_type == _JSON_TYPE:
        return decode_json(body)
    return decode_protobuf(body)


def media_type(header: str) -> str | None:
    """``application/x-protobuf`` or ``application/json``, or ``None``."""
    value = header.split(";", 1)[0].strip().lower()
    if value in _PROTOBUF_TYPES:
        return _PROTOBUF_TYPES[0]
    if value == _JSON_TYPE:
        return _JSON_TYPE
    return None


def bearer_matches(header: str | None, token: str | None) -> bool:
    if not token:
        return True
    if header is None:
        return False
    scheme, _, value = header.strip().partition(" ")
    # As bytes: compare_digest refuses text that is not ASCII, and a header
    # is whatever the client sent.
    given = value.strip().encode("utf-8", "surrogatepass")
    return scheme.lower() == "bearer" and hmac.compare_digest(given, token.encode("utf-8"))


# -- memory ------------------------------------------------------------------------------


class DecodeBudget:
    """Admits requests to decoding while their worst-case memory fits.

    A decoded request takes up to :data:`DECODE_EXPANSION` times its body
    (every tiny attribute becomes an object of its own), so four workers at
    the body cap could want gigabytes at once. Each request reserves its
    worst case before it is decoded and waits while the others' reservations
    leave no room; a request alone is always admitted, so one larger than the
    whole budget still goes through, only never beside another.
    """

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._reserved = 0
        self._admitted = 0
        self._room = threading.Condition()

    @contextlib.contextmanager
    def reserve(self, body_bytes: int) -> Iterator[None]:
        need = body_bytes * DECODE_EXPANSION
        with self._room:
            while self._admitted and self._reserved + need > self.limit:
                self._room.wait()
            self._reserved += need
            self._admitted += 1
        try:
            yield
        finally:
            with self._room:
                self._reserved -= need
                self._admitted -= 1
                self._room.notify_all()


# -- OTLP/HTTP ---------------------------------------------------------------------------

_GRPC_CODE_OF_STATUS = {
    400: code_pb2.INVALID_ARGUMENT,
    401: code_pb2.UNAUTHENTICATED,
    404: code_pb2.NOT_FOUND,
    405: code_pb2.UNIMPLEMENTED,
    408: code_pb2.DEADLINE_EXCEEDED,
    413: code_pb2.RESOURCE_EXHAUSTED,
    415: code_pb2.INVALID_ARGUMENT,
    503: code_pb2.UNAVAILABLE,
}


class OtlpHttpApp:
    """A minimal ASGI app: ``POST /v1/traces``, ``GET /healthz``, ``GET /readyz``.

    Request bodies are read and decoded off the event loop (decoding a large
    batch is CPU-bound, the commit is blocking SQLite), so health checks stay
    responsive while a 64 MiB episode is being committed.
    """

    def __init__(self, receiver: Receiver) -> None:
        self._receiver = receiver
        self._config = receiver.config

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        path = scope["path"].rstrip("/") or "/"
        method = scope["method"]
        if path in ("/healthz", "/readyz"):
            if method not in ("GET", "HEAD"):
                await _send_json(send, 405, {"error": "use GET"}, allow="GET")
                return
            await self._health(send, ready=path == "/readyz")
            return
        if path != TRACES_PATH:
            await _send_status(
                send, 404, f"no such endpoint {path!r}; OTLP traces go to POST {TRACES_PATH}", None
            )
            return
        if method != "POST":
            await _send_status(send, 405, f"{TRACES_PATH} takes POST", None, allow="POST")
            return
        self._receiver.in_flight += 1
        try:
            await self._export(scope, receive, send)
        finally:
            self._receiver.in_flight -= 1

    async def _health(self, send: Send, *, ready: bool) -> None:
        if not ready:
            await _send_json(send, 200, {"status": "ok", "in_flight": self._receiver.in_flight})
            return
        problem = self._receiver.not_ready_reason()
        if problem is None:
            await _send_json(send, 200, {"status": "ready"})
        else:
            await _send_json(send, 503, {"status": "not ready", "reason": problem})

    async def _export(self, scope: Scope, receive: Receive, send: Send) -> None:
        headers = _headers(scope)
        content_type = media_type(headers.get("content-type", ""))
        if not bearer_matches(headers.get("authorization"), self._config.token):
            await _drain(receive, self._config.max_body_bytes)
            await _send_status(
                send,
                401,
                "missing or wrong bearer token: send 'Authorization: Bearer <token>' with the "
                f"token serve was started with (--token or {TOKEN_ENV})",
                content_type,
                www_authenticate='Bearer realm="prime-runs-otel"',
            )
            return
        if content_type is None:
            await _drain(receive, self._config.max_body_bytes)
            await _send_status(
                send,
                415,
                f"Content-Type {headers.get('content-type', '(none)')!r} is not OTLP; send "
                "application/x-protobuf or application/json",
                None,
            )
            return
        try:
            body = await _read_body(
                receive, headers, self._config.max_body_bytes, self._config.read_timeout
            )
            verdict = await self._receiver.run_blocking(
                self._receiver.handle_http_body,
                body,
                headers.get("content-encoding", ""),
                content_type,
            )
        except BodyError as exc:
            logger.warning("Refused an OTLP/HTTP request: %s", exc.message)
            await _send_status(send, exc.status, exc.message, content_type)
            return
        await _send_verdict(send, verdict, content_type)


def _headers(scope: Scope) -> dict[str, str]:
    return {
        name.decode("latin-1").lower(): value.decode("latin-1")
        for name, value in scope.get("headers", [])
    }


async def _read_body(
    receive: Receive, headers: dict[str, str], limit: int, timeout: float = DEFAULT_READ_TIMEOUT
) -> bytes:
    """The whole body, refused as soon as it is known to be too large (from
    ``Content-Length`` before a byte of it is read), and given ``timeout``
    seconds in all: a client that trickles a body in holds its memory and
    connection, so it does not get to hold them for ever."""
    declared = headers.get("content-length")
    if declared is not None:
        if "transfer-encoding" in headers:
            raise BodyError(
                400, "the request has both Content-Length and Transfer-Encoding; send one"
            )
        if not (declared.isascii() and declared.isdigit()):
            raise BodyError(400, f"Content-Length {shown(declared, 40)!r} is not a number")
        if int(declared) > limit:
            raise _too_large(limit, "request")
    try:
        return await asyncio.wait_for(_read_chunks(receive, limit), timeout)
    except asyncio.TimeoutError:
        raise BodyError(
            408, f"the body did not arrive within {timeout:g}s; send it at once"
        ) from None


async def _read_chunks(receive: Receive, limit: int) -> bytes:
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise BodyError(400, "the client went away before sending the whole body")
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise _too_large(limit, "request")
        chunks.append(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks)


_DRAIN_BYTES = 4 * MiB
_DRAIN_SECONDS = 5.0


async def _drain(receive: Receive, limit: int) -> None:
    """Read (and drop) what is left of a refused body, so the client reads the
    answer instead of a connection reset mid-upload; past a small budget (or
    a few seconds) the connection is closed on it instead: a refused client
    gets no more of the receiver's time than it takes to tell it why."""
    budget = min(4 * limit, _DRAIN_BYTES)
    while budget > 0:
        try:
            message = await asyncio.wait_for(receive(), _DRAIN_SECONDS)
        except asyncio.TimeoutError:
            return
        if message["type"] != "http.request" or not message.get("more_body", False):
            return
        budget -= len(message.get("body", b""))


async def _send_verdict(send: Send, verdict: Verdict, content_type: str) -> None:
    if verdict.outcome == "accepted":
        response = export_response(verdict)
        await _send(send, 200, _encode(response, content_type), content_type)
        return
    if verdict.outcome == "invalid":
        logger.warning("Refused an OTLP/HTTP request: %s", verdict.message)
        await _send_status(send, 400, verdict.message, content_type)
        return
    await _send_status(
        send, 503, verdict.message, content_type, retry_after=str(verdict.retry_after or 1)
    )


async def _send_status(
    send: Send,
    status: int,
    message: str,
    content_type: str | None,
    **extra_headers: str,
) -> None:
    """An OTLP error answer: a ``google.rpc.Status`` in the request's encoding."""
    body_type = content_type or _JSON_TYPE
    payload = status_pb2.Status(
        code=_GRPC_CODE_OF_STATUS.get(status, 2), message=_wire_text(message)
    )
    await _send(send, status, _encode(payload, body_type), body_type, **extra_headers)


async def _send_json(send: Send, status: int, payload: Any, **extra_headers: str) -> None:
    await _send(send, status, json.dumps(payload).encode(), _JSON_TYPE, **extra_headers)


async def _send(
    send: Send, status: int, body: bytes, content_type: str, **extra_headers: str
) -> None:
    headers = [
        (b"content-type", content_type.encode()),
        (b"content-length", str(len(body)).encode()),
    ]
    headers += [
        (name.replace("_", "-").encode(), value.encode()) for name, value in extra_headers.items()
    ]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def _encode(message: Any, content_type: str) -> bytes:
    if content_type == _JSON_TYPE:
        return json_format.MessageToJson(message, indent=None).encode()
    data: bytes = message.SerializeToString()
    return data


# -- OTLP/gRPC ---------------------------------------------------------------------------


class _GrpcStatus(
    collections.namedtuple("_GrpcStatus", ("code", "details", "trailing_metadata")),
    grpc.Status,
):
    """A gRPC status with rich details (``RetryInfo``), without grpcio-status."""


def _grpc_status(code: grpc.StatusCode, message: str, retry_after: int | None) -> _GrpcStatus:
    message = _wire_text(message)
    details = status_pb2.Status(code=code.value[0], message=message)
    if retry_after is not None:
        hint = AnyProto()
        hint.Pack(error_details_pb2.RetryInfo(retry_delay=Duration(seconds=retry_after)))
        details.details.append(hint)
    metadata = (("grpc-status-details-bin", details.SerializeToString()),)
    return _GrpcStatus(code, message, metadata)


class OtlpGrpcService:
    """``TraceService/Export`` over raw bytes, so a malformed request is
    answered ``INVALID_ARGUMENT`` by this code rather than by the framework."""

    def __init__(self, receiver: Receiver) -> None:
        self._receiver = receiver

    def handler(self) -> grpc.GenericRpcHandler:
        return grpc.method_handlers_generic_handler(
            GRPC_SERVICE,
            {
                "Export": grpc.unary_unary_rpc_method_handler(
                    self.export,
                    request_deserializer=None,
                    response_serializer=ExportTraceServiceResponse.SerializeToString,
                )
            },
        )

    def export(self, body: bytes, context: grpc.ServicerContext) -> ExportTraceServiceResponse:
        token = self._receiver.config.token
        metadata = dict(context.invocation_metadata())
        header = metadata.get("authorization")
        if not bearer_matches(header if isinstance(header, str) else None, token):
            context.abort_with_status(
                _grpc_status(
                    grpc.StatusCode.UNAUTHENTICATED,
                    "missing or wrong bearer token in the 'authorization' metadata",
                    None,
                )
            )
        verdict = self._accept(body)
        if verdict.outcome == "accepted":
            return export_response(verdict)
        code = {
            "invalid": grpc.StatusCode.INVALID_ARGUMENT,
            "full": grpc.StatusCode.RESOURCE_EXHAUSTED,
            "unavailable": grpc.StatusCode.UNAVAILABLE,
        }[verdict.outcome]
        if verdict.outcome == "invalid":
            logger.warning("Refused an OTLP/gRPC request: %s", verdict.message)
        context.abort_with_status(_grpc_status(code, verdict.message, verdict.retry_after))
        raise AssertionError("abort_with_status() returns only by raising")

    def _accept(self, body: bytes) -> Verdict:
        with self._receiver.memory.reserve(len(body)):
            try:
                request = decode_protobuf(body)
            except OtlpDecodeError as exc:
                return Verdict("invalid", str(exc))
            return self._receiver.intake.accept(request)


# -- the server ------------------------------------------------------------------------------


class _HttpServer(uvicorn.Server):
    """uvicorn, with the receiver's own shutdown steps around its drain."""

    def __init__(self, config: uvicorn.Config, receiver: Receiver) -> None:
        super().__init__(config)
        self._receiver = receiver

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        grpc_stopped = self._receiver.begin_stop()
        await super().shutdown(sockets)
        await asyncio.to_thread(grpc_stopped.wait, self._receiver.config.shutdown_grace + 1)

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        """Stop on SIGINT/SIGTERM like uvicorn, without re-raising the signal
        afterwards: the receiver still has its uploader to stop."""
        with contextlib.ExitStack() as restore:
            if threading.current_thread() is threading.main_thread():
                for sig in (signal.SIGINT, signal.SIGTERM):
                    previous = signal.signal(sig, self.handle_exit)
                    restore.callback(signal.signal, sig, previous)
            yield


class Receiver:
    """One ``serve`` process: spool, uploader, HTTP and gRPC fronts."""

    def __init__(self, config: ReceiverConfig, settings: Settings) -> None:
        config.validate()
        if settings.mode == "disabled":
            raise ConfigError(
                "serve cannot run with PRIME_RUNS_MODE=disabled: it would accept spans and "
                "drop them. Use online (with an API key) or local."
            )
        self.config = config
        self.settings = settings
        self.spool = Spool(settings.spool_path, max_bytes=settings.spool_max_bytes)
        self.uploader = Uploader(self.spool, settings, idle_timeout=config.idle_timeout)
        self.intake = SpanIntake(
            self.spool,
            settings,
            self.uploader,
            settle_seconds=config.settle_seconds,
            max_held_spans=config.max_held_spans,
        )
        self.memory = DecodeBudget(config.memory_bytes)
        self._releasing = threading.Event()
        self._releaser = threading.Thread(
            target=self._release_loop, name="otlp-synthesis", daemon=True
        )
        self._executor = ThreadPoolExecutor(config.workers, thread_name_prefix="otlp-intake")
        self._http_socket = _listen(config.host, config.http_port)
        self.http_port: int = self._http_socket.getsockname()[1]
        self.grpc_port: int | None = None
        self._grpc: grpc.Server | None = None
        self._grpc_executor = ThreadPoolExecutor(config.workers, thread_name_prefix="otlp-grpc")
        if config.grpc_port is not None:
            self._grpc, self.grpc_port = self._grpc_server(config.grpc_port)
        self._stopped: threading.Event | None = None
        #: OTLP/HTTP requests being read or committed (shown on /healthz).
        self.in_flight = 0
        self._server = _HttpServer(
            uvicorn.Config(
                OtlpHttpApp(self),
                log_level="warning",
                access_log=False,
                lifespan="off",
                ws="none",
                timeout_graceful_shutdown=int(config.shutdown_grace),
                server_header=False,
            ),
            self,
        )

    def _grpc_server(self, port: int) -> tuple[grpc.Server, int]:
        server = grpc.server(
            self._grpc_executor,
            handlers=[OtlpGrpcService(self).handler()],
            options=[
                ("grpc.max_receive_message_length", self.config.max_body_bytes),
                ("grpc.max_send_message_length", 4 * MiB),
                ("grpc.so_reuseport", 0),
            ],
            maximum_concurrent_rpcs=self.config.workers * 4,
        )
        host = self.config.host
        address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        try:
            bound = server.add_insecure_port(address)
        except RuntimeError as exc:
            bound = 0
            reason = str(exc)
        else:
            reason = "the address is in use or not available"
        if not bound:
            self._http_socket.close()
            raise ConfigError(
                f"cannot listen for OTLP/gRPC on {address}: {reason}. Pick another "
                "--grpc-port, or turn gRPC off with --no-grpc."
            )
        return server, bound

    # -- running ------------------------------------------------------------------

    async def serve(self) -> None:
        """Serve until SIGINT/SIGTERM or :meth:`stop`, then drain and stop."""
        self.uploader.start()
        self._releaser.start()
        if self._grpc is not None:
            self._grpc.start()
        logger.info(
            "prime-runs-otel serve: OTLP/HTTP on http://%s:%d%s%s; runs go to %s (spool %s)",
            self.config.host,
            self.http_port,
            TRACES_PATH,
            f", OTLP/gRPC on {self.config.host}:{self.grpc_port}" if self.grpc_port else "",
            "the platform" if self.settings.mode == "online" else "the local store",
            self.spool.path,
        )
        try:
            await self._server.serve(sockets=[self._http_socket])
        finally:
            # Each step on its own: whatever went wrong while serving, the
            # held episodes are still committed and the spool still closed.
            for step in (
                lambda: self.begin_stop().wait(self.config.shutdown_grace + 1),
                lambda: self._executor.shutdown(wait=True),
                lambda: self._grpc_executor.shutdown(wait=True),
                self._stop_releasing,
                self.intake.flush,
                lambda: self.uploader.stop(timeout=self.config.shutdown_grace),
                self._http_socket.close,
                self.spool.close,
            ):
                try:
                    step()
                except Exception as exc:
                    logger.error(
                        "Stopping: a step failed (%s: %s); going on", type(exc).__name__, shown(exc)
                    )

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

    def not_ready_reason(self) -> str | None:
        if self._stopped is not None:
            return "shutting down"
        if not self.uploader.running:
            return "the uploader is not running"
        if self.intake.commit_problem is not None:
            return self.intake.commit_problem
        if not self.intake.has_room():
            return "the spool is at its cap; delivery has to free room first"
        return None

    async def run_blocking(self, function: Callable[..., Verdict], *args: Any) -> Verdict:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, function, *args)

    def handle_http_body(self, body: bytes, encoding: str, content_type: str) -> Verdict:
        """Decompress, decode and commit one OTLP/HTTP body (on a worker thread)."""
        data = decompress(body, encoding, self.config.max_body_bytes)
        with self.memory.reserve(len(data)):
            try:
                request = decode_body(data, content_type)
            except OtlpDecodeError as exc:
                raise BodyError(400, str(exc)) from None
            del data
            return self.intake.accept(request)


def _listen(host: str, port: int) -> socket.socket:
    """Bind the HTTP socket up front, so a port in use is a clear error at
    start-up, and port 0 gives a known port before serving."""
    try:
        family, kind, proto, _, address = socket.getaddrinfo(
            host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )[0]
        sock = socket.socket(family, kind, proto)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(2048)
    except OSError as exc:
        raise ConfigError(
            f"cannot listen for OTLP/HTTP on {host}:{port}: {exc}. Pick another --http-port."
        ) from None
    sock.setblocking(False)
    return sock


def run_receiver(config: ReceiverConfig, settings: Settings) -> None:
    """Run ``serve`` in this thread until a stop signal."""
    receiver = Receiver(config, settings)
    asyncio.run(receiver.serve())
