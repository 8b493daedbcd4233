"""``replay`` (a verifiers eval's ``traces.jsonl`` as a run) and ``demo`` (a
synthetic eval), both through the real pipeline.

A replay is idempotent: its run key is derived from the file's bytes (or
given with ``--run-key``), and episodes are stored once per run by their id,
so replaying the same file again adds nothing to the run it made the first
time. Ctrl-C finishes the run as cancelled, never as crashed.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import secrets
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

from ..config import Settings, resolve_settings
from ..deliver.spool import Spool
from ..errors import PrimeRunsOtelError
from ..produce.traces_jsonl import (
    NoEpisodesError,
    bad_lines_report,
    count_lines,
    environments_of,
    read_records,
    traces_file,
)
from ..run import INTERRUPTED, INTERRUPTED_PLATFORM_WAIT, Run, RunResult, start_run
from ..sampling import without_sdk
from ..view.runs import run_view
from .arguments import (
    add_options,
    json_option,
    non_negative_float,
    option,
    positive_int,
    spool_option,
)
from .exits import EXIT_INCOMPLETE, EXIT_INTERRUPTED, EXIT_OK
from .extras import require_testing
from .otlp_replay import add_otlp_replay_option, replay_command_over_otlp
from .output import Progress, color, command_name, error, print_json, reported_here
from .recorded_eval import DEFAULT_FRAMEWORK, recorded_eval, replay_options, replay_run_key
from .store.show import print_show
from .store.training import with_training

DEFAULT_REPLAY_TIMEOUT = 300.0
#: What a run in the disabled mode leaves: nothing, and how to change that.
DISABLED = (
    "telemetry is disabled (OTEL_SDK_DISABLED=true or PRIME_RUNS_MODE=disabled), so nothing "
    "is sent or kept; unset it to record runs"
)


def cmd_replay(args: argparse.Namespace) -> int:
    if args.otlp_endpoint or args.otlp:
        return replay_command_over_otlp(args)
    given = Path(args.path)
    path = traces_file(given)
    recorded = recorded_eval(path.parent)
    total = count_lines(path)
    errors: list[str] = []
    records = read_records(path, errors)
    first = next(records, None)
    if first is None:
        raise NoEpisodesError(path, total, errors)
    environments = args.environment or recorded.get("environments") or environments_of(first)
    run_key = args.run_key or replay_run_key(
        path, replay_options(args.name, args.model, args.environment, args.framework)
    )
    _reopen_unfinished(args.spool_dir, run_key)
    run = start_run(
        name=args.name or recorded.get("name") or path.resolve().parent.name,
        model=args.model or recorded.get("model"),
        environments=environments,
        framework=args.framework,
        config_file=args.config or recorded.get("config_file"),
        run_id=run_key,
        spool_dir=args.spool_dir,
    )
    reported_here(run.id)  # its outcome is printed below, once
    progress = Progress("replaying episodes", total)
    try:
        if first is not None:
            progress.advance(_record(run, first, errors))
        for record in records:
            progress.advance(_record(run, record, errors))
    except KeyboardInterrupt:
        return _interrupted(run, progress, as_json=args.json)
    progress.close()
    for problem in bad_lines_report(errors):
        error(problem)
    timeout = DEFAULT_REPLAY_TIMEOUT if args.timeout is None else args.timeout
    result = run.finish("completed", timeout=timeout)
    print_result(result, bad_lines=len(errors), as_json=args.json)
    delivered = result.closed and not (
        result.pending or result.failed or result.uncertain or result.unencodable
    )
    return EXIT_OK if delivered and not errors else EXIT_INCOMPLETE


def _reopen_unfinished(spool_dir: str | None, run_key: str) -> None:
    """A replay into a run an earlier replay left unfinished (Ctrl-C, or its
    process killed) completes it: the run is reopened first, so the episodes
    it lacks are stored as any others and it closes as completed. A run
    closed on the platform already cannot be reopened: it stays as it ended,
    the episodes it lacks are added to it, and a note says why and what to do."""
    settings = resolve_settings(spool_dir=spool_dir, mode="local")
    if not settings.spool_path.exists():
        return
    spool = Spool(settings.spool_path, max_bytes=settings.spool_max_bytes)
    try:
        row = spool.reading.run(run_key)
        unfinished = row is not None and (
            row.end_status == "crashed"
            or (row.end_status == "cancelled" and row.end_error == INTERRUPTED)
        )
        if row is None or not unfinished:
            return
        if spool.intake.reopen_run(run_key):
            note = (
                f"run {run_key[:12]} was {row.end_status} by an interrupted replay with "
                f"{row.episodes} episode(s); reopened: this replay adds the ones it lacks and "
                "closes it as completed"
            )
        else:
            note = (
                f"run {run_key[:12]} was closed on the platform as {row.end_status} by an "
                "interrupted replay, and a closed platform run is not reopened: the episodes "
                f"it lacks are added to it, and it stays {row.end_status}. For a completed run, "
                "replay into a new one: --run-key NEW-KEY"
            )
        print(f"note: {note}", file=sys.stderr)
    finally:
        spool.close()


def _interrupted(run: Run, progress: Progress, *, as_json: bool) -> int:
    """Ctrl-C while recording: the run ends as cancelled with what it has."""
    try:
        progress.close()
        print(
            "interrupted: finishing the run as cancelled (Ctrl-C again to stop waiting)",
            file=sys.stderr,
        )
        try:
            result = run.finish("cancelled", INTERRUPTED)
        except KeyboardInterrupt:  # raised once the run's end is in the spool
            return _stopped_waiting(run, run.settings.spool_path)
    except KeyboardInterrupt:
        _end_if_left(run)
        raise
    _nothing_left_to_stop()
    print_result(result, as_json=as_json)
    return EXIT_INTERRUPTED


def _end_if_left(run: Run | None) -> None:
    """A second Ctrl-C that landed before the run began to finish (right
    after the first) still leaves the run ended: cancelled, with what it has,
    without a long wait for the platform."""
    if run is not None and not run.finishing:
        with contextlib.suppress(KeyboardInterrupt):
            run.finish("cancelled", INTERRUPTED, timeout=INTERRUPTED_PLATFORM_WAIT)


def _nothing_left_to_stop() -> None:
    """The run is ended and in the spool: a Ctrl-C from now on has nothing
    left to stop, and would only kill the process half way out (exit -2
    instead of the code it is returning)."""
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, signal.SIG_IGN)


def _record(run: Any, record: dict[str, Any], errors: list[str]) -> int:
    try:
        run.record_episode(record)
    except PrimeRunsOtelError as exc:
        errors.append(f"episode {record.get('id')!r}: {exc}")
    return 1


def result_view(result: RunResult) -> dict[str, Any]:
    """The result in the vocabulary of ``show --json`` (from the spool when
    the run is there, so both print the same thing)."""
    if result.spool_path:
        spool = Spool(Path(result.spool_path), max_bytes=resolve_settings().spool_max_bytes)
        row = spool.reading.run(result.local_id)
        if row is not None:
            return with_training(spool, row, run_view(spool, row))
    return {
        "id": result.local_id,
        "mode": result.mode,
        "status": result.status,
        "closed": result.closed,
        "episodes": result.episodes,
        "pending": result.pending,
        "failed": result.failed,
        "uncertain": result.uncertain,
        "corrupt": result.corrupt,
        "unencodable": result.unencodable,
    }


def print_result(
    result: RunResult, *, bad_lines: int = 0, as_json: bool = False, with_next_step: bool = True
) -> None:
    if as_json:
        print_json({**result_view(result), "bad_lines": bad_lines})
        return
    status = color(result.status, "32" if result.status == "completed" else "33")
    print(f"run:       {result.local_id} ({status}, {'closed' if result.closed else 'OPEN'})")
    if result.mode == "disabled":
        print(f"episodes:  {result.episodes} recorded, none sent or kept: {DISABLED}")
        return
    if result.platform_id:
        print(f"platform:  {result.platform_id}")
    if result.url:
        print(f"url:       {result.url}")
    print(
        f"episodes:  {result.episodes} stored, {result.pending} pending, "
        f"{result.failed} failed, {result.uncertain} uncertain, {result.corrupt} corrupt"
        + (f", {result.unencodable} unencodable" if result.unencodable else "")
        + (f", {bad_lines} bad line(s)" if bad_lines else "")
    )
    print(f"spool:     {result.spool_path}")
    if not with_next_step:
        return
    if result.stopped:
        print(f"stopped:   {result.error}")
    if result.next_step:
        print(f"next:      {result.next_step}")


# -- demo -------------------------------------------------------------------------


def cmd_demo(args: argparse.Namespace) -> int:
    from ..produce.synthetic import synthetic_episodes

    fake = None
    run: Run | None = None
    env_backup = dict(os.environ)
    try:
        if args.fake_platform:
            require_testing("demo --fake-platform")
            from ..testing import FakePlatform

            fake = FakePlatform().start()
            os.environ.update(fake.client_env())
            os.environ["PRIME_RUNS_MODE"] = "online"
            print(f"fake platform listening on {fake.url}")
        settings = without_sdk(resolve_settings(spool_dir=args.spool_dir))
        run = _start_demo_run(settings, args.episodes)
        reported_here(run.id)  # its outcome is printed below, once
        progress = Progress("recording episodes", args.episodes)
        try:
            for record in synthetic_episodes(args.episodes, seed=args.seed, ending_at="now"):
                run.record_episode(record)
                progress.advance()
            # Every episode is in the spool before Ctrl-C is called safe.
            run.wait_delivered(0)
        except KeyboardInterrupt:
            return _interrupted(run, progress, as_json=False)
        progress.close()
        try:
            print(finishing_line(settings.mode, settings.spool_dir), flush=True)
            result = run.finish()
        except KeyboardInterrupt:
            return _stopped_waiting(run, settings.spool_path)
        _nothing_left_to_stop()
        print_result(result, with_next_step=False)  # the summary below says it once
        if result.mode == "disabled":
            return EXIT_OK  # nothing to look at: nothing was kept
        print()
        spool = Spool(settings.spool_path, max_bytes=settings.spool_max_bytes)
        row = spool.reading.run(result.local_id)
        if row is not None:
            print_show(spool, row)
        if fake is not None:
            _print_fake_platform(fake, result.platform_id)
        _print_where_to_look(result.local_id, settings.mode)
        ok = result.closed and not (result.pending or result.failed)
        return EXIT_OK if ok else EXIT_INCOMPLETE
    except KeyboardInterrupt:
        _end_if_left(run)  # before the fake platform goes
        raise
    finally:
        os.environ.clear()
        os.environ.update(env_backup)
        if fake is not None:
            fake.stop()


def _start_demo_run(settings: Settings, episodes: int) -> Run:
    """The demo's run, once it has said where its episodes go."""
    where = {"online": "the platform", "local": "the local store"}.get(
        settings.mode, "nowhere (telemetry is disabled)"
    )
    print(f"demo: {episodes} episodes through OpenTelemetry into {where}")
    return start_run(
        name=demo_name(),
        model="demo/solver-8b",
        environments=["gsm8k-demo"],
        framework="prime-runs-otel-demo",
        config={"rollouts_per_example": 4, "temperature": 0.7, "judge": "demo/judge-1b"},
        tags=["demo"],
        settings=settings,
    )


def _print_where_to_look(local_id: str, mode: str) -> None:
    """The commands that show the demo's run, and in local mode what to do with it."""
    short = local_id[:12]
    cli = command_name()
    print()
    print("where to look:")
    print(f"  {cli} ui                   # every run in the browser (read-only)")
    print(f"  {cli} runs                 # every run in the spool")
    print(f"  {cli} show {short}    # this run")
    print(f"  {cli} export {short} --what samples | head -c 600")
    if mode == "local":
        print(f"  {cli} push {short}    # send it once you have a key")
        print(f"  {cli} rm {short}      # or drop it from the local store")


def demo_name() -> str:
    """``demo-<time>-<4 hex>``: two demos started in the same second (in two
    terminals, or by a script) are still two names."""
    return f"demo-{int(time.time())}-{secrets.token_hex(2)}"


def finishing_line(mode: str, spool_dir: Path) -> str:
    """What ``finish()`` is about to wait for, and, online, that Ctrl-C is
    safe: the wait can last minutes when the platform is away."""
    if mode == "online":
        return (
            "finishing the run: delivering it to the platform, then closing it. Ctrl-C is "
            "safe: what is not delivered stays in the spool, and `prime-runs-otel push` "
            "sends it later"
        )
    if mode == "disabled":
        return "finishing the run: nothing to deliver or keep (telemetry is disabled)"
    return f"finishing the run: kept locally (no API key), in {spool_dir}"


def _stopped_waiting(run: Run, spool_path: Path) -> int:
    """Ctrl-C while the run was being delivered: nothing is lost, say where it is.

    A Ctrl-C that lands before ``finish()`` began still ends the run (its
    episodes were all recorded), without waiting for the platform."""
    with contextlib.suppress(KeyboardInterrupt):
        if not run.finishing:
            run.finish(timeout=0)
    _nothing_left_to_stop()
    short = run.id[:12]
    result = run.result
    if result is not None and result.closed and not result.pending:
        print(
            f"\nstopped: run {short} {result.status} and closed, {result.episodes} episode(s) "
            f"in {spool_path}",
            file=sys.stderr,
        )
        return EXIT_INTERRUPTED
    print(
        f"\nstopped waiting: run {short} and what is not delivered yet stay in "
        f"{spool_path}; `prime-runs-otel push {short}` delivers it later",
        file=sys.stderr,
    )
    return EXIT_INTERRUPTED


def _print_fake_platform(fake: Any, platform_id: str | None) -> None:
    if platform_id is None:
        print("the fake platform has no run")
        return
    platform_run = fake.run(platform_id)
    print("what the (fake) platform received:")
    print(f"  run {platform_run.id}: {platform_run.name!r}, status {platform_run.status}")
    print(f"  episodes in Prime Traces: {len(fake.episodes(platform_id))}")
    print(f"  legacy sample rows: {len(fake.samples(platform_id))}")
    print(f"  metrics: {json.dumps(platform_run.metrics, sort_keys=True)[:400]}")


# -- wiring -----------------------------------------------------------------------


#: ``replay``'s own options, in the order its help lists them (then
#: ``--json``, ``--spool-dir`` and the OTLP ones, shared with other commands).
REPLAY_OPTIONS = (
    option("path", help="traces.jsonl, or the run folder that holds it"),
    option(
        "--name", help="run name (default: the eval's recorded run name, else the folder's name)"
    ),
    option(
        "--model", help="model the episodes were sampled from (default: what the eval recorded)"
    ),
    option(
        "--environment",
        action="append",
        metavar="NAME",
        help="environment (repeatable; default: what the eval recorded, else the records' env)",
    ),
    option(
        "--framework",
        default=DEFAULT_FRAMEWORK,
        help="framework that produced the run (default verifiers)",
    ),
    option(
        "--config",
        metavar="FILE",
        help="the config file the run was launched with (default: the one the eval saved)",
    ),
    option(
        "--run-key",
        metavar="KEY",
        help="the run to replay into (default: derived from the file's bytes and the --name, "
        "--model, --environment and --framework given, so replaying the same file with the "
        "same options again stores nothing twice); a new key makes a new run",
    ),
    option(
        "--timeout",
        type=non_negative_float,
        default=None,
        metavar="SECONDS",
        help="seconds to wait for delivery (default 300); with OTLP, for each request (default 30)",
    ),
)
#: ``demo``'s own options (then ``--spool-dir``).
DEMO_OPTIONS = (
    option(
        "--episodes",
        type=positive_int,
        default=300,
        help="how many episodes to record, 1 or more (default 300)",
    ),
    option("--seed", type=int, default=0, help="seed of the synthetic episodes"),
    option("--fake-platform", action="store_true", help="deliver to a fake platform on loopback"),
)


def add_replay_commands(commands: Any, common: argparse.ArgumentParser) -> None:
    replay = commands.add_parser(
        "replay", parents=[common], help="replay a verifiers traces.jsonl as a run"
    )
    add_options(replay, REPLAY_OPTIONS)
    json_option(replay, "the run, as `show --json` does")
    spool_option(replay)
    add_otlp_replay_option(replay)
    replay.set_defaults(func=cmd_replay)

    demo = commands.add_parser(
        "demo", parents=[common], help="a synthetic eval run through the real pipeline"
    )
    add_options(demo, DEMO_OPTIONS)
    spool_option(demo)
    demo.set_defaults(func=cmd_demo)
