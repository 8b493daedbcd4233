"""The MeterProvider and LoggerProvider a run uses beside its TracerProvider,
as ``OTEL_METRICS_EXPORTER`` and ``OTEL_LOGS_EXPORTER`` say.

The names are the SDK's (``otlp``, which follows
``OTEL_EXPORTER_OTLP_[METRICS_|LOGS_]PROTOCOL``, ``console``, or any
installed exporter's entry point), read as the SDK's configurator reads them,
with one difference: unset means none. The SDK defaults to ``otlp`` there,
but a run that nobody asked to report metrics or events must not start
sending them to a collector that is not there.

When they name exporters and the process already has an SDK provider of
that signal (``opentelemetry-instrument``: the SDK's configurator built it
from the same variables), the run reports through it, as any
instrumentation does, rather than open a second pipeline to the same place;
the process flushes it at exit. Otherwise the run opens its own, with the
run's Resource, and shuts it down when the run finishes.
"""

from __future__ import annotations

import os
from typing import Any, Literal

from opentelemetry import metrics
from opentelemetry._logs import get_logger_provider
from opentelemetry.sdk._logs import LoggerProvider
from opentelemetry.sdk._logs.export import BatchLogRecordProcessor, LogRecordExporter
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import (
    MetricExporter,
    MetricReader,
    PeriodicExportingMetricReader,
)
from opentelemetry.sdk.resources import Resource

from .errors import ConfigError
from .exporter_names import load_exporter_class

__all__ = [
    "logger_provider_from_env",
    "meter_provider_from_env",
    "run_logger_provider",
    "run_meter_provider",
]

Signal = Literal["metrics", "logs"]
_VARIABLE = {"metrics": "OTEL_METRICS_EXPORTER", "logs": "OTEL_LOGS_EXPORTER"}


#: A provider, and whether the run opened it (and so shuts it down).
Opened = tuple[Any, bool]


def run_meter_provider(resource: Resource) -> Opened:
    """The run's MeterProvider: ``None`` when ``OTEL_METRICS_EXPORTER``
    names nothing, the process's SDK MeterProvider when it has one, else a
    new one (opened)."""
    if not _names("metrics"):
        return None, False
    current = metrics.get_meter_provider()
    if isinstance(current, MeterProvider):
        return current, False
    return meter_provider_from_env(resource), True


def run_logger_provider(resource: Resource) -> Opened:
    """The run's LoggerProvider, as :func:`run_meter_provider` chooses."""
    if not _names("logs"):
        return None, False
    current = get_logger_provider()
    if isinstance(current, LoggerProvider):
        return current, False
    return logger_provider_from_env(resource), True


def meter_provider_from_env(resource: Resource) -> MeterProvider | None:
    """A MeterProvider exporting to what ``OTEL_METRICS_EXPORTER`` names
    (each exporter read periodically, ``OTEL_METRIC_EXPORT_INTERVAL``), or
    ``None`` when it names nothing."""
    readers: list[MetricReader] = []
    for exporter_class in _exporters("metrics"):
        if isinstance(exporter_class, type) and issubclass(exporter_class, MetricReader):
            readers.append(exporter_class())
        elif isinstance(exporter_class, type) and issubclass(exporter_class, MetricExporter):
            readers.append(PeriodicExportingMetricReader(exporter_class()))
        else:
            raise ConfigError(
                f"OTEL_METRICS_EXPORTER names {exporter_class!r}: not a metric exporter"
            )
    if not readers:
        return None
    return MeterProvider(resource=resource, metric_readers=readers)


def logger_provider_from_env(resource: Resource) -> LoggerProvider | None:
    """A LoggerProvider batching to what ``OTEL_LOGS_EXPORTER`` names, or
    ``None`` when it names nothing."""
    exporters = _exporters("logs")
    if not exporters:
        return None
    provider = LoggerProvider(resource=resource)
    for exporter_class in exporters:
        if not (isinstance(exporter_class, type) and issubclass(exporter_class, LogRecordExporter)):
            raise ConfigError(
                f"OTEL_LOGS_EXPORTER names {exporter_class!r}, which is not a log exporter"
            )
        provider.add_log_record_processor(BatchLogRecordProcessor(exporter_class()))
    return provider


def _names(signal: Signal) -> list[str]:
    """The exporter names the signal's variable gives (none when unset or ``none``)."""
    raw = os.environ.get(_VARIABLE[signal], "").strip()
    if not raw or raw.lower() == "none":
        return []
    return [name for name in (part.strip() for part in raw.split(",")) if name]


def _exporters(signal: Signal) -> list[Any]:
    """The exporter classes the signal's variable names."""
    return [load_exporter_class(name, signal, _VARIABLE[signal]) for name in _names(signal)]
