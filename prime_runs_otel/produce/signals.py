"""What a run reports besides its spans: GenAI events (the Logs API) and
metrics, each present only when the run has a provider for it.

A run's spans are what the platform reads; these are for the user's own
backends, so a run without a LoggerProvider or a MeterProvider builds none
of them and pays nothing.
"""

from __future__ import annotations

from dataclasses import dataclass

from opentelemetry._logs import LoggerProvider
from opentelemetry.metrics import MeterProvider

from .genai_events import GenAIEvents
from .run_metrics import RunMetrics

__all__ = ["NO_SIGNALS", "Signals"]


@dataclass(frozen=True)
class Signals:
    """A run's events and metrics; either may be ``None`` (not asked for)."""

    events: GenAIEvents | None = None
    metrics: RunMetrics | None = None

    @classmethod
    def of(
        cls,
        *,
        logger_provider: LoggerProvider | None = None,
        meter_provider: MeterProvider | None = None,
    ) -> Signals:
        """Events on ``logger_provider``'s logger, metrics on
        ``meter_provider``'s meter, both under this package's scope."""
        return cls(
            events=GenAIEvents.of(logger_provider) if logger_provider is not None else None,
            metrics=RunMetrics(meter_provider) if meter_provider is not None else None,
        )


NO_SIGNALS = Signals()
