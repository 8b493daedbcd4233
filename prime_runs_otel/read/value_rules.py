"""The rules of a value a span brings in: what a later stage could not take.

Split from :mod:`~prime_runs_otel.read.checks` (the pass over a span that
applies them) so the rules can be read, and reused by the dialects' readers,
without the span pass: the small readers (text, whole and finite numbers,
string arrays) and :func:`check_json_value`, which refuses what the spool,
the projection or the platform's JSON would fail on later (integers past a
float, lone surrogates, nesting past :data:`~prime_runs_otel._json.MAX_NESTING`).
"""

from __future__ import annotations

import math
import re
import sys
from collections.abc import Sequence
from typing import Any

from .._json import MAX_NESTING, nests_too_deep
from ..errors import RecordError


def text_or_none(value: Any) -> str | None:
    """A string attribute, ``None`` when absent or empty (an empty name is no name)."""
    return value if isinstance(value, str) and value else None


def texts(value: Any) -> tuple[str, ...]:
    """A string array, or a comma-separated string: ``OTEL_RESOURCE_ATTRIBUTES``
    can only carry strings, so ``prime.run.environments=gsm8k,math`` is two."""
    if isinstance(value, str):
        return tuple(part.strip() for part in value.split(",") if part.strip())
    if isinstance(value, Sequence):
        return tuple(str(item) for item in value if item)
    return ()


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


def finite_number(value: Any) -> float | None:
    """An int or float attribute as a finite float, else ``None`` (a bool is no
    number, and neither is NaN or infinity)."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        number = float(value)
        return number if math.isfinite(number) else None
    return None


def _few_brackets(raw: bytes | None) -> bool:
    """Whether ``raw`` has too few ``[`` and ``{`` to nest past
    :data:`MAX_NESTING`: every object or array opens with one, so counting
    them all (strings included) bounds the depth. Two passes in C instead of
    a walk over every value, for records of a few turns (the bench's 8 KB
    records have 85 at the median); longer ones are walked."""
    return raw is not None and raw.count(b"[") + raw.count(b"{") <= MAX_NESTING


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
        if not _few_brackets(raw) and nests_too_deep(value):
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
