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
import importlib
import sys
from collections.abc import Callable, Sequence
from typing import Any

from .. import __version__
from .arguments import json_option, port_number, spool_option
from .exits import (
    EXIT_INCOMPLETE,
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_USAGE,
    exit_code_for,
    say_interrupted,
)

__all__ = ["EXIT_INCOMPLETE", "EXIT_OK", "EXIT_USAGE", "build_parser", "main"]

#: Every command, in the order ``--help`` lists them: its name, its one-line
#: help, and the module and function that add it (with its options) to the
#: parser. Only the module of the command being run is imported: the others
#: pull in the OpenTelemetry SDK, the platform clients or a web server, and
#: ``prime-runs-otel --version`` should not wait for any of them. The help
#: lines are the ones the modules give (a test holds them equal).
COMMANDS: tuple[tuple[str, str, str, str], ...] = (
    ("replay", "replay a verifiers traces.jsonl as a run", ".replay", "add_replay_commands"),
    ("demo", "a synthetic eval run through the real pipeline", ".replay", "add_replay_commands"),
    ("runs", "list the runs in the spool, newest first", ".store.runs", "add_runs_command"),
    (
        "show",
        "one run: summary, metrics, rewards, status, errors",
        ".store.show",
        "add_show_command",
    ),
    (
        "export",
        "what the platform would receive, as JSONL/JSON",
        ".store.export",
        "add_export_command",
    ),
    (
        "push",
        "deliver chosen local or pending runs to the platform",
        ".store.push",
        "add_push_command",
    ),
    (
        "rm",
        "remove runs from the local store (not from the platform)",
        ".store.remove",
        "add_remove_commands",
    ),
    (
        "prune",
        "remove closed runs from the local store by age or status",
        ".store.remove",
        "add_remove_commands",
    ),
    (
        "compact",
        "give the space of removed runs back to the disk (the spool file shrinks)",
        ".store.compact",
        "add_compact_command",
    ),
    (
        "serve",
        "receive OTLP (from a collector) and report the runs in it",
        ".serve",
        "add_serve_command",
    ),
    ("ui", "look at the runs in the local store in the browser", ".ui", "add_ui_command"),
    (
        "doctor",
        "check configuration, credentials, platform reachability, spool health",
        ".main",
        "add_doctor_command",
    ),
    (
        "run",
        "run a command whose prime-runs calls report through this package",
        ".main",
        "add_run_command",
    ),
    (
        "fake-platform",
        "serve a fake platform on loopback for testing",
        ".main",
        "add_fake_platform_command",
    ),
)


def cmd_doctor(args: argparse.Namespace) -> int:
    from .doctor import FAIL, WARN, run_checks
    from .output import color, print_json

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


def add_doctor_command(commands: Any, common: argparse.ArgumentParser) -> None:
    doctor = commands.add_parser(
        "doctor",
        parents=[common],
        help="check configuration, credentials, platform reachability, spool health",
    )
    json_option(doctor, "the checks")
    spool_option(doctor)
    doctor.set_defaults(func=cmd_doctor)


def add_run_command(commands: Any, common: argparse.ArgumentParser) -> None:
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


def add_fake_platform_command(commands: Any, common: argparse.ArgumentParser) -> None:
    fake = commands.add_parser(
        "fake-platform", parents=[common], help="serve a fake platform on loopback for testing"
    )
    fake.add_argument("--host", default="127.0.0.1", help="address to listen on (default loopback)")
    fake.add_argument(
        "--port", type=port_number, default=0, help="port to listen on (default: any free one)"
    )
    fake.add_argument("--api-key", default="test-key", help="the key it accepts (default test-key)")
    fake.set_defaults(func=cmd_fake_platform)


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The parser of every command (``command=None``), or of ``command`` only,
    with the others listed by name and help line and not imported (``""``:
    none, for ``--help`` and ``--version``)."""
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
    added: set[tuple[str, str]] = set()
    for name, help_line, module, adder in COMMANDS:
        if command is not None and name != command:
            commands.add_parser(name, help=help_line, add_help=False)
            continue
        if (module, adder) not in added:
            added.add((module, adder))
            _adder(module, adder)(_Only(commands, name if command else None), common)
    return parser


def _adder(module: str, name: str) -> Callable[[Any, argparse.ArgumentParser], None]:
    adder: Callable[[Any, argparse.ArgumentParser], None] = getattr(
        importlib.import_module(module, __package__), name
    )
    return adder


class _Only:
    """The subparsers of ``prime-runs-otel``, as a module that adds several
    commands (``replay`` and ``demo``, ``rm`` and ``prune``) sees them: the
    commands other than ``name`` are already listed, and are not added twice."""

    def __init__(self, commands: Any, name: str | None) -> None:
        self._commands = commands
        self._name = name

    def add_parser(self, name: str, **kwargs: Any) -> argparse.ArgumentParser:
        if self._name is None or name == self._name:
            parser: argparse.ArgumentParser = self._commands.add_parser(name, **kwargs)
            return parser
        kwargs.pop("help", None)
        return argparse.ArgumentParser(prog=name, **kwargs)


def command_named(args: Sequence[str]) -> str | None:
    """The command a command line names: its first word that is not an option
    (the options before it, ``-v``, ``--version`` and ``-h``, take no value)."""
    return next((arg for arg in args if not arg.startswith("-")), None)


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command in this process; its exit code."""
    args_given = list(sys.argv[1:] if argv is None else argv)
    named = command_named(args_given)
    known = {name for name, *_ in COMMANDS}
    parser = build_parser(named if named in known else "")
    args = parser.parse_args(args_given)
    return run_command(args)


def run_command(args: argparse.Namespace) -> int:
    import logging

    from .._text import configure_logging
    from ..errors import PrimeRunsOtelError
    from .output import error, install_pipe_safe_stdout

    install_pipe_safe_stdout()
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
        say_interrupted()
        return EXIT_INTERRUPTED
    sys.stdout.flush()
    return result


if __name__ == "__main__":
    sys.exit(main())
