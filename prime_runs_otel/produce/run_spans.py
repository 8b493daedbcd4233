"""The spans about the run rather than an episode: its start (carrying the
config), a training step's metrics, and its end (the status, and how many
episodes were recorded, so that a consumer seeing spans out of order knows
what is still in flight).

Spans rather than Resource attributes: what they carry can be large, and is
sent once instead of on every exported batch.
"""

from __future__ import annotations

import base64
import json
import math
import time
from collections.abc import Mapping
from typing import Any

from opentelemetry import trace as trace_api
from opentelemetry.trace import Link, SpanContext, Status, StatusCode, Tracer

from .. import semconv as sc
from .._json import clean_metric_values
from ..errors import ConfigError
from ._fields import Attributes, compact_json, is_int
from .blobs import set_blob
from .run_metrics import RunMetrics
from .span_times import epoch_ns

__all__ = ["emit_metrics", "emit_run_end", "emit_run_start", "emit_step_table", "summary_json"]


_ERROR_STATUSES = frozenset({"failed", "crashed"})


def emit_run_start(tracer: Tracer, config: Mapping[str, Any], *, owner: bool = True) -> SpanContext:
    """Send the run config once, on its own span, and return the span's
    context: the run's other spans link to it (``link=``), so a backend can
    walk from the run's start to its episodes, metrics and end.

    A span of its own (rather than a Resource attribute) because the config
    can be large and must be sent once, not repeated on every exported batch.
    ``owner=False`` from a process that feeds a run somebody else owns and
    ends: its start does not claim the run (``serve`` takes the run's end
    only from the producer that claimed it).
    """
    try:
        text = compact_json(config)
    except (TypeError, ValueError) as exc:
        raise ConfigError(
            f"the run config is not JSON-serialisable ({exc}); pass plain "
            "str/int/float/bool/list/dict values"
        ) from exc
    # A kind, so tracing backends do not show the run's boundaries as "unknown".
    attributes: Attributes = {sc.OPENINFERENCE_SPAN_KIND: sc.OPENINFERENCE_CHAIN}
    if not owner:
        attributes[sc.RUN_OWNER] = False
    span = tracer.start_span(sc.RUN_START_SPAN, attributes=attributes)
    try:
        set_blob(span, tracer, sc.RUN_CONFIG, text)
    finally:
        span.end()
    return span.get_span_context()


def _links(link: SpanContext | None) -> tuple[Link, ...] | None:
    return (Link(link),) if link is not None else None


def emit_run_end(
    tracer: Tracer,
    status: str,
    error: str | None = None,
    *,
    episodes_recorded: int | None = None,
    summary: Mapping[str, Any] | None = None,
    episodes_unencodable: int = 0,
    link: SpanContext | None = None,
) -> None:
    """Close the run with its terminal status.

    ``episodes_recorded`` lets a consumer that sees spans out of order (behind
    a collector) wait for episodes still in flight before it finalizes.
    ``summary`` is the run's summary as the producer wants it shown; left
    out, the consumer aggregates one from the episodes.
    ``episodes_unencodable`` counts those left out because their record could
    not be encoded, so the run's record says so.
    """
    if status not in sc.RUN_STATUSES:
        raise ValueError(f"status={status!r} is not one of {', '.join(sc.RUN_STATUSES)}")
    attributes: Attributes = {sc.RUN_STATUS: status}
    if error:
        attributes[sc.RUN_ERROR] = error
    if episodes_recorded is not None:
        attributes[sc.RUN_EPISODES_RECORDED] = int(episodes_recorded)
    if episodes_unencodable:
        attributes[sc.RUN_EPISODES_UNENCODABLE] = int(episodes_unencodable)
    # What a tracing backend shows for the run's end: its kind, and the outcome.
    attributes[sc.OPENINFERENCE_SPAN_KIND] = sc.OPENINFERENCE_CHAIN
    outcome = status if episodes_recorded is None else f"{status}, {episodes_recorded} episode(s)"
    attributes[sc.OUTPUT_VALUE] = f"{outcome}: {error}" if error else outcome
    text = summary_json(summary)
    span = tracer.start_span(sc.RUN_END_SPAN, attributes=attributes, links=_links(link))
    try:
        if status in _ERROR_STATUSES:
            span.set_status(Status(StatusCode.ERROR, error or status))
        if text is not None:
            set_blob(span, tracer, sc.RUN_SUMMARY, text)
    finally:
        span.end()


def summary_json(summary: Mapping[str, Any] | None) -> str | None:
    """The run summary as the run's end carries it (non-finite numbers
    dropped); ``ConfigError`` saying what to pass when it is not JSON. For a
    caller that wants the refusal before it starts ending the run."""
    if summary is None:
        return None
    try:
        return json.dumps(clean_metric_values(summary), separators=(",", ":"), allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise ConfigError(
            f"the run summary is not JSON-serialisable ({exc}); pass plain "
            "str/int/float/bool/list/dict values"
        ) from exc


def emit_metrics(
    tracer: Tracer,
    values: Mapping[str, Any],
    *,
    step: int | None = None,
    timestamp: float | None = None,
    link: SpanContext | None = None,
    metrics: RunMetrics | None = None,
    verbatim: bool = False,
) -> int:
    """Report one training step's metrics on a span of its own; returns the step.

    ``step`` is required, here or as ``values["step"]`` (which wins, as in
    prime-runs). Non-finite numbers are dropped rather than refused: a NaN
    loss is a fact about the step, not a reason to lose the whole row. The
    platform keeps one row per step, so the spool adds a step logged again
    to its row.
    ``verbatim``: ``values`` is posted exactly as given instead (a post of
    its own, ``step`` left where and as it is, no ``_timestamp``), for a
    source whose own reporting posts its rows so (``prime_rl``); ``step`` then
    only says which step the row belongs to. Nothing is dropped: a value
    that is not JSON is refused.
    ``metrics`` records the row's numbers as the run's ``prime.run.metric``
    gauge too, in the span's context (a dashboard's exemplar leads to it).
    """
    row, chosen, logged_at, text = _metrics_row(values, step, timestamp, verbatim=verbatim)
    attributes: Attributes = {sc.RUN_STEP: chosen, sc.RUN_METRICS_TIMESTAMP: logged_at}
    if verbatim:
        attributes[sc.RUN_METRICS_VERBATIM] = True
    span = tracer.start_span(
        sc.RUN_METRICS_SPAN,
        attributes=attributes,
        start_time=epoch_ns(logged_at) or time.time_ns(),
        links=_links(link),
    )
    try:
        set_blob(span, tracer, sc.RUN_METRICS_VALUES, text)
        if metrics is not None:
            gauged = {key: value for key, value in row.items() if key != "step"}
            metrics.step(gauged, trace_api.set_span_in_context(span))
    finally:
        span.end()
    return chosen


def _metrics_row(
    values: Mapping[str, Any], step: int | None, timestamp: float | None, *, verbatim: bool
) -> tuple[dict[str, Any], int, float, str]:
    """``emit_metrics``' row checked before any span: ``(row, step, logged
    at, the row's JSON)``, the step and time taken as ``emit_metrics`` says
    and refused, with what to pass, when the row cannot be posted."""
    if not isinstance(values, Mapping):
        raise ConfigError(f"metrics must be a mapping of names to values, got {type(values)}")
    if verbatim:
        row = dict(values)
        chosen = step if step is not None else row.get("step")
        logged_at = timestamp
    else:
        row = clean_metric_values(values)
        chosen = row.pop("step", step)
        logged_at = row.pop("_timestamp", timestamp)
    if not is_int(chosen) or chosen < 0:
        raise ConfigError(
            f"a metrics row needs its training step as a whole number of 0 or more "
            f"(step=... or values['step']), got {chosen!r}"
        )
    if not isinstance(logged_at, (int, float)) or not math.isfinite(logged_at):
        logged_at = time.time()
    try:
        text = json.dumps(row, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise ConfigError(
            f"the metrics of step {chosen} are not JSON-serialisable ({exc}); pass plain "
            "str/int/float/bool/list/dict values"
        ) from exc
    return row, int(chosen), float(logged_at), text


def emit_step_table(
    tracer: Tracer, step: int, body: bytes, *, link: SpanContext | None = None
) -> None:
    """One Parquet object of a training step's sample table, written by the
    producer (``run_id`` column empty: the consumer fills in the platform's
    id when it sends it), on a span of its own, so that a consumer behind a
    collector sends the very object a process delivering in place would."""
    if not is_int(step) or step < 0:
        raise ConfigError(
            f"a sample table needs its step as a whole number of 0 or more, not {step!r}"
        )
    text = base64.b64encode(body).decode("ascii")
    span = tracer.start_span(
        sc.RUN_SAMPLES_SPAN, attributes={sc.RUN_STEP: int(step)}, links=_links(link)
    )
    try:
        set_blob(span, tracer, sc.RUN_SAMPLES_PARQUET, text)
    finally:
        span.end()
