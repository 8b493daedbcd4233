"""``start_run()``: one run, its own TracerProvider and exporter, in one call.

The pieces are public (``run_resource``, ``record_episode``,
``PrimeRunsSpanExporter``) for code that owns its TracerProvider; this
package is the short path for code that just wants its episodes on the
platform. One module per stage of a run's life:

- ``start``: ``start_run()``, its options resolved and its pipeline wired;
  ``providers``: the run's TracerProvider, MeterProvider and LoggerProvider.
- ``recording``: :class:`Run`, the handle the caller holds, and recording
  episodes, step metrics and step tables into it.
- ``ending``: finishing it (``finish()``, a ``with`` block, the exit hook),
  with ``ctrl_c``: a Ctrl-C meanwhile hurries the end, never cuts it.
- ``result``: :class:`RunResult`, and what the run reports of its delivery
  without ending it.
- ``state``: the attributes every one of those classes reads, declared once.
"""

from __future__ import annotations

from .ending import (
    DRAIN_WAIT,
    INTERRUPTED,
    INTERRUPTED_DRAIN_WAIT,
    INTERRUPTED_LOCAL_WAIT,
    INTERRUPTED_PLATFORM_WAIT,
)
from .providers import CHILD_SPANS_ENV, RunProviders, RunTracerProvider, run_tracer
from .recording import Run
from .result import TERMINAL_STATUSES, RunFinishedError, RunResult
from .start import start_run

__all__ = [
    "CHILD_SPANS_ENV",
    "DRAIN_WAIT",
    "INTERRUPTED",
    "INTERRUPTED_DRAIN_WAIT",
    "INTERRUPTED_LOCAL_WAIT",
    "INTERRUPTED_PLATFORM_WAIT",
    "TERMINAL_STATUSES",
    "Run",
    "RunFinishedError",
    "RunProviders",
    "RunResult",
    "RunTracerProvider",
    "run_tracer",
    "start_run",
]
