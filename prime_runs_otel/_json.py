"""Fast JSON where it is hot, exact JSON where it must be.

Every episode is parsed on the export path and again by the uploader, and
serialised once more as its Prime Traces line; orjson does each several times
faster than the standard library. It is used only where its output is
equivalent: parsing (falling back to the standard library for the ``NaN`` and
``Infinity`` tokens a producer's record may carry, which orjson refuses) and
Prime Traces lines (strict JSON, where orjson writes non-finite floats as
``null`` exactly as the line format requires), and episode records on the
producer (:func:`dumps_record`, which keeps the standard library's output
wherever a reader could tell the difference).
"""

from __future__ import annotations

import json
import math
import threading
from collections.abc import Mapping
from typing import Any

from ._interrupts import interrupts_held

with interrupts_held():  # a Ctrl-C during its initialisation crashes the process
    import orjson


def loads(data: bytes | str) -> Any:
    """Parse JSON; ``ValueError`` when it is not JSON."""
    return parse(data)[0]


def parse(data: bytes | str) -> tuple[Any, bool]:
    """Parse JSON, and say whether orjson did (``ValueError`` when it is not JSON).

    What orjson parses has plain scalars by construction: it refuses lone
    surrogates, and reads integers beyond 64 bits as floats. The standard
    library, which takes over for the ``NaN`` and ``Infinity`` tokens, keeps
    both, so what it parsed still needs every value looked at
    (:func:`prime_runs_otel.read.checks.check_json_value`).
    """
    try:
        return orjson.loads(data), True
    except orjson.JSONDecodeError:
        # NaN/Infinity tokens, or a real error with its position
        return json.loads(data), False


def parsed_if_json(value: Any) -> Any:
    """JSON text parsed; anything else (or text that is not JSON) as it is.

    For values that are JSON by convention but not by contract: tool-call
    arguments as a model emitted them, and span attributes that GenAI
    instrumentations fill with JSON text."""
    if isinstance(value, str):
        try:
            return json.loads(value)
        except ValueError:
            return value
    return value


def dumps_strict(value: Any) -> bytes | None:
    """Compact UTF-8 JSON with non-finite floats as ``null``; ``None`` for
    values orjson cannot encode (integers beyond 64 bits), which the caller
    encodes the slow way."""
    try:
        return orjson.dumps(value)
    except orjson.JSONEncodeError:
        return None


#: Types the standard library refuses stay refused: orjson would quietly encode
#: datetimes, dataclasses and str/int subclasses that a reader never sees again.
_RECORD_OPTIONS = (
    orjson.OPT_PASSTHROUGH_DATACLASS
    | orjson.OPT_PASSTHROUGH_DATETIME
    | orjson.OPT_PASSTHROUGH_SUBCLASS
)


def plain_copy(value: Any) -> Any:
    """``json.loads(json.dumps(value, default=str))``: the value as a reader
    of its JSON gets it back, a copy of its own, three times faster where
    orjson gives the same.

    orjson's copy is kept only when it equals the value: then the value held
    nothing orjson writes differently (a non-finite float, which it writes
    as ``null``; a ``UUID`` or an ``Enum``, which it writes its own way; a
    tuple, read back as a list), and nothing it refuses (the types
    :data:`_RECORD_OPTIONS` leaves out, non-string keys, integers beyond 64
    bits), which the standard library copies instead.
    """
    try:
        copy = orjson.loads(orjson.dumps(value, option=_RECORD_OPTIONS))
    except orjson.JSONEncodeError:
        copy = _NOT_COPIED
    if copy is not _NOT_COPIED and copy == value:
        return copy
    return json.loads(json.dumps(value, default=str))


_NOT_COPIED: Any = object()


def dumps_record(record: Mapping[str, Any]) -> bytes:
    """An episode record as compact UTF-8 JSON (see :func:`encode_record`)."""
    return encode_record(record)[0]


def encode_record(record: Mapping[str, Any]) -> tuple[bytes, bool]:
    """An episode record as compact UTF-8 JSON, as fast as it can be done
    faithfully, and whether orjson wrote it: then nothing in it is past the
    limits :func:`prime_runs_otel.read.checks.check_json_value` checks
    (orjson refuses surrogates and integers beyond 64 bits, and the record
    was written where orjson's own nesting limit is :data:`MAX_NESTING`).

    orjson is six times faster than the standard library here, but it writes
    NaN and infinity as ``null``. Every reader of the record but one cleans
    non-finite numbers to ``null`` anyway (Prime Traces lines, legacy rows);
    the run summary is the exception, where a NaN score poisons an average
    that a ``null`` would not. So a record whose scores or metrics are not
    all finite, or that orjson cannot encode (integers beyond 64 bits,
    non-string keys, the types above, nesting past the limit), takes the
    standard library's path. Raises ``TypeError``/``ValueError`` for values
    JSON has no form for. The differences left: a ``uuid.UUID`` is written
    as its string, an ``Enum`` member as its value.
    """
    if _summary_numbers_finite(record):
        try:
            return _dumps_within_nesting(record), True
        except orjson.JSONEncodeError:
            pass
    text = json.dumps(record, separators=(",", ":"), ensure_ascii=False, allow_nan=True)
    return text.encode(), False


#: Deepest nesting of objects and arrays a record may have. Far above any
#: honest record (a verifiers record is about ten deep), and far below what
#: any JSON encoder on the way recurses to (orjson stops at 254, the standard
#: library near the interpreter's recursion limit).
MAX_NESTING = 128


def _orjson_nesting_limit() -> int | None:
    """The deepest nesting orjson writes, found out once (it is no option)."""
    for limit in (254, 1024):
        value: Any = []
        for _ in range(limit - 1):
            value = [value]
        try:
            orjson.dumps(value)
        except orjson.JSONEncodeError:
            return None
        try:
            orjson.dumps([value])
        except orjson.JSONEncodeError:
            return limit
    return None


#: Arrays the record is written inside so that orjson's limit falls exactly
#: at MAX_NESTING: checking the nesting then costs nothing, where walking
#: every value of an 8 KB record costs more than encoding it.
_PADDING = (lambda limit: limit - MAX_NESTING if limit else 0)(_orjson_nesting_limit())


class _Padding(threading.local):
    """:data:`_PADDING` arrays nested in one another, built once per thread:
    the record goes into the innermost for the length of one encoding.
    Building them afresh for every record cost two fifths of the encoding."""

    def __init__(self) -> None:
        self.outer: list[Any] = [None]
        inner = self.outer
        for _ in range(_PADDING - 1):
            nested: list[Any] = [None]
            inner[0] = nested
            inner = nested
        self.inner = inner


_padding = _Padding()


def _dumps_within_nesting(record: Mapping[str, Any]) -> bytes:
    """orjson's encoding of ``record``; ``JSONEncodeError`` also when it
    nests deeper than :data:`MAX_NESTING`."""
    if not _PADDING:  # an orjson whose limit is unknown: the nesting is walked
        encoded = orjson.dumps(record, option=_RECORD_OPTIONS)
        if nested_deeper_than(record, MAX_NESTING):
            raise orjson.JSONEncodeError("nested deeper than the limit")
        return encoded
    padding = _padding
    inner = padding.inner
    inner[0] = record
    try:
        return orjson.dumps(padding.outer, option=_RECORD_OPTIONS)[_PADDING:-_PADDING]
    finally:
        inner[0] = None  # the record is not kept alive by the thread


def nests_too_deep(value: Any) -> bool:
    """Whether a value orjson parsed nests deeper than :data:`MAX_NESTING`.

    Found by orjson writing it where its own limit falls at the limit (see
    :func:`_dumps_within_nesting`): what orjson parsed has plain scalars and
    string keys, so nesting is the one thing its writer can refuse, and
    writing an 8 KB record in C costs a fraction of walking its values.
    """
    try:
        _dumps_within_nesting(value)
    except orjson.JSONEncodeError:
        return True
    return False


def nested_deeper_than(value: Any, limit: int) -> bool:
    """Whether objects and arrays nest more than ``limit`` deep in ``value``
    (tuples count as arrays: a record handed over in process may hold them)."""
    if not isinstance(value, (dict, list, tuple)):
        return False
    stack: list[tuple[Any, int]] = [(value, 1)]
    push, pop = stack.append, stack.pop
    while stack:
        item, depth = pop()
        for member in item.values() if isinstance(item, dict) else item:
            kind = type(member)
            if kind is dict or kind is list or kind is tuple:
                if depth >= limit:
                    return True
                push((member, depth + 1))
    return False


def _summary_numbers_finite(record: Mapping[str, Any]) -> bool:
    """Whether every reward score, weight and metric the summary reads is finite."""
    traces = record.get("traces")
    for trace in traces if isinstance(traces, list) else ():
        if not _is_mapping(trace):
            continue
        rewards = trace.get("rewards")
        if _is_mapping(rewards):
            for reward in rewards.values():
                if _is_mapping(reward) and not (
                    _finite_or_absent(reward.get("score"))
                    and _finite_or_absent(reward.get("weight"))
                ):
                    return False
        metrics = trace.get("metrics")
        if _is_mapping(metrics):
            for value in metrics.values():
                if isinstance(value, float) and not math.isfinite(value):
                    return False
    return True


def _is_mapping(value: Any) -> bool:
    # dict first: the ABC check costs ten times more, and records are dicts.
    return type(value) is dict or isinstance(value, Mapping)


def _finite_or_absent(value: Any) -> bool:
    return not isinstance(value, float) or math.isfinite(value)


def clean_metric_values(values: Mapping[str, Any]) -> dict[str, Any]:
    """``values`` without NaN or infinity anywhere inside, and without nested
    mappings that end up empty: the platform's strict JSON refuses the first
    with an opaque 400, and shows the second as nothing."""
    cleaned = _finite_or_drop(dict(values))
    return cleaned if isinstance(cleaned, dict) else {}


_DROP: Any = object()


def _finite_or_drop(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return _DROP
    if isinstance(value, Mapping):
        kept: dict[str, Any] = {}
        for key, item in value.items():
            cleaned = _finite_or_drop(item)
            if cleaned is _DROP or (isinstance(item, Mapping) and not cleaned):
                continue
            kept[str(key)] = cleaned
        return kept
    if isinstance(value, (list, tuple)):
        return [kept for kept in (_finite_or_drop(item) for item in value) if kept is not _DROP]
    return value
