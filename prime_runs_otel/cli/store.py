"""The local store from the command line: ``runs``, ``show``, ``export``,
``push``, ``rm`` and ``prune``.

One vocabulary for every command that describes a run (see
:func:`run_view`): ``status`` is how the run ended (``running`` until it
does), ``state`` where it is in its life (``recording``, ``stored`` in the
local store, ``delivering``, ``delivered``, ``stopped`` on a permanent
refusal), ``pending`` the episodes still on their way to the platform and
``not_pushed`` those of a local run nobody has pushed yet.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import re
import sys
import time
from collections.abc import Sequence
from typing import Any, TextIO

from .._json import loads as fast_loads
from .._text import one_line
from ..config import Settings, resolve_settings
from ..deliver.advice import next_step
from ..deliver.spool import RunRow, Spool
from ..deliver.summary import run_summary
from ..deliver.uploader import Uploader
from ..errors import PrimeRunsOtelError
from ..read.projection import TraceScores, episode_sample_rows, summary_trace_index, traces_line
from .arguments import non_negative_float, positive_int
from .output import Progress, color, human_bytes, print_json, stdout_gone

EXIT_OK, EXIT_INCOMPLETE, EXIT_USAGE = 0, 1, 2

STATES = ("recording", "stored", "delivering", "delivered", "stopped")
STATUSES = ("running", "completed", "failed", "cancelled", "crashed")


class UsageError(PrimeRunsOtelError):
    """A command line that cannot be carried out as given (exit code 2)."""


# -- shared -----------------------------------------------------------------------


def open_spool(spool_dir: str | None) -> tuple[Settings, Spool]:
    settings = resolve_settings(spool_dir=spool_dir, mode="local")
    if not settings.spool_path.exists():
        raise UsageError(
            f"no spool at {settings.spool_path}: nothing has been recorded there yet "
            "(set PRIME_RUNS_OTEL_DIR or --spool-dir to look elsewhere)"
        )
    return settings, Spool(settings.spool_path, max_bytes=settings.spool_max_bytes)


def find(spool: Spool, key: str) -> RunRow:
    """A run by id, platform id, a unique prefix of either, or its exact name."""
    run = spool.find_run(key)
    if run is not None:
        return run
    named = [row for row in spool.runs() if row.name == key]
    if len(named) == 1:
        return named[0]
    if len(named) > 1:
        ids = ", ".join(row.local_id[:12] for row in named)
        raise UsageError(f"{len(named)} runs are named {key!r} ({ids}); give an id instead")
    raise UsageError(
        f"no run {key!r} in {spool.path} (or the prefix is ambiguous); "
        "`prime-runs-otel runs` lists them"
    )


def run_state(run: RunRow) -> str:
    if run.stopped:
        return "stopped"
    if run.mode == "local":
        return "stored" if run.closed else "recording"
    if run.closed:
        return "delivered"
    return "delivering" if run.end_status else "recording"


def run_view(spool: Spool, run: RunRow) -> dict[str, Any]:
    """A run as every command prints it in ``--json`` (the keys are documented
    in docs/cli.md and stay stable)."""
    waiting = spool.pending_count(run.local_id)
    local = run.mode == "local"
    return {
        "id": run.local_id,
        "name": run.name,
        "kind": run.kind,
        "mode": run.mode,
        "status": run.end_status or "running",
        "state": run_state(run),
        "closed": run.closed,
        "model": run.identity.model,
        "environments": list(run.identity.environments),
        "platform_id": run.platform_id,
        "url": run.url,
        "episodes": run.episodes,
        # Local runs wait for nobody: their episodes are stored, to be pushed.
        "pending": 0 if local else waiting,
        "not_pushed": waiting if local else 0,
        "failed": run.failed,
        "rejected": run.rejected,
        "uncertain": run.uncertain,
        "corrupt": run.corrupt,
        "unencodable": run.unencodable,
        "duplicates": run.duplicates,
        "error": run.end_error,
        "last_error": run.last_error,
        "next_step": next_step(run.local_id, run.last_error) if run.stopped else None,
        "created_at": _iso(run.created_at),
        "ended_at": _iso(run.ended_at) if run.ended_at else None,
        "summary": run_summary(run),
        "spool": str(spool.path),
    }


def _iso(stamp: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(stamp))


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


# -- runs ---------------------------------------------------------------------------


def select_runs(
    spool: Spool,
    *,
    statuses: Sequence[str] = (),
    kind: str | None = None,
    name: str | None = None,
    since: float | None = None,
    older_than: float | None = None,
) -> list[RunRow]:
    """Runs newest first, filtered; a status filter matches ``status`` or ``state``."""
    chosen = []
    now = time.time()
    for row in spool.runs():
        if statuses and not {row.end_status or "running", run_state(row)} & set(statuses):
            continue
        if kind and row.kind != kind:
            continue
        if name and name.lower() not in (row.name or "").lower():
            continue
        if since is not None and row.created_at < since:
            continue
        if older_than is not None and now - row.created_at < older_than:
            continue
        chosen.append(row)
    return chosen


def cmd_runs(args: argparse.Namespace) -> int:
    _, spool = open_spool(args.spool_dir)
    rows = select_runs(
        spool, statuses=args.status or (), kind=args.kind, name=args.name, since=args.since
    )
    if args.limit:
        rows = rows[: args.limit]
    if args.json:
        print_json([run_view(spool, row) for row in rows])
        return EXIT_OK
    if not rows:
        print(f"no runs in {spool.path}" + (" match" if _filtered(args) else ""))
        return EXIT_OK
    print(
        f"{'ID':<12}  {'NAME':<28} {'KIND':<5} {'STATUS':<9} {'STATE':<10} "
        f"{'EPISODES':>8} {'PENDING':>7} {'NOT PUSHED':>10}  CREATED"
    )
    for row in rows:
        view = run_view(spool, row)
        created = time.strftime("%Y-%m-%d %H:%M", time.localtime(row.created_at))
        name = one_line((row.name or "-")[:28])
        print(
            f"{one_line(row.local_id[:12]):<12}  {name:<28} {row.kind:<5} "
            f"{view['status']:<9} {view['state']:<10} {row.episodes:>8} {view['pending']:>7} "
            f"{view['not_pushed']:>10}  {created}"
        )
        if stdout_gone():
            break
    return EXIT_OK


def _filtered(args: argparse.Namespace) -> bool:
    return bool(args.status or args.kind or args.name or args.since)


# -- show ---------------------------------------------------------------------------


def cmd_show(args: argparse.Namespace) -> int:
    _, spool = open_spool(args.spool_dir)
    run = find(spool, args.run)
    if args.follow:
        return follow(spool, run.local_id, interval=args.interval, as_json=args.json)
    if args.json:
        print_json(run_view(spool, run))
    else:
        print_show(spool, run)
    return EXIT_OK


def episode_rewards(spool: Spool, run: RunRow, limit: int = 100_000) -> list[float]:
    """Each stored episode's reward (its summary trace's), up to ``limit``."""
    rewards: list[float] = []
    for episode in spool.iter_episodes(run.local_id):
        try:
            record = fast_loads(episode.record)
            traces = record.get("traces") or ()
            if traces:
                reward = float(TraceScores.of(traces[summary_trace_index(record)]).reward)
                if math.isfinite(reward):
                    rewards.append(reward)
        except (AttributeError, KeyError, TypeError, ValueError):
            continue
        if len(rewards) >= limit:
            break
    return rewards


def histogram(values: Sequence[float], bins: int = 10, width: int = 40) -> list[str]:
    """A reward histogram as text lines: ``[low, high)  ####  count``."""
    if not values:
        return []
    low, high = min(values), max(values)
    if high == low:
        return [f"  {low:>8.3f}          {'#' * width} {len(values)}"]
    step = (high - low) / bins
    counts = [0] * bins
    for value in values:
        counts[min(int((value - low) / step), bins - 1)] += 1
    top = max(counts)
    lines = []
    for index, count in enumerate(counts):
        start = low + index * step
        bar = "#" * (round(width * count / top) if count else 0)
        lines.append(f"  {start:>8.3f} - {start + step:<8.3f} {bar:<{width}} {count}")
    return lines


def print_show(spool: Spool, run: RunRow, out: TextIO | None = None) -> None:
    """The readable summary of one run."""
    stream = out or sys.stdout
    view = run_view(spool, run)

    def line(label: str, text: str) -> None:
        print(f"{label:<11} {one_line(str(text))}", file=stream)

    line("run", f"{run.local_id}" + (f"  ({run.name})" if run.name else ""))
    identity = run.identity
    about = [run.kind]
    if identity.model:
        about.append(f"model {identity.model}")
    if identity.environments:
        about.append("environments " + ", ".join(identity.environments))
    if identity.framework:
        about.append(f"framework {identity.framework}")
    line("what", " · ".join(about))
    where = {
        "stored": "kept in the local store (not pushed)",
        "recording": "still recording",
        "delivering": "being delivered",
        "delivered": "delivered and closed on the platform",
        "stopped": "delivery stopped (see error)",
    }[view["state"]]
    line("status", f"{view['status']}, {where}")
    counts = (
        f"{run.episodes} stored · {view['pending']} pending · {view['not_pushed']} not pushed · "
        f"{view['failed']} failed · {run.uncertain} uncertain · {run.corrupt} corrupt · "
        f"{run.duplicates} duplicates"
    )
    line("episodes", counts)
    summary = view["summary"]
    if run.episodes:
        line("error rate", f"{100 * float(summary.get('avg_error', 0.0)):.1f} %")
    if "avg_reward" in summary:
        line("reward", f"{summary['avg_reward']:.4f} (mean)")
    metrics = summary.get("avg_metrics") or {}
    if metrics:
        line("metrics", "")
        width = max(len(name) for name in metrics)
        for name, value in sorted(metrics.items()):
            print(f"  {name:<{width}}  {value:>10.4f}", file=stream)
    rewards = episode_rewards(spool, run)
    if len(rewards) > 1:
        line("rewards", f"histogram of {len(rewards)} episode(s)")
        for text in histogram(rewards):
            print(text, file=stream)
    if run.platform_id:
        line("platform", run.platform_id + (f"  {run.url}" if run.url else ""))
    if run.end_error:
        line("ended with", run.end_error)
    if run.last_error:
        line("error", run.last_error)
    if view["next_step"]:
        line("next", view["next_step"])
    elif view["state"] == "stored" and run.episodes:
        line("next", f"prime-runs-otel push {run.local_id[:12]}  (once you have a key)")
    line("created", view["created_at"])
    line("spool", f"{spool.path} ({human_bytes(spool.size_bytes())})")


def _follow_line(view: dict[str, Any], rate: float) -> str:
    summary = view["summary"]
    reward = summary.get("avg_reward")
    parts = [
        f"{view['status']}/{view['state']}",
        f"{view['episodes']} episodes",
        f"{rate:.1f}/s",
        f"reward {reward:.4f}" if isinstance(reward, (int, float)) else "reward -",
        f"{view['pending']} pending",
        f"{view['failed']} failed",
    ]
    if view["last_error"]:
        parts.append(f"error: {view['last_error'][:80]}")
    return " · ".join(parts)


def follow(spool: Spool, local_id: str, *, interval: float, as_json: bool) -> int:
    """Redraw the run's progress until it is closed or stopped (or Ctrl-C):
    episodes, their rate, the reward so far, what is pending, errors."""
    tty = sys.stdout.isatty() and not as_json
    previous: tuple[float, int] | None = None
    while True:
        run = spool.run(local_id)
        if run is None:
            raise UsageError(f"run {local_id} was removed from {spool.path}")
        view = run_view(spool, run)
        now = time.monotonic()
        rate = 0.0
        if previous is not None and now > previous[0]:
            rate = (run.episodes - previous[1]) / (now - previous[0])
        previous = (now, run.episodes)
        if as_json:
            print(json.dumps({**view, "rate": round(rate, 3)}), flush=True)
        elif tty:
            sys.stdout.write("\r\033[K" + _follow_line(view, rate))
            sys.stdout.flush()
        else:
            print(_follow_line(view, rate), flush=True)
        if stdout_gone():
            return EXIT_OK
        if run.settled or run.stopped or (run.mode == "local" and run.closed):
            if tty:
                print()
            return EXIT_INCOMPLETE if run.stopped else EXIT_OK
        time.sleep(interval)


# -- export -------------------------------------------------------------------------


def cmd_export(args: argparse.Namespace) -> int:
    """What the platform would receive, computed from the spool."""
    _, spool = open_spool(args.spool_dir)
    run = find(spool, args.run)
    if args.output:
        with open(args.output, "w", encoding="utf-8") as out:
            code = _export(spool, run, args.what, out)
        print(f"wrote {args.what} of run {run.local_id} to {args.output}", file=sys.stderr)
        return code
    return _export(spool, run, args.what, sys.stdout)


def _export(spool: Spool, run: RunRow, what: str, out: Any) -> int:
    if what == "summary":
        out.write(json.dumps(run_summary(run), indent=2, sort_keys=True) + "\n")
        return EXIT_OK
    if what == "metrics":
        for metrics in spool.metrics_rows(run.local_id):
            out.write(metrics.row.strip() + "\n")
            if stdout_gone():
                break
        return EXIT_OK
    progress = Progress(f"exporting {what}", run.episodes, sys.stderr)
    platform_id = run.platform_id or run.local_id
    for episode in spool.iter_episodes(run.local_id):
        record = fast_loads(episode.record)
        if what == "episodes":
            out.write(traces_line(record, platform_id, run.kind).decode())
        else:
            for row in episode_sample_rows(record, episode.rollout_number or 1):
                out.write(json.dumps(row, ensure_ascii=False, allow_nan=False) + "\n")
        if stdout_gone():
            break
        progress.advance()
    if sys.stderr.isatty():
        progress.close()
    missing = run.episodes - progress.done
    if missing > 0 and not stdout_gone():
        print(
            f"note: {missing} episode(s) were delivered already and their bodies are no longer "
            "kept in the spool (a run pushed with --drop-local, or delivered online)",
            file=sys.stderr,
        )
    return EXIT_OK


# -- push ---------------------------------------------------------------------------


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
        waiting = [row for row in spool.runs() if _pushable(row)]
        raise UsageError(
            "say which runs to push: `prime-runs-otel push RUN...`, or `push --all` for the "
            f"{len(waiting)} run(s) not yet on the platform (`push --all --dry-run` lists them)"
        )
    return [row for row in spool.runs() if _pushable(row)]


def _pushable(row: RunRow) -> bool:
    return row.mode == "local" or not row.closed


def cmd_push(args: argparse.Namespace) -> int:
    _, spool = open_spool(args.spool_dir)
    targets = _push_targets(args, spool)
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
        raise UsageError("push needs an API key: set PRIME_API_KEY or run `prime login` first")
    if not targets:
        _report([], skipped, spool, as_json=args.json, note="nothing to push")
        return EXIT_OK
    for run in ready:
        if amend:
            identity = dataclasses.replace(
                run.identity,
                environments=tuple(args.environment or run.identity.environments),
                model=args.model or run.identity.model,
            )
            spool.update_run(run.local_id, identity=identity.to_json())
        if run.mode != "online":
            spool.set_mode(run.local_id, "online")
            spool.keep_records(run.local_id, not args.drop_local)
        elif args.drop_local:
            spool.keep_records(run.local_id, False)
        spool.reopen_failed(run.local_id)
        # What went wrong last time is history once the run is tried again.
        spool.update_run(run.local_id, last_error=None)
    ids = [run.local_id for run in ready]
    _deliver(spool, settings, ids, args.timeout)
    rows = [row for row in (spool.run(key) for key in ids) if row is not None]
    _report(rows, skipped, spool, as_json=args.json)
    incomplete = bool(skipped) or any(
        spool.pending_count(row.local_id) or row.failed or not row.closed for row in rows
    )
    return EXIT_INCOMPLETE if incomplete else EXIT_OK


def _deliver(spool: Spool, settings: Settings, ids: list[str], timeout: float) -> None:
    if not ids:
        return
    total = sum(spool.pending_count(key) for key in ids)
    uploader = Uploader(spool, settings.with_mode("online"))
    progress = Progress("pushing episodes", total)
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            uploader.deliver_once(only=ids)
            left = sum(spool.pending_count(key) for key in ids)
            progress.advance(max(0, total - left - progress.done))
            if all(_push_done(spool, spool.run(key)) for key in ids):
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
    return run.end_status is None and spool.pending_count(run.local_id) == 0


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


# -- rm and prune -------------------------------------------------------------------


def _live(run: RunRow) -> bool:
    """Still being recorded or delivered: removing it would lose work in flight."""
    if run.mode == "local":
        return not run.closed
    return not (run.settled or run.stopped)


def cmd_rm(args: argparse.Namespace) -> int:
    _, spool = open_spool(args.spool_dir)
    runs = [find(spool, key) for key in args.runs]
    live = [run for run in runs if _live(run)]
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
    if args.json:
        print_json({"removed": removed})
    else:
        for item in removed:
            print(f"removed {item['id']} ({item['name'] or '-'}, {item['episodes']} episode(s))")
        print("only the local copy is gone; a run already on the platform stays there")
    return EXIT_OK


def cmd_prune(args: argparse.Namespace) -> int:
    if args.older_than is None and not args.status:
        raise UsageError(
            "say what to prune: --older-than AGE (e.g. 30d) and/or --status STATUS "
            "(e.g. delivered, stored, failed); --dry-run lists it first"
        )
    _, spool = open_spool(args.spool_dir)
    rows = [
        row
        for row in select_runs(spool, statuses=args.status or (), older_than=args.older_than)
        if not _live(row)
    ]
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


# -- wiring -------------------------------------------------------------------------


def spool_option(sub: argparse.ArgumentParser) -> None:
    sub.add_argument(
        "--spool-dir",
        metavar="DIR",
        help="spool folder (default: $PRIME_RUNS_OTEL_DIR or ~/.prime/runs-otel)",
    )


def json_option(sub: argparse.ArgumentParser, what: str = "the result") -> None:
    sub.add_argument("--json", action="store_true", help=f"print {what} as JSON (see docs/cli.md)")


def add_store_commands(commands: Any, common: argparse.ArgumentParser) -> None:
    runs = commands.add_parser(
        "runs", parents=[common], help="list the runs in the spool, newest first"
    )
    runs.add_argument(
        "--status",
        action="append",
        choices=STATUSES + STATES,
        help="only runs with this status or state (repeatable)",
    )
    runs.add_argument("--kind", choices=["eval", "train"], help="only eval or training runs")
    runs.add_argument("--name", help="only runs whose name contains this text")
    runs.add_argument(
        "--since",
        type=parse_since,
        metavar="AGE|DATE",
        help="only runs created since (7d, 2026-01-31)",
    )
    runs.add_argument("--limit", type=positive_int, metavar="N", help="at most N runs")
    json_option(runs, "the runs")
    spool_option(runs)
    runs.set_defaults(func=cmd_runs)

    show = commands.add_parser(
        "show", parents=[common], help="one run: summary, metrics, rewards, status, errors"
    )
    show.add_argument("run", help="run id, platform id, a unique prefix, or the run's name")
    show.add_argument(
        "--follow", "-f", action="store_true", help="keep updating until the run is closed"
    )
    show.add_argument(
        "--interval",
        type=non_negative_float,
        default=1.0,
        metavar="SECONDS",
        help="with --follow: seconds between updates (default 1)",
    )
    json_option(show, "the run (with --follow: one JSON object per line)")
    spool_option(show)
    show.set_defaults(func=cmd_show)

    export = commands.add_parser(
        "export", parents=[common], help="what the platform would receive, as JSONL/JSON"
    )
    export.add_argument("run", help="run id, platform id, a unique prefix, or the run's name")
    export.add_argument(
        "--what",
        choices=["samples", "episodes", "summary", "metrics"],
        default="samples",
        help="legacy sample rows, Prime Traces episode lines, the run summary, or training "
        "step metrics (default: samples)",
    )
    export.add_argument("-o", "--output", metavar="FILE", help="write to FILE instead of stdout")
    export.add_argument(
        "--json", action="store_true", help="accepted for symmetry: the output is JSON already"
    )
    spool_option(export)
    export.set_defaults(func=cmd_export)

    push = commands.add_parser(
        "push", parents=[common], help="deliver chosen local or pending runs to the platform"
    )
    push.add_argument("runs", nargs="*", metavar="RUN", help="the runs to push")
    push.add_argument("--all", action="store_true", help="every run not yet on the platform")
    push.add_argument(
        "--dry-run", action="store_true", help="list what would be pushed, and send nothing"
    )
    push.add_argument(
        "--drop-local",
        action="store_true",
        help="delete the local record bodies once delivered (default: keep them for export)",
    )
    push.add_argument(
        "--environment",
        action="append",
        metavar="NAME",
        help="amend the run's environments before pushing (repeatable; one RUN only)",
    )
    push.add_argument("--model", help="amend the run's model before pushing (one RUN only)")
    push.add_argument(
        "--timeout",
        type=non_negative_float,
        default=600.0,
        metavar="SECONDS",
        help="how long to keep delivering (default 600)",
    )
    json_option(push, "what was pushed")
    spool_option(push)
    push.set_defaults(func=cmd_push)

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
    prune.add_argument("--dry-run", action="store_true", help="list what would go; remove nothing")
    json_option(prune, "what was removed")
    spool_option(prune)
    prune.set_defaults(func=cmd_prune)
