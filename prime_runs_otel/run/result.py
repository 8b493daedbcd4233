"""What a run reports: :class:`RunResult` (what ``finish()`` knows when it
returns), and the run's methods that read where its delivery stands
without ending it (``snapshot``, ``wait_registered``, ``commit``,
``wait_delivered``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..deliver.advice import next_step
from ..errors import PrimeRunsOtelError
from .state import RunState

TERMINAL_STATUSES = ("completed", "failed", "cancelled", "crashed")


class RunFinishedError(PrimeRunsOtelError):
    """An episode was recorded on a run that already finished."""


@dataclass(frozen=True)
class RunResult:
    """What ``finish()`` knows when it returns."""

    local_id: str
    status: str
    closed: bool
    mode: str
    platform_id: str | None
    url: str | None
    episodes: int
    pending: int
    uncertain: int
    failed: int
    corrupt: int
    spool_path: str
    error: str | None = None
    #: Delivery stopped on a permanent refusal: nothing more happens until the
    #: cause is fixed and the run pushed again (``next_step`` says how).
    stopped: bool = False
    #: Of ``failed``: episodes refused at the spool's size cap, never stored.
    rejected: int = 0
    #: Episodes handed to ``record_episode`` whose record could not be encoded
    #: on the producer thread (each was logged with its id); never stored.
    unencodable: int = 0

    @property
    def next_step(self) -> str | None:
        """The command that moves the run on, when it needs one."""
        if self.stopped:
            return next_step(self.local_id, self.error)
        if self.pending or self.left_open:
            return f"`prime-runs-otel push {self.local_id}`"
        return None

    @property
    def left_open(self) -> bool:
        """Ended here but not closed on the platform yet (the wait ran out,
        or a Ctrl-C cut it short): ``push`` closes it."""
        return self.mode == "online" and not self.closed and self.status in TERMINAL_STATUSES

    def describe(self) -> str:
        where = self.url or (f"platform run {self.platform_id}" if self.platform_id else None)
        if self.mode == "local":
            where = (
                f"the local store ({self.spool_path}); see `prime-runs-otel show {self.local_id}`"
            )
        elif where is None and not self.closed and self.mode == "online":
            where = f"kept locally in {self.spool_path}: the platform has not acknowledged it"
        state = "closed" if self.closed else "NOT closed yet"
        text = (
            f"run {self.local_id} {self.status}, {state}: {self.episodes} episode(s), "
            f"{self.pending} pending, {self.uncertain} uncertain, {self.failed} failed, "
            f"{self.corrupt} corrupt"
        )
        if where:
            text += f" — {where}"
        if self.unencodable:
            text += (
                f". {self.unencodable} episode(s) could not be encoded and were not recorded"
                " (each is named in a warning above)"
            )
        if self.stopped:
            stopped = (self.error or "").rstrip(". ")
            text += f". Delivery stopped: {stopped}. Next: {self.next_step}"
        elif self.error:
            text += f". Last error: {self.error}"
        if not self.stopped and self.pending:
            text += f". Pending episodes stay in the spool: {self.next_step}"
        elif not self.stopped and self.left_open:
            text += f". Not closed on the platform yet: {self.next_step} closes it"
        return text


class RunReports(RunState):
    """Where the run's delivery stands, read from the spool."""

    #: What finish() returned, once it did.
    result: RunResult | None

    def snapshot(self, status: str | None = None) -> RunResult:
        """Where the run's delivery stands right now, read from the spool
        without waiting: what a progress display shows while episodes stream."""
        return self._describe(status or ("running" if not self._finished else "completed"), None)

    def wait_registered(self, timeout: float) -> RunResult:
        """Flush the run's spans and wait (up to ``timeout``) until the platform
        has the run, or refused it for good; a local run is there at once.
        For callers that must hand out the platform's run id before the first
        episode, as prime-runs' ``init()`` does."""
        self._handoff.drain()
        self._provider.force_flush()
        if self.settings.mode == "online":
            self._exporter.wait_registered(self.id, timeout)
        return self.snapshot()

    def commit(self) -> None:
        """Everything recorded and logged so far is in the spool (or with the
        run's other exporters) once this returns, delivered or not: what a
        SIGKILL afterwards cannot take. Blocks for one export; call it off
        any thread whose latency matters."""
        self._handoff.drain()
        self._provider.force_flush()

    def wait_delivered(self, timeout: float) -> bool:
        """Flush the run's spans and wait (up to ``timeout``) until the
        platform has confirmed everything recorded so far."""
        self._handoff.drain()  # episodes handed over become spans first
        self._provider.force_flush()
        if self.settings.mode != "online":
            return True
        return self._exporter.wait_delivered(self.id, timeout)

    def _describe(self, status: str, run: Any) -> RunResult:
        settings = self.settings
        if settings.mode == "disabled":
            recorded = self._recorded - self._unencodable
            return RunResult(
                self.id, status, True, "disabled", None, None, recorded, 0, 0, 0, 0, ""
            )
        spool = self._exporter.spool
        run = run or spool.reading.run(self.id)
        if run is None:
            return RunResult(
                self.id, status, False, settings.mode, None, None, 0, 0, 0, 0, 0, str(spool.path)
            )
        return RunResult(
            local_id=self.id,
            status=run.end_status or status,
            closed=run.closed,
            mode=run.mode,
            platform_id=run.platform_id,
            url=run.url,
            episodes=run.episodes,
            # A local run's episodes are stored, not waiting: nothing is pending
            # until somebody pushes it.
            pending=spool.reading.pending_count(self.id) if run.mode == "online" else 0,
            uncertain=run.uncertain,
            failed=run.failed + run.rejected + self._exporter.lost(self.id),
            corrupt=run.corrupt,
            spool_path=str(spool.path),
            error=run.last_error,
            stopped=run.stopped,
            rejected=run.rejected + self._exporter.lost(self.id),
        )
