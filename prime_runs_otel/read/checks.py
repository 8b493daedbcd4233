"""Every value a span brings in, checked once, where it comes in.

The consumer half of the span contract in :mod:`prime_runs_otel.semconv`. One
pass over a span (:func:`read_span`) or over its Resource (:func:`run_identity`)
returns the typed values of :mod:`~prime_runs_otel.read.records` (an episode as
:mod:`~prime_runs_otel.read.episodes` has it), or a refusal that says why
(:class:`~prime_runs_otel.read.episodes.CorruptEpisode`,
:class:`~prime_runs_otel.read.records.CorruptMetrics`). Everything after this
step reads those values and checks nothing again. It reads
:class:`~prime_runs_otel.read.spans.SpanView` only, so spans exported in
process and spans received over OTLP are checked alike.

Spans reach ``serve`` from anyone who can reach its port, and every stage
after intake (the spool, projection, Prime Traces lines, the platform's JSON)
has limits of its own: SQLite integers are 64-bit, ``float()`` refuses
integers past about 1.8e308, UTF-8 has no lone surrogates, and JSON encoders
recurse once per nesting level. A value that passes intake but breaks a later
stage would fail there over and over (a delivery pass, a retried commit), far
from the span that brought it. So the limits of every later stage are checked
here, once, where the value enters, and a value past them is refused with
that item's own :class:`~prime_runs_otel.errors.RecordError`.

A transported record is accepted only when its byte length and SHA-256 match
what the producer pinned: an attribute limit somewhere on the way (the SDK,
a collector processor) must show up as a counted loss, never as a corrupt
row on the platform.

The rules and the small readers (:mod:`~prime_runs_otel.read.value_rules`)
are applied here, in one trip over the span. The readers of other
instrumentations' spans (:mod:`~prime_runs_otel.read.dialects`) take their
values with the same small readers, and the record they build is checked
with :func:`check_json_value` before the spool takes it.
"""

from __future__ import annotations

import base64
import json
import logging
from collections.abc import Mapping, Sequence
from typing import Any

from .. import semconv as sc
from .._encoded_here import encoded_here
from .._json import MAX_NESTING, parse
from ..errors import RecordError
from .episodes import CorruptEpisode, EpisodeArrival, episode_arrival
from .projection.step_table import unnamed_step_table
from .projection.summary import digest_episode
from .records import (
    CorruptMetrics,
    RunEnd,
    RunIdentity,
    RunMetrics,
    RunSamples,
    RunStart,
    SpanMeaning,
    UnrecordedEpisode,
)
from .spans import SpanView
from .value_rules import (
    INT64_MAX,
    INT64_MIN,
    check_json_value,
    finite_number,
    text_or_none,
    texts,
    whole_number,
)

__all__ = [
    "INT64_MAX",
    "INT64_MIN",
    "MAX_NESTING",
    "check_json_value",
    "decode_blob",
    "derived_episode_id",
    "finite_number",
    "read_record",
    "read_span",
    "read_synthesized",
    "record_step",
    "run_identity",
    "text_or_none",
    "whole_number",
]

logger = logging.getLogger(__name__)

# -- the pass over a span ---------------------------------------------------------------


def run_identity(resource: Mapping[str, Any]) -> RunIdentity | None:
    """The run a span belongs to, or ``None`` for spans from outside any run."""
    local_id = resource.get(sc.RUN_ID)
    if not isinstance(local_id, str) or not local_id:
        return None
    kind = _run_kind(resource)
    if kind != resource.get(sc.RUN_KIND, "eval"):
        logger.warning(
            "run %s has unknown %s=%r; treating it as eval",
            local_id,
            sc.RUN_KIND,
            resource.get(sc.RUN_KIND),
        )
    return RunIdentity(
        local_id=local_id,
        kind=kind,
        name=text_or_none(resource.get(sc.RUN_NAME)),
        model=text_or_none(resource.get(sc.RUN_MODEL)),
        environments=texts(resource.get(sc.RUN_ENVIRONMENTS)),
        framework=text_or_none(resource.get(sc.RUN_FRAMEWORK)),
        tags=texts(resource.get(sc.RUN_TAGS)),
        description=text_or_none(resource.get(sc.RUN_DESCRIPTION)),
        attach=text_or_none(resource.get(sc.RUN_ATTACH)),
        team_id=text_or_none(resource.get(sc.RUN_TEAM_ID)),
        max_steps=whole_number(resource.get(sc.RUN_MAX_STEPS)),
        batch_size=whole_number(resource.get(sc.RUN_BATCH_SIZE)),
        rollouts_per_example=whole_number(resource.get(sc.RUN_ROLLOUTS_PER_EXAMPLE)),
        seq_len=whole_number(resource.get(sc.RUN_SEQ_LEN)),
        wandb_project=text_or_none(resource.get(sc.RUN_WANDB_PROJECT)),
        wandb_entity=text_or_none(resource.get(sc.RUN_WANDB_ENTITY)),
        wandb_run_name=text_or_none(resource.get(sc.RUN_WANDB_RUN_NAME)),
    )


def _run_kind(resource: Mapping[str, Any]) -> str:
    kind = resource.get(sc.RUN_KIND, "eval")
    return kind if kind in sc.RUN_KINDS else "eval"


def read_span(view: SpanView, *, lines: bool = False) -> SpanMeaning | None:
    """What one span says about its run; ``None`` for spans that are not ours.

    Agent and model-call spans return ``None`` too: everything the platform
    needs is on the episode span's record, or is synthesised from the span
    tree under an :class:`UnrecordedEpisode`. ``lines``: the reader's runs
    go to Prime Traces, so an episode read here gets its line template built
    while its record is parsed (:attr:`EpisodeArrival.line`).
    """
    if view.prepared is not None:
        return view.prepared
    attributes = view.attributes
    if sc.EPISODE_ID in attributes or sc.EPISODE_EXAMPLE_ID in attributes:
        if _carries_record(attributes) or sc.EPISODE_EXAMPLE_ID not in attributes:
            return _read_episode(
                attributes,
                verify_digest=not view.in_process,
                line_for=_run_kind(view.resource) if lines else None,
                span_id=view.span_id if view.in_process else None,
            )
        return UnrecordedEpisode(_episode_id_of(view), view)
    if view.name == sc.RUN_METRICS_SPAN:
        return _read_metrics(view)
    if view.name == sc.RUN_SAMPLES_SPAN:
        return _read_samples(view)
    if view.name == sc.RUN_START_SPAN:
        return _read_run_start(attributes)
    if view.name == sc.RUN_END_SPAN:
        return _read_run_end(attributes)
    return None


def record_step(record: Mapping[str, Any], span_step: Any = None) -> int | None:
    """The training step an episode is training work of, else ``None``.

    The record's ``run.work`` decides when it has one (verifiers'
    ``TrainRunInfo``): eval work dispatched during training has a step but no
    row in the training sample table. Records without it (other producers)
    fall back to the span's ``prime.run.step``.
    """
    run = record.get("run")
    work = run.get("work") if isinstance(run, Mapping) else None
    if isinstance(work, Mapping):
        if work.get("type", "train") != "train":
            return None
        return whole_number(work.get("step"))
    return whole_number(span_step)


def derived_episode_id(view: SpanView) -> str:
    """An id for an episode span that names none: its trace and span ids, so a
    copy of the same span (a collector's retry) is the same episode."""
    return _span_key(view)


def _episode_id_of(view: SpanView) -> str:
    given = view.attributes.get(sc.EPISODE_ID)
    return given if isinstance(given, str) and given else derived_episode_id(view)


def _carries_record(attributes: Mapping[str, Any]) -> bool:
    """Any part of a record blob: a partial one is a damaged record, not a
    span to synthesise from."""
    key = sc.EPISODE_RECORD
    return any(name in attributes for name in (key, sc.blob_size_key(key), sc.blob_sha256_key(key)))


def _read_episode(
    attributes: Mapping[str, Any],
    *,
    verify_digest: bool = True,
    line_for: str | None = None,
    span_id: int | None = None,
) -> EpisodeArrival | CorruptEpisode:
    """``span_id``: the span was made in this process, whose producer may
    have noted the record it encoded on it (see :mod:`prime_runs_otel._encoded_here`)."""
    raw_id = attributes.get(sc.EPISODE_ID)
    episode_id = raw_id if isinstance(raw_id, str) and raw_id else None
    if attributes.get(sc.EPISODE_RECORD_IN_PROCESS) is True:
        return CorruptEpisode(
            episode_id,
            "its record was handed straight to the exporter of the process that made it, "
            "and only that exporter can read it: give the run another span processor "
            "(run.add_exporter or the provider's add_span_processor) for spans that carry it",
        )
    noted = _noted_here(attributes, span_id) if span_id is not None else None
    if noted is not None:
        raw = noted
    else:
        try:
            raw = decode_blob(attributes, sc.EPISODE_RECORD, verify_digest=verify_digest)
        except RecordError as exc:
            return CorruptEpisode(episode_id, str(exc))
    try:
        record, plain_scalars = parse(raw)
    except (ValueError, RecursionError) as exc:
        return CorruptEpisode(episode_id, f"the episode record is not valid JSON: {exc}")
    if not isinstance(record, dict):
        return CorruptEpisode(episode_id, "the episode record is not a JSON object")
    if episode_id is None or record.get("id") != episode_id:
        return CorruptEpisode(
            episode_id,
            f"the record's id {record.get('id')!r} does not match the span's "
            f"{sc.EPISODE_ID}={raw_id!r}",
        )
    return read_record(
        record,
        raw,
        plain_scalars=plain_scalars,
        span_step=attributes.get(sc.RUN_STEP),
        line_for=line_for,
        written_here=noted is not None,
    )


def _noted_here(attributes: Mapping[str, Any], span_id: int) -> bytes | None:
    """The record's bytes as this process's producer encoded them, when the
    span still carries exactly what it set, size and digest included;
    ``None`` sends the span down the ordinary path, which says what is wrong."""
    key = sc.EPISODE_RECORD
    data = encoded_here.take(span_id, attributes.get(key))
    if data is None or not isinstance(attributes.get(sc.blob_sha256_key(key)), str):
        return None
    return data if whole_number(attributes.get(sc.blob_size_key(key))) == len(data) else None


def read_record(
    record: dict[str, Any],
    raw: bytes,
    *,
    plain_scalars: bool = False,
    span_step: Any = None,
    line_for: str | None = None,
    written_here: bool = False,
) -> EpisodeArrival | CorruptEpisode:
    """An episode record as the spool takes it, or why it cannot be taken.

    ``raw`` is the record serialised; ``plain_scalars`` says orjson parsed or
    wrote it (see :func:`check_json_value`). Called once the record is
    parsed from its span (or synthesised).
    ``line_for`` (a run type) also builds the record's Prime Traces line
    template, for a run that will upload it. ``written_here``: ``raw`` is
    what orjson wrote in this process within the nesting limit (see
    :mod:`prime_runs_otel._encoded_here`), so it holds nothing to check.
    """
    episode_id = str(record.get("id"))
    if not written_here:
        try:
            check_json_value(record, "the episode record", raw, plain_scalars=plain_scalars)
        except RecordError as exc:
            return CorruptEpisode(episode_id, str(exc))
    step = record_step(record, span_step)
    return episode_arrival(record, raw, episode_id, step, line_for=line_for)


def read_synthesized(record: dict[str, Any], episode_id: str, span_step: Any) -> EpisodeArrival:
    """A record synthesised from a span tree, checked as one read off a span
    is; raises what it finds wrong (the caller counts the episode lost).
    ``span_step`` is the episode span's ``prime.run.step``."""
    raw = json.dumps(record, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    check_json_value(record, "the synthesised record")
    digest = digest_episode(record)
    step = record_step(record, span_step)
    return EpisodeArrival(episode_id, raw, digest, step)


def _read_metrics(view: SpanView) -> RunMetrics | CorruptMetrics:
    attributes = view.attributes
    step = whole_number(attributes.get(sc.RUN_STEP))
    if step is None:
        return CorruptMetrics(None, f"the metrics span has no whole-number {sc.RUN_STEP}")
    if step < 0:
        # Steps count from 0, as prime-rl's do and as the platform keeps one
        # row per step: a negative one is nobody's step (log_metrics refuses it).
        return CorruptMetrics(
            None,
            f"the metrics span's {sc.RUN_STEP} is {step}; a step is a whole number of 0 or more",
        )
    try:
        raw = decode_blob(attributes, sc.RUN_METRICS_VALUES)
        values = json.loads(raw)
        check_json_value(values, "the metrics", raw)
    except (RecordError, ValueError, RecursionError) as exc:
        return CorruptMetrics(step, f"the metrics of step {step} are damaged: {exc}")
    if not isinstance(values, dict):
        return CorruptMetrics(step, f"the metrics of step {step} are not a JSON object")
    timestamp = attributes.get(sc.RUN_METRICS_TIMESTAMP)
    if isinstance(timestamp, str):
        try:
            timestamp = float(timestamp)
        except ValueError:
            timestamp = None
    if not isinstance(timestamp, (int, float)) or isinstance(timestamp, bool):
        timestamp = 0.0
    if attributes.get(sc.RUN_METRICS_VERBATIM) is True:
        # One post per span: a copy of the span (a collector's retry) has its ids.
        return RunMetrics(step, values, float(timestamp), verbatim=True, key=_span_key(view))
    return RunMetrics(step, values, float(timestamp))


def _read_samples(view: SpanView) -> RunSamples | CorruptMetrics:
    """A sample table's Parquet object; a damaged one is a counted loss."""
    step = whole_number(view.attributes.get(sc.RUN_STEP))
    if step is None or step < 0:
        return CorruptMetrics(None, f"a sample table span has no step of 0 or more ({sc.RUN_STEP})")
    try:
        text = decode_blob(view.attributes, sc.RUN_SAMPLES_PARQUET)
        body = base64.b64decode(text, validate=True)
        unnamed_step_table(body)
    except (RecordError, ValueError) as exc:
        return CorruptMetrics(step, f"the sample table of step {step} is damaged: {exc}")
    return RunSamples(step, body, _span_key(view))


def _span_key(view: SpanView) -> str:
    return f"{view.trace_id:032x}{view.span_id:016x}"


def _read_run_start(attributes: Mapping[str, Any]) -> RunStart:
    owner = attributes.get(sc.RUN_OWNER) is not False
    try:
        raw = decode_blob(attributes, sc.RUN_CONFIG)
        config = json.loads(raw)
        check_json_value(config, "the run config", raw)
    except (RecordError, ValueError, RecursionError) as exc:
        reason = f"the run config is damaged: {exc}"
    else:
        if isinstance(config, dict):
            return RunStart(config, owner=owner)
        reason = "the run config is not a JSON object"
    # Logged where it is filed under its run, once a window however many
    # copies arrive (read.ingest).
    return RunStart({}, corrupt_reason=reason, owner=owner)


def _read_run_end(attributes: Mapping[str, Any]) -> RunEnd:
    status = attributes.get(sc.RUN_STATUS)
    error = text_or_none(attributes.get(sc.RUN_ERROR))
    if status not in sc.RUN_STATUSES:
        error = f"the run ended with an unknown {sc.RUN_STATUS}={status!r}" + (
            f": {error}" if error else ""
        )
        status = "failed"
    count = whole_number(attributes.get(sc.RUN_EPISODES_RECORDED))
    unencodable = whole_number(attributes.get(sc.RUN_EPISODES_UNENCODABLE)) or 0
    summary = None
    if sc.RUN_SUMMARY in attributes:
        try:
            summary = json.loads(decode_blob(attributes, sc.RUN_SUMMARY))
        except (RecordError, ValueError, RecursionError) as exc:
            logger.warning("the run summary is damaged (%s); the aggregated one is sent", exc)
        if not isinstance(summary, dict):
            summary = None
    return RunEnd(
        status=str(status),
        error=error,
        episodes_recorded=count,
        summary=summary,
        episodes_unencodable=unencodable,
    )


# -- blobs: a value chunked over attributes, proven whole ------------------------------


def decode_blob(attributes: Mapping[str, Any], key: str, *, verify_digest: bool = True) -> bytes:
    """Reassemble a blob and prove it whole, or raise :class:`RecordError` saying why.

    The SHA-256 is checked where the blob crossed a process boundary (OTLP,
    a collector); ``verify_digest=False`` is for a span read in the process
    that made it, where only a length limit can have touched it and the size
    says so. Hashing is a tenth of the export path's CPU for a large record.
    """
    text = _joined_chunks(attributes.get(key), key)
    size = whole_number(attributes.get(sc.blob_size_key(key)))
    digest = attributes.get(sc.blob_sha256_key(key))
    if size is None or not isinstance(digest, str):
        raise RecordError(
            f"{key} lacks its {sc.blob_size_key(key)} or {sc.blob_sha256_key(key)} "
            "attribute (evicted by an attribute count limit?)"
        )
    try:
        data = text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise RecordError(f"{key} is not valid text ({exc.reason})") from None
    if len(data) != size:
        raise RecordError(
            f"{key} arrived as {len(data)} bytes but {size} were sent: it was truncated "
            "on the way (an attribute value length limit in an SDK or collector?)"
        )
    if verify_digest and sc.blob_sha256(data) != digest:
        raise RecordError(f"{key} does not match its SHA-256: it was altered on the way")
    return data


def _joined_chunks(value: Any, key: str) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, Sequence) and all(isinstance(chunk, str) for chunk in value):
        return "".join(value)
    if value is None:
        raise RecordError(f"{key} is missing (evicted by an attribute count limit?)")
    raise RecordError(f"{key} is a {type(value).__name__}, expected an array of strings")
