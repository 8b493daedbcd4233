"""What several pages of the viewer write the same way: a run's label, the
crumbs that lead back to it, the pager's words and an example's key as the
reader knows it. One place, so a run is named alike on every page.
"""

from __future__ import annotations

import json

from ..deliver.spool import RunRow
from .html import url

__all__ = ["NEXT", "PREVIOUS", "crumbs", "example_label", "run_label"]

PREVIOUS = "\u2039 previous"
NEXT = "next \u203a"


def run_label(run: RunRow) -> str:
    """The run's name, else the start of its local id."""
    return run.name or run.local_id[:12]


def crumbs(run: RunRow, *more: tuple[str, str]) -> list[tuple[str, str]]:
    """The trail from the run's page to the ones below it (``more``)."""
    return [(url("runs", run.local_id), run_label(run)), *more]


def example_label(key: str | None) -> str | None:
    """An example key (the JSON of its idx) as the reader knows it."""
    if key is None:
        return None
    try:
        value = json.loads(key)
    except ValueError:
        return key
    return value if isinstance(value, str) else key
