"""The books a member keeps of the runs in its partitions: which records of
each run are not done yet, which platform calls were recorded before they
went out, and what a previous owner left; and the run state
(:class:`~..deliver.kafka.state.RunState`) committed from them.

A record counts as done once none of its episodes waits for delivery (and,
for a run's start, end or metrics, once the run is closed): a new owner
skips a run's records up to its state's ``through``, but for the records of
a run's start, end or metrics that are not done yet: ``through`` passes them
(they are listed in the state's ``controls`` and read again by a new owner),
so that a run's start does not hold it back until the run closes, and a
state stays the size of what is in flight, not of the whole run.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from .. import semconv
from .._text import shown
from ..deliver.kafka.owner import FleetOwnership, Intent
from ..deliver.kafka.spool import FleetSpool
from ..deliver.kafka.state import RunState
from ..deliver.spool import RunRow
from ..read.spans import SpanView

logger = logging.getLogger(__name__)

#: Span names whose records are done only once their run is closed.
CONTROL_SPANS = frozenset({semconv.RUN_START_SPAN, semconv.RUN_END_SPAN, semconv.RUN_METRICS_SPAN})


@dataclass
class Record:
    offset: int
    episode_ids: frozenset[str]
    #: Carries a run's start, end or metrics (or an episode without an id).
    control: bool


@dataclass
class RunBook:
    """One run of an owned partition: its records not done yet."""

    partition: int
    through: int = -1
    records: deque[Record] = field(default_factory=deque)
    #: Uploads recorded before they went out, not yet in the spool's books.
    intents: dict[str, list[str]] = field(default_factory=dict)
    creating_at: float | None = None
    finalizing: bool = False
    #: Delivered elsewhere and not yet marked so here.
    delivered_elsewhere: set[str] = field(default_factory=set)
    #: Episodes of legacy sample requests recorded, not yet begun in the spool.
    sampling: set[str] = field(default_factory=set)
    #: Uncertain elsewhere (a sample request may have stored them), not yet counted here.
    uncertain_elsewhere: set[str] = field(default_factory=set)
    #: Counted uncertain by earlier owners in records this one skips, not yet
    #: added to this spool's count (``RunState.uncertain_before``).
    uncertain_before: int = 0
    adopted: bool = False
    written: bytes = b""
    #: Records up to ``through`` not done: a run's start, end or metrics.
    controls: list[Record] = field(default_factory=list)
    #: Offsets up to ``through`` a previous owner left to read again (its ``controls``).
    reread: frozenset[int] = frozenset()

    def skips(self, offset: int) -> bool:
        """A record done already (by this owner or an earlier one): not read again."""
        return offset <= self.through and offset not in self.reread

    def first_offset(self) -> int | None:
        """The first offset a new owner must read from, ``None`` when none is left."""
        offsets = [record.offset for record in self.controls[:1]]
        if self.records:
            offsets.append(self.records[0].offset)
        return min(offsets, default=None)

    def advance(self, run: RunRow | None, waiting: set[str]) -> None:
        """Drop the done records at the head; a run's start, end or metrics
        not done, none of its episodes waiting, is passed too, kept in
        ``controls`` until the run is closed."""
        while self.records:
            head = self.records[0]
            if not _done(head, run, waiting):
                if not head.control or head.episode_ids & waiting:
                    break
                self.controls.append(head)
            self.records.popleft()
            self.through = max(self.through, head.offset)
        self.controls = [record for record in self.controls if not _done(record, run, waiting)]


@dataclass
class Owned:
    """An assigned partition: how far it is read, and when it is caught up."""

    end_at_assignment: int
    position: int | None = None
    ready: bool = False
    blocked_until: float = 0.0


class RunBooks:
    """The books of every run in this member's partitions, by run key."""

    def __init__(self, spool: FleetSpool, ownership: FleetOwnership) -> None:
        self._spool = spool
        self._ownership = ownership
        self.books: dict[str, RunBook] = {}

    def book(self, key: str, partition: int, states: dict[str, RunState]) -> RunBook:
        """The run's book, opened from the state a previous owner committed."""
        book = self.books.get(key)
        if book is None or book.partition != partition:
            book = RunBook(partition)
            state = states.get(key)
            if state is not None and state.partition == partition:
                book.through = state.through
                book.reread = frozenset(state.controls)
                book.delivered_elsewhere = set(state.delivered)
                book.uncertain_elsewhere = set(state.uncertain)
                book.uncertain_before = state.uncertain_before
                book.creating_at = state.creating_at
                book.finalizing = state.finalizing
                self._ownership.inherit(state)
            self.books[key] = book
            self._ownership.bind(key, partition)
        return book

    def in_partition(self, partition: int) -> list[tuple[str, RunBook]]:
        return [(key, book) for key, book in self.books.items() if book.partition == partition]

    def note(self, intent: Intent, owned: Owned | None) -> None:
        """An intent into its run's book, or refused when the run's
        partition is not this member's (caught up) now."""
        book = self.books.get(intent.run_key)
        if book is None or owned is None or not owned.ready:
            intent.error = "the run's partition is not this member's"
            return
        if intent.kind == "upload":
            book.intents[intent.upload_id] = intent.episode_ids
        elif intent.kind == "samples":
            book.sampling.update(intent.episode_ids)
        elif intent.kind == "close":
            book.finalizing = True
        else:
            book.creating_at = intent.at

    def adopt(self, key: str, book: RunBook) -> None:
        """What the previous owner did with the run, applied to this spool."""
        state = self._ownership.inherited(key)
        if state is None:
            return
        run = self._spool.reading.run(key)
        if run is None:
            return
        if not book.adopted:
            book.adopted = True
            self._spool.adopt(key, **_adopted_values(state, run))
            self._spool.delivery.count_uncertain_before(key, book.uncertain_before)
            book.uncertain_before = 0
            logger.info(
                "Run %s: taken over (platform run %s, %d episode(s) delivered before, %d "
                "upload(s) to send again)",
                shown(key),
                state.platform_id,
                len(state.delivered),
                len(state.sending),
            )
        if book.delivered_elsewhere:
            self._spool.handover.delivered_elsewhere(key, book.delivered_elsewhere)
            stored = self._spool.handover.stored_ids(key, book.delivered_elsewhere)
            book.delivered_elsewhere -= {i for i, s in stored.items() if s == "delivered"}
        if book.uncertain_elsewhere:
            counted = self._spool.delivery.uncertain_elsewhere(key, book.uncertain_elsewhere)
            stored = self._spool.handover.stored_ids(key, book.uncertain_elsewhere)
            book.uncertain_elsewhere -= {i for i, s in stored.items() if s == "uncertain"}
            if counted:
                logger.warning(
                    "Run %s: %d episode(s) may have been stored in the sample table by the "
                    "member that delivered the run before; they are not sent again (duplicate "
                    "rows would skew every average). Counted as uncertain.",
                    shown(key),
                    counted,
                )

    def settle(self, key: str, book: RunBook, held: set[str]) -> RunState:
        """The run's state now, its done records dropped from ``book``."""
        handover = self._spool.handover
        run = self._spool.reading.run(key)
        waiting = held | (handover.undelivered_ids(key) if run is not None else set())
        book.advance(run, waiting)
        remaining = {i for record in (*book.controls, *book.records) for i in record.episode_ids}
        stored = handover.stored_ids(key, remaining) if run is not None and remaining else {}
        delivered = {i for i, s in stored.items() if s == "delivered"}
        # A sample request's episodes are "sending" from its start to its answer.
        uncertain = {i for i, s in stored.items() if s in ("sending", "uncertain")}
        begun = handover.stored_ids(key, book.sampling) if run is not None else {}
        book.sampling = {i for i in book.sampling if begun.get(i, "pending") == "pending"}
        platform_id = run.platform_id if run is not None else None
        inherited = self._ownership.inherited(key)
        if platform_id is None and inherited is not None:
            platform_id = inherited.platform_id
        return RunState(
            run=key,
            partition=book.partition,
            through=book.through,
            platform_id=platform_id,
            url=run.url if run is not None else None,
            closed=bool(run is not None and run.closed),
            traces_written=run.traces_written if run is not None else 0,
            # What a previous owner left and this spool has not applied yet goes on too.
            delivered=sorted(delivered | book.delivered_elsewhere),
            sending=self._sending(key, book, run),
            creating_at=None if platform_id else book.creating_at,
            finalizing=book.finalizing and not (run is not None and run.closed),
            uncertain=sorted(uncertain | book.sampling | book.uncertain_elsewhere),
            uncertain_before=book.uncertain_before + _uncertain_done(run, stored),
            controls=[record.offset for record in book.controls],
        )

    def _sending(self, key: str, book: RunBook, run: RunRow | None) -> list[tuple[str, list[str]]]:
        """The run's Prime Traces uploads begun and not confirmed: this
        spool's, the intents not in its books yet, and those inherited."""
        handover = self._spool.handover
        opened = handover.open_traces_uploads(key) if run is not None else []
        open_ids = {upload for upload, _ in opened}
        for upload in list(book.intents):
            if upload not in open_ids and handover.upload_state(upload) is not None:
                del book.intents[upload]  # confirmed, or given up: in the books now
        sending = [*opened, *((u, i) for u, i in book.intents.items() if u not in open_ids)]
        known = {upload for upload, _ in sending}
        sending += [item for item in self._ownership.inherited_uploads(key) if item[0] not in known]
        return [(u, list(i)) for u, i in sending]


def _adopted_values(state: RunState, run: RunRow) -> dict[str, Any]:
    values: dict[str, Any] = {}
    if state.platform_id and not run.platform_id:
        values.update(
            platform_id=state.platform_id,
            url=state.url,
            create_state="created",
            traces_written=state.traces_written,
        )
    if state.closed and not run.closed:
        values.update(close_state="closed", closed_at=time.time())
    elif state.finalizing and not run.closed:
        values.update(close_state="finalizing")
    return values


def _uncertain_done(run: RunRow | None, stored: dict[str, str]) -> int:
    """The episodes this spool counted uncertain in the run's done records:
    all it counted but those of records still to do (``stored``: their
    episodes' states), which go in the state's ``uncertain`` and which the
    next owner, reading those records again, counts itself."""
    if run is None:
        return 0
    return run.uncertain - sum(1 for state in stored.values() if state == "uncertain")


def _done(record: Record, run: RunRow | None, waiting: set[str]) -> bool:
    if run is None:
        return not record.episode_ids & waiting and not record.control
    if record.episode_ids & waiting:
        return False
    return not record.control or run.settled or run.stopped


def episode_ids_of(views: Iterable[SpanView]) -> tuple[frozenset[str], bool]:
    """The episode ids a record's spans carry, and whether they carry more
    than episodes (a run's start, end or metrics, or an episode known by no
    id). Read off the views the spool takes, not off the request again."""
    ids: set[str] = set()
    control = False
    for view in views:
        if view.name in CONTROL_SPANS:
            control = True
            continue
        episode_id = view.attributes.get(semconv.EPISODE_ID)
        if isinstance(episode_id, str) and episode_id:
            ids.add(episode_id)
        elif semconv.EPISODE_EXAMPLE_ID in view.attributes:
            control = True
    return frozenset(ids), control
