"""``prime-runs-otel push``: deliver local or pending runs to the platform
from the command line, with the same uploader the exporter runs.

A run that cannot go as it is (no episodes, no environment) is named with
what to do instead, and ``--environment``/``--model`` amend one run first.
"""

from __future__ import annotations

import argparse
import dataclasses
import time
from collections.abc import Sequence
from typing import Any

from ..._text import one_line
from ...config import Settings, key_hint, resolve_settings
from ...deliver.spool import RunRow, Spool
from ...deliver.uploader import Uploader
from ...view.runs import run_view
from ..arguments import add_options, json_option, non_negative_float, option, spool_option
from ..exits import EXIT_INCOMPLETE, EXIT_OK, UsageError
from ..output import Progress, color, print_json
from .lookup import find, note_damaged, open_spool


def why_unpushable(run: RunRow, environments: Sequence[str]) -> str | None:
    """Why this run cannot go to the platform as it is, with what to do instead."""
    short = run.local_id[:12]
    # A run the platform already has still needs closing, episodes or not.
    if run.episodes == 0 and run.kind == "eval" and run.platform_id is None:
        return f"it holds no episodes; remove it with `prime-runs-otel rm {short}`"
    if run.kind == "eval" and not (environments or run.identity.environments):
        return (
            "it names no environment, which the platform requires; give it one with "
            f"`prime-runs-otel push {short} --environment NAME` or remove it with "
            f"`prime-runs-otel rm {short}`"
        )
    return None


def _push_targets(args: argparse.Namespace, spool: Spool) -> list[RunRow]:
    if args.runs and args.all:
        raise UsageError("give runs to push, or --all, not both")
    if args.runs:
        return [find(spool, key) for key in args.runs]
    if not args.all:
        waiting = [row for row in spool.reading.runs() if _pushable(row)]
        raise UsageError(
            "say which runs to push: `prime-runs-otel push RUN...`, or `push --all` for the "
            f"{len(waiting)} run(s) not yet on the platform (`push --all --dry-run` lists them)"
        )
    return [row for row in spool.reading.runs() if _pushable(row)]


def _pushable(row: RunRow) -> bool:
    return row.mode == "local" or not row.closed


def cmd_push(args: argparse.Namespace) -> int:
    _, spool = open_spool(args.spool_dir)
    targets = _push_targets(args, spool)
    damaged = note_damaged(spool) if args.all else 0
    amend = bool(args.environment or args.model)
    if amend and len(targets) != 1:
        raise UsageError("--environment and --model amend one run: name exactly one RUN")
    skipped: list[tuple[RunRow, str]] = []
    ready: list[RunRow] = []
    for run in targets:
        reason = why_unpushable(run, args.environment or ())
        (skipped.append((run, reason)) if reason else ready.append(run))
    if args.dry_run:
        return _print_dry_run(spool, ready, skipped, as_json=args.json)
    settings = resolve_settings(spool_dir=args.spool_dir)
    if not settings.api_key:
        raise UsageError(f"push needs an API key: {key_hint()} first")
    if not targets:
        _report([], skipped, spool, as_json=args.json, note="nothing to push")
        return EXIT_OK
    spool.housekeeping.keep_room()  # on a full disk, the spool's reserve is for delivering it
    for run in ready:
        if amend:
            identity = dataclasses.replace(
                run.identity,
                environments=tuple(args.environment or run.identity.environments),
                model=args.model or run.identity.model,
            )
            spool.delivery.update_run(run.local_id, identity=identity.to_json())
        if run.mode != "online":
            spool.delivery.set_mode(run.local_id, "online")
            spool.delivery.keep_records(run.local_id, not args.drop_local)
        elif args.drop_local:
            spool.delivery.keep_records(run.local_id, False)
        spool.delivery.reopen_failed(run.local_id)
        # What went wrong last time is history once the run is tried again.
        spool.delivery.update_run(run.local_id, last_error=None)
    ids = [run.local_id for run in ready]
    _deliver(spool, settings, ids, args.timeout)
    rows = [row for row in (spool.reading.run(key) for key in ids) if row is not None]
    _report(rows, skipped, spool, as_json=args.json)
    incomplete = (
        bool(skipped)
        or bool(damaged)
        or any(
            spool.reading.pending_count(row.local_id) or row.failed or not row.closed
            for row in rows
        )
    )
    return EXIT_INCOMPLETE if incomplete else EXIT_OK


def _deliver(spool: Spool, settings: Settings, ids: list[str], timeout: float) -> None:
    if not ids:
        return
    total = sum(spool.reading.pending_count(key) for key in ids)
    uploader = Uploader(spool, settings.with_mode("online"))
    progress = Progress("pushing episodes", total)
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            uploader.deliver_once(only=ids)
            left = sum(spool.reading.pending_count(key) for key in ids)
            progress.advance(max(0, total - left - progress.done))
            if all(_push_done(spool, spool.reading.run(key)) for key in ids):
                break
            time.sleep(0.2)
    finally:
        uploader.stop()
    progress.close()


def _push_done(spool: Spool, run: RunRow | None) -> bool:
    """Nothing more to do for now: closed, stopped on a permanent error, or
    still running elsewhere with nothing pending."""
    if run is None or run.settled or run.stopped:
        return True
    return run.end_status is None and spool.reading.pending_count(run.local_id) == 0


def _print_dry_run(
    spool: Spool, ready: list[RunRow], skipped: list[tuple[RunRow, str]], *, as_json: bool
) -> int:
    if as_json:
        print_json(
            {
                "would_push": [run_view(spool, row) for row in ready],
                "cannot_push": [
                    {**run_view(spool, row), "reason": reason} for row, reason in skipped
                ],
            }
        )
        return EXIT_OK
    if not ready and not skipped:
        print("nothing to push: every run in the spool is on the platform")
    for row in ready:
        print(
            one_line(
                f"would push {row.local_id[:12]}  {row.name or '-'}  ({row.episodes} episode(s))"
            )
        )
    for row, reason in skipped:
        print(one_line(f"cannot push {row.local_id[:12]}  {row.name or '-'}: {reason}"))
    return EXIT_OK


def _report(
    rows: list[RunRow],
    skipped: list[tuple[RunRow, str]],
    spool: Spool,
    *,
    as_json: bool,
    note: str | None = None,
) -> None:
    if as_json:
        print_json(
            {
                "pushed": [run_view(spool, row) for row in rows],
                "cannot_push": [
                    {**run_view(spool, row), "reason": reason} for row, reason in skipped
                ],
            }
        )
        return
    if note and not skipped:
        print(f"{note}: every run in the spool is on the platform")
    for row in rows:
        view = run_view(spool, row)
        text = (
            f"{row.local_id[:12]}: {view['status']}, {view['state']}, {row.episodes} episode(s), "
            f"{view['pending']} pending, {view['failed']} failed, {row.uncertain} uncertain"
            + (f", {row.url}" if row.url else "")
        )
        print(text)
        if view["next_step"]:
            print(f"  {color('stopped', '31')}: {row.last_error}\n  next: {view['next_step']}")
    for row, reason in skipped:
        print(one_line(f"{row.local_id[:12]}: not pushed: {reason}"))


#: ``push``'s arguments, in the order its help lists them.
PUSH_OPTIONS = (
    option("runs", nargs="*", metavar="RUN", help="the runs to push"),
    option("--all", action="store_true", help="every run not yet on the platform"),
    option("--dry-run", action="store_true", help="list what would be pushed, and send nothing"),
    option(
        "--drop-local",
        action="store_true",
        help="delete the local record bodies once delivered (default: keep them for export)",
    ),
    option(
        "--environment",
        action="append",
        metavar="NAME",
        help="amend the run's environments before pushing (repeatable; one RUN only)",
    ),
    option("--model", help="amend the run's model before pushing (one RUN only)"),
    option(
        "--timeout",
        type=non_negative_float,
        default=600.0,
        metavar="SECONDS",
        help="how long to keep delivering (default 600)",
    ),
)


def add_push_command(commands: Any, common: argparse.ArgumentParser) -> None:
    push = commands.add_parser(
        "push", parents=[common], help="deliver chosen local or pending runs to the platform"
    )
    add_options(push, PUSH_OPTIONS)
    json_option(push, "what was pushed")
    spool_option(push)
    push.set_defaults(func=cmd_push)
