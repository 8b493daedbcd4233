"""The producer side: a run as a Resource, and episodes as spans.

Everything here runs on the producer's own thread, once per episode, so it is
written for speed: the record is serialised exactly once, child spans get
their attributes at creation (one SDK call each), and message content is only
converted when it was asked for.

The episode span carries the whole native record (the canonical form every
platform projection is computed from). Agent and model-call child spans follow
the OpenTelemetry GenAI conventions so any tracing backend shows the rollout;
the consumer does not need them.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeGuard

from opentelemetry import trace as trace_api
from opentelemetry.context import Context
from opentelemetry.sdk.resources import Resource
from opentelemetry.trace import Span, SpanContext, Status, StatusCode, Tracer

from .. import semconv as sc
from .._json import clean_metric_values, encode_record, parsed_if_json
from ..errors import ConfigError, RecordError

__all__ = [
    "MAX_CONFIG_SOURCE_BYTES",
    "capture_content_enabled",
    "capture_content_mode",
    "clean_metric_values",
    "emit_metrics",
    "emit_run_end",
    "emit_run_start",
    "episode_span",
    "normalize_config",
    "prepare_episode",
    "record_episode",
    "run_resource",
    "score_episode",
]

logger = logging.getLogger(__name__)

#: A run config is display metadata, not a dataset: the platform stores it
#: with the run, and the prime SDKs refuse anything larger.
MAX_CONFIG_SOURCE_BYTES = 256 * 1024

_CONFIG_FORMATS = {".toml": "toml", ".json": "json", ".yaml": "yaml", ".yml": "yaml"}
#: ``OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT`` → (on the span, on an
#: event). The current GenAI utilities take the first four (and only them once
#: ``OTEL_SEMCONV_STABILITY_OPT_IN=gen_ai_latest_experimental``); the older
#: true/false spelling is taken everywhere, since refusing it captures nothing.
_CAPTURE_MODES: dict[str, tuple[bool, bool]] = {
    "span_only": (True, False),
    "event_only": (False, True),
    "span_and_event": (True, True),
    "no_content": (False, False),
    "true": (True, False),
    "1": (True, False),
    "yes": (True, False),
    "on": (True, False),
    "false": (False, False),
    "0": (False, False),
    "no": (False, False),
    "off": (False, False),
    "": (False, False),
}
_NO_CAPTURE = (False, False)
_warned_capture_values: set[str] = set()
_TIMING_STAGES = ("boot", "setup", "agent", "finalize", "scoring")
_ERROR_STATUSES = frozenset({"failed", "crashed"})
_EMPTY: Mapping[str, Any] = {}

Attributes = dict[str, Any]
Window = tuple[int, int]
#: ``hand_over(span context, record, its JSON, whether orjson wrote it, and
#: so within the limits; see ``_json.encode_record``)``: see :func:`record_episode`.
HandOver = Callable[[SpanContext, dict[str, Any], bytes, bool], None]


# ---------------------------------------------------------------------------
# The run
# ---------------------------------------------------------------------------


def run_resource(
    *,
    run_id: str | None = None,
    kind: str = "eval",
    name: str | None = None,
    model: str | None = None,
    environments: Sequence[str] = (),
    framework: str | None = None,
    tags: Sequence[str] = (),
    description: str | None = None,
    attach: str | None = None,
    team_id: str | None = None,
    service_name: str | None = None,
    extra: Mapping[str, Any] | None = None,
    max_steps: int | None = None,
    batch_size: int | None = None,
    rollouts_per_example: int | None = None,
    seq_len: int | None = None,
    wandb_project: str | None = None,
    wandb_entity: str | None = None,
    wandb_run_name: str | None = None,
) -> Resource:
    """The Resource naming one run; give it to that run's own ``TracerProvider``.

    A fresh ``run_id`` is generated when none is given. Pass the same id again
    (for example after a restart) to keep reporting into the same run. The
    standard ``OTEL_RESOURCE_ATTRIBUTES`` and ``OTEL_SERVICE_NAME`` still
    apply, but never override the run identity given here.

    The training fields (``max_steps`` to ``wandb_run_name``) are what a
    ``kind="train"`` run is registered with. Every process feeding one
    training run (orchestrator, inference workers, trainer) builds the same
    Resource: the run is created once, by whichever is seen first.
    """
    if kind not in sc.RUN_KINDS:
        raise ConfigError(f"kind={kind!r} is not one of 'eval' or 'train'")
    if isinstance(environments, str) or isinstance(tags, str):
        raise ConfigError("environments and tags take a list of strings, not a single string")
    attributes: Attributes = dict(extra or {})
    attributes.update(
        _training_attributes(
            kind,
            {
                sc.RUN_MAX_STEPS: max_steps,
                sc.RUN_BATCH_SIZE: batch_size,
                sc.RUN_ROLLOUTS_PER_EXAMPLE: rollouts_per_example,
                sc.RUN_SEQ_LEN: seq_len,
            },
            {
                sc.RUN_WANDB_PROJECT: wandb_project,
                sc.RUN_WANDB_ENTITY: wandb_entity,
                sc.RUN_WANDB_RUN_NAME: wandb_run_name,
            },
        )
    )
    attributes[sc.RUN_ID] = run_id or uuid.uuid4().hex
    attributes[sc.RUN_KIND] = kind
    optional = {
        sc.RUN_NAME: name,
        sc.RUN_MODEL: model,
        sc.RUN_FRAMEWORK: framework,
        sc.RUN_DESCRIPTION: description,
        sc.RUN_ATTACH: attach,
        sc.RUN_TEAM_ID: team_id,
        sc.SERVICE_NAME: service_name,
    }
    attributes.update((key, value) for key, value in optional.items() if value)
    if environments:
        attributes[sc.RUN_ENVIRONMENTS] = [str(env) for env in environments]
    if tags:
        attributes[sc.RUN_TAGS] = [str(tag) for tag in tags]
    resource = Resource.create(attributes)
    current = str(resource.attributes.get(sc.SERVICE_NAME, ""))
    if not service_name and current.startswith("unknown_service"):
        resource = resource.merge(Resource({sc.SERVICE_NAME: sc.DEFAULT_SERVICE_NAME}))
    return resource


def _training_attributes(
    kind: str, counts: Mapping[str, int | None], texts: Mapping[str, str | None]
) -> Attributes:
    given = {key: value for key, value in {**counts, **texts}.items() if value is not None}
    if given and kind != "train":
        raise ConfigError(
            f"{', '.join(key.rsplit('.', 1)[-1] for key in given)} only apply to a "
            "training run; pass kind='train'"
        )
    attributes: Attributes = {}
    for key, count in counts.items():
        if count is None:
            continue
        if not _is_int(count) or count < 0:
            name = key.rsplit(".", 1)[-1]
            raise ConfigError(f"{name} must be a whole number of 0 or more, got {count!r}")
        attributes[key] = int(count)
    attributes.update((key, str(text)) for key, text in texts.items() if text)
    return attributes


def normalize_config(
    config: Mapping[str, Any] | str | os.PathLike[str] | None = None,
    *,
    config_file: str | os.PathLike[str] | None = None,
) -> dict[str, Any]:
    """The run config as the platform stores it.

    A mapping is taken as given (copied). A path, through either argument, is
    read byte for byte into ``config_source`` so the dashboard shows the file
    the run was started from, comments included. Nothing is redacted: keep
    credentials in the environment, not in the config.
    """
    if config is None or isinstance(config, Mapping):
        normalized = dict(config or {})
    elif isinstance(config, (str, os.PathLike)):
        if config_file is not None:
            raise ConfigError(
                "config was given as a path and config_file too; pass the file once "
                "(config_file=...) and any extra fields as a mapping in config"
            )
        normalized, config_file = {}, config
    else:
        raise ConfigError(
            f"config must be a mapping or a path to a config file, got {type(config).__name__}"
        )
    if config_file is not None:
        normalized[sc.CONFIG_SOURCE_KEY] = _read_config_source(config_file)
    return normalized


def _read_config_source(path: str | os.PathLike[str]) -> dict[str, str]:
    resolved = Path(path)
    try:
        raw = resolved.read_bytes()
    except FileNotFoundError:
        raise ConfigError(
            f"config file {str(path)!r} does not exist; pass the path of the file "
            "the run was started from"
        ) from None
    except OSError as exc:
        raise ConfigError(f"config file {str(path)!r} could not be read: {exc}") from exc
    if len(raw) > MAX_CONFIG_SOURCE_BYTES:
        raise ConfigError(
            f"config file {str(path)!r} is {len(raw)} bytes, over the "
            f"{MAX_CONFIG_SOURCE_BYTES}-byte limit for a run config; pass the "
            "settings that matter as a mapping instead"
        )
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(
            f"config file {str(path)!r} is not UTF-8 text ({exc.reason} at byte "
            f"{exc.start}); a run config must be readable text"
        ) from None
    return {
        "format": _CONFIG_FORMATS.get(resolved.suffix.lower(), "text"),
        "text": text,
        "filename": resolved.name,
    }


def emit_run_start(tracer: Tracer, config: Mapping[str, Any]) -> None:
    """Send the run config once, on its own span.

    A span of its own (rather than a Resource attribute) because the config
    can be large and must be sent once, not repeated on every exported batch.
    """
    try:
        text = _dumps(config)
    except (TypeError, ValueError) as exc:
        raise ConfigError(
            f"the run config is not JSON-serialisable ({exc}); pass plain "
            "str/int/float/bool/list/dict values"
        ) from exc
    # A kind, so tracing backends do not show the run's boundaries as "unknown".
    span = tracer.start_span(
        sc.RUN_START_SPAN, attributes={sc.OPENINFERENCE_SPAN_KIND: sc.OPENINFERENCE_CHAIN}
    )
    try:
        _set_blob(span, tracer, sc.RUN_CONFIG, text)
    finally:
        span.end()


def emit_run_end(
    tracer: Tracer,
    status: str,
    error: str | None = None,
    *,
    episodes_recorded: int | None = None,
    summary: Mapping[str, Any] | None = None,
    episodes_unencodable: int = 0,
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
    text = None
    if summary is not None:
        try:
            text = json.dumps(clean_metric_values(summary), separators=(",", ":"), allow_nan=False)
        except (TypeError, ValueError) as exc:
            raise ConfigError(
                f"the run summary is not JSON-serialisable ({exc}); pass plain "
                "str/int/float/bool/list/dict values"
            ) from exc
    span = tracer.start_span(sc.RUN_END_SPAN, attributes=attributes)
    try:
        if status in _ERROR_STATUSES:
            span.set_status(Status(StatusCode.ERROR, error or status))
        if text is not None:
            _set_blob(span, tracer, sc.RUN_SUMMARY, text)
    finally:
        span.end()


# ---------------------------------------------------------------------------
# Step metrics
# ---------------------------------------------------------------------------


def emit_metrics(
    tracer: Tracer,
    values: Mapping[str, Any],
    *,
    step: int | None = None,
    timestamp: float | None = None,
) -> int:
    """Report one training step's metrics on a span of its own; returns the step.

    ``step`` is required, here or as ``values["step"]`` (which wins, as in
    prime-runs). Non-finite numbers are dropped rather than refused: a NaN
    loss is a fact about the step, not a reason to lose the whole row. The
    platform keeps one row per step, so logging a step again replaces it.
    """
    if not isinstance(values, Mapping):
        raise ConfigError(f"metrics must be a mapping of names to values, got {type(values)}")
    row = clean_metric_values(values)
    chosen = row.pop("step", step)
    if not _is_int(chosen) or chosen < 0:
        raise ConfigError(
            f"a metrics row needs its training step as a whole number of 0 or more "
            f"(step=... or values['step']), got {chosen!r}"
        )
    logged_at = row.pop("_timestamp", timestamp)
    if not isinstance(logged_at, (int, float)) or not math.isfinite(logged_at):
        logged_at = time.time()
    try:
        text = json.dumps(row, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise ConfigError(
            f"the metrics of step {chosen} are not JSON-serialisable ({exc}); pass plain "
            "str/int/float/bool/list/dict values"
        ) from exc
    attributes: Attributes = {sc.RUN_STEP: int(chosen), sc.RUN_METRICS_TIMESTAMP: float(logged_at)}
    span = tracer.start_span(
        sc.RUN_METRICS_SPAN, attributes=attributes, start_time=_ns(logged_at) or time.time_ns()
    )
    try:
        _set_blob(span, tracer, sc.RUN_METRICS_VALUES, text)
    finally:
        span.end()
    return int(chosen)


# ---------------------------------------------------------------------------
# Episodes from other instrumentations
# ---------------------------------------------------------------------------


@contextlib.contextmanager
def episode_span(
    tracer: Tracer,
    *,
    example_id: int | str,
    episode_id: str | None = None,
    env: str | None = None,
    step: int | None = None,
    group: str | None = None,
    task_type: str | None = None,
    answer: str | None = None,
) -> Iterator[Span]:
    """A current span for one rollout whose model calls another instrumentation
    traces (OpenTelemetry GenAI, OpenInference, OpenLLMetry).

    The exporter synthesises the episode record from the spans under it, so
    code that is not built on verifiers still reports whole episodes. Set the
    outcome with :func:`score_episode` before the block ends; an exception
    escaping the block marks the episode failed.
    """
    if isinstance(example_id, bool) or not isinstance(example_id, (int, str)):
        raise ConfigError(f"example_id must be an int or a str, got {example_id!r}")
    attributes: Attributes = {sc.EPISODE_EXAMPLE_ID: example_id}
    optional = {
        sc.EPISODE_ID: episode_id,
        sc.EPISODE_ENV: env,
        sc.EPISODE_GROUP: group,
        sc.EPISODE_TASK_TYPE: task_type,
        sc.EPISODE_ANSWER: answer,
    }
    attributes.update((key, value) for key, value in optional.items() if value)
    if step is not None:
        if not _is_int(step) or step < 0:
            raise ConfigError(f"step must be a whole number of 0 or more, got {step!r}")
        attributes[sc.RUN_STEP] = step
    with tracer.start_as_current_span(
        sc.episode_span_name(env), attributes=attributes, record_exception=True
    ) as span:
        yield span


def score_episode(
    span: Span,
    reward: float | None = None,
    *,
    scores: Mapping[str, float] | None = None,
    metrics: Mapping[str, float] | None = None,
) -> None:
    """The outcome of an :func:`episode_span`.

    ``reward`` is the episode's reward as the trainer uses it; ``scores`` are
    named reward components (without ``reward`` their sum is the reward);
    ``metrics`` are anything else measured.
    """
    if reward is not None:
        span.set_attribute(sc.EPISODE_REWARD, float(reward))
    for name, score in (scores or {}).items():
        span.set_attribute(sc.AGENT_REWARD_PREFIX + str(name), float(score))
    for name, value in (metrics or {}).items():
        span.set_attribute(sc.AGENT_METRIC_PREFIX + str(name), float(value))


# ---------------------------------------------------------------------------
# Episodes
# ---------------------------------------------------------------------------


def capture_content_enabled() -> bool:
    """Whether message content goes on model-call spans or their events (the GenAI switch)."""
    return capture_content_mode() != _NO_CAPTURE


def capture_content_mode() -> tuple[bool, bool]:
    """``(on spans, on events)`` as ``OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT``
    says. An unknown value captures nothing, and says so once: content is
    personal data, so a typo must not turn it on, nor silently leave it off."""
    raw = os.environ.get(sc.CAPTURE_MESSAGE_CONTENT_ENV, "").strip().lower()
    mode = _CAPTURE_MODES.get(raw)
    if mode is not None:
        return mode
    if raw not in _warned_capture_values:
        _warned_capture_values.add(raw)
        logger.warning(
            "%s=%r is not a value prime-runs-otel knows: message content stays off the "
            "spans. Use span_only, event_only, span_and_event or no_content (or true/false).",
            sc.CAPTURE_MESSAGE_CONTENT_ENV,
            raw,
        )
    return _NO_CAPTURE


def record_episode(
    tracer: Tracer,
    episode: Any,
    *,
    capture_content: bool | None = None,
    child_spans: bool = True,
    summary_attributes: bool = True,
    hand_over: HandOver | None = None,
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
    ``hand_over`` takes the record instead of the span: it is called with the
    span's context, the record, its JSON and whether orjson wrote that JSON,
    before the span ends. It is for an exporter in this process that is the
    span's only reader: the span then carries ``prime.episode.record.in_process``
    and no record, and the record is not chunked, hashed, joined and parsed
    again on its way to that exporter.
    """
    record = _as_record(episode)
    try:
        data, by_orjson = encode_record(record)
    except (TypeError, ValueError) as exc:
        raise RecordError(
            f"episode {record['id']!r} is not JSON-serialisable ({exc}); a record "
            "holds only str/int/float/bool/None/list/dict values"
        ) from exc
    if capture_content is None:
        capture = capture_content_mode() if child_spans else _NO_CAPTURE
    else:
        capture = (True, False) if capture_content else _NO_CAPTURE
    traces: list[Any] = record["traces"]
    trace_windows = [_trace_window(_mapping(item)) for item in traces]
    window = _episode_window(trace_windows)
    span = tracer.start_span(_episode_name(record), start_time=window[0])
    if not span.is_recording():  # sampled out, or no SDK behind the tracer
        span.end(end_time=window[1])
        return str(record["id"])
    try:
        if child_spans:
            parent = trace_api.set_span_in_context(span)
            for item, trace_window in zip(traces, trace_windows, strict=True):
                agent = _mapping(item)
                _emit_agent(tracer, parent, agent, _fill(trace_window, window), capture)
        if summary_attributes:
            attributes, error = _episode_attributes(record, traces)
            if child_spans:
                _put_backend_view(attributes, record, traces, capture[0])
            span.set_attributes(attributes)
            if error is not None:
                span.set_status(Status(StatusCode.ERROR, error))
        else:
            span.set_attribute(sc.EPISODE_ID, record["id"])
        if hand_over is None:
            _set_blob(span, tracer, sc.EPISODE_RECORD, data.decode("utf-8"), data)
        else:
            span.set_attribute(sc.EPISODE_RECORD_IN_PROCESS, True)
            hand_over(span.get_span_context(), record, data, by_orjson)
    finally:
        span.end(end_time=window[1])
    episode_id: str = record["id"]
    return episode_id


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


def _dumps(value: Any) -> str:
    """Compact JSON that keeps NaN/inf (the record's own floats survive the trip)."""
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False, allow_nan=True)


def _episode_name(record: Mapping[str, Any]) -> str:
    return sc.episode_span_name(_env_label(record))


def _env_label(record: Mapping[str, Any]) -> str | None:
    env = _mapping(record.get("env"))
    label = env.get("name") or env.get("id")
    return label if isinstance(label, str) and label else None


def _summary_trace(traces: list[Any]) -> Mapping[str, Any] | None:
    """First trainable trace, else the first: the one that speaks for the episode."""
    for item in traces:
        agent = _mapping(_mapping(item).get("agent"))
        if agent.get("trainable", True):
            return _mapping(item)
    return _mapping(traces[0]) if traces else None


def _put_backend_view(
    attributes: Attributes, record: Mapping[str, Any], traces: list[Any], content: bool
) -> None:
    """What tracing backends show for a whole episode: its kind, and with
    content capture on its first prompt and its final completion."""
    attributes[sc.OPENINFERENCE_SPAN_KIND] = sc.OPENINFERENCE_CHAIN
    if content:
        _put_io(attributes, _summary_trace(traces) or _EMPTY, record)


def _put_io(
    attributes: Attributes, trace: Mapping[str, Any], record: Mapping[str, Any] = _EMPTY
) -> None:
    """``input.value``: the first user message (else the task's prompt);
    ``output.value``: what the last model call produced."""
    nodes = trace.get("nodes")
    nodes = nodes if isinstance(nodes, list) else []
    prompt = next(
        (
            _content_text(_mapping(_mapping(node).get("message")).get("content"))
            for node in nodes
            if _mapping(_mapping(node).get("message")).get("role") == "user"
        ),
        None,
    )
    if prompt is None:
        task = _mapping(trace.get("task")) or _mapping(record.get("task"))
        given = _mapping(task.get("data")).get("prompt")
        prompt = _content_text(given) if given is not None else None
    if prompt:
        attributes[sc.INPUT_VALUE] = prompt
        attributes[sc.INPUT_MIME_TYPE] = "text/plain"
    calls = trace.get("calls")
    last = _mapping(calls[-1]) if isinstance(calls, list) and calls else _EMPTY
    index = last.get("node")
    if _is_int(index) and 0 <= index < len(nodes):
        message = _mapping(_mapping(nodes[index]).get("message"))
        completion = _content_text(message.get("content"))
        if not completion and message.get("tool_calls"):
            completion = _dumps(message["tool_calls"])
        if completion:
            attributes[sc.OUTPUT_VALUE] = completion
            attributes[sc.OUTPUT_MIME_TYPE] = "text/plain"


def _episode_attributes(
    record: Mapping[str, Any], traces: list[Any]
) -> tuple[Attributes, str | None]:
    """Summary attributes, and the status message when the episode failed."""
    summary = _summary_trace(traces)
    attributes: Attributes = {sc.EPISODE_ID: record["id"]}
    example_id = _example_id(record, summary)
    if example_id is not None:
        attributes[sc.EPISODE_EXAMPLE_ID] = example_id
    _put_str(attributes, sc.EPISODE_ENV, _env_label(record))
    _put_str(attributes, sc.EPISODE_GROUP, _mapping(record.get("group")).get("id"))
    ok = record.get("ok")
    if isinstance(ok, bool):
        attributes[sc.EPISODE_OK] = ok
    if summary is not None:
        reward = _reward(summary)
        if reward is not None:
            attributes[sc.EPISODE_REWARD] = reward
        _put_str(attributes, sc.EPISODE_STOP_CONDITION, summary.get("stop_condition"))
    _put_int(attributes, sc.GEN_AI_USAGE_INPUT_TOKENS, _token_total(record, traces, "input"))
    _put_int(attributes, sc.GEN_AI_USAGE_OUTPUT_TOKENS, _token_total(record, traces, "output"))
    _put_int(attributes, sc.RUN_STEP, _mapping(_mapping(record.get("run")).get("work")).get("step"))
    errors = _errors(record, summary)
    attributes[sc.EPISODE_ERROR_COUNT] = len(errors)
    last = _mapping(errors[-1]) if errors else _EMPTY
    _put_str(attributes, sc.EPISODE_ERROR_TYPE, last.get("type"))
    _put_str(attributes, sc.EPISODE_ERROR_MESSAGE, last.get("message"))
    if ok is not False:
        return attributes, None
    return attributes, _error_text(last) or "episode not ok"


def _example_id(record: Mapping[str, Any], summary: Mapping[str, Any] | None) -> int | str | None:
    for source in (summary or _EMPTY, record):
        idx = _mapping(_mapping(source.get("task")).get("data")).get("idx")
        if isinstance(idx, (int, str)) and not isinstance(idx, bool):
            return idx
    return None


def _errors(record: Mapping[str, Any], summary: Mapping[str, Any] | None) -> list[Any]:
    """The episode's own errors, else its summary trace's (where v0 rows read them)."""
    errors = record.get("errors")
    if isinstance(errors, list) and errors:
        return errors
    trace_errors = (summary or _EMPTY).get("errors")
    return trace_errors if isinstance(trace_errors, list) else []


def _token_total(record: Mapping[str, Any], traces: list[Any], side: str) -> int | None:
    key = f"num_{side}_tokens"
    value = record.get(key)
    if _is_int(value):
        return int(value)
    counts = [_mapping(item).get(key) for item in traces]
    known = [int(count) for count in counts if _is_int(count)]
    return sum(known) if known else None


def _emit_agent(
    tracer: Tracer,
    parent: Context,
    trace: Mapping[str, Any],
    window: Window,
    capture: tuple[bool, bool],
) -> None:
    agent = _mapping(trace.get("agent"))
    name = agent.get("name") if isinstance(agent.get("name"), str) else None
    attributes: Attributes = {
        sc.GEN_AI_OPERATION_NAME: sc.OPERATION_INVOKE_AGENT,
        sc.OPENINFERENCE_SPAN_KIND: sc.OPENINFERENCE_AGENT,
        sc.AGENT_TRAINABLE: bool(agent.get("trainable", True)),
    }
    _put_str(attributes, sc.GEN_AI_AGENT_NAME, name)
    _put_str(attributes, sc.OPENINFERENCE_AGENT_NAME, name)
    if capture[0]:
        _put_io(attributes, trace)
    _put_str(attributes, sc.AGENT_TRACE_ID, trace.get("id"))
    _put_str(attributes, sc.AGENT_STOP_CONDITION, trace.get("stop_condition"))
    _put_int(attributes, sc.GEN_AI_USAGE_INPUT_TOKENS, trace.get("num_input_tokens"))
    _put_int(attributes, sc.GEN_AI_USAGE_OUTPUT_TOKENS, trace.get("num_output_tokens"))
    _put_rewards(attributes, _mapping(trace.get("rewards")))
    span = tracer.start_span(
        sc.agent_span_name(name), context=parent, start_time=window[0], attributes=attributes
    )
    if trace.get("ok") is False:
        errors = trace.get("errors")
        last = _mapping(errors[-1]) if isinstance(errors, list) and errors else _EMPTY
        span.set_status(Status(StatusCode.ERROR, _error_text(last) or "trace not ok"))
    calls = trace.get("calls")
    if isinstance(calls, list) and calls:
        context = trace_api.set_span_in_context(span)
        nodes = trace.get("nodes") if capture != _NO_CAPTURE else None
        provider = agent.get("provider") or _mapping(agent.get("config")).get("provider")
        provider = provider if isinstance(provider, str) and provider else sc.DEFAULT_PROVIDER
        for call in calls:
            _emit_call(tracer, context, _mapping(call), window, nodes, capture, provider)
    span.end(end_time=window[1])


def _put_rewards(attributes: Attributes, rewards: Mapping[str, Any]) -> None:
    total: float | None = None
    written = 0
    for name, reward in rewards.items():
        score = _number(_mapping(reward).get("score"))
        if score is None:
            continue
        weight = _number(_mapping(reward).get("weight"))
        total = (total or 0.0) + score * (1.0 if weight is None else weight)
        if written < sc.MAX_SUB_REWARD_ATTRIBUTES:
            attributes[sc.AGENT_REWARD_PREFIX + str(name)] = score
            written += 1
    if total is not None:
        attributes[sc.AGENT_REWARD] = total


def _reward(trace: Mapping[str, Any]) -> float | None:
    """Sum of score x weight; None when nothing was scored (not the same as 0)."""
    total: float | None = None
    for reward in _mapping(trace.get("rewards")).values():
        score = _number(_mapping(reward).get("score"))
        if score is not None:
            weight = _number(_mapping(reward).get("weight"))
            total = (total or 0.0) + score * (1.0 if weight is None else weight)
    return total


def _emit_call(
    tracer: Tracer,
    parent: Context,
    call: Mapping[str, Any],
    window: Window,
    nodes: Any,
    capture: tuple[bool, bool],
    provider: str,
) -> None:
    model = call.get("model") if isinstance(call.get("model"), str) else None
    attributes: Attributes = {
        sc.GEN_AI_OPERATION_NAME: sc.OPERATION_CHAT,
        sc.GEN_AI_PROVIDER_NAME: provider,
        sc.OPENINFERENCE_SPAN_KIND: sc.OPENINFERENCE_LLM,
        sc.LLM_PROVIDER: provider,
    }
    if model:
        attributes[sc.GEN_AI_REQUEST_MODEL] = model
        attributes[sc.GEN_AI_RESPONSE_MODEL] = model
        attributes[sc.LLM_MODEL_NAME] = model
    _put_usage(attributes, _mapping(call.get("usage")))
    finish_reason = call.get("finish_reason")
    if isinstance(finish_reason, str):
        attributes[sc.GEN_AI_RESPONSE_FINISH_REASONS] = (finish_reason,)
    error = _mapping(call.get("error"))
    _put_str(attributes, sc.ERROR_TYPE, error.get("type"))
    messages: Attributes = {}
    if isinstance(nodes, list):
        _put_messages(messages, nodes, call.get("node"), finish_reason, bool(error))
    if messages and capture[0]:
        attributes.update(messages)
        attributes[sc.INPUT_VALUE] = messages[sc.GEN_AI_INPUT_MESSAGES]
        attributes[sc.INPUT_MIME_TYPE] = "application/json"
        attributes[sc.OUTPUT_VALUE] = messages[sc.GEN_AI_OUTPUT_MESSAGES]
        attributes[sc.OUTPUT_MIME_TYPE] = "application/json"
    call_time = _mapping(call.get("time"))
    start = _ns(call_time.get("start")) or window[0]
    end = max(_ns(call_time.get("end")) or window[1], start)
    span = tracer.start_span(
        sc.chat_span_name(model),
        context=parent,
        kind=trace_api.SpanKind.CLIENT,
        start_time=start,
        attributes=attributes,
    )
    if messages and capture[1]:
        span.add_event(sc.GEN_AI_INFERENCE_DETAILS_EVENT, messages, timestamp=end)
    if error:
        span.set_status(Status(StatusCode.ERROR, _error_text(error) or "model call failed"))
    span.end(end_time=end)


def _put_usage(attributes: Attributes, usage: Mapping[str, Any]) -> None:
    """Token counts in the GenAI shape: input tokens include cache reads."""
    prompt, cached = usage.get("prompt_tokens"), usage.get("cached_input_tokens")
    if _is_int(prompt):
        attributes[sc.GEN_AI_USAGE_INPUT_TOKENS] = int(prompt) + (
            int(cached) if _is_int(cached) else 0
        )
    _put_int(attributes, sc.GEN_AI_USAGE_OUTPUT_TOKENS, usage.get("completion_tokens"))
    _put_int(attributes, sc.GEN_AI_USAGE_CACHE_READ_INPUT_TOKENS, cached)
    _put_int(attributes, sc.GEN_AI_USAGE_REASONING_OUTPUT_TOKENS, usage.get("reasoning_tokens"))
    fed, produced = attributes.get(sc.GEN_AI_USAGE_INPUT_TOKENS), usage.get("completion_tokens")
    if fed is not None:
        attributes[sc.LLM_TOKEN_COUNT_PROMPT] = fed
    if _is_int(produced):
        attributes[sc.LLM_TOKEN_COUNT_COMPLETION] = int(produced)
        if fed is not None:
            attributes[sc.LLM_TOKEN_COUNT_TOTAL] = fed + int(produced)


# ---------------------------------------------------------------------------
# Message content in the GenAI conventions' shape (only with capture on)
# ---------------------------------------------------------------------------


def _put_messages(
    attributes: Attributes,
    nodes: list[Any],
    index: Any,
    finish_reason: Any,
    failed: bool,
) -> None:
    """Input = the path from the root to the node's parent; output = the node."""
    if not _is_int(index) or not 0 <= index < len(nodes):
        return
    path: list[Any] = []
    parent = _mapping(nodes[index]).get("parent")
    while _is_int(parent) and 0 <= parent < len(nodes) and len(path) < len(nodes):
        path.append(_mapping(nodes[parent]).get("message"))
        parent = _mapping(nodes[parent]).get("parent")
    path.reverse()
    inputs = [_genai_message(_mapping(message)) for message in path]
    output = _genai_message(_mapping(_mapping(nodes[index]).get("message")))
    reason = finish_reason if isinstance(finish_reason, str) else ("error" if failed else "stop")
    output["finish_reason"] = reason
    attributes[sc.GEN_AI_INPUT_MESSAGES] = _dumps(inputs)
    attributes[sc.GEN_AI_OUTPUT_MESSAGES] = _dumps([output])


def _genai_message(message: Mapping[str, Any]) -> dict[str, Any]:
    role = message.get("role")
    parts: list[dict[str, Any]] = []
    reasoning = message.get("reasoning_content")
    if isinstance(reasoning, str) and reasoning:
        parts.append({"type": "reasoning", "content": reasoning})
    if role == "tool":
        response = _content_text(message.get("content"))
        parts.append(
            {"type": "tool_call_response", "id": message.get("tool_call_id"), "response": response}
        )
    else:
        parts.extend(_content_parts(message.get("content")))
    for call in message.get("tool_calls") or ():
        tool_call = _mapping(call)
        parts.append(
            {
                "type": "tool_call",
                "id": tool_call.get("id"),
                "name": tool_call.get("name"),
                # Parsed when the model emitted JSON (what viewers expect).
                "arguments": parsed_if_json(tool_call.get("arguments")),
            }
        )
    return {"role": role if isinstance(role, str) else "user", "parts": parts}


def _content_parts(content: Any) -> list[dict[str, Any]]:
    if isinstance(content, str):
        return [{"type": "text", "content": content}] if content else []
    parts: list[dict[str, Any]] = []
    for part in content if isinstance(content, list) else ():
        item = _mapping(part)
        if item.get("type") == "text":
            parts.append({"type": "text", "content": item.get("text", "")})
        elif item.get("type") == "image_url":
            url = _mapping(item.get("image_url")).get("url", "")
            parts.append({"type": "uri", "modality": "image", "uri": url})
        elif isinstance(item.get("type"), str):
            parts.append(dict(item))
    return parts


def _content_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        return ""
    texts = [_mapping(part).get("text") for part in content]
    return "\n".join(text for text in texts if isinstance(text, str))


# ---------------------------------------------------------------------------
# Times
# ---------------------------------------------------------------------------


def _trace_window(trace: Mapping[str, Any]) -> tuple[int | None, int | None]:
    """Earliest start and latest end the trace recorded, in epoch nanoseconds."""
    timing = _mapping(trace.get("timing"))
    first = _ns(timing.get("start"))
    last: int | None = None
    calls = trace.get("calls")
    spans = [_mapping(timing.get(stage)) for stage in _TIMING_STAGES]
    if isinstance(calls, list):
        spans.extend(_mapping(_mapping(call).get("time")) for call in calls)
    for span in spans:
        start, end = _ns(span.get("start")), _ns(span.get("end"))
        if start is not None and (first is None or start < first):
            first = start
        if end is not None and (last is None or end > last):
            last = end
    return first, last


def _episode_window(windows: list[tuple[int | None, int | None]]) -> Window:
    """The traces' combined window; the recording moment stands in for what is unknown."""
    starts = [start for start, _ in windows if start is not None]
    ends = [end for _, end in windows if end is not None]
    now = time.time_ns()
    start = min(starts) if starts else min([now, *ends])
    end = max(ends) if ends else max(start, now)
    return start, max(start, end)


def _fill(window: tuple[int | None, int | None], fallback: Window) -> Window:
    start = window[0] if window[0] is not None else fallback[0]
    end = window[1] if window[1] is not None else fallback[1]
    return start, max(start, end)


def _ns(seconds: Any) -> int | None:
    """Epoch seconds to nanoseconds; 0 and missing mean "not recorded"."""
    kind = type(seconds)  # exact float/int first: the common case, and bool is excluded
    if (kind is not float and kind is not int) and (
        not isinstance(seconds, (int, float)) or isinstance(seconds, bool)
    ):
        return None
    return int(seconds * 1_000_000_000) if seconds > 0 and math.isfinite(seconds) else None


# ---------------------------------------------------------------------------
# Blob transport
# ---------------------------------------------------------------------------


def _set_blob(span: Span, tracer: Tracer, key: str, text: str, data: bytes | None = None) -> None:
    """Chunk ``text`` under the length limit and pin its size and digest
    (computed over ``data``, its UTF-8 bytes, when the caller has them).

    Set last on the span so count-based eviction takes older attributes first.
    """
    if data is None:
        data = text.encode("utf-8")
    step = max(1, _length_limit(span, tracer) or sc.DEFAULT_BLOB_CHUNK_CHARS)
    chunks = (
        [text]
        if len(text) <= step
        else [text[offset : offset + step] for offset in range(0, len(text), step)]
    )
    span.set_attribute(sc.blob_size_key(key), len(data))
    span.set_attribute(sc.blob_sha256_key(key), sc.blob_sha256(data))
    span.set_attribute(key, chunks)


def _length_limit(span: Span, tracer: Tracer) -> int | None:
    """The tightest attribute value length limit in force, if any is known.

    Read from the SDK objects first (what actually truncates), then from the
    environment (what a tracer built later, or elsewhere, would use). All of
    it defensively: a tracer that is not the SDK's simply has no limit here.
    """
    limits: list[int] = []
    for holder in (getattr(span, "_limits", None), getattr(tracer, "_span_limits", None)):
        value = getattr(holder, "max_span_attribute_length", None)
        if isinstance(value, int) and value >= 0:
            limits.append(value)
    for variable in (sc.SPAN_ATTRIBUTE_VALUE_LENGTH_LIMIT_ENV, sc.ATTRIBUTE_VALUE_LENGTH_LIMIT_ENV):
        raw = os.environ.get(variable, "").strip()
        if raw.isdigit():
            limits.append(int(raw))
    return min(limits) if limits else None


# ---------------------------------------------------------------------------
# Small readers for records that may be hand-written
# ---------------------------------------------------------------------------


def _mapping(value: Any) -> Mapping[str, Any]:
    # dict first: the ABC check costs ten times more, and records are dicts.
    return value if type(value) is dict or isinstance(value, Mapping) else _EMPTY


def _is_int(value: Any) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


def _number(value: Any) -> float | None:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    return None


def _put_str(attributes: Attributes, key: str, value: Any) -> None:
    if isinstance(value, str) and value:
        attributes[key] = value


def _put_int(attributes: Attributes, key: str, value: Any) -> None:
    if _is_int(value):
        attributes[key] = int(value)


def _error_text(error: Mapping[str, Any]) -> str | None:
    kind, message = error.get("type"), error.get("message")
    if isinstance(kind, str) and isinstance(message, str):
        return f"{kind}: {message}"
    text = message if isinstance(message, str) else kind
    return text if isinstance(text, str) else None
