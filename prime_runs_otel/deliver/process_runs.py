"""The runs one process feeds in process: waiting for their delivery, and
what becomes of them when the process ends.

``exporter.py`` adapts the SDK's calls to these (``force_flush``,
``shutdown``), and ``run.py`` waits through them at a run's ``finish()``.
Episodes reach the spool through :mod:`.delivery`; this module only watches
the runs it committed to, and ends the ones nobody else will.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import os
import sqlite3
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from .. import semconv
from .._text import shown
from ..read.checks import run_identity
from ..read.records import RunIdentity
from .delivery import SpanDelivery
from .platform.watch import WATCH
from .spool import RunRow, Spool, SpoolError, process_alive, this_producer
from .uploader import Uploader

logger = logging.getLogger(__name__)

#: How long the end of a run waits for a platform that has not acknowledged
#: the run since it started and failed to answer (see ``wait_closed``).
UNREACHABLE_FINISH_WAIT = 10.0


class FallbackRun:
    """The run of episodes whose Resource names none: one per service and
    process, so a zero-code eval that forgot ``prime.run.id`` loses nothing
    (its next process is a new run, never a mix of two)."""

    def __init__(self) -> None:
        self.local_id: str | None = None

    def __call__(self, resource: Mapping[str, Any]) -> RunIdentity | None:
        if self.local_id is None:
            service = str(resource.get("service.name") or "unknown_service")
            host, pid, start = this_producer()
            digest = hashlib.sha256(f"{service}\0{host}\0{pid}\0{start}".encode())
            self.local_id = digest.hexdigest()[:32]
            logger.warning(
                "Spans carry no %s on their Resource: recording them as run %s, named after "
                "service.name %r. Set OTEL_RESOURCE_ATTRIBUTES=%s=... to choose the run.",
                semconv.RUN_ID,
                self.local_id,
                service,
                semconv.RUN_ID,
            )
        service_name = resource.get("service.name")
        name = str(service_name) if service_name else None
        identity = run_identity({**dict(resource), semconv.RUN_ID: self.local_id})
        if identity is None:
            return RunIdentity(local_id=self.local_id, name=name)
        return identity if identity.name else dataclasses.replace(identity, name=name)

    def summarise(self, spool: Spool) -> None:
        """One line at exit for a run nobody named, as ``start_run`` prints."""
        if self.local_id is None:
            return
        run = spool.reading.run(self.local_id)
        if run is None:
            return
        if run.mode == "local":
            where = f"kept in the local store ({spool.path})"
        else:
            pending = spool.reading.pending_count(run.local_id)
            where = f"{pending} pending, {run.url or 'on the platform'}"
        logger.warning(
            "prime-runs-otel: run %s (%s) %s: %d episode(s), %s; see `prime-runs-otel show %s`",
            run.local_id,
            run.name or "unnamed",
            run.end_status or "running",
            run.episodes,
            where,
            run.local_id[:12],
        )


class ProcessRuns:
    """The runs a :class:`.delivery.SpanDelivery` committed to in this process."""

    #: How long the uploader gets to finish the step it is in once the wait
    #: for delivery is over, within the SDK's budget.
    STOP_GRACE = 5.0

    def __init__(
        self,
        delivery: SpanDelivery,
        uploader: Uploader,
        fallback: FallbackRun,
        *,
        ends_runs: bool = True,
    ) -> None:
        self.spool = delivery.spool
        self._delivery = delivery
        self._uploader = uploader
        self._fallback = fallback
        self._ends_runs = ends_runs
        self._owner_pid = os.getpid()

    def add_step_table(self, local_id: str, step: int, body: bytes) -> None:
        """Keep a training step's Parquet sample table, built elsewhere, with
        the run in the spool, and have the uploader send it."""
        self.spool.steps.begin_step_upload(local_id, step, (), body, 0)
        self._delivery.wake()

    # -- the end of the process ---------------------------------------------------

    def close(self, deadline: float, hard: float) -> None:
        """Commit what the span buffer holds, end the runs nobody else feeds,
        wait for delivery until ``deadline`` and stop the uploader by
        ``hard``. Whatever is not delivered by then stays in the spool."""
        self._delivery.flush()
        try:
            self._end_abandoned_runs()
        except SpoolError as exc:  # shutdown never raises; the next process ends them
            logger.error("prime-runs-otel could not record the end of its runs: %s", exc)
        seen = self._delivery.seen_runs()
        if self._uploader.running:
            for local_id in seen:
                self._wait_for_run(local_id, deadline - time.monotonic())
            now = time.monotonic()
            grace = max(0.0, deadline - now) + self.STOP_GRACE
            self._uploader.stop(timeout=max(0.0, min(grace, hard - now)))
        self._report_leftovers(seen)
        self._fallback.summarise(self.spool)

    def _end_abandoned_runs(self) -> None:
        """Runs this process fed without an end span, and that no other live
        process feeds, end with this process: completed when it shuts down
        cleanly (zero-code set-ups never emit an end span), failed when an
        unhandled exception is taking the interpreter down. A process that is
        killed never gets here; the next one to open the spool marks its runs
        crashed."""
        if os.getpid() != self._owner_pid or not self._ends_runs:
            return  # a forked child never ends the parent's runs, nor does a worker
        me = os.getpid()
        status, error = _exit_status()
        for local_id in self._delivery.seen_runs():
            run = self.spool.reading.run(local_id)
            if run is None or run.end_status is not None:
                continue
            others = [
                (pid, start)
                for _, pid, start, _ in self.spool.delivery.producers(local_id)
                if pid != me and process_alive(pid, start)
            ]
            if not others:
                self._end_run(local_id, status, error)

    def _end_run(self, local_id: str, status: str, error: str | None) -> None:
        """Record the run's end, or say why it could not be: on a disk (or
        file size limit) that is full, the write fails with SQLite's own
        error, which must not escape ``finish()`` or the interpreter's exit.
        The episodes already committed stay; the next process to open the
        spool finds this one gone and closes the run as crashed."""
        try:
            self.spool.intake.end_run(local_id, status, error)
        except (SpoolError, sqlite3.Error) as exc:
            logger.error(
                "Run %s: its end could not be written to the spool %s (%s); the episodes "
                "stored stay, and the next prime-runs-otel process to open the store closes "
                "the run as crashed. Free space on its disk, then run `prime-runs-otel push %s`.",
                shown(local_id),
                shown(str(self.spool.path)),
                shown(str(exc)),
                shown(local_id),
            )

    def _report_leftovers(self, seen: Sequence[str]) -> None:
        for local_id in seen:
            run = self.spool.reading.run(local_id)
            if run is None or run.mode != "online" or run.closed:
                continue
            pending = self.spool.reading.pending_count(local_id)
            logger.warning(
                "Run %s is not closed on the platform yet (%d episode(s) pending). Nothing is "
                "lost: it stays in %s; deliver it with `prime-runs-otel push %s`.",
                local_id,
                pending,
                self.spool.path,
                local_id,
            )

    # -- waiting on delivery ---------------------------------------------------------

    def wait_all_delivered(self, timeout: float) -> bool:
        """Every run committed to in this process delivered within ``timeout``."""
        deadline = time.monotonic() + timeout
        return all(
            self.wait_delivered(local_id, deadline - time.monotonic())
            for local_id in self._delivery.seen_runs()
        )

    def _wait_for_run(self, local_id: str, timeout: float) -> None:
        """A run that has ended is waited on until it is closed; one that is
        still fed by another process only until what this process gave is
        delivered (its close is that process's to wait for)."""
        run = self.spool.reading.run(local_id)
        if run is not None and run.end_status is None:
            self.wait_delivered(local_id, timeout)
        else:
            self.wait_closed(local_id, timeout)

    def wait_delivered(self, local_id: str, timeout: float) -> bool:
        """``True`` once nothing of the run is waiting for the platform."""
        return self._wait(
            local_id,
            timeout,
            lambda run: (
                run.mode != "online"
                or (
                    run.create_state == "created"
                    and self.spool.reading.pending_count(local_id) == 0
                    and not self.spool.steps.metrics_counts(local_id).get("pending")
                )
            ),
        )

    def wait_registered(self, local_id: str, timeout: float) -> bool:
        """``True`` once the platform has the run (created or attached, and
        its dashboard address known) or creating it failed for good;
        ``False`` when the time ran out first."""
        return self._wait(
            local_id,
            timeout,
            lambda run: (
                run.mode != "online"
                or run.create_state == "failed"
                or (run.create_state == "created" and run.url is not None)
            ),
        )

    def wait_closed(
        self, local_id: str, timeout: float, *, cut_short: Callable[[], bool] | None = None
    ) -> RunRow | None:
        """The run once it is closed (or the deadline passes). A run the
        platform has not acknowledged since it started, with an error
        recorded (it could not be reached, or refused for now), waits only
        ``UNREACHABLE_FINISH_WAIT`` more from the moment that is known, and
        says so: its episodes are safe in the spool, and ``push`` delivers
        them later. ``cut_short()`` says to stop waiting at once (a Ctrl-C
        during ``finish()``)."""
        deadline = time.monotonic() + max(0.0, timeout)
        shortened = False

        def over(run: RunRow) -> bool:
            nonlocal deadline, shortened
            if run.settled:
                return True
            now = time.monotonic()
            if not shortened and _unacknowledged(run) and deadline - now > UNREACHABLE_FINISH_WAIT:
                shortened = True
                deadline = now + UNREACHABLE_FINISH_WAIT
                logger.warning(
                    "Run %s: the platform has not acknowledged it since it started (%s). "
                    "Waiting %.0fs more for it, not the %.0fs finish timeout; then its episodes "
                    "stay in %s for `prime-runs-otel push %s`.",
                    shown(local_id),
                    shown(run.last_error),
                    UNREACHABLE_FINISH_WAIT,
                    timeout,
                    shown(str(self.spool.path)),
                    shown(local_id),
                )
            return now >= deadline

        self._wait(local_id, timeout, over, cut_short)
        return self.spool.reading.run(local_id)

    def _wait(
        self,
        local_id: str,
        timeout: float,
        done: Callable[[RunRow], bool],
        cut_short: Callable[[], bool] | None = None,
    ) -> bool:
        deadline = time.monotonic() + max(0.0, timeout)
        delay = 0.01
        while True:
            run = self.spool.reading.run(local_id)
            if run is not None and done(run):
                return True
            if run is not None and run.stopped:
                return False
            if time.monotonic() >= deadline or (cut_short is not None and cut_short()):
                return False
            self._delivery.wake()
            time.sleep(min(delay, max(0.0, deadline - time.monotonic())))
            delay = min(delay * 2, 0.2)


def _unacknowledged(run: RunRow) -> bool:
    """An online run the platform has not taken, with the error that holds
    it up recorded, and no answer at all from the platform since the run
    started (see :mod:`.platform.watch`). A platform that answers, if only
    "not now" (429, 503), is waited for the whole finish timeout."""
    return (
        run.mode == "online"
        and run.create_state != "created"
        and run.last_error is not None
        and not WATCH.answered_since(run.created_at)
    )


def _exit_status() -> tuple[str, str | None]:
    """How the producer is ending: an unhandled exception (recorded by the
    interpreter in ``sys.last_value`` before exit handlers run) is a failure."""
    exc = getattr(sys, "last_value", None) or getattr(sys, "last_exc", None)
    if exc is None:
        return "completed", None
    if isinstance(exc, KeyboardInterrupt):
        return "cancelled", "interrupted"
    return "failed", f"{type(exc).__name__}: {exc}"
