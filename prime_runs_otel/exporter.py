"""``PrimeRunsSpanExporter``: the OpenTelemetry ``SpanExporter`` for the Prime
platform. An adapter only: the SDK's calls → :mod:`.deliver.delivery` (span
views → one spool commit) and :mod:`.deliver.process_runs` (waiting for
delivery, the end of the process); the uploader thread does every network call.

Why ``export()`` never talks to the network: the SDK calls it on its batch
worker thread, ignores what it returns and drops a batch that fails, so the
only safe thing to do there is to make the batch durable and return.

Its options: ``ends_runs=False`` is for a process that feeds a run somebody
else owns (an inference worker of a training run): it never ends a run at
shutdown, so the run ends with its owner, or is found crashed once every
process feeding it is gone. ``root_traces_as_episodes=True`` (or
``PRIME_RUNS_OTEL_ROOT_TRACES_AS_EPISODES``) is for instrumented code without
episode spans: each root trace that holds model calls becomes an episode;
without it such model calls are no episode, and a warning says so.
``OTEL_SDK_DISABLED=true`` disables it, as ``PRIME_RUNS_MODE=disabled``
does. Built for a provider this package does not own (zero-code, where the
SDK's configurator builds it), it warns when ``OTEL_TRACES_SAMPLER`` may
drop episode spans before they get here: ``start_run``'s provider keeps
them, and passes ``warn_about_sampler=False``.

What it returns is the SpanExporter contract read with docs/delivery.md's:
an episode is *acknowledged* once it is committed and ``export()`` returned
SUCCESS. So SUCCESS means every episode of the batch is in the spool (stored,
or there already) but those refused for their own content, counted as such;
FAILURE means some others are not: the commit itself failed, or episodes
were refused at the spool's size cap, past the share of runs whose delivery
stopped, or on a full disk. Either way ``export()`` never raises, and each
episode not kept is logged and counted on its run as ``rejected``
(``deliver/delivery.py`` keeps the rules, the same as ``serve``'s).
"""

from __future__ import annotations

import logging
import math
import os
import time
import weakref
from collections.abc import Callable, Sequence
from typing import Any

from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

from ._courtesy import ExportRunning
from ._encoded_here import encoded_here
from ._untraced import untraced
from .config import (
    Settings,
    cut_resource_attributes,
    env_flag,
    refuse_overrides,
    resolve_settings,
)
from .deliver.delivery import Sender, SpanDelivery, WatchedTrees
from .deliver.process_runs import FallbackRun, ProcessRuns
from .deliver.spool import RunRow, Spool
from .deliver.uploader import Uploader
from .read.spans import from_readable_span
from .sampling import dropped_episodes, sampler_that_may_drop, without_sdk

logger = logging.getLogger(__name__)

#: How long ``shutdown()`` lets delivery drain: bounded, as the SDK expects
#: of every exporter; whatever is left is delivered by the next process.
DEFAULT_SHUTDOWN_TIMEOUT = 30.0

#: ``true``: plain instrumented code that marks no episodes gets one episode
#: per root trace holding model calls (``root_traces_as_episodes=True``).
ROOT_TRACES_AS_EPISODES_ENV = "PRIME_RUNS_OTEL_ROOT_TRACES_AS_EPISODES"


UNCLAIMED_ADVICE = (
    f", or set {ROOT_TRACES_AS_EPISODES_ENV}=true to make each root trace with model calls "
    "an episode"
)


class PrimeRunsSpanExporter(SpanExporter):
    """Exports run spans to the Prime platform, or to the local store.

    Keyword arguments override the environment and ``~/.prime/config.json``
    (see :func:`prime_runs_otel.config.resolve_settings`); with no API key the
    runs stay in the local spool. ``ends_runs=False``: this process feeds a
    run somebody else owns and never ends it at shutdown.
    ``root_traces_as_episodes``: each root trace holding model calls is an
    episode (see the module's docstring for both, and for
    ``warn_about_sampler``).
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
        self.settings = _settings(settings, warn_about_sampler, **overrides)
        self._shutdown_timeout = shutdown_timeout
        #: Up while export() runs: the run's producer thread and the uploader
        #: give way to it then (see prime_runs_otel._courtesy).
        self.export_running = ExportRunning()
        self._is_shutdown = False
        self._owner_pid = os.getpid()
        self._fallback = FallbackRun()
        self._delivery: SpanDelivery | None = None
        self._runs: ProcessRuns | None = None
        reference = weakref.ref(self)
        os.register_at_fork(after_in_child=lambda: _renew_locks(reference))
        if self.settings.mode == "disabled":
            return
        if root_traces_as_episodes is None:
            root_traces_as_episodes = bool(env_flag(ROOT_TRACES_AS_EPISODES_ENV))
        spool, uploader = _spool_and_uploader(self.settings, self.export_running)
        encoded_here.enable()  # records encoded in process are read here without a re-check
        self._delivery = SpanDelivery(
            spool,
            self.settings,
            uploader,
            Sender(retries=False, in_process=True, owns_runs=ends_runs),
            # Spans of other instrumentations wait here for their episode span.
            trees=WatchedTrees(root_traces_as_episodes=root_traces_as_episodes),
            fallback=self._fallback,
            unclaimed_advice=UNCLAIMED_ADVICE,
        )
        self._runs = ProcessRuns(self._delivery, uploader, self._fallback, ends_runs=ends_runs)
        if deliver:
            uploader.start()

    @property
    def spool(self) -> Spool:
        return self._process_runs.spool

    @property
    def _process_runs(self) -> ProcessRuns:
        if self._runs is None:
            raise RuntimeError("this exporter is disabled (PRIME_RUNS_MODE=disabled): no spool")
        return self._runs

    # -- the SpanExporter contract ---------------------------------------------

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        """Commit the batch to the spool and wake the uploader. SUCCESS when
        every episode in it is kept; FAILURE when any is not (counted on
        their runs as ``rejected``): SUCCESS always means acknowledged."""
        if self._is_shutdown:
            logger.warning("export() called after shutdown(); %d span(s) dropped", len(spans))
            return SpanExportResult.FAILURE
        if self._delivery is None:
            return SpanExportResult.SUCCESS
        with self.export_running.up():
            delivered = self._delivery.deliver(map(from_readable_span, spans))
        return SpanExportResult.SUCCESS if delivered.kept else SpanExportResult.FAILURE

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        """Wait for the runs seen to be delivered (what ``export()`` took is
        durable already; a caller flushing before exit wants the receipts)."""
        if self._runs is None:
            return True
        with untraced():
            return self._runs.wait_all_delivered(timeout_millis / 1000.0)

    def shutdown(self, timeout_millis: float | None = None) -> None:
        """Bounded: waits up to ``shutdown_timeout`` for delivery, or less when
        the SDK gives less (``timeout_millis``: what is left of its budget),
        then stops; what is not delivered stays in the spool for the next
        process (see :meth:`.process_runs.ProcessRuns.close`)."""
        if self._is_shutdown:
            return
        self._is_shutdown = True
        now = time.monotonic()
        hard = now + (math.inf if timeout_millis is None else max(0.0, timeout_millis / 1000.0))
        dropped_episodes.report()
        # A forked child: its episodes are committed, and delivering and
        # closing the runs is the parent's business.
        if self._runs is not None and os.getpid() == self._owner_pid:
            with untraced():
                self._runs.close(min(now + self._shutdown_timeout, hard), hard)

    # -- what run.py and the instrumentations use ------------------------------

    @property
    def fallback_run(self) -> str | None:
        """The run of episodes whose Resource names none, once one came."""
        return self._fallback.local_id

    @property
    def unattributed(self) -> int:
        return 0 if self._delivery is None else self._delivery.unattributed

    def count_lost(self, local_id: str, count: int) -> None:
        """``count`` episodes of the run never reached ``export()``."""
        if self._delivery is not None:
            self._delivery.count_lost(local_id, count)

    def lost(self, local_id: str) -> int:
        """Episodes of the run lost here, not yet counted in the spool."""
        return 0 if self._delivery is None else self._delivery.lost(local_id)

    def add_step_table(self, local_id: str, step: int, body: bytes) -> None:
        self._process_runs.add_step_table(local_id, step, body)

    def wait_delivered(self, local_id: str, timeout: float) -> bool:
        return self._process_runs.wait_delivered(local_id, timeout)

    def wait_registered(self, local_id: str, timeout: float) -> bool:
        return self._process_runs.wait_registered(local_id, timeout)

    def wait_closed(
        self, local_id: str, timeout: float, *, cut_short: Callable[[], bool] | None = None
    ) -> RunRow | None:
        return self._process_runs.wait_closed(local_id, timeout, cut_short=cut_short)


def _spool_and_uploader(
    settings: Settings, export_running: ExportRunning
) -> tuple[Spool, Uploader]:
    """The spool ``settings`` name, and its uploader (not started)."""
    spool = Spool(
        settings.spool_path,
        max_bytes=settings.spool_max_bytes,
        keep_delivered=settings.keep_delivered,
    )
    return spool, Uploader(spool, settings, export_running=export_running)


def _settings(settings: Settings | None, warn_about_sampler: bool, **overrides: Any) -> Settings:
    """The exporter's settings, with what would lose spans before they get
    here said once (attributes cut from the Resource, a sampler)."""
    resolved = without_sdk(settings or resolve_settings(**overrides))
    for message in cut_resource_attributes():
        logger.warning(message)
    sampler = sampler_that_may_drop() if warn_about_sampler else None
    if sampler and resolved.mode != "disabled":
        logger.warning(
            "OTEL_TRACES_SAMPLER=%s may drop episode spans before they reach prime-runs-otel, "
            "and a dropped episode is not reported. Use parentbased_always_on (or unset it); "
            "each episode dropped is counted and said.",
            sampler,
        )
    return resolved


def _renew_locks(reference: weakref.ref[PrimeRunsSpanExporter]) -> None:
    """In a forked child: a lock another thread of the parent held at the
    fork would stay held forever."""
    exporter = reference()
    if exporter is not None:
        if exporter._delivery is not None:
            exporter._delivery.after_fork()
        exporter.export_running.after_fork()
