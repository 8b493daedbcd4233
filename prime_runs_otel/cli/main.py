"""``prime-runs-otel``: replay, demo, the local store, serve, ui, doctor and
the fake platform. One module per command group: ``replay`` (replay, demo;
over OTLP ``otlp_replay``), ``store`` (a package: runs, show, export, push,
rm, prune), ``serve``, ``ui`` (the viewer), ``doctor``; ``output`` is how every command writes,
``arguments`` the options they share, ``exits`` how they end.

Exit codes: 0 success; 1 the work ran but not everything was delivered (or a
run is not closed yet), or the store could not be read or written; 2 bad
usage or configuration (the message says what to change); 130 interrupted.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence

from .. import __version__
from .._text import configure_logging
from ..errors import PrimeRunsOtelError
from .arguments import json_option, port_number, spool_option
from .exits import EXIT_INCOMPLETE, EXIT_INTERRUPTED, EXIT_OK, EXIT_USAGE, exit_code_for
from .output import color, error, install_pipe_safe_stdout, print_json
from .replay import add_replay_commands
from .serve import add_serve_command
from .store import add_store_commands
from .ui import add_ui_command

__all__ = ["EXIT_INCOMPLETE", "EXIT_OK", "EXIT_USAGE", "build_parser", "main"]


def cmd_doctor(args: argparse.Namespace) -> int:
    from .doctor import FAIL, WARN, run_checks

    checks = run_checks(spool_dir=args.spool_dir)
    if args.json:
        print_json([check.__dict__ for check in checks])
    else:
        marks = {FAIL: color("FAIL", "31"), WARN: color("warn", "33")}
        for check in checks:
            print(f"{marks.get(check.status, color('ok', '32')):>4}  {check.name}: {check.detail}")
            if check.fix:
                print(f"      -> {check.fix}")
    return EXIT_INCOMPLETE if any(check.status == FAIL for check in checks) else EXIT_OK


def cmd_fake_platform(args: argparse.Namespace) -> int:
    from .extras import require_testing

    require_testing("fake-platform")
    from ..testing import main as fake_main

    argv = ["--host", args.host, "--port", str(args.port), "--api-key", args.api_key]
    return fake_main(argv)


def cmd_run(args: argparse.Namespace) -> int:
    from ..instrumentation.launcher import launch

    launch(args.command)
    return EXIT_USAGE  # not reached: launch() replaces this process or raises


# -- wiring -------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    # Options every command takes, before or after its name.
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "-v",
        "--verbose",
        action="store_true",
        default=argparse.SUPPRESS,
        help="log delivery details",
    )
    parser = argparse.ArgumentParser(
        prog="prime-runs-otel",
        parents=[common],
        description="Report eval runs to the Prime platform through OpenTelemetry, "
        "and manage the local store of runs.",
        epilog="Exit codes: 0 ok, 1 not everything delivered yet (or the store could not be "
        "read or written), 2 usage or configuration error, 130 interrupted.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    add_replay_commands(commands, common)
    add_store_commands(commands, common)
    add_serve_command(commands, common)
    add_ui_command(commands, common)

    doctor = commands.add_parser(
        "doctor",
        parents=[common],
        help="check configuration, credentials, platform reachability, spool health",
    )
    json_option(doctor, "the checks")
    spool_option(doctor)
    doctor.set_defaults(func=cmd_doctor)

    run = commands.add_parser(
        "run",
        help="run a command whose prime-runs calls report through this package",
        description="Run COMMAND (vf-eval, a trainer, any Python program) so that every "
        "prime_runs.init(...) in it opens a run reported through prime-runs-otel: the same as "
        "opentelemetry-instrument with OTEL_TRACES_EXPORTER=prime_runs, without "
        "opentelemetry-distro. COMMAND's exit code is passed through.",
    )
    run.add_argument(
        "command",
        nargs=argparse.REMAINDER,
        metavar="-- COMMAND ...",
        help="the command to run, after --, with its own arguments",
    )
    run.set_defaults(func=cmd_run)

    fake = commands.add_parser(
        "fake-platform", parents=[common], help="serve a fake platform on loopback for testing"
    )
    fake.add_argument("--host", default="127.0.0.1", help="address to listen on (default loopback)")
    fake.add_argument(
        "--port", type=port_number, default=0, help="port to listen on (default: any free one)"
    )
    fake.add_argument("--api-key", default="test-key", help="the key it accepts (default test-key)")
    fake.set_defaults(func=cmd_fake_platform)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    install_pipe_safe_stdout()
    args = build_parser().parse_args(argv)
    verbose = bool(getattr(args, "verbose", False))
    serving = args.command == "serve"
    configure_logging(
        level=logging.INFO if verbose or serving else logging.WARNING,
        fmt="%(asctime)s %(levelname)s %(name)s: %(message)s"
        if serving
        else "%(levelname)s %(name)s: %(message)s",
    )
    # One line per platform request drowns everything else.
    logging.getLogger("httpx").setLevel(logging.INFO if verbose else logging.WARNING)
    try:
        result: int = args.func(args)
    except PrimeRunsOtelError as exc:
        error(str(exc))
        return exit_code_for(exc)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    sys.stdout.flush()
    return result


if __name__ == "__main__":
    sys.exit(main())
