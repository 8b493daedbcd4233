"""The spool a command reads and the run it names: by id, platform id, a
unique prefix of either, or the run's exact name.

Every store command starts here, so a run is found the same way and a
missing spool or an unknown run is the same usage error (exit 2) whatever
the command. Reading needs no write access: :func:`open_store` reads a
store this user cannot write (a shared results folder, a mounted backup)
as it is; :func:`open_spool`, for the commands that change the store, says
at once when it cannot be written, naming the folder.
"""

from __future__ import annotations

import os
import sqlite3
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from ..._text import one_line
from ...config import spool_dir_setting, spool_max_bytes_setting
from ...deliver.spool import RunRow, Spool, SpoolError
from ..exits import UsageError

if TYPE_CHECKING:
    from ...config import Settings

#: The spool's file in its folder (as ``Settings.spool_path`` names it).
SPOOL_FILE = "spool.sqlite3"


def store_folder(spool_dir: str | None) -> Path:
    """The store's folder: ``--spool-dir``, else ``PRIME_RUNS_OTEL_DIR``, else
    the default. A path that is a file is refused (exit 2), and so is a
    ``--spool-dir`` that does not exist: a typo must not read as an empty store."""
    folder = spool_dir_setting(spool_dir)
    if folder.exists() and not folder.is_dir():
        raise UsageError(
            f"{folder} is a file, not a store folder: give --spool-dir (or PRIME_RUNS_OTEL_DIR) "
            "the folder that holds spool.sqlite3"
        )
    if spool_dir and not folder.exists():
        raise UsageError(
            f"no folder {folder}: give --spool-dir an existing store folder "
            "(`prime-runs-otel runs` without it reads the default one)"
        )
    return folder


def spool_exists(folder: Path) -> bool:
    """Whether anything was ever recorded in the store at ``folder``."""
    return (folder / SPOOL_FILE).exists()


def open_store(spool_dir: str | None) -> Spool:
    """The spool, for a command that only reads it (``runs``, ``show``,
    ``export``, ``ui``). A store this user cannot write is opened read-only
    and read as it is, with a note on stderr."""
    folder = store_folder(spool_dir)
    _require_spool(folder)
    path = folder / SPOOL_FILE
    if writable(folder):
        spool = Spool(path, max_bytes=spool_max_bytes_setting())
        _end_runs_of_dead_producers(spool)
        return spool
    print(
        f"note: this user cannot write the store in {folder}: it is read as it is "
        "(runs whose process is gone are not marked crashed)",
        file=sys.stderr,
    )
    try:
        return Spool.open_read_only(path)
    except SpoolError as exc:
        raise UsageError(str(exc)) from None


def open_spool(spool_dir: str | None) -> tuple[Settings, Spool]:
    """The spool, for a command that changes it (``push``, ``rm``, ``prune``,
    ``compact``): refused at once, naming the folder, where it cannot be written."""
    from ...config import resolve_settings

    folder = store_folder(spool_dir)
    settings = resolve_settings(spool_dir=folder, mode="local")
    _require_spool(folder)
    if not writable(folder):
        raise UsageError(
            f"{command_word()} needs to write to the local store in {folder}, which this user "
            "cannot write: run it as the store's owner, or copy the folder somewhere writable "
            "and point --spool-dir (or PRIME_RUNS_OTEL_DIR) at the copy"
        )
    spool = Spool(settings.spool_path, max_bytes=settings.spool_max_bytes)
    _end_runs_of_dead_producers(spool)
    return settings, spool


def writable(folder: Path) -> bool:
    """Whether this user can write the store: its folder and its files (the
    spool and, if there, its write-ahead log and index), on a file system
    mounted for writing."""
    members = [folder / SPOOL_FILE, folder / f"{SPOOL_FILE}-wal", folder / f"{SPOOL_FILE}-shm"]
    return os.access(folder, os.W_OK | os.X_OK) and all(
        os.access(member, os.W_OK) for member in members if member.exists()
    )


def command_word() -> str:
    """The command being run, as the user typed it (``prime-runs-otel rm``)."""
    words = [arg for arg in sys.argv[1:] if not arg.startswith("-")]
    return f"`prime-runs-otel {words[0]}`" if words else "this command"


def _require_spool(folder: Path) -> None:
    if not spool_exists(folder):
        raise UsageError(
            f"no spool at {folder / SPOOL_FILE}: nothing has been recorded there yet "
            f"(set PRIME_RUNS_OTEL_DIR or --spool-dir to look elsewhere); {first_run_hint()}"
        )


def _end_runs_of_dead_producers(spool: Spool) -> None:
    """A run whose recording process was killed is shown as crashed, not as
    still recording (the write is the one the next delivering process would
    make)."""
    from ...deliver.crashed import end_runs_of_dead_producers

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


def first_run_hint() -> str:
    """How to make a first run, for a store that has none yet."""
    return (
        "`prime-runs-otel demo` records one (`make demo` in a checkout); "
        "`prime-runs-otel run -- COMMAND` or `replay traces.jsonl` record yours"
    )


def find(spool: Spool, key: str) -> RunRow:
    """A run by id, platform id, a unique prefix of either, or its exact name."""
    from ...view.runs import runs_named

    if not key.strip():
        raise UsageError("RUN is empty: give a run's id, a prefix of it, or its name")
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
        for row in spool.reading.runs()
        if row.local_id.startswith(key) or (row.platform_id or "").startswith(key)
    ]


def note_damaged(spool: Spool) -> int:
    """Name, on stderr, every run whose row cannot be read back (left out of
    what a command lists or does); returns how many there are."""
    damaged = spool.reading.damaged_runs()
    for exc in damaged:
        print(one_line(f"note: {exc}"), file=sys.stderr)
    return len(damaged)
