"""``prime-runs-otel runs``: the runs in the spool, newest first, as a table
or as JSON."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

from ..._text import one_line
from ...view.runs import STATES, STATUSES, run_view, select_runs
from ..arguments import add_options, json_option, option, parse_since, positive_int, spool_option
from ..exits import EXIT_OK
from ..output import print_json, stdout_gone
from .lookup import SPOOL_FILE, first_run_hint, note_damaged, open_store, spool_exists, store_folder
from .training import step_column, training_view, with_training


def cmd_runs(args: argparse.Namespace) -> int:
    folder = store_folder(args.spool_dir)
    if not spool_exists(folder):
        return _no_runs_yet(folder / SPOOL_FILE, as_json=args.json)
    spool = open_store(args.spool_dir)
    rows = select_runs(
        spool, statuses=args.status or (), kind=args.kind, name=args.name, since=args.since
    )
    if args.limit:
        rows = rows[: args.limit]
    note_damaged(spool)
    if args.json:
        print_json([with_training(spool, row, run_view(spool, row)) for row in rows])
        return EXIT_OK
    if not rows:
        print(f"no runs in {spool.path}" + (" match" if _filtered(args) else ""))
        return EXIT_OK
    print(
        f"{'ID':<12}  {'NAME':<28} {'KIND':<5} {'STEP':>6} {'STATUS':<9} {'STATE':<10} "
        f"{'EPISODES':>8} {'PENDING':>7} {'NOT PUSHED':>10}  CREATED"
    )
    for row in rows:
        view = run_view(spool, row)
        created = time.strftime("%Y-%m-%d %H:%M", time.localtime(row.created_at))
        name = one_line((row.name or "-")[:28])
        print(
            f"{one_line(row.local_id[:12]):<12}  {name:<28} {row.kind:<5} "
            f"{step_column(training_view(spool, row)):>6} "
            f"{view['status']:<9} {view['state']:<10} {row.episodes:>8} {view['pending']:>7} "
            f"{view['not_pushed']:>10}  {created}"
        )
        if stdout_gone():
            break
    return EXIT_OK


def _no_runs_yet(path: Path, *, as_json: bool) -> int:
    """A machine where nothing was recorded yet: an empty list, not an error
    (a fresh install is not a misconfiguration), and how to make a run."""
    hint = f"no runs yet (nothing recorded in {path.parent}): {first_run_hint()}"
    if as_json:
        print_json([])
        print(hint, file=sys.stderr)
    else:
        print(hint)
    return EXIT_OK


def _filtered(args: argparse.Namespace) -> bool:
    return bool(args.status or args.kind or args.name or args.since)


#: ``runs``' filters, in the order its help lists them.
RUNS_OPTIONS = (
    option(
        "--status",
        action="append",
        choices=STATUSES + STATES,
        help="only runs with this status or state (repeatable)",
    ),
    option("--kind", choices=["eval", "train"], help="only eval or training runs"),
    option("--name", help="only runs whose name contains this text"),
    option(
        "--since",
        type=parse_since,
        metavar="AGE|DATE",
        help="only runs created since (7d, 2026-01-31)",
    ),
    option("--limit", type=positive_int, metavar="N", help="at most N runs"),
)


def add_runs_command(commands: Any, common: argparse.ArgumentParser) -> None:
    runs = commands.add_parser(
        "runs", parents=[common], help="list the runs in the spool, newest first"
    )
    add_options(runs, RUNS_OPTIONS)
    json_option(runs, "the runs")
    spool_option(runs)
    runs.set_defaults(func=cmd_runs)
