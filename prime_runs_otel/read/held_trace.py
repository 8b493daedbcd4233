"""The spans of one trace held by :class:`~.span_tree.SpanTreeBuffer` while
its episodes' trees come in: by id, indexed by parent, with the events that
came ahead of their span, and weighed in attribute values.

Apart from the buffer because this answers "what is held of one trace and
what does it cost", with no clock, bound or episode in sight: the buffer
decides when a trace's episodes are whole and what to let go.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from .records import UnrecordedEpisode
from .spans import SpanEventView, SpanView

__all__ = ["HeldTrace", "event_weight"]


@dataclass
class HeldTrace:
    """One trace's held spans, their parent index and their weight."""

    spans: dict[int, SpanView] = field(default_factory=dict)
    #: Held span ids by parent id, kept as spans come and go, so finding an
    #: episode's tree costs its own size, not a scan of the whole trace.
    children: dict[int, set[int]] = field(default_factory=dict)
    roots: dict[int, tuple[UnrecordedEpisode, float]] = field(default_factory=dict)
    last_seen: float = 0.0
    #: The trace's root span arrived while spans end children first (in the
    #: producer's process): nothing more can come under it.
    closed: bool = False
    #: Attribute values of the held spans (see :func:`_weight`).
    values: int = 0
    #: Events that came apart from their span (a log record in its context)
    #: before it, by span id: they join the span when it arrives.
    events: dict[int, list[SpanEventView]] = field(default_factory=dict)

    def take_events(self, view: SpanView) -> SpanView:
        """``view`` with the events that came ahead of it."""
        waiting = self.events.pop(view.span_id, None)
        if not waiting:
            return view
        self.values -= sum(map(event_weight, waiting))
        return replace(view, events=(*view.events, *waiting))

    def hold(self, view: SpanView) -> bool:
        """Hold ``view``; ``True`` when its id was not held before."""
        previous = self.spans.get(view.span_id)
        if previous is not None:
            self._unlink(previous)
            self.values -= _weight(previous)
        self.spans[view.span_id] = view
        self.values += _weight(view)
        if view.parent_span_id is not None:
            self.children.setdefault(view.parent_span_id, set()).add(view.span_id)
        return previous is None

    def let_go(self, span_id: int) -> bool:
        view = self.spans.pop(span_id, None)
        if view is None:
            return False
        self._unlink(view)
        self.values -= _weight(view)
        return True

    def subtree(self, root_id: int) -> list[int]:
        """Ids of the held spans under ``root_id`` (through held spans only);
        parent links that loop are followed once."""
        found: list[int] = []
        seen = {root_id}
        stack = list(self.children.get(root_id, ()))
        while stack:
            current = stack.pop()
            if current in seen:
                continue
            seen.add(current)
            found.append(current)
            stack.extend(self.children.get(current, ()))
        return found

    def _unlink(self, view: SpanView) -> None:
        if view.parent_span_id is None:
            return
        siblings = self.children.get(view.parent_span_id)
        if siblings is not None:
            siblings.discard(view.span_id)
            if not siblings:
                del self.children[view.parent_span_id]


def _weight(view: SpanView) -> int:
    """What holding ``view`` costs, in attribute values: a decoded attribute
    takes about a hundred bytes however small it was on the wire, so the
    count of them is what bounds the buffer's memory, more than spans are."""
    return 1 + len(view.attributes) + sum(len(event.attributes) for event in view.events)


def event_weight(event: SpanEventView) -> int:
    return 1 + len(event.attributes)
