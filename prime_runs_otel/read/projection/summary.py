"""The run summary (average reward, metrics and error rate), kept as each
episode arrives, and :class:`EpisodeDigest`, all of a record the summary and
the spool need, taken once when the record is read.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .episode import Number, rollout_key, summary_trace_index, trainable, weighted_reward
from .facts import NO_FACTS, EpisodeFacts, episode_facts

__all__ = [
    "EpisodeDigest",
    "SummaryAccumulator",
    "TraceScores",
    "digest_episode",
    "rollout_key_text",
]


def _sum_is_compensated() -> bool:
    """Whether this interpreter's builtin ``sum`` compensates float rounding (3.12+).
    prime-runs averages rewards with ``sum``, so the running total must follow it."""
    return sum([1.0, 1e100, 1.0, -1e100]) == 2.0


_COMPENSATED_SUM = _sum_is_compensated()


class _BuiltinSum:
    """The builtin ``sum`` of a sequence, computed one item at a time.

    Reproduces CPython's arithmetic exactly: integers add exactly until the first float,
    then floats add left to right, with Neumaier compensation on interpreters whose
    ``sum`` has it. The result is therefore bit-identical to ``sum`` over all items at
    once, which an averaged-at-the-end total would not be.
    """

    __slots__ = ("compensation", "total")

    def __init__(self, total: Number = 0, compensation: float = 0.0) -> None:
        self.total = total
        self.compensation = compensation

    def add(self, value: Number) -> None:
        total = self.total
        if isinstance(total, int) or not _COMPENSATED_SUM:
            self.total = total + value
        elif isinstance(value, float):
            added = total + value
            if abs(total) >= abs(value):
                self.compensation += (total - added) + value
            else:
                self.compensation += (value - added) + total
            self.total = added
        else:
            self.total = total + float(value)

    def result(self) -> Number:
        total, compensation = self.total, self.compensation
        if isinstance(total, float) and compensation and math.isfinite(compensation):
            return total + compensation
        return total


@dataclass(frozen=True, slots=True)
class TraceScores:
    """One trace's share of the run summary: whether it is trainable, its weighted
    reward and its per-name scores and metrics (a metric overriding a score of the
    same name, as verifiers merges them)."""

    trainable: bool
    reward: Number
    values: tuple[tuple[str, float], ...]

    @classmethod
    def of(cls, trace: Mapping[str, Any]) -> TraceScores:
        rewards = trace.get("rewards") or {}
        values = {
            name: float(reward["score"]) for name, reward in rewards.items() if reward is not None
        }
        for name, value in (trace.get("metrics") or {}).items():
            if value is not None:
                values[name] = float(value)
        return cls(trainable(trace), weighted_reward(rewards), tuple(values.items()))


@dataclass(frozen=True, slots=True)
class EpisodeDigest:
    """All the spool needs of a record besides its bytes: the summary's share, the
    rollout numbering key, and what the local viewer shows of it (``facts``).

    Taken once, when the record is read, so the parsed record can be dropped at once:
    holding thousands of parsed records for the length of an export batch is what made
    Python's garbage collector, not the parsing, the main cost of an export.
    """

    ok: bool
    has_traces: bool
    rollout_key: str
    traces: tuple[TraceScores, ...]
    facts: EpisodeFacts = NO_FACTS


def digest_episode(record: Mapping[str, Any]) -> EpisodeDigest:
    """The digest of a verifiers episode record; ``ValueError`` when its rewards,
    metrics or task are not in the verifiers shape (not numbers, not objects)."""
    try:
        traces = record.get("traces") or ()
        scores = tuple([TraceScores.of(trace) for trace in traces])
        key = rollout_key_text(rollout_key(record))
        index = summary_trace_index(record) if scores else -1
    except (AttributeError, KeyError, TypeError, ValueError) as exc:
        raise ValueError(
            f"its rewards, metrics or task are not in the verifiers shape ({exc!r})"
        ) from None
    summary = scores[index] if scores else None
    facts = episode_facts(
        record,
        index,
        summary.reward if summary is not None else None,
        summary.values if summary is not None else (),
    )
    return EpisodeDigest(bool(record.get("ok", False)), bool(traces), key, scores, facts)


def rollout_key_text(key: Any) -> str:
    """``key`` as the spool keeps it: its JSON with sorted keys (anything
    JSON has no form for as its ``str``). An integer or ``None``, as nearly
    every record has, is spelt directly: exactly what ``json.dumps`` writes
    for them, without the encoder it builds on every call."""
    if type(key) is int:
        return int.__repr__(key)
    if key is None:
        return "null"
    return json.dumps(key, sort_keys=True, default=str)


class _ScoredTotals:
    """Reward and per-name score/metric totals over one population of traces."""

    __slots__ = ("counts", "reward", "sums", "traces")

    def __init__(self) -> None:
        self.traces = 0
        self.reward = _BuiltinSum()
        self.sums: dict[str, float] = {}
        self.counts: dict[str, int] = {}

    def add(self, scores: TraceScores) -> None:
        self.traces += 1
        self.reward.add(scores.reward)
        for name, value in scores.values:
            self.sums[name] = self.sums.get(name, 0.0) + value
            self.counts[name] = self.counts.get(name, 0) + 1

    def averages(self) -> tuple[float, dict[str, float]]:
        average_reward = self.reward.result() / self.traces if self.traces else 0.0
        metrics = {name: self.sums[name] / self.counts[name] for name in self.sums}
        return average_reward, metrics

    def to_state(self) -> dict[str, Any]:
        return {
            "traces": self.traces,
            "reward": [_float_state(self.reward.total), _float_state(self.reward.compensation)],
            "sums": {name: _float_state(value) for name, value in self.sums.items()},
            "counts": dict(self.counts),
        }

    @classmethod
    def from_state(cls, state: Mapping[str, Any]) -> _ScoredTotals:
        totals = cls()
        totals.traces = int(state["traces"])
        total, compensation = state["reward"]
        totals.reward = _BuiltinSum(
            _float_from_state(total), float(_float_from_state(compensation))
        )
        totals.sums = {name: float(_float_from_state(v)) for name, v in state["sums"].items()}
        totals.counts = {name: int(count) for name, count in state["counts"].items()}
        return totals


def _float_state(value: Number) -> Number | str:
    """Strict-JSON spelling of a running total: non-finite floats as strings."""
    if isinstance(value, float) and not math.isfinite(value):
        return repr(value)
    return value


def _float_from_state(value: Number | str) -> Number:
    return float(value) if isinstance(value, str) else value


class SummaryAccumulator:
    """The run summary prime-runs computes with ``metrics.from_episodes`` over every
    episode, maintained incrementally so no episode has to be kept.

    Rewards and metrics average over trainable traces (a judge would dilute every mean
    with structural zeros), or over all traces when the run has no trainable trace at
    all; both populations are tracked because which one applies is only known at the
    end. ``avg_error`` is the share of episodes that are not ok, traceless ones included.
    """

    _STATE_VERSION = 1

    def __init__(self) -> None:
        self._episodes = 0
        self._failed = 0
        self._trainable = _ScoredTotals()
        self._everything = _ScoredTotals()

    def add(self, record: Mapping[str, Any]) -> None:
        self.add_digest(digest_episode(record))

    def add_digest(self, digest: EpisodeDigest) -> None:
        self._episodes += 1
        self._failed += not digest.ok
        for scores in digest.traces:
            self._everything.add(scores)
            if scores.trainable:
                self._trainable.add(scores)

    def summary(self) -> dict[str, Any]:
        """``{"avg_reward", "avg_metrics", "avg_error"}`` as the platform receives it:
        prime-runs drops non-finite values (and then an empty ``avg_metrics``) before
        sending, so a NaN reward leaves the key out rather than failing the request."""
        scored = self._trainable if self._trainable.traces else self._everything
        average_reward, average_metrics = scored.averages()
        summary: dict[str, Any] = {}
        if math.isfinite(average_reward):
            summary["avg_reward"] = average_reward
        finite_metrics = {name: v for name, v in average_metrics.items() if math.isfinite(v)}
        if finite_metrics:
            summary["avg_metrics"] = finite_metrics
        summary["avg_error"] = self._failed / self._episodes if self._episodes else 0.0
        return summary

    def to_state(self) -> dict[str, Any]:
        """Strict-JSON state that :meth:`from_state` restores exactly, so the spool can
        commit it in the same transaction as the episode it includes."""
        return {
            "version": self._STATE_VERSION,
            "episodes": self._episodes,
            "failed": self._failed,
            "trainable": self._trainable.to_state(),
            "all": self._everything.to_state(),
        }

    @classmethod
    def from_state(cls, state: Mapping[str, Any]) -> SummaryAccumulator:
        version = state.get("version")
        if version != cls._STATE_VERSION:
            raise ValueError(
                f"summary state version {version!r} is not supported (expected "
                f"{cls._STATE_VERSION}); it was written by a different prime-runs-otel "
                "release. Recompute the summary from the stored episodes."
            )
        accumulator = cls()
        accumulator._episodes = int(state["episodes"])
        accumulator._failed = int(state["failed"])
        accumulator._trainable = _ScoredTotals.from_state(state["trainable"])
        accumulator._everything = _ScoredTotals.from_state(state["all"])
        return accumulator
