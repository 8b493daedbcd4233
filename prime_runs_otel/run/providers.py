"""The run's providers: its TracerProvider (whose own tracer no sampler
drops), and the MeterProvider and LoggerProvider beside it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from opentelemetry._logs import LoggerProvider
from opentelemetry.metrics import MeterProvider
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import (
    SpanLimits,
    SpanProcessor,
    SynchronousMultiSpanProcessor,
    TracerProvider,
)
from opentelemetry.sdk.trace.sampling import ALWAYS_ON
from opentelemetry.trace import Tracer

from .. import __version__
from .. import semconv as sc
from ..config import env_flag
from ..produce.signals import Signals
from ..providers import run_logger_provider, run_meter_provider

#: ``true`` / ``false`` forces the agent and model-call child spans on or off
#: for runs opened with ``start_run``; unset, they follow who is listening.
CHILD_SPANS_ENV = "PRIME_RUNS_OTEL_CHILD_SPANS"


class RunTracerProvider(TracerProvider):
    """The run's TracerProvider: it never lets a sampler drop the run's own
    spans, and knows whether anyone but the run reads them.

    The environment's sampler (``OTEL_TRACES_SAMPLER``) stays the provider's,
    for every tracer but the run's own (``prime_runs_otel``), whose spans are
    always sampled: an episode a sampler dropped would never reach the
    platform, and the run would close without it. A sampler is not told which
    tracer starts a span, so the run's tracer comes from a second provider
    built with ``ALWAYS_ON`` that shares this one's Resource, ids, limits and
    span processors (everything added here reaches its spans too).

    The platform needs only the episode span (it carries the whole record);
    the agent and model-call spans under it exist for tracing backends, and
    cost several times more than the episode span to build and export. So a
    run emits them only once a span processor of somebody else's is added
    (``run.tracer_provider.add_span_processor(...)``), unless told otherwise.
    """

    def __init__(self, *, resource: Resource) -> None:
        processors = SynchronousMultiSpanProcessor()  # type: ignore[no-untyped-call]
        limits = SpanLimits()
        super().__init__(resource=resource, active_span_processor=processors, span_limits=limits)
        self._own = TracerProvider(
            sampler=ALWAYS_ON,
            resource=resource,
            shutdown_on_exit=False,  # the processors are shared: shut down with this one
            active_span_processor=processors,
            id_generator=self.id_generator,
            span_limits=limits,
        )
        self.processors_added = 0

    def add_span_processor(self, span_processor: SpanProcessor) -> None:
        super().add_span_processor(span_processor)
        self.processors_added += 1

    def get_tracer(
        self,
        instrumenting_module_name: str,
        instrumenting_library_version: str | None = None,
        schema_url: str | None = None,
        attributes: Any = None,
    ) -> Tracer:
        owner: TracerProvider = self
        if instrumenting_module_name == sc.INSTRUMENTATION_SCOPE:
            owner = self._own
        return TracerProvider.get_tracer(
            owner,
            instrumenting_module_name,
            instrumenting_library_version,
            schema_url,
            attributes,
        )


def run_tracer(provider: TracerProvider) -> Tracer:
    """The run's own tracer: this package's scope, version and schema URL."""
    return provider.get_tracer(sc.INSTRUMENTATION_SCOPE, __version__, schema_url=sc.SCHEMA_URL)


def child_spans_setting(argument: bool | None) -> bool | None:
    """``start_run``'s argument, else ``PRIME_RUNS_OTEL_CHILD_SPANS``, else None (follow)."""
    return argument if argument is not None else env_flag(CHILD_SPANS_ENV)


@dataclass
class RunProviders:
    """The run's MeterProvider and LoggerProvider, and what finishing the run
    does to each: a provider the run opened is shut down (its last metrics
    and events go out); one the caller gave is flushed and stays the
    caller's; the process's own (``opentelemetry-instrument``'s) is left to
    the process, which flushes it at exit."""

    meter: MeterProvider | None = None
    logger: LoggerProvider | None = None
    opened: tuple[object, ...] = ()
    given: tuple[object, ...] = ()

    @classmethod
    def open(
        cls,
        resource: Resource,
        meter: MeterProvider | None,
        logger: LoggerProvider | None,
        *,
        disabled: bool,
    ) -> RunProviders:
        if disabled:
            return cls()
        opened: list[object] = []
        given = [provider for provider in (meter, logger) if provider is not None]
        if meter is None:
            meter, made = run_meter_provider(resource)
            if made:
                opened.append(meter)
        if logger is None:
            logger, made = run_logger_provider(resource)
            if made:
                opened.append(logger)
        return cls(meter, logger, tuple(opened), tuple(given))

    def signals(self) -> Signals:
        return Signals.of(logger_provider=self.logger, meter_provider=self.meter)

    def close(self) -> None:
        for provider in (self.meter, self.logger):
            if any(provider is own for own in self.opened):
                step = "shutdown"
            elif any(provider is theirs for theirs in self.given):
                step = "force_flush"
            else:
                continue
            method = getattr(provider, step, None)
            if callable(method):
                method()
