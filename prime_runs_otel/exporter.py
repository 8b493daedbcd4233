"""``PrimeRunsSpanExporter``: the OpenTelemetry ``SpanExporter`` for the Prime
platform. Wiring only: spans → views → per-run batches → spool commit; the
uploader thread does every network call.

Why ``export()`` never talks to the network: the SDK calls it on its batch
worker thread, ignores what it returns and drops a batch that fails, so the
only safe thing to do there is to make the batch durable and return.

What it returns is the SpanExporter contract read with docs/delivery.md's:
an episode is *acknowledged* once it is committed and ``export()`` returned
SUCCESS. So SUCCESS means every episode of the batch is in the spool (stored,
or there already); FAILURE means some are not: the commit itself failed, or
episodes were refused at the spool's size cap, past the share of runs whose
delivery stopped, or on a full disk. Either way ``export()`` never raises,
and each episode not kept is logged and counted on its run as ``rejected``.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import math
import os
import sys
import threading
import time
import weakref
from collections.abc import Callable, Sequence
from typing import Any

from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult
from opentelemetry.trace import SpanContext

from . import semconv
from ._courtesy import ExportRunning
from ._text import shown
from ._untraced import untraced
from .config import (
    Settings,
    cut_resource_attributes,
    env_flag,
    refuse_overrides,
    resolve_settings,
)
from .deliver.platform.watch import WATCH
from .deliver.spool import RunRow, Spool, SpoolError, process_alive, this_producer
from .deliver.uploader import Uploader
from .read.checks import run_identity
from .read.episodes import CorruptEpisode, EpisodeArrival
from .read.ingest import Grouped, group_by_run
from .read.records import RunIdentity
from .read.span_tree import SpanTreeBuffer
from .read.spans import from_readable_span
from .sampling import dropped_episodes, sampler_that_may_drop, without_sdk

logger = logging.getLogger(__name__)

#: How long ``shutdown()`` lets delivery drain: bounded, as the SDK expects
#: of every exporter; whatever is left is delivered by the next process.
DEFAULT_SHUTDOWN_TIMEOUT = 30.0
#: How long the end of a run waits for a platform that has not acknowledged
#: the run since it started and failed to answer (see ``_finish_wait``).
UNREACHABLE_FINISH_WAIT = 10.0

#: ``true``: plain instrumented code that marks no episodes gets one episode
#: per root trace holding model calls (``root_traces_as_episodes=True``).
ROOT_TRACES_AS_EPISODES_ENV = "PRIME_RUNS_OTEL_ROOT_TRACES_AS_EPISODES"


class PrimeRunsSpanExporter(SpanExporter):
    """Exports run spans to the Prime platform, or to the local store.

    Keyword arguments override the environment and ``~/.prime/config.json``
    (see :func:`prime_runs_otel.config.resolve_settings`). With no API key the
    runs stay in the local spool (``prime-runs-otel runs`` lists them).

    ``ends_runs=False`` is for a process that feeds a run somebody else owns
    (an inference worker of a training run): it never ends a run at
    shutdown, so the run ends with its owner, or is found crashed once every
    process feeding it is gone.

    ``root_traces_as_episodes=True`` (or ``PRIME_RUNS_OTEL_ROOT_TRACES_AS_EPISODES``)
    is for instrumented code without episode spans: each root trace that holds
    model calls becomes an episode. Without it such model calls are no
    episode, and a warning says so.

    ``OTEL_SDK_DISABLED=true`` disables it, as ``PRIME_RUNS_MODE=disabled``
    does. Built for a provider this package does not own (zero-code, where
    the SDK's configurator builds it), it warns when ``OTEL_TRACES_SAMPLER``
    may drop episode spans before they get here: ``start_run``'s provider
    keeps them, and passes ``warn_about_sampler=False``.
    """

    def __init__(
        self,
        *,
        settings: Settings | None = None,
        deliver: bool = True,
        shutdown_timeout: float = DEFAULT_SHUTDOWN_TIMEOUT,
        ends_runs: bool = True,
        root_traces_as_episodes: bool | None = None,
        warn_about_sampler: bool = True,
        **overrides: Any,
    ) -> None:
        refuse_overrides(settings, "PrimeRunsSpanExporter", **overrides)
        self.settings = without_sdk(settings or resolve_settings(**overrides))
        for message in cut_resource_attributes():
            logger.warning(message)
        sampler = sampler_that_may_drop() if warn_about_sampler else None
        if sampler and self.settings.mode != "disabled":
            logger.warning(
                "OTEL_TRACES_SAMPLER=%s may drop episode spans before they reach prime-runs-otel, "
                "and a dropped episode is not reported. Use parentbased_always_on (or unset it); "
                "each episode dropped is counted and said.",
                sampler,
            )
        self._shutdown_timeout = shutdown_timeout
        self._ends_runs = ends_runs
        if root_traces_as_episodes is None:
            root_traces_as_episodes = bool(env_flag(ROOT_TRACES_AS_EPISODES_ENV))
        # Spans of other instrumentations wait here for their episode span.
        self._trees = SpanTreeBuffer(root_traces_as_episodes=root_traces_as_episodes)
        self._reported_unclaimed = 0
        self._quiet_until = 0.0
        self._trees_lock = threading.Lock()
        self._disabled = self.settings.mode == "disabled"
        self._spool: Spool | None = None
        self._uploader: Uploader | None = None
        self._seen: set[str] = set()
        self._seen_lock = threading.Lock()
        # Episodes handed over in this process, by (trace id, span id), until
        # their span reaches export(). Single dict operations need no lock.
        self._handed: dict[tuple[int, int], EpisodeArrival | CorruptEpisode] = {}
        #: Up while export() runs: the run's producer thread and the uploader
        #: give way to it then (see prime_runs_otel._courtesy).
        self.export_running = ExportRunning()
        self._is_shutdown = False
        self._owner_pid = os.getpid()
        self.unattributed = 0
        #: Per run, episodes whose commit failed (the spool could not be
        #: written: a full disk): lost, and counted here until the spool
        #: takes the count onto the run's ``rejected``.
        self._lost: dict[str, int] = {}
        #: The run key of episodes whose Resource names no run (zero-code
        #: without prime.run.id), once one has arrived.
        self.fallback_run: str | None = None
        reference = weakref.ref(self)
        os.register_at_fork(after_in_child=lambda: _renew_locks(reference))
        if self._disabled:
            return
        self._spool = Spool(
            self.settings.spool_path,
            max_bytes=self.settings.spool_max_bytes,
            keep_delivered=self.settings.keep_delivered,
        )
        self._uploader = Uploader(self._spool, self.settings, export_running=self.export_running)
        if deliver:
            self._uploader.start()

    @property
    def spool(self) -> Spool:
        if self._spool is None:
            raise RuntimeError("this exporter is disabled (PRIME_RUNS_MODE=disabled): no spool")
        return self._spool

    # -- the SpanExporter contract ---------------------------------------------

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        """Commit the batch to the spool and wake the uploader. SUCCESS when
        every episode in it is kept; FAILURE when any is not (a failed commit,
        or episodes refused at the cap: counted on their runs as ``rejected``),
        so SUCCESS always means acknowledged (docs/delivery.md)."""
        if self._is_shutdown:
            logger.warning("export() called after shutdown(); %d span(s) dropped", len(spans))
            return SpanExportResult.FAILURE
        if self._disabled or self._spool is None:
            return SpanExportResult.SUCCESS
        with self.export_running.up():
            with self._trees_lock:
                grouped = group_by_run(
                    (from_readable_span(span, self._take_handed(span)) for span in spans),
                    trees=self._trees,
                    fallback=self._fallback_identity,
                    lines=self.settings.sends_prime_traces,
                )
                self._report_unclaimed()
            return self._commit(grouped, len(spans))

    # -- episodes handed over in this process ------------------------------

    def hand_over(self, context: SpanContext, episode: EpisodeArrival | CorruptEpisode) -> None:
        """Take the episode of a span that is still to end, straight from the
        producer in this process (``record_episode(hand_over=...)``).

        For a run whose only span processor is this exporter's: the span then
        carries no record, and the record that ``export()`` would otherwise
        join, parse and check again arrives here read already. It waits for
        its span, and is committed with it.
        """
        if self._disabled or self._is_shutdown:
            return
        self._handed[(context.trace_id, context.span_id)] = episode

    def _take_handed(self, span: ReadableSpan) -> EpisodeArrival | CorruptEpisode | None:
        if not self._handed:
            return None
        context = span.context
        if context is None:
            return None
        return self._handed.pop((context.trace_id, context.span_id), None)

    @property
    def episodes_waiting_for_spans(self) -> int:
        """Handed-over episodes whose span has not reached ``export()``:
        after a run's spans are flushed, each one is a span the SDK dropped."""
        return len(self._handed)

    def _fallback_identity(self, resource: Any) -> RunIdentity | None:
        """The run of episodes whose Resource names none: one per service and
        process, so a zero-code eval that forgot ``prime.run.id`` loses
        nothing (its next process is a new run, never a mix of two)."""
        if self.fallback_run is None:
            service = str(resource.get("service.name") or "unknown_service")
            host, pid, start = this_producer()
            digest = hashlib.sha256(f"{service}\0{host}\0{pid}\0{start}".encode())
            self.fallback_run = digest.hexdigest()[:32]
            logger.warning(
                "Spans carry no %s on their Resource: recording them as run %s, named after "
                "service.name %r. Set OTEL_RESOURCE_ATTRIBUTES=%s=... to choose the run.",
                semconv.RUN_ID,
                self.fallback_run,
                service,
                semconv.RUN_ID,
            )
        service_name = resource.get("service.name")
        name = str(service_name) if service_name else None
        identity = run_identity({**dict(resource), semconv.RUN_ID: self.fallback_run})
        if identity is None:
            return RunIdentity(local_id=self.fallback_run, name=name)
        return identity if identity.name else dataclasses.replace(identity, name=name)

    #: Unclaimed model calls are reported at most this often (seconds): an
    #: application whose other traces share the provider would flood the log.
    UNCLAIMED_REPORT_INTERVAL = 60.0

    def _report_unclaimed(self, *, final: bool = False) -> None:
        """Model calls under no episode span make no episode: a run fed only
        those would close "completed, 0 episodes" without a word otherwise."""
        total = self._trees.stats.unclaimed_model_calls
        new = total - self._reported_unclaimed
        now = time.monotonic()
        if new <= 0 or (now < self._quiet_until and not final):
            return
        self._reported_unclaimed = total
        self._quiet_until = now + self.UNCLAIMED_REPORT_INTERVAL
        logger.warning(
            "%d model-call span(s) arrived under no episode span and make no episode (%d so "
            "far). Wrap each rollout in prime_runs_otel.episode_span(...), or set %s=true to "
            "make each root trace with model calls an episode.",
            new,
            total,
            ROOT_TRACES_AS_EPISODES_ENV,
        )

    def _commit(self, grouped: Grouped, span_count: int) -> SpanExportResult:
        assert self._spool is not None
        self.unattributed += grouped.unattributed
        if not grouped.batches:
            return SpanExportResult.SUCCESS
        try:
            outcome = self._spool.intake.ingest(
                grouped.batches, mode=self.settings.mode, owns_runs=self._ends_runs
            )
        except Exception as exc:  # FAILURE is the contract: export() never raises
            lost = self._count_lost(grouped)
            logger.error(
                "prime-runs-otel could not commit %d span(s) to the spool %s: %s. They are "
                "lost (%d episode(s), counted on their runs as rejected); check disk space "
                "and permissions.",
                span_count,
                self._spool.path,
                exc,
                lost,
            )
            return SpanExportResult.FAILURE
        self._settle_lost()
        with self._seen_lock:
            self._seen.update(batch.identity.local_id for batch in grouped.batches)
        # A forked child never delivers (the parent's uploader does), and the
        # uploader's locks may have been held by a thread of the parent at
        # the fork: touching them here could wait forever.
        if self._uploader is not None and os.getpid() == self._owner_pid:
            if outcome.lines:
                self._uploader.lines.keep(outcome.lines)
            self._uploader.wake()
        # An episode refused at the cap is not acknowledged: the batch is not
        # a SUCCESS, though the rest of it is committed.
        return SpanExportResult.FAILURE if outcome.rejected else SpanExportResult.SUCCESS

    def _count_lost(self, grouped: Grouped) -> int:
        lost = 0
        with self._seen_lock:
            for batch in grouped.batches:
                local_id = batch.identity.local_id
                self._seen.add(local_id)
                if batch.episodes:
                    self._lost[local_id] = self._lost.get(local_id, 0) + len(batch.episodes)
                    lost += len(batch.episodes)
        return lost

    def _settle_lost(self) -> None:
        """Write the count of lost episodes onto their runs, now that the
        spool takes writes again."""
        if not self._lost or self._spool is None:
            return
        with self._seen_lock:
            lost, self._lost = self._lost, {}
        for local_id, count in lost.items():
            try:
                self._spool.intake.count_rejected(local_id, count)
            except Exception:
                with self._seen_lock:
                    self._lost[local_id] = self._lost.get(local_id, 0) + count

    def count_lost(self, local_id: str, count: int) -> None:
        """``count`` episodes of the run never reached ``export()`` (left in
        its hand-off when ``finish()`` could wait no longer): counted on the
        run as rejected, as those whose commit failed are."""
        with self._seen_lock:
            self._lost[local_id] = self._lost.get(local_id, 0) + count
        self._settle_lost()

    def lost(self, local_id: str) -> int:
        """Episodes of the run lost in this process and not yet counted in the spool."""
        return self._lost.get(local_id, 0)

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        """Wait for the runs this exporter has seen to be delivered.

        Everything ``export()`` accepted is already durable; this waits for
        the platform's receipts, which is what a caller flushing before exit
        wants to know.
        """
        deadline = time.monotonic() + timeout_millis / 1000.0
        with self._seen_lock:
            seen = list(self._seen)
        with untraced():
            return all(
                self.wait_delivered(local_id, deadline - time.monotonic()) for local_id in seen
            )

    def shutdown(self, timeout_millis: float | None = None) -> None:
        """Bounded: waits up to ``shutdown_timeout`` for delivery, or less when
        the SDK gives less (its batch processor passes what is left of its
        own budget as ``timeout_millis``), then stops. Whatever is not
        delivered by then stays in the spool for the next process.

        A run this process fed that never got its end span, and that no other
        live process is feeding, is recorded as crashed here.
        """
        if self._is_shutdown:
            return
        self._is_shutdown = True
        now = time.monotonic()
        hard = now + (math.inf if timeout_millis is None else max(0.0, timeout_millis / 1000.0))
        deadline = min(now + self._shutdown_timeout, hard)
        if self._handed:
            logger.warning(
                "%d episode(s) handed over in this process never had their span exported (the "
                "span processor dropped them: was it shut down first?); they are lost",
                len(self._handed),
            )
            self._handed.clear()
        if dropped_episodes.count:
            logger.warning(
                "%d episode span(s) were dropped by the tracer's sampler in this process and "
                "never reached prime-runs-otel: those episodes are not in their runs.",
                dropped_episodes.count,
            )
        if self._spool is None or os.getpid() != self._owner_pid:
            # A forked child: its episodes are committed, and delivering and
            # closing the runs is the parent's business.
            return
        with untraced():
            self._shut_down_delivery(deadline, hard)

    #: How long the uploader gets to finish the step it is in once the wait
    #: for delivery is over, within the SDK's budget.
    STOP_GRACE = 5.0

    def _shut_down_delivery(self, deadline: float, hard: float) -> None:
        with self._trees_lock:
            # Episodes still waiting for spans go out with what arrived.
            self._commit(
                group_by_run((), trees=self._trees, flush=True, fallback=self._fallback_identity),
                0,
            )
            self._report_unclaimed(final=True)
        self._settle_lost()
        try:
            self._end_abandoned_runs()
        except SpoolError as exc:  # shutdown never raises; the next process ends them
            logger.error("prime-runs-otel could not record the end of its runs: %s", exc)
        with self._seen_lock:
            seen = list(self._seen)
        if self._uploader is not None and self._uploader.running:
            for local_id in seen:
                self._wait_for_run(local_id, deadline - time.monotonic())
            now = time.monotonic()
            grace = max(0.0, deadline - now) + self.STOP_GRACE
            self._uploader.stop(timeout=max(0.0, min(grace, hard - now)))
        self._report_leftovers(seen)
        self._summarise_fallback_run()

    def _summarise_fallback_run(self) -> None:
        """One line at exit for a run nobody named, as ``start_run`` prints."""
        if self.fallback_run is None or self._spool is None:
            return
        run = self._spool.reading.run(self.fallback_run)
        if run is None:
            return
        if run.mode == "local":
            where = f"kept in the local store ({self._spool.path})"
        else:
            pending = self._spool.reading.pending_count(run.local_id)
            where = f"{pending} pending, {run.url or 'on the platform'}"
        logger.warning(
            "prime-runs-otel: run %s (%s) %s: %d episode(s), %s; see `prime-runs-otel show %s`",
            run.local_id,
            run.name or "unnamed",
            run.end_status or "running",
            run.episodes,
            where,
            run.local_id[:12],
        )

    # -- waiting on delivery ------------------------------------------------

    def add_step_table(self, local_id: str, step: int, body: bytes) -> None:
        """Keep a training step's Parquet sample table, built elsewhere, with
        the run in the spool, and have the uploader send it."""
        self.spool.steps.begin_step_upload(local_id, step, (), body, 0)
        if self._uploader is not None and os.getpid() == self._owner_pid:
            self._uploader.wake()

    def _wait_for_run(self, local_id: str, timeout: float) -> None:
        """A run that has ended is waited on until it is closed; one that is
        still fed by another process only until what this process gave is
        delivered (its close is that process's to wait for)."""
        run = self.spool.reading.run(local_id)
        if run is not None and run.end_status is None:
            self.wait_delivered(local_id, timeout)
        else:
            self.wait_closed(local_id, timeout)

    def wait_delivered(self, local_id: str, timeout: float) -> bool:
        """``True`` once nothing of the run is waiting for the platform."""
        return self._wait(
            local_id,
            timeout,
            lambda run: (
                run.mode != "online"
                or (
                    run.create_state == "created"
                    and self.spool.reading.pending_count(local_id) == 0
                    and not self.spool.steps.metrics_counts(local_id).get("pending")
                )
            ),
        )

    def wait_registered(self, local_id: str, timeout: float) -> bool:
        """``True`` once the platform has the run (created or attached, and
        its dashboard address known) or creating it failed for good;
        ``False`` when the time ran out first."""
        return self._wait(
            local_id,
            timeout,
            lambda run: (
                run.mode != "online"
                or run.create_state == "failed"
                or (run.create_state == "created" and run.url is not None)
            ),
        )

    def wait_closed(
        self, local_id: str, timeout: float, *, cut_short: Callable[[], bool] | None = None
    ) -> RunRow | None:
        """The run once it is closed (or the deadline passes). A run the
        platform has not acknowledged since it started, with an error
        recorded (it could not be reached, or refused for now), waits only
        ``UNREACHABLE_FINISH_WAIT`` more from the moment that is known, and
        says so: its episodes are safe in the spool, and ``push`` delivers
        them later. ``cut_short()`` says to stop waiting at once (a Ctrl-C
        during ``finish()``)."""
        deadline = time.monotonic() + max(0.0, timeout)
        shortened = False

        def over(run: RunRow) -> bool:
            nonlocal deadline, shortened
            if run.settled:
                return True
            now = time.monotonic()
            if not shortened and _unacknowledged(run) and deadline - now > UNREACHABLE_FINISH_WAIT:
                shortened = True
                deadline = now + UNREACHABLE_FINISH_WAIT
                logger.warning(
                    "Run %s: the platform has not acknowledged it since it started (%s). "
                    "Waiting %.0fs more for it, not the %.0fs finish timeout; then its episodes "
                    "stay in %s for `prime-runs-otel push %s`.",
                    shown(local_id),
                    shown(run.last_error),
                    UNREACHABLE_FINISH_WAIT,
                    timeout,
                    shown(str(self.spool.path)),
                    shown(local_id),
                )
            return now >= deadline

        self._wait(local_id, timeout, over, cut_short)
        return self.spool.reading.run(local_id)

    def _wait(
        self,
        local_id: str,
        timeout: float,
        done: Any,
        cut_short: Callable[[], bool] | None = None,
    ) -> bool:
        deadline = time.monotonic() + max(0.0, timeout)
        delay = 0.01
        while True:
            run = self.spool.reading.run(local_id)
            if run is not None and done(run):
                return True
            if run is not None and run.stopped:
                return False
            if time.monotonic() >= deadline or (cut_short is not None and cut_short()):
                return False
            if self._uploader is not None and os.getpid() == self._owner_pid:
                self._uploader.wake()
            time.sleep(min(delay, max(0.0, deadline - time.monotonic())))
            delay = min(delay * 2, 0.2)

    def _end_abandoned_runs(self) -> None:
        """Runs this process fed without an end span, and that no other live
        process feeds, end with this process: completed when it shuts down
        cleanly (zero-code set-ups never emit an end span), failed when an
        unhandled exception is taking the interpreter down. A process that is
        killed never gets here; the next one to open the spool marks its runs
        crashed."""
        assert self._spool is not None
        if os.getpid() != self._owner_pid or not self._ends_runs:
            return  # a forked child never ends the parent's runs, nor does a worker
        with self._seen_lock:
            seen = list(self._seen)
        me = os.getpid()
        status, error = _exit_status()
        for local_id in seen:
            run = self._spool.reading.run(local_id)
            if run is None or run.end_status is not None:
                continue
            others = [
                (pid, start)
                for _, pid, start, _ in self._spool.delivery.producers(local_id)
                if pid != me and process_alive(pid, start)
            ]
            if not others:
                self._spool.intake.end_run(local_id, status, error)

    def _report_leftovers(self, seen: Sequence[str]) -> None:
        assert self._spool is not None
        for local_id in seen:
            run = self._spool.reading.run(local_id)
            if run is None or run.mode != "online" or run.closed:
                continue
            pending = self._spool.reading.pending_count(local_id)
            logger.warning(
                "Run %s is not closed on the platform yet (%d episode(s) pending). Nothing is "
                "lost: it stays in %s; deliver it with `prime-runs-otel push %s`.",
                local_id,
                pending,
                self._spool.path,
                local_id,
            )


def _unacknowledged(run: RunRow) -> bool:
    """An online run the platform has not taken, with the error that holds
    it up recorded, and no answer at all from the platform since the run
    started (see :mod:`.deliver.platform.watch`). A platform that answers,
    if only "not now" (429, 503), is waited for the whole finish timeout."""
    return (
        run.mode == "online"
        and run.create_state != "created"
        and run.last_error is not None
        and not WATCH.answered_since(run.created_at)
    )


def _exit_status() -> tuple[str, str | None]:
    """How the producer is ending: an unhandled exception (recorded by the
    interpreter in ``sys.last_value`` before exit handlers run) is a failure."""
    exc = getattr(sys, "last_value", None) or getattr(sys, "last_exc", None)
    if exc is None:
        return "completed", None
    if isinstance(exc, KeyboardInterrupt):
        return "cancelled", "interrupted"
    return "failed", f"{type(exc).__name__}: {exc}"


def _renew_locks(reference: weakref.ref[PrimeRunsSpanExporter]) -> None:
    """In a forked child: a lock another thread of the parent held at the
    fork would stay held forever."""
    exporter = reference()
    if exporter is not None:
        exporter._seen_lock = threading.Lock()
        exporter._trees_lock = threading.Lock()
        exporter._handed = {}  # the parent's spans; none of them is exported here
        exporter.export_running.after_fork()
