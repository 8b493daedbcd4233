"""A producer's own run summary on the run-end span (``prime.run.summary``):
what ``prime_runs``' ``finish(summary)`` carries through this package. It
arrives from outside the process (behind a collector, from any producer), so
whatever the attribute holds, reading it never fails: a damaged summary is
left out, and the one aggregated from the episodes is sent instead."""

from __future__ import annotations

import hashlib
import json
import math
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from prime_runs_otel import semconv as sc
from prime_runs_otel._json import clean_metric_values
from prime_runs_otel.errors import ConfigError
from prime_runs_otel.produce.run_spans import emit_run_end
from prime_runs_otel.read.checks import read_span
from prime_runs_otel.read.records import RunEnd
from prime_runs_otel.read.spans import SpanView, from_readable_span

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**53), max_value=2**53)
    | st.floats()
    | st.text(max_size=20),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=20,
)
summaries = st.dictionaries(st.text(max_size=12), json_values, max_size=6)


def _finite_everywhere(value: Any) -> bool:
    if isinstance(value, float):
        return math.isfinite(value)
    if isinstance(value, dict):
        return all(_finite_everywhere(item) for item in value.values())
    if isinstance(value, list):
        return all(_finite_everywhere(item) for item in value)
    return True


def _ended(summary: Any) -> RunEnd:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    emit_run_end(provider.get_tracer("t"), "completed", summary=summary)
    (span,) = exporter.get_finished_spans()
    provider.shutdown()
    meaning = read_span(from_readable_span(span))
    assert isinstance(meaning, RunEnd)
    return meaning


@settings(max_examples=150, deadline=None)
@given(summaries)
def test_a_summary_arrives_as_sent_without_non_finite_numbers(summary: dict[str, Any]) -> None:
    ended = _ended(summary)
    assert ended.summary == json.loads(json.dumps(clean_metric_values(summary)))
    assert _finite_everywhere(ended.summary)


def test_no_summary_means_the_aggregated_one() -> None:
    assert _ended(None).summary is None
    assert _ended({}).summary == {}
    assert _ended({"avg_reward": math.nan, "n": {"x": math.inf}}).summary == {}


def test_a_summary_that_is_not_json_is_refused_with_what_to_do() -> None:
    with pytest.raises(ConfigError, match="JSON-serialisable"):
        _ended({"when": object()})


attribute_values = (
    st.text(max_size=40)
    | st.lists(st.text(max_size=20), max_size=4)
    | st.integers()
    | st.floats()
    | st.booleans()
    | st.lists(st.integers(), max_size=3)
)


@settings(max_examples=200, deadline=None)
@given(
    blob=attribute_values,
    size=st.none() | st.integers(min_value=-1, max_value=1000),
    digest=st.none() | st.text(max_size=64),
)
def test_whatever_the_summary_attribute_holds_the_end_is_read(
    blob: Any, size: int | None, digest: str | None
) -> None:
    attributes: dict[str, Any] = {sc.RUN_STATUS: "completed", sc.RUN_SUMMARY: blob}
    if size is not None:
        attributes[sc.blob_size_key(sc.RUN_SUMMARY)] = size
    if digest is not None:
        attributes[sc.blob_sha256_key(sc.RUN_SUMMARY)] = digest
    ended = read_span(_run_end_view(attributes))
    assert isinstance(ended, RunEnd) and ended.status == "completed"
    assert ended.summary is None or isinstance(ended.summary, dict)


def test_a_summary_damaged_in_transit_is_left_out() -> None:
    text = json.dumps({"avg_reward": 0.5})
    attributes = {
        sc.RUN_STATUS: "completed",
        sc.RUN_SUMMARY: [text[:-3]],  # truncated by an attribute length limit
        sc.blob_size_key(sc.RUN_SUMMARY): len(text),
        sc.blob_sha256_key(sc.RUN_SUMMARY): hashlib.sha256(text.encode()).hexdigest(),
    }
    ended = read_span(_run_end_view(attributes))
    assert isinstance(ended, RunEnd) and ended.summary is None


def _run_end_view(attributes: dict[str, Any]) -> SpanView:
    return SpanView(
        name=sc.RUN_END_SPAN,
        trace_id=1,
        span_id=2,
        parent_span_id=None,
        start_ns=0,
        end_ns=1,
        attributes=attributes,
        resource={},
        status_error=False,
        status_message=None,
    )
