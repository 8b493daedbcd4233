"""What ``serve`` counts, in the Prometheus text format (``GET /metrics``),
so a fleet of them can be watched and alerted on like the collectors in
front of them (which expose theirs on :8888).

Two kinds of figures. Counters of this process (since it started, as
Prometheus expects: ``rate()`` copes with a restart): requests by outcome,
episodes accepted, stored, duplicated, refused (:mod:`.counters`). And the
spool's state, read when scraped: episodes by state (pending, delivered,
failed, ...), runs by where they are, late episodes, the delivery lag and the
spool's size (and with ``--kafka`` the member's consumer lag).
docs/collector.md says which alert to set. The text format itself (names,
escaping, numbers) is ``prometheus_client``'s: each scrape builds the figures
afresh in a registry of its own and has the library write them.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from ..deliver.spool import SpoolCounts
from .counters import ServeCounters

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
    "kafka_records_total": (
        "counter",
        "with --kafka: records of this member's partitions read, by outcome (taken into the "
        "spool, skipped: done by an earlier owner, damaged: unreadable and let go)",
    ),
    "kafka_intakes_total": (
        "counter",
        "with --kafka: passes that took records into the spool (one transaction each, for "
        "all the records of a partition one read returned)",
    ),
    "kafka_loop_cpu_seconds_total": (
        "counter",
        "with --kafka: CPU time of the thread that reads the records into the spool",
    ),
    "kafka_request_stage_seconds": (
        "gauge",
        "with --kafka: where an OTLP/HTTP request's time went, from its body read to its "
        "answer sent, by stage and quantile, over the last 1000 requests",
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


Sample = tuple[str, dict[str, str], float]


class _Figures(Collector):
    """One scrape's figures, as ``prometheus_client`` metric families."""

    def __init__(self, samples: list[Sample]) -> None:
        self._samples = samples

    def collect(self) -> Iterator[Metric]:
        for name, (kind, text) in FIGURES.items():
            mine = [(labels, value) for figure, labels, value in self._samples if figure == name]
            if mine:
                yield _family(name, kind, text, mine)


def _family(
    name: str, kind: str, text: str, samples: Iterable[tuple[dict[str, str], float]]
) -> Metric:
    ordered = sorted(samples, key=lambda sample: sorted(sample[0].items()))
    label_names = sorted({key for labels, _ in ordered for key in labels})
    family: CounterMetricFamily | GaugeMetricFamily
    if kind == "counter":
        # The library writes a counter as NAME_total: the name goes in without it.
        family = CounterMetricFamily(
            f"{PREFIX}_{name.removesuffix('_total')}", text, labels=label_names
        )
    else:
        family = GaugeMetricFamily(f"{PREFIX}_{name}", text, labels=label_names)
    for labels, value in ordered:
        family.add_metric([labels.get(key, "") for key in label_names], value)
    return family


def render(
    counters: ServeCounters,
    spool: SpoolCounts,
    *,
    spool_bytes: int,
    spool_max_bytes: int,
    now: float | None = None,
    kafka_lag: int | None = None,
    kafka_loop_cpu: float | None = None,
    kafka_stages: dict[tuple[str, str], float] | None = None,
) -> str:
    """Every figure in the Prometheus text exposition format (0.0.4)."""
    now = time.time() if now is None else now
    samples: list[Sample] = [
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
    if kafka_loop_cpu is not None:
        samples.append(("kafka_loop_cpu_seconds_total", {}, kafka_loop_cpu))
    for (stage, quantile), seconds in (kafka_stages or {}).items():
        samples.append(
            ("kafka_request_stage_seconds", {"stage": stage, "quantile": quantile}, seconds)
        )
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Figures(samples))
    return generate_latest(registry).decode("utf-8")
