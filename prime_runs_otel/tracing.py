"""``TracingExporter``: a run's spans to a tracing backend, without the
platform's payloads.

A tracing backend (Jaeger, Tempo, Phoenix, Langfuse, any OTLP endpoint) that
gets a run's spans as they are also gets every episode record: a blob of up to
64 MiB on each episode span, which no viewer shows and every OTLP hop pays
for. The OTLP/HTTP exporter drops a whole batch whose request exceeds its
``max_request_size`` (64 MiB), and a collector's gRPC receiver refuses
messages over 4 MiB by default, so with large records the backend would get
nothing of the run. Wrapping the backend's exporter in this one leaves out
the record and config blobs (the collector fan-out config does the same with
an attributes processor), shortens any other attribute value past a bound,
and hands the spans on in batches that stay under a request budget.

One concern per wrapper, in the spirit of small composable exporters: this
one changes what a span carries and how many go per call; retrying,
queueing and the wire stay with the wrapped exporter and its processor.
"""

from __future__ import annotations

import inspect
import os
from collections.abc import Iterator, Sequence
from typing import Any

from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

from . import semconv as sc
from .errors import ConfigError

__all__ = [
    "DEFAULT_MAX_BATCH_BYTES",
    "DEFAULT_MAX_VALUE_CHARS",
    "OTLPTracingExporter",
    "TracingExporter",
]

#: A collector's OTLP/gRPC receiver takes messages up to 4 MiB unless told
#: otherwise; staying under it keeps every default OTLP hop open.
DEFAULT_MAX_BATCH_BYTES = 4 * 1024 * 1024
#: Longest attribute text handed on (message content with capture on can be
#: a whole conversation); longer values are cut and marked.
DEFAULT_MAX_VALUE_CHARS = 256 * 1024
#: What a span costs on the wire besides its attribute values: ids, times,
#: names, keys; an estimate, generous on purpose.
_SPAN_OVERHEAD_BYTES = 512
_TRUNCATED = "…[truncated by prime-runs-otel]"

_BLOBS = (sc.EPISODE_RECORD, sc.RUN_CONFIG)
#: The platform's payloads: record and config blobs with their size and digest.
LEFT_OUT = frozenset(
    key for blob in _BLOBS for key in (blob, sc.blob_size_key(blob), sc.blob_sha256_key(blob))
)


class TracingExporter(SpanExporter):
    """Wraps a tracing backend's exporter (an ``OTLPSpanExporter``, say).

    Use it as one more span processor's exporter on a run's provider, or
    through :meth:`prime_runs_otel.Run.add_exporter`::

        run.add_exporter(OTLPSpanExporter(endpoint="http://127.0.0.1:6006/v1/traces"))

    ``max_batch_bytes`` bounds the estimated size of one call to the wrapped
    exporter; ``max_value_chars`` the length of any one attribute text.
    """

    def __init__(
        self,
        inner: SpanExporter,
        *,
        max_batch_bytes: int = DEFAULT_MAX_BATCH_BYTES,
        max_value_chars: int = DEFAULT_MAX_VALUE_CHARS,
    ) -> None:
        if max_batch_bytes < 1 or max_value_chars < 1:
            raise ValueError("max_batch_bytes and max_value_chars must be at least 1")
        self.inner = inner
        self.max_batch_bytes = max_batch_bytes
        self.max_value_chars = max_value_chars

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        slim = [self._slim(span) for span in spans]
        result = SpanExportResult.SUCCESS
        for batch in self._batches(slim):
            # Every batch is tried: one refused by the backend loses only itself.
            if self.inner.export(batch) is not SpanExportResult.SUCCESS:
                result = SpanExportResult.FAILURE
        return result

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return self.inner.force_flush(timeout_millis)

    def shutdown(self, timeout_millis: float | None = None) -> None:
        """Shut the wrapped exporter down, passing on the SDK's budget when
        it takes one (as the SDK's batch processor does with exporters)."""
        if timeout_millis is not None and takes_timeout(self.inner.shutdown):
            self.inner.shutdown(timeout_millis=timeout_millis)  # type: ignore[call-arg]
        else:
            self.inner.shutdown()

    # -- what a span carries ----------------------------------------------------

    def _slim(self, span: ReadableSpan) -> tuple[ReadableSpan, int]:
        """The span without the platform's payloads, and its estimated size."""
        attributes = span.attributes or {}
        size = _SPAN_OVERHEAD_BYTES
        kept: dict[str, Any] = {}
        changed = False
        for key, value in attributes.items():
            if key in LEFT_OUT:
                changed = True
                continue
            short = self._shorten(value)
            changed = changed or short is not value
            kept[key] = short
            size += len(key) + _value_size(short)
        for event in span.events:
            size += len(event.name) + sum(
                len(key) + _value_size(value) for key, value in (event.attributes or {}).items()
            )
        if not changed:
            return span, size
        copy = ReadableSpan(
            name=span.name,
            context=span.context,
            parent=span.parent,
            resource=span.resource,
            attributes=kept,
            events=span.events,
            links=span.links,
            kind=span.kind,
            status=span.status,
            start_time=span.start_time,
            end_time=span.end_time,
            instrumentation_scope=span.instrumentation_scope,
        )
        return copy, size

    def _shorten(self, value: Any) -> Any:
        limit = self.max_value_chars
        if isinstance(value, str):
            return value if len(value) <= limit else value[:limit] + _TRUNCATED
        if isinstance(value, (list, tuple)) and any(
            isinstance(item, str) and len(item) > limit for item in value
        ):
            return tuple(self._shorten(item) for item in value)
        return value

    def _batches(self, spans: list[tuple[ReadableSpan, int]]) -> Iterator[list[ReadableSpan]]:
        """Consecutive spans, cut where the next would pass the budget (a span
        over it on its own still goes, alone: its values are already bounded)."""
        batch: list[ReadableSpan] = []
        used = 0
        for span, size in spans:
            if batch and used + size > self.max_batch_bytes:
                yield batch
                batch, used = [], 0
            batch.append(span)
            used += size
        if batch:
            yield batch


class OTLPTracingExporter(TracingExporter):
    """OTLP to a tracing backend, configured by the standard
    ``OTEL_EXPORTER_OTLP_*`` variables, without the platform's payloads:
    OTLP/gRPC when ``OTEL_EXPORTER_OTLP_TRACES_PROTOCOL`` (else
    ``OTEL_EXPORTER_OTLP_PROTOCOL``) says ``grpc``, OTLP/HTTP (protobuf)
    otherwise.

    For zero-code set-ups, which name exporters instead of building them:
    ``OTEL_TRACES_EXPORTER=prime_runs,otlp_without_records`` feeds the platform
    and a tracing backend from the same spans.
    """

    def __init__(self) -> None:
        super().__init__(_otlp_span_exporter(_otlp_protocol()))


def _otlp_protocol() -> str:
    raw = os.environ.get(_TRACES_PROTOCOL_ENV) or os.environ.get(_PROTOCOL_ENV) or _HTTP
    protocol = raw.strip().lower()
    if protocol not in (_GRPC, _HTTP):
        variable = _TRACES_PROTOCOL_ENV if os.environ.get(_TRACES_PROTOCOL_ENV) else _PROTOCOL_ENV
        raise ConfigError(
            f"{variable}={raw!r} is not an OTLP protocol otlp_without_records speaks: "
            f"use {_GRPC} or {_HTTP}"
        )
    return protocol


def _otlp_span_exporter(protocol: str) -> SpanExporter:
    if protocol == _GRPC:
        try:
            from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import (
                OTLPSpanExporter as GrpcSpanExporter,
            )
        except ImportError:  # OTLP/gRPC is the user's choice, not a dependency
            raise ConfigError(
                "otlp_without_records speaks OTLP/gRPC here (OTEL_EXPORTER_OTLP_PROTOCOL=grpc), "
                "which needs `pip install opentelemetry-exporter-otlp-proto-grpc`; or set "
                "OTEL_EXPORTER_OTLP_PROTOCOL=http/protobuf for the backend's OTLP/HTTP endpoint"
            ) from None

        return GrpcSpanExporter()
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    return OTLPSpanExporter()


_PROTOCOL_ENV = "OTEL_EXPORTER_OTLP_PROTOCOL"
_TRACES_PROTOCOL_ENV = "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"
_GRPC = "grpc"
_HTTP = "http/protobuf"


def takes_timeout(shutdown: Any) -> bool:
    """Whether an exporter's ``shutdown`` takes ``timeout_millis`` (the SDK
    asks the same of the exporters it shuts down)."""
    try:
        return "timeout_millis" in inspect.signature(shutdown).parameters
    except (TypeError, ValueError):
        return False


def _value_size(value: Any) -> int:
    if isinstance(value, str):
        # isascii() is constant time in CPython; only other text is encoded.
        return len(value) if value.isascii() else len(value.encode("utf-8", "replace"))
    if isinstance(value, (list, tuple)):
        return sum(_value_size(item) + 2 for item in value)
    return 8
