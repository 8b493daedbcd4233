"""``prime-runs-otel serve`` and ``prime-runs-otel replay --otlp-endpoint``: the
two command-line ends of the collector path.

``serve`` receives OTLP from a collector (or from producers directly) and
runs the exporter core behind it. ``replay --otlp-endpoint`` is the producer
side of the same path: it sends a recorded run as OTLP spans instead of
exporting it in process, which is also how to check a collector deployment
with real data before pointing an eval at it.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from opentelemetry.exporter.otlp.proto.http import Compression
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

from .. import semconv
from .._text import configure_logging
from ..collector.bodies import DECODE_EXPANSION
from ..collector.intake import DEFAULT_MAX_HELD_SPANS, DEFAULT_SETTLE_SECONDS
from ..collector.receiver import (
    DEFAULT_IDLE_TIMEOUT,
    DEFAULT_MAX_BODY_BYTES,
    DEFAULT_MEMORY_BYTES,
    DEFAULT_READ_TIMEOUT,
    DEFAULT_SHUTDOWN_GRACE,
    DEFAULT_WORKERS,
    TOKEN_ENV,
    TRACES_PATH,
    MiB,
    ReceiverConfig,
    run_receiver,
)
from ..config import resolve_settings
from ..errors import PrimeRunsOtelError
from ..produce.instrument import (
    emit_run_end,
    emit_run_start,
    normalize_config,
    record_episode,
    run_resource,
)
from ..produce.traces_jsonl import environments_of, read_records, traces_file

__all__ = [
    "add_otlp_replay_option",
    "add_serve_command",
    "add_serve_options",
    "cmd_serve",
    "main",
    "replay_command_over_otlp",
    "replay_over_otlp",
]

EXIT_OK, EXIT_INCOMPLETE, EXIT_USAGE = 0, 1, 2

#: A replay batch closes at this many spans or bytes of attributes, whichever
#: comes first: a run of 20 MiB episodes must not become one giant request.
REPLAY_BATCH_SPANS = 512
REPLAY_BATCH_BYTES = 16 * MiB


# -- serve -------------------------------------------------------------------------


def add_serve_command(subparsers: Any) -> None:
    """Add ``serve`` to the ``prime-runs-otel`` command parser."""
    serve = subparsers.add_parser(
        "serve",
        help="receive OTLP (from a collector) and report the runs in it",
        description="Receive OTLP/HTTP and OTLP/gRPC spans, typically from an OpenTelemetry "
        "Collector, and deliver the runs in them like the in-process exporter does.",
    )
    add_serve_options(serve)
    serve.set_defaults(func=cmd_serve)


def add_serve_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on")
    parser.add_argument("--http-port", type=int, default=4318, help="OTLP/HTTP port (0: any)")
    parser.add_argument("--grpc-port", type=int, default=4317, help="OTLP/gRPC port (0: any)")
    parser.add_argument("--no-grpc", action="store_true", help="serve OTLP/HTTP only")
    parser.add_argument(
        "--token",
        default=os.environ.get(TOKEN_ENV) or None,
        help=f"bearer token clients must send (default: ${TOKEN_ENV}); required when "
        "listening beyond loopback",
    )
    parser.add_argument(
        "--max-body-mib",
        type=float,
        default=DEFAULT_MAX_BODY_BYTES / MiB,
        help="largest request accepted, after decompression (default: %(default)g)",
    )
    parser.add_argument(
        "--idle-timeout",
        type=float,
        default=DEFAULT_IDLE_TIMEOUT,
        help="seconds without spans after which a run with no end span is closed as "
        "crashed (default: %(default)g)",
    )
    parser.add_argument(
        "--shutdown-grace",
        type=float,
        default=DEFAULT_SHUTDOWN_GRACE,
        help="seconds in-flight requests get to finish on SIGTERM (default: %(default)g)",
    )
    parser.add_argument(
        "--memory-mib",
        type=float,
        default=DEFAULT_MEMORY_BYTES / MiB,
        help=f"memory the requests being decoded may take together, counted as "
        f"{DECODE_EXPANSION}x each decompressed body; more waits its turn (default: %(default)g)",
    )
    parser.add_argument(
        "--read-timeout",
        type=float,
        default=DEFAULT_READ_TIMEOUT,
        help="seconds a request body may take to arrive in full (default: %(default)g)",
    )
    parser.add_argument(
        "--settle-seconds",
        type=float,
        default=DEFAULT_SETTLE_SECONDS,
        help="how long an episode span without a record waits for the rest of its span "
        "tree before its record is synthesised (default: %(default)g)",
    )
    parser.add_argument(
        "--max-held-spans",
        type=int,
        default=DEFAULT_MAX_HELD_SPANS,
        help="spans held in memory while span trees complete (default: %(default)d)",
    )
    parser.add_argument(
        "--workers",
        type=int,
        default=DEFAULT_WORKERS,
        help="requests decoded and committed at once (default: %(default)d)",
    )
    parser.add_argument(
        "--spool-dir", help="spool folder (default: $PRIME_RUNS_OTEL_DIR or ~/.prime/runs-otel)"
    )


def cmd_serve(args: argparse.Namespace) -> int:
    config = ReceiverConfig(
        host=args.host,
        http_port=args.http_port,
        grpc_port=None if args.no_grpc else args.grpc_port,
        token=args.token,
        max_body_bytes=int(args.max_body_mib * MiB),
        idle_timeout=args.idle_timeout,
        shutdown_grace=args.shutdown_grace,
        workers=args.workers,
        read_timeout=args.read_timeout,
        memory_bytes=int(args.memory_mib * MiB),
        settle_seconds=args.settle_seconds,
        max_held_spans=args.max_held_spans,
    )
    settings = resolve_settings(spool_dir=args.spool_dir)
    run_receiver(config, settings)
    return EXIT_OK


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m prime_runs_otel.serve``: the ``serve`` command on its own."""
    parser = argparse.ArgumentParser(
        prog="prime-runs-otel serve", description="Receive OTLP and report the runs in it."
    )
    add_serve_options(parser)
    parser.add_argument("-v", "--verbose", action="store_true", help="log delivery details")
    args = parser.parse_args(argv)
    configure_logging(
        level=logging.DEBUG if args.verbose else logging.INFO,
        fmt="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    # One line per platform request drowns the receiver's own messages.
    logging.getLogger("httpx").setLevel(logging.DEBUG if args.verbose else logging.WARNING)
    try:
        return cmd_serve(args)
    except PrimeRunsOtelError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USAGE


# -- replay over OTLP --------------------------------------------------------------------


def add_otlp_replay_option(replay_parser: argparse.ArgumentParser) -> None:
    """Add ``--otlp-endpoint`` (and its token) to ``prime-runs-otel replay``."""
    replay_parser.add_argument(
        "--otlp-endpoint",
        metavar="URL",
        help="send the spans over OTLP/HTTP to this endpoint (a collector, or `serve`) "
        f"instead of exporting in process; {TRACES_PATH} is added when the URL has no path",
    )
    replay_parser.add_argument(
        "--otlp-token",
        default=os.environ.get(TOKEN_ENV) or None,
        help=f"bearer token for the OTLP endpoint (default: ${TOKEN_ENV})",
    )


def replay_command_over_otlp(args: argparse.Namespace) -> int:
    """``replay`` with ``--otlp-endpoint``, from the replay command's arguments."""
    return replay_over_otlp(
        args.path,
        args.otlp_endpoint,
        name=args.name,
        model=args.model,
        environments=args.environment,
        framework=args.framework,
        config_file=args.config,
        token=args.otlp_token,
        timeout=args.timeout,
    )


def replay_over_otlp(
    path: str | os.PathLike[str],
    endpoint: str,
    *,
    name: str | None = None,
    model: str | None = None,
    environments: Sequence[str] | None = None,
    framework: str | None = "verifiers",
    config_file: str | os.PathLike[str] | None = None,
    token: str | None = None,
    timeout: float = 60.0,
    run_id: str | None = None,
) -> int:
    """Send a verifiers ``traces.jsonl`` as one run's spans to an OTLP endpoint.

    Returns 0 when every span was accepted by the endpoint, 1 otherwise. The
    endpoint's acceptance is all that can be known from here: delivery to the
    platform is the receiving ``serve``'s job.
    """
    source = traces_file(Path(path))
    bad_lines: list[str] = []
    records = read_records(source, bad_lines)
    first = next(records, None)
    resource = run_resource(
        run_id=run_id,
        name=name or source.resolve().parent.name,
        model=model,
        environments=list(environments or environments_of(first)),
        framework=framework,
    )
    exporter = _CountingExporter(
        OTLPSpanExporter(
            endpoint=traces_endpoint(endpoint),
            headers={"authorization": f"Bearer {token}"} if token else None,
            timeout=timeout,
            compression=Compression.Gzip,
        )
    )
    provider = TracerProvider(resource=resource)
    provider.add_span_processor(_BlockingBatchProcessor(exporter))
    tracer = provider.get_tracer("prime_runs_otel.replay")
    emit_run_start(tracer, normalize_config(None, config_file=config_file))
    sent = 0
    for record in _chain(first, records):
        try:
            record_episode(tracer, record)
        except PrimeRunsOtelError as exc:
            bad_lines.append(f"episode {record.get('id')!r}: {exc}")
            continue
        sent += 1
    emit_run_end(tracer, "completed", episodes_recorded=sent)
    provider.shutdown()
    local_id = str(resource.attributes[semconv.RUN_ID])
    for problem in bad_lines:
        print(f"error: {problem}", file=sys.stderr)
    print(
        f"run {local_id}: {sent} episode(s) sent to {traces_endpoint(endpoint)}, "
        f"{exporter.failed_spans} span(s) refused or not delivered"
    )
    if exporter.failed_spans:
        print(
            "some spans were not accepted: check the endpoint's log, then replay again "
            "with the same file (episodes already stored are not stored twice)",
            file=sys.stderr,
        )
    return EXIT_OK if not exporter.failed_spans and not bad_lines else EXIT_INCOMPLETE


def traces_endpoint(url: str) -> str:
    """``http://host:4318`` → ``http://host:4318/v1/traces``; a URL with a path
    is used as given (a collector may route on it)."""
    parsed = urlsplit(url)
    if parsed.scheme not in ("http", "https") or not parsed.netloc:
        raise PrimeRunsOtelError(
            f"--otlp-endpoint {url!r} is not an http(s) URL; write it as http://host:4318"
        )
    return url.rstrip("/") + TRACES_PATH if not parsed.path.strip("/") else url


class _CountingExporter(SpanExporter):
    """Counts spans the endpoint did not accept, which the SDK would forget."""

    def __init__(self, inner: SpanExporter) -> None:
        self._inner = inner
        self.failed_spans = 0

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        result = self._inner.export(spans)
        if result is not SpanExportResult.SUCCESS:
            self.failed_spans += len(spans)
        return result

    def shutdown(self) -> None:
        self._inner.shutdown()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return self._inner.force_flush(timeout_millis)


class _BlockingBatchProcessor(SpanProcessor):
    """Batches spans and exports on the recording thread.

    A replay produces spans far faster than HTTP carries them; the SDK's
    BatchSpanProcessor would drop what overflows its queue, while blocking
    here slows the replay down to the endpoint's pace and loses nothing.
    """

    def __init__(self, exporter: SpanExporter) -> None:
        self._exporter = exporter
        self._spans: list[ReadableSpan] = []
        self._bytes = 0
        self._lock = threading.Lock()

    def on_end(self, span: ReadableSpan) -> None:
        with self._lock:
            self._spans.append(span)
            self._bytes += _attribute_bytes(span)
            if len(self._spans) >= REPLAY_BATCH_SPANS or self._bytes >= REPLAY_BATCH_BYTES:
                self._export_locked()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        with self._lock:
            self._export_locked()
        return True

    def shutdown(self) -> None:
        self.force_flush()
        self._exporter.shutdown()

    def _export_locked(self) -> None:
        if self._spans:
            self._exporter.export(self._spans)
        self._spans = []
        self._bytes = 0


def _attribute_bytes(span: ReadableSpan) -> int:
    total = 0
    for value in (span.attributes or {}).values():
        if isinstance(value, str):
            total += len(value)
        elif isinstance(value, (tuple, list)):
            total += sum(len(item) for item in value if isinstance(item, str))
    return total


def _chain(
    first: dict[str, Any] | None, rest: Iterator[dict[str, Any]]
) -> Iterator[dict[str, Any]]:
    if first is not None:
        yield first
    yield from rest


if __name__ == "__main__":
    sys.exit(main())
