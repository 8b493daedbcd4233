"""Whether an address stays on this machine: what decides whether a server
of this package (``serve``, ``ui``) needs a token to listen there."""

from __future__ import annotations

import ipaddress


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False
