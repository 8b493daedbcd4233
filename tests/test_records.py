"""The consumer side: span views, run identity, and records proven whole or counted lost.

Spans are produced by the real instrumentation through real SDK pipelines;
damage is done the ways it happens in practice (a length limit the producer
did not know about, a lost chunk, an evicted attribute).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import math
from collections.abc import Iterator, Mapping
from typing import Any

import pytest
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, SpanLimits, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import Status, StatusCode

from prime_runs_otel import semconv as sc
from prime_runs_otel.errors import RecordError
from prime_runs_otel.produce.episode import record_episode
from prime_runs_otel.produce.resource import run_resource
from prime_runs_otel.produce.run_spans import emit_run_end, emit_run_start
from prime_runs_otel.produce.synthetic import synthetic_episode
from prime_runs_otel.read.checks import decode_blob, read_span, run_identity
from prime_runs_otel.read.episodes import CorruptEpisode, EpisodeArrival
from prime_runs_otel.read.ingest import group_by_run
from prime_runs_otel.read.records import RunEnd, RunIdentity, RunStart
from prime_runs_otel.read.spans import SpanView, from_readable_span

RECORD_SIZE = sc.blob_size_key(sc.EPISODE_RECORD)
RECORD_SHA256 = sc.blob_sha256_key(sc.EPISODE_RECORD)


def compact(value: Any) -> bytes:
    """The producer's serialisation, as the contract documents it."""
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False, allow_nan=True).encode()


class Pipeline:
    """A real SDK pipeline exporting into memory, read back as span views."""

    def __init__(self, limits: SpanLimits | None = None, *, batch: bool = False) -> None:
        self.exporter = InMemorySpanExporter()
        self.provider = TracerProvider(
            resource=run_resource(run_id="run-1", name="records", environments=["math"]),
            span_limits=limits,
        )
        processor = (
            BatchSpanProcessor(self.exporter) if batch else SimpleSpanProcessor(self.exporter)
        )
        self.provider.add_span_processor(processor)
        self.tracer = self.provider.get_tracer("tests")

    def views(self) -> list[SpanView]:
        self.provider.force_flush()
        return [from_readable_span(span) for span in self.exporter.get_finished_spans()]

    def episode_view(self) -> SpanView:
        (view,) = [view for view in self.views() if sc.EPISODE_ID in view.attributes]
        return view


@pytest.fixture
def pipeline() -> Iterator[Pipeline]:
    built = Pipeline()
    yield built
    built.provider.shutdown()


def with_attributes(view: SpanView, attributes: Mapping[str, Any]) -> SpanView:
    return SpanView(
        name=view.name,
        trace_id=view.trace_id,
        span_id=view.span_id,
        parent_span_id=view.parent_span_id,
        start_ns=view.start_ns,
        end_ns=view.end_ns,
        attributes=attributes,
        resource=view.resource,
        status_error=view.status_error,
        status_message=view.status_message,
    )


# ---------------------------------------------------------------------------
# Round trips
# ---------------------------------------------------------------------------


def test_records_round_trip_through_a_batch_pipeline() -> None:
    batched = Pipeline(batch=True)
    try:
        records = [synthetic_episode(index, seed=5) for index in range(25)]
        records[3]["traces"][0]["rewards"]["correct"] = {"score": math.nan, "weight": 1.0}
        records[4]["traces"][0]["info"] = {"note": 'Søren 🧮 ∑ 日本語 e\u0301 \u2028 \x00 "q"'}
        records[5]["traces"][0]["metrics"] = {"up": math.inf, "down": -math.inf}
        for record in records:
            record_episode(batched.tracer, record)
        arrivals = [read_span(view) for view in batched.views()]
    finally:
        batched.provider.shutdown()

    episodes = {item.episode_id: item for item in arrivals if isinstance(item, EpisodeArrival)}
    assert list(episodes) == [record["id"] for record in records]
    for record in records:
        arrival = episodes[record["id"]]
        assert arrival.raw == compact(record)
        # NaN is not equal to itself; the exact bytes above already prove it survived.
        assert compact(arrival.record) == arrival.raw
    assert math.isnan(episodes[records[3]["id"]].record["traces"][0]["rewards"]["correct"]["score"])
    assert episodes[records[4]["id"]].record == records[4]


def test_a_record_whose_scores_are_not_numbers_is_a_counted_loss(pipeline: Pipeline) -> None:
    record = synthetic_episode(2, seed=5)
    record["traces"][0]["rewards"] = {"correct": {"score": "high", "weight": 1.0}}
    record_episode(pipeline.tracer, record)

    arrival = read_span(pipeline.episode_view())

    assert isinstance(arrival, CorruptEpisode)
    assert arrival.episode_id == record["id"]
    assert "verifiers shape" in arrival.reason


def test_a_20_mb_record_round_trips(pipeline: Pipeline) -> None:
    record = synthetic_episode(9, target_bytes=20 * 1024 * 1024)
    record_episode(pipeline.tracer, record)
    view = pipeline.episode_view()
    arrival = read_span(view)

    assert isinstance(arrival, EpisodeArrival)
    assert len(arrival.raw) >= 20 * 1024 * 1024
    assert len(view.attributes[sc.EPISODE_RECORD]) == math.ceil(
        len(arrival.raw.decode()) / sc.DEFAULT_BLOB_CHUNK_CHARS
    )
    assert arrival.record == record


def test_a_20_mb_record_round_trips_under_a_4096_length_limit(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT", "4096")
    limited = Pipeline()
    try:
        record = synthetic_episode(10, target_bytes=20 * 1024 * 1024)
        record_episode(limited.tracer, record)
        view = limited.episode_view()
        arrival = read_span(view)
    finally:
        limited.provider.shutdown()

    assert isinstance(arrival, EpisodeArrival)
    assert len(view.attributes[sc.EPISODE_RECORD]) > 5000
    assert arrival.raw == compact(record)


# ---------------------------------------------------------------------------
# Damage is detected, never passed on
# ---------------------------------------------------------------------------


def test_a_length_limit_on_a_second_pipeline_is_detected() -> None:
    """The producer chunked for no limit; a relay with a limit truncated the chunks."""
    producer, relay = Pipeline(), Pipeline(SpanLimits(max_span_attribute_length=1024))
    try:
        record = synthetic_episode(4, target_bytes=30_000)
        record_episode(producer.tracer, record)
        original = producer.episode_view()
        relayed_span = relay.tracer.start_span(original.name, attributes=dict(original.attributes))
        relayed_span.end()
        relayed = relay.episode_view()
    finally:
        producer.provider.shutdown()
        relay.provider.shutdown()

    outcome = read_span(relayed)
    assert isinstance(outcome, CorruptEpisode)
    assert outcome.episode_id == record["id"]
    assert "truncated" in outcome.reason
    assert isinstance(read_span(original), EpisodeArrival)


@pytest.mark.parametrize(
    ("damage", "complaint"),
    [
        (lambda a: a.update({sc.EPISODE_RECORD: a[sc.EPISODE_RECORD][:-1]}), "truncated"),
        (lambda a: a.update({sc.EPISODE_RECORD: list(reversed(a[sc.EPISODE_RECORD]))}), "SHA-256"),
        (lambda a: a.pop(sc.EPISODE_RECORD), "missing"),
        (lambda a: a.pop(RECORD_SIZE), "lacks its"),
        (lambda a: a.pop(RECORD_SHA256), "lacks its"),
        (lambda a: a.update({sc.EPISODE_RECORD: 42}), "expected an array of strings"),
        (lambda a: a.update({RECORD_SHA256: a[RECORD_SHA256][:40]}), "SHA-256"),
    ],
)
def test_lost_or_altered_chunks_make_a_corrupt_episode(damage: Any, complaint: str) -> None:
    limited = Pipeline(SpanLimits(max_span_attribute_length=512))
    try:
        record = synthetic_episode(6, target_bytes=8_000)
        record_episode(limited.tracer, record)
        view = limited.episode_view()
    finally:
        limited.provider.shutdown()
    attributes = dict(view.attributes)
    assert len(attributes[sc.EPISODE_RECORD]) > 2
    damage(attributes)

    outcome = read_span(with_attributes(view, attributes))
    assert isinstance(outcome, CorruptEpisode)
    assert outcome.episode_id == record["id"]
    assert complaint in outcome.reason


def blob_attributes(text: str, episode_id: str | None = "e-1") -> dict[str, Any]:
    """A blob whose size and digest are right for bytes that are still wrong."""
    data = text.encode()
    attributes: dict[str, Any] = {
        sc.EPISODE_RECORD: [text],
        RECORD_SIZE: len(data),
        RECORD_SHA256: hashlib.sha256(data).hexdigest(),
    }
    if episode_id is not None:
        attributes[sc.EPISODE_ID] = episode_id
    return attributes


@pytest.mark.parametrize(
    ("text", "complaint"),
    [
        ('{"id": "e-1", "traces": [', "not valid JSON"),
        ('["e-1"]', "not a JSON object"),
        ('{"id": "someone-else", "traces": []}', "does not match"),
    ],
)
def test_intact_bytes_that_are_not_this_episode_are_corrupt(
    pipeline: Pipeline, text: str, complaint: str
) -> None:
    emit_run_end(pipeline.tracer, "completed")  # any real span to borrow ids from
    (view,) = pipeline.views()
    outcome = read_span(with_attributes(view, blob_attributes(text)))

    assert isinstance(outcome, CorruptEpisode)
    assert outcome.episode_id == "e-1"
    assert complaint in outcome.reason


def test_decode_blob_accepts_one_string_and_otlp_json_sizes() -> None:
    text = '{"a":"Zoë"}'
    attributes = blob_attributes(text, episode_id=None)
    attributes[sc.EPISODE_RECORD] = text
    attributes[RECORD_SIZE] = str(attributes[RECORD_SIZE])

    assert decode_blob(attributes, sc.EPISODE_RECORD) == text.encode()


def test_decode_blob_refuses_text_that_cannot_be_utf8() -> None:
    attributes = blob_attributes("ok", episode_id=None)
    attributes[sc.EPISODE_RECORD] = ["\ud800"]

    with pytest.raises(RecordError, match="not valid text"):
        decode_blob(attributes, sc.EPISODE_RECORD)


# ---------------------------------------------------------------------------
# Run events
# ---------------------------------------------------------------------------


def test_run_start_and_end_round_trip(pipeline: Pipeline) -> None:
    config = {
        "model": "policy-8b",
        "config_source": {"format": "toml", "text": "# c\nlr = 1\n", "filename": "run.toml"},
    }
    emit_run_start(pipeline.tracer, config)
    emit_run_end(pipeline.tracer, "cancelled", "stopped by user", episodes_recorded=0)
    start, end = (read_span(view) for view in pipeline.views())

    assert start == RunStart(config)
    assert end == RunEnd("cancelled", "stopped by user", 0)


def test_a_damaged_run_config_is_reported_not_dropped(
    caplog: pytest.LogCaptureFixture,
) -> None:
    limited = Pipeline(SpanLimits(max_span_attribute_length=64))
    relay = Pipeline(SpanLimits(max_span_attribute_length=10))
    try:
        emit_run_start(limited.tracer, {"notes": "x" * 500})
        (original,) = limited.views()
        span = relay.tracer.start_span(original.name, attributes=dict(original.attributes))
        span.end()
        (relayed,) = relay.views()
    finally:
        limited.provider.shutdown()
        relay.provider.shutdown()

    assert read_span(original) == RunStart({"notes": "x" * 500})
    outcome = read_span(relayed)
    assert isinstance(outcome, RunStart)
    assert outcome.config == {}
    assert outcome.corrupt_reason is not None and "damaged" in outcome.corrupt_reason
    # Logged where the start is filed under its run, so copies share one line.
    with caplog.at_level(logging.WARNING, logger="prime_runs_otel.read.ingest"):
        group_by_run([relayed, relayed, relayed])
    assert caplog.text.count("run config is damaged") == 1
    assert "Run run-1: the run config is damaged" in caplog.text
    assert "run-1: run starts arrived with a damaged config: 2 more like it" in caplog.text


def test_an_unknown_end_status_counts_as_failed(pipeline: Pipeline) -> None:
    span = pipeline.tracer.start_span(
        sc.RUN_END_SPAN, attributes={sc.RUN_STATUS: "exploded", sc.RUN_ERROR: "boom"}
    )
    span.end()
    (view,) = pipeline.views()

    assert read_span(view) == RunEnd(
        "failed", f"the run ended with an unknown {sc.RUN_STATUS}='exploded': boom", None
    )


def test_spans_that_are_not_ours_mean_nothing(pipeline: Pipeline) -> None:
    with pipeline.tracer.start_as_current_span("GET /health", attributes={"http.status": 200}):
        pass
    record_episode(pipeline.tracer, synthetic_episode(0, error=False))
    meanings = [read_span(view) for view in pipeline.views()]

    assert sum(isinstance(item, EpisodeArrival) for item in meanings) == 1
    assert meanings.count(None) == len(meanings) - 1


# ---------------------------------------------------------------------------
# Run identity
# ---------------------------------------------------------------------------


def test_run_identity_reads_the_resource_and_survives_the_spool() -> None:
    resource = run_resource(
        run_id="local-1",
        kind="train",
        name="sweep",
        model="policy-8b",
        environments=["gsm8k", "owner/math"],
        framework="prime-rl",
        tags=["x"],
        description="d",
        attach="plat-9",
        team_id="team-1",
    )
    identity = run_identity(resource.attributes)

    assert identity == RunIdentity(
        local_id="local-1",
        kind="train",
        name="sweep",
        model="policy-8b",
        environments=("gsm8k", "owner/math"),
        framework="prime-rl",
        tags=("x",),
        description="d",
        attach="plat-9",
        team_id="team-1",
    )
    assert RunIdentity.from_json(identity.to_json()) == identity
    assert RunIdentity.from_json(identity.to_json().encode()) == identity


def test_run_identity_defaults_and_refusals(caplog: pytest.LogCaptureFixture) -> None:
    assert run_identity(Resource.create({}).attributes) is None
    assert run_identity({sc.RUN_ID: ""}) is None
    assert run_identity({sc.RUN_ID: "r"}) == RunIdentity(local_id="r")
    with caplog.at_level(logging.WARNING, logger="prime_runs_otel.read.checks"):
        assert run_identity({sc.RUN_ID: "r", sc.RUN_KIND: "sft"}) == RunIdentity("r", "eval")
    assert "unknown prime.run.kind='sft'" in caplog.text
    with pytest.raises(RecordError, match="local_id"):
        RunIdentity.from_json('{"kind": "eval"}')


# ---------------------------------------------------------------------------
# The span view
# ---------------------------------------------------------------------------


def test_span_view_of_a_readable_span(pipeline: Pipeline) -> None:
    with pipeline.tracer.start_as_current_span("parent") as parent:
        child = pipeline.tracer.start_span("child", attributes={"k": ("a", "b")})
        child.set_status(Status(StatusCode.ERROR, "broken"))
        child.end()
    spans: dict[str, ReadableSpan] = {
        span.name: span for span in pipeline.exporter.get_finished_spans()
    }
    view = from_readable_span(spans["child"])
    parent_view = from_readable_span(spans["parent"])

    assert view.name == "child"
    assert view.trace_id == parent.get_span_context().trace_id
    assert view.parent_span_id == parent.get_span_context().span_id
    assert view.span_id == spans["child"].context.span_id
    assert view.attributes == {"k": ("a", "b")}
    assert view.resource[sc.RUN_ID] == "run-1"
    assert view.status_error is True and view.status_message == "broken"
    assert 0 < view.start_ns <= view.end_ns
    assert parent_view.parent_span_id is None
    assert parent_view.status_error is False and parent_view.status_message is None


def test_the_digest_is_checked_where_a_record_crossed_a_process_boundary() -> None:
    """A span read from the SDK that made it skips the hash (only a length
    limit can have touched it, and the size catches that); the same
    attributes arriving from elsewhere are hashed, and a wrong digest shows."""
    limited = Pipeline(SpanLimits(max_span_attribute_length=512))
    try:
        record = synthetic_episode(7, target_bytes=4_000)
        record_episode(limited.tracer, record)
        view = limited.episode_view()
    finally:
        limited.provider.shutdown()
    assert view.in_process
    wrong = {**view.attributes, RECORD_SHA256: "0" * 64}
    shortened = {**view.attributes, sc.EPISODE_RECORD: view.attributes[sc.EPISODE_RECORD][:-1]}

    assert isinstance(read_span(dataclasses.replace(view, attributes=wrong)), EpisodeArrival)
    travelled = read_span(with_attributes(view, wrong))
    assert isinstance(travelled, CorruptEpisode) and "SHA-256" in travelled.reason
    truncated = read_span(dataclasses.replace(view, attributes=shortened))
    assert isinstance(truncated, CorruptEpisode) and "truncated" in truncated.reason
