"""Fast JSON where it is hot, exact JSON where it must be.

Every episode is parsed on the export path and again by the uploader, and
serialised once more as its Prime Traces line; orjson does each several times
faster than the standard library. It is used only where its output is
equivalent: parsing (falling back to the standard library for the ``NaN`` and
``Infinity`` tokens a producer's record may carry, which orjson refuses) and
Prime Traces lines (strict JSON, where orjson writes non-finite floats as
``null`` exactly as the line format requires).
"""

from __future__ import annotations

import json
from typing import Any

import orjson


def loads(data: bytes | str) -> Any:
    """Parse JSON; ``ValueError`` when it is not JSON."""
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError:
        return json.loads(data)  # NaN/Infinity tokens, or a real error with its position


def dumps_strict(value: Any) -> bytes | None:
    """Compact UTF-8 JSON with non-finite floats as ``null``; ``None`` for
    values orjson cannot encode (integers beyond 64 bits), which the caller
    encodes the slow way."""
    try:
        return orjson.dumps(value)
    except orjson.JSONEncodeError:
        return None
