"""``prime-runs-otel rm`` and ``prune``: take runs out of the local store
(never off the platform), refusing a run still being recorded or
delivered unless told to; ``prune --bodies`` drops only the episode bodies
delivered runs keep, which bounds the store while keeping the runs."""

from __future__ import annotations

import argparse
from typing import Any

from ...deliver.spool import DamagedRunError, RunRow, Spool
from ...view.runs import STATES, STATUSES, run_state, select_runs
from ..arguments import json_option, parse_age, spool_option
from ..exits import EXIT_OK, UsageError
from ..output import human_bytes, print_json
from .lookup import find, open_spool


def _live(spool: Spool, run: RunRow) -> bool:
    """Still being recorded or delivered: removing it would lose work in
    flight. A run whose delivery nobody carries on (``paused``) is not."""
    if run.mode == "local":
        return not run.closed
    if run.settled or run.stopped:
        return False
    return run_state(run, spool.waiting_count(run), spool.delivery_alive()) != "paused"


def cmd_rm(args: argparse.Namespace) -> int:
    _, spool = open_spool(args.spool_dir)
    runs: list[RunRow] = []
    damaged: list[str] = []
    for key in args.runs:
        try:
            runs.append(find(spool, key))
        except DamagedRunError as exc:
            if not args.force:  # nothing can tell whether it is still in use
                raise
            damaged.append(exc.local_id)
    live = [run for run in runs if _live(spool, run)]
    if live and not args.force:
        ids = ", ".join(run.local_id[:12] for run in live)
        raise UsageError(
            f"{ids}: still being recorded or delivered; wait until it is closed "
            "(`prime-runs-otel show RUN --follow`), or pass --force to remove it anyway"
        )
    removed: list[dict[str, Any]] = []
    for run in runs:
        episodes = spool.delete_run(run.local_id)
        removed.append({"id": run.local_id, "name": run.name, "episodes": episodes})
    for local_id in damaged:
        removed.append({"id": local_id, "name": None, "episodes": spool.delete_run(local_id)})
    if args.json:
        print_json({"removed": removed})
    else:
        for item in removed:
            print(f"removed {item['id']} ({item['name'] or '-'}, {item['episodes']} episode(s))")
        print("only the local copy is gone; a run already on the platform stays there")
    return EXIT_OK


def cmd_prune(args: argparse.Namespace) -> int:
    if args.older_than is None and not args.status and not args.bodies:
        raise UsageError(
            "say what to prune: --older-than AGE (e.g. 30d) and/or --status STATUS "
            "(e.g. delivered, stored, failed), or --bodies; --dry-run lists it first"
        )
    _, spool = open_spool(args.spool_dir)
    rows = [
        row
        for row in select_runs(spool, statuses=args.status or (), older_than=args.older_than)
        if not _live(spool, row)
    ]
    if args.bodies:
        return _prune_bodies(spool, rows, dry_run=args.dry_run, as_json=args.json)
    items = [{"id": row.local_id, "name": row.name, "episodes": row.episodes} for row in rows]
    if not args.dry_run:
        for row in rows:
            spool.delete_run(row.local_id)
    if args.json:
        print_json({"would_remove" if args.dry_run else "removed": items})
        return EXIT_OK
    verb = "would remove" if args.dry_run else "removed"
    for item in items:
        print(f"{verb} {item['id']} ({item['name'] or '-'}, {item['episodes']} episode(s))")
    if not items:
        print("no closed run matches; nothing removed")
    return EXIT_OK


def _prune_bodies(spool: Spool, rows: list[RunRow], *, dry_run: bool, as_json: bool) -> int:
    """Drop the kept bodies of delivered episodes: the runs stay, with their
    summaries, charts and episode table; only episode pages and ``export``
    lose what the platform has anyway."""
    items: list[dict[str, Any]] = []
    for row in rows:
        if row.mode != "online":
            continue  # a local run's bodies are its only copy
        if dry_run:
            count, size = spool.delivered_bodies(row.local_id)
        else:
            count, size = spool.drop_delivered_bodies(row.local_id)
        if count:
            items.append({"id": row.local_id, "name": row.name, "bodies": count, "bytes": size})
    if as_json:
        print_json({"would_drop" if dry_run else "dropped": items})
        return EXIT_OK
    verb = "would drop" if dry_run else "dropped"
    for item in items:
        print(
            f"{verb} {item['bodies']} delivered episode bodies of {item['id']} "
            f"({item['name'] or '-'}, {human_bytes(item['bytes'])})"
        )
    if not items:
        print("no delivered run keeps episode bodies; nothing dropped")
    elif not dry_run:
        print("the space is reused by the store before its file grows again")
    return EXIT_OK


def add_remove_commands(commands: Any, common: argparse.ArgumentParser) -> None:
    rm = commands.add_parser(
        "rm", parents=[common], help="remove runs from the local store (not from the platform)"
    )
    rm.add_argument("runs", nargs="+", metavar="RUN", help="the runs to remove")
    rm.add_argument(
        "--force", action="store_true", help="remove even a run still being recorded or delivered"
    )
    json_option(rm, "what was removed")
    spool_option(rm)
    rm.set_defaults(func=cmd_rm)

    prune = commands.add_parser(
        "prune", parents=[common], help="remove closed runs from the local store by age or status"
    )
    prune.add_argument(
        "--older-than", type=parse_age, metavar="AGE", help="created more than AGE ago (30d, 12h)"
    )
    prune.add_argument(
        "--status",
        action="append",
        choices=STATUSES + STATES,
        help="with this status or state (repeatable)",
    )
    prune.add_argument(
        "--bodies",
        action="store_true",
        help="drop only the kept bodies of delivered episodes (the platform has them); the runs, "
        "their summaries and charts stay",
    )
    prune.add_argument("--dry-run", action="store_true", help="list what would go; remove nothing")
    json_option(prune, "what was removed")
    spool_option(prune)
    prune.set_defaults(func=cmd_prune)
