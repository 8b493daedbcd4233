"""``prime-runs-otel show``: one run for a person to read (its summary,
metrics, a reward histogram, errors by type, token and duration figures,
where it is and what to do next), or followed live until it is closed.

Everything comes from what the spool keeps up to date as episodes are
stored, so it answers as fast for a million episodes as for ten; a run
stored by an earlier release is read into those views once, first."""

from __future__ import annotations

import argparse
import contextlib
import sqlite3
import sys
import time
from collections.abc import Callable
from typing import Any, TextIO

from ..._text import one_line
from ...deliver.crashed import end_runs_of_dead_producers
from ...deliver.spool import ErrorGroup, RunRow, Spool, SpoolError
from ...view.distributions import Distribution, distribution
from ...view.older import read_older_episodes
from ...view.run_data import run_distributions
from ...view.runs import run_about, run_view
from ..arguments import json_option, non_negative_float, spool_option
from ..exits import EXIT_INCOMPLETE, EXIT_OK, UsageError
from ..output import human_bytes, print_json, stdout_gone
from .lookup import find, open_store
from .training import training_lines, training_view, with_training

#: How ``print_show`` prints one labelled line.
_Line = Callable[[str, str], None]


def cmd_show(args: argparse.Namespace) -> int:
    spool = open_store(args.spool_dir)
    run = find(spool, args.run)
    if args.follow:
        return follow(spool, run.local_id, interval=args.interval, as_json=args.json)
    if args.json:
        print_json(with_training(spool, run, run_view(spool, run)))
    else:
        if not spool.read_only:  # what an earlier release stored is shown as it is
            read_older_episodes(spool, run.local_id, _reading_progress())
        print_show(spool, run)
    return EXIT_OK


def _reading_progress() -> Any:
    def report(done: int, total: int) -> None:
        if sys.stderr.isatty():
            end = "\n" if done >= total else ""
            print(
                f"\rreading {done}/{total} episodes stored by an earlier release",
                end=end,
                file=sys.stderr,
                flush=True,
            )

    return report


def histogram(shape: Distribution, width: int = 40) -> list[str]:
    """A distribution as text lines: ``low - high  ####  count``."""
    top = max(item.count for item in shape.bins)
    lines = []
    for item in shape.bins:
        bar = "#" * (round(width * item.count / top) if item.count else 0)
        if item.low == item.high:
            lines.append(f"  {item.low:>8.3f}            {bar:<{width}} {item.count}")
        else:
            lines.append(f"  {item.low:>8.3f} - {item.high:<8.3f} {bar:<{width}} {item.count}")
    return lines


def print_show(spool: Spool, run: RunRow, out: TextIO | None = None) -> None:
    """The readable summary of one run."""
    stream = out or sys.stdout
    view = run_view(spool, run)

    def line(label: str, text: str) -> None:
        print(f"{label:<11} {one_line(str(text))}", file=stream)

    _print_state(run, view, line)
    training = training_view(spool, run)
    if training is not None:
        for label, text in training_lines(training):
            line(label, text)
    _print_outcomes(spool, run, view["summary"], line, stream)
    _print_errors(spool.reading.error_groups(run.local_id), line, stream)
    _print_next(run, view, line)
    line("spool", f"{spool.path} ({human_bytes(spool.housekeeping.size_bytes())})")


def _print_state(run: RunRow, view: dict[str, Any], line: _Line) -> None:
    """Which run, where it stands, and what became of its episodes."""
    line("run", f"{run.local_id}" + (f"  ({run.name})" if run.name else ""))
    line("what", run_about(run))
    where = {
        "stored": "kept in the local store (not pushed)",
        "recording": "still recording",
        "delivered": "delivered and closed on the platform",
        # Closed, with late episodes still on their way to the closed run.
        "delivering": "closed, late episodes being delivered" if run.closed else "being delivered",
        "stopped": "delivery stopped (see error)",
        "paused": "delivery paused: no process delivers it now (see next)",
    }[view["state"]]
    line("status", f"{view['status']}, {where}")
    counts = (
        f"{run.episodes} stored · {view['pending']} pending · {view['not_pushed']} not pushed · "
        f"{view['failed']} failed · {run.uncertain} uncertain · {run.corrupt} corrupt · "
        f"{run.duplicates} duplicates"
    )
    line("episodes", counts)
    if run.late:
        line(
            "late",
            f"{run.late} arrived after the run was closed · {run.late_refused} of them refused "
            "by the platform (late and undelivered)",
        )


def _print_outcomes(
    spool: Spool, run: RunRow, summary: dict[str, Any], line: _Line, stream: TextIO
) -> None:
    """The run's error rate, rewards and metrics, and how its episodes spread."""
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
    shapes = run_distributions(spool, run.local_id)
    rewards = distribution(spool.reading.histogram(run.local_id, "reward"), bins=10)
    if rewards is not None and rewards.count > 1:
        line("rewards", f"histogram of {rewards.count} episode(s)")
        for text in histogram(rewards):
            print(text, file=stream)
    for name, label, unit in (("tokens", "tokens", ""), ("duration", "duration", " s")):
        shape = shapes[name]
        if shape is not None:
            line(
                label,
                f"p50 {shape.p50:g}{unit} · p90 {shape.p90:g}{unit} · "
                f"p99 {shape.p99:g}{unit} · max {shape.high:g}{unit}",
            )


def _print_errors(groups: list[ErrorGroup], line: _Line, stream: TextIO) -> None:
    """The run's failures by error type, an example episode each."""
    if not groups:
        return
    line("errors", "by type (an example episode each)")
    width = min(40, max(len(group.error_type) for group in groups))
    for group in groups[:10]:
        print(
            one_line(
                f"  {group.error_type[:40]:<{width}}  {group.count:>7}  e.g. {group.example_id}"
            ),
            file=stream,
        )
    if len(groups) > 10:
        print(f"  ... and {len(groups) - 10} more type(s): prime-runs-otel ui", file=stream)


def _print_next(run: RunRow, view: dict[str, Any], line: _Line) -> None:
    """Where the run is on the platform, how it ended, and what to do next."""
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
    episodes, their rate, the reward so far, what is pending, errors. A run
    nothing delivers any more (``paused``) ends the follow with the step
    that resumes it, rather than a rate of 0.0/s forever; one whose
    producer died is ended as crashed, and followed to its close."""
    tty = sys.stdout.isatty() and not as_json
    previous: tuple[float, int] | None = None
    while True:
        with contextlib.suppress(SpoolError, sqlite3.Error):  # a spool it cannot write
            end_runs_of_dead_producers(spool)  # its producer may die while followed
        run = spool.reading.run(local_id)
        if run is None:
            raise UsageError(f"run {local_id} was removed from {spool.path}")
        view = run_view(spool, run)
        now = time.monotonic()
        rate = 0.0
        if previous is not None and now > previous[0]:
            rate = (run.episodes - previous[1]) / (now - previous[0])
        previous = (now, run.episodes)
        if as_json:
            print_json({**view, "rate": round(rate, 3)}, indent=None, flush=True)
        elif tty:
            sys.stdout.write("\r\033[K" + _follow_line(view, rate))
            sys.stdout.flush()
        else:
            print(_follow_line(view, rate), flush=True)
        if stdout_gone():
            return EXIT_OK
        if view["state"] == "paused":
            if tty:
                print()
            print(f"not delivering: {view['next_step']}", file=sys.stderr)
            return EXIT_INCOMPLETE
        done = run.settled and not view["pending"]
        if done or run.stopped or (run.mode == "local" and run.closed):
            if tty:
                print()
            return EXIT_INCOMPLETE if run.stopped else EXIT_OK
        time.sleep(interval)


def add_show_command(commands: Any, common: argparse.ArgumentParser) -> None:
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
