"""The run ``prime_runs.init(...)`` hands back: prime-runs' ``Run``, as its
callers use it (verifiers' ``vf-eval --push`` and its dashboard, training
loops), over this package's delivery.

Its state comes from the delivery: delivered in process, its attributes read
the spool, so a progress display sees what is pending, failed or refused at
that moment; behind a collector, this process knows only what it sent.
"""

from __future__ import annotations

import atexit
import logging
import os
import threading
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Literal

import prime_runs as pr

from ..._json import clean_metric_values
from ...errors import PrimeRunsOtelError
from ..delivery import Delivery
from .run_spec import RunSpec

__all__ = ["InstrumentedRun"]

logger = logging.getLogger(__name__)

#: Records this package could not take, under ``failed_records``.
SINK_NAME = "prime-runs-otel"
CRASHED_ERROR = "process exited without finishing the run"


class InstrumentedRun:
    """prime-runs' ``Run``, as its callers use it, reported through this package.

    Like prime-runs: ``finish()`` sets the status before it drains (a caller
    aborting meanwhile sees the run is already closing), a ``with`` block
    ends as completed, failed on an exception, cancelled on Ctrl-C, and a
    process that exits without finishing reports the run crashed. Unlike
    it: what is not delivered by ``finish()``'s deadline stays in the spool
    instead of being lost (``prime-runs-otel push`` delivers it).
    """

    def __init__(self, delivery: Delivery, spec: RunSpec, *, on_error: str = "warn") -> None:
        self._delivery = delivery
        self._spec = spec
        self._on_error = on_error
        self._id = delivery.platform_id or delivery.local_id
        self._status = pr.RunStatus.RUNNING
        self._finished = False
        self._finishing = False
        self._state_lock = threading.Lock()
        self._finish_lock = threading.Lock()
        self._refused = 0
        self._notes: list[str] = []
        self._deferred: BaseException | None = None
        self._owner_pid = os.getpid()
        self.config: dict[str, Any] = dict(spec.config)
        self.summary: dict[str, Any] = {}
        atexit.register(self._on_process_exit)
        if self.url:
            logger.info("Run %s: %s", self.id, self.url)

    # -- identity and live state -------------------------------------------

    @property
    def id(self) -> str:
        """The platform's id once the platform had the run when ``init()``
        returned (as prime-runs gives it), else this package's run key."""
        return self._id

    @property
    def local_id(self) -> str:
        """This package's key for the run (``prime-runs-otel show`` takes it)."""
        return self._delivery.local_id

    @property
    def name(self) -> str | None:
        return self._spec.name

    @property
    def url(self) -> str | None:
        state = self._delivery.snapshot()
        return state.url if state is not None else None

    @property
    def config_source(self) -> Any:
        raw = self.config.get(pr.CONFIG_SOURCE_KEY)
        return pr.ConfigSource.from_mapping(raw) if isinstance(raw, Mapping) else None

    @property
    def mode(self) -> str:
        """``online``, or this package's ``local`` (kept in the local store)."""
        return self._delivery.mode

    @property
    def status(self) -> pr.RunStatus:
        return self._status

    @property
    def finished(self) -> bool:
        return self._finished

    @property
    def kind(self) -> str:
        return self._spec.kind

    @property
    def attached(self) -> bool:
        return self._spec.attach is not None

    @property
    def dropped_records(self) -> int:
        """Records that never reached the spool: refused at its size cap."""
        state = self._delivery.snapshot()
        return state.rejected if state is not None else 0

    @property
    def failed_records(self) -> dict[str, int]:
        """Records that will not reach the platform: refused at hand-off (not
        an episode), refused by the platform, corrupted in transit, or legacy
        rows whose upload may or may not have been stored."""
        state = self._delivery.snapshot()
        failed = self._refused
        if state is not None:
            failed += state.failed - state.rejected + state.corrupt + state.uncertain
        return {SINK_NAME: failed} if failed else {}

    @property
    def pending_records(self) -> int:
        """Episodes in the spool the platform has not confirmed yet."""
        state = self._delivery.snapshot()
        return state.pending if state is not None else 0

    @property
    def errors(self) -> list[str]:
        """What went wrong for good, as prime-runs lists it: a refusal the
        pipeline recorded on the run, and anything noted at hand-off or finish."""
        state = self._delivery.snapshot()
        errors = list(self._notes)
        # The run's last error also names a passing cause (a platform that
        # does not answer yet, a pause before a retry): an error for good
        # only once delivery stopped or episodes failed.
        if (
            state is not None
            and (state.stopped or state.failed > 0)
            and state.error
            and state.error not in errors
        ):
            errors.insert(0, state.error)
        return errors

    def __repr__(self) -> str:
        return f"<Run id={self.id!r} mode={self.mode!r} status={self._status.value}>"

    # -- records -------------------------------------------------------------

    def log_episodes(self, episodes: Iterable[Any]) -> None:
        """Episodes (verifiers ``Episode`` objects or their records) become spans
        now, on this thread; one that is not an episode is refused alone."""
        self._require_live("log_episodes")
        batch = list(episodes)
        with self._state_lock:
            self._require_live("log_episodes")
        for episode in batch:
            try:
                self._delivery.record(episode)
            except PrimeRunsOtelError as exc:
                self._refused += 1
                self._note("recording an episode", exc)

    def log_traces(self, traces: Iterable[Any]) -> None:
        raise NotImplementedError(
            "log_traces() is not reported through prime-runs-otel: log whole episodes "
            "(run.log_episodes), which carry their traces"
        )

    def log_metrics(self, values: Mapping[str, Any], *, step: int | None = None) -> None:
        """One training step's metrics (a no-op for evals, as in prime-runs)."""
        self._require_live("log_metrics")
        if self.kind != "train":
            return
        row = dict(values)
        if step is not None:
            row.setdefault("step", step)
        try:
            self._delivery.metrics(row, None)
        except PrimeRunsOtelError as exc:
            self._note("logging metrics", exc)

    def update_summary(self, values: Mapping[str, Any]) -> None:
        with self._state_lock:
            self._require_live("update_summary")
            self.summary.update(clean_metric_values(values))

    def flush(self, timeout: float | None = 30.0) -> bool:
        """Everything logged so far is durable in the spool once this returns
        (in process); ``True`` if nothing is left waiting for the platform."""
        flushed = self._delivery.flush(30.0 if timeout is None else max(0.0, timeout))
        self._raise_deferred()
        return flushed

    # -- the end ---------------------------------------------------------------

    def finish(
        self,
        summary: Mapping[str, Any] | None = None,
        *,
        status: pr.RunStatus | str = pr.RunStatus.COMPLETED,
        error: str | None = None,
        timeout: float | None = None,
    ) -> None:
        """End the run and wait (up to ``timeout``) for its delivery. The
        run's summary is the caller's, as with prime-runs (verifiers passes
        ``prime_runs.metrics.from_episodes`` over its episodes)."""
        with self._finish_lock:
            if self._finished:
                return
            resolved = pr.RunStatus(status)
            if not resolved.is_terminal():
                raise ValueError(f"finish() requires a terminal status, got {resolved.value!r}")
            with self._state_lock:
                self._finishing = True
                self._status = resolved
            if summary:
                self.summary.update(clean_metric_values(summary))
            try:
                self._finish_once(resolved, error, timeout)
            finally:
                with self._state_lock:
                    self._finishing = False
                    self._finished = True
                atexit.unregister(self._on_process_exit)
        self._raise_deferred()

    def _finish_once(self, status: pr.RunStatus, error: str | None, timeout: float | None) -> None:
        if os.getpid() != self._owner_pid:
            # A forked child: what it recorded is flushed, the run is the parent's.
            self._delivery.end(status.value, error, timeout, self.summary)
            return
        try:
            result = self._delivery.end(
                status.value, error or _first(self._notes), timeout, self.summary
            )
        except Exception as exc:
            self._note("finishing the run", exc)
            return
        if result is not None and result.mode == "online" and (result.pending or not result.closed):
            self._notes.append(
                f"{result.pending} episode(s) not delivered yet and the run not closed; nothing "
                f"is lost: they stay in {result.spool_path} and `prime-runs-otel push "
                f"{result.local_id}` delivers them"
            )

    def fail(self, error: str | BaseException, *, timeout: float | None = None) -> None:
        message = f"{type(error).__name__}: {error}" if isinstance(error, BaseException) else error
        self.finish(status=pr.RunStatus.FAILED, error=str(message), timeout=timeout)

    def __enter__(self) -> InstrumentedRun:
        return self

    def __exit__(self, exc_type: Any, exc: Any, traceback: Any) -> Literal[False]:
        if exc_type is None:
            self.finish()
            return False
        if isinstance(exc, (KeyboardInterrupt, _cancelled())):
            status, message = pr.RunStatus.CANCELLED, "interrupted"
        else:
            status, message = pr.RunStatus.FAILED, f"{exc_type.__name__}: {exc}"
        try:
            self.finish(status=status, error=message)
        except Exception as finish_error:
            logger.warning("Run %s: finishing after %s failed: %s", self.id, exc, finish_error)
        return False

    def _on_process_exit(self) -> None:
        if self._finished or os.getpid() != self._owner_pid:
            return
        logger.warning("Run %s was never finished; reporting it as crashed", self.id)
        try:
            self.finish(
                status=pr.RunStatus.CRASHED, error="process exited without finishing the run"
            )
        except Exception as exc:
            logger.warning("Run %s: reporting the crash failed: %s", self.id, exc)

    def _require_live(self, operation: str) -> None:
        if self._finishing or self._finished:
            raise pr.RunFinishedError(
                f"{operation}() was called on run {self.id}, which is already finished; "
                "start a new run"
            )

    def _note(self, what: str, exc: BaseException) -> None:
        message = f"{what} failed: {type(exc).__name__}: {exc}"
        self._notes.append(message)
        if self._on_error == "raise":
            if self._deferred is None:
                self._deferred = exc
        else:
            logger.warning("Run %s: %s", self.id, message)

    def _raise_deferred(self) -> None:
        exc, self._deferred = self._deferred, None
        if exc is not None:
            raise exc


def _first(items: Sequence[str]) -> str | None:
    return items[0] if items else None


def _cancelled() -> type[BaseException]:
    import asyncio

    return asyncio.CancelledError
