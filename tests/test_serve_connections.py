"""``serve``'s connections as anyone who reaches its port can hold them:
silent and half-sent HTTP connections are closed, the open connections are
capped with an answer clients retry (and health checks still answered past
the cap), and a process out of descriptors says so once, not once per
failed ``accept()``, and answers ``/healthz`` again once connections close."""

from __future__ import annotations

import resource
import signal
import socket
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest
from test_receiver import ServeProcess, serve_env


@pytest.fixture
def serve_with(tmp_path: Path) -> Iterator[Callable[..., ServeProcess]]:
    started: list[ServeProcess] = []

    def start(*args: str, preexec: Callable[[], None] | None = None) -> ServeProcess:
        serve = ServeProcess(tmp_path, serve_env(tmp_path, None), *args)
        serve.preexec = preexec
        started.append(serve.start())
        return serve

    yield start
    for serve in started:
        if serve.process is not None:
            serve.stop(signal.SIGKILL)


def _closed_by_server(sock: socket.socket, within: float) -> bool:
    """Whether the server closes ``sock`` within ``within`` seconds (an
    answer before the close is allowed)."""
    sock.settimeout(within)
    try:
        while sock.recv(65536):
            pass
    except TimeoutError:
        return False
    except ConnectionResetError:
        return True
    return True


@pytest.mark.parametrize(
    "sent",
    [b"", b"POST /v1/traces HTTP/1.1\r\nHost: x\r\nContent-Type: applic"],
    ids=["silent", "half-sent-head"],
)
def test_a_connection_without_a_whole_request_head_is_closed(
    serve_with: Callable[..., ServeProcess], sent: bytes
) -> None:
    serve = serve_with("--header-timeout", "1", "--no-grpc")
    with socket.create_connection(("127.0.0.1", serve.http_port)) as sock:
        sock.sendall(sent)
        assert _closed_by_server(sock, 15), "the connection was still open after 15 s"


def test_a_keep_alive_connection_that_starts_a_second_head_and_stops_is_closed(
    serve_with: Callable[..., ServeProcess],
) -> None:
    serve = serve_with("--header-timeout", "1", "--no-grpc")
    with socket.create_connection(("127.0.0.1", serve.http_port)) as sock:
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        sock.settimeout(10)
        assert sock.recv(65536).startswith(b"HTTP/1.1 200")
        sock.sendall(b"GET /hea")
        assert _closed_by_server(sock, 15), "the connection was still open after 15 s"


def test_past_the_connection_cap_exports_are_told_to_retry_and_health_is_answered(
    serve_with: Callable[..., ServeProcess],
) -> None:
    serve = serve_with("--max-connections", "8", "--no-grpc")
    held = [socket.create_connection(("127.0.0.1", serve.http_port)) for _ in range(8)]
    try:
        time.sleep(0.2)  # the server has taken them all
        health = httpx.get(f"{serve.url}/healthz", timeout=10)
        assert health.status_code == 200
        assert health.headers["connection"] == "close"
        export = httpx.post(
            serve.traces_url,
            content=b"",
            headers={"content-type": "application/x-protobuf"},
            timeout=10,
        )
        assert export.status_code == 503
        assert export.headers["retry-after"] == "1"
        assert "--max-connections" in export.text
    finally:
        for sock in held:
            sock.close()
    # The held connections gone, exports are taken again.
    answer = httpx.post(
        serve.traces_url, content=b"", headers={"content-type": "application/x-protobuf"}
    )
    assert answer.status_code == 200


def _descriptor_limit(limit: int) -> Callable[[], None]:
    def limit_in_child() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (limit, limit))

    return limit_in_child


def test_out_of_descriptors_is_one_log_line_and_health_comes_back(
    serve_with: Callable[..., ServeProcess],
) -> None:
    """gRPC connections are not capped: 300 of them take every descriptor
    of a process limited to 128. HTTP connections then fail in accept()."""
    serve = serve_with("--header-timeout", "1", preexec=_descriptor_limit(128))
    flood = []
    for _ in range(300):
        try:
            flood.append(socket.create_connection(("127.0.0.1", serve.grpc_port), timeout=2))
        except OSError:
            break
    waiting = [socket.create_connection(("127.0.0.1", serve.http_port)) for _ in range(20)]
    before = serve.log_path.stat().st_size
    time.sleep(3)
    growth = serve.log_path.stat().st_size - before
    for sock in [*flood, *waiting]:
        sock.close()
    assert growth < 5_000, f"the log grew {growth} bytes in 3 s:\n{serve.log()[-2000:]}"
    assert "Out of file descriptors" in serve.log()
    assert "Traceback" not in serve.log()
    deadline = time.monotonic() + 20
    while True:
        try:
            if httpx.get(f"{serve.url}/healthz", timeout=2).status_code == 200:
                break
        except httpx.HTTPError:
            pass
        assert time.monotonic() < deadline, "/healthz did not come back"
        time.sleep(0.2)
