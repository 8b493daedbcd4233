"""What a refusal from the platform is about, and so what it may cost.

Every failed request is one of three things, and each has its own remedy:

- **about the moment** (``PlatformError.retryable``: a transport error,
  408, 425, 429, 5xx): the run pauses and the same request goes again
  (``backoff.py``), for as long as it takes.
- **about what was sent** (400, 413, 422, except the 400s below about how
  the request was made): the episodes or rows in the request. One bad
  episode refuses a whole request, so a refused request of several episodes
  is sent again in halves (:class:`Narrowing`) until the episode responsible
  is alone; only that one fails, counted on its run with the answer.
- **about the set-up** (401, 402, 403, 404, 405, 409, a redirect, any other
  4xx, and the 400s that concern how the request was built rather than what
  it carries): a key, an address, an account or this release is wrong, and
  nothing in the episodes is. The run's delivery stops
  (:class:`StopDelivery`): its episodes are kept pending, the run is not
  closed, and the answer is recorded with the step that fixes it, for
  ``finish()``, ``show`` and ``doctor`` to print. ``prime-runs-otel push
  RUN`` delivers it once the cause is fixed.

So no episode is ever failed, and no run ever finalized without its
episodes, for a reason that is not about those episodes.
"""

from __future__ import annotations

import logging

from .._text import shown
from .advice import next_step
from .platform.http import PlatformError
from .spool import RunRow, Spool

logger = logging.getLogger(__name__)

#: Answers about the content of the request: the episodes or rows it carries.
CONTENT_STATUSES = frozenset({400, 413, 422})
#: Prime Traces 400s about how the request was built (its metadata part, its
#: key, its encoding, its declared format): this release and the service
#: disagree, or something between them rewrote the request. Every episode
#: would be refused the same way, alone or not.
REQUEST_CODES = frozenset(
    {
        "invalid_metadata",
        "invalid_idempotency_key",
        "unsupported_schema_version",
        "line_format_mismatch",
        "malformed_encoding",
        "digest_mismatch",
    }
)


def about_content(exc: PlatformError) -> bool:
    """Whether the refusal is about what was sent, so that sending less of
    it (or leaving one episode out) is the remedy."""
    return not exc.retryable and exc.status in CONTENT_STATUSES and exc.code not in REQUEST_CODES


class StopDelivery(Exception):
    """Stop the run's delivery until somebody acts; ``reason`` says why, and
    the run keeps every episode it has."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def refused_setup(exc: PlatformError, what: str) -> StopDelivery:
    """The stop for a set-up refusal of ``what`` (e.g. "the Prime Traces upload")."""
    return StopDelivery(
        f"{what} was refused, and not because of the episodes ({exc}); they are kept"
    )


def stop_run(spool: Spool, run: RunRow, reason: str) -> None:
    """Record that the run's delivery stopped on ``reason``: it leaves the
    delivery list, open, with every episode it holds, until ``push``."""
    spool.delivery.update_run(run.local_id, close_state="gave_up", last_error=reason)
    logger.error(
        "Run %s: delivery stopped: %s. Next: %s",
        shown(run.local_id),
        shown(reason),
        next_step(run.local_id, reason),
    )


class Narrowing:
    """Per run, the most episodes one request may carry while a request
    refused for its content is narrowed down to the episode responsible:
    halved on each such refusal, doubled back on each success, so one bad
    episode among thousands costs a few requests, and the run then streams
    at full size again."""

    def __init__(self, largest: int) -> None:
        self._largest = largest
        self._limits: dict[str, int] = {}

    def limit(self, run_id: str) -> int:
        """The most episodes the run's next request may carry."""
        return self._limits.get(run_id, self._largest)

    def refused(self, run_id: str, sent: int) -> None:
        """A request of ``sent`` episodes (more than one) was refused whole."""
        self._limits[run_id] = max(1, sent // 2)

    def delivered(self, run_id: str) -> None:
        limit = self._limits.pop(run_id, None)
        if limit is not None and limit * 2 < self._largest:
            self._limits[run_id] = limit * 2
