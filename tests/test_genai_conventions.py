"""Episodes as the OpenTelemetry GenAI conventions describe them: agent,
model-call and tool spans with every attribute the record can fill (and none
it cannot), message values valid under the conventions' JSON schemas,
usage counted once, rewards as ``gen_ai.evaluation.result`` log events.

Every test drives a real SDK pipeline (TracerProvider, LoggerProvider, the
SDK's in-memory exporters) and reads back what it exported. The schemas are
the conventions' own, vendored in ``tests/genai_schemas`` (see its README).
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from opentelemetry.sdk._logs import LoggerProvider
from opentelemetry.sdk._logs.export import InMemoryLogRecordExporter, SimpleLogRecordProcessor
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from prime_runs_otel import semconv as sc
from prime_runs_otel.produce.episode import record_episode
from prime_runs_otel.produce.resource import run_resource
from prime_runs_otel.produce.signals import Signals
from prime_runs_otel.produce.synthetic import synthetic_episodes

SCHEMAS = Path(__file__).resolve().parent / "genai_schemas"


def validator(name: str) -> jsonschema.protocols.Validator:
    schema = json.loads((SCHEMAS / f"gen-ai-{name}.json").read_text(encoding="utf-8"))
    cls = jsonschema.validators.validator_for(schema)
    cls.check_schema(schema)
    return cls(schema)


VALIDATORS = {
    sc.GEN_AI_INPUT_MESSAGES: validator("input-messages"),
    sc.GEN_AI_OUTPUT_MESSAGES: validator("output-messages"),
    sc.GEN_AI_TOOL_DEFINITIONS: validator("tool-definitions"),
}


class Pipeline:
    def __init__(self) -> None:
        resource = run_resource(run_id="conventions", environments=["gsm8k-demo"])
        self.spans_out = InMemorySpanExporter()
        self.provider = TracerProvider(resource=resource)
        self.provider.add_span_processor(SimpleSpanProcessor(self.spans_out))
        self.tracer = self.provider.get_tracer("tests")
        self.logs = InMemoryLogRecordExporter()
        self.logger_provider = LoggerProvider(resource=resource)
        self.logger_provider.add_log_record_processor(SimpleLogRecordProcessor(self.logs))
        self.signals = Signals.of(logger_provider=self.logger_provider)

    def spans(self, operation: str | None = None) -> list[ReadableSpan]:
        spans = list(self.spans_out.get_finished_spans())
        if operation is None:
            return spans
        return [s for s in spans if (s.attributes or {}).get(sc.GEN_AI_OPERATION_NAME) == operation]

    def events(self, name: str) -> list[Any]:
        records = [item.log_record for item in self.logs.get_finished_logs()]
        return [record for record in records if record.event_name == name]


@pytest.fixture
def pipeline() -> Iterator[Pipeline]:
    built = Pipeline()
    yield built
    built.provider.shutdown()
    built.logger_provider.shutdown()


def episodes(count: int = 24) -> list[dict[str, Any]]:
    """Synthetic episodes as verifiers writes them: tools, a judge, failures."""
    return list(synthetic_episodes(count, seed=11))


def test_message_values_are_valid_under_the_conventions_schemas(
    pipeline: Pipeline, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(sc.CAPTURE_MESSAGE_CONTENT_ENV, "span_and_event")
    for record in episodes():
        record_episode(pipeline.tracer, record, signals=pipeline.signals)

    checked: dict[str, int] = defaultdict(int)
    for span in pipeline.spans():
        for key, check in VALIDATORS.items():
            text = (span.attributes or {}).get(key)
            if text is not None:
                check.validate(json.loads(str(text)))  # JSON text on spans
                checked[key] += 1
    for event in pipeline.events(sc.GEN_AI_INFERENCE_DETAILS_EVENT):
        for key, check in VALIDATORS.items():
            value = (event.attributes or {}).get(key)
            if value is not None:
                check.validate(_plain(value))  # structured on events
                checked[f"event {key}"] += 1
    calls = sum(len(trace["calls"]) for record in episodes() for trace in record["traces"])
    failed_calls = sum(
        "node" not in call for r in episodes() for t in r["traces"] for call in t["calls"]
    )
    answered = calls - failed_calls
    assert checked[sc.GEN_AI_INPUT_MESSAGES] == answered
    assert checked[sc.GEN_AI_OUTPUT_MESSAGES] == answered
    assert checked[f"event {sc.GEN_AI_OUTPUT_MESSAGES}"] == answered
    assert checked[sc.GEN_AI_TOOL_DEFINITIONS] > 0  # some solvers were offered tools


def _plain(value: Any) -> Any:
    """An attribute value as JSON would hold it (the SDK keeps sequences as tuples)."""
    if isinstance(value, (list, tuple)):
        return [_plain(item) for item in value]
    if isinstance(value, dict) or hasattr(value, "items"):
        return {key: _plain(item) for key, item in value.items()}
    return value


def test_tool_calls_with_results_become_execute_tool_spans(
    pipeline: Pipeline, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(sc.CAPTURE_MESSAGE_CONTENT_ENV, "span_only")
    records = episodes()
    for record in records:
        record_episode(pipeline.tracer, record)

    answered = {
        node["message"]["tool_call_id"]: node
        for record in records
        for trace in record["traces"]
        for node in trace["nodes"]
        if node["message"].get("role") == "tool"
    }
    tools = pipeline.spans(sc.OPERATION_EXECUTE_TOOL)
    assert answered and len(tools) == len(answered)
    agents = {s.context.span_id: s for s in pipeline.spans(sc.OPERATION_INVOKE_AGENT) if s.context}
    for span in tools:
        attributes = dict(span.attributes or {})
        assert span.name == "execute_tool calculator"
        assert span.parent is not None and span.parent.span_id in agents
        assert attributes[sc.GEN_AI_TOOL_NAME] == "calculator"
        assert attributes[sc.GEN_AI_TOOL_TYPE] == "function"
        assert attributes[sc.GEN_AI_TOOL_DESCRIPTION].startswith("Evaluate an arithmetic")
        result = answered[attributes[sc.GEN_AI_TOOL_CALL_ID]]
        assert attributes[sc.GEN_AI_TOOL_CALL_RESULT] == result["message"]["content"]
        assert json.loads(attributes[sc.GEN_AI_TOOL_CALL_ARGUMENTS])["expression"]
        assert span.start_time is not None and span.end_time is not None
        assert span.start_time <= span.end_time


def test_tool_arguments_and_results_are_content(pipeline: Pipeline) -> None:
    for record in episodes():
        record_episode(pipeline.tracer, record, capture_content=False)
    tools = pipeline.spans(sc.OPERATION_EXECUTE_TOOL)
    assert tools
    for span in tools:
        attributes = span.attributes or {}
        assert sc.GEN_AI_TOOL_CALL_ARGUMENTS not in attributes
        assert sc.GEN_AI_TOOL_CALL_RESULT not in attributes
        assert attributes[sc.GEN_AI_TOOL_CALL_ID]


def test_usage_is_counted_once_per_trace(pipeline: Pipeline) -> None:
    """A backend that sums gen_ai.usage over an episode's trace gets what the
    model calls reported, not two or three times as much."""
    records = episodes()
    for record in records:
        record_episode(pipeline.tracer, record)

    by_trace: dict[int, list[int]] = defaultdict(lambda: [0, 0])
    episode_of: dict[int, str] = {}
    for span in pipeline.spans():
        attributes = span.attributes or {}
        assert span.context is not None
        sums = by_trace[span.context.trace_id]
        sums[0] += int(attributes.get(sc.GEN_AI_USAGE_INPUT_TOKENS, 0))
        sums[1] += int(attributes.get(sc.GEN_AI_USAGE_OUTPUT_TOKENS, 0))
        if sc.EPISODE_ID in attributes:
            episode_of[span.context.trace_id] = str(attributes[sc.EPISODE_ID])
            assert sc.GEN_AI_USAGE_INPUT_TOKENS not in attributes
            assert attributes[sc.EPISODE_INPUT_TOKENS] >= 0
    reported = {}
    for record in records:
        usages = [c.get("usage") or {} for t in record["traces"] for c in t["calls"]]
        reported[record["id"]] = [
            sum(u.get("prompt_tokens", 0) + u.get("cached_input_tokens", 0) for u in usages),
            sum(u.get("completion_tokens", 0) for u in usages),
        ]
    assert {episode_of[trace]: sums for trace, sums in by_trace.items()} == reported


def test_nothing_the_record_does_not_hold_is_set(pipeline: Pipeline) -> None:
    """No response model copied from the request, no provider guessed."""
    record = episodes(1)[0]
    for trace in record["traces"]:
        for call in trace["calls"]:
            call.pop("endpoint", None)
    record_episode(pipeline.tracer, record)

    for span in pipeline.spans():
        attributes = span.attributes or {}
        assert sc.GEN_AI_RESPONSE_MODEL not in attributes
        assert sc.GEN_AI_PROVIDER_NAME not in attributes
        assert sc.LLM_PROVIDER not in attributes
    chats = pipeline.spans(sc.OPERATION_CHAT)
    assert chats and all((s.attributes or {})[sc.GEN_AI_REQUEST_MODEL] for s in chats)


def test_an_agent_config_naming_its_provider_wins(pipeline: Pipeline) -> None:
    record = episodes(1)[0]
    record["traces"][0]["agent"]["config"]["provider"] = "anthropic"
    record_episode(pipeline.tracer, record)
    solver = next(
        s for s in pipeline.spans(sc.OPERATION_INVOKE_AGENT) if s.name == "invoke_agent solver"
    )
    assert (solver.attributes or {})[sc.GEN_AI_PROVIDER_NAME] == "anthropic"


def test_agent_and_model_call_spans_carry_the_request_the_record_holds(
    pipeline: Pipeline,
) -> None:
    record = episodes(1)[0]
    record_episode(pipeline.tracer, record)

    solver = next(s for s in pipeline.spans(sc.OPERATION_INVOKE_AGENT) if "solver" in s.name)
    attributes = dict(solver.attributes or {})
    trace = record["traces"][0]
    assert attributes[sc.GEN_AI_PROVIDER_NAME] == "openai"  # calls went to /chat/completions
    assert attributes[sc.GEN_AI_CONVERSATION_ID] == trace["id"]
    assert attributes[sc.GEN_AI_REQUEST_MODEL] == trace["agent"]["config"]["model"]
    assert attributes[sc.GEN_AI_REQUEST_TEMPERATURE] == 0.7
    assert attributes[sc.GEN_AI_REQUEST_MAX_TOKENS] == 2048
    for chat in pipeline.spans(sc.OPERATION_CHAT):
        chat_attributes = dict(chat.attributes or {})
        assert chat_attributes[sc.GEN_AI_PROVIDER_NAME] == "openai"
        assert chat_attributes[sc.GEN_AI_CONVERSATION_ID] in {t["id"] for t in record["traces"]}
        assert chat_attributes[sc.GEN_AI_REQUEST_TEMPERATURE] == 0.7


def test_rewards_become_evaluation_events_of_the_episode_span(pipeline: Pipeline) -> None:
    records = episodes()
    for record in records:
        record_episode(pipeline.tracer, record, child_spans=False, signals=pipeline.signals)

    episode_spans = {
        (s.attributes or {})[sc.EPISODE_ID]: s for s in pipeline.spans() if s.context is not None
    }
    expected = {
        (record["id"], trace["id"], name, reward["score"])
        for record in records
        for trace in record["traces"]
        for name, reward in trace["rewards"].items()
        if reward is not None
    }
    seen = set()
    for event in pipeline.events(sc.GEN_AI_EVALUATION_EVENT):
        attributes = dict(event.attributes or {})
        owner = next(
            episode_id
            for episode_id, span in episode_spans.items()
            if span.context is not None
            and (span.context.trace_id, span.context.span_id) == (event.trace_id, event.span_id)
        )
        seen.add(
            (
                owner,
                attributes[sc.GEN_AI_CONVERSATION_ID],
                attributes[sc.GEN_AI_EVALUATION_NAME],
                attributes[sc.GEN_AI_EVALUATION_SCORE],
            )
        )
    assert expected and seen == expected


def test_without_a_logger_provider_there_are_no_events(pipeline: Pipeline) -> None:
    for record in episodes(4):
        record_episode(pipeline.tracer, record)
    assert not pipeline.logs.get_finished_logs()
