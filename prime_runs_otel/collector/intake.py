"""Export requests → the one delivery into the spool: the part of ``serve``
that knows no transport.

The HTTP and gRPC fronts (and the Kafka member) hand a decoded request to
:class:`SpanIntake` and answer with the :class:`Verdict` it returns. What a
request's spans cost is decided in ``deliver/delivery.py``, by the rules the
in-process exporter follows too, for a sender that retries: a span that
cannot be read or stored is refused alone and counted (``partial_success``);
a failure of the disk itself keeps what nothing else would send again, and
readiness reports it until a commit succeeds; a request whose episodes do
not all fit (the spool's cap, its disk's reserve) is refused whole and
counted nowhere, and its sender retries it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Literal

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTracePartialSuccess,
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.trace.v1.trace_pb2 import ResourceSpans

from .. import semconv
from ..config import Settings
from ..deliver.batch_items import is_episode
from ..deliver.delivery import Sender, SpanDelivery, WatchedTrees
from ..deliver.spool import IngestOutcome, Spool
from ..deliver.uploader import Uploader
from ..read.otlp import span_views
from ..read.otlp_logs import SpanEvent
from ..read.spans import SpanView
from .counters import ServeCounters

#: How long an episode span without a record waits for the spans under it.
#: A collector batches and sends a trace's spans within seconds of each other
#: (its batch processor flushes every 200 ms by default, at most a few s).
DEFAULT_SETTLE_SECONDS = 5.0
#: Spans held for synthesis at most; past it the oldest trace is let go, its
#: episodes synthesised from what arrived and counted incomplete.
DEFAULT_MAX_HELD_SPANS = 100_000


# -- the transport-free core ----------------------------------------------------------


@dataclass(frozen=True)
class Verdict:
    """What to answer for one export request, whatever the transport.

    ``accepted``: committed (``rejected`` spans, if any, are reported as
    partial success); ``invalid``: nothing of it can ever be accepted;
    ``full`` / ``unavailable``: nothing was committed, retry after
    ``retry_after`` seconds.
    """

    outcome: Literal["accepted", "invalid", "full", "unavailable"]
    message: str = ""
    rejected: int = 0
    retry_after: int | None = None
    #: With ``--kafka``: when the request was handed to the producer, its
    #: records produced, the last acknowledged and its thread running again
    #: (``time.monotonic()``), for the stages ``/metrics`` reports.
    stamps: tuple[float, ...] = ()


class SpanIntake:
    """Export requests → :class:`.deliver.delivery.SpanDelivery`, shared by the
    HTTP and gRPC fronts and the Kafka member.

    Episode spans without a record wait in :attr:`trees` for the spans under
    them, which a collector may send in later requests; :meth:`release_settled`
    (on a timer) and :meth:`flush` (at shutdown) let them go. What a request
    costs, and when it is refused, is the delivery's one set of rules, for a
    sender that retries what it is refused; this adds the request's counters
    and its answer.
    """

    def __init__(
        self,
        spool: Spool,
        settings: Settings,
        uploader: Uploader | None,
        *,
        settle_seconds: float = DEFAULT_SETTLE_SECONDS,
        max_held_spans: int = DEFAULT_MAX_HELD_SPANS,
        allow_attach: bool = False,
        clock: Callable[[], float] = time.monotonic,
        handoff: Callable[[ExportTraceServiceRequest, bytes | None], Verdict] | None = None,
    ) -> None:
        self.spool = spool
        #: In a Kafka fleet: where requests go instead of this spool (the
        #: member that owns a run's partition commits its spans, see
        #: :mod:`.kafka_member`).
        self.handoff = handoff
        #: What /metrics reports of this process.
        self.counters = ServeCounters()
        self.settings = settings
        self.delivery = SpanDelivery(
            spool,
            settings,
            uploader,
            Sender(retries=True, in_process=False, allow_attach=allow_attach),
            trees=WatchedTrees(
                settle_seconds=settle_seconds, max_spans=max_held_spans, clock=clock
            ),
            on_commit=self._count_commit,
            clock=clock,
        )
        self.trees = self.delivery.trees

    @property
    def commit_problem(self) -> str | None:
        """Why the last commit failed, until one succeeds: readiness says so."""
        return self.delivery.commit_problem

    def has_room(self) -> bool:
        """Under the spool's cap, and short of its disk's reserve."""
        return self.spool.housekeeping.has_room()

    def accept(
        self, request: ExportTraceServiceRequest, *, owned: bool = False, wire: bytes | None = None
    ) -> Verdict:
        """Commit ``request`` (in a fleet: hand it to Kafka); ``owned``: it
        comes from Kafka, for runs this member delivers, so it is committed
        here; ``wire``: the request's own protobuf encoding, when it came as
        one (a fleet member may produce those bytes instead of encoding it again)."""
        if self.handoff is not None and not owned:
            verdict = self.handoff(request, wire)
        else:
            verdict = self._deliver(span_views(request))
        self._count(verdict, 1, lambda: _episode_spans_in(request))
        return verdict

    def accept_consumed(self, records: Sequence[Sequence[SpanView]]) -> Verdict:
        """Commit the spans of records a Kafka member read for the runs it
        delivers (each record's spans read once, by the member), all in one
        pass and one spool transaction, as one request carrying all their
        spans would be: what a pass costs (the checks of the spool's room,
        the run rows, the statements per run) is paid once for them, not
        once per record. Counted as ``len(records)`` requests."""
        verdict = self._deliver(view for views in records for view in views)
        self._count(verdict, len(records), lambda: _episodes_among(records))
        return verdict

    def _deliver(self, views: Iterable[SpanView]) -> Verdict:
        delivered = self.delivery.deliver(views)
        return Verdict(
            delivered.outcome, delivered.message, delivered.refused, delivered.retry_after
        )

    def _count(self, verdict: Verdict, requests: int, episodes: Callable[[], int]) -> None:
        """``requests`` taken with ``verdict``; ``episodes`` says how many
        episode spans they carried (counted only when they are refused whole)."""
        self.counters.add("requests_total", requests, outcome=verdict.outcome)
        if verdict.outcome == "accepted":
            self.counters.add("episodes_refused_total", verdict.rejected, reason="refused_alone")
        else:
            self.counters.add("episodes_refused_total", episodes(), reason=verdict.outcome)

    def held_episode_ids(self) -> dict[str, set[str]]:
        """The episodes held in the span buffer now, by run key: not in the
        spool yet, so not delivered (a Kafka fleet commits no offset past them)."""
        return self.delivery.held_episode_ids()

    def add_span_events(self, events: Iterable[SpanEvent]) -> int:
        """Events sent apart from their spans (OTLP log records, see
        :mod:`.logs_intake`): each joins its span in the buffer, and reaches
        the episode's record when the episode is synthesised. How many there
        were."""
        count = 0
        with self.delivery.lock:
            for item in events:
                self.trees.add_event(item.trace_id, item.span_id, item.event)
                count += 1
        return count

    def release_settled(self) -> None:
        """Commit the episodes that waited long enough for their spans."""
        self.delivery.release_settled()

    def flush(self) -> None:
        """Commit every episode still held (the process is stopping)."""
        self.delivery.flush()

    def _count_commit(self, outcome: IngestOutcome) -> None:
        self.counters.add("episodes_stored_total", outcome.stored)
        self.counters.add("episodes_duplicate_total", outcome.duplicates)
        self.counters.add("episodes_accepted_total", outcome.stored + outcome.duplicates)


def _episodes_among(records: Sequence[Sequence[SpanView]]) -> int:
    """How many of the records' spans are episodes (counted when they are refused whole)."""
    return sum(is_episode(view) for views in records for view in views)


def _episode_spans_in(request: ExportTraceServiceRequest) -> int:
    """How many spans of ``request`` are episodes (counted when it is refused whole)."""
    return sum(episode_spans(resource_spans) for resource_spans in request.resource_spans)


def episode_spans(resource_spans: ResourceSpans) -> int:
    """How many spans of one Resource's are episodes (they carry an episode id)."""
    count = 0
    for scope_spans in resource_spans.scope_spans:
        for span in scope_spans.spans:
            if any(
                pair.key in (semconv.EPISODE_ID, semconv.EPISODE_EXAMPLE_ID)
                for pair in span.attributes
            ):
                count += 1
    return count


def wire_text(message: str) -> str:
    """``message`` as text protobuf can carry: a message may quote the
    client's input, lone surrogates and all."""
    return message.encode("utf-8", "backslashreplace").decode("utf-8")


def export_response(verdict: Verdict) -> ExportTraceServiceResponse:
    response = ExportTraceServiceResponse()
    if verdict.rejected or verdict.message:
        response.partial_success.CopyFrom(
            ExportTracePartialSuccess(
                rejected_spans=verdict.rejected, error_message=wire_text(verdict.message)
            )
        )
    return response
