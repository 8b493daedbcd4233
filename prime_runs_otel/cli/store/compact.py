"""``prime-runs-otel compact``: give the spool file's free pages back to the
disk, and make ``rm`` and ``prune`` do it by themselves from then on (a
spool created by an earlier release keeps every removed run's pages as free
pages inside the file; see :mod:`prime_runs_otel.deliver.spool.space`)."""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from ...deliver.spool import Spool
from ..arguments import json_option, spool_option
from ..exits import EXIT_OK, UsageError
from ..output import human_bytes, print_json
from .lookup import open_spool


def cmd_compact(args: argparse.Namespace) -> int:
    _, spool = open_spool(args.spool_dir)
    if spool.reading.delivery_alive() and not args.force:
        raise UsageError(
            f"a process is recording or delivering from {spool.path} right now, and compacting "
            "makes it wait until done; run compact once it has finished "
            "(`prime-runs-otel runs` shows what is recording), or pass --force"
        )
    before, free = file_bytes(spool), spool.housekeeping.free_bytes()
    gave_back_before = spool.housekeeping.gives_back_space()
    _check_room(spool, before - free)
    if not args.json:
        print(
            f"compacting {spool.path}: {human_bytes(before)} on disk, {human_bytes(free)} of it "
            "free pages (this rewrites the file; it takes a while for a large spool)...",
            file=sys.stderr,
            flush=True,
        )
    spool.housekeeping.compact()
    after = file_bytes(spool)
    report = {"spool": str(spool.path), "bytes_before": before, "bytes_after": after}
    if args.json:
        print_json(report)
    else:
        print(
            f"compacted {spool.path}: {human_bytes(before)} -> {human_bytes(after)} "
            f"({human_bytes(max(0, before - after))} given back)"
            + (
                ""
                if gave_back_before
                else "; `rm` and `prune` give space back by themselves from now on"
            )
        )
    return EXIT_OK


def file_bytes(spool: Spool) -> int:
    """The spool file's size on disk, its write-ahead log left out: the log
    is emptied into the file at every checkpoint, and counting it made
    ``prune`` and ``compact`` disagree on the same file (each open of the
    spool adds a few pages to the log)."""
    try:
        return os.path.getsize(spool.path)
    except OSError:
        return 0


def _check_room(spool: Spool, used: int) -> None:
    """Compacting writes a copy of what the spool holds before the old file
    goes: a disk without that much room would fail half-way."""
    disk_free = spool.housekeeping.disk_free()
    if disk_free is not None and disk_free < used:
        raise UsageError(
            f"compacting needs about {human_bytes(used)} free on the disk of {spool.path} "
            f"(a copy of what it holds), and the disk has {human_bytes(disk_free)}: free space "
            "on it first, or remove runs (`rm`, `prune`), which gives their space back"
        )


def add_compact_command(commands: Any, common: argparse.ArgumentParser) -> None:
    compact = commands.add_parser(
        "compact",
        parents=[common],
        help="give the space of removed runs back to the disk (the spool file shrinks)",
    )
    compact.add_argument(
        "--force",
        action="store_true",
        help="compact even while a process records or delivers (it waits until done)",
    )
    json_option(compact, "the spool's size before and after")
    spool_option(compact)
    compact.set_defaults(func=cmd_compact)
