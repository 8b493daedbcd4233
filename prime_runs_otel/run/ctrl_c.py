"""Ctrl-C while a run is being finished: noted, acted on, raised at the end.

Ending a run is a sequence (the last episodes handed over, the run's end
emitted, everything committed to the spool, the run closed) that leaves the
run open for ever if an exception cuts it in two: Python raises
``KeyboardInterrupt`` on the main thread between any two bytecodes. So while
``Run.finish`` works, a Ctrl-C does not raise: it is counted here, the run's
end hears of it (``finish`` cancels what it can and shortens its waits), and
``finish`` raises ``KeyboardInterrupt`` once the run is safe.

Only Python's own handler is replaced, and only on the main thread (the only
one a signal handler may be set from). A program that installed its own
(``asyncio.run`` does) keeps it: ``finish`` then catches what it raises
during its waits and counts it here the same way.
"""

from __future__ import annotations

import signal
import threading
import time
from types import FrameType, TracebackType
from typing import Any

from .._wakeup import Wakeup

__all__ = ["CtrlC"]


class CtrlC:
    """The Ctrl-C's that came during a ``with`` block, each one posting
    ``wake`` so that whoever waits looks at them at once."""

    def __init__(self, wake: Wakeup) -> None:
        self.count = 0
        #: ``time.monotonic()`` of the first one.
        self.first_at: float | None = None
        self._wake = wake
        self._previous: Any = None

    def note(self) -> None:
        """One more Ctrl-C (from the handler, or a caught ``KeyboardInterrupt``)."""
        if self.first_at is None:
            self.first_at = time.monotonic()
        self.count += 1
        self._wake.post()

    def _on_sigint(self, signum: int, frame: FrameType | None) -> None:
        self.note()

    def __enter__(self) -> CtrlC:
        if (
            threading.current_thread() is threading.main_thread()
            and signal.getsignal(signal.SIGINT) is signal.default_int_handler
        ):
            self._previous = signal.signal(signal.SIGINT, self._on_sigint)
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        if self._previous is not None:
            signal.signal(signal.SIGINT, self._previous)
            self._previous = None
