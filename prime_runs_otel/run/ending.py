"""Finishing a run: its end emitted after every episode handed over, all of
it committed to the spool on a thread of its own, then the wait for the
platform to close it; Ctrl-C during all of that (``ctrl_c.py``) hurries
the end instead of cutting it in two. Also the ``with`` block's end and the
exit hook that ends a run nobody finished."""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import dataclasses
import logging
import sys
import threading
import time
from collections.abc import Mapping
from typing import Any, TypeVar

from .._wakeup import POLL, Wakeup
from ..deliver.spool import RunRow
from ..produce.handoff import NotDrained
from ..produce.run_spans import emit_run_end, summary_json
from .ctrl_c import CtrlC
from .result import TERMINAL_STATUSES, RunReports, RunResult
from .state import _Handed

logger = logging.getLogger(__name__)

_Run = TypeVar("_Run", bound="RunEnding")

#: The end of a run finished with Ctrl-C: how ``replay`` finds a run its
#: own interruption left cancelled, and what ``finish()`` records when a
#: Ctrl-C lands while it ends a run that was completing.
INTERRUPTED = "interrupted by the user (Ctrl-C)"

#: How long ``finish()`` lets the run's producer thread hand over the last
#: episodes. Under a second normally (at most 128 wait there); longer only
#: when something holds the thread up (a span processor that does not
#: return, a span queue that stays full). What is left then is counted lost.
DRAIN_WAIT = 120.0

#: After a Ctrl-C during ``finish()``: what the hand-off still gets...
INTERRUPTED_DRAIN_WAIT = 5.0

#: ...what the local part of the end (the hand-off, the run's end, the
#: commit into the spool) gets in all...
INTERRUPTED_LOCAL_WAIT = 10.0

#: ...and how long ``finish()`` still waits for the platform to close the
#: run. What is not closed by then stays in the spool for ``push``.
INTERRUPTED_PLATFORM_WAIT = 3.0


class Ending:
    """The local part of a run's end, done on a thread of its own: no Ctrl-C
    is ever raised there, so it cannot be cut in two (the run left open with
    episodes in memory), and the caller's thread waits for it as long as it
    likes, and can be interrupted while it waits.

    ``status`` may still change until the run's end is emitted (a Ctrl-C
    during ``finish("completed")`` cancels the run); ``interrupted()``
    shortens the wait for the hand-off. ``wake`` is posted when the work is
    done (and by the Ctrl-C handler, so that the caller looks at once)."""

    def __init__(self, status: str, error: str | None, wake: Wakeup) -> None:
        self.status = status
        self.error = error
        self.emitted = False
        self.hurried = False
        self.done = False
        self.lost = 0
        self.failure: BaseException | None = None
        self.wake = wake
        self.drain_deadline = time.monotonic() + DRAIN_WAIT
        self._lock = threading.Lock()
        self._claimed = threading.Lock()

    def claim(self) -> bool:
        """``True`` for the first caller only: who does the work."""
        return self._claimed.acquire(blocking=False)

    def interrupted(self) -> None:
        """Ctrl-C: a run that was completing is cancelled, if its end is
        not out yet; the hand-off gets a few seconds more at most."""
        with self._lock:
            if not self.emitted and self.status == "completed":
                self.status, self.error = "cancelled", INTERRUPTED
            self.hurried = True
            self.drain_deadline = min(
                self.drain_deadline, time.monotonic() + INTERRUPTED_DRAIN_WAIT
            )

    def emit(self) -> tuple[str, str | None]:
        """The status and error the run ends with, fixed from now on."""
        with self._lock:
            self.emitted = True
            return self.status, self.error

    def finished(self) -> None:
        self.done = True
        self.wake.post()


class RunEnding(RunReports):
    """A run's end, however it comes: ``finish()``, a ``with`` block, the exit."""

    #: The end under way, once finish() began.
    _ending: Ending | None

    def finish(
        self,
        status: str = "completed",
        error: str | None = None,
        *,
        timeout: float | None = None,
        summary: Mapping[str, Any] | None = None,
    ) -> RunResult:
        """End the run and wait (up to ``timeout``) until it is closed on the
        platform. What is not delivered by then stays in the spool.

        ``summary`` replaces the run summary aggregated from the episodes
        (``avg_reward``, ``avg_metrics``, ``avg_error``) with your own.

        Ctrl-C during ``finish()`` does not cut the end in two: a run that
        was completing ends cancelled (unless its end was out already),
        ``finish()`` still waits for the run's end and every episode handed
        over to be in the spool (a few seconds at most), then for the
        platform ``INTERRUPTED_PLATFORM_WAIT`` seconds at most, and only then
        raises ``KeyboardInterrupt``; :attr:`result` says where the run was
        left (``push`` completes what the platform does not have yet)."""
        if status not in TERMINAL_STATUSES:
            raise ValueError(
                f"status must be one of {', '.join(TERMINAL_STATUSES)}, not {status!r}"
            )
        summary_json(summary)  # refused here, before the run starts ending
        wake = Wakeup()
        # Ctrl-C is caught from before the run is marked finishing: none may
        # land between that mark and the thread that ends the run.
        with CtrlC(wake) as ctrl_c:
            with self._lock:
                already = self._finished
                self._finished = True
                if not already:
                    self._ending = Ending(status, error, wake)
            ending = self._ending
            if already or ending is None:
                result = self._finished_elsewhere()
            else:
                threading.Thread(
                    target=self._end_locally,
                    args=(ending, summary),
                    name=f"prime-runs-otel-end-{self.id}",
                    daemon=True,
                ).start()
                committed = self._wait_for_end(ending, ctrl_c)
                budget = self._finish_timeout if timeout is None else timeout
                result = self._settle(ending, committed, budget, ctrl_c)
        if ctrl_c.count:
            raise KeyboardInterrupt
        if not already and ending is not None and ending.failure is not None:
            raise ending.failure
        return result

    def _finished_elsewhere(self) -> RunResult:
        """finish() again: the first call's result, once its end is local."""
        ending = self._ending
        if ending is not None and not ending.done:
            _wait_quietly(ending, INTERRUPTED_LOCAL_WAIT)
        if self.result is not None:
            return self.result
        return self.snapshot(ending.status if ending is not None else None)

    def _end_locally(self, ending: Ending, summary: Mapping[str, Any] | None) -> None:
        """On the end's own thread: every episode handed over becomes its
        spans (or is counted lost), then the run's end, then all of it is
        committed to the spool."""
        if not ending.claim():
            return  # done by the exit hook, this thread having never run
        try:
            lost = self._close_handoff(ending)
            status, error = ending.emit()
            if self._owns_lifecycle:
                emit_run_end(
                    self._tracer,
                    status,
                    error,
                    # What became spans, counted where it happened: an
                    # interrupted record_episode may or may not have queued.
                    episodes_recorded=self._handoff.handled,
                    episodes_unencodable=self._unencodable,
                    summary=summary,
                    link=self.start_link,
                )
            if lost and self.settings.mode != "disabled":
                self._exporter.count_lost(self.id, lost)
            self._provider.force_flush()
            self._providers.close()
            if self._owns_lifecycle and self.settings.mode == "local":
                # Closed here, not on the uploader's next pass: the process
                # may be gone before that (a second Ctrl-C).
                self._exporter.spool.intake.close_local_run(self.id)
        except BaseException as exc:  # raised to the caller by finish()
            ending.failure = exc
        finally:
            ending.finished()

    def _close_handoff(self, ending: Ending) -> int:
        """Drain the hand-off until ``ending.drain_deadline`` (which a Ctrl-C
        brings closer); what is left then is taken off and counted lost."""
        while not self._handoff.drain(POLL):
            if time.monotonic() >= ending.drain_deadline:
                break
        left: NotDrained[_Handed] | None = self._handoff.close(0)
        if left is None:
            return 0
        ending.lost = left.count
        logger.warning(
            "Run %s: %d episode(s) were still waiting for the producer thread after %s; "
            "they are not recorded and are counted as rejected%s",
            self.id,
            left.count,
            "Ctrl-C" if ending.hurried else f"{DRAIN_WAIT:.0f}s",
            " (one was being built and may still arrive)" if left.in_hand else "",
        )
        return left.count

    def _wait_for_end(self, ending: Ending, ctrl_c: CtrlC) -> bool:
        """Wait for the local part of the end; a Ctrl-C makes it hurry and
        bounds the wait (``INTERRUPTED_LOCAL_WAIT``). ``True`` once it is done."""
        acted_on = 0
        while not ending.done:
            try:
                if ctrl_c.count > acted_on:
                    acted_on = ctrl_c.count
                    ending.interrupted()
                wait = POLL
                if ctrl_c.first_at is not None:
                    left = ctrl_c.first_at + INTERRUPTED_LOCAL_WAIT - time.monotonic()
                    if left <= 0:
                        return False
                    wait = min(wait, left)
                ending.wake.wait(wait)
            except KeyboardInterrupt:  # somebody else's SIGINT handler raised it
                ctrl_c.note()
        return True

    def _settle(self, ending: Ending, committed: bool, budget: float, ctrl_c: CtrlC) -> RunResult:
        """After the local part: wait for the platform, then say where the run is."""
        status = ending.status
        if not self._owns_lifecycle:
            # A forked child only flushes what it recorded: the run goes on in
            # the parent, so it is reported as running, and not as a problem.
            status = "running"
        run = None
        if committed and ending.failure is None:
            run = self._wait_closed(budget, ctrl_c)
        result = self._describe(status, run)
        result = dataclasses.replace(result, unencodable=self._unencodable)
        if committed:
            atexit.unregister(self._on_exit)
            self._provider.shutdown()
        self.result = result
        self._say(result, ending, ctrl_c)
        return result

    def _wait_closed(self, budget: float, ctrl_c: CtrlC) -> RunRow | None:
        """The run once the platform closed it, or when the wait is over
        (``budget``, or ``INTERRUPTED_PLATFORM_WAIT`` after a Ctrl-C)."""
        if self.settings.mode == "disabled" or not self._owns_lifecycle:
            return None
        deadline = time.monotonic() + budget

        def cut_short() -> bool:
            first = ctrl_c.first_at
            return first is not None and time.monotonic() >= first + INTERRUPTED_PLATFORM_WAIT

        while True:
            try:
                left = max(0.0, deadline - time.monotonic())
                return self._exporter.wait_closed(self.id, left, cut_short=cut_short)
            except KeyboardInterrupt:  # somebody else's SIGINT handler raised it
                ctrl_c.note()

    def _say(self, result: RunResult, ending: Ending, ctrl_c: CtrlC) -> None:
        settled = result.closed and not result.pending
        level = logging.INFO if settled or not self._owns_lifecycle else logging.WARNING
        if ctrl_c.count:
            level = logging.WARNING
            logger.warning(
                "prime-runs-otel: Ctrl-C while run %s was finishing: %s",
                self.id,
                "its end and every episode handed over are in the spool"
                if ending.done
                else "the run's end was not in the spool yet",
            )
        logger.log(level, "prime-runs-otel: %s", result.describe())

    @property
    def finishing(self) -> bool:
        """Whether :meth:`finish` has begun (it may still be waiting on delivery)."""
        return self._finished

    def __enter__(self: _Run) -> _Run:
        return self

    def __exit__(self, exc_type: Any, exc: Any, traceback: Any) -> None:
        if exc_type is None:
            self.finish()
        elif isinstance(exc, (KeyboardInterrupt, asyncio.CancelledError)):
            self.finish("cancelled", "interrupted")
        else:
            self.finish("failed", f"{exc_type.__name__}: {exc}")

    def _on_exit(self) -> None:
        """At interpreter exit: a run whose end is still being committed
        (``finish()`` stopped waiting for it) gets the time it needs, within
        ``INTERRUPTED_LOCAL_WAIT``; one never finished is ended cancelled
        when Ctrl-C took the program down, and reported crashed otherwise.
        Before the SDK's own exit handler shuts the span pipeline down (it
        was registered first, so it runs after this)."""
        ending = self._ending
        if ending is not None:
            self._end_locally(ending, None)  # nothing, unless its thread never ran
            if not _wait_quietly(ending, INTERRUPTED_LOCAL_WAIT):
                logger.warning(
                    "Run %s: its end was still not in the spool at exit; the next process "
                    "to open the spool reports it crashed",
                    self.id,
                )
            return
        if self._finished or not self._owns_lifecycle:
            return
        if isinstance(getattr(sys, "last_value", None), KeyboardInterrupt):
            # Ctrl-C took the program down before it finished the run (a
            # second one, right after the first, in a `with` block's exit).
            with contextlib.suppress(KeyboardInterrupt):
                self.finish("cancelled", INTERRUPTED, timeout=INTERRUPTED_PLATFORM_WAIT)
            return
        logger.warning("Run %s was never finished; reporting it as crashed", self.id)
        try:
            self.finish("crashed", "the process exited without finishing the run")
        except KeyboardInterrupt:
            pass  # finish() has said where it left the run
        except Exception as exc:
            logger.warning("Run %s: reporting the crash failed: %s", self.id, exc)


def _wait_quietly(ending: Ending, timeout: float) -> bool:
    """Wait up to ``timeout`` for ``ending`` to be done, Ctrl-C or not."""
    deadline = time.monotonic() + timeout
    while not ending.done:
        try:
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            ending.wake.wait(min(left, POLL))
        except KeyboardInterrupt:
            pass
    ending.wake.post()  # for anyone else waiting
    return True
