"""Episodes synthesised behind a collector: the receiver holds an episode
span without a record until the spans under it are in, whatever request they
come in and in whatever order, keeps its run open until then, and counts
what it could not keep whole.

The intake is driven in process with a hand-wound clock for the waiting
rules; the whole path runs once for real: the OpenTelemetry instrumentation
of the ``openai`` client against a fake OpenAI server, OTLP/HTTP in several
out-of-order requests, a ``serve`` process, the fake platform.
"""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import textwrap
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from test_receiver import ServeProcess, closed_run, serve_env

from prime_runs_otel import emit_run_end, emit_run_start, run_resource
from prime_runs_otel import semconv as sc
from prime_runs_otel.collector.intake import SpanIntake
from prime_runs_otel.collector.receiver_config import ReceiverConfig
from prime_runs_otel.config import resolve_settings
from prime_runs_otel.deliver.spool import Spool
from prime_runs_otel.errors import ConfigError
from prime_runs_otel.produce.traced_episode import episode_span, score_episode
from prime_runs_otel.read.projection import episode_sample_rows
from prime_runs_otel.testing import FakePlatform

SETTLE = 5.0


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def spool(tmp_path: Path) -> Iterator[Spool]:
    opened = Spool(tmp_path / "spool.sqlite3", max_bytes=1 << 30)
    yield opened
    opened.close()


def intake_of(spool: Spool, clock: Clock, **options: Any) -> SpanIntake:
    settings = resolve_settings(mode="local", spool_dir=spool.path.parent)
    return SpanIntake(spool, settings, None, settle_seconds=SETTLE, clock=clock, **options)


def message(role: str, content: str) -> dict[str, Any]:
    return {"role": role, "parts": [{"type": "text", "content": content}]}


def produce(run_id: str, episodes: int = 1, *, turns: int = 2) -> list[ReadableSpan]:
    """A run of GenAI-traced rollouts, each wrapped in an episode span."""
    memory = InMemorySpanExporter()
    provider = TracerProvider(resource=run_resource(run_id=run_id, environments=["arith"]))
    provider.add_span_processor(SimpleSpanProcessor(memory))
    tracer = provider.get_tracer("rl")
    emit_run_start(tracer, {"temperature": 1.0})
    for example in range(episodes):
        with episode_span(tracer, example_id=example, env="arith") as episode:
            history = [message("user", f"question {example}")]
            for turn in range(turns):
                answer = message("assistant", f"answer {example}.{turn}")
                with tracer.start_as_current_span(
                    "chat policy",
                    attributes={
                        sc.GEN_AI_OPERATION_NAME: "chat",
                        sc.GEN_AI_REQUEST_MODEL: "policy",
                        sc.GEN_AI_USAGE_INPUT_TOKENS: 10 * (turn + 1),
                        sc.GEN_AI_USAGE_OUTPUT_TOKENS: 5,
                        sc.GEN_AI_INPUT_MESSAGES: json.dumps(history),
                        sc.GEN_AI_OUTPUT_MESSAGES: json.dumps([answer]),
                    },
                ):
                    pass
                history += [answer, message("user", "go on")]
            score_episode(episode, 1.0)
    emit_run_end(tracer, "completed", episodes_recorded=episodes)
    provider.shutdown()
    return list(memory.get_finished_spans())


def request(spans: Sequence[ReadableSpan]) -> ExportTraceServiceRequest:
    return encode_spans(spans)


def split(spans: Sequence[ReadableSpan]) -> tuple[Any, list[Any], list[Any], Any]:
    """(run start, episode roots, model calls, run end)."""
    by_kind: dict[str, list[ReadableSpan]] = {"start": [], "roots": [], "calls": [], "end": []}
    for span in spans:
        if span.name == sc.RUN_START_SPAN:
            by_kind["start"].append(span)
        elif span.name == sc.RUN_END_SPAN:
            by_kind["end"].append(span)
        elif span.parent is None or sc.EPISODE_EXAMPLE_ID in (span.attributes or {}):
            by_kind["roots"].append(span)
        else:
            by_kind["calls"].append(span)
    [start], [end] = by_kind["start"], by_kind["end"]
    return start, by_kind["roots"], by_kind["calls"], end


def stored(spool: Spool, run_id: str) -> list[dict[str, Any]]:
    return [json.loads(row.record) for row in spool.reading.iter_episodes(run_id)]


# -- waiting for the tree, in process --------------------------------------------------------


def test_children_in_later_requests_join_their_episode_and_the_end_waits(
    spool: Spool, clock: Clock
) -> None:
    intake = intake_of(spool, clock)
    start, [root], calls, end = split(produce("later", turns=3))

    for part in ([start, root], [calls[2]], [calls[0]], [calls[1], end]):
        assert intake.accept(request(part)).outcome == "accepted"
        clock.now += 1.0

    # Still settling: nothing synthesised yet, and the run's end is held back
    # so the run cannot be closed before its episode is in.
    assert stored(spool, "later") == []
    run = spool.reading.run("later")
    assert run is not None and run.end_status is None

    clock.now += SETTLE
    intake.release_settled()

    [record] = stored(spool, "later")
    [trace] = record["traces"]
    assert len(trace["calls"]) == 3
    assert [node["message"]["role"] for node in trace["nodes"]][:3] == ["user", "assistant", "user"]
    assert trace["rewards"] == {"reward": {"score": 1.0, "weight": 1.0}}
    run = spool.reading.run("later")
    assert run is not None and run.end_status == "completed"


def test_a_retried_request_yields_one_episode(spool: Spool, clock: Clock) -> None:
    intake = intake_of(spool, clock)
    spans = produce("retried", episodes=2)

    for _ in range(3):
        intake.accept(request(spans))
        clock.now += SETTLE
        intake.release_settled()

    assert sorted(record["task"]["data"]["idx"] for record in stored(spool, "retried")) == [0, 1]
    assert intake.trees.stats.late_spans == 0


def _with_ids_of(theirs: ExportTraceServiceRequest, mine: ExportTraceServiceRequest) -> None:
    """Give ``mine``'s spans the trace and span ids of ``theirs``, in order."""
    [their_spans] = [list(scope.spans) for rs in theirs.resource_spans for scope in rs.scope_spans]
    [my_spans] = [list(scope.spans) for rs in mine.resource_spans for scope in rs.scope_spans]
    for my, their in zip(my_spans, their_spans, strict=True):
        my.trace_id, my.span_id, my.parent_span_id = (
            their.trace_id,
            their.span_id,
            their.parent_span_id,
        )


@pytest.mark.parametrize("released_first", [False, True], ids=["both-held", "one-released"])
def test_an_episode_span_with_the_ids_of_another_runs_is_counted_lost(
    spool: Spool, clock: Clock, released_first: bool, caplog: pytest.LogCaptureFixture
) -> None:
    """Taken, it would be mistaken for the other run's (a copy of it): it
    used to vanish without a count."""
    intake = intake_of(spool, clock)
    first, copycat = request(produce("first")), request(produce("copycat"))
    _with_ids_of(first, copycat)
    assert not intake.accept(first).rejected
    if released_first:
        clock.now += SETTLE
        intake.release_settled()
    verdict = intake.accept(copycat)
    clock.now += SETTLE
    intake.release_settled()

    assert verdict.rejected == 1
    assert "counted as lost" in verdict.message
    assert "the trace and span ids of another run's episode span" in caplog.text
    assert len(stored(spool, "first")) == 1
    run = spool.reading.run("copycat")
    assert run is not None and run.corrupt == 1 and stored(spool, "copycat") == []


def test_flush_releases_held_episodes_and_their_run_end(spool: Spool, clock: Clock) -> None:
    intake = intake_of(spool, clock)
    start, roots, calls, end = split(produce("flushed", episodes=2))
    intake.accept(request([start, *roots, *calls[:2], end]))

    intake.release_settled()  # not settled yet
    assert stored(spool, "flushed") == []

    intake.flush()

    records = {record["task"]["data"]["idx"]: record for record in stored(spool, "flushed")}
    assert len(records[0]["traces"][0]["calls"]) == 2
    # The second episode's calls never came: it goes out as what arrived.
    assert records[1]["traces"][0]["calls"] == []
    run = spool.reading.run("flushed")
    assert run is not None and run.end_status == "completed"


def test_memory_bound_drops_the_oldest_trace_and_says_so(
    spool: Spool, clock: Clock, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING)
    # Calls first: three traces of two calls each, room for three spans.
    intake = intake_of(spool, clock, max_held_spans=3)
    start, roots, calls, end = split(produce("calls-first", episodes=3))
    intake.accept(request([start, *calls]))
    intake.accept(request([*roots, end]))
    intake.flush()

    assert intake.trees.stats.evicted_spans == 4
    calls_kept = sorted(
        len(record["traces"][0]["calls"]) for record in stored(spool, "calls-first")
    )
    assert calls_kept == [0, 0, 2]
    assert "4 span(s) were dropped to keep the span buffer within its bound" in caplog.text
    assert "4 were dropped to stay within 3 held spans" in caplog.text

    # Roots first: the oldest episode is forced out before its calls are in.
    intake = intake_of(spool, clock, max_held_spans=3)
    start, roots, calls, end = split(produce("roots-first", episodes=3))
    intake.accept(request([start, *roots, end]))
    intake.accept(request(calls))
    intake.flush()

    assert intake.trees.stats.incomplete_episodes == 2
    assert len(stored(spool, "roots-first")) == 3
    assert "2 episode(s) went out without all of their spans" in caplog.text
    run = spool.reading.run("roots-first")
    assert run is not None and run.end_status == "completed"


def test_model_calls_under_no_episode_are_counted_and_logged(
    spool: Spool, clock: Clock, caplog: pytest.LogCaptureFixture
) -> None:
    intake = intake_of(spool, clock)
    _, _, calls, _ = split(produce("stray"))
    caplog.set_level(logging.WARNING)

    intake.accept(request(calls))
    clock.now += intake.trees.max_wait_seconds
    intake.release_settled()

    assert intake.trees.stats.unclaimed_model_calls == 2
    assert "2 model-call span(s) arrived under no episode span" in caplog.text
    assert "episode_span" in caplog.text


def test_a_full_spool_holds_episodes_back_instead_of_refusing_them(
    spool: Spool, clock: Clock
) -> None:
    intake = intake_of(spool, clock)
    start, roots, calls, _ = split(produce("full", episodes=2))
    intake.accept(request([start, roots[0], *calls]))
    room = spool.max_bytes
    spool.max_bytes = 1

    # A request with episodes is refused before the buffer sees it...
    assert intake.accept(request([roots[1]])).outcome == "full"
    # ...and a held episode waits for room rather than being refused and lost.
    clock.now += SETTLE
    intake.release_settled()
    assert stored(spool, "full") == []
    assert intake.trees.pending_episodes == 1

    spool.max_bytes = room
    intake.release_settled()
    [record] = stored(spool, "full")
    assert len(record["traces"][0]["calls"]) == 2
    run = spool.reading.run("full")
    assert run is not None and run.rejected == 0


def test_settle_and_bound_are_checked() -> None:
    with pytest.raises(ConfigError, match="cannot be negative"):
        ReceiverConfig(settle_seconds=-1).validate()
    with pytest.raises(ConfigError, match="at least one span"):
        ReceiverConfig(max_held_spans=0).validate()


# -- the whole path: openai-v2 → OTLP/HTTP (out of order) → serve → platform ---------------

_PRODUCER = textwrap.dedent(
    """
    import sys
    import openai
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.instrumentation.openai_v2 import OpenAIInstrumentor
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
    from prime_runs_otel import emit_run_end, emit_run_start, run_resource
    from prime_runs_otel.produce.traced_episode import episode_span, score_episode
    from prime_runs_otel.testing.fake_openai import FakeOpenAI

    memory = InMemorySpanExporter()
    provider = TracerProvider(
        resource=run_resource(run_id="openai-behind-serve", name="openai-behind-serve",
                              model="policy", environments=["arith"])
    )
    provider.add_span_processor(SimpleSpanProcessor(memory))
    OpenAIInstrumentor().instrument(tracer_provider=provider)
    tracer = provider.get_tracer("rl")
    tools = [{"type": "function", "function": {"name": "calc", "description": "Evaluate.",
              "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}}}}]
    emit_run_start(tracer, {"temperature": 0.7})
    with FakeOpenAI(accuracy=1.0) as fake:
        client = openai.OpenAI(base_url=fake.base_url, api_key="k", max_retries=0)
        for example, (a, b) in enumerate([(17, 25), (3, 4)]):
            with episode_span(tracer, example_id=example, env="arith") as span:
                messages = [{"role": "system", "content": "Use the tool."},
                            {"role": "user", "content": f"What is {a} + {b}?"}]
                first = client.chat.completions.create(
                    model="policy", messages=messages, tools=tools)
                call = first.choices[0].message
                messages.append(call.model_dump(exclude_none=True))
                messages.append({"role": "tool", "tool_call_id": call.tool_calls[0].id,
                                 "content": str(a + b)})
                final = client.chat.completions.create(
                    model="policy", messages=messages, tools=tools)
                correct = float(str(a + b) in final.choices[0].message.content)
                score_episode(span, correct)
                span.add_event("gen_ai.evaluation.result", {
                    "gen_ai.evaluation.name": "judge", "gen_ai.evaluation.score.value": 0.9})
    emit_run_end(tracer, "completed", episodes_recorded=2)
    provider.shutdown()

    spans = memory.get_finished_spans()
    start, end = spans[0], spans[-1]
    roots = [s for s in spans if "prime.episode.example_id" in (s.attributes or {})]
    calls = {root.context.span_id: [s for s in spans if s.parent is not None
                                    and s.parent.span_id == root.context.span_id]
             for root in roots}
    first, second = roots
    # One episode's calls before its root, the other's after it, one call a request.
    requests = [[start, *calls[first.context.span_id]], [second], [first],
                *([call] for call in reversed(calls[second.context.span_id])), [end]]
    assert sum(map(len, requests)) == len(spans), (len(spans), [s.name for s in spans])
    exporter = OTLPSpanExporter(endpoint=sys.argv[1])
    for batch in requests:
        assert exporter.export(batch).name == "SUCCESS"
    exporter.shutdown()
    print(len(requests))
    """
)


def test_openai_instrumented_episodes_are_synthesised_behind_serve(
    tmp_path: Path, platform: FakePlatform, monkeypatch: pytest.MonkeyPatch
) -> None:
    serve = ServeProcess(tmp_path, serve_env(tmp_path, platform)).start()
    try:
        monkeypatch.setenv("OTEL_SEMCONV_STABILITY_OPT_IN", "gen_ai_latest_experimental")
        monkeypatch.setenv("OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT", "span_only")
        done = subprocess.run(
            [sys.executable, "-c", _PRODUCER, serve.traces_url],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 0, done.stderr
        assert int(done.stdout) == 6

        run = closed_run(platform, "openai-behind-serve")
        episodes = platform.episodes(run.id)
    finally:
        serve.stop()
    assert "counted as lost" not in serve.log(), serve.log()

    assert run.status == "COMPLETED"
    assert run.metadata["temperature"] == 0.7
    assert run.metrics["avg_reward"] == 1.0
    assert run.metrics["avg_metrics"]["judge"] == 0.9
    assert len(episodes) == 2
    by_example = {episode["task"]["data"]["idx"]: episode for episode in episodes}
    for example, total in ((0, "42"), (1, "7")):
        [trace] = by_example[example]["traces"]
        messages = [node["message"] for node in trace["nodes"]]
        assert [message["role"] for message in messages] == [
            "system",
            "user",
            "assistant",
            "tool",
            "assistant",
        ]
        assert messages[3]["content"] == total
        assert messages[4]["content"] == f"The answer is {total}."
        assert [call["finish_reason"] for call in trace["calls"]] == ["tool_calls", "stop"]
        assert trace["rewards"] == {"reward": {"score": 1.0, "weight": 1.0}}
        assert trace["metrics"]["judge"] == 0.9
        assert trace["num_output_tokens"] > 0 and trace["num_input_tokens"] > 0
        assert by_example[example]["num_total_tokens"] == trace["num_total_tokens"]

    # The legacy sample rows the platform's table would show for them.
    for example, record in by_example.items():
        [row] = episode_sample_rows(record, 1)
        assert row["example_id"] == example
        assert row["reward"] == 1.0 and row["metrics"]["judge"] == 0.9
        assert row["completion"][-1]["content"].startswith("The answer is")
        assert row["trajectory"][0]["num_output_tokens"] > 0
