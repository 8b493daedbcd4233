"""The steps of a run's platform lifecycle that eval and training runs share:
recording that the platform has the run (or refused it for good), deciding
that the run is whole and may close, and closing it.

An eval run is closed through the evaluations API, a training run through
the RFT API, but the decision is the same: a completed run is finalized; a
run attached to by id that ended otherwise is left to its launcher (which
sees the process exit and marks the failure itself); any other is closed
with its terminal status. A permanent refusal gives the run up (``push``
tries again); a retryable one propagates, for the uploader to pause the run.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from .platform.http import PlatformError
from .spool import RunRow, Spool

logger = logging.getLogger(__name__)

#: After the end span, how long a run may go without news before it closes
#: although episodes its end span counts have not arrived (in process, where
#: the end comes after the episodes, only a span the SDK dropped is missing).
#: ``serve`` waits longer (``--straggler-wait``): behind a collector the end
#: can come first, and the rest follows the collector's next retry.
STRAGGLER_WAIT = 30.0


class RunLifecycle(Protocol):
    """What the uploader asks of each kind of run (``eval_run.py``,
    ``training_run.py``). Each call finishes its step, records a permanent
    failure on the run, or raises :class:`~.backoff.Backoff`."""

    def create(self, run: RunRow) -> None:
        """Have the platform hold the run, exactly once."""
        ...

    def deliver(self, run: RunRow) -> None:
        """Advance the created run: its episodes, then its close once it
        ended and is whole."""
        ...


class RunLeftSpool(Exception):
    """The run is no longer in the spool while a step was delivering it.

    Only a fleet member's spool loses runs under its uploader: a run leaves
    with its Kafka partition when the partition goes to another member,
    which delivers it from there (what was begun is in the run's state)."""


def reload(spool: Spool, run: RunRow) -> RunRow:
    """``run`` as the spool holds it now."""
    fresh = spool.reading.run(run.local_id)
    if fresh is None:
        raise RunLeftSpool(run.local_id)
    return fresh


def mark_created(
    spool: Spool, run: RunRow, platform_id: str, url: str, *, name: str | None, what: str
) -> None:
    """The platform has the run as ``platform_id`` (``what``: how the log
    names it), shown at ``url``; ``name`` is the platform's name for it, if
    it gave one."""
    spool.delivery.update_run(
        run.local_id,
        platform_id=platform_id,
        url=url,
        create_state="created",
        name=name or run.name,
    )
    logger.info("Run %s is %s %s: %s", run.local_id, what, platform_id, url)


def fail_create(spool: Spool, run: RunRow, reason: str) -> None:
    """The platform will not have the run (``reason``) until somebody acts:
    it stops being delivered, and ``push`` tries again."""
    logger.error(
        "Run %s cannot be created on the platform: %s. Its episodes stay in the spool "
        "(%s); fix the cause and run `prime-runs-otel push %s`.",
        run.local_id,
        reason.rstrip(". "),  # the sentence goes on: one period, not two
        spool.path,
        run.local_id,
    )
    spool.delivery.update_run(
        run.local_id,
        create_state="failed",
        last_error=reason,
        close_state="gave_up" if run.end_status else run.close_state,
    )


@dataclass(frozen=True)
class StragglerWait:
    """When an ended run whose episodes have not all arrived may close anyway.

    The end span says how many episodes the producer recorded. Behind a
    collector the end can arrive before some of them (a queue with several
    consumers, a retry after a restart), so an ended run waits until every
    episode it counts is stored, or until it has had no news for
    ``seconds``: no span of the run arrived, and this process was up, for
    that long. Time the spool spent with nobody delivering from it (a
    ``serve`` that was down) does not count, since the stragglers could not
    arrive then either: the wait starts again at ``since``, when this
    process began delivering.
    """

    seconds: float = STRAGGLER_WAIT
    since: float = field(default_factory=time.time)
    #: Whether episodes come through a collector, which sends again what it
    #: sent before (a retry: a duplicate) and what the spool refused (it was
    #: answered "retry"): neither counts as arrived there, or the run would
    #: close before episodes still on their way. In process nothing is sent
    #: again: a duplicate is an episode the producer recorded twice (and
    #: counted twice), and one refused at the spool arrived and is gone.
    behind_collector: bool = False

    def missing(self, run: RunRow) -> int:
        """Episodes the end span counts that have not arrived. A damaged
        record arrived (and was counted lost)."""
        if run.end_expected is None:
            return 0
        arrived = run.episodes + run.corrupt
        if not self.behind_collector:
            arrived += run.duplicates + run.rejected
        return max(0, run.end_expected - arrived)

    def ready_to_close(self, spool: Spool, run: RunRow) -> bool:
        """The ended ``run`` is not closed yet, nothing of it is pending, and
        every episode the producer recorded has arrived (or the wait for
        stragglers is over)."""
        if run.end_status is None or run.closed or spool.reading.pending_count(run.local_id):
            return False
        missing = self.missing(run)
        if not missing:
            return True
        quiet = time.time() - max(run.ended_at or 0.0, run.last_seen, self.since)
        if quiet < self.seconds:
            return False
        logger.warning(
            "Run %s: the producer recorded %d episode(s) but %d arrived, and none for %.0fs; "
            "closing it without the %d missing (any that still arrive are delivered late)",
            run.local_id,
            run.end_expected,
            (run.end_expected or 0) - missing,
            quiet,
            missing,
        )
        return True


def close_run(
    spool: Spool,
    run: RunRow,
    *,
    finalize: Callable[[], None],
    close_as: Callable[[str, str | None], None],
    prepare: Callable[[], bool] | None = None,
) -> None:
    """Finalize ``run`` or close it with its end status, and record the outcome.

    ``prepare()``, if given, runs first and returns ``True`` when it found
    the run closed already (an earlier attempt acted); ``finalize()`` and
    ``close_as(status, error)`` make the platform calls. Any of them may
    raise :class:`PlatformError`: a retryable error is raised again,
    untouched; any other leaves the run given up, with the error.
    """
    assert run.end_status is not None
    try:
        if prepare is not None and prepare():
            pass  # closed already: an earlier attempt acted
        elif run.end_status == "completed":
            finalize()
        elif run.identity.attach is not None:
            logger.info(
                "Run %s ended %s; an attached run's failure is marked by its launcher",
                run.local_id,
                run.end_status,
            )
        else:
            close_as(run.end_status, run.end_error)
    except PlatformError as exc:
        if exc.retryable:
            raise
        kind = "training" if run.kind == "train" else run.kind
        logger.error("Run %s: closing the %s run failed for good: %s", run.local_id, kind, exc)
        spool.delivery.update_run(run.local_id, close_state="gave_up", last_error=str(exc))
        return
    mark_closed(spool, run)


def mark_closed(spool: Spool, run: RunRow) -> None:
    """The run is closed where it lives (the platform acknowledged it).
    Its episodes are folded into the viewer's aggregates first (the rest
    ``Uploader._fold_behind`` left), so a finished run's first view has
    nothing to fold: ``finish()`` returns once the run is closed."""
    spool.reading.fold_behind(run.local_id, 0)
    spool.delivery.mark_closed(run.local_id)
    logger.info("Run %s closed as %s", run.local_id, run.end_status)
