"""One finished episode as a span: the whole native record on it, the
summary tracing backends show, and its agent and model-call spans under it.

Everything here runs on the producer's own thread, once per episode, so it is
written for speed: the record is serialised exactly once, child spans get
their attributes at creation (one SDK call each), and message content is only
converted when it was asked for.

The episode span carries the whole native record (the canonical form every
platform projection is computed from); the consumer needs nothing else.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from opentelemetry import trace as trace_api
from opentelemetry.context import Context
from opentelemetry.trace import Link, Span, SpanContext, Status, StatusCode, Tracer

from .. import semconv as sc
from .._encoded_here import encoded_here
from .._json import encode_record
from ..errors import RecordError
from ..sampling import dropped_episodes
from ._fields import EMPTY, Attributes, as_mapping, error_text, is_int, put_int, put_str
from .blobs import set_blob
from .content_capture import NO_CAPTURE, capture_content_mode
from .genai_messages import put_input_output
from .genai_spans import emit_agent_span, trace_reward
from .signals import NO_SIGNALS, Signals
from .span_times import episode_window, fill_window, recorded_window

__all__ = ["prepare_episode", "record_episode"]


def record_episode(
    tracer: Tracer,
    episode: Any,
    *,
    capture_content: bool | None = None,
    child_spans: bool = True,
    summary_attributes: bool = True,
    link: SpanContext | None = None,
    signals: Signals = NO_SIGNALS,
) -> str:
    """Emit one finished episode as a span tree and return its id.

    ``episode`` is a verifiers ``Episode`` (anything with ``to_record()``) or
    its record as a dict. ``capture_content`` overrides
    ``OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT`` for the model-call
    spans; the record on the episode span always holds the full messages.
    ``child_spans=False`` emits the episode span alone: the platform reads
    only the record, so the agent and model-call spans are worth their cost
    (most of this function's) only when a tracing backend shows them. With
    child spans on, the episode span also gets what those backends read
    (OpenInference's span kind, and with content capture the first prompt and
    the final completion as ``input.value``/``output.value``).
    ``summary_attributes=False`` leaves out, for the same reason, the
    episode span's summary (reward, ok, tokens, errors, its status): the
    span keeps only ``prime.episode.id`` and the record with its size and
    digest.
    ``link`` is the run-start span's context: the episode span links to it,
    so a backend can walk from a run to its episodes.
    ``signals`` are the run's events and metrics (see :mod:`.signals`): each
    reward as a ``gen_ai.evaluation.result`` event in the episode span's
    context, and the episode's reward, scores and model calls as metrics.
    """
    record = _as_record(episode)
    data, plain = _encoded(record)
    capture = _capture_mode(capture_content, child_spans)
    traces: list[Any] = record["traces"]
    trace_windows = [recorded_window(as_mapping(item)) for item in traces]
    window = episode_window(trace_windows)
    span = tracer.start_span(
        _episode_name(record),
        start_time=window[0],
        attributes={sc.EPISODE_ID: record["id"]},
        links=(Link(link),) if link is not None else None,
    )
    if not span.is_recording():  # sampled out (counted and said), or no SDK behind it
        span.end(end_time=window[1])
        dropped_episodes.note(span.get_span_context(), record["id"])
        return str(record["id"])
    try:
        signalled = signals.events is not None or signals.metrics is not None
        # The episode span as a parent (and a context for events and metrics),
        # built only when something needs it: most episodes have neither.
        here = trace_api.set_span_in_context(span) if child_spans or signalled else None
        if here is not None and child_spans:
            for item, trace_window in zip(traces, trace_windows, strict=True):
                trace = as_mapping(item)
                trace_span = fill_window(trace_window, window)
                emit_agent_span(tracer, here, trace, trace_span, capture, signals.events)
        _put_summary(span, record, traces, capture, child_spans, summary_attributes)
        if here is not None and signalled:
            _emit_signals(signals, record, traces, here, window[1])
        chunks = set_blob(span, tracer, sc.EPISODE_RECORD, data.decode("utf-8"), data)
        if plain:  # before the span ends: its export may start at once
            encoded_here.note(span.get_span_context().span_id, chunks, data)
    finally:
        span.end(end_time=window[1])
    episode_id: str = record["id"]
    return episode_id


def _encoded(record: dict[str, Any]) -> tuple[bytes, bool]:
    """The record's JSON, and whether orjson wrote it (which vouches for every
    scalar in it); a record that cannot be written is the caller's error."""
    try:
        return encode_record(record)
    except (TypeError, ValueError) as exc:
        raise RecordError(
            f"episode {record['id']!r} is not JSON-serialisable ({exc}); a record "
            "holds only str/int/float/bool/None/list/dict values"
        ) from exc


def _capture_mode(capture_content: bool | None, child_spans: bool) -> tuple[bool, bool]:
    """What the model-call spans capture: the argument when given, else the
    environment's setting, and nothing without child spans to carry it."""
    if capture_content is None:
        return capture_content_mode() if child_spans else NO_CAPTURE
    return (True, False) if capture_content else NO_CAPTURE


def _put_summary(
    span: Span,
    record: dict[str, Any],
    traces: list[Any],
    capture: tuple[bool, bool],
    child_spans: bool,
    summary_attributes: bool,
) -> None:
    """The episode span's summary (reward, ok, tokens, errors, its status), or
    its id alone when the summary is not wanted."""
    if summary_attributes:
        attributes, error = _episode_attributes(record, traces)
        if child_spans:
            _put_backend_view(attributes, record, traces, capture[0])
        span.set_attributes(attributes)
        if error is not None:
            span.set_status(Status(StatusCode.ERROR, error))
    else:
        # Again, after whatever other processors added at the span's start:
        # an attribute count limit evicts the oldest first.
        span.set_attribute(sc.EPISODE_ID, record["id"])


def prepare_episode(episode: Any) -> tuple[str, Any]:
    """The episode's id and what to hand to :func:`record_episode` later,
    after the checks that cost next to nothing.

    ``Run.record_episode`` calls this on the caller's thread and leaves the
    encoding to its producer thread, so a wrong argument is still refused
    where it was passed. A verifiers ``Episode`` is handed over as it is (its
    ``to_record()`` runs on the producer thread); an object with
    ``to_record()`` but no string ``id`` is converted here, to learn its id.
    """
    if type(episode) is dict or isinstance(episode, Mapping):
        episode_id = episode.get("id")
        if not isinstance(episode_id, str) or not episode_id:
            raise RecordError(_NO_ID.format(episode_id))
        if not isinstance(episode.get("traces"), list):
            raise RecordError(_NO_TRACES.format(episode_id))
        return episode_id, episode
    if callable(getattr(episode, "to_record", None)):
        episode_id = getattr(episode, "id", None)
        if isinstance(episode_id, str) and episode_id:
            return episode_id, episode
        record = _as_record(episode)
        return str(record["id"]), record
    raise RecordError(_NOT_AN_EPISODE.format(type(episode).__name__))


_NO_ID = "an episode record needs a non-empty string 'id' (Episode.to_record() has one); got {!r}"
_NO_TRACES = (
    "episode {!r} has no 'traces' list; pass Episode.to_record() "
    "or a dict with 'traces': [...] (an empty list is fine)"
)
_NOT_AN_EPISODE = "expected a verifiers Episode or its record (a dict), got {}"


def _as_record(episode: Any) -> dict[str, Any]:
    to_record = getattr(episode, "to_record", None)
    record = to_record() if callable(to_record) else episode
    if not isinstance(record, Mapping):
        raise RecordError(_NOT_AN_EPISODE.format(type(record).__name__))
    if not isinstance(record, dict):
        record = dict(record)
    episode_id = record.get("id")
    if not isinstance(episode_id, str) or not episode_id:
        raise RecordError(_NO_ID.format(episode_id))
    if not isinstance(record.get("traces"), list):
        raise RecordError(_NO_TRACES.format(episode_id))
    return record


def _episode_name(record: Mapping[str, Any]) -> str:
    return sc.episode_span_name(_env_label(record))


def _env_label(record: Mapping[str, Any]) -> str | None:
    env = as_mapping(record.get("env"))
    label = env.get("name") or env.get("id")
    return label if isinstance(label, str) and label else None


def _summary_trace(traces: list[Any]) -> Mapping[str, Any] | None:
    """First trainable trace, else the first: the one that speaks for the episode."""
    for item in traces:
        agent = as_mapping(as_mapping(item).get("agent"))
        if agent.get("trainable", True):
            return as_mapping(item)
    return as_mapping(traces[0]) if traces else None


def _put_backend_view(
    attributes: Attributes, record: Mapping[str, Any], traces: list[Any], content: bool
) -> None:
    """What tracing backends show for a whole episode: its kind, and with
    content capture on its first prompt and its final completion."""
    attributes[sc.OPENINFERENCE_SPAN_KIND] = sc.OPENINFERENCE_CHAIN
    if content:
        put_input_output(attributes, _summary_trace(traces) or EMPTY, record)


def _episode_attributes(
    record: Mapping[str, Any], traces: list[Any]
) -> tuple[Attributes, str | None]:
    """Summary attributes, and the status message when the episode failed."""
    summary = _summary_trace(traces)
    attributes: Attributes = {sc.EPISODE_ID: record["id"]}
    example_id = _example_id(record, summary)
    if example_id is not None:
        attributes[sc.EPISODE_EXAMPLE_ID] = example_id
    put_str(attributes, sc.EPISODE_ENV, _env_label(record))
    put_str(attributes, sc.EPISODE_GROUP, as_mapping(record.get("group")).get("id"))
    ok = record.get("ok")
    if isinstance(ok, bool):
        attributes[sc.EPISODE_OK] = ok
    if summary is not None:
        reward = trace_reward(summary)
        if reward is not None:
            attributes[sc.EPISODE_REWARD] = reward
        put_str(attributes, sc.EPISODE_STOP_CONDITION, summary.get("stop_condition"))
    put_int(attributes, sc.EPISODE_INPUT_TOKENS, _token_total(record, traces, "input"))
    put_int(attributes, sc.EPISODE_OUTPUT_TOKENS, _token_total(record, traces, "output"))
    put_int(
        attributes, sc.RUN_STEP, as_mapping(as_mapping(record.get("run")).get("work")).get("step")
    )
    errors = _errors(record, summary)
    attributes[sc.EPISODE_ERROR_COUNT] = len(errors)
    last = as_mapping(errors[-1]) if errors else EMPTY
    put_str(attributes, sc.EPISODE_ERROR_TYPE, last.get("type"))
    put_str(attributes, sc.EPISODE_ERROR_MESSAGE, last.get("message"))
    if ok is not False:
        return attributes, None
    return attributes, error_text(last) or "episode not ok"


def _emit_signals(
    signals: Signals,
    record: Mapping[str, Any],
    traces: list[Any],
    context: Context,
    ended: int,
) -> None:
    """The episode's events and metrics, in the episode span's context."""
    if signals.events is not None:
        for item in traces:
            signals.events.evaluation_results(context, as_mapping(item), ended)
    if signals.metrics is not None:
        summary = _summary_trace(traces)
        reward = trace_reward(summary) if summary is not None else None
        signals.metrics.episode(record, traces, reward, _env_label(record), context)


def _example_id(record: Mapping[str, Any], summary: Mapping[str, Any] | None) -> int | str | None:
    for source in (summary or EMPTY, record):
        idx = as_mapping(as_mapping(source.get("task")).get("data")).get("idx")
        if isinstance(idx, (int, str)) and not isinstance(idx, bool):
            return idx
    return None


def _errors(record: Mapping[str, Any], summary: Mapping[str, Any] | None) -> list[Any]:
    """The episode's own errors, else its summary trace's (where v0 rows read them)."""
    errors = record.get("errors")
    if isinstance(errors, list) and errors:
        return errors
    trace_errors = (summary or EMPTY).get("errors")
    return trace_errors if isinstance(trace_errors, list) else []


def _token_total(record: Mapping[str, Any], traces: list[Any], side: str) -> int | None:
    key = f"num_{side}_tokens"
    value = record.get(key)
    if is_int(value):
        return int(value)
    counts = [as_mapping(item).get(key) for item in traces]
    known = [int(count) for count in counts if is_int(count)]
    return sum(known) if known else None
