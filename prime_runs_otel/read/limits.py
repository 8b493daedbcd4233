"""What a value from outside may be before the rest of the package touches it.

Spans reach ``serve`` from anyone who can reach its port, and every stage
after intake (the spool, projection, Prime Traces lines, the platform's JSON)
has limits of its own: SQLite integers are 64-bit, ``float()`` refuses
integers past about 1.8e308, UTF-8 has no lone surrogates, and JSON encoders
recurse once per nesting level. A value that passes intake but breaks a later
stage would fail there over and over (a delivery pass, a retried commit), far
from the span that brought it. So the limits of every later stage are checked
here, once, where the value enters, and a value past them is refused with
that item's own :class:`~prime_runs_otel.errors.RecordError`.
"""

from __future__ import annotations

import re
import sys
from typing import Any

from .._json import MAX_NESTING, nested_deeper_than
from ..errors import RecordError

__all__ = ["INT64_MAX", "INT64_MIN", "MAX_NESTING", "check_json_value", "whole_number"]

INT64_MIN = -(2**63)
INT64_MAX = 2**63 - 1
#: Integers ``float()`` still converts: rewards and metrics are averaged as floats.
_FLOAT_INT_LIMIT = int(sys.float_info.max)

_SURROGATE = re.compile("[\ud800-\udfff]")
_ESCAPED_SURROGATE = re.compile(rb"\\u[dD][89a-fA-F]")


def whole_number(value: Any) -> int | None:
    """An integer attribute within 64 bits, or ``None``.

    OTLP/JSON and ``OTEL_RESOURCE_ATTRIBUTES`` carry integers as decimal
    text; only ASCII digits count (``int()`` refuses many characters that
    ``str.isdigit()`` accepts, such as superscripts), and a number too large
    for SQLite is no step or count anyone sent on purpose.
    """
    if isinstance(value, bool):
        return None
    if isinstance(value, str):
        if not (value.isascii() and value.isdigit() and len(value) <= 19):
            return None
        value = int(value)
    if isinstance(value, int) and INT64_MIN <= value <= INT64_MAX:
        return value
    return None


def check_json_value(
    value: Any, what: str, raw: bytes | None = None, *, plain_scalars: bool = False
) -> None:
    """Refuse a parsed JSON value that a later stage could not handle.

    ``raw`` is the text it was parsed from: when it holds no ``\\uD8xx``
    escape the value cannot hold a lone surrogate (the bytes were checked as
    UTF-8 already), so strings are not scanned one by one.
    ``plain_scalars`` says orjson parsed or wrote the value
    (:func:`prime_runs_otel._json.parse`), which vouches for every scalar in
    it: only the nesting is left to check, at less than half the cost.
    """
    if plain_scalars:
        if nested_deeper_than(value, MAX_NESTING):
            raise _too_deep(what)
        return
    scan = raw is None or _ESCAPED_SURROGATE.search(raw) is not None
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            if depth > MAX_NESTING:
                raise _too_deep(what)
            for key, member in item.items():
                if scan and isinstance(key, str) and _SURROGATE.search(key):
                    raise _surrogate(what)
                if isinstance(member, (dict, list)):
                    stack.append((member, depth + 1))
                else:
                    _check_scalar(member, what, scan)
        elif isinstance(item, list):
            if depth > MAX_NESTING:
                raise _too_deep(what)
            for member in item:
                if isinstance(member, (dict, list)):
                    stack.append((member, depth + 1))
                else:
                    _check_scalar(member, what, scan)
        else:
            _check_scalar(item, what, scan)


def _check_scalar(value: Any, what: str, scan: bool) -> None:
    if isinstance(value, int) and not isinstance(value, bool):
        if not -_FLOAT_INT_LIMIT <= value <= _FLOAT_INT_LIMIT:
            raise RecordError(
                f"{what} holds an integer of {value.bit_length()} bits, beyond what a "
                "floating-point number can hold; send it as a string"
            )
    elif scan and isinstance(value, str) and _SURROGATE.search(value):
        raise _surrogate(what)


def _too_deep(what: str) -> RecordError:
    return RecordError(
        f"{what} nests objects and arrays more than {MAX_NESTING} deep; flatten it "
        "(or carry the deep part as a JSON string)"
    )


def _surrogate(what: str) -> RecordError:
    return RecordError(
        f"{what} holds a lone UTF-16 surrogate (a \\ud800-\\udfff escape without its pair), "
        "which is not text; fix the producer's string handling"
    )
