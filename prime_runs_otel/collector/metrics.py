"""What ``serve`` counts, in the Prometheus text format (``GET /metrics``),
so a fleet of them can be watched and alerted on like the collectors in
front of them (which expose theirs on :8888).

Two kinds of figures. Counters of this process (since it started, as
Prometheus expects: ``rate()`` copes with a restart): requests by outcome,
episodes accepted, stored, duplicated, refused. And the spool's state, read
when scraped: episodes by state (pending, delivered, failed, ...), runs by
where they are, late episodes, the delivery lag and the spool's size (and
with ``--kafka`` the member's consumer lag). docs/collector.md says which alert
to set.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Iterable

from ..deliver.spool import SpoolCounts

PREFIX = "prime_runs_otel"

#: name → (type, help) of every figure, in the order they are written.
FIGURES: dict[str, tuple[str, str]] = {
    "requests_total": ("counter", "OTLP export requests answered, by outcome"),
    "episodes_accepted_total": (
        "counter",
        "episodes in requests answered 200 and committed (new or duplicate)",
    ),
    "episodes_stored_total": ("counter", "episodes stored for the first time"),
    "episodes_duplicate_total": ("counter", "episodes that were stored already (retries)"),
    "episodes_refused_total": (
        "counter",
        "episodes refused, by reason (spool_full and unavailable are retried by the sender)",
    ),
    "kafka_lag": (
        "gauge",
        "with --kafka: records of this member's partitions not read yet",
    ),
    "episodes": ("gauge", "episodes in the spool, by state"),
    "episodes_pending": ("gauge", "episodes stored and not delivered yet"),
    "episodes_delivered": ("gauge", "episodes in the spool the platform has acknowledged"),
    "episodes_late": (
        "gauge",
        "episodes that arrived after their run was closed (delivered late if the platform "
        "takes them)",
    ),
    "episodes_late_refused": ("gauge", "late episodes the platform refused: late and undelivered"),
    "runs": ("gauge", "runs in the spool, by state (open, closing, closed, stopped)"),
    "delivery_lag_seconds": (
        "gauge",
        "age of the oldest episode still pending (0 when none is)",
    ),
    "spool_bytes": ("gauge", "what the spool holds (its pages in use), against its cap"),
    "spool_max_bytes": ("gauge", "the spool's cap; at it, serve answers 503"),
}


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


def render(
    counters: ServeCounters,
    spool: SpoolCounts,
    *,
    spool_bytes: int,
    spool_max_bytes: int,
    now: float | None = None,
    kafka_lag: int | None = None,
) -> str:
    """Every figure in the Prometheus text exposition format (0.0.4)."""
    now = time.time() if now is None else now
    samples: list[tuple[str, dict[str, str], float]] = [
        (name, labels, float(value)) for name, labels, value in counters.items()
    ]
    # Counters that have not happened yet still show, as 0.
    for name in ("episodes_accepted_total", "episodes_stored_total", "episodes_duplicate_total"):
        if not any(sample[0] == name for sample in samples):
            samples.append((name, {}, 0.0))
    samples += [("episodes", {"state": state}, float(n)) for state, n in spool.episodes.items()]
    samples += [
        ("episodes_pending", {}, float(spool.pending)),
        ("episodes_delivered", {}, float(spool.episodes.get("delivered", 0))),
        ("episodes_late", {}, float(spool.late)),
        ("episodes_late_refused", {}, float(spool.late_refused)),
    ]
    for state in ("open", "closing", "closed", "stopped"):
        samples.append(("runs", {"state": state}, float(spool.runs.get(state, 0))))
    lag = 0.0 if spool.oldest_pending_at is None else max(0.0, now - spool.oldest_pending_at)
    samples += [
        ("delivery_lag_seconds", {}, lag),
        ("spool_bytes", {}, float(spool_bytes)),
        ("spool_max_bytes", {}, float(spool_max_bytes)),
    ]
    if kafka_lag is not None:
        samples.append(("kafka_lag", {}, float(kafka_lag)))
    return "".join(_lines(samples))


def _lines(samples: list[tuple[str, dict[str, str], float]]) -> Iterable[str]:
    for name, (kind, text) in FIGURES.items():
        mine = sorted(
            ((labels, value) for figure, labels, value in samples if figure == name),
            key=lambda sample: sorted(sample[0].items()),
        )
        if not mine:
            continue
        yield f"# HELP {PREFIX}_{name} {text}\n# TYPE {PREFIX}_{name} {kind}\n"
        for labels, value in mine:
            yield f"{PREFIX}_{name}{_labels(labels)} {_number(value)}\n"


def _labels(labels: dict[str, str]) -> str:
    if not labels:
        return ""
    inside = ",".join(f'{key}="{_escaped(value)}"' for key, value in sorted(labels.items()))
    return "{" + inside + "}"


def _escaped(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _number(value: float) -> str:
    return str(int(value)) if value.is_integer() else repr(value)
