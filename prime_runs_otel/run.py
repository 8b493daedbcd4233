"""``start_run()``: one run, its own TracerProvider and exporter, in one call.

The pieces are public (``run_resource``, ``record_episode``,
``PrimeRunsSpanExporter``) for code that owns its TracerProvider; this module
is the short path for code that just wants its episodes on the platform.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import dataclasses
import logging
import os
import sys
import threading
import time
import weakref
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry._logs import LoggerProvider
from opentelemetry.metrics import MeterProvider
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import (
    SpanLimits,
    SpanProcessor,
    SynchronousMultiSpanProcessor,
    TracerProvider,
)
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter
from opentelemetry.sdk.trace.sampling import ALWAYS_ON
from opentelemetry.trace import SpanContext, Tracer

from . import __version__
from . import semconv as sc
from ._ctrl_c import CtrlC
from ._wakeup import POLL, Wakeup
from .batching import CountedBatchProcessor, batch_processor
from .config import Settings, env_flag, refuse_overrides, resolve_settings
from .deliver.advice import next_step
from .deliver.spool import RunRow
from .errors import ConfigError, PrimeRunsOtelError
from .exporter import PrimeRunsSpanExporter
from .produce.episode import prepare_episode, record_episode
from .produce.handoff import Handoff, NotDrained
from .produce.resource import run_resource
from .produce.run_config import normalize_config
from .produce.run_spans import emit_metrics, emit_run_end, emit_run_start, summary_json
from .produce.signals import NO_SIGNALS, Signals
from .providers import run_logger_provider, run_meter_provider
from .read.checks import read_record
from .read.projection import parquet_available
from .sampling import without_sdk
from .tracing import TracingExporter

logger = logging.getLogger(__name__)

TERMINAL_STATUSES = ("completed", "failed", "cancelled", "crashed")

#: The end of a run finished with Ctrl-C: how ``replay`` finds a run its
#: own interruption left cancelled, and what ``finish()`` records when a
#: Ctrl-C lands while it ends a run that was completing.
INTERRUPTED = "interrupted by the user (Ctrl-C)"

#: How long ``finish()`` lets the run's producer thread hand over the last
#: episodes. Under a second normally (at most 128 wait there); longer only
#: when something holds the thread up (a span processor that does not
#: return, a span queue that stays full). What is left then is counted lost.
DRAIN_WAIT = 120.0
#: After a Ctrl-C during ``finish()``: what the hand-off still gets...
INTERRUPTED_DRAIN_WAIT = 5.0
#: ...what the local part of the end (the hand-off, the run's end, the
#: commit into the spool) gets in all...
INTERRUPTED_LOCAL_WAIT = 10.0
#: ...and how long ``finish()`` still waits for the platform to close the
#: run. What is not closed by then stays in the spool for ``push``.
INTERRUPTED_PLATFORM_WAIT = 3.0


#: ``true`` / ``false`` forces the agent and model-call child spans on or off
#: for runs opened with ``start_run``; unset, they follow who is listening.
CHILD_SPANS_ENV = "PRIME_RUNS_OTEL_CHILD_SPANS"


class RunTracerProvider(TracerProvider):
    """The run's TracerProvider: it never lets a sampler drop the run's own
    spans, and knows whether anyone but the run reads them.

    The environment's sampler (``OTEL_TRACES_SAMPLER``) stays the provider's,
    for every tracer but the run's own (``prime_runs_otel``), whose spans are
    always sampled: an episode a sampler dropped would never reach the
    platform, and the run would close without it. A sampler is not told which
    tracer starts a span, so the run's tracer comes from a second provider
    built with ``ALWAYS_ON`` that shares this one's Resource, ids, limits and
    span processors (everything added here reaches its spans too).

    The platform needs only the episode span (it carries the whole record);
    the agent and model-call spans under it exist for tracing backends, and
    cost several times more than the episode span to build and export. So a
    run emits them only once a span processor of somebody else's is added
    (``run.tracer_provider.add_span_processor(...)``), unless told otherwise.
    """

    def __init__(self, *, resource: Resource) -> None:
        processors = SynchronousMultiSpanProcessor()  # type: ignore[no-untyped-call]
        limits = SpanLimits()
        super().__init__(resource=resource, active_span_processor=processors, span_limits=limits)
        self._own = TracerProvider(
            sampler=ALWAYS_ON,
            resource=resource,
            shutdown_on_exit=False,  # the processors are shared: shut down with this one
            active_span_processor=processors,
            id_generator=self.id_generator,
            span_limits=limits,
        )
        self.processors_added = 0

    def add_span_processor(self, span_processor: SpanProcessor) -> None:
        super().add_span_processor(span_processor)
        self.processors_added += 1

    def get_tracer(
        self,
        instrumenting_module_name: str,
        instrumenting_library_version: str | None = None,
        schema_url: str | None = None,
        attributes: Any = None,
    ) -> Tracer:
        owner: TracerProvider = self
        if instrumenting_module_name == sc.INSTRUMENTATION_SCOPE:
            owner = self._own
        return TracerProvider.get_tracer(
            owner,
            instrumenting_module_name,
            instrumenting_library_version,
            schema_url,
            attributes,
        )


def run_tracer(provider: TracerProvider) -> Tracer:
    """The run's own tracer: this package's scope, version and schema URL."""
    return provider.get_tracer(sc.INSTRUMENTATION_SCOPE, __version__, schema_url=sc.SCHEMA_URL)


def _child_spans_setting(argument: bool | None) -> bool | None:
    """``start_run``'s argument, else ``PRIME_RUNS_OTEL_CHILD_SPANS``, else None (follow)."""
    return argument if argument is not None else env_flag(CHILD_SPANS_ENV)


@dataclass
class RunProviders:
    """The run's MeterProvider and LoggerProvider, and what finishing the run
    does to each: a provider the run opened is shut down (its last metrics
    and events go out); one the caller gave is flushed and stays the
    caller's; the process's own (``opentelemetry-instrument``'s) is left to
    the process, which flushes it at exit."""

    meter: MeterProvider | None = None
    logger: LoggerProvider | None = None
    opened: tuple[object, ...] = ()
    given: tuple[object, ...] = ()

    @classmethod
    def open(
        cls,
        resource: Resource,
        meter: MeterProvider | None,
        logger: LoggerProvider | None,
        *,
        disabled: bool,
    ) -> RunProviders:
        if disabled:
            return cls()
        opened: list[object] = []
        given = [provider for provider in (meter, logger) if provider is not None]
        if meter is None:
            meter, made = run_meter_provider(resource)
            if made:
                opened.append(meter)
        if logger is None:
            logger, made = run_logger_provider(resource)
            if made:
                opened.append(logger)
        return cls(meter, logger, tuple(opened), tuple(given))

    def signals(self) -> Signals:
        return Signals.of(logger_provider=self.logger, meter_provider=self.meter)

    def close(self) -> None:
        for provider in (self.meter, self.logger):
            if any(provider is own for own in self.opened):
                step = "shutdown"
            elif any(provider is theirs for theirs in self.given):
                step = "force_flush"
            else:
                continue
            method = getattr(provider, step, None)
            if callable(method):
                method()


#: What ``Run.record_episode`` hands to the producer thread: the episode (or
#: its record), its id, whether it gets child spans, and the caller's context.
_Handed = tuple[Any, str, bool, otel_context.Context]


class _Ending:
    """The local part of a run's end, done on a thread of its own: no Ctrl-C
    is ever raised there, so it cannot be cut in two (the run left open with
    episodes in memory), and the caller's thread waits for it as long as it
    likes, and can be interrupted while it waits.

    ``status`` may still change until the run's end is emitted (a Ctrl-C
    during ``finish("completed")`` cancels the run); ``interrupted()``
    shortens the wait for the hand-off. ``wake`` is posted when the work is
    done (and by the Ctrl-C handler, so that the caller looks at once)."""

    def __init__(self, status: str, error: str | None, wake: Wakeup) -> None:
        self.status = status
        self.error = error
        self.emitted = False
        self.hurried = False
        self.done = False
        self.lost = 0
        self.failure: BaseException | None = None
        self.wake = wake
        self.drain_deadline = time.monotonic() + DRAIN_WAIT
        self._lock = threading.Lock()
        self._claimed = threading.Lock()

    def claim(self) -> bool:
        """``True`` for the first caller only: who does the work."""
        return self._claimed.acquire(blocking=False)

    def interrupted(self) -> None:
        """Ctrl-C: a run that was completing is cancelled, if its end is
        not out yet; the hand-off gets a few seconds more at most."""
        with self._lock:
            if not self.emitted and self.status == "completed":
                self.status, self.error = "cancelled", INTERRUPTED
            self.hurried = True
            self.drain_deadline = min(
                self.drain_deadline, time.monotonic() + INTERRUPTED_DRAIN_WAIT
            )

    def emit(self) -> tuple[str, str | None]:
        """The status and error the run ends with, fixed from now on."""
        with self._lock:
            self.emitted = True
            return self.status, self.error

    def finished(self) -> None:
        self.done = True
        self.wake.post()


class RunFinishedError(PrimeRunsOtelError):
    """An episode was recorded on a run that already finished."""


@dataclass(frozen=True)
class RunResult:
    """What ``finish()`` knows when it returns."""

    local_id: str
    status: str
    closed: bool
    mode: str
    platform_id: str | None
    url: str | None
    episodes: int
    pending: int
    uncertain: int
    failed: int
    corrupt: int
    spool_path: str
    error: str | None = None
    #: Delivery stopped on a permanent refusal: nothing more happens until the
    #: cause is fixed and the run pushed again (``next_step`` says how).
    stopped: bool = False
    #: Of ``failed``: episodes refused at the spool's size cap, never stored.
    rejected: int = 0
    #: Episodes handed to ``record_episode`` whose record could not be encoded
    #: on the producer thread (each was logged with its id); never stored.
    unencodable: int = 0

    @property
    def next_step(self) -> str | None:
        """The command that moves the run on, when it needs one."""
        if self.stopped:
            return next_step(self.local_id, self.error)
        if self.pending or self.left_open:
            return f"`prime-runs-otel push {self.local_id}`"
        return None

    @property
    def left_open(self) -> bool:
        """Ended here but not closed on the platform yet (the wait ran out,
        or a Ctrl-C cut it short): ``push`` closes it."""
        return self.mode == "online" and not self.closed and self.status in TERMINAL_STATUSES

    def describe(self) -> str:
        where = self.url or (f"platform run {self.platform_id}" if self.platform_id else None)
        if self.mode == "local":
            where = (
                f"the local store ({self.spool_path}); see `prime-runs-otel show {self.local_id}`"
            )
        elif where is None and not self.closed and self.mode == "online":
            where = f"kept locally in {self.spool_path}: the platform has not acknowledged it"
        state = "closed" if self.closed else "NOT closed yet"
        text = (
            f"run {self.local_id} {self.status}, {state}: {self.episodes} episode(s), "
            f"{self.pending} pending, {self.uncertain} uncertain, {self.failed} failed, "
            f"{self.corrupt} corrupt"
        )
        if where:
            text += f" — {where}"
        if self.unencodable:
            text += (
                f". {self.unencodable} episode(s) could not be encoded and were not recorded"
                " (each is named in a warning above)"
            )
        if self.stopped:
            stopped = (self.error or "").rstrip(". ")
            text += f". Delivery stopped: {stopped}. Next: {self.next_step}"
        elif self.error:
            text += f". Last error: {self.error}"
        if not self.stopped and self.pending:
            text += f". Pending episodes stay in the spool: {self.next_step}"
        elif not self.stopped and self.left_open:
            text += f". Not closed on the platform yet: {self.next_step} closes it"
        return text


class Run:
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
        queue: CountedBatchProcessor | None = None,
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
        self._handoff: Handoff[_Handed] = Handoff(
            self._produce, self._unencodable_episode, name=f"prime-runs-otel-run-{local_id}"
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
        self._ending: _Ending | None = None
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
    def settings(self) -> Settings:
        return self._exporter.settings

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
        if self._queue is not None:
            self._queue.wait_for_room()
        # While an export() runs, let go of the GIL once per episode, or it
        # waits a switch interval behind this thread on every SQLite call.
        self._exporter.export_running.give_way()
        token = otel_context.attach(current)
        try:
            # Nobody but the run reads the episode span's summary attributes
            # when nobody else listens, just as for the child spans; and then
            # the record goes to the exporter directly, read already.
            record_episode(
                self._tracer,
                payload,
                capture_content=self._capture_content,
                child_spans=child_spans,
                summary_attributes=child_spans,
                hand_over=self._hand_over if self._exporter_alone else None,
                link=self.start_link,
                signals=self._signals,
            )
        finally:
            otel_context.detach(token)

    @property
    def _exporter_alone(self) -> bool:
        """Whether the run's exporter is the only reader of its spans."""
        provider = self._provider
        return isinstance(provider, RunTracerProvider) and provider.processors_added == 1

    def _hand_over(
        self, context: SpanContext, record: dict[str, Any], raw: bytes, by_orjson: bool
    ) -> None:
        # A run bound for Prime Traces gets its lines built here, from the
        # record at hand, instead of from the stored bytes at upload.
        episode = read_record(
            record,
            raw,
            within_limits=by_orjson,
            line_for=self.kind if self.settings.sends_prime_traces else None,
        )
        self._exporter.hand_over(context, episode)

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

    def finish(
        self,
        status: str = "completed",
        error: str | None = None,
        *,
        timeout: float | None = None,
        summary: Mapping[str, Any] | None = None,
    ) -> RunResult:
        """End the run and wait (up to ``timeout``) until it is closed on the
        platform. What is not delivered by then stays in the spool.

        ``summary`` replaces the run summary aggregated from the episodes
        (``avg_reward``, ``avg_metrics``, ``avg_error``) with your own.

        Ctrl-C during ``finish()`` does not cut the end in two: a run that
        was completing ends cancelled (unless its end was out already),
        ``finish()`` still waits for the run's end and every episode handed
        over to be in the spool (a few seconds at most), then for the
        platform ``INTERRUPTED_PLATFORM_WAIT`` seconds at most, and only then
        raises ``KeyboardInterrupt``; :attr:`result` says where the run was
        left (``push`` completes what the platform does not have yet)."""
        if status not in TERMINAL_STATUSES:
            raise ValueError(
                f"status must be one of {', '.join(TERMINAL_STATUSES)}, not {status!r}"
            )
        summary_json(summary)  # refused here, before the run starts ending
        wake = Wakeup()
        # Ctrl-C is caught from before the run is marked finishing: none may
        # land between that mark and the thread that ends the run.
        with CtrlC(wake) as ctrl_c:
            with self._lock:
                already = self._finished
                self._finished = True
                if not already:
                    self._ending = _Ending(status, error, wake)
            ending = self._ending
            if already or ending is None:
                result = self._finished_elsewhere()
            else:
                threading.Thread(
                    target=self._end_locally,
                    args=(ending, summary),
                    name=f"prime-runs-otel-end-{self.id}",
                    daemon=True,
                ).start()
                committed = self._wait_for_end(ending, ctrl_c)
                budget = self._finish_timeout if timeout is None else timeout
                result = self._settle(ending, committed, budget, ctrl_c)
        if ctrl_c.count:
            raise KeyboardInterrupt
        if not already and ending is not None and ending.failure is not None:
            raise ending.failure
        return result

    def _finished_elsewhere(self) -> RunResult:
        """finish() again: the first call's result, once its end is local."""
        ending = self._ending
        if ending is not None and not ending.done:
            _wait_quietly(ending, INTERRUPTED_LOCAL_WAIT)
        if self.result is not None:
            return self.result
        return self.snapshot(ending.status if ending is not None else None)

    def _end_locally(self, ending: _Ending, summary: Mapping[str, Any] | None) -> None:
        """On the end's own thread: every episode handed over becomes its
        spans (or is counted lost), then the run's end, then all of it is
        committed to the spool."""
        if not ending.claim():
            return  # done by the exit hook, this thread having never run
        try:
            lost = self._close_handoff(ending)
            status, error = ending.emit()
            if self._owns_lifecycle:
                emit_run_end(
                    self._tracer,
                    status,
                    error,
                    # What became spans, counted where it happened: an
                    # interrupted record_episode may or may not have queued.
                    episodes_recorded=self._handoff.handled,
                    episodes_unencodable=self._unencodable,
                    summary=summary,
                    link=self.start_link,
                )
            if lost and self.settings.mode != "disabled":
                self._exporter.count_lost(self.id, lost)
            self._provider.force_flush()
            self._providers.close()
            if self._owns_lifecycle and self.settings.mode == "local":
                # Closed here, not on the uploader's next pass: the process
                # may be gone before that (a second Ctrl-C).
                self._exporter.spool.intake.close_local_run(self.id)
        except BaseException as exc:  # raised to the caller by finish()
            ending.failure = exc
        finally:
            ending.finished()

    def _close_handoff(self, ending: _Ending) -> int:
        """Drain the hand-off until ``ending.drain_deadline`` (which a Ctrl-C
        brings closer); what is left then is taken off and counted lost."""
        while not self._handoff.drain(POLL):
            if time.monotonic() >= ending.drain_deadline:
                break
        left: NotDrained[_Handed] | None = self._handoff.close(0)
        if left is None:
            return 0
        ending.lost = left.count
        logger.warning(
            "Run %s: %d episode(s) were still waiting for the producer thread after %s; "
            "they are not recorded and are counted as rejected%s",
            self.id,
            left.count,
            "Ctrl-C" if ending.hurried else f"{DRAIN_WAIT:.0f}s",
            " (one was being built and may still arrive)" if left.in_hand else "",
        )
        return left.count

    def _wait_for_end(self, ending: _Ending, ctrl_c: CtrlC) -> bool:
        """Wait for the local part of the end; a Ctrl-C makes it hurry and
        bounds the wait (``INTERRUPTED_LOCAL_WAIT``). ``True`` once it is done."""
        acted_on = 0
        while not ending.done:
            try:
                if ctrl_c.count > acted_on:
                    acted_on = ctrl_c.count
                    ending.interrupted()
                wait = POLL
                if ctrl_c.first_at is not None:
                    left = ctrl_c.first_at + INTERRUPTED_LOCAL_WAIT - time.monotonic()
                    if left <= 0:
                        return False
                    wait = min(wait, left)
                ending.wake.wait(wait)
            except KeyboardInterrupt:  # somebody else's SIGINT handler raised it
                ctrl_c.note()
        return True

    def _settle(self, ending: _Ending, committed: bool, budget: float, ctrl_c: CtrlC) -> RunResult:
        """After the local part: wait for the platform, then say where the run is."""
        status = ending.status
        if not self._owns_lifecycle:
            # A forked child only flushes what it recorded: the run goes on in
            # the parent, so it is reported as running, and not as a problem.
            status = "running"
        run = None
        if committed and ending.failure is None:
            run = self._wait_closed(budget, ctrl_c)
        result = self._describe(status, run)
        result = dataclasses.replace(result, unencodable=self._unencodable)
        if committed:
            atexit.unregister(self._on_exit)
            self._provider.shutdown()
        self.result = result
        self._say(result, ending, ctrl_c)
        return result

    def _wait_closed(self, budget: float, ctrl_c: CtrlC) -> RunRow | None:
        """The run once the platform closed it, or when the wait is over
        (``budget``, or ``INTERRUPTED_PLATFORM_WAIT`` after a Ctrl-C)."""
        if self.settings.mode == "disabled" or not self._owns_lifecycle:
            return None
        deadline = time.monotonic() + budget

        def cut_short() -> bool:
            first = ctrl_c.first_at
            return first is not None and time.monotonic() >= first + INTERRUPTED_PLATFORM_WAIT

        while True:
            try:
                left = max(0.0, deadline - time.monotonic())
                return self._exporter.wait_closed(self.id, left, cut_short=cut_short)
            except KeyboardInterrupt:  # somebody else's SIGINT handler raised it
                ctrl_c.note()

    def _say(self, result: RunResult, ending: _Ending, ctrl_c: CtrlC) -> None:
        settled = result.closed and not result.pending
        level = logging.INFO if settled or not self._owns_lifecycle else logging.WARNING
        if ctrl_c.count:
            level = logging.WARNING
            logger.warning(
                "prime-runs-otel: Ctrl-C while run %s was finishing: %s",
                self.id,
                "its end and every episode handed over are in the spool"
                if ending.done
                else "the run's end was not in the spool yet",
            )
        logger.log(level, "prime-runs-otel: %s", result.describe())

    @property
    def finishing(self) -> bool:
        """Whether :meth:`finish` has begun (it may still be waiting on delivery)."""
        return self._finished

    def snapshot(self, status: str | None = None) -> RunResult:
        """Where the run's delivery stands right now, read from the spool
        without waiting: what a progress display shows while episodes stream."""
        return self._describe(status or ("running" if not self._finished else "completed"), None)

    def wait_registered(self, timeout: float) -> RunResult:
        """Flush the run's spans and wait (up to ``timeout``) until the platform
        has the run, or refused it for good; a local run is there at once.
        For callers that must hand out the platform's run id before the first
        episode, as prime-runs' ``init()`` does."""
        self._handoff.drain()
        self._provider.force_flush()
        if self.settings.mode == "online":
            self._exporter.wait_registered(self.id, timeout)
        return self.snapshot()

    def commit(self) -> None:
        """Everything recorded and logged so far is in the spool (or with the
        run's other exporters) once this returns, delivered or not: what a
        SIGKILL afterwards cannot take. Blocks for one export; call it off
        any thread whose latency matters."""
        self._handoff.drain()
        self._provider.force_flush()

    def wait_delivered(self, timeout: float) -> bool:
        """Flush the run's spans and wait (up to ``timeout``) until the
        platform has confirmed everything recorded so far."""
        self._handoff.drain()  # episodes handed over become spans first
        self._provider.force_flush()
        if self.settings.mode != "online":
            return True
        return self._exporter.wait_delivered(self.id, timeout)

    def _describe(self, status: str, run: Any) -> RunResult:
        settings = self.settings
        if settings.mode == "disabled":
            recorded = self._recorded - self._unencodable
            return RunResult(
                self.id, status, True, "disabled", None, None, recorded, 0, 0, 0, 0, ""
            )
        spool = self._exporter.spool
        run = run or spool.reading.run(self.id)
        if run is None:
            return RunResult(
                self.id, status, False, settings.mode, None, None, 0, 0, 0, 0, 0, str(spool.path)
            )
        return RunResult(
            local_id=self.id,
            status=run.end_status or status,
            closed=run.closed,
            mode=run.mode,
            platform_id=run.platform_id,
            url=run.url,
            episodes=run.episodes,
            # A local run's episodes are stored, not waiting: nothing is pending
            # until somebody pushes it.
            pending=spool.reading.pending_count(self.id) if run.mode == "online" else 0,
            uncertain=run.uncertain,
            failed=run.failed + run.rejected + self._exporter.lost(self.id),
            corrupt=run.corrupt,
            spool_path=str(spool.path),
            error=run.last_error,
            stopped=run.stopped,
            rejected=run.rejected + self._exporter.lost(self.id),
        )

    def __enter__(self) -> Run:
        return self

    def __exit__(self, exc_type: Any, exc: Any, traceback: Any) -> None:
        if exc_type is None:
            self.finish()
        elif isinstance(exc, (KeyboardInterrupt, asyncio.CancelledError)):
            self.finish("cancelled", "interrupted")
        else:
            self.finish("failed", f"{exc_type.__name__}: {exc}")

    def _on_exit(self) -> None:
        """At interpreter exit: a run whose end is still being committed
        (``finish()`` stopped waiting for it) gets the time it needs, within
        ``INTERRUPTED_LOCAL_WAIT``; one never finished is ended cancelled
        when Ctrl-C took the program down, and reported crashed otherwise.
        Before the SDK's own exit handler shuts the span pipeline down (it
        was registered first, so it runs after this)."""
        ending = self._ending
        if ending is not None:
            self._end_locally(ending, None)  # nothing, unless its thread never ran
            if not _wait_quietly(ending, INTERRUPTED_LOCAL_WAIT):
                logger.warning(
                    "Run %s: its end was still not in the spool at exit; the next process "
                    "to open the spool reports it crashed",
                    self.id,
                )
            return
        if self._finished or not self._owns_lifecycle:
            return
        if isinstance(getattr(sys, "last_value", None), KeyboardInterrupt):
            # Ctrl-C took the program down before it finished the run (a
            # second one, right after the first, in a `with` block's exit).
            with contextlib.suppress(KeyboardInterrupt):
                self.finish("cancelled", INTERRUPTED, timeout=INTERRUPTED_PLATFORM_WAIT)
            return
        logger.warning("Run %s was never finished; reporting it as crashed", self.id)
        try:
            self.finish("crashed", "the process exited without finishing the run")
        except KeyboardInterrupt:
            pass  # finish() has said where it left the run
        except Exception as exc:
            logger.warning("Run %s: reporting the crash failed: %s", self.id, exc)


def _wait_quietly(ending: _Ending, timeout: float) -> bool:
    """Wait up to ``timeout`` for ``ending`` to be done, Ctrl-C or not."""
    deadline = time.monotonic() + timeout
    while not ending.done:
        try:
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            ending.wake.wait(min(left, POLL))
        except KeyboardInterrupt:
            pass
    ending.wake.post()  # for anyone else waiting
    return True


def _disown(reference: weakref.ref[Run]) -> None:
    """In a forked child: the parent owns the run's lifecycle."""
    run = reference()
    if run is not None:
        run._owns_lifecycle = False
        run._forked = True
        run._lock = threading.Lock()


def start_run(
    *,
    name: str | None = None,
    model: str | None = None,
    environments: Sequence[str] = (),
    framework: str | None = None,
    config: Mapping[str, Any] | str | os.PathLike[str] | None = None,
    config_file: str | os.PathLike[str] | None = None,
    kind: str = "eval",
    tags: Sequence[str] = (),
    description: str | None = None,
    attach: str | None = None,
    run_id: str | None = None,
    team_id: str | None = None,
    api_key: str | None = None,
    base_url: str | None = None,
    mode: str | None = None,
    spool_dir: str | os.PathLike[str] | None = None,
    finish_timeout: float | None = None,
    capture_content: bool | None = None,
    settings: Settings | None = None,
    max_steps: int | None = None,
    batch_size: int | None = None,
    rollouts_per_example: int | None = None,
    seq_len: int | None = None,
    wandb_project: str | None = None,
    wandb_entity: str | None = None,
    wandb_run_name: str | None = None,
    owns_run: bool = True,
    child_spans: bool | None = None,
    meter_provider: MeterProvider | None = None,
    logger_provider: LoggerProvider | None = None,
) -> Run:
    """Open a run: a Resource naming it, a TracerProvider with a
    BatchSpanProcessor and :class:`PrimeRunsSpanExporter`, and the run-start
    span carrying its config (sent once, as the run's platform metadata).

    ``config`` is a mapping of the settings somebody chose and/or the path of
    the file the run was launched from (``config_file``), kept byte for byte
    under ``config_source``. Nothing in it is redacted: keep secrets in the
    environment.

    ``kind="train"`` opens a training run: ``model`` is the base model,
    ``max_steps`` to ``wandb_run_name`` what it is registered with, and its
    team (``team_id`` or ``PRIME_TEAM_ID``) if it has one: without, it belongs
    to the user's own account, as prime-rl registers it. Every process feeding one
    training run passes the same ``run_id``; the one that owns the run (the
    trainer, which logs the step metrics) keeps ``owns_run=True`` and ends it,
    the others (inference workers, an orchestrator) pass ``owns_run=False``.
    ``attach`` joins a run a launcher already registered (a hosted run's id).

    ``child_spans`` turns the GenAI agent and model-call spans under each
    episode span on or off (``PRIME_RUNS_OTEL_CHILD_SPANS``); by default they
    are emitted once a span processor is added to ``run.tracer_provider``,
    since the platform reads only the episode span.

    ``meter_provider`` and ``logger_provider`` receive the run's metrics
    (step metrics, rewards, the GenAI client histograms) and GenAI events
    (``gen_ai.evaluation.result``, and the inference details when content
    capture asks for events). Without them the run opens its own, with its
    Resource, as ``OTEL_METRICS_EXPORTER`` and ``OTEL_LOGS_EXPORTER`` say,
    and none when those are unset. The run's own spans are never sampled
    away, whatever ``OTEL_TRACES_SAMPLER`` says; ``OTEL_SDK_DISABLED=true``
    means what ``PRIME_RUNS_MODE=disabled`` means.

    ``settings`` (from :func:`~prime_runs_otel.config.resolve_settings`)
    stands for ``api_key``, ``base_url``, ``mode``, ``spool_dir`` and
    ``finish_timeout``: passing one of those with it is a ``TypeError``,
    never an argument silently ignored.
    """
    if kind not in ("eval", "train"):
        raise ValueError(f"kind must be 'eval' or 'train', not {kind!r}")
    refuse_overrides(
        settings,
        "start_run",
        api_key=api_key,
        base_url=base_url,
        mode=mode,
        spool_dir=spool_dir,
        finish_timeout=finish_timeout,
    )
    metadata = normalize_config(config, config_file=config_file)
    settings = without_sdk(
        settings
        or resolve_settings(
            api_key=api_key,
            base_url=base_url,
            team_id=team_id,
            mode=mode,
            spool_dir=spool_dir,
            finish_timeout=finish_timeout,
        )
    )
    if kind == "train":
        _check_training_run(settings, model=model, attach=attach)
    resource = run_resource(
        run_id=run_id,
        kind=kind,
        name=name,
        model=model,
        environments=environments,
        framework=framework,
        tags=tags,
        description=description,
        attach=attach,
        team_id=team_id,
        max_steps=max_steps,
        batch_size=batch_size,
        rollouts_per_example=rollouts_per_example,
        seq_len=seq_len,
        wandb_project=wandb_project,
        wandb_entity=wandb_entity,
        wandb_run_name=wandb_run_name,
    )
    exporter = PrimeRunsSpanExporter(
        settings=settings, shutdown_timeout=0.0, ends_runs=owns_run, warn_about_sampler=False
    )
    child_spans = _child_spans_setting(child_spans)
    provider = RunTracerProvider(resource=resource)
    processor = batch_processor(exporter)
    provider.add_span_processor(processor)
    local_id = str(resource.attributes["prime.run.id"])
    providers = RunProviders.open(
        resource, meter_provider, logger_provider, disabled=settings.mode == "disabled"
    )
    run = Run(
        provider=provider,
        exporter=exporter,
        local_id=local_id,
        finish_timeout=settings.finish_timeout,
        capture_content=capture_content,
        queue=processor,
        kind=kind,
        owns_run=owns_run,
        child_spans=child_spans,
        signals=providers.signals(),
        providers=providers,
    )
    if owns_run or metadata:
        # A worker's empty config must not stand in for the owner's.
        run.start_link = emit_run_start(run.tracer, metadata, owner=owns_run)
    return run


def _check_training_run(settings: Settings, *, model: str | None, attach: str | None) -> None:
    """What a training run needs to reach the platform, checked before any
    span: a run that cannot be registered is better refused at start than
    found unregistered after days of training."""
    if settings.mode != "online":
        return
    if attach is None and not model:
        raise ConfigError("a training run needs its base model: pass model=... to start_run()")
    if settings.traces_opt_out and not parquet_available():
        raise ConfigError(
            "opting out of Prime Traces sends a training run's samples to the legacy step "
            "table, which is Parquet and needs pyarrow: pip install -e '.[train]' from the clone"
        )
