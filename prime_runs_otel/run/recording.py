"""The run the caller holds, and recording into it: episodes (handed to the
run's producer thread, which builds their spans), step metrics and step
tables. Ending it is ``ending.py``'s, reporting on it ``result.py``'s."""

from __future__ import annotations

import atexit
import logging
import os
import threading
import weakref
from collections.abc import Mapping
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry._logs import LoggerProvider
from opentelemetry.metrics import MeterProvider
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter
from opentelemetry.trace import SpanContext

from ..exporter import PrimeRunsSpanExporter
from ..produce.episode import prepare_episode, record_episode
from ..produce.handoff import Handoff
from ..produce.run_batches import ProducerBatches
from ..produce.run_spans import emit_metrics
from ..produce.signals import NO_SIGNALS, Signals
from ..tracing import TracingExporter
from .ending import RunEnding
from .providers import RunProviders, RunTracerProvider, run_tracer
from .result import RunFinishedError, RunResult
from .state import _Handed

logger = logging.getLogger(__name__)


class Run(RunEnding):
    """A live run. Use it as a context manager, or call :meth:`finish`.

    In a ``with`` block an exception finishes the run as failed and Ctrl-C as
    cancelled; a process that exits without finishing reports it crashed.
    """

    def __init__(
        self,
        *,
        provider: TracerProvider,
        exporter: PrimeRunsSpanExporter,
        local_id: str,
        finish_timeout: float,
        capture_content: bool | None,
        queue: ProducerBatches | None = None,
        kind: str = "eval",
        owns_run: bool = True,
        child_spans: bool | None = None,
        signals: Signals = NO_SIGNALS,
        providers: RunProviders | None = None,
    ) -> None:
        self.id = local_id
        self._signals = signals
        self._providers = providers or RunProviders()
        #: The run-start span's context, which the run's other spans link to.
        self.start_link: SpanContext | None = None
        self._child_spans = child_spans
        self.kind = kind
        self._queue = queue
        self._provider = provider
        self._exporter = exporter
        self._tracer = run_tracer(provider)
        self._finish_timeout = finish_timeout
        self._capture_content = capture_content
        self._recorded = 0
        self._unencodable = 0
        # The producer thread exports the run's batches between episodes.
        self._handoff = Handoff[_Handed](
            self._produce,
            self._unencodable_episode,
            name=f"prime-runs-otel-run-{local_id}",
            between=queue.tick if queue is not None else None,
        )
        self._lock = threading.Lock()
        self._finished = False
        # A process feeding a run somebody else owns (a worker of a training
        # run) never ends it: the owner does, or its absence is a crash.
        self._owns_lifecycle = owns_run
        #: In a forked child of the process that started the run (see
        #: _record_in_child).
        self._forked = False
        self._warned_metrics = False
        self.result: RunResult | None = None
        #: The end under way, once finish() began.
        self._ending = None
        atexit.register(self._on_exit)
        reference = weakref.ref(self)
        os.register_at_fork(after_in_child=lambda: _disown(reference))

    @property
    def tracer(self) -> Any:
        """The run's tracer, for spans of your own under the run's Resource."""
        return self._tracer

    @property
    def tracer_provider(self) -> TracerProvider:
        """The run's provider, for instrumentations that take one (their
        spans then carry the run's Resource)."""
        return self._provider

    @property
    def meter_provider(self) -> MeterProvider | None:
        """The run's MeterProvider (``OTEL_METRICS_EXPORTER``, or the one
        given to ``start_run``), ``None`` when the run reports no metrics."""
        return self._providers.meter

    @property
    def logger_provider(self) -> LoggerProvider | None:
        """The run's LoggerProvider (``OTEL_LOGS_EXPORTER``, or the one given
        to ``start_run``), ``None`` when the run emits no events."""
        return self._providers.logger

    def add_exporter(self, exporter: SpanExporter, **limits: int) -> BatchSpanProcessor:
        """Send the run's spans to a tracing backend as well (Jaeger, Tempo,
        Phoenix, any OTLP endpoint), without the episode records and the run
        config, in batches under the OTLP limits: see :class:`TracingExporter`
        (``limits`` are its ``max_batch_bytes`` and ``max_value_chars``).

        The run then emits agent and model-call spans under each episode (the
        backend shows the rollout), unless ``child_spans=False`` said otherwise.
        """
        if not isinstance(exporter, TracingExporter):
            exporter = TracingExporter(exporter, **limits)
        processor = BatchSpanProcessor(exporter)
        self._provider.add_span_processor(processor)
        return processor

    @property
    def platform_id(self) -> str | None:
        run = (
            self._exporter.spool.reading.run(self.id) if self.settings.mode != "disabled" else None
        )
        return run.platform_id if run else None

    @property
    def url(self) -> str | None:
        run = (
            self._exporter.spool.reading.run(self.id) if self.settings.mode != "disabled" else None
        )
        return run.url if run else None

    @property
    def episodes_recorded(self) -> int:
        return self._recorded

    def record_episode(self, episode: Any) -> str:
        """Record one finished episode (a verifiers ``Episode`` or its record)
        and return its id.

        The episode is handed to the run's producer thread, which builds its
        spans and encodes its record, so this returns in microseconds; do not
        change the episode after handing it over. What is cheap to check is
        checked here and raises here (the argument's type, the record's id
        and ``traces``, a finished run). A record that turns out not to be
        encodable (a value JSON cannot hold) is not raised: it is logged
        with its id, left out, and counted in ``RunResult.unencodable`` and
        ``prime-runs-otel show``. When the producer thread falls behind, this
        waits for room instead of dropping the episode.
        """
        episode_id, payload = prepare_episode(episode)
        item = (payload, episode_id, self.child_spans, otel_context.get_current())
        with self._lock:
            if self._finished:
                raise RunFinishedError(
                    f"run {self.id} is finished; start a new run to record more episodes"
                )
            if self._forked:
                self._record_in_child(item)
            else:
                # Under the lock, so finish() cannot drain between the put and
                # the count; counted once it is in (a put interrupted by Ctrl-C
                # is not).
                self._handoff.put(item)
            self._recorded += 1
        return episode_id

    def _record_in_child(self, item: _Handed) -> None:
        """In a forked child: the episode is in the spool before
        ``record_episode`` returns. A child may never get to ``finish()`` nor
        to an exit handler: a ``multiprocessing`` pool worker leaves through
        ``os._exit`` (or the pool's SIGTERM) once its tasks are done, and
        whatever waited in its hand-off or span queue would be gone with it,
        unseen by the parent. Committing each episode costs a transaction
        of its own, and loses nothing a finished task recorded."""
        try:
            self._produce(item)
        except BaseException as exc:
            self._unencodable_episode(item, exc)
        self._provider.force_flush()

    def _produce(self, item: _Handed) -> None:
        """On the producer thread: one episode's spans, in the order handed
        over, under the span that was current where it was recorded."""
        payload, _, child_spans, current = item
        # While an export() runs on another thread (a flush), let go of the
        # GIL once per episode, or it waits a switch interval behind this
        # thread on every SQLite call.
        self._exporter.export_running.give_way()
        token = otel_context.attach(current)
        try:
            # Nobody but the run reads the episode span's summary attributes
            # when nobody else listens, just as for the child spans.
            record_episode(
                self._tracer,
                payload,
                capture_content=self._capture_content,
                child_spans=child_spans,
                summary_attributes=child_spans,
                link=self.start_link,
                signals=self._signals,
            )
        finally:
            otel_context.detach(token)

    def _unencodable_episode(self, item: _Handed, exc: BaseException) -> None:
        self._unencodable += 1
        logger.warning(
            "Run %s: episode %s could not be encoded and is not recorded: %s", self.id, item[1], exc
        )

    @property
    def child_spans(self) -> bool:
        """Whether episodes get agent and model-call spans: as ``start_run``
        was told, else once the provider has a span processor besides the
        run's own (somebody who shows them)."""
        if self._child_spans is not None:
            return self._child_spans
        provider = self._provider
        return not isinstance(provider, RunTracerProvider) or provider.processors_added > 1

    def add_step_table(self, step: int, body: bytes) -> None:
        """Send one training step's sample table, already written as Parquet
        (by an instrumentation reproducing another reporter's table, see
        ``instrumentation/prime_rl``): kept in the spool with the run first,
        then presign → PUT → confirm like the legacy step tables, whichever
        sink the run's episodes go to. The run is registered by then (its
        spans are flushed first), and the close waits for the table."""
        with self._lock:
            if self._finished:
                raise RunFinishedError(
                    f"run {self.id} is finished; its samples can no longer change"
                )
        if self.settings.mode == "disabled":
            return
        self._provider.force_flush()
        self._exporter.add_step_table(self.id, step, body)

    def log_metrics(
        self, values: Mapping[str, Any], *, step: int | None = None, verbatim: bool = False
    ) -> int | None:
        """Report one training step's metrics; returns the step.

        ``step`` (or ``values["step"]``) is required. Non-finite numbers are
        dropped, and each row gets a ``_timestamp``. The platform keeps one
        row per step, so logging a step again adds its values to that row
        (a name logged again takes the new value). An eval run
        has no step metrics: there this does nothing (and says so once).
        ``verbatim``: the row is posted exactly as given, a post of its own
        (``emit_metrics``'s ``verbatim``), for an instrumentation reporting a
        framework's rows as the framework posts them.
        """
        with self._lock:
            if self._finished:
                raise RunFinishedError(
                    f"run {self.id} is finished; its metrics can no longer change"
                )
        if self.kind != "train":
            if not self._warned_metrics:
                self._warned_metrics = True
                logger.warning(
                    "Run %s is an eval run: step metrics belong to training runs "
                    "(start_run(kind='train', ...)); log_metrics does nothing here",
                    self.id,
                )
            return None
        step = emit_metrics(
            self._tracer,
            values,
            step=step,
            link=self.start_link,
            metrics=self._signals.metrics,
            verbatim=verbatim,
        )
        if self._forked:  # committed now: see _record_in_child
            self._provider.force_flush()
        return step


def _disown(reference: weakref.ref[Run]) -> None:
    """In a forked child: the parent owns the run's lifecycle."""
    run = reference()
    if run is not None:
        run._owns_lifecycle = False
        run._forked = True
        run._lock = threading.Lock()
