"""OpenInference (Arize Phoenix's conventions, ``llm.*``): what the
``openinference-instrumentation-*`` packages write. Arrays of objects are
flattened into indexed attributes (``llm.input_messages.0.message.role``),
and a span says what it is in ``openinference.span.kind``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ... import semconv as sc
from ..._json import parsed_if_json as _loads
from ..checks import text_or_none
from .messages import (
    Exchange,
    as_assistant,
    as_mapping,
    content_pieces,
    finish_reason,
    grouped,
    normalize_role,
    tool_call,
    verifiers_message,
)

__all__ = [
    "CACHE_READ_TOKENS",
    "COMPLETION_TOKENS",
    "COST",
    "KIND",
    "MESSAGE_PREFIXES",
    "MODEL_NAME",
    "PROMPT_TOKENS",
    "REASONING_TOKENS",
    "agent_name",
    "exchange",
    "has_messages",
    "is_agent",
    "is_call",
    "read_message",
    "requested_model",
    "tool_definitions",
]

KIND = "openinference.span.kind"
_INVOCATION_PARAMETERS = "llm.invocation_parameters"
#: The model that answered (a provider may resolve an alias to a dated snapshot).
MODEL_NAME = "llm.model_name"
PROMPT_TOKENS = "llm.token_count.prompt"
COMPLETION_TOKENS = "llm.token_count.completion"
CACHE_READ_TOKENS = "llm.token_count.prompt_details.cache_read"
REASONING_TOKENS = "llm.token_count.completion_details.reasoning"
COST = "llm.cost.total"
MESSAGE_PREFIXES = ("llm.input_messages.", "llm.output_messages.")


def is_call(attributes: Mapping[str, Any]) -> bool:
    return attributes.get(KIND) == "LLM"


def is_agent(attributes: Mapping[str, Any]) -> bool:
    return attributes.get(KIND) == "AGENT"


def agent_name(attributes: Mapping[str, Any]) -> str | None:
    return text_or_none(attributes.get("agent.name"))


def has_messages(attributes: Mapping[str, Any]) -> bool:
    return any(key.startswith(MESSAGE_PREFIXES) for key in attributes)


def read_message(flat: Mapping[str, Any]) -> list[dict[str, Any]]:
    """One message of ``llm.input_messages`` or ``llm.output_messages``, its
    index prefix taken off."""
    role = normalize_role(flat.get("message.role")) or "user"
    texts, images = content_pieces(flat.get("message.content"))
    for part in grouped(flat, "message.contents"):
        kind = part.get("message_content.type")
        if kind == "text" and isinstance(part.get("message_content.text"), str):
            texts.append(part["message_content.text"])
        elif kind == "image" and isinstance(part.get("message_content.image.image.url"), str):
            images.append(part["message_content.image.image.url"])
    calls = [
        tool_call(
            call.get("tool_call.id"),
            call.get("tool_call.function.name"),
            call.get("tool_call.function.arguments"),
        )
        for call in grouped(flat, "message.tool_calls")
    ]
    return [
        verifiers_message(
            role,
            texts,
            images=images,
            tool_calls=calls,
            tool_call_id=flat.get("message.tool_call_id"),
            name=flat.get("message.name"),
        )
    ]


def exchange(attributes: Mapping[str, Any]) -> Exchange:
    inputs = [
        message
        for flat in grouped(attributes, "llm.input_messages")
        for message in read_message(flat)
    ]
    outputs = grouped(attributes, "llm.output_messages")
    output = read_message(outputs[0])[0] if outputs else None
    reason = finish_reason(attributes.get("llm.finish_reason")) or finish_reason(
        attributes.get(sc.GEN_AI_RESPONSE_FINISH_REASONS)
    )
    if reason is None and output is not None:
        reason = "tool_calls" if output.get("tool_calls") else None
    return Exchange("openinference", inputs, as_assistant(output), reason)


def tool_definitions(attributes: Mapping[str, Any]) -> list[Any]:
    """The tools offered, as written (each one's JSON schema)."""
    return [tool.get("tool.json_schema") for tool in grouped(attributes, "llm.tools")]


def requested_model(attributes: Mapping[str, Any]) -> str | None:
    """The model the call asked for, from its invocation parameters."""
    requested = as_mapping(_loads(attributes.get(_INVOCATION_PARAMETERS)))
    return text_or_none(requested.get("model")) or text_or_none(requested.get("model_name"))
