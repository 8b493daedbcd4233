"""Export requests → spool commits: the part of ``serve`` that knows no transport.

The HTTP and gRPC fronts both hand a decoded request to :class:`SpanIntake`
and answer with the :class:`Verdict` it returns. Every span, episode and item
is outside input, so each is handled inside a guard: one that cannot be read
or stored is refused alone and counted (``partial_success``), never a failed
request or a batch retried for ever; only a failure of the disk itself keeps
a batch for the retry, and readiness reports it until a commit succeeds. A
request whose episodes do not all fit (the spool's cap, its disk's reserve)
is refused whole and counted nowhere: its sender retries it.
"""

from __future__ import annotations

import logging
import sqlite3
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any, Literal

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTracePartialSuccess,
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

from .. import semconv
from .._text import shown
from ..config import Settings
from ..deliver.spool import IngestOutcome, Spool, SpoolError
from ..deliver.uploader import Uploader
from ..read.checks import read_span
from ..read.episodes import CorruptEpisode, EpisodeArrival
from ..read.ingest import Grouped, group_by_run
from ..read.otlp import span_views
from ..read.otlp_logs import SpanEvent
from ..read.records import RunBatch
from ..read.span_tree import SpanTree, SpanTreeBuffer
from ..read.spans import SpanView
from .counters import ServeCounters

logger = logging.getLogger(__name__)

#: Retry hint when the spool is at its cap: delivery frees room at the pace of
#: the platform, so retrying sooner only repeats the refusal.
FULL_RETRY_AFTER = 30
#: Retry hint when a commit failed (a locked or briefly unavailable disk).
COMMIT_RETRY_AFTER = 5
#: How long an episode span without a record waits for the spans under it.
#: A collector batches and sends a trace's spans within seconds of each other
#: (its batch processor flushes every 200 ms by default, at most a few s).
DEFAULT_SETTLE_SECONDS = 5.0
#: Spans held for synthesis at most; past it the oldest trace is let go, its
#: episodes synthesised from what arrived and counted incomplete.
DEFAULT_MAX_HELD_SPANS = 100_000


# -- the transport-free core ----------------------------------------------------------


@dataclass(frozen=True)
class Verdict:
    """What to answer for one export request, whatever the transport.

    ``accepted``: committed (``rejected`` spans, if any, are reported as
    partial success); ``invalid``: nothing of it can ever be accepted;
    ``full`` / ``unavailable``: nothing was committed, retry after
    ``retry_after`` seconds.
    """

    outcome: Literal["accepted", "invalid", "full", "unavailable"]
    message: str = ""
    rejected: int = 0
    retry_after: int | None = None


class _WatchedTrees(SpanTreeBuffer):
    """A span buffer that remembers which episodes its last release let go,
    so a failed commit can keep exactly those: the collector's retry brings
    the request's own spans again, but never an episode already released."""

    released: frozenset[str] = frozenset()

    def release(self, *, flush: bool = False) -> list[SpanTree]:
        trees = super().release(flush=flush)
        self.released = frozenset(tree.root.episode_id for tree in trees)
        return trees


class SpanIntake:
    """Export requests → spool commits, shared by the HTTP and gRPC fronts.

    Episode spans without a record wait in :attr:`trees` for the spans under
    them, which a collector may send in later requests; :meth:`release_settled`
    (on a timer) and :meth:`flush` (at shutdown) let them go. A run's end is
    held back while episodes of the run are, so the run is never closed
    before its last synthesised episode is in the spool. The buffer lives in
    memory only: spans it holds when the process dies are lost with it, which
    is why the wait is seconds, not minutes.

    Buffer work and the commit after it run under one lock, so what the
    buffer releases reaches the spool in order; the spool serialises commits
    anyway, so the lock costs no parallelism beyond the record checks.
    """

    def __init__(
        self,
        spool: Spool,
        settings: Settings,
        uploader: Uploader | None,
        *,
        settle_seconds: float = DEFAULT_SETTLE_SECONDS,
        max_held_spans: int = DEFAULT_MAX_HELD_SPANS,
        allow_attach: bool = False,
        clock: Callable[[], float] = time.monotonic,
        handoff: Callable[[ExportTraceServiceRequest], Verdict] | None = None,
    ) -> None:
        self.spool = spool
        #: In a Kafka fleet: where requests go instead of this spool (the
        #: member that owns a run's partition commits its spans, see
        #: :mod:`.kafka_member`).
        self.handoff = handoff
        #: What /metrics reports of this process.
        self.counters = ServeCounters()
        self.settings = settings
        self._uploader = uploader
        #: Episodes read off spans get their Prime Traces line built there,
        #: for the uploader (``deliver/lines.py``).
        self._uploads_lines = uploader is not None and settings.sends_prime_traces
        self.trees = _WatchedTrees(
            settle_seconds=settle_seconds, max_spans=max_held_spans, clock=clock
        )
        self._lock = threading.Lock()
        #: Run ends waiting for the run's held episodes, by run key.
        self._held_ends: dict[str, RunBatch] = {}
        #: Released episodes (and run ends) whose commit failed, retried first.
        self._uncommitted: list[RunBatch] = []
        self._report = _BufferReport(self.trees, clock)
        #: Items of the last commit refused on their own (see :meth:`_commit`).
        self._refused = 0
        #: Whether spans may name a platform run to attach to (``--allow-attach``).
        self._allow_attach = allow_attach
        self._refused_attach: set[str] = set()
        #: Why the last commit failed, until one succeeds: readiness says so.
        self.commit_problem: str | None = None

    def has_room(self) -> bool:
        """Under the spool's cap, and short of its disk's reserve."""
        return self.spool.housekeeping.has_room()

    def accept(self, request: ExportTraceServiceRequest, *, owned: bool = False) -> Verdict:
        """Commit ``request`` (in a fleet: hand it to Kafka); ``owned``: it
        comes from Kafka, for runs this member delivers, so it is committed here."""
        if self.handoff is not None and not owned:
            verdict = self.handoff(request)
        else:
            verdict = self._accept_here(request)
        self.counters.add("requests_total", outcome=verdict.outcome)
        if verdict.outcome == "accepted":
            self.counters.add("episodes_refused_total", verdict.rejected, reason="refused_alone")
        else:
            refused = _episode_spans_in(request)
            self.counters.add("episodes_refused_total", refused, reason=verdict.outcome)
        return verdict

    def _accept_here(self, request: ExportTraceServiceRequest) -> Verdict:
        # Episodes are read (parsed, checked, projected) before the lock, which
        # guards the span buffer and the commit: one worker parses while
        # another waits for its commit to reach the disk.
        views = [_read_ahead(view, self._uploads_lines) for view in span_views(request)]
        with self._lock:
            # Checked before the buffer sees the spans, so a refused batch
            # leaves no trace: the collector retries it, and it is not counted
            # lost meanwhile.
            if not self.has_room() and any(map(_is_episode_span, views)):
                return self._full()
            grouped = group_by_run(views, trees=self.trees, lines=self._uploads_lines)
            self._report.update()
            self._refused = 0
            attaching = self._refuse_attaching(grouped)
            if grouped.unattributed and not grouped.batches and not self._uncommitted:
                return Verdict(
                    "invalid",
                    f"{grouped.unattributed} episode span(s) carry no {semconv.RUN_ID} on "
                    "their Resource, so they belong to no run; set it with run_resource(...) "
                    f"or OTEL_RESOURCE_ATTRIBUTES={semconv.RUN_ID}=<run key>",
                )
            try:
                outcome = self._commit(grouped.batches, whole=True)
            except _TRANSIENT as exc:
                logger.error("Committing a batch to the spool %s failed: %s", self.spool.path, exc)
                return Verdict(
                    "unavailable",
                    f"the batch could not be committed to the spool ({exc}); retry later",
                    retry_after=COMMIT_RETRY_AFTER,
                )
        if outcome.rejected:
            # Refused whole (``whole=True``): nothing of it was committed or
            # counted lost; the sender still holds it and retries.
            return self._full()
        corrupt = sum(len(batch.corrupt) for batch in grouped.batches)
        unreadable = grouped.unreadable + self._refused
        self._refused = 0
        foreign = len(outcome.foreign_ends)
        return Verdict(
            "accepted",
            _rejection_message(grouped.unattributed, corrupt, unreadable, foreign, attaching),
            rejected=grouped.unattributed + corrupt + unreadable + foreign + attaching,
        )

    def held_episode_ids(self) -> dict[str, set[str]]:
        """The episodes held in the span buffer now, by run key: not in the
        spool yet, so not delivered (a Kafka fleet commits no offset past them)."""
        held: dict[str, set[str]] = {}
        with self._lock:
            for episode in self.trees.held_episodes():
                key = _run_key(episode.view.resource)
                if key is not None:
                    held.setdefault(key, set()).add(episode.episode_id)
            for batch in self._uncommitted:
                for item in batch.episodes:
                    held.setdefault(batch.identity.local_id, set()).add(item.episode_id)
        return held

    def add_span_events(self, events: Iterable[SpanEvent]) -> int:
        """Events sent apart from their spans (OTLP log records, see
        :mod:`.logs_intake`): each joins its span in the buffer, and reaches
        the episode's record when the episode is synthesised. How many there
        were."""
        count = 0
        with self._lock:
            for item in events:
                self.trees.add_event(item.trace_id, item.span_id, item.event)
                count += 1
        return count

    def release_settled(self) -> None:
        """Commit the episodes that waited long enough for their spans.

        While the spool is full they wait on (the buffer's bound still
        holds): released now, they would only be refused and counted lost.
        """
        with self._lock:
            idle = not (len(self.trees) or self.trees.pending_episodes or self._uncommitted)
            if (idle and not self._held_ends) or not self.has_room():
                return
            grouped = group_by_run((), trees=self.trees)
            self._report.update()
            self._refuse_attaching(grouped)
            try:
                self._commit(grouped.batches)
            except _TRANSIENT as exc:
                logger.error(
                    "Committing synthesised episodes to the spool %s failed (%s); retrying",
                    self.spool.path,
                    exc,
                )

    def flush(self) -> None:
        """Commit every episode still held, with the spans that arrived for it
        (the process is stopping), and report what synthesis could not keep."""
        with self._lock:
            grouped = group_by_run((), trees=self.trees, flush=True)
            self._refuse_attaching(grouped)
            try:
                self._commit(grouped.batches)
            except _TRANSIENT as exc:
                episodes = sum(len(batch.episodes) for batch in self._uncommitted)
                logger.error(
                    "Stopping: %d synthesised episode(s) could not be committed to the spool "
                    "%s and are lost: %s",
                    episodes,
                    self.spool.path,
                    exc,
                )
            self._report.summary()

    def _commit(self, batches: list[RunBatch], *, whole: bool = False) -> IngestOutcome:
        """Commit ``batches`` after anything whose commit failed before, with
        run ends held back until their runs' episodes are out of the buffer.

        ``whole``: ``batches`` come from a request, which is answered with a
        retryable refusal unless every new episode fits; then nothing is
        committed (the spool's ``whole``), so its retry is no loss counted
        twice. Episodes released by the buffer for timers (``release_settled``,
        ``flush``) have no sender to retry them: refused, they are lost, and
        counted on their run.
        """
        ends = self._ends_ready(batches)
        pending = [*self._uncommitted, *batches, *ends]
        if not pending:
            return IngestOutcome()
        try:
            outcome = self.spool.intake.ingest(
                pending,
                mode=self.settings.mode,
                register_producer=False,
                check_owner=True,
                whole=whole,
            )
        except _TRANSIENT as exc:
            # The disk, not the items: keep what nothing else would bring again.
            self._uncommitted = [*self._uncommitted, *_released_part(batches, self.trees), *ends]
            self.commit_problem = f"commits to the spool fail: {exc}"
            raise
        except Exception as exc:
            # Something in the items: commit them one by one, so the one that
            # cannot be stored costs itself only, never the requests after it.
            logger.warning(
                "A batch could not be committed as a whole (%s: %s); committing its items "
                "one by one",
                type(exc).__name__,
                shown(exc),
            )
            outcome = self._commit_each(pending, whole=whole)
        self.commit_problem = None
        if outcome.refused_whole:
            # Not committed: the request comes again, but what the buffer
            # released for it (and run ends held for those) only from here.
            self._uncommitted = [*self._uncommitted, *_released_part(batches, self.trees), *ends]
            return outcome
        self._uncommitted = []
        _log_foreign_ends(outcome.foreign_ends)
        self.counters.add("episodes_stored_total", outcome.stored)
        self.counters.add("episodes_duplicate_total", outcome.duplicates)
        self.counters.add("episodes_accepted_total", outcome.stored + outcome.duplicates)
        if self._uploader is not None:
            self._uploader.lines.keep(outcome.lines)
            self._uploader.wake()
        return outcome

    def _commit_each(self, pending: list[RunBatch], *, whole: bool) -> IngestOutcome:
        """Commit every item of ``pending`` alone; refuse (count and name) the
        ones that fail on their own. A transient failure stops it, the items
        not yet committed kept for the retry. ``whole``: an episode that does
        not fit is not counted, and the outcome says the request must come
        again (its committed items are duplicates then)."""
        rejected = refused = 0
        foreign: list[tuple[str, str]] = []
        items = [item for batch in pending for item in _items_of(batch)]
        for index, item in enumerate(items):
            try:
                outcome = self.spool.intake.ingest(
                    [item],
                    mode=self.settings.mode,
                    register_producer=False,
                    check_owner=True,
                    whole=whole,
                )
            except _TRANSIENT as exc:
                self._uncommitted = items[index:]
                self.commit_problem = f"commits to the spool fail: {exc}"
                raise
            except Exception as exc:
                self._refused += 1
                refused += 1
                if refused <= 5:
                    logger.warning(
                        "Run %s: refused %s that cannot be stored: %s: %s",
                        shown(item.identity.local_id),
                        _describe(item),
                        type(exc).__name__,
                        shown(exc),
                    )
                continue
            rejected += outcome.rejected
            foreign += outcome.foreign_ends
        if refused > 5:
            logger.warning("%d more item(s) of the batch were refused the same way", refused - 5)
        return IngestOutcome(
            rejected=rejected, foreign_ends=tuple(foreign), refused_whole=whole and rejected > 0
        )

    def _ends_ready(self, batches: list[RunBatch]) -> list[RunBatch]:
        """Hold back the ends of runs with episodes still in the buffer; return
        the held ends whose runs have none left."""
        waiting = {_run_key(episode.view.resource) for episode in self.trees.held_episodes()}
        for batch in batches:
            key = batch.identity.local_id
            if batch.end is not None and key in waiting:
                self._held_ends[key] = RunBatch(identity=batch.identity, end=batch.end)
                batch.end = None
        ready = [key for key in self._held_ends if key not in waiting]
        return [self._held_ends.pop(key) for key in ready]

    def _refuse_attaching(self, grouped: Grouped) -> int:
        """Take the runs that name a platform run to attach to out of
        ``grouped`` unless ``serve`` allows it; returns their spans' count.

        ``prime.run.attach`` would let anyone holding the token add
        episodes to, and finalize, any run the platform key reaches: it is
        the operator's choice (``--allow-attach``), not a sender's.
        """
        if self._allow_attach:
            return 0
        kept, refused = [], 0
        for batch in grouped.batches:
            if batch.identity.attach is None:
                kept.append(batch)
                continue
            refused += _item_count(batch)
            key = batch.identity.local_id
            if key not in self._refused_attach and len(self._refused_attach) < 10_000:
                self._refused_attach.add(key)
                logger.warning(
                    "Run %s asks to attach to platform run %s: refused, with its spans. serve "
                    "attaches to platform runs only when started with --allow-attach.",
                    shown(key),
                    shown(batch.identity.attach),
                )
        grouped.batches = kept
        return refused

    def _full(self) -> Verdict:
        """The answer while new episodes would be refused: which limit (the
        disk or the cap) and what frees it; checked again at each request."""
        problem = self.spool.housekeeping.room_problem() or (
            f"the spool is at its cap of {self.spool.max_bytes} bytes until delivery frees room"
        )
        return Verdict(
            "full",
            f"{problem}; retry later (the receiver's PRIME_RUNS_OTEL_SPOOL_MAX_BYTES and "
            "PRIME_RUNS_OTEL_DIR set its cap and disk)",
            retry_after=FULL_RETRY_AFTER,
        )


#: Commit failures of the disk or the database, not of what was committed:
#: the batch is kept (or the collector retries it).
_TRANSIENT = (SpoolError, sqlite3.OperationalError, OSError, MemoryError)


def _items_of(batch: RunBatch) -> list[RunBatch]:
    """``batch`` as one batch per item, in the order the spool takes them."""
    identity = batch.identity
    items = [
        RunBatch(
            identity=identity,
            start=batch.start,
            corrupt=batch.corrupt,
            corrupt_metrics=batch.corrupt_metrics,
        )
    ]
    items += [RunBatch(identity=identity, episodes=[episode]) for episode in batch.episodes]
    items += [RunBatch(identity=identity, metrics=[metrics]) for metrics in batch.metrics]
    items += [RunBatch(identity=identity, samples=[table]) for table in batch.samples]
    if batch.end is not None:
        items.append(RunBatch(identity=identity, end=batch.end))
    return items


def _item_count(batch: RunBatch) -> int:
    """The spans ``batch`` came from: one per item."""
    events = (batch.start is not None) + (batch.end is not None)
    corrupt = len(batch.corrupt) + len(batch.corrupt_metrics)
    return len(batch.episodes) + len(batch.metrics) + len(batch.samples) + corrupt + events


def _log_foreign_ends(foreign: tuple[tuple[str, str], ...]) -> None:
    for key, sender in foreign[:5]:
        logger.warning(
            "Run %s: refused a run end from producer %s, which does not own the run; the "
            "run stays open for its owner (service.instance.id must match the one that "
            "started it)",
            shown(key),
            shown(sender or "(no service.instance.id)"),
        )
    if len(foreign) > 5:
        logger.warning("%d more run end(s) were refused the same way", len(foreign) - 5)


def _describe(item: RunBatch) -> str:
    if item.episodes:
        return f"episode {shown(item.episodes[0].episode_id)}"
    if item.metrics:
        return f"the metrics of step {item.metrics[0].step}"
    if item.samples:
        return f"the sample table of step {item.samples[0].step}"
    if item.end is not None:
        return "the run's end"
    return "the run's start"


def _episode_spans_in(request: ExportTraceServiceRequest) -> int:
    """How many spans of ``request`` are episodes (counted when it is refused whole)."""
    count = 0
    for resource_spans in request.resource_spans:
        for scope_spans in resource_spans.scope_spans:
            for span in scope_spans.spans:
                if any(
                    pair.key in (semconv.EPISODE_ID, semconv.EPISODE_EXAMPLE_ID)
                    for pair in span.attributes
                ):
                    count += 1
    return count


def _read_ahead(view: SpanView, lines: bool) -> SpanView:
    """``view`` with its episode already read, when it is an episode span
    carrying its record: reading one depends on nothing but the span, so
    it needs no lock. A span that cannot be read is left as it came, for
    :func:`group_by_run` to read again and refuse alone as it always does."""
    if view.prepared is not None:
        return view
    try:
        if not _is_episode_span(view):
            return view
        item = read_span(view, lines=lines)
    except Exception:
        return view
    if isinstance(item, (EpisodeArrival, CorruptEpisode)):
        return replace(view, prepared=item)
    return view


def _is_episode_span(view: SpanView) -> bool:
    attributes = view.attributes
    return semconv.EPISODE_ID in attributes or semconv.EPISODE_EXAMPLE_ID in attributes


def _run_key(resource: Mapping[str, Any]) -> str | None:
    key = resource.get(semconv.RUN_ID)
    return key if isinstance(key, str) and key else None


def _released_part(batches: list[RunBatch], trees: _WatchedTrees) -> list[RunBatch]:
    """The episodes of ``batches`` the buffer released (synthesised ones):
    nothing else would bring them again after a failed commit."""
    kept = []
    for batch in batches:
        episodes = [item for item in batch.episodes if item.episode_id in trees.released]
        if episodes:
            kept.append(RunBatch(identity=batch.identity, episodes=episodes))
    return kept


class _BufferReport:
    """Logs what the span buffer let go unused. Model-call spans under no
    episode span are reported at most once a minute: a collector that also
    forwards an application's other GenAI traces would flood the log."""

    INTERVAL = 60.0

    def __init__(self, trees: SpanTreeBuffer, clock: Callable[[], float]) -> None:
        self._trees = trees
        self._clock = clock
        self._reported_unclaimed = 0
        self._quiet_until = 0.0

    def update(self) -> None:
        stats = self._trees.stats
        unclaimed = stats.unclaimed_model_calls - self._reported_unclaimed
        now = self._clock()
        if unclaimed <= 0 or now < self._quiet_until:
            return
        self._reported_unclaimed = stats.unclaimed_model_calls
        self._quiet_until = now + self.INTERVAL
        logger.warning(
            "%d model-call span(s) arrived under no episode span within %gs and were let go "
            "(%d so far). To report them as episodes, wrap each rollout in "
            "prime_runs_otel.episode_span(...) in the producer.",
            unclaimed,
            self._trees.max_wait_seconds,
            stats.unclaimed_model_calls,
        )

    def summary(self) -> None:
        stats = self._trees.stats
        self._quiet_until = 0.0
        self.update()
        if stats.incomplete_episodes or stats.late_spans or stats.evicted_spans:
            logger.warning(
                "Episode synthesis: %d episode(s) went out without all of their spans; %d "
                "span(s) arrived after their episode, %d were dropped to stay within %d held "
                "spans",
                stats.incomplete_episodes,
                stats.late_spans,
                stats.evicted_spans,
                self._trees.max_spans,
            )
        if stats.late_events or stats.unclaimed_events:
            logger.warning(
                "Span events sent as log records: %d arrived after their episode was "
                "synthesised, %d named a span that never came; their scores are not in any "
                "record. Send them within the settle time of their episode's spans.",
                stats.late_events,
                stats.unclaimed_events,
            )


def _rejection_message(
    unattributed: int, corrupt: int, unreadable: int = 0, foreign: int = 0, attaching: int = 0
) -> str:
    parts = []
    if foreign:
        parts.append(
            f"{foreign} run end(s) from a producer that does not own the run (another "
            "service.instance.id than the run's start); the run stays open for its owner"
        )
    if attaching:
        parts.append(
            f"{attaching} span(s) of runs that ask to attach to a platform run "
            f"({semconv.RUN_ATTACH}); serve does so only when started with --allow-attach"
        )
    if unreadable:
        parts.append(
            f"{unreadable} span(s) or item(s) that could not be read or stored (the "
            "receiver's log names each and says why)"
        )
    if unattributed:
        parts.append(f"{unattributed} episode span(s) without {semconv.RUN_ID} on their Resource")
    if corrupt:
        parts.append(
            f"{corrupt} episode(s) that cannot be used, counted as lost on their run: a record "
            "damaged on the way (an attribute limit in an SDK or collector?), or an episode "
            "span with another run's ids; the receiver's log names each and says why"
        )
    return "; ".join(parts)


def wire_text(message: str) -> str:
    """``message`` as text protobuf can carry: a message may quote the
    client's input, lone surrogates and all."""
    return message.encode("utf-8", "backslashreplace").decode("utf-8")


def export_response(verdict: Verdict) -> ExportTraceServiceResponse:
    response = ExportTraceServiceResponse()
    if verdict.rejected or verdict.message:
        response.partial_success.CopyFrom(
            ExportTracePartialSuccess(
                rejected_spans=verdict.rejected, error_message=wire_text(verdict.message)
            )
        )
    return response
