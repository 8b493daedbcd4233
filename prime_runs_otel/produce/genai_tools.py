"""An agent's tool executions as ``execute_tool`` spans, from its message graph.

A record holds each tool call a model made (``tool_calls`` on an assistant
message) and the result it got back (a ``tool`` message naming the call's
id). Each call that has a result becomes one span under the agent span,
beside the model calls, from the end of the model call that asked for it
(else its message's time) to the result's message time. A call without a
result was never run as far as the record knows, and gets no span.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from opentelemetry.context import Context
from opentelemetry.trace import Tracer

from .. import semconv as sc
from ._fields import Attributes, as_mapping, is_int, put_str
from .genai_attributes import put_tool_description
from .genai_messages import content_text
from .span_times import Window, epoch_ns

__all__ = ["emit_tool_spans", "tool_span_name"]


def tool_span_name(tool: str) -> str:
    """``execute_tool {name}``, the GenAI conventions' tool span name."""
    return f"{sc.OPERATION_EXECUTE_TOOL} {tool}"


def emit_tool_spans(
    tracer: Tracer,
    parent: Context,
    trace: Mapping[str, Any],
    window: Window,
    content: bool,
) -> None:
    """One span per tool call of ``trace`` that has a result; with
    ``content`` (capture on spans) its arguments and result too."""
    nodes = trace.get("nodes")
    if not isinstance(nodes, list):
        return
    results = _results_by_call_id(nodes)
    if not results:
        return
    ends = _model_call_ends(trace.get("calls"))
    for index, item in enumerate(nodes):
        node = as_mapping(item)
        requests = as_mapping(node.get("message")).get("tool_calls")
        if not isinstance(requests, list):
            continue
        asked = ends.get(index) or epoch_ns(node.get("timestamp")) or window[0]
        for request in requests:
            tool_call = as_mapping(request)
            result = results.get(tool_call.get("id"))
            name = tool_call.get("name")
            if result is None or not isinstance(name, str) or not name:
                continue
            answered = max(epoch_ns(result.get("timestamp")) or asked, asked)
            attributes = _tool_attributes(trace, tool_call, name, result, content)
            span = tracer.start_span(
                tool_span_name(name), context=parent, start_time=asked, attributes=attributes
            )
            span.end(end_time=answered)


def _tool_attributes(
    trace: Mapping[str, Any],
    tool_call: Mapping[str, Any],
    name: str,
    result: Mapping[str, Any],
    content: bool,
) -> Attributes:
    attributes: Attributes = {
        sc.GEN_AI_OPERATION_NAME: sc.OPERATION_EXECUTE_TOOL,
        sc.GEN_AI_TOOL_NAME: name,
        sc.OPENINFERENCE_SPAN_KIND: sc.OPENINFERENCE_TOOL,
    }
    put_str(attributes, sc.GEN_AI_TOOL_CALL_ID, tool_call.get("id"))
    put_str(attributes, sc.GEN_AI_TOOL_TYPE, tool_call.get("type"))
    put_tool_description(attributes, trace, name)
    if content:
        arguments = tool_call.get("arguments")
        if isinstance(arguments, str):
            attributes[sc.GEN_AI_TOOL_CALL_ARGUMENTS] = arguments
        attributes[sc.GEN_AI_TOOL_CALL_RESULT] = content_text(
            as_mapping(result.get("message")).get("content")
        )
    return attributes


def _results_by_call_id(nodes: list[Any]) -> dict[Any, Mapping[str, Any]]:
    """Tool-result nodes by the id of the call they answer."""
    results: dict[Any, Mapping[str, Any]] = {}
    for item in nodes:
        node = as_mapping(item)
        message = as_mapping(node.get("message"))
        call_id = message.get("tool_call_id")
        if message.get("role") == "tool" and isinstance(call_id, str) and call_id:
            results.setdefault(call_id, node)
    return results


def _model_call_ends(calls: Any) -> dict[int, int]:
    """When each model call that produced a node ended, by node index."""
    ends: dict[int, int] = {}
    for item in calls if isinstance(calls, list) else ():
        call = as_mapping(item)
        index, end = call.get("node"), epoch_ns(as_mapping(call.get("time")).get("end"))
        if is_int(index) and end is not None:
            ends[int(index)] = end
    return ends
