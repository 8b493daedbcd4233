"""What the local viewer sorts, filters and counts an episode by: its
reward, its error, its tokens, how long it took, its model calls' latencies
and its metrics, read from the record once, when the record is read.

The spool keeps these beside each episode and folds them into per-run
distributions when a view first asks after the episode was stored (see
``deliver/spool/views.py`` and ``folds.py``), so no page and no ``show``
ever parses the stored bodies again. A record comes from a producer and may hold anything:
every reader here takes what is in the expected shape and leaves the rest
out (``None``), and never refuses a record the platform projections accept.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeGuard

__all__ = ["NO_ERROR_RECORDED", "NO_FACTS", "EpisodeFacts", "episode_facts"]

#: The error type of an episode that is not ok and says nothing about why.
NO_ERROR_RECORDED = "(no error recorded)"
#: Longest error text kept as a group's example; the episode has the rest.
_MESSAGE_CHARS = 300
_TIMING_STAGES = ("boot", "setup", "agent", "finalize", "scoring")
#: SQLite's integers are 64-bit: a count beyond them is no count.
_MAX_COUNT = 2**63 - 1


@dataclass(frozen=True, slots=True)
class EpisodeFacts:
    """One episode as the viewer's tables and charts see it.

    ``reward`` and ``metrics`` are the summary trace's (the trace that stands
    for the episode, as in the sample row); ``error_type`` is set for an
    episode that is not ok only; ``duration`` runs from the earliest start to
    the latest end any of its traces recorded, in seconds; ``turns`` counts
    the summary trace's model calls, and ``call_latencies`` every model call
    of every trace that recorded its start and end.
    """

    reward: float | None = None
    error_type: str | None = None
    error_message: str | None = None
    input_tokens: int | None = None
    output_tokens: int | None = None
    duration: float | None = None
    turns: int | None = None
    call_latencies: tuple[float, ...] = ()
    metrics: tuple[tuple[str, float], ...] = ()

    @property
    def tokens(self) -> int | None:
        if self.input_tokens is None and self.output_tokens is None:
            return None
        return _count((self.input_tokens or 0) + (self.output_tokens or 0))


#: The facts of a record nobody read them from.
NO_FACTS = EpisodeFacts()


def episode_facts(
    record: Mapping[str, Any],
    summary_index: int,
    reward: float | None,
    metrics: Sequence[tuple[str, float]],
) -> EpisodeFacts:
    """The facts of ``record``, whose summary trace is ``summary_index`` and
    whose reward and metrics the summary digest has read already."""
    traces = [trace for trace in _list(record.get("traces")) if _is_map(trace)]
    summary = traces[summary_index] if 0 <= summary_index < len(traces) else None
    error_type, error_message = _error(record, traces)
    calls = _list(summary.get("calls")) if summary is not None else []
    return EpisodeFacts(
        reward=_finite(reward),
        error_type=error_type,
        error_message=error_message,
        input_tokens=_tokens(record, traces, "num_input_tokens"),
        output_tokens=_tokens(record, traces, "num_output_tokens"),
        duration=_duration(traces),
        turns=len(calls) if summary is not None else None,
        call_latencies=tuple(_latencies(traces)),
        metrics=tuple((name, value) for name, value in metrics if math.isfinite(value)),
    )


def _list(value: Any) -> list[Any]:
    return value if type(value) is list else []


def _finite(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    number = float(value)
    return number if math.isfinite(number) else None


def _text(value: str) -> str:
    """``value`` cut to a readable length, and storable whatever it holds (a
    record built in process may hold lone surrogates, which UTF-8 cannot)."""
    cut = value[:_MESSAGE_CHARS]
    return cut.encode("utf-8", "replace").decode("utf-8")


def _count(value: Any) -> int | None:
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= _MAX_COUNT:
        return value
    return None


def _error(
    record: Mapping[str, Any], traces: list[Mapping[str, Any]]
) -> tuple[str | None, str | None]:
    """Why an episode that is not ok failed: its first error with a type
    (the episode's own, then its traces'), a timeout, or that it does not say."""
    if record.get("ok", False) is True:
        return None, None
    candidates = _list(record.get("errors"))
    for trace in traces:
        candidates = candidates + _list(trace.get("errors"))
    for error in candidates:
        if isinstance(error, Mapping) and isinstance(error.get("type"), str) and error["type"]:
            message = error.get("message")
            return _text(error["type"]), _text(message) if isinstance(message, str) else None
    if record.get("is_timeout") is True:
        return "timeout", None
    return NO_ERROR_RECORDED, None


def _tokens(record: Mapping[str, Any], traces: list[Mapping[str, Any]], key: str) -> int | None:
    """The episode's count (verifiers sums its traces'), else the traces' sum."""
    own = _count(record.get(key))
    if own is not None:
        return own
    found = [count for count in (_count(trace.get(key)) for trace in traces) if count is not None]
    return _count(sum(found)) if found else None


def _duration(traces: list[Mapping[str, Any]]) -> float | None:
    first = last = None
    for trace in traces:
        timing = trace.get("timing")
        if not _is_map(timing):
            continue
        for stage in (timing, *(timing.get(name) for name in _TIMING_STAGES)):
            if not _is_map(stage):
                continue
            start, end = _when(stage.get("start")), _when(stage.get("end"))
            if start is not None and (first is None or start < first):
                first = start
            if end is not None and (last is None or end > last):
                last = end
    if first is None or last is None or last < first:
        return None
    return last - first


def _is_map(value: Any) -> TypeGuard[Mapping[str, Any]]:
    """A mapping; a record parsed from JSON holds dicts, asked first (the
    abstract class's check costs ten times as much)."""
    return type(value) is dict or isinstance(value, Mapping)


def _when(value: Any) -> float | None:
    """An epoch time in seconds; 0 and missing mean "not recorded"."""
    kind = type(value)
    if kind is not float and kind is not int:
        return None
    return float(value) if value > 0 and math.isfinite(value) else None


def _latencies(traces: list[Mapping[str, Any]]) -> list[float]:
    found = []
    for trace in traces:
        for call in _list(trace.get("calls")):
            time = call.get("time") if _is_map(call) else None
            if not _is_map(time):
                continue
            start, end = _when(time.get("start")), _when(time.get("end"))
            if start is not None and end is not None and end >= start:
                found.append(end - start)
    return found
