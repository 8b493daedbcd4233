"""Episode records synthesised from other instrumentations' span trees, and
the buffer that waits for those trees.

Hand-built span views pin each convention's spelling (OpenTelemetry GenAI,
OpenInference, OpenLLMetry); the real instrumentations of the ``openai``
client (``opentelemetry-instrumentation-openai-v2`` and OpenInference's),
driven against a fake OpenAI-compatible server on loopback, prove the same
against what those libraries actually emit. Every synthesised record must load
as a verifiers ``WireEpisode`` and project like a native one.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

import pytest

from prime_runs_otel import semconv as sc
from prime_runs_otel.read.checks import read_span
from prime_runs_otel.read.dialects.calls import is_model_call
from prime_runs_otel.read.projection import episode_sample_rows, step_table_rows
from prime_runs_otel.read.records import RunIdentity, UnrecordedEpisode
from prime_runs_otel.read.span_tree import SpanTreeBuffer
from prime_runs_otel.read.spans import SpanEventView, SpanView
from prime_runs_otel.read.synthesis import synthesize_record

TRACE = 0xABC
RESOURCE = {sc.RUN_ID: "local-run", sc.RUN_KIND: "train"}
TRAIN = RunIdentity(local_id="local-run", kind="train", name="rl", environments=("arith",))
T0 = 1_767_225_600_000_000_000
SECOND = 1_000_000_000


def event(name: str, attributes: Mapping[str, Any]) -> SpanEventView:
    return SpanEventView(name=name, time_ns=T0, attributes=attributes)


def span(
    span_id: int,
    parent: int | None,
    attributes: Mapping[str, Any],
    *,
    name: str = "span",
    start: float = 0.0,
    end: float = 1.0,
    error: str | None = None,
    events: Sequence[SpanEventView] = (),
    trace: int = TRACE,
) -> SpanView:
    return SpanView(
        name=name,
        trace_id=trace,
        span_id=span_id,
        parent_span_id=parent,
        start_ns=T0 + int(start * SECOND),
        end_ns=T0 + int(end * SECOND),
        attributes=dict(attributes),
        resource=RESOURCE,
        status_error=error is not None,
        status_message=error,
        events=tuple(events),
    )


def episode(span_id: int = 1, **attributes: Any) -> SpanView:
    given = {sc.EPISODE_EXAMPLE_ID: 7, sc.RUN_STEP: 20, sc.EPISODE_ENV: "arith"}
    given.update(attributes)
    return span(span_id, None, given, name="episode arith", start=0.0, end=10.0)


def genai_call(
    span_id: int,
    parent: int,
    inputs: list[dict[str, Any]],
    output: dict[str, Any] | None,
    *,
    start: float,
    usage: tuple[int, int] = (100, 20),
    error: str | None = None,
    **extra: Any,
) -> SpanView:
    attributes: dict[str, Any] = {
        sc.GEN_AI_OPERATION_NAME: "chat",
        sc.GEN_AI_REQUEST_MODEL: "policy",
        sc.GEN_AI_USAGE_INPUT_TOKENS: usage[0],
        sc.GEN_AI_USAGE_OUTPUT_TOKENS: usage[1],
        sc.GEN_AI_INPUT_MESSAGES: json.dumps(inputs),
    }
    if output is not None:
        attributes[sc.GEN_AI_OUTPUT_MESSAGES] = json.dumps([output])
    attributes.update(extra)
    return span(
        span_id, parent, attributes, name="chat policy", start=start, end=start + 1, error=error
    )


def text(role: str, content: str) -> dict[str, Any]:
    return {"role": role, "parts": [{"type": "text", "content": content}]}


def synthesize(root: SpanView, spans: Sequence[SpanView]) -> dict[str, Any]:
    return synthesize_record(root, spans, TRAIN)


@pytest.fixture(scope="module")
def validate(wire_episode: Any) -> Any:
    """Loads the record as verifiers does, and returns the loaded episode."""

    def check(record: dict[str, Any]) -> Any:
        loaded = wire_episode.model_validate(record)
        dumped = loaded.to_record()
        for key in ("num_input_tokens", "num_output_tokens", "num_total_tokens"):
            assert dumped[key] == record[key], key
            for ours, theirs in zip(record["traces"], dumped["traces"], strict=True):
                assert ours[key] == theirs[key], key
        return loaded

    return check


# -- OpenTelemetry GenAI ------------------------------------------------------------------


def test_a_genai_conversation_becomes_one_branch(validate: Any) -> None:
    call_1 = [text("system", "Be brief."), text("user", "What is 2 + 2?")]
    tool_call = {
        "role": "assistant",
        "parts": [
            {"type": "reasoning", "content": "use the tool"},
            {"type": "tool_call", "id": "c1", "name": "calc", "arguments": {"expression": "2+2"}},
        ],
        "finish_reason": "tool_calls",
    }
    result = {"role": "tool", "parts": [{"type": "tool_call_response", "id": "c1", "response": 4}]}
    # The history sent back lacks the reasoning, as providers strip it.
    sent_back = {"role": "assistant", "parts": tool_call["parts"][1:]}
    answer = {**text("assistant", "4"), "finish_reason": "stop"}
    root = episode(**{sc.EPISODE_REWARD: 1.0})
    spans = [
        genai_call(2, 1, call_1, tool_call, start=1.0, usage=(100, 20)),
        genai_call(3, 1, [*call_1, sent_back, result], answer, start=3.0, usage=(130, 5)),
    ]
    record = synthesize(root, spans)
    validate(record)

    [trace] = record["traces"]
    messages = [node["message"] for node in trace["nodes"]]
    assert messages == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "What is 2 + 2?"},
        {
            "role": "assistant",
            "reasoning_content": "use the tool",
            "tool_calls": [
                {
                    "id": "c1",
                    "type": "function",
                    "name": "calc",
                    "arguments": '{"expression": "2+2"}',
                }
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "4"},
        {"role": "assistant", "content": "4"},
    ]
    assert [node.get("parent") for node in trace["nodes"]] == [None, 0, 1, 2, 3]
    assert [node["sampled"] for node in trace["nodes"]] == [False, False, True, False, True]
    assert [(call["node"], call["finish_reason"]) for call in trace["calls"]] == [
        (2, "tool_calls"),
        (4, "stop"),
    ]
    assert trace["calls"][1]["usage"] == {"prompt_tokens": 130, "completion_tokens": 5}
    assert record["run"] == {
        "type": "train",
        "id": "local-run",
        "name": "rl",
        "work": {"type": "train", "step": 20},
    }
    assert record["env"] == {"id": "arith", "name": "arith"}
    assert record["task"] == {"type": "Task", "data": {"idx": 7, "prompt": "What is 2 + 2?"}}
    assert record["ok"] is True and trace["ok"] is True
    assert trace["rewards"] == {"reward": {"score": 1.0, "weight": 1.0}}

    [row] = episode_sample_rows(record, 1)
    assert row["reward"] == 1.0 and row["example_id"] == 7
    assert row["completion"] == messages
    assert row["trajectory"][0]["num_input_tokens"] == 100 + (130 - 120)
    assert row["token_usage"] == {"prompt_tokens": 230, "completion_tokens": 25}


def test_cache_reads_are_kept_apart_and_system_instructions_lead(validate: Any) -> None:
    call = genai_call(
        2,
        1,
        [text("user", "hi")],
        text("assistant", "hello"),
        start=1.0,
        usage=(500, 10),
        **{
            "gen_ai.usage.cache_read.input_tokens": 384,
            "gen_ai.usage.reasoning.output_tokens": 4,
            "gen_ai.system_instructions": json.dumps([{"type": "text", "content": "Be kind."}]),
            "gen_ai.tool.definitions": json.dumps(
                [
                    {
                        "type": "function",
                        "name": "calc",
                        "description": "math",
                        "parameters": {"type": "object"},
                    }
                ]
            ),
            sc.GEN_AI_RESPONSE_FINISH_REASONS: ("end_turn",),
        },
    )
    record = synthesize(episode(), [call])
    validate(record)
    [trace] = record["traces"]
    assert trace["calls"][0]["usage"] == {
        "prompt_tokens": 116,
        "completion_tokens": 10,
        "cached_input_tokens": 384,
        "reasoning_tokens": 4,
    }
    assert trace["calls"][0]["finish_reason"] == "stop"
    assert trace["nodes"][0]["message"] == {"role": "system", "content": "Be kind."}
    assert trace["tools"] == [
        {
            "type": "function",
            "name": "calc",
            "description": "math",
            "parameters": {"type": "object"},
        }
    ]
    assert trace["nodes"][0]["tools"] == trace["tools"]


def test_system_instructions_also_among_the_input_messages_are_kept_once(
    validate: Any,
) -> None:
    # openlit's shape: the system turn both in the input messages and apart.
    system = "Solve it step by step."
    call = genai_call(
        2,
        1,
        [text("system", system), text("user", "What is 2 + 2?")],
        text("assistant", "4"),
        start=1.0,
        **{"gen_ai.system_instructions": json.dumps([{"type": "text", "content": system}])},
    )
    record = synthesize(episode(), [call])
    validate(record)
    [trace] = record["traces"]
    assert [node["message"]["role"] for node in trace["nodes"]] == ["system", "user", "assistant"]
    [row] = episode_sample_rows(record, 1)
    assert [message["role"] for message in row["completion"]] == ["system", "user", "assistant"]


def test_agents_become_traces_and_the_summary_trace_gets_the_reward(validate: Any) -> None:
    root = episode(**{sc.EPISODE_REWARD: 0.5, sc.AGENT_REWARD_PREFIX + "correct": 1.0})
    solver = span(
        2,
        1,
        {sc.GEN_AI_OPERATION_NAME: "invoke_agent", sc.GEN_AI_AGENT_NAME: "solver"},
        start=0.5,
        end=5.0,
    )
    judge = span(
        3,
        1,
        {
            sc.GEN_AI_OPERATION_NAME: "invoke_agent",
            sc.GEN_AI_AGENT_NAME: "judge",
            sc.AGENT_TRAINABLE: False,
            sc.AGENT_METRIC_PREFIX + "agreement": 1.0,
        },
        start=5.0,
        end=7.0,
    )
    spans = [
        solver,
        judge,
        genai_call(4, 2, [text("user", "2+2?")], text("assistant", "4"), start=1.0),
        genai_call(5, 3, [text("user", "Is 4 right?")], text("assistant", "yes"), start=5.5),
    ]
    record = synthesize(root, spans)
    validate(record)

    assert [(t["agent"]["name"], t["agent"]["trainable"]) for t in record["traces"]] == [
        ("solver", True),
        ("judge", False),
    ]
    solver_trace, judge_trace = record["traces"]
    assert solver_trace["rewards"] == {"reward": {"score": 0.5, "weight": 1.0}}
    assert solver_trace["metrics"] == {"correct": 1.0}
    assert judge_trace["rewards"] == {} and judge_trace["metrics"] == {"agreement": 1.0}
    assert [row["agent"] for row in episode_sample_rows(record, 1)] == ["solver"]


def test_named_scores_without_a_total_are_the_rewards(validate: Any) -> None:
    evaluation = event(
        sc.GEN_AI_EVALUATION_EVENT,
        {sc.GEN_AI_EVALUATION_NAME: "format", sc.GEN_AI_EVALUATION_SCORE: 0.5},
    )
    root = span(
        1,
        None,
        {sc.EPISODE_EXAMPLE_ID: 1, sc.AGENT_REWARD_PREFIX + "correct": 1.0},
        events=[evaluation],
        end=5.0,
    )
    call = genai_call(2, 1, [text("user", "q")], text("assistant", "a"), start=1.0)
    record = synthesize(root, [call])
    validate(record)
    [trace] = record["traces"]
    assert trace["rewards"] == {
        "correct": {"score": 1.0, "weight": 1.0},
        "format": {"score": 0.5, "weight": 1.0},
    }
    [row] = episode_sample_rows(record, 1)
    assert row["reward"] == 1.5 and row["correct"] == 1.0 and row["format"] == 0.5


def test_evaluation_events_on_a_model_call_score_its_agent() -> None:
    evaluation = event(
        sc.GEN_AI_EVALUATION_EVENT,
        {sc.GEN_AI_EVALUATION_NAME: "relevance", sc.GEN_AI_EVALUATION_SCORE: 0.8},
    )
    call = genai_call(2, 1, [text("user", "q")], text("assistant", "a"), start=1.0)
    call = replace(call, events=(evaluation,))
    [trace] = synthesize(episode(), [call])["traces"]
    assert trace["rewards"] == {"relevance": {"score": 0.8, "weight": 1.0}}


def test_failures_come_from_span_status(validate: Any) -> None:
    exception = event(
        "exception",
        {
            "exception.type": "TimeoutError",
            "exception.message": "no answer",
            "exception.stacktrace": "Traceback...",
        },
    )
    root = span(
        1,
        None,
        {sc.EPISODE_EXAMPLE_ID: 2},
        error="TimeoutError: no answer",
        events=[exception],
        end=9.0,
    )
    ok_call = genai_call(2, 1, [text("user", "q")], text("assistant", "a"), start=1.0)
    failed_call = genai_call(
        3,
        1,
        [text("user", "q"), text("assistant", "a"), text("user", "more")],
        None,
        start=3.0,
        error="upstream 500",
        **{sc.ERROR_TYPE: "InternalServerError"},
    )
    record = synthesize(root, [ok_call, failed_call])
    validate(record)
    [trace] = record["traces"]
    assert record["ok"] is False and trace["ok"] is False
    assert record["errors"] == [
        {"type": "TimeoutError", "message": "TimeoutError: no answer", "traceback": "Traceback..."}
    ]
    assert trace["stop_condition"] == "error"
    assert trace["calls"][1]["error"] == {"type": "InternalServerError", "message": "upstream 500"}
    assert "node" not in trace["calls"][1]
    [row] = episode_sample_rows(record, 1)
    assert row["error"]["type"] == "TimeoutError"


def test_a_failed_last_call_fails_a_trace_nobody_marked() -> None:
    failed = genai_call(2, 1, [text("user", "q")], None, start=1.0, error="rate limited")
    record = synthesize(episode(), [failed])
    [trace] = record["traces"]
    assert not trace["ok"] and trace["errors"][0]["message"] == "rate limited"
    assert record["ok"] is False


def test_the_episode_can_say_it_failed() -> None:
    root = episode(
        **{
            sc.EPISODE_OK: False,
            sc.EPISODE_ERROR_TYPE: "WrongFormat",
            sc.EPISODE_ERROR_MESSAGE: "no box",
        }
    )
    record = synthesize(root, [])
    assert record["ok"] is False
    assert record["errors"] == [{"type": "WrongFormat", "message": "no box"}]
    assert len(record["traces"]) == 1 and record["traces"][0]["nodes"] == []


def test_a_call_seen_twice_counts_once() -> None:
    outer = span(
        2,
        1,
        {_openinference_kind(): "LLM", "llm.model_name": "policy", "llm.token_count.prompt": 9},
        start=1.0,
        end=3.0,
    )
    inner = genai_call(3, 2, [text("user", "q")], text("assistant", "a"), start=1.5)
    [trace] = synthesize(episode(), [outer, inner])["traces"]
    assert len(trace["calls"]) == 1
    assert trace["calls"][0]["usage"]["prompt_tokens"] == 100


def _openinference_kind() -> str:
    return "openinference.span.kind"


def test_spans_outside_the_episode_are_ignored() -> None:
    elsewhere = genai_call(9, 8, [text("user", "other")], text("assistant", "x"), start=1.0)
    other_trace = span(2, 1, {sc.GEN_AI_OPERATION_NAME: "chat"}, trace=TRACE + 1)
    [trace] = synthesize(episode(), [elsewhere, other_trace])["traces"]
    assert trace["calls"] == []


def test_without_content_capture_usage_still_counts(validate: Any) -> None:
    bare = span(
        2,
        1,
        {
            sc.GEN_AI_OPERATION_NAME: "chat",
            sc.GEN_AI_REQUEST_MODEL: "policy",
            sc.GEN_AI_USAGE_INPUT_TOKENS: 50,
            sc.GEN_AI_USAGE_OUTPUT_TOKENS: 7,
            sc.GEN_AI_RESPONSE_FINISH_REASONS: ("length",),
        },
        start=1.0,
        end=2.0,
    )
    record = synthesize(episode(), [bare])
    validate(record)
    [trace] = record["traces"]
    assert trace["nodes"] == [] and trace["calls"][0]["finish_reason"] == "length"
    assert episode_sample_rows(record, 1)[0]["token_usage"] == {
        "prompt_tokens": 50,
        "completion_tokens": 7,
    }


def test_an_eval_run_and_an_unknown_step() -> None:
    record = synthesize_record(episode(**{sc.RUN_STEP: "x"}), [], TRAIN)
    assert "run" not in record  # a training episode must name its work
    evaluation = RunIdentity(local_id="e", kind="eval")
    record = synthesize_record(episode(), [], evaluation)
    assert record["run"] == {"type": "eval", "id": "e"}
    assert synthesize_record(episode(), [], None).get("run") is None


# -- OpenInference and OpenLLMetry ---------------------------------------------------------


def test_openinference_flattened_messages(validate: Any) -> None:
    attributes = {
        "openinference.span.kind": "LLM",
        "llm.model_name": "policy",
        "llm.input_messages.0.message.role": "system",
        "llm.input_messages.0.message.content": "Be brief.",
        "llm.input_messages.1.message.role": "user",
        "llm.input_messages.1.message.contents.0.message_content.type": "text",
        "llm.input_messages.1.message.contents.0.message_content.text": "What is this?",
        "llm.input_messages.1.message.contents.1.message_content.type": "image",
        "llm.input_messages.1.message.contents.1.message_content.image.image.url": "https://x/y.png",
        "llm.output_messages.0.message.role": "assistant",
        "llm.output_messages.0.message.tool_calls.0.tool_call.id": "t1",
        "llm.output_messages.0.message.tool_calls.0.tool_call.function.name": "zoom",
        "llm.output_messages.0.message.tool_calls.0.tool_call.function.arguments": '{"x": 1}',
        "llm.token_count.prompt": 40,
        "llm.token_count.completion": 6,
        "llm.token_count.prompt_details.cache_read": 8,
        "llm.tools.0.tool.json_schema": json.dumps(
            {"type": "function", "function": {"name": "zoom", "parameters": {"type": "object"}}}
        ),
    }
    record = synthesize(episode(), [span(2, 1, attributes, start=1.0, end=2.0)])
    validate(record)
    [trace] = record["traces"]
    assert [node["message"] for node in trace["nodes"]] == [
        {"role": "system", "content": "Be brief."},
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "What is this?"},
                {"type": "image_url", "image_url": {"url": "https://x/y.png"}},
            ],
        },
        {
            "role": "assistant",
            "tool_calls": [
                {"id": "t1", "type": "function", "name": "zoom", "arguments": '{"x": 1}'}
            ],
        },
    ]
    assert trace["calls"][0]["finish_reason"] == "tool_calls"
    assert trace["calls"][0]["usage"] == {
        "prompt_tokens": 32,
        "completion_tokens": 6,
        "cached_input_tokens": 8,
    }
    assert trace["tools"][0]["name"] == "zoom"
    assert trace["info"]["instrumentation"] == ["openinference"]


def test_openllmetry_flattened_messages_and_agents(validate: Any) -> None:
    agent = span(
        2, 1, {"traceloop.span.kind": "agent", "traceloop.entity.name": "planner"}, start=0.5, end=4
    )
    attributes = {
        "llm.request.type": "chat",
        "gen_ai.request.model": "policy",
        "gen_ai.prompt.0.role": "user",
        "gen_ai.prompt.0.content": "Plan a trip.",
        "gen_ai.completion.0.role": "assistant",
        "gen_ai.completion.0.content": "Go north.",
        "gen_ai.completion.0.finish_reason": "stop",
        "gen_ai.usage.prompt_tokens": 12,
        "gen_ai.usage.completion_tokens": 3,
        "llm.request.functions.0.name": "map",
        "llm.request.functions.0.parameters": '{"type": "object"}',
    }
    task = span(3, 2, {"traceloop.span.kind": "task"}, start=1, end=3)
    call = span(4, 3, attributes, start=1.5, end=2.5)
    record = synthesize(episode(), [agent, task, call])
    validate(record)
    [trace] = record["traces"]
    assert trace["agent"]["name"] == "planner"
    assert [node["message"] for node in trace["nodes"]] == [
        {"role": "user", "content": "Plan a trip."},
        {"role": "assistant", "content": "Go north."},
    ]
    assert trace["calls"][0]["usage"] == {"prompt_tokens": 12, "completion_tokens": 3}
    assert trace["tools"] == [
        {"type": "function", "name": "map", "description": "", "parameters": {"type": "object"}}
    ]


def test_model_call_recognition() -> None:
    assert is_model_call(span(1, None, {sc.GEN_AI_OPERATION_NAME: "chat"}))
    assert is_model_call(span(1, None, {"openinference.span.kind": "LLM"}))
    assert is_model_call(span(1, None, {"llm.request.type": "completion"}))
    assert is_model_call(span(1, None, {sc.GEN_AI_INPUT_MESSAGES: "[]"}))
    assert not is_model_call(span(1, None, {sc.GEN_AI_OPERATION_NAME: "invoke_agent"}))
    assert not is_model_call(span(1, None, {"http.method": "POST"}))


# -- the buffer -----------------------------------------------------------------------------


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _feed(buffer: SpanTreeBuffer, views: Sequence[SpanView]) -> None:
    for view in views:
        meaning = read_span(view)
        if isinstance(meaning, UnrecordedEpisode):
            buffer.add_episode(meaning)
        elif meaning is None:
            buffer.add(view)


def _tree(root_id: int, trace: int = TRACE) -> list[SpanView]:
    root = span(root_id, None, {sc.EPISODE_EXAMPLE_ID: 1}, trace=trace, end=9.0)
    agent = span(root_id + 1, root_id, {sc.GEN_AI_OPERATION_NAME: "invoke_agent"}, trace=trace)
    call = genai_call(
        root_id + 2, root_id + 1, [text("user", "q")], text("assistant", "a"), start=1.0
    )
    return [root, agent, replace(call, trace_id=trace)]


def test_in_process_an_episode_is_released_when_it_arrives() -> None:
    buffer = SpanTreeBuffer()
    root, agent, call = _tree(1)
    _feed(buffer, [call, agent])
    assert buffer.release() == [] and len(buffer) == 2
    _feed(buffer, [root])
    [tree] = buffer.release()
    assert tree.root.view == root and tree.complete
    assert sorted(view.span_id for view in tree.spans) == [2, 3]
    assert len(buffer) == 0 and buffer.pending_episodes == 0


def test_episodes_whose_calls_carry_no_messages_are_reported_once_per_run(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # What openai-v2 emits under gen_ai_latest_experimental when the capture
    # switch says `true`: usage, and no messages.
    buffer = SpanTreeBuffer()
    for root_id in (10, 20, 30):
        root, agent, _ = _tree(root_id)
        bare = span(
            root_id + 2,
            root_id + 1,
            {sc.GEN_AI_OPERATION_NAME: "chat", sc.GEN_AI_USAGE_INPUT_TOKENS: 9},
        )
        if root_id == 30:  # another run
            root = replace(root, resource={sc.RUN_ID: "other-run"})
        _feed(buffer, [bare, agent, root])
    root, agent, call = _tree(40)
    _feed(buffer, [call, agent, root])  # with messages: nothing to say
    assert len(buffer.release()) == 4
    assert buffer.stats.episodes_without_messages == 3
    warnings = [
        r.getMessage() for r in caplog.records if "no prompts or completions" in r.getMessage()
    ]
    assert len(warnings) == 2
    assert "local-run" in warnings[0] and "other-run" in warnings[1]
    assert "span_only" in warnings[0] and "gen_ai_latest_experimental" in warnings[0]


def test_behind_a_collector_stragglers_are_waited_for_then_counted() -> None:
    clock = Clock()
    buffer = SpanTreeBuffer(settle_seconds=5.0, clock=clock)
    root, agent, call = _tree(1)
    _feed(buffer, [root, call])
    clock.now = 2.0
    assert buffer.release() == []
    _feed(buffer, [agent])
    clock.now = 5.0
    [tree] = buffer.release()
    assert sorted(view.span_id for view in tree.spans) == [2, 3]

    late = span(4, 2, {sc.GEN_AI_OPERATION_NAME: "chat"})
    late_child = span(5, 4, {})
    _feed(buffer, [late, late_child, root])  # and a collector's copy of the root
    assert buffer.stats.late_spans == 2
    assert buffer.stats.incomplete_episodes == 1
    assert buffer.release() == [] and len(buffer) == 0


def test_spans_under_no_episode_are_let_go_and_model_calls_counted() -> None:
    clock = Clock()
    buffer = SpanTreeBuffer(max_wait_seconds=30.0, clock=clock)
    stray = [
        genai_call(2, 1, [text("user", "q")], None, start=0.0, trace=TRACE),
        span(3, None, {"http.method": "GET"}, trace=TRACE + 1),
    ]
    _feed(buffer, stray)
    # In process a root span ends last: once it is in, its trace is let go.
    assert buffer.release() == [] and len(buffer) == 1
    clock.now = 29.0
    assert buffer.release() == [] and len(buffer) == 1
    clock.now = 31.0
    assert buffer.release() == [] and len(buffer) == 0
    assert buffer.stats.unclaimed_model_calls == 1


def test_behind_a_collector_root_traces_can_stand_in_for_episodes() -> None:
    clock = Clock()
    buffer = SpanTreeBuffer(settle_seconds=5.0, root_traces_as_episodes=True, clock=clock)
    request = span(1, None, {"http.route": "/ask"}, trace=TRACE)
    call = genai_call(2, 1, [text("user", "q")], text("assistant", "a"), start=1.0)
    marked_root, marked_agent, marked_call = _tree(10)  # a marked episode inside it
    marked_root = replace(marked_root, parent_span_id=1)
    quiet = span(30, None, {"http.route": "/health"}, trace=TRACE + 1)
    _feed(buffer, [request, quiet, marked_call, marked_root])
    clock.now = 2.0
    _feed(buffer, [call, marked_agent])  # stragglers, within the settle time
    clock.now = 6.0
    trees = buffer.release()
    # The marked episode keeps its own calls; the root trace the rest; the
    # health check holds no model call and is no episode.
    assert [tree.root.view.span_id for tree in trees] == [10, 1]
    assert sorted(view.span_id for view in trees[0].spans) == [11, 12]
    assert [view.span_id for view in trees[1].spans] == [2]
    record = synthesize(trees[1].root.view, trees[1].spans)
    assert record["task"]["data"]["idx"] == 0
    assert record["task"]["data"]["prompt"] == "q"
    assert buffer.stats.unclaimed_model_calls == 0 and len(buffer) == 0


def test_memory_is_bounded_and_an_evicted_episode_is_released_incomplete() -> None:
    clock = Clock()
    buffer = SpanTreeBuffer(settle_seconds=5.0, max_spans=4, clock=clock)
    first = _tree(1, trace=1)
    loose = span(60, 59, {}, trace=1)  # under a span that has not arrived
    _feed(buffer, [*first[:2], loose])  # the root, its agent, and the loose span
    _feed(buffer, [span(i, 100, {}, trace=2) for i in range(10, 13)])
    assert len(buffer) == 3  # trace 1 went as a whole, being the oldest
    [forced] = buffer.release()
    assert forced.root.view == first[0] and not forced.complete
    assert [view.span_id for view in forced.spans] == [2]
    assert buffer.stats.incomplete_episodes == 1
    assert buffer.stats.evicted_spans == 1


def test_native_episodes_take_their_children_along() -> None:
    buffer = SpanTreeBuffer()
    native_root = span(1, None, {sc.EPISODE_ID: "e", sc.EPISODE_RECORD: "{}"})
    children = [span(2, 1, {sc.GEN_AI_OPERATION_NAME: "invoke_agent"}), span(3, 2, {})]
    _feed(buffer, children)
    buffer.claim_native(native_root)
    _feed(buffer, [span(4, 2, {})])
    assert len(buffer) == 0 and buffer.stats.late_spans == 0
    assert buffer.release(flush=True) == []


def test_flush_releases_everything_held() -> None:
    clock = Clock()
    buffer = SpanTreeBuffer(settle_seconds=60.0, clock=clock)
    root, agent, call = _tree(1)
    _feed(buffer, [root, agent, call, span(50, None, {}, trace=77)])
    [tree] = buffer.release(flush=True)
    assert len(tree.spans) == 2 and len(buffer) == 0


def test_buffer_arguments_are_checked() -> None:
    with pytest.raises(ValueError):
        SpanTreeBuffer(max_spans=0)


# -- real instrumentations of the openai client --------------------------------------------

_INSTRUMENTED = textwrap.dedent(
    """
    import json, sys
    import openai
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
    from prime_runs_otel.produce.resource import run_resource
    from prime_runs_otel.produce.traced_episode import episode_span, score_episode
    from prime_runs_otel.read.checks import read_span, run_identity
    from prime_runs_otel.read.records import UnrecordedEpisode
    from prime_runs_otel.read.spans import from_readable_span
    from prime_runs_otel.read.span_tree import SpanTreeBuffer
    from prime_runs_otel.read.synthesis import synthesize_record
    from prime_runs_otel.testing.fake_openai import FakeOpenAI

    exporter = InMemorySpanExporter()
    resource = run_resource(run_id="r", kind="train", model="policy", environments=["arith"])
    provider = TracerProvider(resource=resource)
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    if sys.argv[1] == "logfire":
        # logfire traces through a provider of its own; its spans join the
        # episode's trace through the shared context.
        import logfire
        logfire.configure(send_to_logfire=False, console=False, inspect_arguments=False,
                          additional_span_processors=[SimpleSpanProcessor(exporter)])
        logfire.instrument_openai()
    else:
        if sys.argv[1] == "openai-v2":
            from opentelemetry.instrumentation.openai_v2 import OpenAIInstrumentor
        elif sys.argv[1] == "openllmetry":
            from opentelemetry.instrumentation.openai import OpenAIInstrumentor
        else:
            from openinference.instrumentation.openai import OpenAIInstrumentor
        OpenAIInstrumentor().instrument(tracer_provider=provider)
    tracer = provider.get_tracer("rl")
    tools = [{"type": "function", "function": {"name": "calc", "description": "Evaluate.",
              "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}}}}]
    # The server answers as a dated snapshot: the record keeps the model asked for.
    with FakeOpenAI(accuracy=1.0, response_model="policy-2026-01-01") as fake:
        client = openai.OpenAI(base_url=fake.base_url, api_key="k", max_retries=0)
        for example, (a, b) in enumerate([(17, 25), (3, 4)]):
            with episode_span(tracer, example_id=example, step=10, env="arith") as span:
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
                score_episode(span, float(str(a + b) in final.choices[0].message.content))
        fake.fail_next(1, status=400)
        try:
            with episode_span(tracer, example_id=9, step=10, env="arith") as span:
                client.chat.completions.create(
                    model="policy", messages=[{"role": "user", "content": "What is 1 + 1?"}])
        except openai.BadRequestError:
            pass
    buffer = SpanTreeBuffer()
    views = [from_readable_span(s) for s in exporter.get_finished_spans()]
    for view in views:
        meaning = read_span(view)
        if isinstance(meaning, UnrecordedEpisode):
            buffer.add_episode(meaning)
        elif meaning is None:
            buffer.add(view)
    identity = run_identity(resource.attributes)
    records = [synthesize_record(t.root.view, t.spans, identity) for t in buffer.release()]
    print(json.dumps(records))
    """
)


@pytest.mark.parametrize(
    "instrumentation", ["openai-v2", "openinference", "openllmetry", "logfire"]
)
def test_a_real_instrumentation_yields_sensible_samples(
    instrumentation: str, validate: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # openai-v2 puts messages on spans only with the latest GenAI conventions and
    # content capture switched on; both are process-wide, hence the subprocess.
    monkeypatch.setenv("OTEL_SEMCONV_STABILITY_OPT_IN", "gen_ai_latest_experimental")
    monkeypatch.setenv("OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT", "span_only")
    done = subprocess.run(
        [sys.executable, "-c", _INSTRUMENTED, instrumentation],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    records = json.loads(done.stdout)
    assert len(records) == 3
    for record in records:
        validate(record)
    solved, _, failed = records

    [trace] = solved["traces"]
    assert [node["message"]["role"] for node in trace["nodes"]] == [
        "system",
        "user",
        "assistant",
        "tool",
        "assistant",
    ]
    assert trace["nodes"][1]["message"]["content"] == "What is 17 + 25?"
    assert trace["nodes"][2]["message"]["tool_calls"][0]["name"] == "calc"
    assert trace["nodes"][3]["message"] == {
        "role": "tool",
        "tool_call_id": "call_1",
        "content": "42",
    }
    assert trace["nodes"][4]["message"]["content"] == "The answer is 42."
    assert [call["finish_reason"] for call in trace["calls"]] == ["tool_calls", "stop"]
    assert [call["model"] for call in trace["calls"]] == ["policy", "policy"]
    assert all(call["usage"]["prompt_tokens"] > 0 for call in trace["calls"])
    if instrumentation != "openai-v2":  # openai-v2 does not record tool definitions
        assert trace["tools"][0]["name"] == "calc"
    assert solved["run"]["work"] == {"type": "train", "step": 10}

    [row] = episode_sample_rows(solved, 1)
    assert row["reward"] == 1.0 and row["example_id"] == 0
    assert row["completion"][-1]["content"] == "The answer is 42."
    assert row["trajectory"][0]["num_output_tokens"] > 0
    [step_row] = step_table_rows([solved], "run", 10)
    assert json.loads(step_row["completion"])[-1]["content"] == "The answer is 42."

    assert failed["ok"] is False
    assert failed["traces"][0]["calls"][0]["error"]["type"]
