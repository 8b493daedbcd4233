"""Which span is what, whatever family wrote it: model call, agent, and a
call's exchange, token usage and model.

Each question is put to the families in turn (GenAI first: the
conventions OpenTelemetry itself publishes win where a span carries two
families' attributes, as some do). What is read across families on purpose,
such as token counts that one family names and another reuses, is read here,
in the order of preference, so no family module needs another.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any, Protocol

from ... import semconv as sc
from ..checks import finite_number, text_or_none, whole_number
from ..spans import SpanView
from . import genai, openinference, openllmetry
from .messages import Exchange, finish_reason, tool_definition

__all__ = [
    "DEFAULT_AGENT",
    "agent_name",
    "call_model",
    "call_usage",
    "carries_messages",
    "exchange",
    "is_model_call",
]

#: The name of an agent whose span names none.
DEFAULT_AGENT = "agent"


class _Family(Protocol):
    """What each family's module answers (see :mod:`.genai`)."""

    def is_call(self, attributes: Mapping[str, Any]) -> bool: ...
    def is_agent(self, attributes: Mapping[str, Any]) -> bool: ...
    def agent_name(self, attributes: Mapping[str, Any]) -> str | None: ...
    def has_messages(self, attributes: Mapping[str, Any]) -> bool: ...
    def exchange(self, attributes: Mapping[str, Any]) -> Exchange: ...
    def tool_definitions(self, attributes: Mapping[str, Any]) -> list[Any]: ...


#: In the order they are asked.
_FAMILIES: tuple[_Family, ...] = (genai, openinference, openllmetry)
_MESSAGE_PREFIXES = (
    genai.MESSAGE_PREFIXES + openinference.MESSAGE_PREFIXES + openllmetry.MESSAGE_PREFIXES
)


def is_model_call(view: SpanView) -> bool:
    """A span of one model call, in any of the three conventions."""
    attributes = view.attributes
    return any(family.is_call(attributes) for family in _FAMILIES)


def agent_name(view: SpanView) -> str | None:
    """The agent's name when ``view`` is an agent span, else ``None``."""
    attributes = view.attributes
    for family in _FAMILIES:
        if family.is_agent(attributes):
            return family.agent_name(attributes) or _span_agent_name(view)
    return None


def _span_agent_name(view: SpanView) -> str:
    name = view.name.removeprefix(sc.AGENT_SPAN_PREFIX).strip()
    return name or DEFAULT_AGENT


def carries_messages(view: SpanView) -> bool:
    """Whether a span carries any message, in any family's spelling."""
    return any(key.startswith(_MESSAGE_PREFIXES) for key in view.attributes)


def exchange(view: SpanView) -> Exchange:
    """The model call ``view`` records, read by the family whose messages it
    carries (a call without messages still has its finish reason)."""
    attributes = view.attributes
    for family in _FAMILIES:
        if family.has_messages(attributes):
            read = family.exchange(attributes)
            break
    else:
        source = "openinference" if openinference.KIND in attributes else "gen_ai"
        reason = finish_reason(attributes.get(sc.GEN_AI_RESPONSE_FINISH_REASONS))
        read = Exchange(source, None, None, reason)
    return replace(read, tools=_tool_definitions(attributes))


def _tool_definitions(attributes: Mapping[str, Any]) -> list[dict[str, Any]]:
    raws = [raw for family in _FAMILIES for raw in family.tool_definitions(attributes)]
    tools = [tool for tool in (tool_definition(raw) for raw in raws) if tool is not None]
    return list({tool["name"]: tool for tool in tools}.values())


def _first_int(attributes: Mapping[str, Any], *keys: str) -> int | None:
    for key in keys:
        value = whole_number(attributes.get(key))
        if value is not None:
            return value
    return None


def call_usage(attributes: Mapping[str, Any]) -> dict[str, Any] | None:
    """verifiers' ``Usage``: every convention counts cache reads as input, and
    verifiers keeps them apart (``prompt_tokens`` excludes them)."""
    fed = _first_int(attributes, *genai.INPUT_TOKENS, openinference.PROMPT_TOKENS)
    produced = _first_int(attributes, *genai.OUTPUT_TOKENS, openinference.COMPLETION_TOKENS)
    if fed is None and produced is None:
        return None
    cached = _first_int(attributes, *genai.CACHE_READ_TOKENS, openinference.CACHE_READ_TOKENS)
    reasoning = _first_int(attributes, *genai.REASONING_TOKENS, openinference.REASONING_TOKENS)
    usage: dict[str, Any] = {
        "prompt_tokens": max(0, (fed or 0) - (cached or 0)),
        "completion_tokens": produced or 0,
    }
    if cached is not None:
        usage["cached_input_tokens"] = cached
    if reasoning is not None:
        usage["reasoning_tokens"] = reasoning
    cost = finite_number(attributes.get(openinference.COST))
    if cost is not None:
        usage["cost"] = cost
    return usage


def call_model(attributes: Mapping[str, Any]) -> str | None:
    """The model the call asked for, as verifiers records it. OpenInference's
    ``llm.model_name`` is the model that answered (a provider may resolve an
    alias to a dated snapshot), so its request parameters come first."""
    model = text_or_none(attributes.get(sc.GEN_AI_REQUEST_MODEL))
    if model:
        return model
    model = openinference.requested_model(attributes)
    if model:
        return model
    for key in (sc.GEN_AI_RESPONSE_MODEL, openinference.MODEL_NAME):
        model = text_or_none(attributes.get(key))
        if model:
            return model
    return None
