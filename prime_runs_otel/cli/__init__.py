"""The ``prime-runs-otel`` command line: one module per command group, over
the public API and the spool; nothing below imports it.

This module is the process's entry point, and stays tiny on purpose: a
Ctrl-C can land at any moment of a command's life, the first milliseconds
included, and everything that could be interrupted (the imports of the
command line itself, the command, the way out) runs inside :func:`main`,
where an interrupt becomes one line, ``interrupted``, and exit code 130.
"""

from __future__ import annotations

import sys

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Sequence
    from types import FrameType

__all__ = ["main"]


def main(argv: Sequence[str] | None = None) -> int:
    """``prime-runs-otel``: the whole process, from its first import to its exit.

    ``run -- COMMAND`` is answered before the rest of the command line is
    imported: it only replaces this process with the command, and should not
    make every launch wait for the pipeline's imports. To run a command
    inside another program (a test), call :func:`prime_runs_otel.cli.main.main`
    instead: this one takes over the process's Ctrl-C until it exits.
    """
    try:
        _own_interrupts()
        code = _command(list(sys.argv[1:] if argv is None else argv))
        sys.stdout.flush()
    except KeyboardInterrupt:
        code = -1
    except SystemExit as exc:  # argparse's --help, --version and usage errors
        code = _exit_code(exc)
    return _leave(code)


def _command(args: list[str]) -> int:
    if args[:1] == ["run"] and not {"-h", "--help"} & set(args[1:2]):
        from ..instrumentation.launcher import run_command

        return run_command(args[1:])
    from .main import main as full_main

    return full_main(args)


# -- Ctrl-C ---------------------------------------------------------------------------
#
# While the command runs, Python's own handler turns SIGINT into
# KeyboardInterrupt, which every command either handles (a run is closed as
# cancelled) or lets reach main() above. Once the outcome is known, another
# Ctrl-C must not start a traceback half-way through the exit: it ends the
# process at once with 130. In the very last moments (the interpreter's
# teardown, after every exit handler ran) it is ignored, because by then
# Python has put back the system's default, which would kill the process
# with the signal (exit -2) instead: the command has finished by then.

_owned: list[bool] = []


def _own_interrupts() -> None:
    """Take over SIGINT for the way out, unless the process was started with
    it ignored (a background job: Ctrl-C is not meant for it)."""
    if _owned:
        return
    import atexit
    import signal

    _owned.append(signal.getsignal(signal.SIGINT) is not signal.SIG_IGN)
    if _owned[0]:
        # Registered first, so it runs last of every exit handler.
        atexit.register(_ignore_interrupts)


def _leave(code: int) -> int:
    """From here on a Ctrl-C ends the process with 130 at once; ``code``
    (-1: interrupted) is what it exits with otherwise. An interrupt landing
    while this is set up is one more reason to exit 130."""
    while True:
        try:
            _own_interrupts()
            if _owned[0]:
                import signal

                signal.signal(signal.SIGINT, _interrupt_while_leaving)
            if code != -1:
                return code
            from .exits import EXIT_INTERRUPTED, say_interrupted

            say_interrupted()
            return EXIT_INTERRUPTED
        except KeyboardInterrupt:
            code = -1


def _interrupt_while_leaving(signum: int, frame: FrameType | None) -> None:
    import contextlib
    import os

    from .exits import EXIT_INTERRUPTED, said_interrupted, say_interrupted

    if not said_interrupted:
        say_interrupted()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):  # leaving anyway: a closed pipe, a full disk
            stream.flush()
    os._exit(EXIT_INTERRUPTED)


def _ignore_interrupts() -> None:
    import signal

    signal.signal(signal.SIGINT, signal.SIG_IGN)


def _exit_code(exc: SystemExit) -> int:
    if exc.code is None:
        return 0
    if isinstance(exc.code, int):
        return exc.code
    print(exc.code, file=sys.stderr)
    return 1
