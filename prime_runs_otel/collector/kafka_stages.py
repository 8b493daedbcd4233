"""Where an OTLP request's time goes in a Kafka member, for ``/metrics``.

Each request handed to Kafka is timed by stage (:data:`REQUEST_STAGES`);
two more come from librdkafka's own statistics, measured on its threads,
which need no GIL: ``broker_queue``, a record's time in the producer's queue
(linger, batching, waiting for a request in flight) and ``broker_rtt``, a
produce request's round trip to the brokers (their append, replication and
answer, and librdkafka reading it). A delivery
report's ``Message.latency()`` cannot tell that part apart: it is taken when
the report's callback runs, on a Python thread that holds the GIL (it equals
``time.monotonic()`` in the callback to 0.2 ms). So what ``broker_ack`` has
beyond those two is the member's own wait: the delivery report waiting for
the thread that serves it and for the GIL.
"""

from __future__ import annotations

import bisect
import itertools
import json
import threading
import time
from collections import deque
from typing import Any

#: The stages timed on each request, in order (``total``: all of it).
REQUEST_STAGES = ("decode", "produce", "broker_ack", "wake", "answer", "total")
#: librdkafka's latency histograms behind each of its stages, all parts of
#: ``broker_ack``: the producer's queue and the request's output buffer; the
#: round trip.
BROKER_STAGES = {
    "broker_queue": ("int_latency", "outbuf_latency"),
    "broker_rtt": ("rtt",),
}
#: Every stage ``/metrics`` reports.
STAGES = (*REQUEST_STAGES, *BROKER_STAGES)
#: ``/metrics`` reports the stages of this many requests, the last ones.
STAGE_WINDOW = 1000
#: How often librdkafka sums up its latencies (one window of statistics).
STATS_INTERVAL_MS = 1000
#: The points each histogram gives, as (key, cumulative fraction).
_POINTS = (
    ("min", 0.0),
    ("p50", 0.5),
    ("p75", 0.75),
    ("p90", 0.9),
    ("p95", 0.95),
    ("p99", 0.99),
    ("p99_99", 0.9999),
    ("max", 1.0),
)


class Stages:
    """Where the last :data:`STAGE_WINDOW` requests' time went, from their
    body read to their answer sent: ``decode`` (waiting for a worker,
    decompressing, decoding, checking), ``produce`` (cutting the request into
    records and handing them to the producer), ``broker_ack`` (until the last
    acknowledgement was served), ``wake`` (until the request's thread ran
    again), ``answer`` (until the answer was written). The acknowledgement
    latency is the sum; which stage grows says what to change. The
    ``broker_*`` stages (see the module) are the parts of ``broker_ack`` the
    member does not add."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._rows: deque[tuple[float, ...]] = deque(maxlen=STAGE_WINDOW)
        self._received: deque[float] = deque(maxlen=STAGE_WINDOW)
        #: (end of the window, stage, its count, its quantile points).
        self._windows: deque[tuple[float, str, int, tuple[float, ...]]] = deque()

    def observe(self, received: float, stamps: tuple[float, ...], answered: float) -> None:
        times = (received, *stamps, answered)
        row = tuple(later - earlier for earlier, later in itertools.pairwise(times))
        with self._lock:
            self._rows.append((*row, answered - received))
            self._received.append(received)

    def librdkafka_statistics(self, text: str) -> None:
        """The producer's ``stats_cb``: keep its window of the brokers'
        latencies, for as long as the requests of the window are kept."""
        windows = broker_windows(json.loads(text))
        if not windows:
            return
        ended = time.monotonic()
        with self._lock:
            self._windows.extend((ended, *window) for window in windows)
            oldest = self._received[0] if self._received else time.monotonic()
            # A window is dropped once it ended before the oldest request kept.
            while len(self._windows) > 1 and self._windows[0][0] < oldest:
                self._windows.popleft()

    def quantiles(self, points: tuple[float, ...] = (0.5, 0.99)) -> dict[tuple[str, str], float]:
        """Seconds by (stage, quantile), over the requests in the window."""
        with self._lock:
            rows = list(self._rows)
            windows = list(self._windows)
        found: dict[tuple[str, str], float] = {}
        if not rows:
            return found
        for index, stage in enumerate(REQUEST_STAGES):
            values = sorted(row[index] for row in rows)
            for point in points:
                at = min(len(values) - 1, int(point * len(values)))
                found[(stage, f"{point:g}")] = values[at]
        for stage in BROKER_STAGES:
            ours = [(count, marks) for _, name, count, marks in windows if name == stage]
            for point in points if ours else ():
                found[(stage, f"{point:g}")] = merged_quantile(ours, point)
        return found


def broker_windows(stats: dict[str, Any]) -> list[tuple[str, int, tuple[float, ...]]]:
    """One statistics window, a (stage, count, seconds at each of
    :data:`_POINTS`) per stage of :data:`BROKER_STAGES` and broker that was
    sent records in it. A stage of two histograms adds them point by point
    (the longest of each taken together: an upper bound of their sum's
    quantile; the output buffer's is a few microseconds)."""
    brokers = stats.get("brokers")
    found = []
    for broker in brokers.values() if isinstance(brokers, dict) else ():
        for stage, names in BROKER_STAGES.items():
            parts = [broker.get(name) or {} for name in names]
            count = int(parts[0].get("cnt", 0))
            if count > 0:
                marks = tuple(sum(part.get(key, 0) for part in parts) / 1e6 for key, _ in _POINTS)
                found.append((stage, count, marks))
    return found


def merged_quantile(windows: list[tuple[int, tuple[float, ...]]], point: float) -> float:
    """The ``point`` quantile of several windows' records together, each
    window's distribution read as linear between its histogram points."""
    total = sum(count for count, _ in windows)
    low = min(marks[0] for _, marks in windows)
    high = max(marks[-1] for _, marks in windows)
    for _ in range(40):  # bisection of the value: 40 halvings are far below a microsecond
        middle = (low + high) / 2
        below = sum(count * _fraction(marks, middle) for count, marks in windows)
        if below < point * total:
            low = middle
        else:
            high = middle
    return high


def _fraction(marks: tuple[float, ...], value: float) -> float:
    """Which fraction of a window's records took at most ``value``."""
    if value >= marks[-1]:
        return 1.0
    at = bisect.bisect_right(marks, value)
    if at == 0:
        return 0.0
    (left, left_share), (right, right_share) = (
        (marks[at - 1], _POINTS[at - 1][1]),
        (marks[at], _POINTS[at][1]),
    )
    if right <= left:
        return right_share
    return left_share + (right_share - left_share) * (value - left) / (right - left)
