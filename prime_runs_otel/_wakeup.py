"""Waiting between threads where Ctrl-C may land on any line of the main thread.

Python runs signal handlers on the main thread only, between any two
bytecodes, and Ctrl-C's raises ``KeyboardInterrupt`` there. The main thread
is where people record episodes and finish runs, so whatever it shares with
another thread must stay right when an exception appears between any two of
its steps. ``threading.Condition`` does not: its ``wait()`` takes its lock
back in Python code, and an exception raised just before that leaves the
``with`` block releasing a lock that another thread may hold by then.

So the waits here are one C-level lock acquire each (it either took the
lock or did not; a signal cannot leave it half done), and what they wait for
is read again after every wake-up rather than trusted to the wake-up itself:
a wake-up lost to an interrupt costs at most one ``poll`` interval, never a
hang.
"""

from __future__ import annotations

import threading
import time

__all__ = ["POLL", "Completion", "Wakeup"]

#: The longest a waiter goes without reading its condition again: what a
#: wake-up lost to an interrupt costs.
POLL = 0.25


class Wakeup:
    """A wake-up token: :meth:`post` leaves one (at most one waits), :meth:`wait`
    takes it or waits for it. A waiter reads its condition again after each
    return, so a spare token costs one extra look and nothing more.

    A ``threading.Lock`` released by one thread and acquired by another: the
    lock held means no token. Both calls are single C calls.
    """

    __slots__ = ("_lock",)

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._lock.acquire()

    def post(self) -> None:
        # Once per episode recorded: a plain try costs nothing, a
        # contextlib.suppress two Python calls.
        if self._lock.locked():
            try:  # noqa: SIM105
                self._lock.release()
            except RuntimeError:  # another thread posted in between
                pass

    def wait(self, timeout: float) -> bool:
        """Take the token, waiting up to ``timeout`` seconds; ``True`` if taken."""
        return self._lock.acquire(timeout=max(0.0, timeout))


class Completion:
    """Set once by the thread doing some work; waited for by any other, with
    a timeout, and safe to interrupt: :attr:`done` is set before the waiters
    are woken, so a waiter whose wake-up was cut short by an exception still
    reads that the work is over."""

    __slots__ = ("_wakeup", "done")

    def __init__(self) -> None:
        self.done = False
        self._wakeup = Wakeup()

    def set(self) -> None:
        self.done = True
        self._wakeup.post()

    def wait(self, timeout: float) -> bool:
        """``True`` once the work is done, ``False`` if ``timeout`` passed first."""
        deadline = time.monotonic() + timeout
        while not self.done:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            if self._wakeup.wait(min(remaining, POLL)):
                self._wakeup.post()  # for the next waiter
        return True
