"""An episode's agent, model-call and tool spans, in the OpenTelemetry GenAI
conventions (with OpenInference's attributes beside them).

The platform reads only the episode's record; these child spans are there
so that any tracing backend shows the rollout: one ``invoke_agent`` span per
trace, one model-call span per call and one ``execute_tool`` span per tool
call with a result, with the GenAI attributes the record can fill
(:mod:`.genai_attributes` reads them), rewards and errors, and message
content when capture is on.

Token usage is on the model-call spans, where it was spent; an agent span
carries its trace's totals only when no call of it reports usage, so a
backend summing usage over a trace counts every token once.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from opentelemetry import trace as trace_api
from opentelemetry.context import Context
from opentelemetry.trace import Status, StatusCode, Tracer

from .. import semconv as sc
from ._fields import (
    EMPTY,
    Attributes,
    as_mapping,
    as_number,
    compact_json,
    error_text,
    put_int,
    put_str,
)
from .content_capture import NO_CAPTURE
from .genai_attributes import (
    call_provider,
    operation_of,
    put_request_params,
    put_server,
    put_usage,
    tool_definitions,
    trace_provider,
)
from .genai_events import GenAIEvents
from .genai_messages import call_messages, put_input_output
from .genai_tools import emit_tool_spans
from .span_times import Window, epoch_ns

__all__ = ["emit_agent_span", "trace_reward"]


def emit_agent_span(
    tracer: Tracer,
    parent: Context,
    trace: Mapping[str, Any],
    window: Window,
    capture: tuple[bool, bool],
    events: GenAIEvents | None = None,
) -> None:
    """The agent span of one trace, with its model-call and tool spans."""
    agent = as_mapping(trace.get("agent"))
    calls = trace.get("calls")
    calls = calls if isinstance(calls, list) else []
    span = tracer.start_span(
        sc.agent_span_name(_text(agent.get("name"))),
        context=parent,
        start_time=window[0],
        attributes=_agent_attributes(trace, agent, calls, capture),
    )
    if trace.get("ok") is False:
        span.set_status(Status(StatusCode.ERROR, error_text(_last_error(trace)) or "trace not ok"))
    if calls or trace.get("nodes"):
        context = trace_api.set_span_in_context(span)
        nodes = trace.get("nodes") if capture != NO_CAPTURE else None
        tools = tool_definitions(trace) if capture != NO_CAPTURE else []
        for call in calls:
            _emit_call(
                tracer,
                context,
                as_mapping(call),
                _Call(trace, window, nodes, tools),
                capture,
                events,
            )
        emit_tool_spans(tracer, context, trace, window, capture[0])
    span.end(end_time=window[1])


def _agent_attributes(
    trace: Mapping[str, Any], agent: Mapping[str, Any], calls: list[Any], capture: tuple[bool, bool]
) -> Attributes:
    config = as_mapping(agent.get("config"))
    name = _text(agent.get("name"))
    attributes: Attributes = {
        sc.GEN_AI_OPERATION_NAME: sc.OPERATION_INVOKE_AGENT,
        sc.OPENINFERENCE_SPAN_KIND: sc.OPENINFERENCE_AGENT,
        sc.AGENT_TRAINABLE: bool(agent.get("trainable", True)),
    }
    put_str(attributes, sc.GEN_AI_PROVIDER_NAME, trace_provider(agent, calls))
    put_str(attributes, sc.GEN_AI_AGENT_NAME, name)
    put_str(attributes, sc.OPENINFERENCE_AGENT_NAME, name)
    put_str(attributes, sc.GEN_AI_CONVERSATION_ID, trace.get("id"))
    put_str(attributes, sc.GEN_AI_REQUEST_MODEL, _agent_model(config, calls))
    put_server(attributes, agent)
    put_request_params(attributes, config.get("sampling"))
    last = as_mapping(calls[-1]) if calls else EMPTY
    if isinstance(last.get("finish_reason"), str):
        attributes[sc.GEN_AI_RESPONSE_FINISH_REASONS] = (last["finish_reason"],)
    if trace.get("ok") is False:
        put_str(attributes, sc.ERROR_TYPE, _last_error(trace).get("type"))
    if not any(as_mapping(call).get("usage") for call in calls):
        # No call reports usage: the trace's totals are the only count there is.
        put_int(attributes, sc.GEN_AI_USAGE_INPUT_TOKENS, trace.get("num_input_tokens"))
        put_int(attributes, sc.GEN_AI_USAGE_OUTPUT_TOKENS, trace.get("num_output_tokens"))
    if capture[0]:
        put_input_output(attributes, trace)
        tools = tool_definitions(trace)
        if tools:
            attributes[sc.GEN_AI_TOOL_DEFINITIONS] = compact_json(tools)
    put_str(attributes, sc.AGENT_TRACE_ID, trace.get("id"))
    put_str(attributes, sc.AGENT_STOP_CONDITION, trace.get("stop_condition"))
    _put_rewards(attributes, as_mapping(trace.get("rewards")))
    return attributes


def _agent_model(config: Mapping[str, Any], calls: list[Any]) -> str | None:
    """The agent config's model, else the one model all its calls requested."""
    model = _text(config.get("model"))
    if model is not None:
        return model
    models = {_text(as_mapping(call).get("model")) for call in calls}
    return models.pop() if len(models) == 1 else None


def _last_error(trace: Mapping[str, Any]) -> Mapping[str, Any]:
    errors = trace.get("errors")
    return as_mapping(errors[-1]) if isinstance(errors, list) and errors else EMPTY


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None


def _put_rewards(attributes: Attributes, rewards: Mapping[str, Any]) -> None:
    total: float | None = None
    written = 0
    for name, reward in rewards.items():
        score = as_number(as_mapping(reward).get("score"))
        if score is None:
            continue
        weight = as_number(as_mapping(reward).get("weight"))
        total = (total or 0.0) + score * (1.0 if weight is None else weight)
        if written < sc.MAX_SUB_REWARD_ATTRIBUTES:
            attributes[sc.AGENT_REWARD_PREFIX + str(name)] = score
            written += 1
    if total is not None:
        attributes[sc.AGENT_REWARD] = total


def trace_reward(trace: Mapping[str, Any]) -> float | None:
    """Sum of score x weight; None when nothing was scored (not the same as 0)."""
    total: float | None = None
    for reward in as_mapping(trace.get("rewards")).values():
        score = as_number(as_mapping(reward).get("score"))
        if score is not None:
            weight = as_number(as_mapping(reward).get("weight"))
            total = (total or 0.0) + score * (1.0 if weight is None else weight)
    return total


class _Call:
    """What every model call of one trace shares."""

    __slots__ = ("agent", "nodes", "tools", "trace", "window")

    def __init__(
        self, trace: Mapping[str, Any], window: Window, nodes: Any, tools: list[dict[str, Any]]
    ) -> None:
        self.trace = trace
        self.agent = as_mapping(trace.get("agent"))
        self.window = window
        self.nodes = nodes
        self.tools = tools


def _emit_call(
    tracer: Tracer,
    parent: Context,
    call: Mapping[str, Any],
    shared: _Call,
    capture: tuple[bool, bool],
    events: GenAIEvents | None,
) -> None:
    model = _text(call.get("model"))
    operation = operation_of(call)
    attributes: Attributes = {
        sc.GEN_AI_OPERATION_NAME: operation,
        sc.OPENINFERENCE_SPAN_KIND: sc.OPENINFERENCE_LLM,
    }
    provider = call_provider(shared.agent, call)
    put_str(attributes, sc.GEN_AI_PROVIDER_NAME, provider)
    put_str(attributes, sc.LLM_PROVIDER, provider)
    put_str(attributes, sc.GEN_AI_REQUEST_MODEL, model)
    put_str(attributes, sc.LLM_MODEL_NAME, model)
    put_str(attributes, sc.GEN_AI_CONVERSATION_ID, shared.trace.get("id"))
    put_server(attributes, shared.agent)
    put_request_params(attributes, call.get("sampling"))
    put_usage(attributes, as_mapping(call.get("usage")))
    _put_openinference_usage(attributes)
    finish_reason = call.get("finish_reason")
    if isinstance(finish_reason, str):
        attributes[sc.GEN_AI_RESPONSE_FINISH_REASONS] = (finish_reason,)
    error = as_mapping(call.get("error"))
    put_str(attributes, sc.ERROR_TYPE, error.get("type"))
    messages = None
    if isinstance(shared.nodes, list):
        messages = call_messages(shared.nodes, call.get("node"), finish_reason, bool(error))
    if messages is not None and capture[0]:
        _put_content(attributes, messages, shared.tools)
    call_time = as_mapping(call.get("time"))
    start = epoch_ns(call_time.get("start")) or shared.window[0]
    end = max(epoch_ns(call_time.get("end")) or shared.window[1], start)
    span = tracer.start_span(
        f"{operation} {model}" if model else operation,
        context=parent,
        kind=trace_api.SpanKind.CLIENT,
        start_time=start,
        attributes=attributes,
    )
    if messages is not None and capture[1] and events is not None:
        context = trace_api.set_span_in_context(span)
        events.inference_details(context, attributes, messages, shared.tools, end)
    if error:
        span.set_status(Status(StatusCode.ERROR, error_text(error) or "model call failed"))
    span.end(end_time=end)


def _put_content(
    attributes: Attributes,
    messages: tuple[list[dict[str, Any]], list[dict[str, Any]]],
    tools: list[dict[str, Any]],
) -> None:
    """The call's messages (and the tools offered) on its span, as JSON
    text, in the GenAI shape and again as OpenInference reads them."""
    inputs, outputs = compact_json(messages[0]), compact_json(messages[1])
    attributes[sc.GEN_AI_INPUT_MESSAGES] = inputs
    attributes[sc.GEN_AI_OUTPUT_MESSAGES] = outputs
    if tools:
        attributes[sc.GEN_AI_TOOL_DEFINITIONS] = compact_json(tools)
    attributes[sc.INPUT_VALUE] = inputs
    attributes[sc.INPUT_MIME_TYPE] = "application/json"
    attributes[sc.OUTPUT_VALUE] = outputs
    attributes[sc.OUTPUT_MIME_TYPE] = "application/json"


def _put_openinference_usage(attributes: Attributes) -> None:
    """The call's usage as OpenInference counts it (prompt includes cache reads)."""
    fed = attributes.get(sc.GEN_AI_USAGE_INPUT_TOKENS)
    produced = attributes.get(sc.GEN_AI_USAGE_OUTPUT_TOKENS)
    if fed is not None:
        attributes[sc.LLM_TOKEN_COUNT_PROMPT] = fed
    if produced is not None:
        attributes[sc.LLM_TOKEN_COUNT_COMPLETION] = produced
        if fed is not None:
            attributes[sc.LLM_TOKEN_COUNT_TOTAL] = fed + produced
