"""Message content in the shapes tracing backends read, written only when
content capture is on.

The record keeps a rollout's messages as a graph of nodes; a model call
names the node it produced. A model-call span gets its conversation in the
OpenTelemetry GenAI shape (``gen_ai.input.messages``/``gen_ai.output.messages``),
and agent and episode spans the first prompt and the final completion as
OpenInference's ``input.value``/``output.value``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .. import semconv as sc
from .._json import parsed_if_json
from ._fields import EMPTY, Attributes, as_mapping, compact_json, is_int, put_str

__all__ = ["Messages", "call_messages", "content_text", "put_input_output"]

#: A model call's input and output messages, in the conventions' shape
#: (lists of ``{"role", "parts"}``; the output's with ``finish_reason``).
Messages = tuple[list[dict[str, Any]], list[dict[str, Any]]]


def call_messages(
    nodes: list[Any], index: Any, finish_reason: Any, failed: bool
) -> Messages | None:
    """Input = the path from the root to the node's parent; output = the
    node. ``None`` when the call names no node of the graph."""
    if not is_int(index) or not 0 <= index < len(nodes):
        return None
    path: list[Any] = []
    parent = as_mapping(nodes[index]).get("parent")
    while is_int(parent) and 0 <= parent < len(nodes) and len(path) < len(nodes):
        path.append(as_mapping(nodes[parent]).get("message"))
        parent = as_mapping(nodes[parent]).get("parent")
    path.reverse()
    inputs = [_genai_message(as_mapping(message)) for message in path]
    output = _genai_message(as_mapping(as_mapping(nodes[index]).get("message")))
    reason = finish_reason if isinstance(finish_reason, str) else ("error" if failed else "stop")
    output["finish_reason"] = reason
    return inputs, [output]


def _genai_message(message: Mapping[str, Any]) -> dict[str, Any]:
    role = message.get("role")
    parts: list[dict[str, Any]] = []
    reasoning = message.get("reasoning_content")
    if isinstance(reasoning, str) and reasoning:
        parts.append({"type": "reasoning", "content": reasoning})
    if role == "tool":
        response = content_text(message.get("content"))
        parts.append(
            {"type": "tool_call_response", "id": message.get("tool_call_id"), "response": response}
        )
    else:
        parts.extend(_content_parts(message.get("content")))
    for call in message.get("tool_calls") or ():
        tool_call = as_mapping(call)
        part = {"type": "tool_call", "id": tool_call.get("id")}
        put_str(part, "name", tool_call.get("name"))
        # Parsed when the model emitted JSON (what viewers expect).
        part["arguments"] = parsed_if_json(tool_call.get("arguments"))
        parts.append(part)
    return {"role": role if isinstance(role, str) else "user", "parts": parts}


def _content_parts(content: Any) -> list[dict[str, Any]]:
    if isinstance(content, str):
        return [{"type": "text", "content": content}] if content else []
    parts: list[dict[str, Any]] = []
    for part in content if isinstance(content, list) else ():
        item = as_mapping(part)
        if item.get("type") == "text":
            parts.append({"type": "text", "content": item.get("text", "")})
        elif item.get("type") == "image_url":
            url = as_mapping(item.get("image_url")).get("url", "")
            parts.append({"type": "uri", "modality": "image", "uri": url})
        elif isinstance(item.get("type"), str):
            parts.append(dict(item))
    return parts


def content_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        return ""
    texts = [as_mapping(part).get("text") for part in content]
    return "\n".join(text for text in texts if isinstance(text, str))


def put_input_output(
    attributes: Attributes, trace: Mapping[str, Any], record: Mapping[str, Any] = EMPTY
) -> None:
    """``input.value``: the first user message (else the task's prompt);
    ``output.value``: what the last model call produced."""
    nodes = trace.get("nodes")
    nodes = nodes if isinstance(nodes, list) else []
    prompt = next(
        (
            content_text(as_mapping(as_mapping(node).get("message")).get("content"))
            for node in nodes
            if as_mapping(as_mapping(node).get("message")).get("role") == "user"
        ),
        None,
    )
    if prompt is None:
        task = as_mapping(trace.get("task")) or as_mapping(record.get("task"))
        given = as_mapping(task.get("data")).get("prompt")
        prompt = content_text(given) if given is not None else None
    if prompt:
        attributes[sc.INPUT_VALUE] = prompt
        attributes[sc.INPUT_MIME_TYPE] = "text/plain"
    calls = trace.get("calls")
    last = as_mapping(calls[-1]) if isinstance(calls, list) and calls else EMPTY
    index = last.get("node")
    if is_int(index) and 0 <= index < len(nodes):
        message = as_mapping(as_mapping(nodes[index]).get("message"))
        completion = content_text(message.get("content"))
        if not completion and message.get("tool_calls"):
            completion = compact_json(message["tool_calls"])
        if completion:
            attributes[sc.OUTPUT_VALUE] = completion
            attributes[sc.OUTPUT_MIME_TYPE] = "text/plain"
