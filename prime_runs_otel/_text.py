"""Outside text made safe to print and log.

Run ids, run names, episode ids and error messages come from producers, and
``serve`` takes them from anyone who can reach its port. Printed raw, a
newline in one forges a log line and an ANSI escape drives the terminal of
whoever reads ``runs``; a lone surrogate cannot even be encoded. Every place
that shows such text passes it through :func:`shown` first.
"""

from __future__ import annotations

import re
from typing import Any

__all__ = ["shown"]

#: C0 and C1 controls (newline, escape, carriage return, ...), DEL, lone
#: surrogates, and the bidirectional overrides that reorder what is displayed.
_UNSAFE = re.compile("[\x00-\x1f\x7f-\x9f\ud800-\udfff\u202a-\u202e\u2066-\u2069]")


def shown(value: Any, limit: int = 200) -> str:
    """``value`` as one printable line: unsafe characters as ``\\x..``/``\\u....``
    escapes, cut to about ``limit`` characters."""
    text = value if isinstance(value, str) else str(value)
    if len(text) > limit:
        text = text[:limit] + "…"
    if _UNSAFE.search(text) is None:
        return text
    return _UNSAFE.sub(_escape, text)


def _escape(match: re.Match[str]) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"
