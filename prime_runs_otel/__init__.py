"""prime-runs-otel: report eval and training runs to the Prime platform through
OpenTelemetry.

The short path is :func:`start_run`; code that owns its TracerProvider uses
the pieces: :func:`run_resource`, :func:`record_episode` and
:class:`PrimeRunsSpanExporter`.
"""

__version__ = "0.1.0"

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
