"""In process, the episode span is the one carrier of its record, whoever
else reads the run's spans: the exporter reads each record off its span
once, on the export thread, with its Prime Traces line built there.

The oracle is a run somebody else also listens to: the same episodes
recorded by a run nobody else listens to (no summary attributes, no child
spans) must leave the same spool behind, byte for byte, refusals included.
"""

from __future__ import annotations

import json
import logging
import math
import sqlite3
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import prime_runs_otel as pro
from prime_runs_otel import _courtesy
from prime_runs_otel import semconv as sc
from prime_runs_otel._courtesy import ExportRunning, PacedGiveWay
from prime_runs_otel._json import dumps_record, encode_record, parse
from prime_runs_otel.config import resolve_settings
from prime_runs_otel.deliver.delivery import SpanDelivery
from prime_runs_otel.deliver.lines import LineCache
from prime_runs_otel.errors import RecordError
from prime_runs_otel.exporter import PrimeRunsSpanExporter
from prime_runs_otel.produce.episode import record_episode
from prime_runs_otel.produce.synthetic import synthetic_episodes
from prime_runs_otel.read.checks import MAX_NESTING, check_json_value, read_span
from prime_runs_otel.read.episodes import CorruptEpisode, EpisodeArrival
from prime_runs_otel.read.projection import (
    RUN_ID_PLACEHOLDER,
    LineTemplate,
    traces_line,
    traces_line_template,
)
from prime_runs_otel.read.spans import from_readable_span


def _nested(depth: int) -> Any:
    value: Any = "bottom"
    for _ in range(depth):
        value = [value]
    return value


def _episodes() -> list[dict[str, Any]]:
    """Honest episodes, and the ones each reader must refuse or keep alike:
    a NaN metric (the standard library writes it), an integer beyond what a
    float holds (refused), nesting past the limit (refused), nesting just
    under it (kept), and a reward that is not a number (damaged)."""
    episodes = list(synthetic_episodes(12, seed=7))
    odd = list(synthetic_episodes(5, seed=8))
    odd[0]["id"], odd[0]["traces"][0]["metrics"] = "nan-metric", {"loss": math.nan}
    odd[1]["id"], odd[1]["info"] = "huge-int", {"big": 10**400}
    odd[2]["id"], odd[2]["info"] = "too-deep", {"deep": _nested(MAX_NESTING + 5)}
    odd[3]["id"], odd[3]["info"] = "deep-enough", {"deep": _nested(MAX_NESTING - 5)}
    odd[4]["id"] = "bad-reward"
    odd[4]["traces"][0]["rewards"] = {"correct": {"score": "high", "weight": 1.0}}
    return episodes[:6] + odd + episodes[6:]


def _spooled(local_id: str) -> tuple[list[tuple[str, bytes]], tuple[Any, ...]]:
    """The run's stored records (id, exact bytes) in order, and its counts and summary."""
    db = sqlite3.connect(resolve_settings().spool_path)
    try:
        rows = db.execute(
            "SELECT e.episode_id, COALESCE(e.record, r.body) FROM episodes e "
            "LEFT JOIN records r ON r.seq = e.seq WHERE e.run_id = ? ORDER BY e.seq",
            (local_id,),
        ).fetchall()
        counts = db.execute(
            "SELECT episodes, corrupt, summary_state FROM runs WHERE local_id = ?", (local_id,)
        ).fetchone()
    finally:
        db.close()
    return [(episode_id, bytes(body)) for episode_id, body in rows], tuple(counts)


def _record_all(run: pro.Run, episodes: list[dict[str, Any]]) -> pro.RunResult:
    for episode in episodes:
        run.record_episode(episode)
    return run.finish()


def test_a_run_nobody_else_reads_stores_its_records_as_a_watched_run_does() -> None:
    episodes = _episodes()
    alone = pro.start_run(name="alone", run_id="records-alone")
    watched = pro.start_run(name="watched", run_id="records-watched")
    listener = InMemorySpanExporter()
    watched.tracer_provider.add_span_processor(SimpleSpanProcessor(listener))
    alone_result = _record_all(alone, episodes)
    watched_result = _record_all(watched, episodes)

    alone_rows, alone_counts = _spooled(alone.id)
    watched_rows, watched_counts = _spooled(watched.id)
    assert alone_rows == watched_rows
    assert alone_counts == watched_counts
    assert (alone_result.episodes, alone_result.corrupt) == (
        watched_result.episodes,
        watched_result.corrupt,
    )
    stored = dict(alone_rows)
    assert set(stored) == {e["id"] for e in episodes} - {"huge-int", "too-deep", "bad-reward"}
    assert alone_result.corrupt == 3
    # The bytes the producer wrote, NaN and all, not a re-encoding.
    (nan_metric,) = (e for e in episodes if e["id"] == "nan-metric")
    assert stored["nan-metric"] == dumps_record(nan_metric)
    assert b"NaN" in stored["nan-metric"]
    # The watched run's listener saw each record on its span.
    spans = [
        s for s in listener.get_finished_spans() if s.attributes and sc.EPISODE_ID in s.attributes
    ]
    assert spans and all(sc.EPISODE_RECORD in (s.attributes or {}) for s in spans)


def _episode_span(record: dict[str, Any], run_id: str = "r") -> ReadableSpan:
    """The episode span ``record_episode`` makes for a run nobody else reads."""
    provider = TracerProvider(resource=pro.run_resource(run_id=run_id))
    memory = InMemorySpanExporter()
    provider.add_span_processor(SimpleSpanProcessor(memory))
    record_episode(provider.get_tracer("test"), record, child_spans=False, summary_attributes=False)
    (span,) = memory.get_finished_spans()
    return span


def test_the_episode_span_carries_its_record_even_with_nothing_else_on_it() -> None:
    record = next(synthetic_episodes(1, seed=3))

    span = _episode_span(record)

    attributes = dict(span.attributes or {})
    assert attributes[sc.EPISODE_ID] == record["id"]
    assert sc.EPISODE_RECORD_IN_PROCESS not in attributes
    item = read_span(from_readable_span(span))
    assert isinstance(item, EpisodeArrival)
    assert item.raw == dumps_record(record)


def test_a_span_whose_record_went_around_it_is_a_loss_with_its_reason(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A span marked as having had its record handed to an exporter beside
    it (what earlier releases of a run did) carries no record: counted as a
    damaged episode that says why, never stored empty."""
    record = next(synthetic_episodes(1, seed=4))
    provider = TracerProvider(resource=pro.run_resource(run_id="handed-elsewhere"))
    memory = InMemorySpanExporter()
    provider.add_span_processor(SimpleSpanProcessor(memory))
    attributes = {sc.EPISODE_ID: record["id"], sc.EPISODE_RECORD_IN_PROCESS: True}
    provider.get_tracer("test").start_span("episode", attributes=attributes).end()
    (span,) = memory.get_finished_spans()

    item = read_span(from_readable_span(span))
    assert isinstance(item, CorruptEpisode)
    assert item.episode_id == record["id"]
    assert "handed straight to the exporter" in item.reason

    exporter = PrimeRunsSpanExporter(deliver=False, shutdown_timeout=0.0)
    with caplog.at_level(logging.WARNING):
        exporter.export([span])
    run = exporter.spool.reading.run("handed-elsewhere")
    assert run is not None and (run.episodes, run.corrupt) == (0, 1)
    exporter.shutdown()


# -- the nesting-only check for what orjson parsed or wrote -------------------------------

_json_scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=8)
)


def _deep_values() -> st.SearchStrategy[Any]:
    base = st.recursive(
        _json_scalars,
        lambda inner: (
            st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3)
        ),
        max_leaves=20,
    )
    return st.tuples(base, st.integers(min_value=0, max_value=MAX_NESTING + 3)).map(
        lambda pair: _wrap(pair[0], pair[1])
    )


def _wrap(value: Any, depth: int) -> Any:
    for level in range(depth):
        value = [value] if level % 2 else {"k": value}
    return value


def _refusal(value: Any, **kwargs: Any) -> str | None:
    try:
        check_json_value(value, "the value", **kwargs)
    except RecordError as exc:
        return str(exc)
    return None


@settings(max_examples=300, deadline=None)
@given(_deep_values())
def test_the_nesting_only_check_agrees_with_the_full_check_on_what_orjson_parsed(
    value: Any,
) -> None:
    """orjson vouches for the scalars it parses, so checking only the nesting
    refuses exactly what the full check refuses."""
    text = json.dumps(value)
    try:
        parsed, by_orjson = parse(text.encode())
    except RecursionError:
        return  # deeper than any parser here goes: refused before any check
    assert by_orjson
    raw = orjson.dumps(parsed) if parsed is not None else b"null"
    assert _refusal(parsed, plain_scalars=True) == _refusal(parsed, raw=raw)


# -- Prime Traces lines built at export -------------------------------------------


@pytest.fixture
def lines_taken(monkeypatch: pytest.MonkeyPatch) -> list[bool]:
    """For each episode the uploader sent as a line: whether it had its line
    built already (a spy on the real cache, which still gives what it holds)."""
    taken: list[bool] = []
    take = LineCache.take

    def counted(self: LineCache, seq: int) -> LineTemplate | None:
        template = take(self, seq)
        taken.append(template is not None)
        return template

    monkeypatch.setattr(LineCache, "take", counted)
    return taken


def test_lines_built_at_export_are_the_lines_the_uploader_makes(
    online: Any, lines_taken: list[bool]
) -> None:
    """An online run's uploader fills the run id into lines ``export()``
    built, and falls back to parsing the stored record for one it could not
    build (a record holding the placeholder itself): the platform stores
    exactly what ``traces_line`` makes of each stored record."""
    episodes = list(synthetic_episodes(30, seed=11))
    episodes[4]["info"] = {"note": RUN_ID_PLACEHOLDER}

    run = pro.start_run(name="lines", run_id="export-lines", environments=["env-a"])
    result = _record_all(run, episodes)

    assert result.closed and result.episodes == 30
    assert result.platform_id is not None
    expected = [json.loads(traces_line(e, result.platform_id, "eval")) for e in episodes]
    assert online.episodes(result.platform_id) == expected
    assert lines_taken.count(True) == 29 and lines_taken.count(False) == 1


@settings(max_examples=200, deadline=None)
@given(
    st.dictionaries(
        st.sampled_from(["info", "run", "answer", "x"]),
        st.recursive(
            _json_scalars | st.just(RUN_ID_PLACEHOLDER),
            lambda inner: (
                st.lists(inner, max_size=3)
                | st.dictionaries(st.text(max_size=4), inner, max_size=3)
            ),
            max_leaves=12,
        ),
    ),
    st.lists(
        st.one_of(
            st.none(),
            st.dictionaries(st.sampled_from(["run", "id", "rewards"]), _json_scalars, max_size=3),
        ),
        max_size=3,
    ),
    st.sampled_from(["eval", "train"]),
    st.none() | st.integers(min_value=0, max_value=10**6),
)
def test_a_line_template_fills_in_to_the_line_itself(
    fields: dict[str, Any], traces: list[Any], kind: str, step: int | None
) -> None:
    record = {"id": "e", **fields, "traces": traces}
    template = traces_line_template(record, kind, step=step)
    if template is None:
        return
    for run_id in ("run-1", 'odd "id" \\ \u00e9'):
        assert template.fill(run_id, kind, step) == traces_line(record, run_id, kind, step=step)
    # Made for another run type or step, it makes nothing: the caller makes the line.
    assert template.fill("run-1", "train" if kind == "eval" else "eval", step) is None
    assert template.fill("run-1", kind, 1 if step is None else None) is None


def test_a_record_holding_the_placeholder_gets_no_template() -> None:
    record = next(synthetic_episodes(1, seed=12))
    assert traces_line_template(record, "eval") is not None
    record["traces"][0]["id"] = RUN_ID_PLACEHOLDER
    assert traces_line_template(record, "eval") is None


def test_the_line_cache_keeps_what_fits_and_forgets_what_it_gives() -> None:
    cache = LineCache(max_bytes=10)

    def line(data: bytes) -> LineTemplate:
        return LineTemplate("eval", None, data)

    cache.keep([(1, line(b"abcd")), (2, line(b"efgh")), (3, line(b"ijkl")), (4, line(b"m"))])
    assert (len(cache), cache.size_bytes) == (2, 8)  # the third did not fit: nothing after it
    taken = cache.take(1)
    assert taken is not None and taken.data == b"abcd" and cache.take(1) is None
    cache.keep([(3, line(b"ijkl"))])
    assert cache.take(99) is None and cache.take(2) is not None
    assert (len(cache), cache.size_bytes) == (1, 4)
    cache.clear()
    assert (len(cache), cache.size_bytes) == (0, 0)


# -- giving way to export() ---------------------------------------------------------------


def test_threads_give_way_only_while_an_export_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    """A switch of the GIL costs CPU on every side, so the producer and the
    uploader let go of it between episodes only while export() waits for it."""
    sleeps: list[float] = []
    monkeypatch.setattr(_courtesy.time, "sleep", sleeps.append)
    flag = ExportRunning()
    flag.give_way()
    assert sleeps == []
    with flag.up():
        with flag.up():  # exports may overlap
            flag.give_way()
        flag.give_way()
    flag.give_way()
    assert sleeps == [0, 0]


def test_serve_s_uploader_gives_way_at_most_once_a_millisecond(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Giving the GIL up once per episode starved serve's uploader behind
    its busy intake threads: it now gives way once a millisecond of its work."""
    sleeps: list[float] = []
    now = [1000.0]
    monkeypatch.setattr(_courtesy.time, "sleep", sleeps.append)
    monkeypatch.setattr(_courtesy.time, "perf_counter", lambda: now[0])
    give_way = PacedGiveWay()
    for step in (0.0, 0.0004, 0.0004, 0.0004, 0.0002, 0.0009, 0.0001):
        now[0] += step
        give_way()
    assert sleeps == [0, 0, 0]  # at 0, at 1.2 ms and at 2.3 ms


def test_the_exporter_raises_the_flag_for_the_length_of_export(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    seen: list[int] = []

    exporter = PrimeRunsSpanExporter(deliver=False, shutdown_timeout=0.0)
    commit = SpanDelivery.commit

    def probing(self: SpanDelivery, *args: Any, **kwargs: Any) -> Any:
        seen.append(exporter.export_running._running)  # the commit is the export's own work
        return commit(self, *args, **kwargs)

    monkeypatch.setattr(SpanDelivery, "commit", probing)
    provider = TracerProvider(resource=pro.run_resource(run_id="flagged"))
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    record_episode(provider.get_tracer("t"), next(synthetic_episodes(1, seed=1)))
    assert seen and set(seen) == {1}
    assert exporter.export_running._running == 0
    provider.shutdown()


@settings(max_examples=200, deadline=None)
@given(_deep_values())
def test_orjson_writes_exactly_the_records_within_the_nesting_limit(value: Any) -> None:
    """The record is encoded where orjson's own nesting limit falls at
    MAX_NESTING, so what it writes needs no walk over every value: whatever
    it refuses goes the standard library's way and is checked in full."""
    record = {"id": "e", "traces": [], "info": value}
    raw, by_orjson = encode_record(record)
    assert json.loads(raw) == json.loads(json.dumps(record))
    refusal = _refusal(record)
    if by_orjson:
        assert refusal is None
        assert raw == orjson.dumps(record)
    elif refusal is None:
        # Within the limits, yet not orjson's: an integer orjson cannot take.
        with pytest.raises(orjson.JSONEncodeError, match="Integer"):
            orjson.dumps(record)
    else:
        assert "nests" in refusal or "floating-point" in refusal


def test_records_read_off_spans_get_their_lines_built_there_too(
    online: Any, lines_taken: list[bool]
) -> None:
    """A run somebody else also listens to carries its records on the spans;
    the exporter parses each once there and builds its line then (as
    ``serve`` does), so the uploader parses nothing either."""
    episodes = list(synthetic_episodes(20, seed=13))
    run = pro.start_run(name="watched lines", run_id="span-lines", environments=["env-a"])
    run.tracer_provider.add_span_processor(SimpleSpanProcessor(InMemorySpanExporter()))
    result = _record_all(run, episodes)

    assert result.closed and result.platform_id is not None
    expected = [json.loads(traces_line(e, result.platform_id, "eval")) for e in episodes]
    assert online.episodes(result.platform_id) == expected
    assert lines_taken == [True] * 20


def test_the_spans_under_a_damaged_episode_are_its_own(caplog: pytest.LogCaptureFixture) -> None:
    """A damaged episode is counted once, as damaged: its agent and model-call
    spans are not reported again as model calls under no episode span."""
    episodes = _episodes()
    run = pro.start_run(name="watched damage", run_id="watched-damage")
    run.tracer_provider.add_span_processor(SimpleSpanProcessor(InMemorySpanExporter()))
    with caplog.at_level(logging.WARNING):
        result = _record_all(run, episodes)
    assert result.corrupt == 3
    assert "under no episode span" not in caplog.text
