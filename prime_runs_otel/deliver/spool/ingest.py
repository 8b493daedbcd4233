"""``export()``'s write: a whole batch of runs, episodes, metrics and run
events committed in one transaction, idempotently (an episode already stored
for its run is a duplicate and changes nothing) and within the size cap.
It touches several tables at once, so it has a module of its own."""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ...read.episodes import EpisodeArrival
from ...read.projection import LineTemplate
from .cap import IngestCap
from .core import SpoolCore, SpoolFullError
from .processes import register_producer as register_producer_row
from .rows import aggregate, insert_rows
from .runs import RunAtIngest, count_batch, ensure_run, owned_by, record_end, record_start
from .size import STOPPED_HELD_SQL, STOPPED_SHARE, USED_BYTES_SQL, SpoolSize
from .steps import insert_metrics, insert_step_tables
from .views import FACT_COLUMNS, fact_values, view_facts_text

if TYPE_CHECKING:
    # Only named in signatures: the records' module imports the OpenTelemetry
    # SDK, which a command that only reads the spool should not pay for.
    from ...read.records import RunBatch


@dataclass(frozen=True)
class IngestOutcome:
    stored: int = 0
    duplicates: int = 0
    corrupt: int = 0
    rejected: int = 0
    #: ``(seq, line template)`` of the stored episodes that came with one
    #: (``EpisodeArrival.line``), for the uploader's ``LineCache``.
    lines: tuple[tuple[int, LineTemplate], ...] = ()
    #: Run ends refused for coming from another producer than the run's
    #: owner (``check_owner``), as ``(run key, sender)``.
    foreign_ends: tuple[tuple[str, str], ...] = ()
    #: ``whole`` batches only: nothing was committed, because ``rejected``
    #: of its new episodes did not fit; nothing is counted on any run.
    refused_whole: bool = False


class _DoesNotFit(Exception):
    """Raised inside the transaction of a ``whole`` batch that does not fit,
    so that it rolls back."""

    def __init__(self, rejected: int) -> None:
        super().__init__(rejected)
        self.rejected = rejected


class SpoolIngest(IngestCap):
    """``export()``'s and ``serve``'s write (``intake``), within the cap that
    ``size.py`` keeps (``_room``)."""

    def __init__(self, core: SpoolCore) -> None:
        super().__init__(core)
        self._room = SpoolSize(core)

    def ingest(
        self,
        batches: Sequence[RunBatch],
        *,
        mode: str,
        register_producer: bool = True,
        owns_runs: bool = True,
        check_owner: bool = False,
        whole: bool = False,
    ) -> IngestOutcome:
        """Commit a whole export batch in one transaction.

        ``register_producer``: record this process as feeding the runs, so its
        death without an end span marks them crashed. A receiver behind a
        collector passes ``False``: its runs are fed by remote producers, whose
        silence (an idle timeout) is what tells a crash. ``owns_runs=False``
        registers a process that feeds runs somebody else owns (a worker of a
        training run): its exit says nothing about whether the run crashed.

        Idempotent: an episode already in the spool for its run is counted as
        a duplicate and changes nothing, so collector retries and replays are
        stored once. At the size cap, and short of the disk's reserve, new
        episodes are refused and counted on their run; run events are always
        accepted (they are tiny, and losing a run's end would leave it open):
        on a full disk the reserve is released for them (``size.py``).

        ``check_owner`` (``serve``, whose senders are anyone holding its
        token): a run is owned by the producer of its first owning start, or
        of its first end if that comes first, and an end from any other
        producer is refused (``IngestOutcome.foreign_ends``), the run left
        open for its owner. In process every sender is this process's own.

        ``whole`` (``serve``, whose senders retry what it refuses): a batch
        whose new episodes do not all fit is not committed at all, and
        nothing of it is counted (``IngestOutcome.refused_whole``). The
        sender still holds it and sends it again; counted ``rejected`` here,
        the episodes its retry stores would be a loss that never happened.
        In process (``export()``) nobody sends a batch again, so what does
        not fit is refused alone and counted, and the rest is kept.
        """
        args = (batches, mode, register_producer, owns_runs, check_owner, whole)
        try:
            return self._ingest_or_refuse(*args)
        except SpoolFullError:
            if not self._room.release_reserve():
                raise
            return self._ingest_or_refuse(*args)

    def _ingest_or_refuse(
        self,
        batches: Sequence[RunBatch],
        mode: str,
        register_producer: bool,
        owns_runs: bool,
        check_owner: bool,
        whole: bool,
    ) -> IngestOutcome:
        try:
            return self._ingest(batches, mode, register_producer, owns_runs, check_owner, whole)
        except _DoesNotFit as refused:
            return IngestOutcome(rejected=refused.rejected, refused_whole=True)

    def _ingest(
        self,
        batches: Sequence[RunBatch],
        mode: str,
        register_producer: bool,
        owns_runs: bool,
        check_owner: bool,
        whole: bool = False,
    ) -> IngestOutcome:
        # The cap and the disk are checked per episode against the bytes in
        # use plus what this batch adds, since one export batch can carry
        # thousands of episodes.
        now = time.time()
        stored = duplicates = corrupt = rejected = 0
        lines: list[tuple[int, LineTemplate]] = []
        foreign: list[tuple[str, str]] = []
        with self._transaction() as db:
            size, stopped_held = db.execute(
                f"SELECT ({USED_BYTES_SQL}), ({STOPPED_HELD_SQL})"
            ).fetchone()
            room = _Room(size, stopped_held, self.max_bytes, self._room.disk_left_for_episodes())
            for batch in batches:
                local_id = batch.identity.local_id
                run = ensure_run(
                    db, batch.identity, mode=mode, now=now, keep_records=self.keep_delivered
                )
                if register_producer:
                    register_producer_row(db, local_id, owns_run=owns_runs, now=now)
                if batch.start is not None:
                    record_start(db, batch.identity, batch.start, claim=check_owner)
                added, refused = self._insert_episodes(
                    db, local_id, batch.episodes, run, room, lines
                )
                stored += added
                rejected += refused
                duplicates += len(batch.episodes) - added - refused
                corrupt += len(batch.corrupt) + len(batch.corrupt_metrics)
                insert_metrics(db, local_id, batch.metrics, now)
                insert_step_tables(db, local_id, batch.samples, now)
                count_batch(db, local_id, batch, run.summary, added, refused, now)
                end = batch.end
                if end is not None and check_owner and not owned_by(db, local_id, end.producer):
                    foreign.append((local_id, end.producer or ""))
                elif end is not None:
                    record_end(db, local_id, end, now)
            if whole and rejected:
                raise _DoesNotFit(rejected)  # rolls the transaction back
        self._warn_near_cap(room.size)
        self._report_refused(rejected - room.disk_refused - room.stopped_refused)
        self._report_refused(room.disk_refused, disk_full=True)
        self._report_refused(room.stopped_refused, stopped=True)
        return IngestOutcome(stored, duplicates, corrupt, rejected, tuple(lines), tuple(foreign))

    def _insert_episodes(
        self,
        db: sqlite3.Connection,
        run_id: str,
        episodes: Sequence[EpisodeArrival],
        run: RunAtIngest,
        room: _Room,
        lines: list[tuple[int, LineTemplate]],
    ) -> tuple[int, int]:
        """Store the new episodes of one run from one batch, as far as
        ``room`` goes; returns how many were added and refused. The line
        templates of those stored go to ``lines`` under their ``seq``.

        A fixed handful of statements whatever the batch size, rather than a
        few per episode: Python's sqlite3 lets go of the GIL on every
        statement, and taking it back can cost a switch interval (5 ms) while
        a producer thread computes, which made ``export()`` wait far longer
        than it worked. So duplicates (stored before, or twice in the batch)
        are found in one read, rollout numbers in another, and rows and
        bodies go in as multi-row inserts. At the cap a new episode is
        refused; one already stored is still a duplicate, not a loss.

        What the viewer shows of the run is not touched: each row carries
        what its aggregates need (``view_facts``), folded in by the first
        view that asks (``folds.py``), not paid by every commit.
        """
        fresh, refused = self._fresh_episodes(db, run_id, episodes, room, stopped=run.stopped)
        if not fresh:
            return 0, refused
        numbers = self._number_rollouts(db, run_id, fresh)
        now = time.time()
        insert_rows(
            db,
            "episodes (run_id, episode_id, has_traces, size, step, rollout_number, stored_at, "
            f"{', '.join(FACT_COLUMNS)}, view_facts)",
            [
                (
                    run_id,
                    e.episode_id,
                    int(e.digest.has_traces),
                    len(e.raw),
                    e.step,
                    number,
                    now,
                    *fact_values(e.digest),
                    view_facts_text(e.digest),
                )
                for e, number in zip(fresh, numbers, strict=True)
            ],
        )
        seqs = _seqs_of(db, run_id, fresh)
        insert_rows(db, "records (seq, body)", [(seqs[e.episode_id], e.raw) for e in fresh])
        lines.extend((seqs[e.episode_id], e.line) for e in fresh if e.line is not None)
        for episode in fresh:
            run.summary.add_digest(episode.digest)
        return len(fresh), refused

    def _fresh_episodes(
        self,
        db: sqlite3.Connection,
        run_id: str,
        episodes: Sequence[EpisodeArrival],
        room: _Room,
        *,
        stopped: bool,
    ) -> tuple[list[EpisodeArrival], int]:
        """The episodes of ``episodes`` to store: not stored before, nor
        twice in the batch, as far as ``room`` goes; and how many were
        refused for want of it. ``stopped``: the run's delivery stopped."""
        ids = [episode.episode_id for episode in episodes]
        known: set[str] = set()
        for stored in aggregate(
            db, "json_group_array(episode_id)", "episodes", run_id, "episode_id", ids
        ):
            known.update(stored)
        fresh: list[EpisodeArrival] = []
        refused = 0
        if not stopped:
            # Kept bodies of delivered episodes go before a new episode is
            # refused at the cap (a stopped run's share is not theirs to free).
            incoming = sum(len(e.raw) for e in episodes if e.episode_id not in known)
            over = room.over_cap(incoming)
            if over > 0:
                room.freed(self._make_room(db, over))
        for episode in episodes:
            if episode.episode_id in known:
                continue
            if not room.take(len(episode.raw), stopped=stopped):
                refused += 1
                continue
            known.add(episode.episode_id)
            fresh.append(episode)
        return fresh, refused

    @staticmethod
    def _number_rollouts(
        db: sqlite3.Connection, run_id: str, episodes: Sequence[EpisodeArrival]
    ) -> list[int | None]:
        """Each episode's number among the rollouts of its example, in arrival
        order, continuing the run's counts; None for an episode without traces."""
        keys = list({e.digest.rollout_key for e in episodes if e.digest.has_traces})
        counts: dict[str, int] = {}
        for found in aggregate(
            db, "json_group_object(example_key, count)", "rollouts", run_id, "example_key", keys
        ):
            counts.update(found)
        numbers: list[int | None] = []
        for episode in episodes:
            if not episode.digest.has_traces:
                numbers.append(None)
                continue
            key = episode.digest.rollout_key
            counts[key] = counts.get(key, 0) + 1
            numbers.append(counts[key])
        if keys:
            insert_rows(
                db,
                "rollouts (run_id, example_key, count)",
                [(run_id, key, counts[key]) for key in keys],
                suffix="ON CONFLICT (run_id, example_key) DO UPDATE SET count = excluded.count",
            )
        return numbers


def _seqs_of(
    db: sqlite3.Connection, run_id: str, episodes: Sequence[EpisodeArrival]
) -> dict[str, int]:
    """The ``seq`` each of ``episodes`` was stored under, by episode id, in one read."""
    seqs: dict[str, int] = {}
    ids = [episode.episode_id for episode in episodes]
    for found in aggregate(
        db, "json_group_object(episode_id, seq)", "episodes", run_id, "episode_id", ids
    ):
        seqs.update(found)
    return seqs


@dataclass
class _Room:
    """What one ingest may still add. Runs still delivering share the cap
    (``size`` less what stopped runs hold); runs whose delivery stopped
    share ``STOPPED_SHARE`` of it among themselves, and never take the
    others' room; nobody takes the disk's reserve (``disk_left``; ``None``
    when the disk cannot be asked). A byte costs the disk twice until the
    next checkpoint (the write-ahead log, then the file)."""

    size: int
    stopped_held: int
    cap: int
    disk_left: int | None
    disk_refused: int = 0
    stopped_refused: int = 0

    def over_cap(self, incoming: int) -> int:
        """By how much ``incoming`` bytes of a run still delivering would
        pass the cap (0 or less: they fit)."""
        return self.size - self.stopped_held + incoming - self.cap

    def freed(self, length: int) -> None:
        """``length`` bytes were given back (kept bodies dropped at the cap)."""
        self.size = max(self.stopped_held, self.size - length)

    def take(self, length: int, *, stopped: bool) -> bool:
        if stopped:
            if self.stopped_held + length > self.cap * STOPPED_SHARE:
                self.stopped_refused += 1
                return False
        elif self.size - self.stopped_held + length > self.cap:
            return False
        if self.disk_left is not None:
            if self.disk_left < 2 * length:
                self.disk_refused += 1
                return False
            self.disk_left -= 2 * length
        self.size += length
        if stopped:
            self.stopped_held += length
        return True
