"""The fast paths of the producer and of the reader give exactly what the
plain code gives: the record's encoding from any number of threads at once,
the window of times a trace recorded, and the key rollouts are numbered
under, whatever odd values the record holds."""

from __future__ import annotations

import enum
import json
import math
import threading
from collections.abc import Mapping
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from prime_runs_otel import _json
from prime_runs_otel.produce.span_times import _TIMING_STAGES, epoch_ns, recorded_window
from prime_runs_otel.produce.synthetic import synthetic_episodes
from prime_runs_otel.read.projection.summary import rollout_key_text


def test_threads_encoding_at_once_each_get_their_own_record() -> None:
    records = list(synthetic_episodes(60, seed=12))
    expected = [_json.dumps_record(record) for record in records]
    found: dict[int, list[bytes]] = {}

    def encode(number: int) -> None:
        for _ in range(5):  # rounds enough for the threads to interleave
            found[number] = [_json.dumps_record(record) for record in records]

    threads = [threading.Thread(target=encode, args=(number,)) for number in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert all(found[number] == expected for number in range(4))
    assert _json._padding.inner[0] is None  # no record kept alive by the padding


def _plain_window(trace: Mapping[str, Any]) -> tuple[int | None, int | None]:
    """The window as the plain code reads it: every stage through epoch_ns."""
    timing = trace.get("timing")
    timing = timing if isinstance(timing, Mapping) else {}
    first, last = epoch_ns(timing.get("start")), None
    spans = [timing.get(stage) for stage in _TIMING_STAGES]
    calls = trace.get("calls")
    if isinstance(calls, list):
        spans += [call.get("time") if isinstance(call, Mapping) else None for call in calls]
    for span in spans:
        span = span if isinstance(span, Mapping) else {}
        start, end = epoch_ns(span.get("start")), epoch_ns(span.get("end"))
        if start is not None and (first is None or start < first):
            first = start
        if end is not None and (last is None or end > last):
            last = end
    return first, last


class _Seconds(float):
    """A float subclass, as numpy's float64 is."""


_times = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-5, max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([0.0, -0.0, 1767225600.125, math.nan, math.inf]),
    st.floats(min_value=1, max_value=2e9).map(_Seconds),
    st.text(max_size=3),
)
_span = st.one_of(st.fixed_dictionaries({}, optional={"start": _times, "end": _times}), _times)


@settings(max_examples=400, deadline=None)
@given(
    start=_times,
    stages=st.dictionaries(st.sampled_from(_TIMING_STAGES), _span),
    calls=st.one_of(st.lists(st.one_of(st.fixed_dictionaries({"time": _span}), _times)), _times),
)
def test_the_window_is_what_the_plain_reading_finds(start: Any, stages: Any, calls: Any) -> None:
    trace = {"timing": {"start": start, **stages}, "calls": calls}
    assert recorded_window(trace) == _plain_window(trace)


class _Index(int):
    """An int subclass (an IntEnum's member is one)."""


_json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(), inner, max_size=3),
    max_leaves=8,
)


@settings(max_examples=300, deadline=None)
@given(key=st.one_of(_json_values, st.integers().map(_Index), st.tuples(st.integers())))
def test_the_rollout_key_is_spelt_as_json_dumps_spells_it(key: Any) -> None:
    assert rollout_key_text(key) == json.dumps(key, sort_keys=True, default=str)


class _Colour(enum.Enum):
    RED = "red"


class _Text(str):
    """A str subclass."""


_odd_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=4),
    st.sampled_from(["\ud800", -0.0, math.nan, math.inf, _Colour.RED, _Index(3), _Text("t")]),
    st.uuids(),
    st.datetimes(),
    st.floats(min_value=0, max_value=1e6).map(_Seconds),
)
_odd_values = st.recursive(
    _odd_scalars,
    lambda inner: (
        st.lists(inner, max_size=3)
        | st.lists(inner, max_size=3).map(tuple)
        | st.dictionaries(
            st.one_of(st.text(max_size=3), st.integers(), st.none()), inner, max_size=3
        )
    ),
    max_leaves=10,
)


@settings(max_examples=500, deadline=None)
@given(value=st.one_of(_odd_values, st.dictionaries(st.text(max_size=3), _odd_values, max_size=4)))
def test_a_plain_copy_is_what_the_standard_librarys_round_trip_gives(value: Any) -> None:
    expected = json.loads(json.dumps(value, default=str))
    copy = _json.plain_copy(value)
    # repr tells NaN from None, 1 from 1.0 and True, a list from a tuple.
    assert repr(copy) == repr(expected)
    assert [type(item) for item in _walk(copy)] == [type(item) for item in _walk(expected)]


def test_a_plain_copy_of_a_record_is_its_own() -> None:
    for record in synthetic_episodes(20, seed=3):
        copy = _json.plain_copy(record)
        assert copy == json.loads(json.dumps(record, default=str))
        assert copy is not record
        assert copy["traces"] is not record["traces"]


def _walk(value: Any) -> list[Any]:
    """Every value nested in ``value``, keys included, depth first."""
    found = [value]
    if isinstance(value, dict):
        for key, item in value.items():
            found += [key, *_walk(item)]
    elif isinstance(value, (list, tuple)):
        for item in value:
            found += _walk(item)
    return found
