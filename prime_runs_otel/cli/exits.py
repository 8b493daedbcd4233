"""How a command ends: the exit codes every command returns, and the error
for a command line that cannot be carried out as given.

In one module of their own because every command group returns them and
:mod:`.main` documents them for all: 0 success; 1 the work ran but not
everything was delivered (or a run is not closed yet), or the store could
not be read or written; 2 bad usage or configuration; 130 interrupted.
"""

from __future__ import annotations

from ..errors import PrimeRunsOtelError

EXIT_OK, EXIT_INCOMPLETE, EXIT_USAGE = 0, 1, 2
EXIT_INTERRUPTED = 130


class UsageError(PrimeRunsOtelError):
    """A command line that cannot be carried out as given (exit code 2)."""


def exit_code_for(error: PrimeRunsOtelError) -> int:
    """The exit code of a command that ended on ``error``: 1 for a store that
    could not be read or written (a damaged spool or run, a full disk, a
    folder that cannot be written: what ``doctor`` exits 1 for too), 2 for
    anything the command line or the configuration must change."""
    from ..deliver.spool import SpoolError  # here: only a command that failed pays for it

    return EXIT_INCOMPLETE if isinstance(error, SpoolError) else EXIT_USAGE


#: Whether this process said so already (an interrupt during the way out
#: after one that stopped the command adds no second line).
said_interrupted: list[bool] = []


def say_interrupted() -> None:
    """Say, on stderr, that the command was interrupted: one line."""
    said_interrupted.append(True)
    import contextlib
    import sys

    with contextlib.suppress(Exception):  # a closed stderr: the exit code says it
        sys.stderr.write("interrupted\n")
        sys.stderr.flush()
