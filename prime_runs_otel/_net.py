"""What the package's servers (``serve``, ``ui``) share about listening:
whether an address stays on this machine (beyond it they need a token), and
the socket bound up front, so a port in use is a clear error at start-up and
port 0 gives a known port before serving."""

from __future__ import annotations

import ipaddress
import socket


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def bind_socket(host: str, port: int, *, backlog: int) -> socket.socket:
    """A listening, non-blocking TCP socket on ``host:port``; ``OSError``
    (for the caller to say which option to change) when it cannot be had."""
    family, kind, proto, _, address = socket.getaddrinfo(
        host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
    )[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(backlog)
    except OSError:
        sock.close()
        raise
    sock.setblocking(False)
    return sock
