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
    from .produce.episode import record_episode
    from .produce.resource import run_resource
    from .produce.run_config import normalize_config
    from .produce.run_spans import emit_metrics, emit_run_end, emit_run_start
    from .produce.traced_episode import episode_span, score_episode
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
    "emit_metrics": ".produce.run_spans",
    "emit_run_end": ".produce.run_spans",
    "emit_run_start": ".produce.run_spans",
    "episode_span": ".produce.traced_episode",
    "normalize_config": ".produce.run_config",
    "record_episode": ".produce.episode",
    "run_resource": ".produce.resource",
    "score_episode": ".produce.traced_episode",
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
