"""What ``serve`` counts as it works: requests by outcome, episodes
accepted, stored, duplicated, refused. Kept apart from
:mod:`.metrics`, which writes them out for ``GET /metrics``, so that what
counts (the intake, the gRPC front) needs no exposition library.
"""

from __future__ import annotations

import threading
from collections import Counter

__all__ = ["ServeCounters"]


class ServeCounters:
    """This process's counters, thread-safe (every intake worker adds)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._values: Counter[tuple[str, tuple[tuple[str, str], ...]]] = Counter()

    def add(self, name: str, amount: int = 1, **labels: str) -> None:
        if amount <= 0:
            return
        key = (name, tuple(sorted(labels.items())))
        with self._lock:
            self._values[key] += amount

    def value(self, name: str, **labels: str) -> int:
        with self._lock:
            return self._values[(name, tuple(sorted(labels.items())))]

    def items(self) -> list[tuple[str, dict[str, str], int]]:
        with self._lock:
            return [(name, dict(labels), value) for (name, labels), value in self._values.items()]
