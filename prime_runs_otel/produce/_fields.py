"""Small helpers every span builder in ``produce/`` shares.

A record may be hand-written, so its fields are read defensively: a value of
the wrong type reads as missing instead of failing the episode. The
attribute writers skip what is missing, so a span never carries an empty or
mistyped attribute.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, TypeGuard

__all__ = [
    "EMPTY",
    "Attributes",
    "as_mapping",
    "as_number",
    "compact_json",
    "error_text",
    "is_int",
    "put_int",
    "put_str",
]


Attributes = dict[str, Any]
EMPTY: Mapping[str, Any] = {}


def as_mapping(value: Any) -> Mapping[str, Any]:
    # dict first: the ABC check costs ten times more, and records are dicts.
    return value if type(value) is dict or isinstance(value, Mapping) else EMPTY


def is_int(value: Any) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


def as_number(value: Any) -> float | None:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    return None


def put_str(attributes: Attributes, key: str, value: Any) -> None:
    if isinstance(value, str) and value:
        attributes[key] = value


def put_int(attributes: Attributes, key: str, value: Any) -> None:
    if is_int(value):
        attributes[key] = int(value)


def error_text(error: Mapping[str, Any]) -> str | None:
    kind, message = error.get("type"), error.get("message")
    if isinstance(kind, str) and isinstance(message, str):
        return f"{kind}: {message}"
    text = message if isinstance(message, str) else kind
    return text if isinstance(text, str) else None


def compact_json(value: Any) -> str:
    """Compact JSON that keeps NaN/inf (the record's own floats survive the trip)."""
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False, allow_nan=True)
