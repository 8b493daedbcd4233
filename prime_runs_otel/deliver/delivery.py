"""Span views → the spool: the one way in, whoever sent the spans.

Both entry points hand their spans here: the in-process exporter
(``exporter.py``, the SDK's ``SpanExporter`` contract) and ``serve``'s
intake (``collector/intake.py``, OTLP requests over HTTP, gRPC or Kafka).
A :class:`SpanDelivery` reads each span once, groups them by run (holding the
spans of other instrumentations until their episode's tree is whole),
refuses what may not come in, commits the rest in one transaction and wakes
the uploader. It answers with a :class:`Delivered` that each entry point
translates: a ``SpanExportResult``, or an HTTP/gRPC status.

The rules, one set for both:

- A bad span costs itself only: one that cannot be read, a damaged record,
  an episode of no run, a run end from another producer, a run asking to
  attach where that is not allowed: each is refused alone and counted in
  ``Delivered.refused``; the rest of the batch is committed.
- An item the spool cannot store (a value SQLite refuses) is refused alone:
  the batch is committed again item by item.
- Episodes that do not fit (the spool's cap, its disk's reserve) and a
  commit the disk fails cost what the :class:`Sender` can bear. A sender that
  sends again what is refused (an OTLP client) is refused whole, nothing
  counted, and told when to come back. One that cannot (the SDK drops a
  failed batch) keeps what fits, and each episode not kept is counted on its
  run as ``rejected``. Either way, what the span buffer released and run
  ends held for it are kept and committed first next time: nothing else
  would bring them again.
- A run's end is held back while episodes of the run wait in the span
  buffer, so a run never closes before its last episode is in the spool.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

from .. import semconv
from .._text import shown
from ..config import Settings
from ..read.ingest import Fallback, Grouped, damage_lines, group_by_run
from ..read.records import RunBatch
from ..read.spans import SpanView
from .batch_items import describe, is_episode, item_count, items_of, read_ahead, run_key
from .outcome import (
    COMMIT_RETRY_AFTER,
    FULL_RETRY_AFTER,
    TRANSIENT,
    Delivered,
    Sender,
    log_foreign_ends,
    refusal_message,
)
from .span_buffer import BufferReport, WatchedTrees, released_part
from .spool import IngestOutcome, Spool
from .uploader import Uploader

#: What the entry points import from here; the values and helpers live in
#: ``outcome.py`` (what a batch became, who sent it), ``span_buffer.py``
#: (what the span buffer let go) and ``batch_items.py`` (a batch item by item).
__all__ = [
    "COMMIT_RETRY_AFTER",
    "FULL_RETRY_AFTER",
    "TRANSIENT",
    "BufferReport",
    "Delivered",
    "Sender",
    "SpanDelivery",
    "WatchedTrees",
    "is_episode",
    "read_ahead",
    "refusal_message",
    "run_key",
]

logger = logging.getLogger(__name__)


class SpanDelivery:
    """Span views → per-run batches → refusals → one commit → the uploader.

    Episodes are read (parsed, checked, projected) before the lock, which
    guards the span buffer and the commit, so one worker reads while another
    waits for its commit to reach the disk; what the buffer releases reaches
    the spool in order. The buffer lives in memory only: spans it holds when
    the process dies are lost with it, which is why its wait is seconds.
    """

    def __init__(
        self,
        spool: Spool,
        settings: Settings,
        uploader: Uploader | None,
        sender: Sender,
        *,
        trees: WatchedTrees | None = None,
        fallback: Fallback | None = None,
        on_commit: Callable[[IngestOutcome], None] | None = None,
        unclaimed_advice: str = "",
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.spool = spool
        self.settings = settings
        self.sender = sender
        self.trees = trees if trees is not None else WatchedTrees()
        self._uploader = uploader
        self._fallback = fallback
        self._on_commit = on_commit
        #: Episodes read off spans get their Prime Traces line built there,
        #: for the uploader (``deliver/lines.py``).
        self._lines = uploader is not None and settings.sends_prime_traces
        self.lock = threading.Lock()
        self._owner_pid = os.getpid()
        self._report = BufferReport(self.trees, unclaimed_advice, clock)
        #: Damaged items logged once a minute per run and kind, however many copies.
        self._damage = damage_lines(clock)
        #: Run ends waiting for the run's held episodes, by run key.
        self._held_ends: dict[str, RunBatch] = {}
        #: Released episodes (and run ends) whose commit failed, retried first.
        self.uncommitted: list[RunBatch] = []
        #: Items of the last commit refused on their own (see :meth:`commit`).
        self.refused_items = 0
        self._refused_attach: set[str] = set()
        #: Why the last commit failed, until one succeeds.
        self.commit_problem: str | None = None
        #: Episode spans that named no run, in all.
        self.unattributed = 0
        #: The runs this delivery committed to (in process only: ``serve``'s
        #: runs are not its to wait for or end).
        self.seen: set[str] = set()
        #: Per run, episodes not kept and not yet counted on the run (the
        #: spool could not be written): counted once it takes writes again.
        self._lost: dict[str, int] = {}
        #: Guards ``seen`` and the lost counts, which the run's own thread
        #: reads and adds to while a batch is committed.
        self._runs_lock = threading.Lock()

    def after_fork(self) -> None:
        """In a forked child: a lock another thread of the parent held at the
        fork would stay held forever."""
        self.lock = threading.Lock()
        self._runs_lock = threading.Lock()

    def seen_runs(self) -> list[str]:
        """The runs committed to in this process, in no order."""
        with self._runs_lock:
            return list(self.seen)

    # -- a batch from the sender ------------------------------------------------

    def deliver(self, views: Iterable[SpanView]) -> Delivered:
        """Commit a batch of spans; what became of it."""
        views = [read_ahead(view, self._lines) for view in views]
        with self.lock:
            # Checked before the buffer sees the spans, so a refused batch
            # leaves no trace: its sender sends it again, not counted lost.
            if (
                self.sender.retries
                and not self.spool.housekeeping.has_room()
                and any(map(is_episode, views))
            ):
                return self.full()
            grouped = group_by_run(
                views,
                trees=self.trees,
                fallback=self._fallback,
                lines=self._lines,
                repeats=self._damage,
            )
            self._report.update()
            self.refused_items = 0
            attaching = self._refuse_attaching(grouped)
            self.unattributed += grouped.unattributed
            if grouped.unattributed and not grouped.batches and not self.uncommitted:
                return Delivered(
                    "invalid",
                    f"{grouped.unattributed} episode span(s) carry no {semconv.RUN_ID} on "
                    "their Resource, so they belong to no run; set it with run_resource(...) "
                    f"or OTEL_RESOURCE_ATTRIBUTES={semconv.RUN_ID}=<run key>",
                )
            try:
                outcome = self.commit(grouped.batches, whole=self.sender.retries)
            except TRANSIENT as exc:
                return self._failed(grouped, exc)
        if outcome.refused_whole:
            # Nothing of it was committed or counted lost; its sender retries.
            return self.full()
        corrupt = sum(len(batch.corrupt) for batch in grouped.batches)
        unreadable = grouped.unreadable + self.refused_items
        foreign = len(outcome.foreign_ends)
        return Delivered(
            "accepted",
            refusal_message(grouped.unattributed, corrupt, unreadable, foreign, attaching),
            refused=grouped.unattributed + corrupt + unreadable + foreign + attaching,
            lost=outcome.rejected,
        )

    def _failed(self, grouped: Grouped, exc: BaseException) -> Delivered:
        """The disk failed the commit: a sender that retries is told to; for
        one that does not, the batch's own episodes are lost and counted."""
        if self.sender.retries:
            logger.error("Committing a batch to the spool %s failed: %s", self.spool.path, exc)
            lost = 0
        else:
            lost = self._count_lost(grouped.batches)
            logger.error(
                "prime-runs-otel could not commit a batch to the spool %s: %s. Its %d "
                "episode(s) are lost (counted on their runs as rejected); check disk space "
                "and permissions.",
                self.spool.path,
                exc,
                lost,
            )
        return Delivered(
            "unavailable",
            f"the batch could not be committed to the spool ({exc}); retry later",
            lost=lost,
            retry_after=COMMIT_RETRY_AFTER,
        )

    def full(self) -> Delivered:
        """The answer while new episodes would be refused: which limit (the
        disk or the cap) and what frees it; checked again at each batch."""
        problem = self.spool.housekeeping.room_problem() or (
            f"the spool is at its cap of {self.spool.max_bytes} bytes until delivery frees room"
        )
        return Delivered(
            "full",
            f"{problem}; retry later (the receiver's PRIME_RUNS_OTEL_SPOOL_MAX_BYTES and "
            "PRIME_RUNS_OTEL_DIR set its cap and disk)",
            retry_after=FULL_RETRY_AFTER,
        )

    # -- what the span buffer holds ---------------------------------------------

    def release_settled(self) -> None:
        """Commit the episodes that waited long enough for their spans.

        While the spool is full they wait on (the buffer's bound still
        holds): released now, they would only be refused and counted lost.
        """
        with self.lock:
            self._damage.flush()
            idle = not (len(self.trees) or self.trees.pending_episodes or self.uncommitted)
            if (idle and not self._held_ends) or not self.spool.housekeeping.has_room():
                return
            grouped = group_by_run(
                (), trees=self.trees, fallback=self._fallback, repeats=self._damage
            )
            self._report.update()
            self._refuse_attaching(grouped)
            try:
                self.commit(grouped.batches)
            except TRANSIENT as exc:
                logger.error(
                    "Committing synthesised episodes to the spool %s failed (%s); retrying",
                    self.spool.path,
                    exc,
                )

    def flush(self) -> None:
        """Commit every episode still held, with the spans that arrived for it
        (the process is stopping), and report what synthesis could not keep."""
        with self.lock:
            grouped = group_by_run(
                (), trees=self.trees, flush=True, fallback=self._fallback, repeats=self._damage
            )
            self._damage.flush(everything=True)
            self._refuse_attaching(grouped)
            try:
                self.commit(grouped.batches)
            except TRANSIENT as exc:
                episodes = sum(len(batch.episodes) for batch in self.uncommitted)
                logger.error(
                    "Stopping: %d synthesised episode(s) could not be committed to the spool "
                    "%s and are lost: %s",
                    episodes,
                    self.spool.path,
                    exc,
                )
            self._report.summary()
        self.settle_lost()

    def held_episode_ids(self) -> dict[str, set[str]]:
        """The episodes held in the span buffer now, by run key: not in the
        spool yet, so not delivered."""
        held: dict[str, set[str]] = {}
        with self.lock:
            for episode in self.trees.held_episodes():
                key = run_key(episode.view.resource)
                if key is not None:
                    held.setdefault(key, set()).add(episode.episode_id)
            for batch in self.uncommitted:
                for item in batch.episodes:
                    held.setdefault(batch.identity.local_id, set()).add(item.episode_id)
        return held

    # -- the commit ---------------------------------------------------------------

    def commit(self, batches: list[RunBatch], *, whole: bool = False) -> IngestOutcome:
        """Commit ``batches`` after anything whose commit failed before, with
        run ends held back until their runs' episodes are out of the buffer.

        ``whole``: nothing is committed unless every new episode fits (the
        spool's ``whole``), so the sender's retry is no loss counted twice.
        Episodes released by the buffer for timers have no sender to retry
        them: refused, they are lost, and counted on their run.
        """
        ends = self._ends_ready(batches)
        pending = [*self.uncommitted, *batches, *ends]
        if not pending:
            return IngestOutcome()
        try:
            outcome = self._ingest(pending, whole)
        except TRANSIENT as exc:
            # The disk, not the items: keep what nothing else would bring again.
            self.uncommitted = [*self.uncommitted, *released_part(batches, self.trees), *ends]
            self.commit_problem = f"commits to the spool fail: {exc}"
            raise
        except Exception as exc:
            # Something in the items: commit them one by one, so the one that
            # cannot be stored costs itself only, never the batches after it.
            logger.warning(
                "A batch could not be committed as a whole (%s: %s); committing its items "
                "one by one",
                type(exc).__name__,
                shown(exc),
            )
            outcome = self._commit_each(pending, whole=whole)
        self.commit_problem = None
        if outcome.refused_whole:
            # Not committed: the batch comes again, but what the buffer
            # released for it (and run ends held for those) only from here.
            self.uncommitted = [*self.uncommitted, *released_part(batches, self.trees), *ends]
            return outcome
        self.uncommitted = []
        self._committed(pending, outcome)
        return outcome

    def _ingest(self, batches: list[RunBatch], whole: bool) -> IngestOutcome:
        in_process = self.sender.in_process
        return self.spool.intake.ingest(
            batches,
            mode=self.settings.mode,
            register_producer=in_process,
            owns_runs=self.sender.owns_runs,
            check_owner=not in_process,
            whole=whole,
        )

    def _committed(self, batches: list[RunBatch], outcome: IngestOutcome) -> None:
        log_foreign_ends(outcome.foreign_ends)
        if self.sender.in_process:
            with self._runs_lock:
                self.seen.update(batch.identity.local_id for batch in batches)
        if self._on_commit is not None:
            self._on_commit(outcome)
        self.settle_lost()
        self.wake(outcome)

    def wake(self, outcome: IngestOutcome | None = None) -> None:
        """Have the uploader deliver what was just committed. A forked child
        never delivers (the parent's uploader does), and the uploader's locks
        may have been held by a thread of the parent at the fork: touching
        them there could wait forever."""
        if self._uploader is None or os.getpid() != self._owner_pid:
            return
        if outcome is not None and outcome.lines:
            self._uploader.lines.keep(outcome.lines)
        self._uploader.wake()

    def _commit_each(self, pending: list[RunBatch], *, whole: bool) -> IngestOutcome:
        """Commit every item of ``pending`` alone; refuse (count and name) the
        ones that fail on their own. A transient failure stops it, the items
        not yet committed kept for the retry. ``whole``: an episode that does
        not fit is not counted, and the outcome says the batch must come
        again (its committed items are duplicates then)."""
        rejected = refused = 0
        foreign: list[tuple[str, str]] = []
        lines: list[Any] = []
        items = [item for batch in pending for item in items_of(batch)]
        for index, item in enumerate(items):
            try:
                outcome = self._ingest([item], whole)
            except TRANSIENT as exc:
                self.uncommitted = items[index:]
                self.commit_problem = f"commits to the spool fail: {exc}"
                raise
            except Exception as exc:
                self.refused_items += 1
                refused += 1
                if refused <= 5:
                    logger.warning(
                        "Run %s: refused %s that cannot be stored: %s: %s",
                        shown(item.identity.local_id),
                        describe(item),
                        type(exc).__name__,
                        shown(exc),
                    )
                continue
            rejected += outcome.rejected
            foreign += outcome.foreign_ends
            lines += outcome.lines
        if refused > 5:
            logger.warning("%d more item(s) of the batch were refused the same way", refused - 5)
        return IngestOutcome(
            rejected=rejected,
            foreign_ends=tuple(foreign),
            lines=tuple(lines),
            refused_whole=whole and rejected > 0,
        )

    def _ends_ready(self, batches: list[RunBatch]) -> list[RunBatch]:
        """Hold back the ends of runs with episodes still in the buffer; return
        the held ends whose runs have none left."""
        waiting = {run_key(episode.view.resource) for episode in self.trees.held_episodes()}
        for batch in batches:
            key = batch.identity.local_id
            if batch.end is not None and key in waiting:
                self._held_ends[key] = RunBatch(identity=batch.identity, end=batch.end)
                batch.end = None
        ready = [key for key in self._held_ends if key not in waiting]
        return [self._held_ends.pop(key) for key in ready]

    def _refuse_attaching(self, grouped: Grouped) -> int:
        """Take the runs that name a platform run to attach to out of
        ``grouped`` unless the sender may; returns their spans' count.

        ``prime.run.attach`` would let anyone holding ``serve``'s token add
        episodes to, and finalize, any run the platform key reaches: it is
        the operator's choice (``--allow-attach``), not a sender's.
        """
        if self.sender.allow_attach:
            return 0
        kept, refused = [], 0
        for batch in grouped.batches:
            if batch.identity.attach is None:
                kept.append(batch)
                continue
            refused += item_count(batch)
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

    # -- episodes lost on the way --------------------------------------------------

    def _count_lost(self, batches: list[RunBatch]) -> int:
        """The episodes of ``batches`` that nothing will bring again (those the
        buffer released are kept for the next commit), held to be counted on
        their runs."""
        lost = 0
        for batch in batches:
            local_id = batch.identity.local_id
            count = sum(1 for item in batch.episodes if item.episode_id not in self.trees.released)
            with self._runs_lock:
                self.seen.add(local_id)
                if count:
                    self._lost[local_id] = self._lost.get(local_id, 0) + count
            lost += count
        return lost

    def count_lost(self, local_id: str, count: int) -> None:
        """``count`` episodes of the run never reached the delivery: counted
        on the run as rejected, as those whose commit failed are."""
        with self._runs_lock:
            self._lost[local_id] = self._lost.get(local_id, 0) + count
        self.settle_lost()

    def lost(self, local_id: str) -> int:
        """Episodes of the run lost here and not yet counted in the spool."""
        return self._lost.get(local_id, 0)

    def settle_lost(self) -> None:
        """Write the count of lost episodes onto their runs, now that the
        spool takes writes again."""
        if not self._lost:
            return
        with self._runs_lock:
            lost, self._lost = self._lost, {}
        for local_id, count in lost.items():
            try:
                self.spool.intake.count_rejected(local_id, count)
            except Exception:
                with self._runs_lock:
                    self._lost[local_id] = self._lost.get(local_id, 0) + count
