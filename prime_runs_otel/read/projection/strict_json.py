"""The JSON the platform takes: compact UTF-8, and NaN and infinity as ``null``.

Every projection writes it (the samples API and Prime Traces reject the
JavaScript literals), and the common case, a record with no non-finite
number, must cost one encoding only: the encoder's refusal is the detector.
"""

from __future__ import annotations

import json
import math
from typing import Any

__all__ = ["encode", "encode_finite", "finite"]


def encode(value: Any) -> bytes:
    """Compact UTF-8 JSON, the encoding both the samples API and Prime Traces receive.
    ``allow_nan=False`` makes a non-finite float raise, which callers use as a cheap
    detector instead of walking every record up front."""
    return json.dumps(value, ensure_ascii=False, allow_nan=False, separators=(",", ":")).encode(
        "utf-8"
    )


def finite(value: Any) -> Any:
    """``value`` with NaN and infinity replaced by ``None``, the way the platform tables
    show them. Containers are rebuilt only along paths that change, so a clean record
    comes back as the very same object."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        changed = None
        for key, item in value.items():
            cleaned = finite(item)
            if cleaned is not item:
                if changed is None:
                    changed = dict(value)
                changed[key] = cleaned
        return value if changed is None else changed
    if isinstance(value, list):
        items = [finite(item) for item in value]
        return value if all(a is b for a, b in zip(items, value, strict=True)) else items
    if isinstance(value, tuple):
        return [finite(item) for item in value]
    return value


def encode_finite(value: Any) -> tuple[Any, bytes]:
    """``(value, its JSON)``, with non-finite floats nulled only when there are any."""
    try:
        return value, encode(value)
    except ValueError:
        cleaned = finite(value)
        return cleaned, encode(cleaned)
