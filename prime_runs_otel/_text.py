"""Outside text made safe to print and log.

Run ids, run names, episode ids and error messages come from producers, and
``serve`` takes them from anyone who can reach its port. Printed raw, a
newline in one forges a log line and an ANSI escape drives the terminal of
whoever reads ``runs``; a lone surrogate cannot even be encoded. Every place
that shows such text passes it through :func:`shown` first.
"""

from __future__ import annotations

import logging
import re
from typing import Any

__all__ = ["OneLineFormatter", "configure_logging", "human_bytes", "one_line", "shown"]

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


def one_line(text: str) -> str:
    """``text`` with unsafe characters escaped, whatever its length."""
    return text if _UNSAFE.search(text) is None else _UNSAFE.sub(_escape, text)


class OneLineFormatter(logging.Formatter):
    """Log records as one line each, whatever their arguments hold.

    The message is escaped after it is formatted, so no run id, span name
    or platform answer logged anywhere can start a line of its own or send
    escapes to a terminal; a traceback (added after the message) keeps its
    lines.
    """

    def formatMessage(self, record: logging.LogRecord) -> str:
        return one_line(super().formatMessage(record))


def configure_logging(level: int, fmt: str) -> None:
    """``logging.basicConfig`` with :class:`OneLineFormatter` on its handler."""
    logging.basicConfig(level=level, format=fmt)
    for handler in logging.getLogger().handlers:
        if type(handler.formatter) is logging.Formatter:
            handler.setFormatter(OneLineFormatter(fmt))


def human_bytes(size: float) -> str:
    """Binary units, the same ones the configuration documents (GiB)."""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{size:.1f} GiB"
