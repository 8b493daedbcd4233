"""Where an instrumented run's spans go, as ``OTEL_TRACES_EXPORTER`` says,
and the pipeline each choice opens.

An instrumentation answers somebody else's API with a run of this package.
With ``prime_runs`` (or nothing set) the run is delivered in process, as
``start_run`` does: spool, then platform, and the run's state is read from
the spool, so a progress display sees what is pending, failed or refused at
that moment. With other exporters (``otlp`` to a collector and
``prime-runs-otel serve``) the spans go to them, which own delivery: this
process reports the run's boundaries and its episodes, and knows only what
it handed over. Every instrumentation chooses the same way, so it is done
here once.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

from opentelemetry.sdk.trace import SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter
from opentelemetry.trace import SpanContext

from .. import semconv as sc
from ..batching import CountedBatchProcessor, batch_processor
from ..config import Settings, env_flag
from ..exporter_names import entry_point_name, load_exporter_class
from ..produce.episode import record_episode
from ..produce.resource import run_resource
from ..produce.run_spans import emit_metrics, emit_run_end, emit_run_start, emit_step_table
from ..run import (
    CHILD_SPANS_ENV,
    Run,
    RunProviders,
    RunResult,
    RunTracerProvider,
    run_tracer,
    start_run,
)

__all__ = ["IN_PROCESS", "Delivery", "Exported", "InProcess", "exporter_names", "load_exporter"]

#: The exporter that keeps delivery in this process.
IN_PROCESS = "prime_runs"


def exporter_names() -> list[str]:
    """The exporters ``OTEL_TRACES_EXPORTER`` names, as the SDK reads it
    (``otlp`` follows ``OTEL_EXPORTER_OTLP_[TRACES_]PROTOCOL``). Unset means
    in process: whoever turned the instrumentation on wants this package."""
    raw = os.environ.get("OTEL_TRACES_EXPORTER", "").strip()
    if not raw:
        return [IN_PROCESS]
    if raw.lower() == "none":
        return []
    names = [name.strip() for name in raw.split(",") if name.strip()]
    return [entry_point_name(name, "traces") for name in names]


def load_exporter(name: str) -> SpanExporter:
    exporter_class = load_exporter_class(name, "traces", "OTEL_TRACES_EXPORTER")
    exporter: SpanExporter = exporter_class()
    return exporter


class Delivery:
    """What an instrumentation's run handle needs of a pipeline."""

    local_id: str
    platform_id: str | None = None

    def record(self, episode: Any) -> None:
        raise NotImplementedError

    def metrics(
        self, values: Mapping[str, Any], step: int | None, *, verbatim: bool = False
    ) -> None:
        """One metrics row; ``verbatim``: posted exactly as given (``emit_metrics``)."""
        raise NotImplementedError

    def step_table(self, step: int, body: bytes) -> None:
        """One Parquet object of a step's sample table, its ``run_id`` column
        empty (filled in with the platform's id when it is sent)."""
        raise NotImplementedError

    def end(
        self,
        status: str,
        error: str | None,
        timeout: float | None,
        summary: Mapping[str, Any],
    ) -> RunResult | None:
        raise NotImplementedError

    def snapshot(self) -> RunResult | None:
        return None

    def flush(self, timeout: float) -> bool:
        raise NotImplementedError

    @property
    def mode(self) -> str:
        return "online"


class InProcess(Delivery):
    """``start_run``'s pipeline: exporter, spool and uploader in this process."""

    def __init__(self, run: Run, attach: str | None) -> None:
        self.run = run
        self.local_id = run.id
        self.platform_id = attach

    @classmethod
    def open(
        cls,
        fields: Mapping[str, Any],
        config: Mapping[str, Any],
        settings: Settings,
        others: Sequence[SpanExporter],
    ) -> InProcess:
        """The run ``fields`` name (``run_resource``'s arguments), its spans
        also to the ``others`` exporters."""
        run = start_run(**fields, config=config, settings=settings)
        for exporter in others:
            run.tracer_provider.add_span_processor(BatchSpanProcessor(exporter))
        return cls(run, fields.get("attach"))

    def record(self, episode: Any) -> None:
        self.run.record_episode(episode)

    def metrics(
        self, values: Mapping[str, Any], step: int | None, *, verbatim: bool = False
    ) -> None:
        self.run.log_metrics(values, step=step, verbatim=verbatim)

    def step_table(self, step: int, body: bytes) -> None:
        self.run.add_step_table(step, body)

    def end(
        self,
        status: str,
        error: str | None,
        timeout: float | None,
        summary: Mapping[str, Any],
    ) -> RunResult | None:
        return self.run.finish(status, error, timeout=timeout, summary=summary)

    def snapshot(self) -> RunResult | None:
        return self.run.snapshot()

    def flush(self, timeout: float) -> bool:
        return self.run.wait_delivered(timeout)

    @property
    def mode(self) -> str:
        return self.run.settings.mode


class Exported(Delivery):
    """Spans to other exporters only (OTLP to a collector and ``serve``),
    which own delivery: this process reports the run's boundaries and its
    episodes, and knows only what it handed over."""

    def __init__(
        self,
        provider: TracerProvider,
        processors: Sequence[SpanProcessor],
        *,
        kind: str,
        attach: str | None,
    ) -> None:
        self.provider = provider
        self.tracer = run_tracer(provider)
        self.local_id = str(provider.resource.attributes[sc.RUN_ID])
        self.platform_id = attach
        self.kind = kind
        self.recorded = 0
        self.child_spans = env_flag(CHILD_SPANS_ENV) is not False
        self._queues = [
            processor for processor in processors if isinstance(processor, CountedBatchProcessor)
        ]
        self._pid = os.getpid()
        #: The run's metrics and events beside its spans, and the run-start
        #: span the run's other spans link to.
        self.providers = RunProviders.open(provider.resource, None, None, disabled=False)
        self.signals = self.providers.signals()
        self.start_link: SpanContext | None = None

    @classmethod
    def open(
        cls,
        fields: Mapping[str, Any],
        config: Mapping[str, Any],
        exporters: Sequence[SpanExporter],
    ) -> Exported:
        """The run ``fields`` name (``run_resource``'s arguments), its spans
        to ``exporters``; its config sent at once."""
        resource = run_resource(**fields)
        # The run's own spans are never sampled away, as in process.
        provider = RunTracerProvider(resource=resource)
        processors: list[SpanProcessor] = []
        for exporter in exporters:
            processor = batch_processor(exporter)
            provider.add_span_processor(processor)
            processors.append(processor)
        kind, attach = fields.get("kind", "eval"), fields.get("attach")
        delivery = cls(provider, processors, kind=kind, attach=attach)
        delivery.start_link = emit_run_start(delivery.tracer, config)
        return delivery

    def record(self, episode: Any) -> None:
        for queue in self._queues:
            queue.wait_for_room()
        record_episode(
            self.tracer,
            episode,
            child_spans=self.child_spans,
            link=self.start_link,
            signals=self.signals,
        )
        self.recorded += 1

    def metrics(
        self, values: Mapping[str, Any], step: int | None, *, verbatim: bool = False
    ) -> None:
        if self.kind == "train":
            emit_metrics(
                self.tracer,
                values,
                step=step,
                link=self.start_link,
                metrics=self.signals.metrics,
                verbatim=verbatim,
            )

    def step_table(self, step: int, body: bytes) -> None:
        if self.kind == "train":
            emit_step_table(self.tracer, step, body, link=self.start_link)

    def end(
        self,
        status: str,
        error: str | None,
        timeout: float | None,
        summary: Mapping[str, Any],
    ) -> RunResult | None:
        if os.getpid() == self._pid:  # a forked child leaves the run to its parent
            emit_run_end(
                self.tracer,
                status,
                error,
                episodes_recorded=self.recorded,
                summary=summary,
                link=self.start_link,
            )
        budget = 30.0 if timeout is None else max(0.0, timeout)
        self.provider.force_flush(int(budget * 1000))
        self.provider.shutdown()
        self.providers.close()
        return None

    def flush(self, timeout: float) -> bool:
        return self.provider.force_flush(int(timeout * 1000))
