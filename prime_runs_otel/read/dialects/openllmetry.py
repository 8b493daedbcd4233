"""OpenLLMetry (Traceloop's conventions): what the
``opentelemetry-instrumentation-*`` packages of Traceloop write. Messages are
flattened into indexed attributes under ``gen_ai.prompt`` and
``gen_ai.completion`` (``gen_ai.prompt.0.role``), and workflow spans say
what they are in ``traceloop.span.kind``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ... import semconv as sc
from ..checks import text_or_none
from .messages import (
    Exchange,
    as_assistant,
    content_pieces,
    finish_reason,
    grouped,
    normalize_role,
    tool_call,
    verifiers_message,
)

__all__ = [
    "MESSAGE_PREFIXES",
    "agent_name",
    "exchange",
    "has_messages",
    "is_agent",
    "is_call",
    "read_message",
    "tool_definitions",
]

_KIND = "traceloop.span.kind"
_REQUEST_TYPE = "llm.request.type"
_PROMPT = "gen_ai.prompt"
_COMPLETION = "gen_ai.completion"
MESSAGE_PREFIXES = (_PROMPT + ".", _COMPLETION + ".")


def is_call(attributes: Mapping[str, Any]) -> bool:
    return attributes.get(_REQUEST_TYPE) in ("chat", "completion")


def is_agent(attributes: Mapping[str, Any]) -> bool:
    return attributes.get(_KIND) == "agent"


def agent_name(attributes: Mapping[str, Any]) -> str | None:
    return text_or_none(attributes.get(sc.GEN_AI_AGENT_NAME)) or text_or_none(
        attributes.get("traceloop.entity.name")
    )


def has_messages(attributes: Mapping[str, Any]) -> bool:
    return any(key.startswith(MESSAGE_PREFIXES) for key in attributes)


def read_message(flat: Mapping[str, Any]) -> list[dict[str, Any]]:
    """One message of ``gen_ai.prompt`` or ``gen_ai.completion``, its index
    prefix taken off."""
    role = normalize_role(flat.get("role")) or "user"
    texts, images = content_pieces(flat.get("content"))
    calls = [
        tool_call(call.get("id"), call.get("name"), call.get("arguments"))
        for call in grouped(flat, "tool_calls")
    ]
    if "function_call.name" in flat:
        calls.append(
            tool_call(None, flat.get("function_call.name"), flat.get("function_call.arguments"))
        )
    return [
        verifiers_message(
            role,
            texts,
            images=images,
            tool_calls=calls,
            tool_call_id=flat.get("tool_call_id"),
            name=flat.get("name"),
        )
    ]


def exchange(attributes: Mapping[str, Any]) -> Exchange:
    inputs = [message for flat in grouped(attributes, _PROMPT) for message in read_message(flat)]
    outputs = grouped(attributes, _COMPLETION)
    output = read_message(outputs[0])[0] if outputs else None
    reason = finish_reason(outputs[0].get("finish_reason")) if outputs else None
    reason = reason or finish_reason(attributes.get(sc.GEN_AI_RESPONSE_FINISH_REASONS))
    return Exchange("openllmetry", inputs, as_assistant(output), reason)


def tool_definitions(attributes: Mapping[str, Any]) -> list[Any]:
    """The tools offered, as written."""
    return list(grouped(attributes, "llm.request.functions"))
