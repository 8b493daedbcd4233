"""The producer side: run resources, config normalisation, and episodes as span trees.

Every test drives a real OpenTelemetry SDK pipeline (TracerProvider, span
processor, the SDK's in-memory exporter) and reads back what it exported.
"""

from __future__ import annotations

import json
import math
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.context import Context
from opentelemetry.sdk._logs import LoggerProvider
from opentelemetry.sdk._logs.export import InMemoryLogRecordExporter, SimpleLogRecordProcessor
from opentelemetry.sdk.trace import ReadableSpan, Span, SpanLimits, SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.sampling import ALWAYS_OFF
from opentelemetry.trace import SpanKind, StatusCode, Tracer

from prime_runs_otel import semconv as sc
from prime_runs_otel._json import dumps_record
from prime_runs_otel.errors import ConfigError, RecordError
from prime_runs_otel.produce.episode import record_episode
from prime_runs_otel.produce.resource import run_resource
from prime_runs_otel.produce.run_config import MAX_CONFIG_SOURCE_BYTES, normalize_config
from prime_runs_otel.produce.run_spans import emit_run_end, emit_run_start
from prime_runs_otel.produce.signals import Signals
from prime_runs_otel.produce.synthetic import synthetic_episode
from prime_runs_otel.read.checks import read_span
from prime_runs_otel.read.episodes import EpisodeArrival
from prime_runs_otel.read.records import RunEnd, RunStart
from prime_runs_otel.read.spans import from_readable_span

T0 = 1_767_225_600.0


def ns(seconds: float) -> int:
    return int(seconds * 1_000_000_000)


def assert_time(actual: int | None, seconds: float) -> None:
    """Epoch seconds as floats carry about 0.2 µs of rounding at today's dates."""
    assert actual is not None
    assert abs(actual - ns(seconds)) <= 1_000


class Pipeline:
    """A real SDK pipeline for one run, exporting spans (and the GenAI log
    events, through ``signals``) into memory."""

    def __init__(self, limits: SpanLimits | None = None, *processors: SpanProcessor) -> None:
        self.exporter = InMemorySpanExporter()
        resource = run_resource(run_id="run-under-test", environments=["math"])
        self.provider = TracerProvider(resource=resource, span_limits=limits)
        for processor in processors:
            self.provider.add_span_processor(processor)
        self.provider.add_span_processor(SimpleSpanProcessor(self.exporter))
        self.tracer: Tracer = self.provider.get_tracer("tests")
        self.logs = InMemoryLogRecordExporter()
        self.logger_provider = LoggerProvider(resource=resource)
        self.logger_provider.add_log_record_processor(SimpleLogRecordProcessor(self.logs))
        self.signals = Signals.of(logger_provider=self.logger_provider)

    def events(self, name: str) -> list[Any]:
        """The API log records of the events named ``name``, in order."""
        records = [item.log_record for item in self.logs.get_finished_logs()]
        return [record for record in records if record.event_name == name]

    def spans(self) -> list[ReadableSpan]:
        return list(self.exporter.get_finished_spans())

    def by_name(self) -> dict[str, ReadableSpan]:
        return {span.name: span for span in self.spans()}

    def arrivals(self) -> list[Any]:
        return [read_span(from_readable_span(span)) for span in self.spans()]


@dataclass
class _Point:
    x: int
    y: int


@pytest.fixture
def pipeline() -> Iterator[Pipeline]:
    built = Pipeline()
    yield built
    built.provider.shutdown()


# ---------------------------------------------------------------------------
# A hand-built record whose every value the tests can name
# ---------------------------------------------------------------------------


def message_node(
    parent: int | None, message: dict[str, Any], sampled: bool = False
) -> dict[str, Any]:
    return {"parent": parent, "message": message, "sampled": sampled, "timestamp": T0}


def model_call(
    node: int,
    model: str,
    start: float,
    end: float,
    *,
    finish: str | None = "stop",
    error: dict[str, Any] | None = None,
    cached: int | None = None,
) -> dict[str, Any]:
    usage: dict[str, Any] = {"prompt_tokens": 10, "completion_tokens": 5}
    if cached is not None:
        usage["cached_input_tokens"] = cached
    call: dict[str, Any] = {"node": node, "model": model, "usage": usage}
    call["endpoint"] = "/chat/completions"
    call["time"] = {"start": start, "end": end}
    if finish is not None:
        call["finish_reason"] = finish
    if error is not None:
        call["error"] = error
    return call


TIMEOUT = {"type": "ProviderTimeout", "message": "no response within 30s"}


def solver_trace() -> dict[str, Any]:
    nodes = [
        message_node(None, {"role": "system", "content": "Be exact."}),
        message_node(0, {"role": "user", "content": "What is 6 x 7?"}),
        message_node(
            1,
            {
                "role": "assistant",
                "content": None,
                "reasoning_content": "Use the calculator.",
                "tool_calls": [
                    {
                        "id": "call-1",
                        "type": "function",
                        "name": "calculator",
                        "arguments": '{"expression": "6*7"}',
                    }
                ],
            },
            sampled=True,
        ),
        message_node(2, {"role": "tool", "tool_call_id": "call-1", "content": "42"}),
        message_node(3, {"role": "assistant", "content": "The answer is 42."}, sampled=True),
    ]
    return {
        "id": "trace-solver",
        "task": {"type": "MathTask", "data": {"idx": 7, "answer": "42"}},
        "agent": {
            "config": {
                "sampling": {"temperature": 0.7, "max_tokens": 512},
                "client": {"base_url": "https://models.example:8443/v1"},
            },
            "name": "solver",
            "trainable": True,
        },
        "tools": [
            {
                "type": "function",
                "name": "calculator",
                "description": "Evaluate an arithmetic expression.",
                "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}},
            }
        ],
        "nodes": nodes,
        "calls": [
            {
                **model_call(2, "policy-8b", T0 + 1, T0 + 2, finish="tool_calls", cached=4),
                "sampling": {"temperature": 0.7, "top_p": 0.95, "max_tokens": 512, "seed": 3},
            },
            model_call(4, "policy-8b", T0 + 3, T0 + 3.5, finish=None, error=TIMEOUT),
        ],
        "rewards": {
            "correct": {"score": 1.0, "weight": 2.0},
            "format": {"score": 0.5, "weight": 1.0},
            "not_scored": None,
        },
        "ok": False,
        "stop_condition": "model_error",
        "errors": [TIMEOUT],
        "timing": {
            "start": T0,
            "agent": {"start": T0 + 0.5, "end": T0 + 3.5},
            "scoring": {"start": T0 + 3.6, "end": T0 + 4.0},
        },
        "num_input_tokens": 24,
        "num_output_tokens": 10,
    }


def judge_trace() -> dict[str, Any]:
    return {
        "id": "trace-judge",
        "task": {"type": "MathTask", "data": {"idx": 7}},
        "agent": {"config": {}, "name": "judge", "trainable": False},
        "nodes": [
            message_node(None, {"role": "user", "content": "Grade: 42"}),
            message_node(0, {"role": "assistant", "content": "correct"}, sampled=True),
        ],
        "calls": [model_call(1, "judge-mini", T0 + 5, T0 + 6)],
        "rewards": {},
        "ok": True,
        "stop_condition": "agent_completed",
        "errors": [],
        "timing": {"start": T0 + 4.5, "scoring": {"start": T0 + 6.0, "end": T0 + 6.5}},
        "num_input_tokens": 10,
        "num_output_tokens": 5,
    }


def hand_record(episode_id: str = "episode-1") -> dict[str, Any]:
    """A failed training episode: a judge trace first, then the trainable solver."""
    return {
        "id": episode_id,
        "env": {"id": "math-env", "name": "math"},
        "task": {"type": "MathTask", "data": {"idx": 7, "answer": "42"}},
        "group": {"id": "group-3"},
        "run": {"type": "train", "id": "r", "work": {"type": "train", "step": 12}},
        "ok": False,
        "is_timeout": False,
        "errors": [{"type": "ValueError", "message": "first"}, TIMEOUT],
        "traces": [judge_trace(), solver_trace()],
        "num_input_tokens": 34,
        "num_output_tokens": 15,
    }


# ---------------------------------------------------------------------------
# The span tree
# ---------------------------------------------------------------------------


def test_episode_becomes_episode_agent_and_chat_spans(pipeline: Pipeline) -> None:
    assert record_episode(pipeline.tracer, hand_record()) == "episode-1"

    spans = pipeline.spans()
    names = sorted(span.name for span in spans)
    assert names == [
        "chat judge-mini",
        "chat policy-8b",
        "chat policy-8b",
        "episode math",
        "execute_tool calculator",
        "invoke_agent judge",
        "invoke_agent solver",
    ]
    by_name = pipeline.by_name()
    episode, solver, judge = (
        by_name["episode math"],
        by_name["invoke_agent solver"],
        by_name["invoke_agent judge"],
    )
    assert episode.context is not None and solver.context is not None
    assert solver.parent is not None and solver.parent.span_id == episode.context.span_id
    assert judge.parent is not None and judge.parent.span_id == episode.context.span_id
    solver_calls = [span for span in spans if span.name == "chat policy-8b"]
    assert all(
        call.parent is not None and call.parent.span_id == solver.context.span_id
        for call in solver_calls
    )
    tool = by_name["execute_tool calculator"]
    assert tool.parent is not None and tool.parent.span_id == solver.context.span_id
    assert {span.context.trace_id for span in spans if span.context} == {episode.context.trace_id}


def test_span_times_come_from_the_record(pipeline: Pipeline) -> None:
    record_episode(pipeline.tracer, hand_record())
    by_name = pipeline.by_name()

    assert_time(by_name["episode math"].start_time, T0)
    assert_time(by_name["episode math"].end_time, T0 + 6.5)
    assert_time(by_name["invoke_agent solver"].start_time, T0)
    assert_time(by_name["invoke_agent solver"].end_time, T0 + 4.0)
    assert_time(by_name["invoke_agent judge"].start_time, T0 + 4.5)
    assert_time(by_name["invoke_agent judge"].end_time, T0 + 6.5)
    calls = sorted(
        (span for span in pipeline.spans() if span.name.startswith("chat")),
        key=lambda span: span.start_time or 0,
    )
    expected = [(T0 + 1, T0 + 2), (T0 + 3, T0 + 3.5), (T0 + 5, T0 + 6)]
    for span, (start, end) in zip(calls, expected, strict=True):
        assert_time(span.start_time, start)
        assert_time(span.end_time, end)


def test_record_without_timing_spans_the_moment_it_was_recorded(pipeline: Pipeline) -> None:
    import time

    record = {"id": "untimed", "traces": [{"id": "t", "agent": {"name": "a"}, "calls": [{}]}]}
    before = time.time_ns()
    record_episode(pipeline.tracer, record)
    after = time.time_ns()

    for span in pipeline.spans():
        assert span.start_time is not None and span.end_time is not None
        assert before <= span.start_time <= span.end_time <= after
    assert sorted(span.name for span in pipeline.spans()) == [
        "chat",
        "episode",
        "invoke_agent a",
    ]


def test_episode_span_attributes_summarise_the_record(pipeline: Pipeline) -> None:
    record_episode(pipeline.tracer, hand_record())
    episode = pipeline.by_name()["episode math"]
    attributes = dict(episode.attributes or {})

    blob_keys = {
        sc.EPISODE_RECORD,
        sc.blob_size_key(sc.EPISODE_RECORD),
        sc.blob_sha256_key(sc.EPISODE_RECORD),
    }
    assert {key: value for key, value in attributes.items() if key not in blob_keys} == {
        sc.EPISODE_ID: "episode-1",
        sc.EPISODE_EXAMPLE_ID: 7,
        sc.EPISODE_ENV: "math",
        sc.EPISODE_GROUP: "group-3",
        sc.EPISODE_OK: False,
        # The summary trace is the first *trainable* one (the solver), not the first.
        sc.EPISODE_REWARD: 2.5,
        sc.EPISODE_STOP_CONDITION: "model_error",
        # Not gen_ai.usage.*: the model-call spans carry usage, once.
        sc.EPISODE_INPUT_TOKENS: 34,
        sc.EPISODE_OUTPUT_TOKENS: 15,
        sc.RUN_STEP: 12,
        sc.EPISODE_ERROR_COUNT: 2,
        sc.EPISODE_ERROR_TYPE: "ProviderTimeout",
        sc.EPISODE_ERROR_MESSAGE: "no response within 30s",
        # For tracing backends (child spans are on): OpenInference's kind.
        sc.OPENINFERENCE_SPAN_KIND: "CHAIN",
    }
    # The blob goes last, so count-based eviction takes everything else first.
    assert list(attributes)[-3:] == [
        sc.blob_size_key(sc.EPISODE_RECORD),
        sc.blob_sha256_key(sc.EPISODE_RECORD),
        sc.EPISODE_RECORD,
    ]
    assert episode.status.status_code is StatusCode.ERROR
    assert episode.status.description == "ProviderTimeout: no response within 30s"


def test_agent_spans_follow_the_genai_conventions(pipeline: Pipeline) -> None:
    record_episode(pipeline.tracer, hand_record())
    by_name = pipeline.by_name()
    solver, judge = by_name["invoke_agent solver"], by_name["invoke_agent judge"]

    assert dict(solver.attributes or {}) == {
        sc.GEN_AI_OPERATION_NAME: "invoke_agent",
        # Its calls went to /chat/completions: OpenAI's API.
        sc.GEN_AI_PROVIDER_NAME: "openai",
        sc.GEN_AI_AGENT_NAME: "solver",
        sc.GEN_AI_CONVERSATION_ID: "trace-solver",
        # The config names no model; every call requested this one.
        sc.GEN_AI_REQUEST_MODEL: "policy-8b",
        sc.SERVER_ADDRESS: "models.example",
        sc.SERVER_PORT: 8443,
        sc.GEN_AI_REQUEST_TEMPERATURE: 0.7,
        sc.GEN_AI_REQUEST_MAX_TOKENS: 512,
        sc.ERROR_TYPE: "ProviderTimeout",
        sc.OPENINFERENCE_SPAN_KIND: "AGENT",
        "agent.name": "solver",
        sc.AGENT_TRAINABLE: True,
        sc.AGENT_TRACE_ID: "trace-solver",
        sc.AGENT_STOP_CONDITION: "model_error",
        # No token counts: its calls report usage, counted there once.
        "prime.agent.reward.correct": 1.0,
        "prime.agent.reward.format": 0.5,
        sc.AGENT_REWARD: 2.5,
    }
    assert solver.status.status_code is StatusCode.ERROR
    assert (judge.attributes or {})[sc.AGENT_TRAINABLE] is False
    assert sc.AGENT_REWARD not in (judge.attributes or {})
    assert judge.status.status_code is StatusCode.UNSET


def test_chat_spans_carry_model_usage_and_errors(pipeline: Pipeline) -> None:
    record_episode(pipeline.tracer, hand_record())
    first, failed = sorted(
        (span for span in pipeline.spans() if span.name == "chat policy-8b"),
        key=lambda span: span.start_time or 0,
    )

    assert dict(first.attributes or {}) == {
        sc.GEN_AI_OPERATION_NAME: "chat",
        sc.GEN_AI_PROVIDER_NAME: "openai",
        sc.GEN_AI_REQUEST_MODEL: "policy-8b",
        # No gen_ai.response.model: the record keeps only the model requested.
        sc.GEN_AI_CONVERSATION_ID: "trace-solver",
        sc.SERVER_ADDRESS: "models.example",
        sc.SERVER_PORT: 8443,
        # The call's own sampling, as recorded.
        sc.GEN_AI_REQUEST_TEMPERATURE: 0.7,
        sc.GEN_AI_REQUEST_TOP_P: 0.95,
        sc.GEN_AI_REQUEST_MAX_TOKENS: 512,
        sc.GEN_AI_REQUEST_SEED: 3,
        # input tokens include cache reads, as the GenAI conventions ask
        sc.GEN_AI_USAGE_INPUT_TOKENS: 14,
        sc.GEN_AI_USAGE_OUTPUT_TOKENS: 5,
        sc.GEN_AI_USAGE_CACHE_READ_INPUT_TOKENS: 4,
        sc.GEN_AI_RESPONSE_FINISH_REASONS: ("tool_calls",),
        # the same call as OpenInference spells it (Phoenix reads these)
        sc.OPENINFERENCE_SPAN_KIND: "LLM",
        sc.LLM_PROVIDER: "openai",
        sc.LLM_MODEL_NAME: "policy-8b",
        sc.LLM_TOKEN_COUNT_PROMPT: 14,
        sc.LLM_TOKEN_COUNT_COMPLETION: 5,
        sc.LLM_TOKEN_COUNT_TOTAL: 19,
    }
    # A model call is a request to a remote service.
    assert first.kind is SpanKind.CLIENT
    assert by_kind(pipeline, "invoke_agent") == {SpanKind.INTERNAL}
    assert first.status.status_code is StatusCode.UNSET
    assert failed.status.status_code is StatusCode.ERROR
    assert failed.status.description == "ProviderTimeout: no response within 30s"
    assert (failed.attributes or {})[sc.ERROR_TYPE] == "ProviderTimeout"


def test_only_the_episode_span_means_something_to_the_consumer(pipeline: Pipeline) -> None:
    record_episode(pipeline.tracer, hand_record())
    meanings = pipeline.arrivals()
    arrivals = [item for item in meanings if isinstance(item, EpisodeArrival)]

    assert len(arrivals) == 1
    assert arrivals[0].record == hand_record()
    assert meanings.count(None) == 6


def test_without_summary_attributes_the_episode_span_carries_its_id_and_record(
    pipeline: Pipeline,
) -> None:
    failed = {**hand_record(), "ok": False}
    record_episode(pipeline.tracer, failed, child_spans=False, summary_attributes=False)
    (span,) = pipeline.spans()

    assert set(span.attributes or {}) == {
        sc.EPISODE_ID,
        sc.EPISODE_RECORD,
        sc.blob_size_key(sc.EPISODE_RECORD),
        sc.blob_sha256_key(sc.EPISODE_RECORD),
    }
    assert span.status.status_code is StatusCode.UNSET
    (arrival,) = pipeline.arrivals()
    assert isinstance(arrival, EpisodeArrival)
    assert arrival.record == failed


def test_a_verifiers_episode_object_is_recorded_through_to_record(
    pipeline: Pipeline, verifiers_episode: Any
) -> None:
    episode_id = record_episode(pipeline.tracer, verifiers_episode)

    assert episode_id == verifiers_episode.id
    (arrival,) = [item for item in pipeline.arrivals() if isinstance(item, EpisodeArrival)]
    assert arrival.record == verifiers_episode.to_record()


@pytest.fixture(scope="session")
def verifiers_episode() -> Any:
    """A real verifiers Episode, validated from a record (verifiers is slow to import)."""
    from verifiers.v1.episode import WireEpisode  # type: ignore[import-untyped]

    return WireEpisode.model_validate(synthetic_episode(3, error=False))


def test_a_train_record_without_rewards_has_no_reward_attribute(pipeline: Pipeline) -> None:
    record = hand_record()
    for item in record["traces"]:
        item["rewards"] = {"a": None}
    record["ok"] = True
    record_episode(pipeline.tracer, record)
    episode = pipeline.by_name()["episode math"]

    # Nothing scored is not the same as a reward of zero.
    assert sc.EPISODE_REWARD not in (episode.attributes or {})
    assert episode.status.status_code is StatusCode.UNSET


# ---------------------------------------------------------------------------
# Message content
# ---------------------------------------------------------------------------


def chat_attributes(pipeline: Pipeline) -> list[dict[str, Any]]:
    spans = sorted(
        (span for span in pipeline.spans() if span.name.startswith("chat")),
        key=lambda span: span.start_time or 0,
    )
    return [dict(span.attributes or {}) for span in spans]


def test_message_content_stays_off_spans_by_default(
    pipeline: Pipeline, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(sc.CAPTURE_MESSAGE_CONTENT_ENV, raising=False)
    record_episode(pipeline.tracer, hand_record())

    for span in pipeline.spans():
        assert sc.GEN_AI_INPUT_MESSAGES not in (span.attributes or {})
        assert sc.GEN_AI_OUTPUT_MESSAGES not in (span.attributes or {})


def test_capture_switch_puts_messages_in_the_genai_shape(
    pipeline: Pipeline, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(sc.CAPTURE_MESSAGE_CONTENT_ENV, "True")
    record_episode(pipeline.tracer, hand_record())
    tool_turn, failed_turn, judge_turn = chat_attributes(pipeline)

    assert json.loads(tool_turn[sc.GEN_AI_INPUT_MESSAGES]) == [
        {"role": "system", "parts": [{"type": "text", "content": "Be exact."}]},
        {"role": "user", "parts": [{"type": "text", "content": "What is 6 x 7?"}]},
    ]
    assert json.loads(tool_turn[sc.GEN_AI_OUTPUT_MESSAGES]) == [
        {
            "role": "assistant",
            "parts": [
                {"type": "reasoning", "content": "Use the calculator."},
                {
                    "type": "tool_call",
                    "id": "call-1",
                    "name": "calculator",
                    "arguments": {"expression": "6*7"},
                },
            ],
            "finish_reason": "tool_calls",
        }
    ]
    later_inputs = json.loads(failed_turn[sc.GEN_AI_INPUT_MESSAGES])
    assert [message["role"] for message in later_inputs] == ["system", "user", "assistant", "tool"]
    assert later_inputs[-1]["parts"] == [
        {"type": "tool_call_response", "id": "call-1", "response": "42"}
    ]
    assert json.loads(failed_turn[sc.GEN_AI_OUTPUT_MESSAGES])[0]["finish_reason"] == "error"
    assert json.loads(judge_turn[sc.GEN_AI_OUTPUT_MESSAGES]) == [
        {
            "role": "assistant",
            "parts": [{"type": "text", "content": "correct"}],
            "finish_reason": "stop",
        }
    ]


def test_the_argument_overrides_the_capture_switch(
    pipeline: Pipeline, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(sc.CAPTURE_MESSAGE_CONTENT_ENV, "true")
    record_episode(pipeline.tracer, hand_record(), capture_content=False)
    monkeypatch.setenv(sc.CAPTURE_MESSAGE_CONTENT_ENV, "false")
    record_episode(pipeline.tracer, {**hand_record(), "id": "episode-2"}, capture_content=True)

    captured = [sc.GEN_AI_INPUT_MESSAGES in attributes for attributes in chat_attributes(pipeline)]
    assert captured == [False, True, False, True, False, True]


def by_kind(pipeline: Pipeline, prefix: str) -> set[SpanKind]:
    return {span.kind for span in pipeline.spans() if span.name.startswith(prefix)}


def test_backends_see_the_episode_s_first_prompt_and_final_completion(
    pipeline: Pipeline, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(sc.CAPTURE_MESSAGE_CONTENT_ENV, "span_only")
    record_episode(pipeline.tracer, hand_record())
    by_name = pipeline.by_name()
    episode = dict(by_name["episode math"].attributes or {})
    assert episode[sc.OPENINFERENCE_SPAN_KIND] == "CHAIN"
    assert episode[sc.INPUT_VALUE] == "What is 6 x 7?"
    # The solver's last call failed; its last completion was the tool call.
    assert sc.OUTPUT_VALUE in episode
    judge = dict(by_name["invoke_agent judge"].attributes or {})
    assert judge[sc.OUTPUT_VALUE] == "correct"
    first = chat_attributes(pipeline)[0]
    assert json.loads(first[sc.INPUT_VALUE]) == json.loads(first[sc.GEN_AI_INPUT_MESSAGES])
    assert first[sc.INPUT_MIME_TYPE] == "application/json"


def test_without_content_capture_no_input_or_output_values(
    pipeline: Pipeline, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(sc.CAPTURE_MESSAGE_CONTENT_ENV, "no_content")
    record_episode(pipeline.tracer, hand_record())
    for span in pipeline.spans():
        assert not {sc.INPUT_VALUE, sc.OUTPUT_VALUE, sc.GEN_AI_INPUT_MESSAGES} & set(
            span.attributes or {}
        )


def test_without_child_spans_the_episode_span_stays_lean(
    pipeline: Pipeline, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(sc.CAPTURE_MESSAGE_CONTENT_ENV, "span_only")
    record_episode(pipeline.tracer, hand_record(), child_spans=False)
    [episode] = pipeline.spans()
    assert not {sc.OPENINFERENCE_SPAN_KIND, sc.INPUT_VALUE, sc.OUTPUT_VALUE} & set(
        episode.attributes or {}
    )


@pytest.mark.parametrize(
    ("value", "on_span", "on_event"),
    [
        ("span_only", True, False),
        ("SPAN_AND_EVENT", True, True),
        ("event_only", False, True),
        ("no_content", False, False),
        ("true", True, False),
        ("false", False, False),
        ("", False, False),
    ],
)
def test_every_capture_value_the_genai_utilities_take(
    pipeline: Pipeline,
    monkeypatch: pytest.MonkeyPatch,
    value: str,
    on_span: bool,
    on_event: bool,
) -> None:
    monkeypatch.setenv("OTEL_SEMCONV_STABILITY_OPT_IN", "gen_ai_latest_experimental")
    monkeypatch.setenv(sc.CAPTURE_MESSAGE_CONTENT_ENV, value)
    record_episode(pipeline.tracer, hand_record(), signals=pipeline.signals)
    chats = sorted(
        (span for span in pipeline.spans() if span.name.startswith("chat")),
        key=lambda span: span.start_time or 0,
    )
    first = chats[0]
    assert (sc.GEN_AI_INPUT_MESSAGES in (first.attributes or {})) is on_span
    episode = pipeline.by_name()["episode math"]
    assert (sc.INPUT_VALUE in (episode.attributes or {})) is on_span
    # Events are log records (the Logs API), not span events.
    assert not [event for event in first.events if event.name == sc.GEN_AI_INFERENCE_DETAILS_EVENT]
    events = pipeline.events(sc.GEN_AI_INFERENCE_DETAILS_EVENT)
    assert len(events) == (3 if on_event else 0)  # one per model call
    if on_event:
        event = min(events, key=lambda record: record.timestamp)
        assert first.context is not None
        assert (event.trace_id, event.span_id) == (first.context.trace_id, first.context.span_id)
        attributes = dict(event.attributes or {})
        # Structured, as the conventions ask of events (spans carry JSON text).
        assert attributes[sc.GEN_AI_OUTPUT_MESSAGES][0]["parts"]
        assert attributes[sc.GEN_AI_TOOL_DEFINITIONS][0]["name"] == "calculator"
        assert attributes[sc.GEN_AI_REQUEST_MODEL] == "policy-8b"


def test_an_unknown_capture_value_captures_nothing_and_says_so(
    pipeline: Pipeline, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv(sc.CAPTURE_MESSAGE_CONTENT_ENV, "spans-please")
    record_episode(pipeline.tracer, hand_record())
    record_episode(pipeline.tracer, {**hand_record(), "id": "episode-2"})
    assert not any(sc.GEN_AI_INPUT_MESSAGES in a for a in chat_attributes(pipeline))
    warnings = [r for r in caplog.records if "spans-please" in r.getMessage()]
    assert len(warnings) == 1
    assert "span_only" in warnings[0].getMessage()


def test_image_parts_become_uri_parts(pipeline: Pipeline) -> None:
    record = hand_record()
    record["traces"][0]["nodes"][0]["message"]["content"] = [
        {"type": "text", "text": "Grade this:"},
        {"type": "image_url", "image_url": {"url": "https://example.com/a.png"}},
    ]
    record_episode(pipeline.tracer, record, capture_content=True)
    judge_turn = chat_attributes(pipeline)[-1]

    assert json.loads(judge_turn[sc.GEN_AI_INPUT_MESSAGES])[0]["parts"] == [
        {"type": "text", "content": "Grade this:"},
        {"type": "uri", "modality": "image", "uri": "https://example.com/a.png"},
    ]


# ---------------------------------------------------------------------------
# OpenTelemetry's limits
# ---------------------------------------------------------------------------


def test_many_sub_rewards_stay_under_the_attribute_count_limit(pipeline: Pipeline) -> None:
    record = hand_record()
    rewards = {
        f"criterion_{index:03d}": {"score": index / 300, "weight": 1.0} for index in range(300)
    }
    record["traces"][1]["rewards"] = rewards
    record_episode(pipeline.tracer, record)
    solver = pipeline.by_name()["invoke_agent solver"]
    attributes = solver.attributes or {}

    assert solver.dropped_attributes == 0
    assert len(attributes) < 128
    written = [key for key in attributes if key.startswith(sc.AGENT_REWARD_PREFIX)]
    assert len(written) == sc.MAX_SUB_REWARD_ATTRIBUTES
    assert attributes[sc.AGENT_REWARD] == pytest.approx(sum(index / 300 for index in range(300)))
    (arrival,) = [item for item in pipeline.arrivals() if isinstance(item, EpisodeArrival)]
    assert arrival.record["traces"][1]["rewards"] == rewards


class NoisyProcessor(SpanProcessor):
    """Adds 200 attributes to every span as it starts, like an over-eager enrichment hook."""

    def on_start(self, span: Span, parent_context: Context | None = None) -> None:
        span.set_attributes({f"enrichment.{index}": index for index in range(200)})

    def on_end(self, span: ReadableSpan) -> None:
        return None


def test_record_survives_attributes_added_by_another_processor() -> None:
    noisy = Pipeline(None, NoisyProcessor())
    try:
        record_episode(noisy.tracer, hand_record())
        episode = noisy.by_name()["episode math"]

        assert episode.dropped_attributes > 0  # the SDK really did evict
        (arrival,) = [item for item in noisy.arrivals() if isinstance(item, EpisodeArrival)]
        assert arrival.record == hand_record()
        assert (episode.attributes or {})[sc.EPISODE_OK] is False
    finally:
        noisy.provider.shutdown()


def test_record_survives_a_count_limit_with_no_room_to_spare(pipeline: Pipeline) -> None:
    """Exactly as many slots as the episode span needs, all taken by others first."""
    record_episode(pipeline.tracer, hand_record())
    ours = dict(pipeline.by_name()["episode math"].attributes or {})
    tight = Pipeline(SpanLimits(max_span_attributes=len(ours)), NoisyProcessor())
    try:
        record_episode(tight.tracer, hand_record())
        episode = tight.by_name()["episode math"]
        (arrival,) = [item for item in tight.arrivals() if isinstance(item, EpisodeArrival)]

        assert arrival.record == hand_record()
        assert dict(episode.attributes or {}) == ours
    finally:
        tight.provider.shutdown()


def test_length_limit_from_the_environment_chunks_the_record(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT", "4096")
    limited = Pipeline()  # the SDK reads the variable when the provider is built
    try:
        record = synthetic_episode(1, target_bytes=200_000)
        record_episode(limited.tracer, record)
        episode = next(span for span in limited.spans() if span.name.startswith("episode"))
        chunks: Any = (episode.attributes or {})[sc.EPISODE_RECORD]

        assert len(chunks) > 40
        assert max(len(chunk) for chunk in chunks) <= 4096
        (arrival,) = [item for item in limited.arrivals() if isinstance(item, EpisodeArrival)]
        assert arrival.record == record
    finally:
        limited.provider.shutdown()


def test_length_limit_in_code_chunks_the_record() -> None:
    limited = Pipeline(SpanLimits(max_span_attribute_length=1000))
    try:
        record = synthetic_episode(2, target_bytes=50_000)
        record_episode(limited.tracer, record)
        (arrival,) = [item for item in limited.arrivals() if isinstance(item, EpisodeArrival)]
        assert arrival.record == record
    finally:
        limited.provider.shutdown()


def test_records_flow_through_a_batch_processor() -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider(resource=run_resource(run_id="batch-run"))
    provider.add_span_processor(BatchSpanProcessor(exporter))
    tracer = provider.get_tracer("tests")
    records = [synthetic_episode(index) for index in range(40)]
    for record in records:
        record_episode(tracer, record)
    provider.force_flush()
    provider.shutdown()

    views = [from_readable_span(span) for span in exporter.get_finished_spans()]
    arrived = {
        item.episode_id: item.record
        for item in map(read_span, views)
        if isinstance(item, EpisodeArrival)
    }
    assert arrived == {record["id"]: record for record in records}
    assert {view.resource[sc.RUN_ID] for view in views} == {"batch-run"}


def test_a_sampled_out_episode_emits_nothing_but_is_still_checked() -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider(sampler=ALWAYS_OFF, resource=run_resource())
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("tests")

    assert record_episode(tracer, hand_record()) == "episode-1"
    assert exporter.get_finished_spans() == ()
    with pytest.raises(RecordError):
        record_episode(tracer, {"id": "no-traces"})
    provider.shutdown()


# ---------------------------------------------------------------------------
# Records that are not records
# ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("offered", "complaint"),
    [
        ({"traces": []}, "non-empty string 'id'"),
        ({"id": 17, "traces": []}, "non-empty string 'id'"),
        ({"id": "e"}, "no 'traces' list"),
        ({"id": "e", "traces": {"0": {}}}, "no 'traces' list"),
        ({"id": "e", "traces": [], "info": {"tags": {"a", "b"}}}, "not JSON-serialisable"),
        (["id", "traces"], "got list"),
    ],
)
def test_something_that_is_not_an_episode_is_refused_before_any_span(
    pipeline: Pipeline, offered: Any, complaint: str
) -> None:
    with pytest.raises(RecordError, match=complaint):
        record_episode(pipeline.tracer, offered)
    assert pipeline.spans() == []


def test_nan_and_unicode_survive_the_trip(pipeline: Pipeline) -> None:
    record = hand_record()
    record["traces"][1]["rewards"]["correct"] = {"score": math.nan, "weight": 1.0}
    record["traces"][1]["metrics"] = {"ratio": math.inf, "floor": -math.inf}
    record["traces"][1]["info"] = {"note": "Zoë 🧮 — ∑ 日本語 \u0301 \u2028 \x00"}
    record_episode(pipeline.tracer, record)

    (arrival,) = [item for item in pipeline.arrivals() if isinstance(item, EpisodeArrival)]
    solver = arrival.record["traces"][1]
    assert math.isnan(solver["rewards"]["correct"]["score"])
    assert solver["metrics"] == {"ratio": math.inf, "floor": -math.inf}
    assert solver["info"] == record["traces"][1]["info"]
    reward: Any = (pipeline.by_name()["invoke_agent solver"].attributes or {})[sc.AGENT_REWARD]
    assert math.isnan(reward)


def test_records_are_encoded_fast_where_no_reader_can_tell(pipeline: Pipeline) -> None:
    plain = hand_record()
    scored_nan = hand_record("episode-2")
    scored_nan["traces"][1]["rewards"]["correct"] = {"score": math.nan, "weight": 1.0}
    info_nan = hand_record("episode-3")
    info_nan["traces"][1]["info"] = {"ratio": math.nan}
    huge = hand_record("episode-4")
    huge["traces"][1]["info"] = {"big": 2**70, 7: "int key"}

    # The summary reads scores: a NaN there keeps its standard-library spelling.
    assert b"NaN" in dumps_record(scored_nan)
    # Elsewhere every reader writes null for it, so the fast encoder may too.
    assert json.loads(dumps_record(info_nan))["traces"][1]["info"] == {"ratio": None}
    # What orjson cannot encode goes the standard library's way, as before.
    assert json.loads(dumps_record(huge))["traces"][1]["info"] == {"big": 2**70, "7": "int key"}
    assert json.loads(dumps_record(plain)) == plain
    # A UUID is the one value the fast encoder writes that the standard library refuses.
    with_uuid = hand_record("episode-5")
    with_uuid["traces"][1]["info"] = {"id": uuid.UUID(int=5)}
    assert json.loads(dumps_record(with_uuid))["traces"][1]["info"] == {"id": str(uuid.UUID(int=5))}
    for record in (plain, scored_nan, huge):
        record_episode(pipeline.tracer, record)
    arrived = {
        item.episode_id: item.record
        for item in pipeline.arrivals()
        if isinstance(item, EpisodeArrival)
    }
    assert arrived["episode-1"] == plain
    assert math.isnan(arrived["episode-2"]["traces"][1]["rewards"]["correct"]["score"])
    assert arrived["episode-4"]["traces"][1]["info"]["big"] == 2**70


@pytest.mark.parametrize(
    "value",
    [datetime.now(timezone.utc), _Point(1, 2), {1, 2}],
    ids=lambda value: type(value).__name__,
)
def test_types_json_has_no_form_for_are_refused(pipeline: Pipeline, value: Any) -> None:
    record = hand_record()
    record["traces"][1]["info"] = {"value": value}

    with pytest.raises(RecordError, match="not JSON-serialisable"):
        record_episode(pipeline.tracer, record)
    assert pipeline.spans() == []


def test_child_spans_can_be_left_out(pipeline: Pipeline) -> None:
    record_episode(pipeline.tracer, hand_record(), child_spans=False)

    assert [span.name for span in pipeline.spans()] == ["episode math"]
    (arrival,) = [item for item in pipeline.arrivals() if isinstance(item, EpisodeArrival)]
    assert arrival.record == hand_record()


# ---------------------------------------------------------------------------
# The run
# ---------------------------------------------------------------------------


def test_run_resource_names_the_run(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OTEL_SERVICE_NAME", raising=False)
    monkeypatch.setenv("OTEL_RESOURCE_ATTRIBUTES", "prime.run.id=from-env,deployment=lab")
    resource = run_resource(
        run_id="run-7",
        kind="train",
        name="sweep",
        model="policy-8b",
        environments=["gsm8k", "primeintellect/math"],
        framework="prime-rl",
        tags=["a", "b"],
        description="lr sweep",
        attach="platform-run-1",
        team_id="team-1",
        extra={"host.name": "trainer-0", sc.RUN_ID: "ignored"},
    )
    attributes = resource.attributes

    assert attributes[sc.RUN_ID] == "run-7"
    assert attributes[sc.RUN_KIND] == "train"
    assert attributes[sc.RUN_NAME] == "sweep"
    assert attributes[sc.RUN_MODEL] == "policy-8b"
    assert attributes[sc.RUN_ENVIRONMENTS] == ("gsm8k", "primeintellect/math")
    assert attributes[sc.RUN_FRAMEWORK] == "prime-rl"
    assert attributes[sc.RUN_TAGS] == ("a", "b")
    assert attributes[sc.RUN_DESCRIPTION] == "lr sweep"
    assert attributes[sc.RUN_ATTACH] == "platform-run-1"
    assert attributes[sc.RUN_TEAM_ID] == "team-1"
    assert attributes["host.name"] == "trainer-0"
    assert attributes["deployment"] == "lab"
    assert attributes[sc.SERVICE_NAME] == sc.DEFAULT_SERVICE_NAME


def test_run_resource_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OTEL_SERVICE_NAME", "my-evals")
    first, second = run_resource(), run_resource()

    assert first.attributes[sc.RUN_ID] != second.attributes[sc.RUN_ID]
    assert len(str(first.attributes[sc.RUN_ID])) == 32
    assert first.attributes[sc.RUN_KIND] == "eval"
    assert first.attributes[sc.SERVICE_NAME] == "my-evals"
    assert sc.RUN_ENVIRONMENTS not in first.attributes
    assert run_resource(service_name="explicit").attributes[sc.SERVICE_NAME] == "explicit"


def test_run_resource_refuses_an_unknown_kind_or_a_bare_string() -> None:
    with pytest.raises(ConfigError, match="'eval' or 'train'"):
        run_resource(kind="evaluation")
    with pytest.raises(ConfigError, match="list of strings"):
        run_resource(environments="gsm8k")


def test_run_start_and_end_spans(pipeline: Pipeline) -> None:
    config = {"model": "policy-8b", "sampling": {"temperature": 0.7}, "note": "Zoë"}
    emit_run_start(pipeline.tracer, config)
    emit_run_end(pipeline.tracer, "failed", "out of memory", episodes_recorded=12)
    start, end = pipeline.arrivals()

    assert start == RunStart(config)
    assert end == RunEnd(status="failed", error="out of memory", episodes_recorded=12)
    end_span = pipeline.by_name()[sc.RUN_END_SPAN]
    assert end_span.status.status_code is StatusCode.ERROR
    assert end_span.status.description == "out of memory"
    # Tracing backends show the run's boundaries with a kind, and its outcome.
    start_span = pipeline.by_name()[sc.RUN_START_SPAN]
    assert (start_span.attributes or {})[sc.OPENINFERENCE_SPAN_KIND] == "CHAIN"
    assert (end_span.attributes or {})[sc.OPENINFERENCE_SPAN_KIND] == "CHAIN"
    assert (end_span.attributes or {})[sc.OUTPUT_VALUE] == "failed, 12 episode(s): out of memory"


def test_a_clean_run_end_is_not_an_error(pipeline: Pipeline) -> None:
    emit_run_end(pipeline.tracer, "completed")
    (span,) = pipeline.spans()

    assert span.status.status_code is StatusCode.UNSET
    assert read_span(from_readable_span(span)) == RunEnd("completed", None, None)


def test_run_end_refuses_an_unknown_status(pipeline: Pipeline) -> None:
    with pytest.raises(ValueError, match="completed, failed, cancelled, crashed"):
        emit_run_end(pipeline.tracer, "done")


def test_run_start_refuses_a_config_that_is_not_json(pipeline: Pipeline) -> None:
    with pytest.raises(ConfigError, match="not JSON-serialisable"):
        emit_run_start(pipeline.tracer, {"path": Path("x")})
    assert pipeline.spans() == []


# ---------------------------------------------------------------------------
# Config normalisation
# ---------------------------------------------------------------------------


def test_a_mapping_is_taken_as_given_and_copied() -> None:
    given = {"lr": 1e-5, "api_key_hint": "nothing is redacted"}
    normalized = normalize_config(given)

    assert normalized == given
    normalized["extra"] = True
    assert "extra" not in given
    assert normalize_config() == {}


CONFIG_TEXT = (
    "# sweep over learning rates — Zoë's run\n"
    'model = "policy-8b"\n'
    "lr = 1e-5  # trailing comment\n"
    "\n[sampling]\ntemperature = 0.7\r\n"
)


@pytest.mark.parametrize(
    ("filename", "expected_format"),
    [
        ("run.toml", "toml"),
        ("run.json", "json"),
        ("run.yaml", "yaml"),
        ("run.YML", "yaml"),
        ("run.cfg", "text"),
        ("Makefile", "text"),
    ],
)
def test_a_config_file_is_kept_byte_for_byte(
    tmp_path: Path, filename: str, expected_format: str
) -> None:
    path = tmp_path / filename
    path.write_bytes(CONFIG_TEXT.encode("utf-8"))

    for normalized in (normalize_config(path), normalize_config(config_file=str(path))):
        assert normalized == {
            "config_source": {
                "format": expected_format,
                "text": CONFIG_TEXT,
                "filename": filename,
            }
        }


def test_a_mapping_and_a_file_combine(tmp_path: Path) -> None:
    path = tmp_path / "run.toml"
    path.write_text("lr = 1\n", encoding="utf-8")
    normalized = normalize_config({"lr": 1}, config_file=path)

    assert normalized["lr"] == 1
    assert normalized["config_source"]["text"] == "lr = 1\n"


def test_config_file_errors_say_what_to_do(tmp_path: Path) -> None:
    too_large = tmp_path / "big.toml"
    too_large.write_bytes(b"#" * (MAX_CONFIG_SOURCE_BYTES + 1))
    at_limit = tmp_path / "limit.toml"
    at_limit.write_bytes(b"#" * MAX_CONFIG_SOURCE_BYTES)
    latin1 = tmp_path / "latin1.toml"
    latin1.write_bytes("name = 'Zoë'".encode("latin-1"))

    with pytest.raises(ConfigError, match="over the 262144-byte limit"):
        normalize_config(too_large)
    assert len(normalize_config(at_limit)["config_source"]["text"]) == MAX_CONFIG_SOURCE_BYTES
    with pytest.raises(ConfigError, match="not UTF-8"):
        normalize_config(latin1)
    with pytest.raises(ConfigError, match="does not exist"):
        normalize_config(tmp_path / "missing.toml")
    with pytest.raises(ConfigError, match="could not be read"):
        normalize_config(tmp_path)
    with pytest.raises(ConfigError, match="pass the file once"):
        normalize_config(at_limit, config_file=at_limit)
    with pytest.raises(ConfigError, match="mapping or a path"):
        normalize_config(42)  # type: ignore[arg-type]
