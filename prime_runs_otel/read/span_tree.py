"""Spans held until each episode span's tree is whole.

An episode span without a record gets one synthesised from the spans under it
(:mod:`prime_runs_otel.read.synthesis`), and those may reach the consumer
after it: a collector does not keep order. :class:`SpanTreeBuffer` holds
spans by trace id until each episode's tree is in, with a bounded wait and
bounded memory, and counts what never completes instead of dropping it
silently. It knows spans by their ids and parents only, and asks
:mod:`prime_runs_otel.read.dialects` which of them are model calls.
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace

from .. import semconv as sc
from .._text import shown
from .checks import derived_episode_id
from .dialects.calls import carries_messages, is_model_call
from .held_trace import HeldTrace, event_weight
from .records import UnrecordedEpisode
from .spans import SpanEventView, SpanView

__all__ = ["DEFAULT_MAX_HELD_VALUES", "BufferStats", "SpanTree", "SpanTreeBuffer"]

logger = logging.getLogger(__name__)

#: Attribute values held for synthesis at most (about 100 bytes each once
#: decoded): past it the oldest trace is let go, as past ``max_spans``.
DEFAULT_MAX_HELD_VALUES = 4_000_000


@dataclass(frozen=True)
class SpanTree:
    """An episode span with every descendant that arrived for it.

    ``complete`` is ``False`` when the memory bound forced the episode out
    early, with spans that might have belonged to it still missing.
    """

    root: UnrecordedEpisode
    spans: tuple[SpanView, ...]
    complete: bool = True


@dataclass
class BufferStats:
    """What the buffer could not keep whole: each count is of spans or
    episodes that reached the platform incomplete, or not at all."""

    #: Episodes synthesised without all of their spans: forced out by the
    #: memory bound, or a descendant arrived after the episode was released.
    incomplete_episodes: int = 0
    #: Spans that arrived after their episode was already synthesised.
    late_spans: int = 0
    #: Model-call spans under no episode span within the wait.
    unclaimed_model_calls: int = 0
    #: Spans dropped to stay within the memory bound.
    evicted_spans: int = 0
    #: Episodes whose model calls carried no messages (content capture off in
    #: the instrumentation): their records have usage but no conversation.
    episodes_without_messages: int = 0
    #: Events sent apart from their span (log records in its context) that
    #: arrived after their episode was synthesised, or whose span never came.
    late_events: int = 0
    unclaimed_events: int = 0


def _run_of(episode: UnrecordedEpisode) -> str:
    run = episode.view.resource.get(sc.RUN_ID)
    return run if isinstance(run, str) else ""


#: What a released span id stands for: the episode it was synthesised into
#: (a late straggler of it is counted), or nothing (a native episode's child).
_Released = tuple[int, int] | None


class SpanTreeBuffer:
    """Spans held by trace id until each episode span's tree is in.

    In the producer's own process the SDK exports a span once it has ended,
    and a parent ends after its children, so an episode span's tree is whole
    when the episode span arrives: ``settle_seconds=0`` releases it then.
    Behind a collector batches arrive in any order, so a positive
    ``settle_seconds`` holds each episode that long for its stragglers; one
    that still comes later is counted (``late_spans``, and its episode in
    ``incomplete_episodes``). Spans of traces without an episode span are let
    go after ``max_wait_seconds`` of silence, and at most ``max_spans`` are
    held: when full, the oldest trace goes first, its episodes released as
    they are.

    ``root_traces_as_episodes`` is for plain instrumented code that marks no
    episodes: each root span whose trace holds model calls becomes an episode
    of its own (numbered as example 0, 1, 2, ... in the order they are released),
    synthesised like any other; a root trace without model calls is no episode.
    """

    #: Released span ids remembered, to tell a late straggler from a span
    #: that belongs to nothing.
    _MAX_REMEMBERED = 200_000
    #: Runs already told that their model calls carry no messages.
    _MAX_WARNED_RUNS = 1_000

    def __init__(
        self,
        *,
        settle_seconds: float = 0.0,
        max_wait_seconds: float = 60.0,
        max_spans: int = 100_000,
        max_values: int = DEFAULT_MAX_HELD_VALUES,
        clock: Callable[[], float] = time.monotonic,
        root_traces_as_episodes: bool = False,
    ) -> None:
        if settle_seconds < 0 or max_wait_seconds < 0 or max_spans < 1:
            raise ValueError("settle and wait times must be >= 0, and max_spans >= 1")
        self.settle_seconds = settle_seconds
        self.max_wait_seconds = max(max_wait_seconds, settle_seconds)
        self.max_spans = max_spans
        self.max_values = max_values
        self._values = 0
        self.stats = BufferStats()
        self._clock = clock
        self._traces: OrderedDict[int, HeldTrace] = OrderedDict()
        self._held = 0
        self._forced: list[SpanTree] = []
        self._released: OrderedDict[tuple[int, int], _Released] = OrderedDict()
        #: The run of each released episode span, by its ids.
        self._released_roots: OrderedDict[tuple[int, int], str] = OrderedDict()
        self._incomplete: OrderedDict[tuple[int, int], None] = OrderedDict()
        self._warned_runs: OrderedDict[str, None] = OrderedDict()
        self.root_traces_as_episodes = root_traces_as_episodes
        self._root_traces: set[tuple[int, int]] = set()
        self._root_trace_count = 0

    def __len__(self) -> int:
        """Spans held now."""
        return self._held

    @property
    def pending_episodes(self) -> int:
        return sum(len(state.roots) for state in self._traces.values()) + len(self._forced)

    def held_episodes(self) -> list[UnrecordedEpisode]:
        """The episodes held now, so a consumer can keep back what must follow
        them (a run's end is delivered after its last episode)."""
        held = [episode for state in self._traces.values() for episode, _ in state.roots.values()]
        return held + [tree.root for tree in self._forced]

    # -- feeding --------------------------------------------------------------------

    def add(self, view: SpanView) -> None:
        """A span that is not a run event: a possible descendant of an episode."""
        if (view.trace_id, view.span_id) in self._released:
            return  # a copy of a span already used (a collector's retry): not late
        if self._late(view):
            return
        if view.parent_span_id is None and self.root_traces_as_episodes:
            self._add_root_trace(view)
            return
        state = self._state(view.trace_id)
        before = state.values
        if state.events:
            view = state.take_events(view)
        if state.hold(view):
            self._held += 1
        if view.parent_span_id is None and self.settle_seconds == 0:
            state.closed = True
        self._values += state.values - before
        self._shrink()

    def _add_root_trace(self, view: SpanView) -> None:
        """A root span standing in for an episode span (``root_traces_as_episodes``)."""
        self._root_traces.add((view.trace_id, view.span_id))
        self.add_episode(UnrecordedEpisode(derived_episode_id(view), view))

    def add_episode(self, episode: UnrecordedEpisode) -> bool:
        """An episode span whose record is to be synthesised; ``False`` when
        it cannot be: another run's episode span had the same trace and span
        ids (it would only be taken for that one, so the caller counts it).
        A copy of an episode of the same run (a collector's retry) is taken
        as the one already held or synthesised."""
        view = episode.view
        key = (view.trace_id, view.span_id)
        run = _run_of(episode)
        if key in self._released:
            return self._released_roots.get(key) == run
        state = self._state(view.trace_id)
        held = state.roots.get(view.span_id)
        if held is not None:
            return _run_of(held[0]) == run
        if state.events:
            before = state.values
            episode = replace(episode, view=state.take_events(view))
            self._values += state.values - before
        state.roots[view.span_id] = (episode, self._clock())
        return True

    def add_event(self, trace_id: int, span_id: int, event: SpanEventView) -> None:
        """An event sent apart from its span: a log record in the span's
        context (the GenAI conventions' ``gen_ai.evaluation.result`` is one).
        It becomes an event of that span, whichever of the two arrives first;
        one that comes after its episode was synthesised is counted late."""
        key = (trace_id, span_id)
        if key in self._released:
            released = self._released[key]
            if released is not None:  # a native episode's needs nothing more
                self.stats.late_events += 1
                self._mark_incomplete(released)
            return
        state = self._state(trace_id)
        before = state.values
        held = state.spans.get(span_id)
        root = state.roots.get(span_id)
        if held is not None:
            state.hold(replace(held, events=(*held.events, event)))
        elif root is not None:
            episode, arrived = root
            view = replace(episode.view, events=(*episode.view.events, event))
            state.roots[span_id] = (replace(episode, view=view), arrived)
        else:
            state.events.setdefault(span_id, []).append(event)
            state.values += event_weight(event)
        self._values += state.values - before
        self._shrink()

    def claim_native(self, view: SpanView) -> None:
        """An episode span that carried its own record: its descendants are
        for tracing backends only and need not wait here."""
        self._remember(view.trace_id, [view.span_id], None)
        state = self._traces.get(view.trace_id)
        if state is None:
            return
        waiting = state.events.pop(view.span_id, None)
        if waiting:
            weight = sum(map(event_weight, waiting))
            state.values -= weight
            self._values -= weight
        members = state.subtree(view.span_id)
        self._drop(state, members)
        self._remember(view.trace_id, members, None)

    # -- releasing --------------------------------------------------------------------

    def release(self, *, flush: bool = False) -> list[SpanTree]:
        """Trees ready to be synthesised; with ``flush`` every episode held
        (the process is ending, or the caller cannot wait any longer)."""
        now = self._clock()
        ready, self._forced = self._forced, []
        for trace_id in list(self._traces):
            state = self._traces[trace_id]
            try:
                # Marked episodes first: a root trace standing in for an episode
                # keeps only what no marked episode under it claimed.
                held = sorted(
                    state.roots.items(), key=lambda item: (trace_id, item[0]) in self._root_traces
                )
                for span_id, (episode, arrived) in held:
                    if flush or now - arrived >= self.settle_seconds:
                        ready.append(self._take(trace_id, state, span_id, episode, complete=True))
                self._expire(trace_id, state, now, flush)
            except Exception as exc:
                # Spans are outside input: a trace that breaks the buffer is
                # let go whole, and every other trace goes on as before.
                ready.extend(self._evict(trace_id, f"{type(exc).__name__}: {exc}"))
        trees: list[SpanTree] = []
        for tree in ready:
            try:
                kept = self._as_episode(tree)
            except Exception as exc:
                logger.warning(
                    "Let go of the trace of span %016x: %s: %s",
                    tree.root.view.span_id,
                    type(exc).__name__,
                    shown(exc),
                )
                continue
            if kept is not None:
                trees.append(kept)
        return trees

    def _as_episode(self, tree: SpanTree) -> SpanTree | None:
        """A root trace is an episode only when it holds model calls; those
        are numbered as examples in the order they are released."""
        view = tree.root.view
        key = (view.trace_id, view.span_id)
        if key not in self._root_traces:
            return tree
        self._root_traces.discard(key)
        if not (is_model_call(view) or any(map(is_model_call, tree.spans))):
            return None
        numbered = replace(
            view, attributes={**view.attributes, sc.EPISODE_EXAMPLE_ID: self._root_trace_count}
        )
        self._root_trace_count += 1
        return replace(tree, root=UnrecordedEpisode(tree.root.episode_id, numbered))

    def _take(
        self,
        trace_id: int,
        state: HeldTrace,
        span_id: int,
        episode: UnrecordedEpisode,
        *,
        complete: bool,
    ) -> SpanTree:
        del state.roots[span_id]
        members = state.subtree(span_id)
        spans = tuple(state.spans[member] for member in members)
        self._drop(state, members)
        self._remember(trace_id, [span_id, *members], (trace_id, span_id))
        self._remember_root(episode)
        if not complete:
            self._mark_incomplete((trace_id, span_id))
        self._check_content(episode, spans)
        return SpanTree(episode, spans, complete)

    def _check_content(self, episode: UnrecordedEpisode, spans: Sequence[SpanView]) -> None:
        """Model calls without messages make a record with usage and no
        conversation: the platform stores it, and nobody would notice. Said
        once per run, since every episode of the run will be the same."""
        calls = [view for view in (episode.view, *spans) if is_model_call(view)]
        if not calls or any(carries_messages(view) for view in calls):
            return
        self.stats.episodes_without_messages += 1
        run = str(episode.view.resource.get(sc.RUN_ID) or "")
        if run in self._warned_runs:
            return
        self._warned_runs[run] = None
        while len(self._warned_runs) > self._MAX_WARNED_RUNS:
            self._warned_runs.popitem(last=False)
        logger.warning(
            "Run %s: episode %s has %d model call(s) and none carries its messages, so its "
            "record holds token usage but no prompts or completions. Turn on content capture "
            "in the instrumentation: %s=span_only (with %s=gen_ai_latest_experimental the "
            "GenAI instrumentations take only span_only, span_and_event, event_only or "
            "no_content, and `true` captures nothing). Said once per run.",
            run or "(no run)",
            episode.episode_id,
            len(calls),
            sc.CAPTURE_MESSAGE_CONTENT_ENV,
            sc.SEMCONV_STABILITY_OPT_IN_ENV,
        )

    def _expire(self, trace_id: int, state: HeldTrace, now: float, flush: bool) -> None:
        if state.roots:
            return
        if (
            flush
            or state.closed
            or not (state.spans or state.events)
            or now - state.last_seen >= self.max_wait_seconds
        ):
            self.stats.unclaimed_model_calls += sum(map(is_model_call, state.spans.values()))
            self.stats.unclaimed_events += sum(map(len, state.events.values()))
            self._held -= len(state.spans)
            self._values -= state.values
            del self._traces[trace_id]

    def _evict(self, trace_id: int, reason: str) -> list[SpanTree]:
        """Let a trace go whole; its waiting episodes go out without their
        spans (counted incomplete) rather than vanish."""
        state = self._traces.pop(trace_id, None)
        if state is None:
            return []
        self.stats.evicted_spans += len(state.spans)
        self._held -= len(state.spans)
        self._values -= state.values
        logger.warning(
            "Let go of trace %032x (%d held span(s), %d episode(s) waiting) that could not be "
            "processed: %s",
            trace_id,
            len(state.spans),
            len(state.roots),
            shown(reason),
        )
        trees = []
        for span_id, (episode, _) in state.roots.items():
            self._remember(trace_id, [span_id], (trace_id, span_id))
            self._remember_root(episode)
            self._mark_incomplete((trace_id, span_id))
            trees.append(SpanTree(episode, (), complete=False))
        return trees

    def _shrink(self) -> None:
        while (self._held > self.max_spans or self._values > self.max_values) and self._traces:
            trace_id, state = next(iter(self._traces.items()))
            for span_id, (episode, _) in list(state.roots.items()):
                self._forced.append(self._take(trace_id, state, span_id, episode, complete=False))
            self.stats.evicted_spans += len(state.spans)
            self._held -= len(state.spans)
            self._values -= state.values
            del self._traces[trace_id]

    # -- bookkeeping --------------------------------------------------------------------

    def _state(self, trace_id: int) -> HeldTrace:
        state = self._traces.get(trace_id)
        if state is None:
            state = self._traces[trace_id] = HeldTrace()
        else:
            self._traces.move_to_end(trace_id)
        state.last_seen = self._clock()
        return state

    def _late(self, view: SpanView) -> bool:
        """Whether ``view`` hangs under an episode already released."""
        parent = view.parent_span_id
        if parent is None or (view.trace_id, parent) not in self._released:
            return False
        episode = self._released[(view.trace_id, parent)]
        if episode is not None:
            self.stats.late_spans += 1
            self._mark_incomplete(episode)
        self._remember(view.trace_id, [view.span_id], episode)
        return True

    def _mark_incomplete(self, episode: tuple[int, int]) -> None:
        if episode in self._incomplete:
            return
        self._incomplete[episode] = None
        self.stats.incomplete_episodes += 1
        while len(self._incomplete) > self._MAX_REMEMBERED:
            self._incomplete.popitem(last=False)

    def _remember(self, trace_id: int, span_ids: Iterable[int], episode: _Released) -> None:
        for span_id in span_ids:
            self._released[(trace_id, span_id)] = episode
        while len(self._released) > self._MAX_REMEMBERED:
            self._released.popitem(last=False)

    def _remember_root(self, episode: UnrecordedEpisode) -> None:
        self._released_roots[(episode.view.trace_id, episode.view.span_id)] = _run_of(episode)
        while len(self._released_roots) > self._MAX_REMEMBERED:
            self._released_roots.popitem(last=False)

    def _drop(self, state: HeldTrace, members: Iterable[int]) -> None:
        before = state.values
        for member in members:
            if state.let_go(member):
                self._held -= 1
        self._values -= before - state.values
