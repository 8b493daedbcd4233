"""``prime-runs-otel``: replay, demo, the local store, and the fake platform.

Exit codes: 0 success; 1 the work ran but not everything was delivered (or a
run is not closed yet); 2 bad usage or configuration (the message says what
to change).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TextIO

from .. import __version__
from ..config import Settings, resolve_settings
from ..deliver.spool import RunRow, Spool
from ..deliver.uploader import Uploader, run_summary
from ..errors import PrimeRunsOtelError
from ..produce.traces_jsonl import count_lines, environments_of, read_records, traces_file
from ..read.projection import episode_sample_rows, traces_line
from ..run import RunResult, start_run
from .serve import add_otlp_replay_option, add_serve_command

EXIT_OK, EXIT_INCOMPLETE, EXIT_USAGE = 0, 1, 2


class Progress:
    """A progress line on stderr: redrawn in place on a terminal, a line per
    tenth of the work otherwise (so CI logs stay readable)."""

    def __init__(self, label: str, total: int | None, stream: TextIO | None = None) -> None:
        self.label = label
        self.total = total
        self.done = 0
        self._stream = stream or sys.stderr
        self._tty = self._stream.isatty()
        self._last_tenth = -1
        self._last_draw = 0.0

    def advance(self, count: int = 1) -> None:
        self.done += count
        now = time.monotonic()
        if self._tty:
            if now - self._last_draw >= 0.1 or self.done == self.total:
                self._last_draw = now
                self._stream.write(f"\r{self._text()}")
                self._stream.flush()
        elif self.total:
            tenth = self.done * 10 // self.total
            if tenth != self._last_tenth:
                self._last_tenth = tenth
                self._stream.write(self._text() + "\n")

    def close(self) -> None:
        if self._tty:
            self._stream.write(f"\r{self._text()}\n")
            self._stream.flush()

    def _text(self) -> str:
        if self.total:
            return f"{self.label}: {self.done}/{self.total} ({100 * self.done // self.total}%)"
        return f"{self.label}: {self.done}"


def _color(text: str, code: str, stream: TextIO = sys.stdout) -> str:
    if stream.isatty() and not os.environ.get("NO_COLOR"):
        return f"\033[{code}m{text}\033[0m"
    return text


# -- replay -------------------------------------------------------------------


def cmd_replay(args: argparse.Namespace) -> int:
    if args.otlp_endpoint:
        from .serve import replay_command_over_otlp

        return replay_command_over_otlp(args)
    path = traces_file(Path(args.path))
    total = count_lines(path)
    errors: list[str] = []
    records = read_records(path, errors)
    first = next(records, None)
    environments = args.environment or environments_of(first)
    run = start_run(
        name=args.name or path.resolve().parent.name,
        model=args.model,
        environments=environments,
        framework=args.framework,
        config_file=args.config,
    )
    progress = Progress("replaying episodes", total)
    if first is not None:
        progress.advance(_record(run, first, errors))
    for record in records:
        progress.advance(_record(run, record, errors))
    progress.close()
    for error in errors:
        print(_color(f"error: {error}", "31", sys.stderr), file=sys.stderr)
    result = run.finish("completed", timeout=args.timeout)
    _print_result(result, bad_lines=len(errors), as_json=args.json)
    delivered = result.closed and not (
        result.pending or result.failed or result.uncertain or result.unencodable
    )
    return EXIT_OK if delivered and not errors else EXIT_INCOMPLETE


def _record(run: Any, record: dict[str, Any], errors: list[str]) -> int:
    try:
        run.record_episode(record)
    except PrimeRunsOtelError as exc:
        errors.append(f"episode {record.get('id')!r}: {exc}")
    return 1


def _print_result(result: RunResult, *, bad_lines: int = 0, as_json: bool = False) -> None:
    if as_json:
        data = {**result.__dict__, "bad_lines": bad_lines}
        print(json.dumps(data, indent=2))
        return
    status = _color(result.status, "32" if result.status == "completed" else "33")
    print(f"run:       {result.local_id} ({status}, {'closed' if result.closed else 'OPEN'})")
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
    if result.pending:
        print(f"next:      prime-runs-otel push {result.local_id}")


# -- demo ---------------------------------------------------------------------


def cmd_demo(args: argparse.Namespace) -> int:
    from ..produce.synthetic import synthetic_episodes

    fake = None
    env_backup = dict(os.environ)
    try:
        if args.fake_platform:
            from ..testing import FakePlatform

            fake = FakePlatform().start()
            os.environ.update(fake.client_env())
            os.environ["PRIME_RUNS_MODE"] = "online"
            print(f"fake platform listening on {fake.url}")
        settings = resolve_settings(spool_dir=args.spool_dir)
        where = {"online": "the platform", "local": "the local store"}.get(settings.mode, "nowhere")
        print(f"demo: {args.episodes} episodes through OpenTelemetry into {where}")
        run = start_run(
            name=f"demo-{int(time.time())}",
            model="demo/solver-8b",
            environments=["gsm8k-demo"],
            framework="prime-runs-otel-demo",
            config={"rollouts_per_example": 4, "temperature": 0.7, "judge": "demo/judge-1b"},
            tags=["demo"],
            settings=settings,
        )
        progress = Progress("recording episodes", args.episodes)
        for record in synthetic_episodes(args.episodes, seed=args.seed, ending_at="now"):
            run.record_episode(record)
            progress.advance()
        progress.close()
        print("finishing the run (delivering, then closing it)...")
        result = run.finish()
        _print_result(result)
        print()
        spool = Spool(settings.spool_path, max_bytes=settings.spool_max_bytes)
        row = spool.run(result.local_id)
        if row is not None:
            _print_show(spool, row, as_json=False)
        if fake is not None:
            _print_fake_platform(fake, result.platform_id)
        print()
        print("where to look:")
        print("  prime-runs-otel runs                     # every run in the spool")
        print(f"  prime-runs-otel show {result.local_id[:12]}        # this run")
        print(f"  prime-runs-otel export {result.local_id[:12]} --what samples | head -c 600")
        if settings.mode == "local":
            short = result.local_id[:12]
            print(f"  prime-runs-otel push {short}        # send it once you have a key")
        ok = result.closed and not (result.pending or result.failed)
        return EXIT_OK if ok else EXIT_INCOMPLETE
    finally:
        os.environ.clear()
        os.environ.update(env_backup)
        if fake is not None:
            fake.stop()


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


# -- the local store ------------------------------------------------------------


def _open_spool(args: argparse.Namespace) -> tuple[Settings, Spool]:
    settings = resolve_settings(spool_dir=args.spool_dir, mode="local")
    if not settings.spool_path.exists():
        raise PrimeRunsOtelError(
            f"no spool at {settings.spool_path}: nothing has been recorded there yet "
            "(set PRIME_RUNS_OTEL_DIR or --spool-dir to look elsewhere)"
        )
    return settings, Spool(settings.spool_path, max_bytes=settings.spool_max_bytes)


def _find(spool: Spool, key: str) -> RunRow:
    run = spool.find_run(key)
    if run is None:
        raise PrimeRunsOtelError(
            f"no run {key!r} in {spool.path} (or the prefix is ambiguous); "
            "`prime-runs-otel runs` lists them"
        )
    return run


def _run_status(run: RunRow) -> str:
    if run.close_state == "gave_up" or run.create_state == "failed":
        return f"{run.end_status or 'running'} (stuck)"
    if run.closed:
        return run.end_status or "closed"
    if run.end_status:
        return f"{run.end_status} (closing)"
    return "running"


def cmd_runs(args: argparse.Namespace) -> int:
    _, spool = _open_spool(args)
    rows = spool.runs()
    if args.json:
        print(json.dumps([_run_json(spool, row) for row in rows], indent=2))
        return EXIT_OK
    if not rows:
        print(f"no runs in {spool.path}")
        return EXIT_OK
    print(
        f"{'ID':<34} {'NAME':<28} {'KIND':<5} {'STATUS':<20} "
        f"{'EPISODES':>8} {'PENDING':>7}  CREATED"
    )
    for row in rows:
        created = time.strftime("%Y-%m-%d %H:%M", time.localtime(row.created_at))
        print(
            f"{row.local_id:<34} {(row.name or '-')[:28]:<28} {row.kind:<5} "
            f"{_run_status(row)[:20]:<20} {row.episodes:>8} {spool.pending_count(row.local_id):>7}"
            f"  {created}"
        )
    return EXIT_OK


def _run_json(spool: Spool, run: RunRow) -> dict[str, Any]:
    return {
        "id": run.local_id,
        "name": run.name,
        "kind": run.kind,
        "mode": run.mode,
        "status": _run_status(run),
        "end_status": run.end_status,
        "end_error": run.end_error,
        "closed": run.closed,
        "platform_id": run.platform_id,
        "url": run.url,
        "sink": run.sink,
        "episodes": run.episodes,
        # Local runs wait for nobody: their episodes are stored, to be pushed.
        "pending": spool.pending_count(run.local_id) if run.mode == "online" else 0,
        "not_pushed": spool.pending_count(run.local_id) if run.mode == "local" else 0,
        "duplicates": run.duplicates,
        "corrupt": run.corrupt,
        "rejected": run.rejected,
        "unencodable": run.unencodable,
        "uncertain": run.uncertain,
        "failed": run.failed,
        "last_error": run.last_error,
        "created_at": time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(run.created_at)),
        "summary": run_summary(run),
        "spool": str(spool.path),
    }


def cmd_show(args: argparse.Namespace) -> int:
    _, spool = _open_spool(args)
    _print_show(spool, _find(spool, args.run), as_json=args.json)
    return EXIT_OK


def _print_show(spool: Spool, run: RunRow, *, as_json: bool) -> None:
    data = _run_json(spool, run)
    if as_json:
        print(json.dumps(data, indent=2))
        return
    width = max(len(key) for key in data)
    for key, value in data.items():
        if value is None:
            continue
        text = json.dumps(value, sort_keys=True) if isinstance(value, (dict, list)) else value
        print(f"{key:<{width}}  {text}")


def cmd_export(args: argparse.Namespace) -> int:
    """What the platform would receive, computed from the spool."""
    _, spool = _open_spool(args)
    run = _find(spool, args.run)
    out = sys.stdout
    if args.what == "summary":
        print(json.dumps(run_summary(run), indent=2, sort_keys=True))
        return EXIT_OK
    progress = Progress(f"exporting {args.what}", run.episodes, sys.stderr)
    missing = 0
    platform_id = run.platform_id or run.local_id
    for episode in spool.iter_episodes(run.local_id):
        record = json.loads(episode.record)
        if args.what == "episodes":
            out.write(traces_line(record, platform_id, run.kind).decode())
        else:
            for row in episode_sample_rows(record, episode.rollout_number or 1):
                out.write(json.dumps(row, ensure_ascii=False, allow_nan=False) + "\n")
        progress.advance()
    if progress.done < run.episodes:
        missing = run.episodes - progress.done
    if sys.stderr.isatty():
        progress.close()
    if missing:
        print(
            f"note: {missing} episode(s) were delivered already and their bodies are no longer "
            "kept in the spool",
            file=sys.stderr,
        )
    return EXIT_OK


def cmd_push(args: argparse.Namespace) -> int:
    settings = resolve_settings(spool_dir=args.spool_dir)
    if not settings.api_key:
        raise PrimeRunsOtelError(
            "push needs an API key: set PRIME_API_KEY or run `prime login` first"
        )
    _, spool = _open_spool(args)
    targets = (
        [_find(spool, key) for key in args.runs]
        if args.runs
        else [run for run in spool.runs() if run.mode == "local" or not run.closed]
    )
    if not targets:
        print("nothing to push: every run in the spool is closed on the platform")
        return EXIT_OK
    for run in targets:
        if run.mode != "online":
            spool.set_mode(run.local_id, "online")
        spool.reopen_failed(run.local_id)
    ids = [run.local_id for run in targets]
    total = sum(spool.pending_count(key) for key in ids)
    uploader = Uploader(spool, settings.with_mode("online"))
    progress = Progress("pushing episodes", total)
    deadline = time.monotonic() + args.timeout
    try:
        while time.monotonic() < deadline:
            uploader.deliver_once(only=ids)
            left = sum(spool.pending_count(key) for key in ids)
            progress.advance(max(0, total - left - progress.done))
            rows = [spool.run(key) for key in ids]
            if all(_push_done(spool, row) for row in rows):
                break
            time.sleep(0.2)
    finally:
        uploader.stop()
    progress.close()
    incomplete = False
    for key in ids:
        row = spool.run(key)
        assert row is not None
        pending = spool.pending_count(key)
        incomplete = incomplete or pending > 0 or row.failed > 0
        print(
            f"{row.local_id}: {_run_status(row)}, {row.episodes} episode(s), {pending} pending, "
            f"{row.failed} failed, {row.uncertain} uncertain"
            + (f", {row.url}" if row.url else "")
            + (f" — {row.last_error}" if row.last_error else "")
        )
    return EXIT_INCOMPLETE if incomplete else EXIT_OK


def _push_done(spool: Spool, run: RunRow | None) -> bool:
    """Nothing more to do for now: closed, stuck on a permanent error, or
    still running elsewhere with nothing pending."""
    if run is None or run.settled or run.create_state == "failed":
        return True
    return run.end_status is None and spool.pending_count(run.local_id) == 0


def cmd_doctor(args: argparse.Namespace) -> int:
    from .doctor import FAIL, WARN, run_checks

    checks = run_checks(spool_dir=args.spool_dir)
    if args.json:
        print(json.dumps([check.__dict__ for check in checks], indent=2))
    else:
        marks = {FAIL: _color("FAIL", "31"), WARN: _color("warn", "33")}
        for check in checks:
            print(f"{marks.get(check.status, _color('ok', '32')):>4}  {check.name}: {check.detail}")
            if check.fix:
                print(f"      -> {check.fix}")
    return EXIT_INCOMPLETE if any(check.status == FAIL for check in checks) else EXIT_OK


def cmd_fake_platform(args: argparse.Namespace) -> int:
    from ..testing.fake_platform import main as fake_main

    argv = ["--host", args.host, "--port", str(args.port), "--api-key", args.api_key]
    return fake_main(argv)


# -- wiring -------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="prime-runs-otel",
        description="Report eval runs to the Prime platform through OpenTelemetry, "
        "and manage the local store of runs.",
        epilog="Exit codes: 0 ok, 1 not everything delivered yet, 2 usage or configuration error.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="log delivery details")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    def spool_option(sub: argparse.ArgumentParser) -> None:
        sub.add_argument(
            "--spool-dir", help="spool folder (default: $PRIME_RUNS_OTEL_DIR or ~/.prime/runs-otel)"
        )

    replay = commands.add_parser("replay", help="replay a verifiers traces.jsonl as a run")
    replay.add_argument("path", help="traces.jsonl, or the run folder that holds it")
    replay.add_argument("--name", help="run name (default: the folder's name)")
    replay.add_argument("--model", help="model the episodes were sampled from")
    replay.add_argument(
        "--environment", action="append", help="environment (repeatable; default: the records' env)"
    )
    replay.add_argument("--framework", default="verifiers")
    replay.add_argument("--config", help="the config file the run was launched with")
    replay.add_argument("--timeout", type=float, default=300.0, help="seconds to wait for delivery")
    replay.add_argument("--json", action="store_true", help="print the result as JSON")
    add_otlp_replay_option(replay)
    replay.set_defaults(func=cmd_replay)

    demo = commands.add_parser("demo", help="a synthetic eval run through the real pipeline")
    demo.add_argument("--episodes", type=int, default=300)
    demo.add_argument("--seed", type=int, default=0)
    demo.add_argument(
        "--fake-platform", action="store_true", help="deliver to a fake platform on loopback"
    )
    spool_option(demo)
    demo.set_defaults(func=cmd_demo)

    runs = commands.add_parser("runs", help="list the runs in the spool")
    runs.add_argument("--json", action="store_true")
    spool_option(runs)
    runs.set_defaults(func=cmd_runs)

    show = commands.add_parser("show", help="one run: summary, counts, status, errors")
    show.add_argument("run", help="run id, platform id, or a unique prefix")
    show.add_argument("--json", action="store_true")
    spool_option(show)
    show.set_defaults(func=cmd_show)

    export = commands.add_parser("export", help="what the platform would receive, as JSONL/JSON")
    export.add_argument("run")
    export.add_argument("--what", choices=["samples", "episodes", "summary"], default="samples")
    spool_option(export)
    export.set_defaults(func=cmd_export)

    push = commands.add_parser("push", help="deliver local or pending runs to the platform")
    push.add_argument("runs", nargs="*", metavar="RUN")
    push.add_argument("--timeout", type=float, default=600.0)
    spool_option(push)
    push.set_defaults(func=cmd_push)

    add_serve_command(commands)

    doctor = commands.add_parser(
        "doctor", help="check configuration, credentials, platform reachability, spool health"
    )
    doctor.add_argument("--json", action="store_true")
    spool_option(doctor)
    doctor.set_defaults(func=cmd_doctor)

    fake = commands.add_parser(
        "fake-platform", help="serve a fake platform on loopback for testing"
    )
    fake.add_argument("--host", default="127.0.0.1")
    fake.add_argument("--port", type=int, default=0)
    fake.add_argument("--api-key", default="test-key")
    fake.set_defaults(func=cmd_fake_platform)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    serving = args.command == "serve"
    logging.basicConfig(
        level=logging.INFO if args.verbose or serving else logging.WARNING,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s"
        if serving
        else "%(levelname)s %(name)s: %(message)s",
    )
    # One line per platform request drowns everything else.
    logging.getLogger("httpx").setLevel(logging.INFO if args.verbose else logging.WARNING)
    try:
        result: int = args.func(args)
        return result
    except PrimeRunsOtelError as exc:
        print(_color(f"error: {exc}", "31", sys.stderr), file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
