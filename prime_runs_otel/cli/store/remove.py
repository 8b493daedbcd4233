"""``prime-runs-otel rm`` and ``prune``: take runs out of the local store
(never off the platform), refusing a run still being recorded or
delivered unless told to; ``prune --bodies`` drops only the episode bodies
delivered runs keep, which bounds the store while keeping the runs."""

from __future__ import annotations

import argparse
from typing import Any

from ...deliver.spool import DamagedRunError, RunRow, Spool
from ...view.runs import STATES, STATUSES, run_state, select_runs
from ..arguments import add_options, json_option, option, parse_age, spool_option
from ..exits import EXIT_OK, UsageError
from ..output import human_bytes, print_json
from .compact import file_bytes
from .lookup import find, open_spool

#: Free pages worth a ``compact`` hint after ``rm`` or ``prune``.
COMPACT_HINT_BYTES = 1 << 20


def _live(spool: Spool, run: RunRow) -> bool:
    """Still being recorded or delivered: removing it would lose work in
    flight. A run whose delivery nobody carries on (``paused``) is not."""
    if run.mode == "local":
        return not run.closed
    if run.settled or run.stopped:
        return False
    return (
        run_state(run, spool.reading.waiting_count(run), spool.reading.delivery_alive()) != "paused"
    )


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
        episodes = spool.housekeeping.delete_run(run.local_id)
        removed.append({"id": run.local_id, "name": run.name, "episodes": episodes})
    for local_id in damaged:
        removed.append(
            {"id": local_id, "name": None, "episodes": spool.housekeeping.delete_run(local_id)}
        )
    space = _give_back_space(spool)
    if args.json:
        print_json({"removed": removed, **space})
    else:
        for item in removed:
            print(f"removed {item['id']} ({item['name'] or '-'}, {item['episodes']} episode(s))")
        print("only the local copy is gone; a run already on the platform stays there")
        _print_space(spool, space)
    return EXIT_OK


def _give_back_space(spool: Spool) -> dict[str, int]:
    """What was removed goes back to the disk where the spool can do that in
    place; the sizes of the spool file before and after (measured as
    ``compact`` measures them: :func:`.compact.file_bytes`), and the free
    pages left in it."""
    before = file_bytes(spool)
    spool.housekeeping.give_back_space()
    return {
        "bytes_before": before,
        "bytes_after": file_bytes(spool),
        "free_bytes": spool.housekeeping.free_bytes(),
    }


def _print_space(spool: Spool, space: dict[str, int]) -> None:
    given, now = space["bytes_before"] - space["bytes_after"], space["bytes_after"]
    if given > 0:
        print(f"the spool file shrank by {human_bytes(given)} (now {human_bytes(now)})")
    if space["free_bytes"] >= COMPACT_HINT_BYTES and not spool.housekeeping.gives_back_space():
        print(
            f"{human_bytes(space['free_bytes'])} of free pages stay in the spool file (created by "
            "an earlier release): `prime-runs-otel compact` gives them back to the disk"
        )


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
            spool.housekeeping.delete_run(row.local_id)
    space = {} if args.dry_run else _give_back_space(spool)
    if args.json:
        print_json({"would_remove" if args.dry_run else "removed": items, **space})
        return EXIT_OK
    verb = "would remove" if args.dry_run else "removed"
    for item in items:
        print(f"{verb} {item['id']} ({item['name'] or '-'}, {item['episodes']} episode(s))")
    if not items:
        print("no closed run matches; nothing removed")
    if space:
        _print_space(spool, space)
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
            count, size = spool.housekeeping.delivered_bodies(row.local_id)
        else:
            count, size = spool.housekeeping.drop_delivered_bodies(row.local_id)
        if count:
            items.append({"id": row.local_id, "name": row.name, "bodies": count, "bytes": size})
    space = {} if dry_run else _give_back_space(spool)
    if as_json:
        print_json({"would_drop" if dry_run else "dropped": items, **space})
        return EXIT_OK
    verb = "would drop" if dry_run else "dropped"
    for item in items:
        print(
            f"{verb} {item['bodies']} delivered episode bodies of {item['id']} "
            f"({item['name'] or '-'}, {human_bytes(item['bytes'])})"
        )
    if not items:
        print("no delivered run keeps episode bodies; nothing dropped")
    if space:
        _print_space(spool, space)
    return EXIT_OK


#: ``prune``'s arguments, in the order its help lists them.
PRUNE_OPTIONS = (
    option(
        "--older-than", type=parse_age, metavar="AGE", help="created more than AGE ago (30d, 12h)"
    ),
    option(
        "--status",
        action="append",
        choices=STATUSES + STATES,
        help="with this status or state (repeatable)",
    ),
    option(
        "--bodies",
        action="store_true",
        help="drop only the kept bodies of delivered episodes (the platform has them); the runs, "
        "their summaries and charts stay",
    ),
    option("--dry-run", action="store_true", help="list what would go; remove nothing"),
)


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
    add_options(prune, PRUNE_OPTIONS)
    json_option(prune, "what was removed")
    spool_option(prune)
    prune.set_defaults(func=cmd_prune)
