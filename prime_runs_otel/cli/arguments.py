"""Value types and options for the command line, shared by every command group.

A bad value is refused by argparse with the option's name and this message
(exit 2), instead of being taken silently as something else: a port of
99999 once listened on a random port, a negative timeout waited forever.
The options every command group takes (``--spool-dir``, ``--json``) are
spelled here once, so they read the same in every command's help; a
command with many options lists them as a table of :func:`option` rows
(:func:`add_options`).
"""

from __future__ import annotations

import argparse
import math
import re
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any


def port_number(text: str) -> int:
    """A TCP port: 1-65535, or 0 for any free one (never silently something else)."""
    try:
        port = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port number") from None
    if not 0 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port: use 1-65535 (0: any free one)")
    return port


def positive_int(text: str) -> int:
    """A count of 1 or more."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} must be 1 or more")
    return value


def _finite(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"{text!r} is not a finite number")
    return value


def non_negative_float(text: str) -> float:
    """A duration or amount of 0 or more."""
    value = _finite(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be 0 or more")
    return value


def positive_float(text: str) -> float:
    """A duration or amount above 0."""
    value = _finite(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be more than 0")
    return value


_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhdw])\s*$")
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


def parse_age(text: str) -> float:
    """``30m``, ``12h``, ``7d``, ``2w`` → seconds."""
    match = _DURATION.match(text)
    if not match:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not an age: give a number and a unit, s m h d or w (e.g. 7d)"
        )
    return float(match.group(1)) * _UNITS[match.group(2)]


def parse_since(text: str) -> float:
    """An age (``2h``) or a date (``2026-01-31``, ``2026-01-31T12:00``) → a timestamp."""
    try:
        return time.time() - parse_age(text)
    except argparse.ArgumentTypeError:
        pass
    for layout in ("%Y-%m-%d", "%Y-%m-%dT%H:%M", "%Y-%m-%dT%H:%M:%S", "%Y-%m-%d %H:%M"):
        try:
            return time.mktime(time.strptime(text, layout))
        except ValueError:
            continue
    raise argparse.ArgumentTypeError(
        f"{text!r} is neither an age (7d, 12h) nor a date (2026-01-31 or 2026-01-31T12:00)"
    )


# -- options --------------------------------------------------------------------------


def spool_option(sub: argparse.ArgumentParser) -> None:
    sub.add_argument(
        "--spool-dir",
        metavar="DIR",
        help="spool folder (default: $PRIME_RUNS_OTEL_DIR or ~/.prime/runs-otel)",
    )


def json_option(sub: argparse.ArgumentParser, what: str = "the result") -> None:
    sub.add_argument("--json", action="store_true", help=f"print {what} as JSON (see docs/cli.md)")


@dataclass(frozen=True)
class Option:
    """One option of a command, as a row of a table: its flags and what
    ``add_argument`` takes for it. ``default_from`` is asked when the parser
    is built, not when the table is: a default read from the environment
    is the environment's at that moment."""

    flags: tuple[str, ...]
    settings: Mapping[str, Any]
    default_from: Callable[[], Any] | None = None


def option(*flags: str, default_from: Callable[[], Any] | None = None, **settings: Any) -> Option:
    """A row of an option table: ``option("--port", type=int, help=...)``."""
    return Option(flags, settings, default_from)


def add_options(parser: argparse.ArgumentParser, table: Sequence[Option]) -> None:
    """Add every option of ``table`` to ``parser``, in the table's order."""
    for row in table:
        settings = dict(row.settings)
        if row.default_from is not None:
            settings["default"] = row.default_from()
        parser.add_argument(*row.flags, **settings)
