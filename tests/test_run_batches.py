"""The run's span batches (``prime_runs_otel.produce.run_batches``): exported
by the thread that ticks them (the run's producer), by a timer for spans
ended elsewhere, never by two threads at once, in the order the spans ended,
and never dropped.

Real SDK pipelines: a TracerProvider with the processor, spans ended on real
threads, and an exporter that keeps what it receives and on which thread.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence

from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

from prime_runs_otel.batching import BspSettings
from prime_runs_otel.produce.run_batches import ProducerBatches

WAIT = 60.0


class Keeping(SpanExporter):
    """Keeps every batch with the name of the thread that exported it, and
    the most export() calls it ever saw running at once."""

    def __init__(self, hold: float = 0.0) -> None:
        self.batches: list[tuple[str, list[str]]] = []
        self.most_at_once = 0
        self.shut = False
        self._running = 0
        self._hold = hold
        self._lock = threading.Lock()

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        with self._lock:
            self._running += 1
            self.most_at_once = max(self.most_at_once, self._running)
        if self._hold:
            time.sleep(self._hold)  # widens the window another export could enter
        with self._lock:
            self._running -= 1
            self.batches.append((threading.current_thread().name, [s.name for s in spans]))
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        self.shut = True

    @property
    def names(self) -> list[str]:
        return [name for _, batch in self.batches for name in batch]


def _pipeline(
    exporter: Keeping, *, queue: int = 64, delay_ms: int = 10_000, batch: int = 4
) -> tuple[TracerProvider, ProducerBatches]:
    processor = ProducerBatches(exporter, BspSettings(queue, delay_ms, batch, 30_000))
    provider = TracerProvider(shutdown_on_exit=False)
    provider.add_span_processor(processor)
    return provider, processor


def _wait_for(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + WAIT
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)


def _on_thread(name: str, work: Callable[[], None]) -> None:
    thread = threading.Thread(target=work, name=name)
    thread.start()
    thread.join(WAIT)
    assert not thread.is_alive()


def test_full_batches_go_out_on_the_producer_thread_and_the_rest_waits() -> None:
    exporter = Keeping()
    provider, processor = _pipeline(exporter, batch=4)
    tracer = provider.get_tracer("test")

    def produce() -> None:
        processor.tick()  # the thread that ticks is the producer
        for number in range(10):
            tracer.start_span(f"episode {number}").end()
            processor.tick()

    _on_thread("producer", produce)
    assert exporter.batches == [
        ("producer", ["episode 0", "episode 1", "episode 2", "episode 3"]),
        ("producer", ["episode 4", "episode 5", "episode 6", "episode 7"]),
    ]
    assert processor.queued == 2  # a partial batch waits for its delay
    assert processor.force_flush(timeout_millis=int(WAIT * 1000))
    assert exporter.names == [f"episode {number}" for number in range(10)]
    assert processor.queued == 0


def test_a_span_ended_elsewhere_goes_out_after_the_delay_with_no_producer_ticking() -> None:
    """The run-start span must reach the spool even while the producer is
    busy, or held for good: the timer thread exports it."""
    exporter = Keeping()
    provider, _ = _pipeline(exporter, delay_ms=20)
    provider.get_tracer("test").start_span("run start").end()
    _wait_for(lambda: exporter.names == ["run start"], "the timer to export the span")
    assert exporter.batches[0][0] == "prime-runs-otel-batch-timer"


def test_export_is_never_called_by_two_threads_at_once_and_nothing_is_lost() -> None:
    exporter = Keeping(hold=0.002)
    provider, processor = _pipeline(exporter, delay_ms=1, batch=3)
    tracer = provider.get_tracer("test")
    done = threading.Event()

    def produce() -> None:
        processor.tick()
        for number in range(60):
            tracer.start_span(f"p{number}").end()
            processor.tick()
        done.set()

    producer = threading.Thread(target=produce, name="producer")
    producer.start()
    for number in range(60):
        tracer.start_span(f"m{number}").end()
        if number % 20 == 0:
            processor.force_flush(timeout_millis=int(WAIT * 1000))
    producer.join(WAIT)
    assert done.is_set()
    assert processor.force_flush(timeout_millis=int(WAIT * 1000))
    assert exporter.most_at_once == 1
    names = exporter.names
    assert sorted(names) == sorted([f"p{n}" for n in range(60)] + [f"m{n}" for n in range(60)])
    # Each thread's spans in the order they ended.
    for prefix in ("p", "m"):
        assert [name for name in names if name[0] == prefix] == [f"{prefix}{n}" for n in range(60)]


def test_past_the_queue_size_the_ending_thread_exports_instead_of_dropping() -> None:
    exporter = Keeping()
    provider, processor = _pipeline(exporter, queue=8, batch=4)
    tracer = provider.get_tracer("test")
    for number in range(20):
        tracer.start_span(f"span {number}").end()
    assert processor.queued < 8
    assert any(thread == "MainThread" for thread, _ in exporter.batches)
    assert processor.force_flush(timeout_millis=int(WAIT * 1000))
    assert exporter.names == [f"span {number}" for number in range(20)]


def test_shutdown_exports_what_is_left_then_takes_no_more() -> None:
    exporter = Keeping()
    provider, processor = _pipeline(exporter)
    tracer = provider.get_tracer("test")
    for number in range(3):
        tracer.start_span(f"span {number}").end()
    processor.shutdown()
    assert exporter.names == ["span 0", "span 1", "span 2"] and exporter.shut
    tracer.start_span("too late").end()
    assert processor.queued == 0
    assert processor.force_flush() is False
