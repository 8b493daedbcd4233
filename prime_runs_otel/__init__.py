"""prime-runs-otel: report eval and training runs to the Prime platform through
OpenTelemetry.

The short path is :func:`start_run`; code that owns its TracerProvider uses
the pieces: :func:`run_resource`, :func:`record_episode` and
:class:`PrimeRunsSpanExporter`.
"""

from __future__ import annotations

__version__ = "0.1.0"

# Not `from typing import TYPE_CHECKING`: importing typing costs a process
# that only installs the instrumentation's hook more than the hook itself.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from .config import Settings, resolve_settings
    from .errors import ConfigError, PrimeRunsOtelError, RecordError
    from .exporter import PrimeRunsSpanExporter
    from .produce.instrument import (
        emit_metrics,
        emit_run_end,
        emit_run_start,
        episode_span,
        normalize_config,
        record_episode,
        run_resource,
        score_episode,
    )
    from .run import Run, RunFinishedError, RunResult, start_run
    from .tracing import TracingExporter

#: Where each public name lives. Imported on first use: a launcher's start-up
#: hook imports this package in every Python process it starts (see
#: ``prime_runs_otel.instrumentation``), and most of them never report a run,
#: so they must not pay for the SDK, the spool and the platform clients.
_LOCATIONS = {
    "Settings": ".config",
    "resolve_settings": ".config",
    "ConfigError": ".errors",
    "PrimeRunsOtelError": ".errors",
    "RecordError": ".errors",
    "PrimeRunsSpanExporter": ".exporter",
    "emit_metrics": ".produce.instrument",
    "emit_run_end": ".produce.instrument",
    "emit_run_start": ".produce.instrument",
    "episode_span": ".produce.instrument",
    "normalize_config": ".produce.instrument",
    "record_episode": ".produce.instrument",
    "run_resource": ".produce.instrument",
    "score_episode": ".produce.instrument",
    "Run": ".run",
    "RunFinishedError": ".run",
    "RunResult": ".run",
    "start_run": ".run",
    "TracingExporter": ".tracing",
}


def __getattr__(name: str) -> Any:
    location = _LOCATIONS.get(name)
    if location is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(location, __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_LOCATIONS])


__all__ = [
    "ConfigError",
    "PrimeRunsOtelError",
    "PrimeRunsSpanExporter",
    "RecordError",
    "Run",
    "RunFinishedError",
    "RunResult",
    "Settings",
    "TracingExporter",
    "emit_metrics",
    "emit_run_end",
    "emit_run_start",
    "episode_span",
    "normalize_config",
    "record_episode",
    "resolve_settings",
    "run_resource",
    "score_episode",
    "start_run",
]
