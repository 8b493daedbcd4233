"""What became of a batch of spans, and who sent it: the values
:class:`~.delivery.SpanDelivery` answers with and the few rules that differ
by sender, for each entry point (the exporter, ``serve``'s intake) to
translate into its own answer (a ``SpanExportResult``, an HTTP or gRPC
status), and the words the refusals are told in."""

from __future__ import annotations

import logging
import sqlite3
from dataclasses import dataclass
from typing import Literal

from .. import semconv
from .._text import shown
from .spool import SpoolError

logger = logging.getLogger(__name__)

#: Retry hint when the spool is at its cap: delivery frees room at the pace of
#: the platform, so retrying sooner only repeats the refusal.
FULL_RETRY_AFTER = 30
#: Retry hint when a commit failed (a locked or briefly unavailable disk).
COMMIT_RETRY_AFTER = 5

#: Commit failures of the disk or the database, not of what was committed.
TRANSIENT = (SpoolError, sqlite3.OperationalError, OSError, MemoryError)


@dataclass(frozen=True)
class Sender:
    """Who sends the spans: the few rules that follow from it, and nothing
    else, differ between entry points."""

    #: It sends again what is refused (an OTLP client): a batch whose new
    #: episodes do not all fit, or whose commit the disk failed, is refused
    #: whole and counted nowhere. Else what is not kept is counted lost.
    retries: bool
    #: The spans come from this process: it is registered as the runs'
    #: producer (its death marks them crashed), and its run ends are its own.
    #: Else (``serve``) the producers are remote, and a run end from another
    #: producer than the run's owner is refused.
    in_process: bool
    #: ``False``: a process feeding a run somebody else owns (see the spool).
    owns_runs: bool = True
    #: Runs may name a platform run to attach to (``prime.run.attach``).
    allow_attach: bool = True


@dataclass(frozen=True)
class Delivered:
    """What became of one batch of spans, whatever the entry point.

    ``accepted``: committed (``refused`` spans, if any, refused alone and
    counted; ``lost`` episodes not kept, counted on their runs); ``invalid``:
    nothing of it can ever be accepted; ``full`` / ``unavailable``: not
    committed, to be sent again after ``retry_after`` seconds (or, for a
    sender that does not retry, ``lost`` episodes counted on their runs).
    """

    outcome: Literal["accepted", "invalid", "full", "unavailable"]
    message: str = ""
    refused: int = 0
    lost: int = 0
    retry_after: int | None = None

    @property
    def kept(self) -> bool:
        """Every episode of the batch is in the spool (stored, or there already)."""
        return self.outcome == "accepted" and self.lost == 0


def refusal_message(
    unattributed: int, corrupt: int, unreadable: int = 0, foreign: int = 0, attaching: int = 0
) -> str:
    parts = []
    if foreign:
        parts.append(
            f"{foreign} run end(s) from a producer that does not own the run (another "
            "service.instance.id than the run's start); the run stays open for its owner"
        )
    if attaching:
        parts.append(
            f"{attaching} span(s) of runs that ask to attach to a platform run "
            f"({semconv.RUN_ATTACH}); serve does so only when started with --allow-attach"
        )
    if unreadable:
        parts.append(
            f"{unreadable} span(s) or item(s) that could not be read or stored (the "
            "receiver's log names each and says why)"
        )
    if unattributed:
        parts.append(f"{unattributed} episode span(s) without {semconv.RUN_ID} on their Resource")
    if corrupt:
        parts.append(
            f"{corrupt} episode(s) that cannot be used, counted as lost on their run: a record "
            "damaged on the way (an attribute limit in an SDK or collector?), or an episode "
            "span with another run's ids; the receiver's log names each and says why"
        )
    return "; ".join(parts)


def log_foreign_ends(foreign: tuple[tuple[str, str], ...]) -> None:
    for key, sender in foreign[:5]:
        logger.warning(
            "Run %s: refused a run end from producer %s, which does not own the run; the "
            "run stays open for its owner (service.instance.id must match the one that "
            "started it)",
            shown(key),
            shown(sender or "(no service.instance.id)"),
        )
    if len(foreign) > 5:
        logger.warning("%d more run end(s) were refused the same way", len(foreign) - 5)
