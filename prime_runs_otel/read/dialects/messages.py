"""The shapes every family's reader builds: messages as verifiers records
them, tool calls and tool definitions, and :class:`Exchange`, one model call.

The families spell a conversation three ways; each reader turns its own
spelling into these, so the record builder knows one shape only. OpenAI's
message shape is read here too: the GenAI conventions fall back to it, and
OpenInference and OpenLLMetry carry OpenAI-shaped content.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..._json import parsed_if_json as _loads

__all__ = [
    "Exchange",
    "as_assistant",
    "as_mapping",
    "content_pieces",
    "finish_reason",
    "grouped",
    "normalize_role",
    "openai_message",
    "tool_call",
    "tool_definition",
    "verifiers_message",
]

_EMPTY: Mapping[str, Any] = {}

_FINISH_REASONS = {
    "stop": "stop",
    "end_turn": "stop",
    "stop_sequence": "stop",
    "eos": "stop",
    "complete": "stop",
    "length": "length",
    "max_tokens": "length",
    "max_output_tokens": "length",
    "model_length": "length",
    "tool_calls": "tool_calls",
    "tool_call": "tool_calls",
    "tool_use": "tool_calls",
    "function_call": "tool_calls",
}
_ROLES = {
    "system": "system",
    "developer": "system",
    "user": "user",
    "human": "user",
    "assistant": "assistant",
    "ai": "assistant",
    "model": "assistant",
    "tool": "tool",
    "function": "tool",
    "ipython": "tool",
}


@dataclass
class Exchange:
    """One model call as read off its span, whatever the convention.

    ``tools`` are the definitions the call offered, from whichever family
    wrote them (:func:`~prime_runs_otel.read.dialects.calls.exchange` adds
    them after the family's reader)."""

    source: str
    inputs: list[dict[str, Any]] | None
    output: dict[str, Any] | None
    finish_reason: str | None
    tools: list[dict[str, Any]] = field(default_factory=list)


def normalize_role(role: Any) -> str | None:
    return _ROLES.get(str(role).lower()) if isinstance(role, str) else None


def finish_reason(value: Any) -> str | None:
    if isinstance(value, (list, tuple)) and value:
        value = value[0]
    return _FINISH_REASONS.get(value.lower()) if isinstance(value, str) else None


def _arguments_text(arguments: Any) -> str:
    """Tool-call arguments as verifiers keeps them: the text the model emitted."""
    if isinstance(arguments, str):
        return arguments
    if arguments is None:
        return ""
    return json.dumps(arguments, ensure_ascii=False)


def tool_call(call_id: Any, name: Any, arguments: Any) -> dict[str, Any]:
    return {
        "id": str(call_id) if call_id is not None else "",
        "type": "function",
        "name": str(name) if name is not None else "",
        "arguments": _arguments_text(arguments),
    }


def verifiers_message(
    role: str,
    texts: list[str],
    *,
    images: Sequence[str] = (),
    reasoning: str | None = None,
    tool_calls: Sequence[dict[str, Any]] = (),
    tool_call_id: Any = None,
    name: Any = None,
) -> dict[str, Any]:
    """One message as verifiers records it (``None`` fields left out)."""
    if role == "assistant":
        message: dict[str, Any] = {"role": "assistant"}
        if texts:
            message["content"] = "\n".join(texts)
        if reasoning:
            message["reasoning_content"] = reasoning
        if tool_calls:
            message["tool_calls"] = list(tool_calls)
        return message
    if role == "tool":
        message = {
            "role": "tool",
            "tool_call_id": str(tool_call_id) if tool_call_id is not None else "",
            "content": "\n".join(texts),
        }
        if isinstance(name, str) and name:
            message["name"] = name
        return message
    content: Any
    if images:
        content = [{"type": "text", "text": text} for text in texts]
        content += [{"type": "image_url", "image_url": {"url": url}} for url in images]
    else:
        content = "\n".join(texts)
    return {"role": role, "content": content}


def content_pieces(content: Any) -> tuple[list[str], list[str]]:
    """``(texts, image urls)`` of OpenAI-shaped content: a string or a list of parts."""
    content = _loads(content) if isinstance(content, str) and content[:1] == "[" else content
    if isinstance(content, str):
        return ([content] if content else []), []
    texts: list[str] = []
    images: list[str] = []
    for part in content if isinstance(content, list) else ():
        if isinstance(part, str):
            texts.append(part)
            continue
        item = as_mapping(part)
        kind = item.get("type")
        if kind in ("text", "input_text", "output_text") and isinstance(item.get("text"), str):
            texts.append(item["text"])
        elif kind == "image_url":
            url = as_mapping(item.get("image_url")).get("url")
            if isinstance(url, str):
                images.append(url)
    return texts, images


def openai_message(raw: Mapping[str, Any]) -> list[dict[str, Any]]:
    """An OpenAI-shaped message (``{role, content, tool_calls, tool_call_id}``)."""
    role = normalize_role(raw.get("role")) or "user"
    texts, images = content_pieces(raw.get("content"))
    calls = []
    for call in raw.get("tool_calls") or ():
        item = as_mapping(call)
        function = as_mapping(item.get("function"))
        calls.append(
            tool_call(
                item.get("id"),
                function.get("name", item.get("name")),
                function.get("arguments", item.get("arguments")),
            )
        )
    reasoning = raw.get("reasoning_content")
    return [
        verifiers_message(
            role,
            texts,
            images=images,
            reasoning=reasoning if isinstance(reasoning, str) else None,
            tool_calls=calls,
            tool_call_id=raw.get("tool_call_id"),
            name=raw.get("name"),
        )
    ]


def as_assistant(message: dict[str, Any] | None) -> dict[str, Any] | None:
    """What a model call produced is the assistant's turn, whatever role the
    instrumentation wrote down for it."""
    if message is None or message.get("role") == "assistant":
        return message
    texts, _ = content_pieces(message.get("content"))
    return verifiers_message("assistant", texts)


def grouped(attributes: Mapping[str, Any], prefix: str) -> list[dict[str, Any]]:
    """Flattened list attributes (``{prefix}.{n}.{rest}``) as one mapping per ``n``,
    in index order: how OpenInference and OpenLLMetry spell arrays of objects."""
    head = prefix + "."
    groups: dict[int, dict[str, Any]] = {}
    for key, value in attributes.items():
        if not key.startswith(head):
            continue
        index, _, rest = key[len(head) :].partition(".")
        if index.isdigit() and rest:
            groups.setdefault(int(index), {})[rest] = value
    return [groups[index] for index in sorted(groups)]


def tool_definition(raw: Any) -> dict[str, Any] | None:
    """One tool definition as verifiers records it, from OpenAI's shape (with or
    without its ``function`` wrapper, as an object or its JSON); ``None``
    without a name."""
    item = as_mapping(_loads(raw))
    function = as_mapping(item.get("function")) or item
    name = function.get("name")
    if not isinstance(name, str) or not name:
        return None
    tool: dict[str, Any] = {"type": "function", "name": name}
    description = function.get("description")
    tool["description"] = description if isinstance(description, str) else ""
    parameters = _loads(function.get("parameters"))
    tool["parameters"] = dict(parameters) if isinstance(parameters, Mapping) else {}
    if isinstance(function.get("strict"), bool):
        tool["strict"] = function["strict"]
    return tool


def as_mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else _EMPTY
