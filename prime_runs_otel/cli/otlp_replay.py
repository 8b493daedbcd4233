"""``prime-runs-otel replay --otlp-endpoint`` (or ``--otlp``): a recorded run
sent as OTLP spans, the producer end of the collector path.

Instead of exporting in process, the replay sends the run's spans to a
collector or to ``serve``, which is also how to check a collector deployment
with real data before pointing an eval at it. Only the endpoint's acceptance
can be known from here: delivery to the platform is the receiving
``serve``'s job.
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
import threading
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from opentelemetry.exporter.otlp.proto.http import Compression
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

from .. import semconv
from ..collector.receiver_config import TOKEN_ENV, TRACES_PATH, MiB
from ..errors import PrimeRunsOtelError
from ..produce.episode import record_episode
from ..produce.resource import run_resource
from ..produce.run_config import normalize_config
from ..produce.run_spans import emit_run_end, emit_run_start
from ..produce.traces_jsonl import (
    NoEpisodesError,
    bad_lines_report,
    count_lines,
    environments_of,
    read_records,
    traces_file,
)
from .exits import EXIT_INCOMPLETE, EXIT_OK
from .output import print_json
from .recorded_eval import recorded_eval, replay_options, replay_run_key

__all__ = [
    "add_otlp_replay_option",
    "replay_command_over_otlp",
    "replay_over_otlp",
]

#: A replay batch closes at this many spans or bytes of attributes, whichever
#: comes first: a run of 20 MiB episodes must not become one giant request.
REPLAY_BATCH_SPANS = 512
REPLAY_BATCH_BYTES = 16 * MiB

#: How long one OTLP request may take, retries included, unless --timeout
#: says otherwise: an endpoint that refuses or is away is reported, not waited
#: on for minutes.
DEFAULT_OTLP_TIMEOUT = 30.0
#: How long the first connection to the endpoint may take before it is
#: reported not reachable.
REACH_TIMEOUT = 5.0


def add_otlp_replay_option(replay_parser: argparse.ArgumentParser) -> None:
    """Add ``--otlp-endpoint``/``--otlp`` (and the token) to ``prime-runs-otel replay``."""
    replay_parser.add_argument(
        "--otlp-endpoint",
        metavar="URL",
        help="send the spans over OTLP/HTTP to this endpoint (a collector, or `serve`) "
        f"instead of exporting in process; {TRACES_PATH} is added when the URL has no path",
    )
    replay_parser.add_argument(
        "--otlp",
        action="store_true",
        help="send over OTLP/HTTP to the endpoint the OpenTelemetry variables name "
        "(OTEL_EXPORTER_OTLP_TRACES_ENDPOINT, else OTEL_EXPORTER_OTLP_ENDPOINT); "
        "OTEL_EXPORTER_OTLP_HEADERS is sent as the SDK sends it",
    )
    replay_parser.add_argument(
        "--otlp-token",
        default=os.environ.get(TOKEN_ENV) or None,
        help=f"bearer token for the OTLP endpoint (default: ${TOKEN_ENV})",
    )


def otlp_endpoint_from_env() -> str:
    """The traces endpoint as the SDK finds it: the signal's own variable as
    given, else the base endpoint with /v1/traces added."""
    traces = os.environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "").strip()
    if traces:
        return traces
    base = os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT", "").strip()
    if base:
        return base.rstrip("/") + TRACES_PATH
    raise PrimeRunsOtelError(
        "--otlp needs an endpoint: set OTEL_EXPORTER_OTLP_ENDPOINT (e.g. "
        "http://127.0.0.1:4318) or pass --otlp-endpoint URL"
    )


def replay_command_over_otlp(args: argparse.Namespace) -> int:
    """``replay`` with ``--otlp-endpoint`` or ``--otlp``, from the replay command's arguments."""
    traces_file(Path(args.path))  # a file it cannot read is said first, as itself
    endpoint = args.otlp_endpoint or otlp_endpoint_from_env()
    timeout = DEFAULT_OTLP_TIMEOUT if args.timeout is None else args.timeout
    return replay_over_otlp(
        args.path,
        endpoint,
        name=args.name,
        model=args.model,
        environments=args.environment,
        framework=args.framework,
        config_file=args.config,
        token=args.otlp_token,
        timeout=timeout,
        run_id=getattr(args, "run_key", None),
        as_json=bool(getattr(args, "json", False)),
    )


def _otlp_headers(token: str | None) -> dict[str, str] | None:
    """``None`` lets the SDK read OTEL_EXPORTER_OTLP_(TRACES_)HEADERS itself; a
    token is added to those headers rather than replacing them."""
    if not token:
        return None
    from opentelemetry.util.re import parse_env_headers

    raw = os.environ.get("OTEL_EXPORTER_OTLP_TRACES_HEADERS") or os.environ.get(
        "OTEL_EXPORTER_OTLP_HEADERS", ""
    )
    headers = dict(parse_env_headers(raw, liberal=True))
    headers["authorization"] = f"Bearer {token}"
    return headers


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
    timeout: float = DEFAULT_OTLP_TIMEOUT,
    run_id: str | None = None,
    as_json: bool = False,
) -> int:
    """Send a verifiers ``traces.jsonl`` as one run's spans to an OTLP endpoint.

    Returns 0 when every episode was accepted by the endpoint, 1 otherwise.
    The endpoint's acceptance is all that can be known from here: delivery to
    the platform is the receiving ``serve``'s job. After the first refused
    request nothing more is sent (the rest would be refused too), and the
    report says what was accepted, refused and never sent.
    """
    source = traces_file(Path(path))
    recorded = recorded_eval(source.parent)
    bad_lines: list[str] = []
    total, first, records = _opened(source, bad_lines)
    resource = _replay_resource(
        source,
        recorded,
        first,
        name=name,
        model=model,
        environments=environments,
        framework=framework,
        run_id=run_id,
    )
    local_id = str(resource.attributes[semconv.RUN_ID])
    target = traces_endpoint(endpoint)
    unreachable = _unreachable(target, min(timeout, REACH_TIMEOUT) if timeout else REACH_TIMEOUT)
    if unreachable:
        return _report_unreachable(target, unreachable, local_id, total, as_json=as_json)
    exporter = _CountingExporter(
        OTLPSpanExporter(
            endpoint=target,
            headers=_otlp_headers(token),
            timeout=timeout,
            compression=Compression.Gzip,
        )
    )
    config_file = config_file or recorded.get("config_file")
    _send_run(resource, exporter, records, bad_lines, config_file=config_file)
    return _report_sent(
        local_id, target, exporter, total, bad_lines, timeout=timeout, as_json=as_json
    )


def _opened(
    source: Path, bad_lines: list[str]
) -> tuple[int, dict[str, Any], Iterator[dict[str, Any]]]:
    """The file's episode count, its first record and all its records (the
    first included), read as they are sent; a file without one is refused
    before anything is sent."""
    total = sum(1 for _ in read_records(source, []))
    records = read_records(source, bad_lines)
    first = next(records, None)
    if first is None:
        raise NoEpisodesError(source, count_lines(source), bad_lines)
    return total, first, _chain(first, records)


def _replay_resource(
    source: Path,
    recorded: Mapping[str, Any],
    first: dict[str, Any],
    *,
    name: str | None,
    model: str | None,
    environments: Sequence[str] | None,
    framework: str | None,
    run_id: str | None,
) -> Resource:
    """The replayed run's Resource: what was given, else what the eval
    recorded in its folder, else what the file itself says; the run key
    comes from the file unless one is given, so a replay again is one run."""
    options = replay_options(name, model, environments, framework)
    return run_resource(
        run_id=run_id or replay_run_key(source, options),
        name=name or recorded.get("name") or source.resolve().parent.name,
        model=model or recorded.get("model"),
        environments=list(environments or recorded.get("environments") or environments_of(first)),
        framework=framework,
    )


def _send_run(
    resource: Resource,
    exporter: _CountingExporter,
    records: Iterator[dict[str, Any]],
    bad_lines: list[str],
    *,
    config_file: str | os.PathLike[str] | None,
) -> None:
    """The run's spans to the endpoint: its start, an episode span per record
    (one that is no episode is a bad line), and its end, until the endpoint
    refuses something: what is left is then never sent, the end included."""
    provider = TracerProvider(resource=resource)
    provider.add_span_processor(_BlockingBatchProcessor(exporter))
    tracer = provider.get_tracer("prime_runs_otel.replay")
    config = normalize_config(None, config_file=config_file)
    emit_run_start(tracer, config)
    recorded_count = 0
    for record in records:
        if exporter.refused_spans:
            break  # the endpoint refuses: what is left is reported as never sent
        try:
            record_episode(tracer, record)
        except PrimeRunsOtelError as exc:
            bad_lines.append(f"episode {record.get('id')!r}: {exc}")
            continue
        recorded_count += 1
    if not exporter.refused_spans:
        emit_run_end(tracer, "completed", episodes_recorded=recorded_count)
    provider.shutdown()


def _report_sent(
    local_id: str,
    target: str,
    exporter: _CountingExporter,
    total: int,
    bad_lines: list[str],
    *,
    timeout: float,
    as_json: bool,
) -> int:
    """Say what the endpoint accepted, refused and was never sent, and
    what to do when it refused; the exit code says whether all of it went."""
    accepted = exporter.accepted_episodes
    refused = exporter.refused_episodes
    never_sent = max(0, total - len(bad_lines) - accepted - refused)
    for problem in bad_lines_report(bad_lines):
        print(f"error: {problem}", file=sys.stderr)
    report = {
        "id": local_id,
        "endpoint": target,
        "episodes": total,
        "accepted": accepted,
        "refused": refused,
        "never_sent": never_sent,
        "bad_lines": len(bad_lines),
        "run_end_sent": exporter.refused_spans == 0,
    }
    if as_json:
        print_json(report)
    else:
        print(
            f"run {local_id} → {target}: {accepted} episode(s) accepted, {refused} refused, "
            f"{never_sent} never sent" + (f", {len(bad_lines)} bad line(s)" if bad_lines else "")
        )
    if exporter.refused_spans:
        print(
            "the endpoint did not accept every span (refused, or not reachable within "
            f"{timeout:g}s). If it needs a token, pass --otlp-token (or set "
            "OTEL_EXPORTER_OTLP_HEADERS=authorization=Bearer%20TOKEN); check that it is "
            "listening and its log, then replay the same file again: episodes already stored "
            "are not stored twice, the run key coming from the file",
            file=sys.stderr,
        )
    return EXIT_OK if not exporter.refused_spans and not bad_lines else EXIT_INCOMPLETE


def _unreachable(url: str, timeout: float) -> str | None:
    """Why nothing listens at ``url``, or ``None`` when a connection opens.

    Asked once, before the first span: the SDK's exporter would otherwise
    retry every batch with backoff for its whole timeout, logging a warning
    each time, and end with "refused" for what was never delivered."""
    parsed = urlsplit(url)
    host = parsed.hostname or "localhost"
    try:
        port = parsed.port or (443 if parsed.scheme == "https" else 80)
    except ValueError:
        return "the URL's port is not a number"
    try:
        socket.create_connection((host, port), timeout=timeout).close()
    except OSError as exc:
        return exc.strerror or str(exc) or type(exc).__name__
    return None


def _report_unreachable(
    target: str, reason: str, local_id: str, total: int, *, as_json: bool
) -> int:
    """Nothing was sent: say so, and what to check, in one line."""
    if as_json:
        print_json(
            {
                "id": local_id,
                "endpoint": target,
                "episodes": total,
                "accepted": 0,
                "refused": 0,
                "never_sent": total,
                "bad_lines": 0,
                "run_end_sent": False,
                "reachable": False,
            }
        )
    print(
        f"error: not reachable: {target} ({reason}); nothing was sent. Start the collector or "
        "`prime-runs-otel serve` there, or check the URL (host and port), then replay again",
        file=sys.stderr,
    )
    return EXIT_INCOMPLETE


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
    """Counts what the endpoint accepted and refused (the SDK would forget),
    in spans and in episodes."""

    def __init__(self, inner: SpanExporter) -> None:
        self._inner = inner
        self.refused_spans = 0
        self.accepted_episodes = 0
        self.refused_episodes = 0

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        result = self._inner.export(spans)
        episodes = sum(1 for span in spans if span.name.startswith("episode"))
        if result is SpanExportResult.SUCCESS:
            self.accepted_episodes += episodes
        else:
            self.refused_spans += len(spans)
            self.refused_episodes += episodes
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
