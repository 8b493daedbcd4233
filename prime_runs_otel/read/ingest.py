"""Span views → per-run spool batches.

The one step between "spans arrived" and "the spool commits them", shared by
the in-process exporter and the OTLP receiver so both treat the same spans
the same way. Each span is checked once (:mod:`~prime_runs_otel.read.checks`)
into what it means to its run, and filed under the run its Resource names:
run events, step metrics and episode records; corrupted records and
unattributable episodes are counted.

Episode spans without a record (code traced by another instrumentation) get
theirs synthesised from their span tree (:mod:`~prime_runs_otel.read.synthesis`),
which a :class:`~prime_runs_otel.read.span_tree.SpanTreeBuffer` holds until it
is in; without a buffer such an episode is counted as lost.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass, field, replace
from typing import Any, TypeAlias

from .. import semconv
from .._text import shown
from .checks import read_span, read_synthesized, run_identity
from .episodes import CorruptEpisode, EpisodeArrival
from .records import (
    CorruptMetrics,
    RunBatch,
    RunEnd,
    RunIdentity,
    RunMetrics,
    RunSamples,
    RunStart,
    UnrecordedEpisode,
)
from .repeats import RepeatedLines
from .span_tree import BufferStats, SpanTree, SpanTreeBuffer
from .spans import SpanView
from .synthesis import synthesize_record

__all__ = ["Grouped", "damage_lines", "group_by_run"]

logger = logging.getLogger(__name__)

#: Unreadable spans named one by one per call; the rest are counted, so a
#: request of a million bad spans is a few log lines, not a million.
_NAMED_PER_CALL = 5


@dataclass
class Grouped:
    batches: list[RunBatch] = field(default_factory=list)
    #: Episode spans whose Resource names no run (``prime.run.id`` missing).
    unattributed: int = 0
    #: Episode records synthesised from span trees in this call.
    synthesized: int = 0
    #: Spans that could not be read at all (each logged with its ids).
    unreadable: int = 0


def damage_lines(clock: Callable[[], float] = time.monotonic) -> RepeatedLines:
    """The log of damaged items for a delivery to keep across its calls of
    :func:`group_by_run`: one line a minute per run and kind of damage."""
    return RepeatedLines(logger, clock=clock)


#: The run of a span whose Resource names none (``None``: it belongs to no run).
Fallback: TypeAlias = Callable[[Mapping[str, Any]], "RunIdentity | None"]


class _Batches:
    """Per-run batches in first-seen order, keyed by the run's local id."""

    def __init__(self, fallback: Fallback | None, repeats: RepeatedLines) -> None:
        self.by_run: dict[str, RunBatch] = {}
        self._keys: dict[int, str | None] = {}
        self._fallback = fallback
        self.repeats = repeats

    def adopt(self, view: SpanView) -> str | None:
        """A run span with no run on its Resource: the fallback run, if any.
        Only spans that mean something to a run get here, so spans of other
        instrumentations never open a run of their own."""
        if self._fallback is None:
            return None
        identity = self._fallback(view.resource)
        if identity is None:
            return None
        self._keys[id(view.resource)] = identity.local_id
        self.by_run.setdefault(identity.local_id, RunBatch(identity=identity))
        return identity.local_id

    def key_of(self, view: SpanView) -> str | None:
        """The run a span belongs to (``None``: no run), its batch opened."""
        marker = id(view.resource)
        if marker in self._keys:
            return self._keys[marker]
        identity = run_identity(view.resource)
        key = identity.local_id if identity is not None else None
        self._keys[marker] = key
        if identity is not None and key not in self.by_run:
            self.by_run[identity.local_id] = RunBatch(identity=identity)
        return key


def group_by_run(
    views: Iterable[SpanView],
    *,
    trees: SpanTreeBuffer | None = None,
    flush: bool = False,
    fallback: Fallback | None = None,
    lines: bool = False,
    repeats: RepeatedLines | None = None,
) -> Grouped:
    """Group spans by run, keeping arrival order within each run.

    ``trees`` holds the spans episodes without a record are synthesised from,
    across calls; ``flush`` releases every episode it still holds (at
    shutdown). ``fallback`` names the run of run spans whose Resource names
    none (an in-process exporter's own process); without it they are counted
    as unattributed. ``lines``: the runs go to Prime Traces, so each episode
    read from its span gets its line template built (see :func:`read_span`).
    ``repeats`` logs the damaged items a run keeps receiving once a window
    (a delivery keeps one across calls); without it, once a call.
    """
    grouped = Grouped()
    batches = _Batches(fallback, repeats or RepeatedLines(logger))
    before = BufferStats(**asdict(trees.stats)) if trees is not None else None
    for view in views:
        # Every span is outside input: one that breaks a reader costs itself
        # only, never the spans beside it.
        try:
            _group_one(view, batches, grouped, trees, lines)
        except Exception as exc:
            grouped.unreadable += 1
            if grouped.unreadable <= _NAMED_PER_CALL:
                logger.warning(
                    "Span %s (trace %032x, span %016x) could not be read and was let go: %s: %s",
                    shown(view.name, 80),
                    view.trace_id,
                    view.span_id,
                    type(exc).__name__,
                    shown(exc),
                )
    if grouped.unreadable > _NAMED_PER_CALL:
        logger.warning(
            "%d more span(s) of the same request could not be read and were let go",
            grouped.unreadable - _NAMED_PER_CALL,
        )
    if trees is not None:
        _file_released(trees, flush, batches, grouped)
        _report_buffer(before, trees.stats)
    batches.repeats.flush(everything=repeats is None)
    if grouped.unattributed:
        logger.error(
            "%d episode span(s) carry no %s on their Resource and cannot be attributed to a "
            "run. Set it with prime_runs_otel.run_resource(...) or OTEL_RESOURCE_ATTRIBUTES.",
            grouped.unattributed,
            semconv.RUN_ID,
        )
    grouped.batches = list(batches.by_run.values())
    return grouped


def _file_released(trees: SpanTreeBuffer, flush: bool, batches: _Batches, grouped: Grouped) -> None:
    """File the episodes synthesised from the trees the buffer lets go of; a
    tree is outside input too, so one that breaks costs itself only."""
    for tree in trees.release(flush=flush):
        try:
            _file_synthesized(batches, grouped, tree)
        except Exception as exc:
            grouped.unreadable += 1
            logger.warning(
                "Episode %s could not be filed and was let go: %s: %s",
                shown(tree.root.episode_id),
                type(exc).__name__,
                shown(exc),
            )


def _group_one(
    view: SpanView,
    batches: _Batches,
    grouped: Grouped,
    trees: SpanTreeBuffer | None,
    lines: bool = False,
) -> None:
    key = batches.key_of(view)
    item = read_span(view, lines=lines)
    if item is None:
        if trees is not None:
            trees.add(view)
        return
    if isinstance(item, UnrecordedEpisode) and trees is not None:
        if trees.add_episode(item):
            return
        # Taken, it would be mistaken for the other run's episode: counted lost.
        item = CorruptEpisode(
            item.episode_id,
            "its episode span has the trace and span ids of another run's episode span, "
            "which were taken first; give each episode span ids of its own",
        )
    if isinstance(item, (EpisodeArrival, CorruptEpisode)) and trees is not None:
        # Its agent and model-call spans are its own, damaged or not: they
        # wait for nothing, and are no model calls "under no episode span".
        trees.claim_native(view)
    if key is None:
        key = batches.adopt(view)
    if key is None:
        if isinstance(item, (EpisodeArrival, CorruptEpisode, UnrecordedEpisode)):
            grouped.unattributed += 1
        return
    if isinstance(item, (RunStart, RunEnd)):
        item = replace(item, producer=_producer_of(view.resource))
    _file(batches.by_run[key], key, item, batches.repeats)


def _producer_of(resource: Mapping[str, Any]) -> str:
    """The producer a Resource names (``service.instance.id``; ``""``: none)."""
    instance = resource.get(semconv.SERVICE_INSTANCE_ID)
    return instance if isinstance(instance, str) else ""


def _file(
    batch: RunBatch,
    key: str,
    item: RunStart
    | RunEnd
    | EpisodeArrival
    | CorruptEpisode
    | UnrecordedEpisode
    | RunMetrics
    | CorruptMetrics
    | RunSamples,
    repeats: RepeatedLines,
) -> None:
    if isinstance(item, EpisodeArrival):
        batch.episodes.append(item)
    elif isinstance(item, UnrecordedEpisode):
        _file(
            batch,
            key,
            CorruptEpisode(
                item.episode_id,
                "the episode span carries no record, and this consumer does not synthesise "
                "records from span trees",
            ),
            repeats,
        )
    elif isinstance(item, CorruptEpisode):
        repeats.log(
            logging.ERROR,
            "episodes arrived damaged",
            shown(key),
            "Run %s: episode %s arrived damaged and is counted as lost: %s",
            shown(key),
            shown(item.episode_id or "(unknown id)"),
            shown(item.reason),
        )
        batch.corrupt.append(item)
    elif isinstance(item, RunMetrics):
        batch.metrics.append(item)
    elif isinstance(item, RunSamples):
        batch.samples.append(item)
    elif isinstance(item, CorruptMetrics):
        repeats.log(
            logging.ERROR,
            "step metrics arrived damaged",
            shown(key),
            "Run %s: the metrics of step %s arrived damaged and are counted as lost: %s",
            shown(key),
            item.step if item.step is not None else "(unknown)",
            shown(item.reason),
        )
        batch.corrupt_metrics.append(item)
    elif isinstance(item, RunStart):
        if item.corrupt_reason is not None:
            _damaged_config(repeats, key, item.corrupt_reason)
        batch.start = item
    elif isinstance(item, RunEnd):
        batch.end = item


def _damaged_config(repeats: RepeatedLines, key: str, reason: str) -> None:
    """A run start whose config arrived damaged: the run goes on with an
    empty one, said once a window however many copies of the start arrive."""
    repeats.log(
        logging.WARNING,
        "run starts arrived with a damaged config",
        shown(key),
        "Run %s: %s; the run goes on without it",
        shown(key),
        shown(reason),
    )


def _file_synthesized(batches: _Batches, grouped: Grouped, tree: SpanTree) -> None:
    root = tree.root.view
    key = batches.key_of(root)
    if key is None:
        key = batches.adopt(root)
    if key is None:
        grouped.unattributed += 1
        return
    batch = batches.by_run[key]
    _file(batch, key, _synthesized(tree, batch.identity), batches.repeats)
    grouped.synthesized += 1


def _synthesized(tree: SpanTree, identity: RunIdentity) -> EpisodeArrival | CorruptEpisode:
    """The tree's episode, or a counted loss when it cannot be built (a span
    tree is outside input: it must never take the export down)."""
    root = tree.root
    try:
        record = synthesize_record(root.view, tree.spans, identity)
        arrival = read_synthesized(
            record, root.episode_id, root.view.attributes.get(semconv.RUN_STEP)
        )
    except Exception as exc:
        logger.warning(
            "Run %s: synthesising episode %s failed: %s: %s",
            shown(identity.local_id),
            shown(root.episode_id),
            type(exc).__name__,
            shown(exc),
        )
        return CorruptEpisode(root.episode_id, f"its record could not be synthesised: {exc}")
    return arrival


def _report_buffer(before: BufferStats | None, after: BufferStats) -> None:
    """Log what the buffer could not keep whole since the last call."""
    if before is None:
        return
    late = after.late_spans - before.late_spans
    evicted = after.evicted_spans - before.evicted_spans
    if late:
        logger.warning(
            "%d span(s) arrived after the episode they belong to was synthesised; that "
            "episode went out without them (%d incomplete so far). Behind a collector, "
            "raise the wait for stragglers.",
            late,
            after.incomplete_episodes,
        )
    if evicted:
        logger.warning(
            "%d span(s) were dropped to keep the span buffer within its bound; episodes "
            "still waiting for them went out as they were (%d incomplete so far)",
            evicted,
            after.incomplete_episodes,
        )
