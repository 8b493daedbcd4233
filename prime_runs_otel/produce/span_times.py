"""When each span of an episode starts and ends.

A record keeps times as epoch seconds, in its traces' timing stages and model
calls, and any of them may be missing. Spans need nanoseconds, and an episode
span must hold its children: these turn what was recorded into windows, with
the recording moment standing in for what was not.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Mapping
from typing import Any

from ._fields import as_mapping

__all__ = ["Window", "episode_window", "epoch_ns", "fill_window", "recorded_window"]


Window = tuple[int, int]
_TIMING_STAGES = ("boot", "setup", "agent", "finalize", "scoring")
#: Seconds past which nanoseconds overflow a float: out of range, as infinity
#: and NaN are (the comparison is False for both), never an OverflowError
#: on the producer thread.
_LAST_SECOND = sys.float_info.max / 1_000_000_000


def recorded_window(trace: Mapping[str, Any]) -> tuple[int | None, int | None]:
    """Earliest start and latest end the trace recorded, in epoch nanoseconds
    (the timing's own start, its stages' and its model calls' starts and ends).

    Runs for every trace of every episode on the producer thread: times that
    are plain floats, as verifiers writes them, are converted inline, and
    everything else goes through :func:`epoch_ns`."""
    timing = as_mapping(trace.get("timing"))
    first = epoch_ns(timing.get("start"))
    last: int | None = None
    spans = [timing.get(stage) for stage in _TIMING_STAGES]
    calls = trace.get("calls")
    if isinstance(calls, list):
        spans.extend(as_mapping(call).get("time") for call in calls)
    for span in spans:
        if type(span) is not dict and not isinstance(span, Mapping):
            continue
        start, end = span.get("start"), span.get("end")
        if type(start) is float and 0 < start < _LAST_SECOND:
            start = int(start * 1_000_000_000)
        elif start is not None:
            start = epoch_ns(start)
        if type(end) is float and 0 < end < _LAST_SECOND:
            end = int(end * 1_000_000_000)
        elif end is not None:
            end = epoch_ns(end)
        if start is not None and (first is None or start < first):
            first = start
        if end is not None and (last is None or end > last):
            last = end
    return first, last


def episode_window(windows: list[tuple[int | None, int | None]]) -> Window:
    """The traces' combined window; the recording moment stands in for what is unknown."""
    starts = [start for start, _ in windows if start is not None]
    ends = [end for _, end in windows if end is not None]
    now = time.time_ns()
    start = min(starts) if starts else min([now, *ends])
    end = max(ends) if ends else max(start, now)
    return start, max(start, end)


def fill_window(window: tuple[int | None, int | None], fallback: Window) -> Window:
    start = window[0] if window[0] is not None else fallback[0]
    end = window[1] if window[1] is not None else fallback[1]
    return start, max(start, end)


def epoch_ns(seconds: Any) -> int | None:
    """Epoch seconds to nanoseconds; 0 and missing mean "not recorded"."""
    kind = type(seconds)  # exact float/int first: the common case, and bool is excluded
    if (kind is not float and kind is not int) and (
        not isinstance(seconds, (int, float)) or isinstance(seconds, bool)
    ):
        return None
    return int(seconds * 1_000_000_000) if 0 < seconds < _LAST_SECOND else None
