"""What every part of a :class:`~.recording.Run` holds, declared once: the
run is one object whose methods live by lifecycle in the modules of this
package (recording, ending, results), each a class in the chain ``Run`` →
``RunEnding`` → ``RunReports`` → ``RunState``; ``Run.__init__`` sets all of it.
What one stage alone holds (``_ending``, ``result``) is declared with it."""

from __future__ import annotations

import threading
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.trace import SpanContext, Tracer

from ..config import Settings
from ..exporter import PrimeRunsSpanExporter
from ..produce.handoff import Handoff
from .providers import RunProviders

#: What ``Run.record_episode`` hands to the producer thread: the episode (or
#: its record), its id, whether it gets child spans, and the caller's context.
_Handed = tuple[Any, str, bool, otel_context.Context]


class RunState:
    """The attributes of a run, and its settings."""

    id: str
    kind: str
    #: The run-start span's context, which the run's other spans link to.
    start_link: SpanContext | None
    _provider: TracerProvider
    _exporter: PrimeRunsSpanExporter
    _tracer: Tracer
    _providers: RunProviders
    _handoff: Handoff[_Handed]
    _lock: threading.Lock
    _finished: bool
    _owns_lifecycle: bool
    _forked: bool
    _recorded: int
    _unencodable: int
    _finish_timeout: float

    @property
    def settings(self) -> Settings:
        return self._exporter.settings
