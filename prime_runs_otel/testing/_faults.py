"""Faults the fake platform injects on request: error answers, lost answers,
and latency.

They act at the HTTP level, in front of every service, because that is
where delivery code meets them in production: a status that says "not now",
a gateway that lost the answer after the work was done, a slow network. (An
outage, the listening socket closed, is the server's own business:
:meth:`~.fake_platform.FakePlatform.start_outage`.)
"""

from __future__ import annotations

import re
import threading
from dataclasses import dataclass
from typing import Literal

from ._http import Request, Response, json_response

FaultKind = Literal["fail", "ambiguous"]


@dataclass
class Fault:
    """``fail``: answered with ``status`` before the request acts.
    ``ambiguous``: the request acts, then its answer is replaced by a 502."""

    kind: FaultKind
    remaining: int
    status: int
    method: str | None
    path: re.Pattern[str] | None
    retry_after: float | None
    code: str | None

    def matches(self, request: Request) -> bool:
        if self.method is not None and self.method != request.method:
            return False
        return self.path is None or self.path.search(request.path) is not None

    def response(self) -> Response:
        headers = {} if self.retry_after is None else {"Retry-After": f"{self.retry_after:g}"}
        if self.kind == "ambiguous":
            # A gateway that lost the upstream answer: no service envelope, no code.
            return Response(502, b"502 Bad Gateway", "text/plain", headers)
        if self.code is not None:
            message = f"injected fault: HTTP {self.status}"
            return json_response(
                self.status, {"error": {"code": self.code, "message": message}}, headers
            )
        return json_response(
            self.status, {"detail": f"injected fault: HTTP {self.status}"}, headers
        )


class Faults:
    """The faults still to come, matched in the order they were added."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._faults: list[Fault] = []
        self._latency = 0.0

    def add(
        self,
        kind: FaultKind,
        count: int,
        status: int,
        method: str | None,
        path: str | None,
        retry_after: float | None,
        code: str | None,
    ) -> None:
        if count < 1:
            raise ValueError(f"count must be at least 1, got {count}")
        fault = Fault(
            kind=kind,
            remaining=count,
            status=status,
            method=method.upper() if method else None,
            path=re.compile(path) if path is not None else None,
            retry_after=retry_after,
            code=code,
        )
        with self._lock:
            self._faults.append(fault)

    def take(self, request: Request) -> Fault | None:
        """The first fault that answers ``request``, used up by one."""
        with self._lock:
            for fault in self._faults:
                if fault.remaining > 0 and fault.matches(request):
                    fault.remaining -= 1
                    return fault
            return None

    def clear(self) -> None:
        """Forget every fault still to come."""
        with self._lock:
            self._faults.clear()

    @property
    def latency(self) -> float:
        with self._lock:
            return self._latency

    def set_latency(self, seconds: float) -> None:
        if seconds < 0:
            raise ValueError("latency cannot be negative")
        with self._lock:
            self._latency = float(seconds)
