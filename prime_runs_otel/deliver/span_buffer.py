"""What the span buffer holds for a delivery: which episodes its last
release let go (kept when their commit fails, since nothing else would
bring them again), and the report of what it let go unused."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from ..read.records import RunBatch
from ..read.span_tree import SpanTree, SpanTreeBuffer

logger = logging.getLogger(__name__)


class WatchedTrees(SpanTreeBuffer):
    """A span buffer that remembers which episodes its last release let go,
    so a failed commit can keep exactly those: nothing else would bring an
    episode already released again."""

    released: frozenset[str] = frozenset()

    def release(self, *, flush: bool = False) -> list[SpanTree]:
        trees = super().release(flush=flush)
        self.released = frozenset(tree.root.episode_id for tree in trees)
        return trees


def released_part(batches: list[RunBatch], trees: WatchedTrees) -> list[RunBatch]:
    """The episodes of ``batches`` the buffer released (synthesised ones):
    nothing else would bring them again after a failed commit."""
    kept = []
    for batch in batches:
        episodes = [item for item in batch.episodes if item.episode_id in trees.released]
        if episodes:
            kept.append(RunBatch(identity=batch.identity, episodes=episodes))
    return kept


class BufferReport:
    """Logs what the span buffer let go unused. Model-call spans under no
    episode span make no episode: a run fed only those would close
    "completed, 0 episodes" without a word otherwise. Reported at most once a
    minute: an application whose other GenAI traces share the pipeline would
    flood the log."""

    INTERVAL = 60.0

    def __init__(
        self,
        trees: SpanTreeBuffer,
        advice: str = "",
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._trees = trees
        self._advice = advice
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
            "%d model-call span(s) arrived under no episode span and make no episode (%d so "
            "far). Wrap each rollout in prime_runs_otel.episode_span(...) in the producer%s.",
            unclaimed,
            stats.unclaimed_model_calls,
            self._advice,
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
