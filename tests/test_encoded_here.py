"""In process, the exporter takes the bytes its producer encoded instead of
joining, encoding and checking the record on the span again, and only when
the span still carries exactly those bytes; any doubt takes the ordinary
path, which reads (or refuses) the span as it always did."""

from __future__ import annotations

import dataclasses
from typing import Any

from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import prime_runs_otel as pro
from prime_runs_otel import semconv as sc
from prime_runs_otel._encoded_here import EncodedHere, encoded_here
from prime_runs_otel._json import dumps_record
from prime_runs_otel.produce.episode import record_episode
from prime_runs_otel.produce.synthetic import synthetic_episodes
from prime_runs_otel.read.checks import read_span
from prime_runs_otel.read.episodes import CorruptEpisode, EpisodeArrival
from prime_runs_otel.read.spans import SpanView, from_readable_span


def _span(record: dict[str, Any]) -> ReadableSpan:
    encoded_here.enable()
    provider = TracerProvider(resource=pro.run_resource(run_id="noted"))
    memory = InMemorySpanExporter()
    provider.add_span_processor(SimpleSpanProcessor(memory))
    record_episode(provider.get_tracer("test"), record, child_spans=False, summary_attributes=False)
    (span,) = memory.get_finished_spans()
    return span


def _with(view: SpanView, **attributes: Any) -> SpanView:
    return dataclasses.replace(view, attributes={**view.attributes, **attributes})


def test_the_exporter_takes_the_bytes_its_producer_encoded_once() -> None:
    (record,) = synthetic_episodes(1, seed=5)
    span = _span(record)
    view = from_readable_span(span)
    noted = encoded_here.take(view.span_id, view.attributes[sc.EPISODE_RECORD])
    assert noted == dumps_record(record)
    # Noted again, as the producer left it, then read as export() reads it.
    encoded_here.note(view.span_id, view.attributes[sc.EPISODE_RECORD], noted)
    arrival = read_span(view, lines=True)
    assert isinstance(arrival, EpisodeArrival)
    assert arrival.raw is noted and arrival.line is not None
    assert encoded_here.take(view.span_id, view.attributes[sc.EPISODE_RECORD]) is None


def test_the_same_record_read_either_way_is_the_same_arrival() -> None:
    for record in synthetic_episodes(20, seed=6):
        view = from_readable_span(_span(record))
        taken = read_span(view, lines=True)
        read_again = read_span(view, lines=True)  # nothing noted any more
        assert isinstance(taken, EpisodeArrival) and isinstance(read_again, EpisodeArrival)
        assert taken.raw is not read_again.raw
        assert taken == read_again


def test_chunks_that_are_not_the_producer_s_take_the_ordinary_path() -> None:
    (record,) = synthetic_episodes(1, seed=7)
    view = from_readable_span(_span(record))
    chunks = view.attributes[sc.EPISODE_RECORD]
    copied = tuple(bytes(chunk, "utf-8").decode("utf-8") for chunk in chunks)
    assert copied == tuple(chunks) and copied[0] is not chunks[0]
    arrival = read_span(_with(view, **{sc.EPISODE_RECORD: copied}), lines=True)
    assert isinstance(arrival, EpisodeArrival) and arrival.raw == dumps_record(record)


def test_a_noted_record_whose_size_is_wrong_is_refused_as_without_the_note() -> None:
    (record,) = synthetic_episodes(1, seed=8)
    view = from_readable_span(_span(record))
    wrong = _with(view, **{sc.blob_size_key(sc.EPISODE_RECORD): 3})
    refused = read_span(wrong, lines=True)
    assert isinstance(refused, CorruptEpisode)
    assert refused == read_span(wrong, lines=True)  # the second read has no note
    assert "truncated" in refused.reason


def test_a_noted_record_without_its_digest_is_refused_as_without_the_note() -> None:
    (record,) = synthetic_episodes(1, seed=9)
    view = from_readable_span(_span(record))
    attributes = dict(view.attributes)
    del attributes[sc.blob_sha256_key(sc.EPISODE_RECORD)]
    refused = read_span(dataclasses.replace(view, attributes=attributes), lines=True)
    assert isinstance(refused, CorruptEpisode) and "lacks" in refused.reason


def test_records_orjson_could_not_write_are_not_noted() -> None:
    (record,) = synthetic_episodes(1, seed=10)
    record["traces"][0]["metrics"] = {"loss": float("nan")}
    view = from_readable_span(_span(record))
    assert encoded_here.take(view.span_id, view.attributes[sc.EPISODE_RECORD]) is None


def test_nothing_is_noted_before_an_exporter_is_built_and_never_without_bound() -> None:
    chunks, data = ("abc",), b"abc"
    registry = EncodedHere(max_entries=2, max_bytes=10)
    registry.note(1, chunks, data)
    assert len(registry) == 0
    registry.enable()
    for span_id in (1, 2, 3):
        registry.note(span_id, chunks, data)
    assert len(registry) == 2 and registry.take(1, chunks) is None  # the oldest went
    registry.note(4, chunks, b"more than the bytes left")
    assert registry.take(4, chunks) is None
    assert registry.take(3, chunks) == data and registry.take(2, list(chunks)) == data
    assert len(registry) == 0
    # Past the bytes, the oldest make room, as past the count: records whose
    # spans never reach the exporter cannot keep newer ones out for good.
    registry.note(5, chunks, b"abcdef")
    registry.note(6, chunks, b"ghijkl")
    assert registry.take(5, chunks) is None and registry.take(6, chunks) == b"ghijkl"
