"""``OTEL_BSP_*`` read as the specification reads them (:func:`bsp_settings`,
which the run's own span batches use too, see ``produce/run_batches.py``), and
the batch span processor of spans that go to other exporters (a run reported
through OTLP to a collector): the SDK's BatchSpanProcessor, with what waits in
its queue counted, and a ``force_flush`` that keeps its timeout.

Why a subclass and not the SDK's class as it is: the SDK drops the oldest
span when its queue is full (one log line, and a dropped episode span is a
lost episode), and it neither says how full its queue is nor lets
``force_flush`` end before every queued span is exported, whatever timeout
it is given (open-telemetry/opentelemetry-python#4568). So this processor
counts the spans it takes and the spans its exporter receives, both through
public calls (``on_end``, ``SpanExporter.export``), and the run's producer
waits while the difference is high (:meth:`CountedBatchProcessor.wait_for_room`).
"""

from __future__ import annotations

import itertools
import logging
import os
import threading
import time
import weakref
from collections.abc import Sequence
from dataclasses import asdict, dataclass

from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult

from .tracing import takes_timeout

__all__ = [
    "BSP_DEFAULTS",
    "BspSettings",
    "CountedBatchProcessor",
    "batch_processor",
    "bsp_settings",
]

logger = logging.getLogger(__name__)

#: BatchSpanProcessor settings ``start_run`` uses unless an ``OTEL_BSP_*``
#: variable says otherwise. The delay is what an episode waits for its batch
#: when fewer than a batch's worth come within it: at 400 per second, 200 ms
#: made record → platform receipt 2.6 times prime-runs' (which sends at once),
#: 50 ms 1.4 times, for a little more CPU per episode (smaller commits and
#: uploads). When episodes come fast, batches fill before the delay is out:
#: batches of 64 keep each ``export()`` call under 10 ms for 8 KB episodes
#: (512 took 150 ms, and CPU per episode is the same: a commit is cheap next
#: to the records in it). The queue needs no great size: the producer waits
#: before it overflows (:meth:`CountedBatchProcessor.wait_for_room`).
BSP_DEFAULTS = {
    "max_queue_size": ("OTEL_BSP_MAX_QUEUE_SIZE", 8192),
    "schedule_delay_millis": ("OTEL_BSP_SCHEDULE_DELAY", 50),
    "max_export_batch_size": ("OTEL_BSP_MAX_EXPORT_BATCH_SIZE", 64),
    "export_timeout_millis": ("OTEL_BSP_EXPORT_TIMEOUT", 30000),
}

#: The delay the SDK is given for ``OTEL_BSP_SCHEDULE_DELAY=0``. The
#: specification allows 0 (export as soon as a span ends); the SDK's
#: constructor refuses anything not above 0, so "at once" becomes the
#: shortest wait it takes.
SHORTEST_DELAY_MILLIS = 1


@dataclass(frozen=True)
class BspSettings:
    """The four BatchSpanProcessor settings, as the SDK's constructor takes them."""

    max_queue_size: int
    schedule_delay_millis: int
    max_export_batch_size: int
    export_timeout_millis: int


def bsp_settings() -> BspSettings:
    """``OTEL_BSP_*`` as the specification reads them, over ``BSP_DEFAULTS``:
    a value that is not a whole number (or is negative, or a zero size) is
    warned about and replaced by the default, never a traceback out of
    ``start_run``; a delay of 0 means at once."""
    chosen: dict[str, int] = {}
    for argument, (variable, default) in BSP_DEFAULTS.items():
        chosen[argument] = _whole_number(variable, default, sizes=argument.startswith("max_"))
    if chosen["schedule_delay_millis"] == 0:
        chosen["schedule_delay_millis"] = SHORTEST_DELAY_MILLIS
    if chosen["max_export_batch_size"] > chosen["max_queue_size"]:
        logger.warning(
            "OTEL_BSP_MAX_EXPORT_BATCH_SIZE (%d) is larger than OTEL_BSP_MAX_QUEUE_SIZE (%d); "
            "using the queue size",
            chosen["max_export_batch_size"],
            chosen["max_queue_size"],
        )
        chosen["max_export_batch_size"] = chosen["max_queue_size"]
    return BspSettings(**chosen)


def _whole_number(variable: str, default: int, *, sizes: bool) -> int:
    raw = os.environ.get(variable, "").strip()
    if not raw:
        return default
    smallest = 1 if sizes else 0
    try:
        value = int(raw)
    except ValueError:
        value = smallest - 1
    if value < smallest:
        logger.warning(
            "%s=%r is not a whole number of at least %d; using %d instead",
            variable,
            raw,
            smallest,
            default,
        )
        return default
    return value


def batch_processor(exporter: SpanExporter) -> CountedBatchProcessor:
    """A batch processor for ``exporter`` with ``start_run``'s settings
    (``BSP_DEFAULTS``, unless ``OTEL_BSP_*`` says otherwise)."""
    return CountedBatchProcessor(exporter, bsp_settings())


class CountedBatchProcessor(BatchSpanProcessor):
    """The SDK's BatchSpanProcessor, with what waits in its queue counted.

    ``queued`` is the spans taken (``on_end`` of a sampled span, as the SDK
    takes them) less the spans its exporter has received. A batch smaller
    than the largest one means the SDK emptied its queue to make it, so the
    count starts again from 0 there: spans the SDK dropped (its queue full,
    or cleared in a forked child) never leave the count too high for long.
    """

    #: The producer waits while the queue is fuller than this share of it.
    HIGH_WATER = 0.75
    #: After this long without room an episode goes in anyway: never hang.
    MAX_WAIT = 60.0

    def __init__(self, exporter: SpanExporter, settings: BspSettings) -> None:
        self.settings = settings
        self.exporter = exporter
        self._lock = threading.Lock()
        self._ends = itertools.count(1)
        self._taken = 0
        self._received = 0
        self._high_water = int(settings.max_queue_size * self.HIGH_WATER)
        super().__init__(_Counting(exporter, self), **asdict(settings))
        reference = weakref.ref(self)
        os.register_at_fork(after_in_child=lambda: _forget_queue(reference))

    @property
    def queued(self) -> int:
        """Spans taken and not yet handed to the exporter."""
        return max(0, self._taken - self._received)

    def on_end(self, span: ReadableSpan) -> None:
        context = span.context
        if context is not None and context.trace_flags.sampled:
            # No lock on the producer's path: next() on a count is atomic,
            # and a racing thread can only leave the figure a span behind.
            self._taken = next(self._ends)
        super().on_end(span)

    def _exported(self, count: int) -> None:
        with self._lock:
            if count < self.settings.max_export_batch_size:
                self._received = self._taken  # the SDK emptied its queue for this batch
            else:
                self._received += count

    def wait_for_room(self) -> None:
        """Return once the queue is below its high-water mark (or after
        ``MAX_WAIT``): a producer that outruns the exporter slows down
        instead of losing spans to a full queue."""
        if self.queued < self._high_water:
            return
        deadline = time.monotonic() + self.MAX_WAIT
        delay = 0.001
        while self.queued >= self._high_water and time.monotonic() < deadline:
            time.sleep(delay)
            delay = min(delay * 2, 0.05)

    def force_flush(self, timeout_millis: int | None = None) -> bool:
        """Export what is queued, waiting at most ``timeout_millis``
        (30 s when not given, the SDK's default): ``False`` when the time
        ran out first. The SDK's own flush ignores its timeout, so it runs
        on a thread of its own and goes on after this returns."""
        budget = 30.0 if timeout_millis is None else max(0.0, timeout_millis / 1000.0)
        done = threading.Event()
        outcome: list[bool] = []

        def flush() -> None:
            try:
                outcome.append(BatchSpanProcessor.force_flush(self))
            finally:
                done.set()

        try:
            threading.Thread(target=flush, name="prime-runs-otel-flush", daemon=True).start()
        except RuntimeError:
            # No new thread at interpreter shutdown (Python 3.12 and later
            # refuse one in an atexit handler, where a run reports its crash):
            # flush here, as the SDK does, whatever the timeout.
            return BatchSpanProcessor.force_flush(self, timeout_millis)
        return done.wait(budget) and all(outcome) and bool(outcome)


class _Counting(SpanExporter):
    """The exporter as the batch processor sees it: every batch is counted
    out of the queue on its way in."""

    def __init__(self, inner: SpanExporter, processor: CountedBatchProcessor) -> None:
        self._inner = inner
        self._processor = weakref.ref(processor)

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        processor = self._processor()
        if processor is not None:
            processor._exported(len(spans))
        return self._inner.export(spans)

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return self._inner.force_flush(timeout_millis)

    def shutdown(self, timeout_millis: float | None = None) -> None:
        """Passes the SDK's remaining budget on to an exporter that takes one
        (the SDK hands it only to a ``shutdown`` with that argument)."""
        if timeout_millis is not None and takes_timeout(self._inner.shutdown):
            self._inner.shutdown(timeout_millis=timeout_millis)  # type: ignore[call-arg]
        else:
            self._inner.shutdown()


def _forget_queue(reference: weakref.ref[CountedBatchProcessor]) -> None:
    """In a forked child: the SDK empties its queue there (the parent's spans
    are the parent's to export), so the count starts again from 0."""
    processor = reference()
    if processor is not None:
        processor._lock = threading.Lock()
        processor._ends = itertools.count(1)
        processor._taken = processor._received = 0
