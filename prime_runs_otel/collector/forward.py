"""Spans of runs another ``serve`` of the fleet owns, sent on to their owner.

With ``--fleet-dir`` every run has one owner (``deliver/fleet.py``). A
request can still bring this ``serve`` spans of a run it does not own: the
load balancer's backend list changed mid-run, a gateway came back with a
new address. Those spans are forwarded, in OTLP/HTTP, to the owner, and the
request is answered only once the owner has committed them, as if they had
been committed here: so the owner holds the whole run (every episode once
in one spool, one create, one close with the right count), and no second
``serve`` ever holds a part of it to create or to time out as crashed.

When the owner cannot be reached (restarting, overloaded), the request is
answered with a retryable status: the collector keeps it on disk and sends
it again, as it would for this ``serve`` itself.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

import httpx
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.trace.v1.trace_pb2 import ResourceSpans

from .. import semconv
from .._text import shown
from ..deliver.fleet import Fleet, FleetError

logger = logging.getLogger(__name__)

#: Header of a forwarded request: its spans are committed where they arrive,
#: never forwarded again (two members that disagree cannot bounce a request).
FORWARDED_HEADER = "x-prime-runs-otel-forwarded"
#: How long the owner may take to commit a forwarded request.
FORWARD_TIMEOUT = 120.0


class ForwardFailed(Exception):
    """The owner did not take the spans now; the sender should retry."""


@dataclass
class Routed:
    """A request split by owner: ``local`` is committed here, the rest was
    forwarded; ``rejected`` spans and ``messages`` are the owners' partial
    refusals, reported to the sender with this ``serve``'s own."""

    local: ExportTraceServiceRequest
    rejected: int = 0
    messages: list[str] = field(default_factory=list)
    forwarded_spans: int = 0


class FleetRouter:
    """Splits each request by run owner and forwards what is not ours."""

    def __init__(self, fleet: Fleet, token: str | None) -> None:
        self.fleet = fleet
        headers = {"content-type": "application/x-protobuf", FORWARDED_HEADER: fleet.name}
        if token:
            headers["authorization"] = f"Bearer {token}"
        self._client = httpx.Client(headers=headers, timeout=FORWARD_TIMEOUT)

    def route(self, request: ExportTraceServiceRequest) -> Routed:
        """Forward the spans of runs other members own; what is left is ours.
        Raises :class:`ForwardFailed` (retry the whole request) when the fleet
        folder or an owner cannot answer now."""
        try:
            owners = [self._owner(resource_spans) for resource_spans in request.resource_spans]
        except FleetError as exc:
            raise ForwardFailed(
                f"the fleet folder cannot be read now ({exc}); retry later"
            ) from exc
        if all(owner == self.fleet.name for owner in owners):
            return Routed(request)
        local = ExportTraceServiceRequest()
        foreign: dict[str, ExportTraceServiceRequest] = {}
        for resource_spans, owner in zip(request.resource_spans, owners, strict=True):
            target = (
                local if owner == self.fleet.name else foreign.setdefault(owner, local.__class__())
            )
            target.resource_spans.append(resource_spans)
        routed = Routed(local)
        for owner, part in foreign.items():
            self._forward(owner, part, routed)
        return routed

    def close(self) -> None:
        self._client.close()

    def _owner(self, resource_spans: ResourceSpans) -> str:
        """The owner of the run these spans belong to; spans of no run stay
        here (they are refused here, as anywhere)."""
        for pair in resource_spans.resource.attributes:
            if pair.key == semconv.RUN_ID:
                key = pair.value.string_value
                return self.fleet.owner_of(key) if key else self.fleet.name
        return self.fleet.name

    def _forward(self, owner: str, part: ExportTraceServiceRequest, routed: Routed) -> None:
        spans = sum(len(s.spans) for r in part.resource_spans for s in r.scope_spans)
        address = self.fleet.address_of(owner)
        if address is None:
            raise ForwardFailed(
                f"run spans belong to serve {owner!r}, which the fleet folder has no address "
                "for (it never started?); retry later"
            )
        body = part.SerializeToString()
        try:
            answer = self._client.post(f"{address.rstrip('/')}/v1/traces", content=body)
        except httpx.HTTPError as exc:
            self.fleet.address_of(owner, fresh=True)  # it may have come back elsewhere
            raise ForwardFailed(
                f"run spans belong to serve {owner!r} at {address}, which cannot be reached "
                f"({type(exc).__name__}); retry later"
            ) from exc
        if answer.status_code == 400:
            # The owner can never take them; neither could this serve.
            routed.rejected += spans
            routed.messages.append(f"{spans} span(s) refused by their run's owner {owner!r}")
            return
        if answer.status_code != 200:
            raise ForwardFailed(
                f"run spans belong to serve {owner!r}, which answered {answer.status_code} "
                f"({shown(answer.text, 200)}); retry later"
            )
        response = ExportTraceServiceResponse.FromString(answer.content)
        if response.partial_success.rejected_spans:
            routed.rejected += response.partial_success.rejected_spans
            routed.messages.append(response.partial_success.error_message)
        routed.forwarded_spans += spans
        logger.debug("Forwarded %d span(s) to their owner %s", spans, owner)
