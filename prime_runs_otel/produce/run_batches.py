"""The run's span processor: the batches of episode spans exported by the
run's producer thread itself, not by a batch processor's thread of its own.

A run's episode spans are built and ended on its producer thread (see
``handoff.py``). Behind the SDK's BatchSpanProcessor every batch then
crossed to a second thread, the processor's worker, which woke, took the GIL
from the producer and called ``export()``: two busy threads handing the GIL
and a condition back and forth for every batch, in a process whose caller
needs that GIL too. Here the producer exports a batch where it fills, between
two episodes, and the batch delay runs out on the same thread while it waits
for its next episode: the same batches, one busy thread fewer.

What the SDK's processor promises is kept:

- ``OTEL_BSP_*`` mean what they meant (:func:`~prime_runs_otel.batching.bsp_settings`):
  a batch goes out once it holds ``max_export_batch_size`` spans, or once
  its oldest span waited ``schedule_delay_millis``;
- ``export()`` is called by one thread at a time (one lock around it), with
  the spans in the order they ended;
- spans ended on other threads (the run's start and end, step metrics, the
  spans of instrumentations under the run) wait in the same queue; their
  delay is kept by a timer thread, started on the first of them, that
  sleeps unless one waits: the producer may be busy with one large episode
  for a second, or held for good by somebody else's span processor, and the
  run-start span must reach the spool all the same. Past ``max_queue_size``
  waiting, the thread ending a span exports a batch itself instead of
  dropping the oldest, as the SDK would;
- ``force_flush(timeout)`` exports everything waiting on a thread of its own
  and returns within its timeout (the export goes on after it), or in place
  where no thread can start (an ``atexit`` handler on Python 3.12+);
  ``shutdown`` exports what is left, then shuts the exporter down with the
  rest of its budget;
- in a forked child the queue starts empty (the parent's spans are the
  parent's) with locks of its own.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
import weakref
from collections import deque

from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor
from opentelemetry.sdk.trace.export import SpanExporter

from .._untraced import untraced
from .._wakeup import POLL, Wakeup
from ..batching import BspSettings
from ..tracing import takes_timeout

__all__ = ["ProducerBatches"]

logger = logging.getLogger(__name__)


class ProducerBatches(SpanProcessor):
    """Batches of the run's spans, exported on the thread that calls
    :meth:`tick` (the run's producer thread), and by a timer thread for
    spans ended elsewhere that waited the batch delay."""

    def __init__(self, exporter: SpanExporter, settings: BspSettings) -> None:
        self.settings = settings
        self.exporter = exporter
        self._delay = settings.schedule_delay_millis / 1000.0
        self._batch = settings.max_export_batch_size
        self._fresh()
        reference = weakref.ref(self)
        os.register_at_fork(after_in_child=lambda: _forget_queue(reference))

    def _fresh(self) -> None:
        self._spans: deque[ReadableSpan] = deque()
        #: When the oldest span waiting ended (monotonic), 0.0 when none waits.
        self._oldest = 0.0
        self._lock = threading.Lock()  # the queue and _oldest
        self._export_lock = threading.Lock()  # one export() at a time
        self._shutdown = False
        #: The thread that calls tick(), once it has.
        self._producer: int | None = None
        #: Whether a span ended elsewhere waits (the timer's business).
        self._elsewhere = False
        self._timer: threading.Thread | None = None
        self._timer_wake = Wakeup()

    @property
    def queued(self) -> int:
        """Spans ended and not yet handed to the exporter."""
        return len(self._spans)

    def on_start(self, span: object, parent_context: object = None) -> None:
        pass

    def on_end(self, span: ReadableSpan) -> None:
        context = span.context
        if self._shutdown or context is None or not context.trace_flags.sampled:
            return
        spans = self._spans
        elsewhere = threading.get_ident() != self._producer
        with self._lock:
            if not spans:
                self._oldest = time.monotonic()
            spans.append(span)
            waiting = len(spans)
            tell_timer = elsewhere and not self._elsewhere
            if tell_timer:
                self._elsewhere = True
        if waiting >= self.settings.max_queue_size:
            # Nobody has taken them for a queue's worth: this thread exports
            # a batch rather than let the queue drop one.
            self._export(full_only=True)
        elif tell_timer:
            self._start_timer()
            self._timer_wake.post()

    def _start_timer(self) -> None:
        if self._timer is not None:
            return
        with self._lock:
            if self._timer is not None:
                return
            timer = threading.Thread(target=self._time, name="prime-runs-otel-batch-timer")
            timer.daemon = True
            self._timer = timer
        with contextlib.suppress(RuntimeError):  # at interpreter shutdown: its flush takes them
            timer.start()

    def _time(self) -> None:
        """The timer thread: export what waited the delay while a span ended
        elsewhere is among it; otherwise sleep."""
        wake = self._timer_wake
        with untraced():
            while not self._shutdown:
                if not self._elsewhere:
                    wake.wait(POLL)
                    continue
                with self._lock:
                    if not self._spans:
                        self._elsewhere = False
                        continue
                left = self._oldest + self._delay - time.monotonic()
                if left > 0:
                    wake.wait(left)
                    continue
                try:
                    self._export(full_only=False)
                except BaseException:  # the timer outlives one failed export
                    logger.exception("prime-runs-otel: exporting waiting spans failed")

    def tick(self) -> float:
        """On the producer thread, between two episodes and while it waits
        for one: export every full batch, and what waited the batch delay;
        the seconds it may wait before calling again."""
        if self._producer is None:
            self._producer = threading.get_ident()
        spans = self._spans
        if not spans:
            return POLL
        if len(spans) >= self._batch:
            self._export(full_only=True)
        if spans:
            left = self._oldest + self._delay - time.monotonic()
            if left > 0:
                return min(left, POLL)
            self._export(full_only=False)
        return POLL

    def _export(self, *, full_only: bool) -> None:
        """Export batches while spans wait (only while a full batch waits,
        with ``full_only``); what waits is read again under the lock, as
        another thread may have taken it."""
        with self._export_lock:
            while True:
                batch = self._take(full_only)
                if not batch:
                    return
                self._send(batch)

    def _take(self, full_only: bool) -> list[ReadableSpan]:
        spans = self._spans
        with self._lock:
            if full_only and len(spans) < self._batch:
                return []
            batch = [spans.popleft() for _ in range(min(self._batch, len(spans)))]
            if not spans:
                self._oldest = 0.0
                self._elsewhere = False
            # Otherwise what waits ended after the batch: its wait is counted
            # from the batch's oldest, which keeps the delay an upper bound.
        return batch

    def _send(self, batch: list[ReadableSpan]) -> None:
        with untraced():
            try:
                self.exporter.export(batch)
            except Exception:  # the SDK's processor logs and carries on, as here
                logger.exception("prime-runs-otel: exporting %d span(s) failed", len(batch))

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        """Export everything waiting, within ``timeout_millis``: ``False``
        when the time ran out first (the export goes on, on its thread)."""
        if self._shutdown:
            return False
        return self._flush(timeout_millis)

    def _flush(self, timeout_millis: float) -> bool:
        done = threading.Event()

        def flush() -> None:
            try:
                self._export(full_only=False)
            finally:
                done.set()

        try:
            threading.Thread(target=flush, name="prime-runs-otel-flush", daemon=True).start()
        except RuntimeError:
            # No new thread at interpreter shutdown (Python 3.12 and later
            # refuse one in an atexit handler, where a run reports its crash).
            self._export(full_only=False)
            return True
        return done.wait(max(0.0, timeout_millis / 1000.0))

    def shutdown(self, timeout_millis: int = 30000) -> None:
        """Take no more spans, export what is left, then shut the exporter
        down with what is left of ``timeout_millis``."""
        if self._shutdown:
            return
        ends_by = time.monotonic() + timeout_millis / 1000.0
        self._shutdown = True
        self._flush(timeout_millis)
        left = max(0.0, (ends_by - time.monotonic()) * 1000.0)
        if takes_timeout(self.exporter.shutdown):
            self.exporter.shutdown(timeout_millis=left)  # type: ignore[call-arg]
        else:
            self.exporter.shutdown()


def _forget_queue(reference: weakref.ref[ProducerBatches]) -> None:
    """In a forked child: the parent's spans are the parent's to export, and
    its locks may be held by a thread the child does not have."""
    processor = reference()
    if processor is not None:
        processor._fresh()
