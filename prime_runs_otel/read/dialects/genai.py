"""The OpenTelemetry GenAI semantic conventions (``gen_ai.*``): what the
OpenTelemetry instrumentations (openai-v2 and the like), openlit and logfire
write. Messages travel as JSON arrays in ``gen_ai.input.messages`` and
``gen_ai.output.messages``, each message a ``{role, parts}`` object (or, from
older writers, OpenAI's ``{role, content}``); the system prompt and the tools
offered have attributes of their own.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from ... import semconv as sc
from ..._json import parsed_if_json as _loads
from ..checks import text_or_none
from .messages import (
    Exchange,
    as_assistant,
    as_mapping,
    finish_reason,
    normalize_role,
    openai_message,
    tool_call,
    verifiers_message,
)

__all__ = [
    "CACHE_READ_TOKENS",
    "INPUT_TOKENS",
    "MESSAGE_PREFIXES",
    "OUTPUT_TOKENS",
    "REASONING_TOKENS",
    "agent_name",
    "exchange",
    "has_messages",
    "is_agent",
    "is_call",
    "read_message",
    "tool_definitions",
]

_CALL_OPERATIONS = frozenset({"chat", "text_completion", "generate_content"})
_SYSTEM_INSTRUCTIONS = "gen_ai.system_instructions"
_TOOL_DEFINITIONS = "gen_ai.tool.definitions"
#: Token counts, the current name first; OpenLLMetry still writes the older one.
INPUT_TOKENS = (sc.GEN_AI_USAGE_INPUT_TOKENS, "gen_ai.usage.prompt_tokens")
OUTPUT_TOKENS = (sc.GEN_AI_USAGE_OUTPUT_TOKENS, "gen_ai.usage.completion_tokens")
CACHE_READ_TOKENS = (
    "gen_ai.usage.cache_read.input_tokens",
    "gen_ai.usage.cache_read_input_tokens",
)
REASONING_TOKENS = ("gen_ai.usage.reasoning.output_tokens",)
#: Attributes (and the start of attributes) that carry a call's messages.
MESSAGE_PREFIXES = (sc.GEN_AI_INPUT_MESSAGES, sc.GEN_AI_OUTPUT_MESSAGES)


def is_call(attributes: Mapping[str, Any]) -> bool:
    """A model call: a calling operation, or messages under no operation at all."""
    # Attribute values from OTLP may be of any type, unhashable ones included:
    # only text is looked up in a set.
    operation = attributes.get(sc.GEN_AI_OPERATION_NAME)
    if isinstance(operation, str) and operation in _CALL_OPERATIONS:
        return True
    return operation is None and has_messages(attributes)


def is_agent(attributes: Mapping[str, Any]) -> bool:
    return attributes.get(sc.GEN_AI_OPERATION_NAME) == sc.OPERATION_INVOKE_AGENT


def agent_name(attributes: Mapping[str, Any]) -> str | None:
    return text_or_none(attributes.get(sc.GEN_AI_AGENT_NAME))


def has_messages(attributes: Mapping[str, Any]) -> bool:
    return sc.GEN_AI_INPUT_MESSAGES in attributes or sc.GEN_AI_OUTPUT_MESSAGES in attributes


def read_message(raw: Mapping[str, Any]) -> list[dict[str, Any]]:
    """A GenAI-conventions message (``{role, parts: [...]}``); a tool message with
    several responses becomes one message per response, as chat APIs carry them."""
    if not isinstance(raw.get("parts"), list):
        return openai_message(raw)
    role = normalize_role(raw.get("role")) or "user"
    texts: list[str] = []
    images: list[str] = []
    reasoning: list[str] = []
    calls: list[dict[str, Any]] = []
    responses: list[dict[str, Any]] = []
    for part in raw["parts"]:
        item = as_mapping(part)
        kind = item.get("type")
        if kind == "text":
            texts.append(str(item.get("content", "")))
        elif kind == "reasoning":
            reasoning.append(str(item.get("content", "")))
        elif kind == "tool_call":
            calls.append(tool_call(item.get("id"), item.get("name"), item.get("arguments")))
        elif kind == "tool_call_response":
            result = item.get("response", item.get("result"))
            text = result if isinstance(result, str) else json.dumps(result, ensure_ascii=False)
            responses.append(verifiers_message("tool", [text], tool_call_id=item.get("id")))
        elif kind == "uri" and isinstance(item.get("uri"), str):
            images.append(item["uri"])
        elif kind == "blob" and isinstance(item.get("content"), str):
            mime = item.get("mime_type") or "application/octet-stream"
            images.append(f"data:{mime};base64,{item['content']}")
    if responses:
        return responses
    return [
        verifiers_message(
            role,
            texts,
            images=images,
            reasoning="\n".join(reasoning) or None,
            tool_calls=calls,
            tool_call_id=raw.get("tool_call_id"),
            name=raw.get("name"),
        )
    ]


def _json_messages(value: Any) -> list[dict[str, Any]] | None:
    """A JSON array of messages (either shape), or ``None`` when absent."""
    parsed = _loads(value)
    if not isinstance(parsed, list):
        return None
    messages: list[dict[str, Any]] = []
    for raw in parsed:
        if isinstance(raw, Mapping):
            messages.extend(read_message(raw))
    return messages


def exchange(attributes: Mapping[str, Any]) -> Exchange:
    inputs = _json_messages(attributes.get(sc.GEN_AI_INPUT_MESSAGES))
    system = _loads(attributes.get(_SYSTEM_INSTRUCTIONS))
    if isinstance(system, list) and inputs is not None and not _has_system(inputs):
        texts = [str(as_mapping(part).get("content", "")) for part in system]
        inputs.insert(0, verifiers_message("system", [text for text in texts if text]))
    outputs = _loads(attributes.get(sc.GEN_AI_OUTPUT_MESSAGES))
    first = as_mapping(outputs[0]) if isinstance(outputs, list) and outputs else None
    output = read_message(first)[0] if first is not None else None
    reason = finish_reason((first or {}).get("finish_reason")) or finish_reason(
        attributes.get(sc.GEN_AI_RESPONSE_FINISH_REASONS)
    )
    return Exchange("gen_ai", inputs, as_assistant(output), reason)


def _has_system(messages: Sequence[Mapping[str, Any]]) -> bool:
    """Whether the input messages already hold the system turn. The conventions
    keep it apart in ``gen_ai.system_instructions``, but some instrumentations
    (openlit) also leave it among the input messages: adding it again would
    show the model a second system prompt it never saw."""
    return any(message.get("role") == "system" for message in messages)


def tool_definitions(attributes: Mapping[str, Any]) -> list[Any]:
    """The tools offered, as written (see
    :func:`~prime_runs_otel.read.dialects.messages.tool_definition`)."""
    definitions = _loads(attributes.get(_TOOL_DEFINITIONS))
    return list(definitions) if isinstance(definitions, list) else []
