"""An episode's agent and model-call spans, in the OpenTelemetry GenAI
conventions (with OpenInference's attributes beside them).

The platform reads only the episode's record; these child spans are there
so that any tracing backend shows the rollout: one agent span per trace,
one model-call span per call, with usage, rewards and errors, and message
content when capture is on.
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
    error_text,
    is_int,
    put_int,
    put_str,
)
from .content_capture import NO_CAPTURE
from .genai_messages import put_input_output, put_messages
from .span_times import Window, epoch_ns

__all__ = ["emit_agent_span", "trace_reward"]


def emit_agent_span(
    tracer: Tracer,
    parent: Context,
    trace: Mapping[str, Any],
    window: Window,
    capture: tuple[bool, bool],
) -> None:
    agent = as_mapping(trace.get("agent"))
    name = agent.get("name") if isinstance(agent.get("name"), str) else None
    attributes: Attributes = {
        sc.GEN_AI_OPERATION_NAME: sc.OPERATION_INVOKE_AGENT,
        sc.OPENINFERENCE_SPAN_KIND: sc.OPENINFERENCE_AGENT,
        sc.AGENT_TRAINABLE: bool(agent.get("trainable", True)),
    }
    put_str(attributes, sc.GEN_AI_AGENT_NAME, name)
    put_str(attributes, sc.OPENINFERENCE_AGENT_NAME, name)
    if capture[0]:
        put_input_output(attributes, trace)
    put_str(attributes, sc.AGENT_TRACE_ID, trace.get("id"))
    put_str(attributes, sc.AGENT_STOP_CONDITION, trace.get("stop_condition"))
    put_int(attributes, sc.GEN_AI_USAGE_INPUT_TOKENS, trace.get("num_input_tokens"))
    put_int(attributes, sc.GEN_AI_USAGE_OUTPUT_TOKENS, trace.get("num_output_tokens"))
    _put_rewards(attributes, as_mapping(trace.get("rewards")))
    span = tracer.start_span(
        sc.agent_span_name(name), context=parent, start_time=window[0], attributes=attributes
    )
    if trace.get("ok") is False:
        errors = trace.get("errors")
        last = as_mapping(errors[-1]) if isinstance(errors, list) and errors else EMPTY
        span.set_status(Status(StatusCode.ERROR, error_text(last) or "trace not ok"))
    calls = trace.get("calls")
    if isinstance(calls, list) and calls:
        context = trace_api.set_span_in_context(span)
        nodes = trace.get("nodes") if capture != NO_CAPTURE else None
        provider = agent.get("provider") or as_mapping(agent.get("config")).get("provider")
        provider = provider if isinstance(provider, str) and provider else sc.DEFAULT_PROVIDER
        for call in calls:
            _emit_call(tracer, context, as_mapping(call), window, nodes, capture, provider)
    span.end(end_time=window[1])


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


def _emit_call(
    tracer: Tracer,
    parent: Context,
    call: Mapping[str, Any],
    window: Window,
    nodes: Any,
    capture: tuple[bool, bool],
    provider: str,
) -> None:
    model = call.get("model") if isinstance(call.get("model"), str) else None
    attributes: Attributes = {
        sc.GEN_AI_OPERATION_NAME: sc.OPERATION_CHAT,
        sc.GEN_AI_PROVIDER_NAME: provider,
        sc.OPENINFERENCE_SPAN_KIND: sc.OPENINFERENCE_LLM,
        sc.LLM_PROVIDER: provider,
    }
    if model:
        attributes[sc.GEN_AI_REQUEST_MODEL] = model
        attributes[sc.GEN_AI_RESPONSE_MODEL] = model
        attributes[sc.LLM_MODEL_NAME] = model
    _put_usage(attributes, as_mapping(call.get("usage")))
    finish_reason = call.get("finish_reason")
    if isinstance(finish_reason, str):
        attributes[sc.GEN_AI_RESPONSE_FINISH_REASONS] = (finish_reason,)
    error = as_mapping(call.get("error"))
    put_str(attributes, sc.ERROR_TYPE, error.get("type"))
    messages: Attributes = {}
    if isinstance(nodes, list):
        put_messages(messages, nodes, call.get("node"), finish_reason, bool(error))
    if messages and capture[0]:
        attributes.update(messages)
        attributes[sc.INPUT_VALUE] = messages[sc.GEN_AI_INPUT_MESSAGES]
        attributes[sc.INPUT_MIME_TYPE] = "application/json"
        attributes[sc.OUTPUT_VALUE] = messages[sc.GEN_AI_OUTPUT_MESSAGES]
        attributes[sc.OUTPUT_MIME_TYPE] = "application/json"
    call_time = as_mapping(call.get("time"))
    start = epoch_ns(call_time.get("start")) or window[0]
    end = max(epoch_ns(call_time.get("end")) or window[1], start)
    span = tracer.start_span(
        sc.chat_span_name(model),
        context=parent,
        kind=trace_api.SpanKind.CLIENT,
        start_time=start,
        attributes=attributes,
    )
    if messages and capture[1]:
        span.add_event(sc.GEN_AI_INFERENCE_DETAILS_EVENT, messages, timestamp=end)
    if error:
        span.set_status(Status(StatusCode.ERROR, error_text(error) or "model call failed"))
    span.end(end_time=end)


def _put_usage(attributes: Attributes, usage: Mapping[str, Any]) -> None:
    """Token counts in the GenAI shape: input tokens include cache reads."""
    prompt, cached = usage.get("prompt_tokens"), usage.get("cached_input_tokens")
    if is_int(prompt):
        attributes[sc.GEN_AI_USAGE_INPUT_TOKENS] = int(prompt) + (
            int(cached) if is_int(cached) else 0
        )
    put_int(attributes, sc.GEN_AI_USAGE_OUTPUT_TOKENS, usage.get("completion_tokens"))
    put_int(attributes, sc.GEN_AI_USAGE_CACHE_READ_INPUT_TOKENS, cached)
    put_int(attributes, sc.GEN_AI_USAGE_REASONING_OUTPUT_TOKENS, usage.get("reasoning_tokens"))
    fed, produced = attributes.get(sc.GEN_AI_USAGE_INPUT_TOKENS), usage.get("completion_tokens")
    if fed is not None:
        attributes[sc.LLM_TOKEN_COUNT_PROMPT] = fed
    if is_int(produced):
        attributes[sc.LLM_TOKEN_COUNT_COMPLETION] = int(produced)
        if fed is not None:
            attributes[sc.LLM_TOKEN_COUNT_TOTAL] = fed + int(produced)
