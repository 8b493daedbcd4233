"""What one span of another instrumentation says of how its part of an
episode went, for the record synthesised from the tree: its failure as a
verifiers ``Error``, and its scores (a total, named rewards, metrics, and
``gen_ai.evaluation.result`` events).

Apart from :mod:`.synthesis` because this answers "what does a span say",
one span at a time, whatever trace it ends up in.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from .. import semconv as sc
from .checks import finite_number
from .checks import text_or_none as _text
from .spans import SpanView

__all__ = ["Scores", "span_error"]

_EMPTY: Mapping[str, Any] = {}


def span_error(
    view: SpanView,
    named_by: Sequence[tuple[str, str]] = (),
    *,
    failed: bool = False,
) -> dict[str, Any] | None:
    """The span's failure as a verifiers ``Error``, or ``None`` when it did not
    fail. ``named_by``: (type, message) attributes that describe it first."""
    attributes = view.attributes
    exception = next((event for event in view.events if event.name == "exception"), None)
    if not (failed or view.status_error or exception is not None):
        return None
    details: Mapping[str, Any] = exception.attributes if exception else _EMPTY
    kind = message = None
    for type_key, message_key in named_by:
        kind = kind or _text(attributes.get(type_key))
        message = message or _text(attributes.get(message_key))
    kind = kind or _text(attributes.get(sc.ERROR_TYPE)) or _text(details.get("exception.type"))
    message = message or view.status_message or _text(details.get("exception.message"))
    error: dict[str, Any] = {"type": kind or "Error", "message": message or kind or "failed"}
    stacktrace = _text(details.get("exception.stacktrace"))
    if stacktrace:
        error["traceback"] = stacktrace
    return error


@dataclass
class Scores:
    """Named scores, a total, and metrics gathered for one trace."""

    total: float | None = None
    named: dict[str, float] = field(default_factory=dict)
    metrics: dict[str, float] = field(default_factory=dict)

    def read(self, view: SpanView, *, total_key: str) -> None:
        attributes = view.attributes
        total = finite_number(attributes.get(total_key))
        if total is not None:
            self.total = total
        for key, value in attributes.items():
            score = finite_number(value)
            if score is None:
                continue
            if key.startswith(sc.AGENT_REWARD_PREFIX):
                self.named[key[len(sc.AGENT_REWARD_PREFIX) :]] = score
            elif key.startswith(sc.AGENT_METRIC_PREFIX):
                self.metrics[key[len(sc.AGENT_METRIC_PREFIX) :]] = score
        self.read_evaluations(view)

    def read_evaluations(self, view: SpanView) -> None:
        for event in view.events:
            if event.name != sc.GEN_AI_EVALUATION_EVENT:
                continue
            details = event.attributes
            name = _text(details.get(sc.GEN_AI_EVALUATION_NAME))
            score = finite_number(details.get(sc.GEN_AI_EVALUATION_SCORE))
            if name and score is not None:
                self.named.setdefault(name, score)

    def merge(self, other: Scores) -> None:
        """``other`` (the episode's own) wins where both say something."""
        if other.total is not None:
            self.total = other.total
        self.named.update(other.named)
        self.metrics.update(other.metrics)

    def rewards_and_metrics(self) -> tuple[dict[str, Any], dict[str, Any]]:
        """A total is the reward as the producer computed it, so named scores
        then travel as metrics (the platform's reward stays that total); without
        one, the named scores are the rewards and their sum is the reward."""
        metrics: dict[str, Any] = dict(self.metrics)
        if self.total is None:
            rewards = {name: {"score": score, "weight": 1.0} for name, score in self.named.items()}
            return rewards, metrics
        for name, score in self.named.items():
            metrics.setdefault(name, score)
        return {"reward": {"score": self.total, "weight": 1.0}}, metrics
