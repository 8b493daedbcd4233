"""One OTLP export call, whichever front carried it: authenticated, admitted,
decoded within the memory budget, and handed to its signal's intake.

The HTTP and gRPC fronts only speak their transport: they read the bearer
token, the body and the call count their way, ask :class:`ExportCalls` what
to do, and turn the :class:`.intake.Verdict` (or the :class:`.bodies.BodyError`)
into their own status. What a call must carry, how many are taken at once,
what decoding may cost and where a decoded request goes are decided here
once, so both fronts answer the same call the same way.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from ..read.otlp import OtlpDecodeError, OtlpTooManyValues
from .admission import admitted_calls, overload_log
from .bodies import (
    JSON_TYPE,
    LOGS_REQUEST,
    BodyError,
    DecodeBudget,
    WireLayout,
    bearer_matches,
    decode_body,
    decode_cost,
    too_many_values,
    values_bound,
)
from .intake import SpanIntake, Verdict, export_response
from .logs_intake import LogIntake, decode_logs_body, logs_response
from .receiver_config import ReceiverConfig

logger = logging.getLogger(__name__)

#: The retry hint of a request that could not be decoded for want of memory,
#: or whose body arrived too slowly: the cause may last a while.
SLOW_BODY_RETRY_AFTER = 5


class CallReceiver(Protocol):
    """What the calls need of the process behind the fronts
    (:class:`.receiver.Receiver`), named here so they need not import it."""

    config: ReceiverConfig
    memory: DecodeBudget
    intake: SpanIntake
    logs: LogIntake


@dataclass(frozen=True)
class Signal:
    """One OTLP service: how its requests decode, where they go, and how an
    accepted one is answered."""

    #: How its values are counted off the wire (None: a trace request's).
    layout: WireLayout | None
    decode: Callable[[bytes, str, int], Any]
    #: Takes the decoded request, and ``wire=`` its own protobuf bytes (``None``: it came as JSON).
    accept: Callable[..., Verdict]
    respond: Callable[[Verdict], Any]


class ExportCalls:
    """Authentication, admission and decoding of export calls, for one front."""

    def __init__(self, receiver: CallReceiver, front: str) -> None:
        self._config = receiver.config
        self._memory = receiver.memory
        self._counters = receiver.intake.counters
        self._front = front
        self.traces = Signal(None, decode_body, receiver.intake.accept, export_response)
        self.logs = Signal(LOGS_REQUEST, decode_logs_body, receiver.logs.accept, logs_response)
        #: Export calls this front takes at once; more are told to come back.
        self.limit = admitted_calls(self._config.workers)
        self._overload = overload_log(front, self.limit)

    def authenticated(self, authorization: str | None) -> bool:
        """The call carries serve's bearer token (or serve has none)."""
        return bearer_matches(authorization, self._config.token)

    def admits(self, held: int) -> bool:
        """Whether a call is taken while the front holds ``held`` others; a
        refusal is logged (quietly) and counted."""
        if held < self.limit:
            return True
        self._overload.happened()
        self._counters.add("requests_total", outcome="overloaded")
        return False

    def take(self, signal: Signal, data: bytes, content_type: str) -> Verdict:
        """Decode ``data`` (uncompressed) within the memory budget and hand
        the request to ``signal``'s intake. A body that cannot be taken
        raises :class:`BodyError` (its status in HTTP terms)."""
        limit = self._config.max_values
        values = values_bound(data, content_type, limit, signal.layout)
        with self._memory.reserve(decode_cost(len(data), values)):
            try:
                request = signal.decode(data, content_type, limit)
            except OtlpTooManyValues:
                raise too_many_values(limit) from None
            except OtlpDecodeError as exc:
                raise BodyError(400, str(exc)) from None
            except MemoryError:
                # This process's state, not the request's fault: an error
                # answer that is not retried would drop the batch.
                logger.error("Decoding an %s request ran out of memory; it is retried", self._front)
                raise BodyError(
                    503,
                    "serve ran out of memory decoding the request; retry later (or lower "
                    "serve's --memory-mib so requests wait their turn instead)",
                    retry_after=SLOW_BODY_RETRY_AFTER,
                ) from None
            return signal.accept(request, wire=None if content_type == JSON_TYPE else data)
