"""The viewer's server: uvicorn on a socket bound up front (a port in use is
a clear error at once, and port 0 gives a known port before serving), in
the foreground for ``prime-runs-otel ui``, or on a thread of its own for
tests and benchmarks (:class:`ViewerServer`)."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable
from types import TracebackType

import uvicorn

from .._net import bind_socket, is_loopback
from ..deliver.spool import Spool
from ..errors import ConfigError
from .app import ViewerApp
from .older import OlderRunsReader

__all__ = ["ViewerServer", "bind", "loopback_hosts"]


def loopback_hosts(port: int) -> frozenset[str]:
    """The ``Host`` values a browser sends to a loopback viewer on ``port``."""
    names = ("127.0.0.1", "localhost", "[::1]")
    return frozenset({*names, *(f"{name}:{port}" for name in names)})


def bind(host: str, port: int) -> socket.socket:
    try:
        return bind_socket(host, port, backlog=128)
    except OSError as exc:
        raise ConfigError(
            f"the viewer cannot listen on {host}:{port}: {exc}. Pick another one with --port "
            "(0: any free port)."
        ) from None


class ViewerServer:
    """The viewer of ``spool`` on ``host:port`` (port 0: any free one).

    Beyond loopback it needs a ``token`` (the caller checks that first);
    on loopback it answers loopback host names only. ``serve()`` runs in
    the foreground until Ctrl-C; as a context manager it runs on a thread.
    """

    def __init__(
        self,
        spool: Spool,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        token: str | None = None,
        since: Callable[[str], float] | None = None,
    ) -> None:
        self.host = host
        self._socket = bind(host, port)
        self.port = int(self._socket.getsockname()[1])
        self.token = token
        self.reader = OlderRunsReader(spool)
        app = ViewerApp(
            spool,
            token=token,
            allowed_hosts=loopback_hosts(self.port) if is_loopback(host) and not token else None,
            since=since,
            reader=self.reader,
        )
        self._server = uvicorn.Server(
            uvicorn.Config(
                app,
                log_level="warning",
                access_log=False,
                lifespan="off",
                ws="none",
                server_header=False,
                timeout_graceful_shutdown=2,
            )
        )
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        """The address to open: with its token, when it needs one."""
        host = self.host if not is_loopback(self.host) else "127.0.0.1"
        shown = f"[{host}]" if ":" in host else host
        address = f"http://{shown}:{self.port}"
        return f"{address}/?token={self.token}" if self.token else address

    def serve(self) -> None:
        """Serve until interrupted (Ctrl-C, SIGTERM)."""
        self.reader.start()
        try:
            self._server.run(sockets=[self._socket])
        finally:
            self.reader.stop()

    def __enter__(self) -> ViewerServer:
        self.reader.start()
        self._thread = threading.Thread(
            target=self._server.run,
            kwargs={"sockets": [self._socket]},
            name="prime-runs-otel-ui",
            daemon=True,
        )
        self._thread.start()
        deadline = time.monotonic() + 10
        while not self._server.started and time.monotonic() < deadline:
            time.sleep(0.01)
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout=10)
        self.reader.stop()
        self._socket.close()
