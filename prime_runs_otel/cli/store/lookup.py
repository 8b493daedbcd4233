"""The spool a command reads and the run it names: by id, platform id, a
unique prefix of either, or the run's exact name.

Every store command starts here, so a run is found the same way and a
missing spool or an unknown run is the same usage error (exit 2) whatever
the command.
"""

from __future__ import annotations

import sqlite3
import sys

from ..._text import one_line
from ...config import Settings, resolve_settings
from ...deliver.crashed import end_runs_of_dead_producers
from ...deliver.spool import RunRow, Spool, SpoolError
from ...view.runs import runs_named
from ..exits import UsageError


def open_spool(spool_dir: str | None) -> tuple[Settings, Spool]:
    settings = resolve_settings(spool_dir=spool_dir, mode="local")
    if not spool_exists(settings):
        raise UsageError(
            f"no spool at {settings.spool_path}: nothing has been recorded there yet "
            f"(set PRIME_RUNS_OTEL_DIR or --spool-dir to look elsewhere); {first_run_hint()}"
        )
    spool = Spool(settings.spool_path, max_bytes=settings.spool_max_bytes)
    _end_runs_of_dead_producers(spool)
    return settings, spool


def _end_runs_of_dead_producers(spool: Spool) -> None:
    """A run whose recording process was killed is shown as crashed, not as
    still recording (the write is the one the next delivering process would
    make; a spool this user cannot write is read as it is)."""
    try:
        ended = end_runs_of_dead_producers(spool)
    except (SpoolError, sqlite3.Error) as exc:
        print(
            one_line(f"note: runs whose process is gone are not marked crashed: {exc}"),
            file=sys.stderr,
        )
        return
    for local_id in ended:
        print(
            f"note: run {local_id[:12]} crashed: the process recording it is gone "
            "without ending it",
            file=sys.stderr,
        )


def spool_exists(settings: Settings) -> bool:
    """Whether anything was ever recorded where ``settings`` point."""
    return settings.spool_path.exists()


def first_run_hint() -> str:
    """How to make a first run, for a store that has none yet."""
    return (
        "`prime-runs-otel demo` records one (`make demo` in a checkout); "
        "`prime-runs-otel run -- COMMAND` or `replay traces.jsonl` record yours"
    )


def find(spool: Spool, key: str) -> RunRow:
    """A run by id, platform id, a unique prefix of either, or its exact name."""
    named = runs_named(spool, key)
    if len(named) == 1:
        return named[0]
    if len(named) > 1:
        ids = ", ".join(row.local_id[:12] for row in named)
        raise UsageError(f"{len(named)} runs are named {key!r} ({ids}); give an id instead")
    matches = _prefixed(spool, key)
    if len(matches) > 1:
        listed = "; ".join(f"{row.local_id[:12]} ({row.name or 'unnamed'})" for row in matches[:10])
        more = f"; and {len(matches) - 10} more" if len(matches) > 10 else ""
        raise UsageError(
            f"{key!r} starts the id of {len(matches)} runs: {listed}{more}; give more of the id"
        )
    raise UsageError(f"no run {key!r} in {spool.path}; `prime-runs-otel runs` lists them")


def _prefixed(spool: Spool, key: str) -> list[RunRow]:
    """The runs whose id or platform id starts with ``key``: what an
    ambiguous prefix could have meant, for the user to pick from."""
    return [
        row
        for row in spool.runs()
        if row.local_id.startswith(key) or (row.platform_id or "").startswith(key)
    ]


def note_damaged(spool: Spool) -> int:
    """Name, on stderr, every run whose row cannot be read back (left out of
    what a command lists or does); returns how many there are."""
    damaged = spool.damaged_runs()
    for exc in damaged:
        print(one_line(f"note: {exc}"), file=sys.stderr)
    return len(damaged)
