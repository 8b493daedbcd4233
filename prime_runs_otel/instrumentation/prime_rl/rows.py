"""What prime-rl hands the monitor, made into what the run takes: a metrics
dict as ``PrimeMonitor`` posts it (``metrics_row``), the whole step it
belongs to, and a rollout's record as plain JSON.

Kept apart from the monitor because these answer "what does prime-rl's
value become", with no thread or delivery in sight.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any

from ..._json import plain_copy
from ...errors import ConfigError

__all__ = ["metrics_row", "plain_record", "record_of", "step_of"]


def metrics_row(
    metrics: Mapping[str, Any], step: int
) -> tuple[dict[str, Any], list[str], list[str]]:
    """prime-rl's metrics dict as ``PrimeMonitor`` posts it: ``(row, dropped,
    refused)``.

    The row is prime-rl's own: its keys in their order, ``step`` where and as
    the dict has it (an eval row's ``10.0`` stays a float; a dict without
    one is posted without one), non-finite numbers dropped at any depth as
    prime-rl's ``sanitize`` drops them (a nested object left empty stays,
    as there), nothing added. Where prime-rl would lose the whole row (a
    value its JSON encoding refuses), only that value is left out: a number
    of another type (numpy, torch) is taken as its float, anything else is
    refused alone. ``step`` only names the step the row belongs to.
    """
    row: dict[str, Any] = {}
    dropped: list[str] = []
    refused: list[str] = []
    for key, value in metrics.items():
        name = str(key)
        plain = _sanitized(value, name, dropped)
        if plain is _DROPPED:
            continue
        plain = _plain(plain)
        if plain is _BAD:
            refused.append(name)
            continue
        row[name] = plain
    return row, dropped, refused


_BAD = object()
_DROPPED = object()


def step_of(step: Any, row: Mapping[str, Any]) -> int:
    """The whole step a row belongs to (for the spool and the viewer; the
    row itself is posted as it is): the ``step`` prime-rl logged it at, or
    the row's own."""
    for candidate in (step, row.get("step")):
        if isinstance(candidate, float) and candidate.is_integer():
            candidate = int(candidate)
        if isinstance(candidate, int) and not isinstance(candidate, bool) and candidate >= 0:
            return candidate
    return 0


def _sanitized(value: Any, path: str, dropped: list[str]) -> Any:
    """prime-rl's ``sanitize`` (``prime_rl.utils.utils``) of one value: a
    non-finite float is dropped (its path noted), dicts and lists walked."""
    if isinstance(value, float) and not math.isfinite(value):
        dropped.append(path)
        return _DROPPED
    if isinstance(value, dict):
        kept = {}
        for key, item in value.items():
            inner = _sanitized(item, f"{path}.{key}", dropped)
            if inner is not _DROPPED:
                kept[key] = inner
        return kept
    if isinstance(value, list):
        items = (_sanitized(item, f"{path}[{index}]", dropped) for index, item in enumerate(value))
        return [item for item in items if item is not _DROPPED]
    return value


def _plain(value: Any) -> Any:
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    try:
        json.dumps(value, allow_nan=False)
    except (TypeError, ValueError):
        pass
    else:
        return value
    try:
        number = float(value)
    except (TypeError, ValueError, OverflowError):
        return _BAD
    return number if math.isfinite(number) else _BAD


def record_of(episode: Any) -> dict[str, Any]:
    """The episode's record as the spool would read it back (plain JSON)."""
    to_record = getattr(episode, "to_record", None)
    record = to_record() if callable(to_record) else episode
    if not isinstance(record, Mapping):
        raise ConfigError(f"a {type(episode).__name__} is not a verifiers Episode")
    return plain_record(record)


def plain_record(record: Mapping[str, Any]) -> dict[str, Any]:
    """A record as the spool would read it back (plain JSON): a copy of its
    own, whatever else holds the record."""
    plain = plain_copy(record)
    if not isinstance(plain, dict):
        raise ConfigError("the episode's record is not a JSON object")
    return plain
