"""Serving the fake platform from a shell: ``python -m prime_runs_otel.testing``
(and ``prime-runs-otel fake-platform``), for trying a run end to end without
an account.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import shlex
import sys
import threading
from collections.abc import Sequence

from ._store import RecordedRequest
from .fake_platform import FakePlatform


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m prime_runs_otel.testing",
        description=(
            "Serve a fake Prime platform (evaluations, environments, Prime Traces, "
            "training runs) so a run can be tried end to end without an account."
        ),
    )
    parser.add_argument("--host", default="127.0.0.1", help="interface to listen on")
    parser.add_argument("--port", type=int, default=0, help="port to listen on (0: any free port)")
    parser.add_argument("--api-key", default="test-key", help="the bearer token to accept")
    parser.add_argument(
        "--allowed-team",
        action="append",
        default=None,
        help="a team allowed to create training runs (repeatable; default: every team)",
    )
    parser.add_argument("--quiet", action="store_true", help="do not log each request")
    return parser


def _log_request(recorded: RecordedRequest) -> None:
    fault = f" [{recorded.fault}]" if recorded.fault else ""
    print(
        f"{recorded.method} {recorded.path} -> {recorded.status}{fault}",
        file=sys.stderr,
        flush=True,
    )


def _cannot_listen(host: str, port: int, exc: OSError) -> str:
    """One line for a port that cannot be had, with what to change."""
    reason = "it is in use" if exc.errno == errno.EADDRINUSE else exc.strerror or str(exc)
    return (
        f"error: cannot listen on {host}:{port} ({reason}); pass another --port, "
        "or --port 0 for any free one"
    )


def main(argv: Sequence[str] | None = None) -> int:
    """Serve until Ctrl-C, after printing the exports that point a client here."""
    args = _parser().parse_args(argv)
    platform = FakePlatform(
        api_key=args.api_key,
        host=args.host,
        port=args.port,
        allowed_teams=set(args.allowed_team) if args.allowed_team else None,
    )
    if not args.quiet:
        platform.on_request = _log_request
    try:
        platform.start()
    except OSError as exc:
        print(_cannot_listen(args.host, args.port, exc), file=sys.stderr)
        return 2
    with platform:
        print(f"# Fake Prime platform at {platform.url}; point a client at it with:")
        for name, value in platform.client_env().items():
            print(f"export {name}={shlex.quote(value)}")
        print("# Press Ctrl-C to stop.", flush=True)
        with contextlib.suppress(KeyboardInterrupt):
            threading.Event().wait()
    return 0
