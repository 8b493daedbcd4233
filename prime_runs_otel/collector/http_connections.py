"""The HTTP front's connections: how many may be open, how long one may stay
silent, and what happens when the process runs out of descriptors.

uvicorn closes an idle keep-alive connection, but not one that never sends
a request or stops in the middle of its headers: anyone who can reach the
port could hold descriptors for ever, until real exports and ``/healthz``
can no longer be accepted. So each connection here gets a deadline for the
head of each request (:data:`HEADER_TIMEOUT`), the open connections are
capped below the descriptor limit, and a connection past the cap is still
read, briefly: a health check on it is answered, an export gets 503 with
``Retry-After`` (see :mod:`.http_front`), and either way it is closed.

When descriptors run out anyway (gRPC connections, other files), asyncio
logs every failed ``accept()``, up to 2048 per second with a traceback each;
:func:`quiet_accept_errors` turns that into one line a minute.
"""

from __future__ import annotations

import asyncio
import logging
import resource
from typing import Any

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

from .admission import QuietLog

logger = logging.getLogger(__name__)

#: Seconds an open connection past the cap has for its request head.
OVER_CAP_HEADER_TIMEOUT = 1.0
#: Seconds an idle keep-alive connection stays open between requests.
KEEP_ALIVE_TIMEOUT = 15.0
#: Descriptors kept out of the HTTP connection cap: the spool, the log, the
#: platform client, gRPC's own; gRPC connections share the other half.
RESERVED_DESCRIPTORS = 64
#: The key in a request's ASGI ``state`` that says its connection is past the cap.
OVER_CAP = "prime_runs_otel.over_connection_cap"


def raise_descriptor_limit() -> int:
    """Raise this process's soft descriptor limit to its hard one (a server's
    usual first step: the soft default, often 1024, is a shell's, not a
    server's); returns the limit in force."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or soft < hard:
        wanted = 1 << 20 if hard == resource.RLIM_INFINITY else hard
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
            soft = wanted
        except (ValueError, OSError):
            pass
    return int(soft)


def connection_cap(max_connections: int, descriptors: int) -> int:
    """HTTP connections open at once: ``--max-connections``, or half the
    descriptors left beside serve's own if that is fewer."""
    return max(8, min(max_connections, (descriptors - RESERVED_DESCRIPTORS) // 2))


class GuardedConnection(H11Protocol):
    """uvicorn's h11 connection with a deadline for each request head and a
    cap on the connections open at once (both set by :func:`guarded_connection`).

    A subclass of uvicorn's protocol class, given through its public
    ``Config(http=...)`` option, because nothing public does this: uvicorn
    has no timeout for a request's head (``--timeout-request-start``, asked
    for in encode/uvicorn#157, its pull request #1685 closed unmerged);
    ``timeout_keep_alive`` is re-armed by every byte and ``limit_concurrency``
    answers every request 503 past its limit, health checks included; and an
    ASGI middleware runs only once a head is whole. It leans on the
    protocol's ``conn`` (the h11 state), ``connections``, ``app_state``,
    ``transport`` and ``loop``: a uvicorn upgrade is checked by
    tests/test_serve_connections.py.

    The deadline runs from the connection's opening, and again from the
    first byte of each later request head: a silent connection and a head
    that stops half-way are both closed when it passes.
    """

    cap = 1000
    header_timeout = 10.0

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._head_deadline: asyncio.TimerHandle | None = None
        self._timeout = self.header_timeout

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        if len(self.connections) > self.cap:
            # Read just enough to answer a health check; anything else is
            # told to come back (see OtlpHttpApp), and the connection closed.
            self.app_state = {**self.app_state, OVER_CAP: True}
            self._timeout = OVER_CAP_HEADER_TIMEOUT
        self._await_head()

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        if self.conn.their_state is h11.IDLE:
            self._await_head()  # a request head has begun (or not yet): it has a deadline
        else:
            self._cancel_deadline()

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_deadline()
        super().connection_lost(exc)

    def _await_head(self) -> None:
        if self._head_deadline is None and not self.transport.is_closing():
            self._head_deadline = self.loop.call_later(self._timeout, self._head_too_slow)

    def _cancel_deadline(self) -> None:
        if self._head_deadline is not None:
            self._head_deadline.cancel()
            self._head_deadline = None

    def _head_too_slow(self) -> None:
        """No request head in time: close (a half-sent head gets no answer
        worth waiting for, and a silent connection none at all)."""
        self._head_deadline = None
        if self.conn.their_state is h11.IDLE and not self.transport.is_closing():
            self.transport.close()


def guarded_connection(cap: int, header_timeout: float) -> type[GuardedConnection]:
    """The connection class of one server, with its cap and head deadline."""
    limits = {"cap": cap, "header_timeout": header_timeout}
    return type("GuardedConnection", (GuardedConnection,), limits)


def quiet_accept_errors(loop: asyncio.AbstractEventLoop, descriptors: int) -> None:
    """Log failed ``accept()`` calls (no descriptors left) once a minute,
    counted, instead of once per attempt with a traceback each."""
    previous = loop.get_exception_handler()

    def log(count: int) -> None:
        logger.error(
            "Out of file descriptors: accepting a connection failed %d time(s) since the last "
            "report (limit %d); clients wait until connections close. Raise serve's limit "
            "(ulimit -n) or lower --max-connections; idle connections close after %gs.",
            count,
            descriptors,
            KEEP_ALIVE_TIMEOUT,
        )

    quiet = QuietLog(log)

    def handler(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        if context.get("message") == "socket.accept() out of system resource":
            quiet.happened()
        elif previous is not None:
            previous(loop, context)
        else:
            loop.default_exception_handler(context)

    loop.set_exception_handler(handler)
