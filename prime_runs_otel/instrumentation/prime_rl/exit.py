"""How a prime-rl run ends when its process does.

prime-rl finalizes its run only on a clean exit (``monitors.finalize``);
otherwise its ``PrimeMonitor`` marks the run ``failed`` from an atexit hook,
without saying why, and after SIGKILL not at all (the run stays RUNNING).
Here the exception that ends the process is kept, and the run is ended at
exit with it: Ctrl-C → cancelled, an exception → failed with its type and
message, an exit without either → crashed.

The exception is seen where it leaves: at the interpreter's top level
(``sys.excepthook``, which ``asyncio.run`` lets every exception reach, Ctrl-C
included), or, as prime-rl's entry points end, at ``sys.exit(1)`` called
while it is being handled (prime-rl's ``clean_exit`` decorator logs the
error and exits so; ``SystemExit`` never reaches ``sys.excepthook``). So
``sys.exit`` is wrapped too while the run is open: it notes the exception
in hand and exits as it would. After SIGKILL nothing runs in the process; the
spool then holds a run without an end whose producer is gone, and the next
process on the spool (or ``prime-runs-otel push --all``) closes it as
crashed.
"""

from __future__ import annotations

import asyncio
import atexit
import sys
import threading
from collections.abc import Callable
from types import TracebackType
from typing import NoReturn

__all__ = ["ExitWatch"]

Ending = tuple[str, str]


class ExitWatch:
    """Calls ``end(status, error)`` once, at interpreter exit, unless
    :meth:`disarm` was called first (the run was finalized)."""

    def __init__(self, end: Callable[[str, str], None]) -> None:
        self._end = end
        self._lock = threading.Lock()
        self._armed = True
        self._ending: Ending | None = None
        self._previous = sys.excepthook
        self._exit = sys.exit
        sys.excepthook = self._excepthook
        sys.exit = self._sys_exit
        atexit.register(self._at_exit)

    def disarm(self) -> None:
        with self._lock:
            self._armed = False
        atexit.unregister(self._at_exit)
        if sys.excepthook == self._excepthook:
            sys.excepthook = self._previous
        if sys.exit == self._sys_exit:
            sys.exit = self._exit

    def _sys_exit(self, status: str | int | None = None) -> NoReturn:
        handled = sys.exc_info()[1]
        with self._lock:
            if self._ending is None and status not in (None, 0):
                if isinstance(handled, BaseException) and not isinstance(handled, SystemExit):
                    self._ending = ending_for(handled)
                else:
                    self._ending = ("failed", f"the prime-rl process exited with status {status}")
        self._exit(status)

    def _excepthook(
        self,
        exc_type: type[BaseException],
        exc: BaseException,
        traceback: TracebackType | None,
    ) -> None:
        with self._lock:
            if self._ending is None:
                self._ending = ending_for(exc)
        self._previous(exc_type, exc, traceback)

    def _at_exit(self) -> None:
        with self._lock:
            if not self._armed:
                return
            self._armed = False
            status, error = self._ending or (
                "crashed",
                "the prime-rl process exited without finalizing its run",
            )
        self._end(status, error)


def ending_for(exc: BaseException) -> Ending:
    """The status and reason a run ends with when ``exc`` ends its process."""
    if isinstance(exc, (KeyboardInterrupt, asyncio.CancelledError)):
        return "cancelled", "interrupted (Ctrl-C)"
    message = str(exc)
    return "failed", f"{type(exc).__name__}: {message}" if message else type(exc).__name__
