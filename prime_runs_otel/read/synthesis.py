"""Episode records synthesised from another instrumentation's span tree.

Training and agent code is often traced already: by the OpenTelemetry GenAI
instrumentations (``gen_ai.*`` spans, messages in ``gen_ai.input.messages``),
by OpenInference (``llm.input_messages.*``) or by OpenLLMetry
(``gen_ai.prompt.*``, ``traceloop.*``). Such code only has to wrap each rollout
in an episode span with its rollout attributes (``prime.episode.example_id``,
the reward; see :func:`prime_runs_otel.instrument.episode_span`) for the
platform to get whole episodes: the record verifiers would have written is
rebuilt here from the spans under the episode span. Model calls become the
record's calls and its message graph, agent spans its traces, span status its
errors, and the episode's attributes and ``gen_ai.evaluation.result`` events
its rewards.

The children of an episode span may reach the consumer after it (a collector
does not keep order), so :class:`SpanTreeBuffer` holds spans by trace id until
each episode's tree is in, with a bounded wait and bounded memory, and counts
what never completes instead of dropping it silently.

The record is shaped so that verifiers' ``WireEpisode`` validates it and every
projection in :mod:`prime_runs_otel.projection` reads it like a native one.
"""

from __future__ import annotations

import copy
import hashlib
import json
import logging
import math
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from .. import semconv as sc
from .._json import parsed_if_json as _loads
from .._message_graph import message_node
from .._text import shown
from .checks import derived_episode_id, whole_number
from .checks import text_or_none as _text
from .records import RunIdentity, UnrecordedEpisode
from .spans import SpanView

__all__ = [
    "BufferStats",
    "SpanTree",
    "SpanTreeBuffer",
    "is_model_call",
    "synthesize_record",
]

logger = logging.getLogger(__name__)

#: Attribute values held for synthesis at most (about 100 bytes each once
#: decoded): past it the oldest trace is let go, as past ``max_spans``.
DEFAULT_MAX_HELD_VALUES = 4_000_000

_EMPTY: Mapping[str, Any] = {}

# -- names the three conventions use --------------------------------------------------

_GENAI_CALL_OPERATIONS = frozenset({"chat", "text_completion", "generate_content"})
_GENAI_SYSTEM_INSTRUCTIONS = "gen_ai.system_instructions"
_GENAI_TOOL_DEFINITIONS = "gen_ai.tool.definitions"
_GENAI_CACHE_READ = ("gen_ai.usage.cache_read.input_tokens", "gen_ai.usage.cache_read_input_tokens")
_GENAI_REASONING = ("gen_ai.usage.reasoning.output_tokens",)
_OPENINFERENCE_KIND = "openinference.span.kind"
_OPENINFERENCE_INVOCATION_PARAMETERS = "llm.invocation_parameters"
_OPENLLMETRY_KIND = "traceloop.span.kind"
_OPENLLMETRY_REQUEST_TYPE = "llm.request.type"
_OPENLLMETRY_PROMPT = "gen_ai.prompt"
_OPENLLMETRY_COMPLETION = "gen_ai.completion"

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
_DEFAULT_AGENT = "agent"
_DEFAULT_TASK_TYPE = "Task"


# =====================================================================================
# Which spans are what
# =====================================================================================


def is_model_call(view: SpanView) -> bool:
    """A span of one model call, in any of the three conventions."""
    attributes = view.attributes
    # Attribute values from OTLP may be of any type, unhashable ones included:
    # only text is looked up in a set.
    operation = attributes.get(sc.GEN_AI_OPERATION_NAME)
    if isinstance(operation, str) and operation in _GENAI_CALL_OPERATIONS:
        return True
    if attributes.get(_OPENINFERENCE_KIND) == "LLM":
        return True
    if attributes.get(_OPENLLMETRY_REQUEST_TYPE) in ("chat", "completion"):
        return True
    carries_messages = (
        sc.GEN_AI_INPUT_MESSAGES in attributes or sc.GEN_AI_OUTPUT_MESSAGES in attributes
    )
    return operation is None and carries_messages


def _agent_name(view: SpanView) -> str | None:
    """The agent's name when ``view`` is an agent span, else ``None``."""
    attributes = view.attributes
    if attributes.get(sc.GEN_AI_OPERATION_NAME) == sc.OPERATION_INVOKE_AGENT:
        return _text(attributes.get(sc.GEN_AI_AGENT_NAME)) or _span_agent_name(view)
    if attributes.get(_OPENINFERENCE_KIND) == "AGENT":
        return _text(attributes.get("agent.name")) or _span_agent_name(view)
    if attributes.get(_OPENLLMETRY_KIND) == "agent":
        return (
            _text(attributes.get(sc.GEN_AI_AGENT_NAME))
            or _text(attributes.get("traceloop.entity.name"))
            or _span_agent_name(view)
        )
    return None


def _span_agent_name(view: SpanView) -> str:
    name = view.name.removeprefix(sc.AGENT_SPAN_PREFIX).strip()
    return name or _DEFAULT_AGENT


# =====================================================================================
# Messages, in verifiers' shape
# =====================================================================================


def _normalize_role(role: Any) -> str | None:
    return _ROLES.get(str(role).lower()) if isinstance(role, str) else None


def _finish_reason(value: Any) -> str | None:
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


def _tool_call(call_id: Any, name: Any, arguments: Any) -> dict[str, Any]:
    return {
        "id": str(call_id) if call_id is not None else "",
        "type": "function",
        "name": str(name) if name is not None else "",
        "arguments": _arguments_text(arguments),
    }


def _message(
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


def _content_pieces(content: Any) -> tuple[list[str], list[str]]:
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
        item = _mapping(part)
        kind = item.get("type")
        if kind in ("text", "input_text", "output_text") and isinstance(item.get("text"), str):
            texts.append(item["text"])
        elif kind == "image_url":
            url = _mapping(item.get("image_url")).get("url")
            if isinstance(url, str):
                images.append(url)
    return texts, images


def _openai_message(raw: Mapping[str, Any]) -> list[dict[str, Any]]:
    """An OpenAI-shaped message (``{role, content, tool_calls, tool_call_id}``)."""
    role = _normalize_role(raw.get("role")) or "user"
    texts, images = _content_pieces(raw.get("content"))
    calls = []
    for call in raw.get("tool_calls") or ():
        item = _mapping(call)
        function = _mapping(item.get("function"))
        calls.append(
            _tool_call(
                item.get("id"),
                function.get("name", item.get("name")),
                function.get("arguments", item.get("arguments")),
            )
        )
    reasoning = raw.get("reasoning_content")
    return [
        _message(
            role,
            texts,
            images=images,
            reasoning=reasoning if isinstance(reasoning, str) else None,
            tool_calls=calls,
            tool_call_id=raw.get("tool_call_id"),
            name=raw.get("name"),
        )
    ]


def _genai_message(raw: Mapping[str, Any]) -> list[dict[str, Any]]:
    """A GenAI-conventions message (``{role, parts: [...]}``); a tool message with
    several responses becomes one message per response, as chat APIs carry them."""
    if not isinstance(raw.get("parts"), list):
        return _openai_message(raw)
    role = _normalize_role(raw.get("role")) or "user"
    texts: list[str] = []
    images: list[str] = []
    reasoning: list[str] = []
    calls: list[dict[str, Any]] = []
    responses: list[dict[str, Any]] = []
    for part in raw["parts"]:
        item = _mapping(part)
        kind = item.get("type")
        if kind == "text":
            texts.append(str(item.get("content", "")))
        elif kind == "reasoning":
            reasoning.append(str(item.get("content", "")))
        elif kind == "tool_call":
            calls.append(_tool_call(item.get("id"), item.get("name"), item.get("arguments")))
        elif kind == "tool_call_response":
            result = item.get("response", item.get("result"))
            text = result if isinstance(result, str) else json.dumps(result, ensure_ascii=False)
            responses.append(_message("tool", [text], tool_call_id=item.get("id")))
        elif kind == "uri" and isinstance(item.get("uri"), str):
            images.append(item["uri"])
        elif kind == "blob" and isinstance(item.get("content"), str):
            mime = item.get("mime_type") or "application/octet-stream"
            images.append(f"data:{mime};base64,{item['content']}")
    if responses:
        return responses
    return [
        _message(
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
            messages.extend(_genai_message(raw))
    return messages


def _grouped(attributes: Mapping[str, Any], prefix: str) -> list[dict[str, Any]]:
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


def _openinference_message(flat: Mapping[str, Any]) -> list[dict[str, Any]]:
    role = _normalize_role(flat.get("message.role")) or "user"
    texts, images = _content_pieces(flat.get("message.content"))
    for part in _grouped(flat, "message.contents"):
        kind = part.get("message_content.type")
        if kind == "text" and isinstance(part.get("message_content.text"), str):
            texts.append(part["message_content.text"])
        elif kind == "image" and isinstance(part.get("message_content.image.image.url"), str):
            images.append(part["message_content.image.image.url"])
    calls = [
        _tool_call(
            call.get("tool_call.id"),
            call.get("tool_call.function.name"),
            call.get("tool_call.function.arguments"),
        )
        for call in _grouped(flat, "message.tool_calls")
    ]
    return [
        _message(
            role,
            texts,
            images=images,
            tool_calls=calls,
            tool_call_id=flat.get("message.tool_call_id"),
            name=flat.get("message.name"),
        )
    ]


def _openllmetry_message(flat: Mapping[str, Any]) -> list[dict[str, Any]]:
    role = _normalize_role(flat.get("role")) or "user"
    texts, images = _content_pieces(flat.get("content"))
    calls = [
        _tool_call(call.get("id"), call.get("name"), call.get("arguments"))
        for call in _grouped(flat, "tool_calls")
    ]
    if "function_call.name" in flat:
        calls.append(
            _tool_call(None, flat.get("function_call.name"), flat.get("function_call.arguments"))
        )
    return [
        _message(
            role,
            texts,
            images=images,
            tool_calls=calls,
            tool_call_id=flat.get("tool_call_id"),
            name=flat.get("name"),
        )
    ]


@dataclass
class _Exchange:
    """One model call as read off its span, whatever the convention."""

    source: str
    inputs: list[dict[str, Any]] | None
    output: dict[str, Any] | None
    finish_reason: str | None
    tools: list[dict[str, Any]]


def _exchange(view: SpanView) -> _Exchange:
    attributes = view.attributes
    if sc.GEN_AI_INPUT_MESSAGES in attributes or sc.GEN_AI_OUTPUT_MESSAGES in attributes:
        return _genai_exchange(attributes)
    if any(key.startswith("llm.input_messages.") for key in attributes) or any(
        key.startswith("llm.output_messages.") for key in attributes
    ):
        return _openinference_exchange(attributes)
    if any(key.startswith(_OPENLLMETRY_PROMPT + ".") for key in attributes) or any(
        key.startswith(_OPENLLMETRY_COMPLETION + ".") for key in attributes
    ):
        return _openllmetry_exchange(attributes)
    source = "openinference" if _OPENINFERENCE_KIND in attributes else "gen_ai"
    reason = _finish_reason(attributes.get(sc.GEN_AI_RESPONSE_FINISH_REASONS))
    return _Exchange(source, None, None, reason, _tool_definitions(attributes))


def _genai_exchange(attributes: Mapping[str, Any]) -> _Exchange:
    inputs = _json_messages(attributes.get(sc.GEN_AI_INPUT_MESSAGES))
    system = _loads(attributes.get(_GENAI_SYSTEM_INSTRUCTIONS))
    if isinstance(system, list) and inputs is not None and not _has_system(inputs):
        texts = [str(_mapping(part).get("content", "")) for part in system]
        inputs.insert(0, _message("system", [text for text in texts if text]))
    outputs = _loads(attributes.get(sc.GEN_AI_OUTPUT_MESSAGES))
    first = _mapping(outputs[0]) if isinstance(outputs, list) and outputs else None
    output = _genai_message(first)[0] if first is not None else None
    reason = _finish_reason((first or _EMPTY).get("finish_reason")) or _finish_reason(
        attributes.get(sc.GEN_AI_RESPONSE_FINISH_REASONS)
    )
    return _Exchange("gen_ai", inputs, _as_assistant(output), reason, _tool_definitions(attributes))


def _has_system(messages: Sequence[Mapping[str, Any]]) -> bool:
    """Whether the input messages already hold the system turn. The conventions
    keep it apart in ``gen_ai.system_instructions``, but some instrumentations
    (openlit) also leave it among the input messages: adding it again would
    show the model a second system prompt it never saw."""
    return any(message.get("role") == "system" for message in messages)


def _openinference_exchange(attributes: Mapping[str, Any]) -> _Exchange:
    inputs = [
        message
        for flat in _grouped(attributes, "llm.input_messages")
        for message in _openinference_message(flat)
    ]
    outputs = _grouped(attributes, "llm.output_messages")
    output = _openinference_message(outputs[0])[0] if outputs else None
    reason = _finish_reason(attributes.get("llm.finish_reason")) or _finish_reason(
        attributes.get(sc.GEN_AI_RESPONSE_FINISH_REASONS)
    )
    if reason is None and output is not None:
        reason = "tool_calls" if output.get("tool_calls") else None
    return _Exchange(
        "openinference", inputs, _as_assistant(output), reason, _tool_definitions(attributes)
    )


def _openllmetry_exchange(attributes: Mapping[str, Any]) -> _Exchange:
    inputs = [
        message
        for flat in _grouped(attributes, _OPENLLMETRY_PROMPT)
        for message in _openllmetry_message(flat)
    ]
    outputs = _grouped(attributes, _OPENLLMETRY_COMPLETION)
    output = _openllmetry_message(outputs[0])[0] if outputs else None
    reason = _finish_reason(outputs[0].get("finish_reason")) if outputs else None
    reason = reason or _finish_reason(attributes.get(sc.GEN_AI_RESPONSE_FINISH_REASONS))
    return _Exchange(
        "openllmetry", inputs, _as_assistant(output), reason, _tool_definitions(attributes)
    )


def _as_assistant(message: dict[str, Any] | None) -> dict[str, Any] | None:
    """What a model call produced is the assistant's turn, whatever role the
    instrumentation wrote down for it."""
    if message is None or message.get("role") == "assistant":
        return message
    texts, _ = _content_pieces(message.get("content"))
    return _message("assistant", texts)


# -- tool definitions --------------------------------------------------------------------


def _tool(raw: Any) -> dict[str, Any] | None:
    item = _mapping(_loads(raw))
    function = _mapping(item.get("function")) or item
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


def _tool_definitions(attributes: Mapping[str, Any]) -> list[dict[str, Any]]:
    raws: list[Any] = []
    definitions = _loads(attributes.get(_GENAI_TOOL_DEFINITIONS))
    if isinstance(definitions, list):
        raws.extend(definitions)
    raws.extend(tool.get("tool.json_schema") for tool in _grouped(attributes, "llm.tools"))
    raws.extend(_grouped(attributes, "llm.request.functions"))
    tools = [tool for tool in (_tool(raw) for raw in raws) if tool is not None]
    return list({tool["name"]: tool for tool in tools}.values())


# -- usage ----------------------------------------------------------------------------------


def _first_int(attributes: Mapping[str, Any], *keys: str) -> int | None:
    for key in keys:
        value = _whole(attributes.get(key))
        if value is not None:
            return value
    return None


def _usage(attributes: Mapping[str, Any]) -> dict[str, Any] | None:
    """verifiers' ``Usage``: every convention counts cache reads as input, and
    verifiers keeps them apart (``prompt_tokens`` excludes them)."""
    fed = _first_int(
        attributes,
        sc.GEN_AI_USAGE_INPUT_TOKENS,
        "gen_ai.usage.prompt_tokens",
        "llm.token_count.prompt",
    )
    produced = _first_int(
        attributes,
        sc.GEN_AI_USAGE_OUTPUT_TOKENS,
        "gen_ai.usage.completion_tokens",
        "llm.token_count.completion",
    )
    if fed is None and produced is None:
        return None
    cached = _first_int(attributes, *_GENAI_CACHE_READ, "llm.token_count.prompt_details.cache_read")
    reasoning = _first_int(
        attributes, *_GENAI_REASONING, "llm.token_count.completion_details.reasoning"
    )
    usage: dict[str, Any] = {
        "prompt_tokens": max(0, (fed or 0) - (cached or 0)),
        "completion_tokens": produced or 0,
    }
    if cached is not None:
        usage["cached_input_tokens"] = cached
    if reasoning is not None:
        usage["reasoning_tokens"] = reasoning
    cost = _number(attributes.get("llm.cost.total"))
    if cost is not None:
        usage["cost"] = cost
    return usage


def _model(attributes: Mapping[str, Any]) -> str | None:
    """The model the call asked for, as verifiers records it. OpenInference's
    ``llm.model_name`` is the model that answered (a provider may resolve an
    alias to a dated snapshot), so its request parameters come first."""
    model = _text(attributes.get(sc.GEN_AI_REQUEST_MODEL))
    if model:
        return model
    requested = _mapping(_loads(attributes.get(_OPENINFERENCE_INVOCATION_PARAMETERS)))
    model = _text(requested.get("model")) or _text(requested.get("model_name"))
    if model:
        return model
    for key in (sc.GEN_AI_RESPONSE_MODEL, "llm.model_name"):
        model = _text(attributes.get(key))
        if model:
            return model
    return None


# =====================================================================================
# Errors and scores
# =====================================================================================


def _error(
    view: SpanView,
    named_by: Sequence[tuple[str, str]] = (),
    *,
    failed: bool = False,
) -> dict[str, Any] | None:
    """The span's failure as a verifiers ``Error``, or ``None`` when it did not
    fail. ``named_by``: (type, message) attributes that describe it first."""
    attributes = view.attributes
    exception = next((event for event in view.events if event.name == "exception"), None)
    if not (failed or view.status_error or exception is not None):
        return None
    details: Mapping[str, Any] = exception.attributes if exception else _EMPTY
    kind = message = None
    for type_key, message_key in named_by:
        kind = kind or _text(attributes.get(type_key))
        message = message or _text(attributes.get(message_key))
    kind = kind or _text(attributes.get(sc.ERROR_TYPE)) or _text(details.get("exception.type"))
    message = message or view.status_message or _text(details.get("exception.message"))
    error: dict[str, Any] = {"type": kind or "Error", "message": message or kind or "failed"}
    stacktrace = _text(details.get("exception.stacktrace"))
    if stacktrace:
        error["traceback"] = stacktrace
    return error


@dataclass
class _Scores:
    """Named scores, a total, and metrics gathered for one trace."""

    total: float | None = None
    named: dict[str, float] = field(default_factory=dict)
    metrics: dict[str, float] = field(default_factory=dict)

    def read(self, view: SpanView, *, total_key: str) -> None:
        attributes = view.attributes
        total = _number(attributes.get(total_key))
        if total is not None:
            self.total = total
        for key, value in attributes.items():
            score = _number(value)
            if score is None:
                continue
            if key.startswith(sc.AGENT_REWARD_PREFIX):
                self.named[key[len(sc.AGENT_REWARD_PREFIX) :]] = score
            elif key.startswith(sc.AGENT_METRIC_PREFIX):
                self.metrics[key[len(sc.AGENT_METRIC_PREFIX) :]] = score
        self.read_evaluations(view)

    def read_evaluations(self, view: SpanView) -> None:
        for event in view.events:
            if event.name != sc.GEN_AI_EVALUATION_EVENT:
                continue
            details = event.attributes
            name = _text(details.get(sc.GEN_AI_EVALUATION_NAME))
            score = _number(details.get(sc.GEN_AI_EVALUATION_SCORE))
            if name and score is not None:
                self.named.setdefault(name, score)

    def merge(self, other: _Scores) -> None:
        """``other`` (the episode's own) wins where both say something."""
        if other.total is not None:
            self.total = other.total
        self.named.update(other.named)
        self.metrics.update(other.metrics)

    def rewards_and_metrics(self) -> tuple[dict[str, Any], dict[str, Any]]:
        """A total is the reward as the producer computed it, so named scores
        then travel as metrics (the platform's reward stays that total); without
        one, the named scores are the rewards and their sum is the reward."""
        metrics: dict[str, Any] = dict(self.metrics)
        if self.total is None:
            rewards = {name: {"score": score, "weight": 1.0} for name, score in self.named.items()}
            return rewards, metrics
        for name, score in self.named.items():
            metrics.setdefault(name, score)
        return {"reward": {"score": self.total, "weight": 1.0}}, metrics


# =====================================================================================
# The record
# =====================================================================================


@dataclass
class _Call:
    view: SpanView
    exchange: _Exchange


@dataclass
class _Agent:
    """One trace to be: an agent span (or the episode itself) and its calls."""

    name: str
    view: SpanView
    trainable: bool
    calls: list[_Call] = field(default_factory=list)
    scores: _Scores = field(default_factory=_Scores)
    scored_views: list[SpanView] = field(default_factory=list)


def synthesize_record(
    root: SpanView, spans: Iterable[SpanView], identity: RunIdentity | None = None
) -> dict[str, Any]:
    """The episode record for ``root`` (an episode span without one) built from
    ``spans``, its descendants (any others are ignored).

    ``identity`` is the run the episode belongs to: it names the run block and
    the environment when the span does not.
    """
    tree = _Tree(root, spans)
    agents = tree.agents()
    task = _task(root, agents)
    root_error = _root_error(root)
    traces = [_trace(agent, task, tree, root_error) for agent in agents]
    summary_index = _summary_index(traces)
    summary = traces[summary_index] if traces else None
    if summary is not None:
        _apply_episode_outcome(summary, agents[summary_index], root)
    record: dict[str, Any] = {"id": _episode_id(root), "env": _env(root, identity), "task": task}
    group = _text(root.attributes.get(sc.EPISODE_GROUP))
    if group:
        record["group"] = {"id": group}
    run = _run_block(root, identity)
    if run is not None:
        record["run"] = run
    record["ok"] = _episode_ok(root, root_error, summary)
    record["is_timeout"] = False
    record["errors"] = [root_error] if root_error else list((summary or _EMPTY).get("errors", ()))
    record["traces"] = traces
    record.update(_episode_tokens(traces))
    return record


def _root_error(root: SpanView) -> dict[str, Any] | None:
    if not _has_episode_error(root):
        return None
    return _error(root, [(sc.EPISODE_ERROR_TYPE, sc.EPISODE_ERROR_MESSAGE)], failed=True)


def _has_episode_error(root: SpanView) -> bool:
    attributes = root.attributes
    return (
        root.status_error
        or attributes.get(sc.EPISODE_OK) is False
        or bool(_text(attributes.get(sc.EPISODE_ERROR_TYPE)))
        or any(event.name == "exception" for event in root.events)
    )


def _episode_ok(
    root: SpanView, root_error: dict[str, Any] | None, summary: Mapping[str, Any] | None
) -> bool:
    given = root.attributes.get(sc.EPISODE_OK)
    if isinstance(given, bool):
        return given
    return root_error is None and bool((summary or {"ok": True}).get("ok"))


class _Tree:
    """The descendants of an episode span, with the parent links between them."""

    def __init__(self, root: SpanView, spans: Iterable[SpanView]) -> None:
        self.root = root
        by_id = {view.span_id: view for view in spans if view.trace_id == root.trace_id}
        by_id.pop(root.span_id, None)
        children: dict[int, list[SpanView]] = {}
        for view in by_id.values():
            if view.parent_span_id is not None:
                children.setdefault(view.parent_span_id, []).append(view)
        # Down from the root, once: linear in the spans however deep the
        # tree, and parent links that loop never reach the root.
        self.members = []
        stack = list(children.get(root.span_id, ()))
        while stack:
            view = stack.pop()
            self.members.append(view)
            stack.extend(children.get(view.span_id, ()))
        self.members.sort(key=lambda view: (view.start_ns, view.end_ns))
        self.by_id = {view.span_id: view for view in self.members}
        self._owners: dict[int, _Agent] = {}

    def ancestors(self, view: SpanView) -> Iterable[SpanView]:
        """From the parent up to (and including) the root."""
        current = view.parent_span_id
        while current is not None and current in self.by_id:
            yield self.by_id[current]
            current = self.by_id[current].parent_span_id
        yield self.root

    def agents(self) -> list[_Agent]:
        """One agent per agent span, plus the episode itself for calls under no
        agent span, in the order they finished."""
        episode = _Agent(_episode_agent_name(self.root), self.root, _trainable(self.root))
        agents: dict[int, _Agent] = {}
        for view in self.members:
            name = _agent_name(view)
            if name is not None:
                agents[view.span_id] = _Agent(name, view, _trainable(view))
        for view in self._innermost_calls():
            self._owner(view, agents, episode).calls.append(_Call(view, _exchange(view)))
        for view in self.members:
            if view.span_id not in agents and any(
                event.name == sc.GEN_AI_EVALUATION_EVENT for event in view.events
            ):
                self._owner(view, agents, episode).scored_views.append(view)
        found = sorted(agents.values(), key=lambda agent: agent.view.end_ns)
        if episode.calls or not found:
            found.append(episode)
        for agent in found:
            if agent.view is not self.root:  # the root's own scores are the episode's
                agent.scores.read(agent.view, total_key=sc.AGENT_REWARD)
            for view in [call.view for call in agent.calls] + agent.scored_views:
                agent.scores.read_evaluations(view)
        return found

    def _owner(self, view: SpanView, agents: Mapping[int, _Agent], episode: _Agent) -> _Agent:
        """The innermost agent above ``view``; remembered per span on the way,
        so a deep chain of calls is walked once, not once per call."""
        walked: list[int] = []
        owner = episode
        for ancestor in self.ancestors(view):
            if ancestor.span_id in agents:
                owner = agents[ancestor.span_id]
                break
            if ancestor.span_id in self._owners:
                owner = self._owners[ancestor.span_id]
                break
            walked.append(ancestor.span_id)
        for span_id in walked:
            self._owners[span_id] = owner
        return owner

    def _innermost_calls(self) -> list[SpanView]:
        """Model-call spans, without one that wraps another (a framework span
        around the client library's span is the same call seen twice)."""
        calls = [view for view in self.members if is_model_call(view)]
        if is_model_call(self.root):
            calls.insert(0, self.root)
        wrapping: set[int] = set()
        for view in calls:
            if view is self.root:
                continue
            for ancestor in self.ancestors(view):
                if ancestor.span_id in wrapping:
                    break  # and so is everything above it: each chain is walked once
                wrapping.add(ancestor.span_id)
        return [view for view in calls if view.span_id not in wrapping]


def _episode_agent_name(root: SpanView) -> str:
    return _text(root.attributes.get(sc.GEN_AI_AGENT_NAME)) or _DEFAULT_AGENT


def _trainable(view: SpanView) -> bool:
    value = view.attributes.get(sc.AGENT_TRAINABLE)
    return value if isinstance(value, bool) else True


def _episode_id(root: SpanView) -> str:
    return _text(root.attributes.get(sc.EPISODE_ID)) or derived_episode_id(root)


def _env(root: SpanView, identity: RunIdentity | None) -> dict[str, Any]:
    label = _text(root.attributes.get(sc.EPISODE_ENV))
    if label is None and identity is not None and identity.environments:
        label = identity.environments[0]
    return {"id": label, "name": label} if label else {"id": ""}


def _task(root: SpanView, agents: Sequence[_Agent]) -> dict[str, Any]:
    attributes = root.attributes
    idx = attributes.get(sc.EPISODE_EXAMPLE_ID)
    if isinstance(idx, str) and idx.lstrip("-").isdigit():
        idx = int(idx)  # OTLP/JSON and OTEL_RESOURCE_ATTRIBUTES carry ints as text
    data: dict[str, Any] = {"idx": idx}
    prompt = _first_user_text(agents)
    if prompt:
        data["prompt"] = prompt
    answer = _text(attributes.get(sc.EPISODE_ANSWER))
    if answer is not None:
        data["answer"] = answer
    return {"type": _text(attributes.get(sc.EPISODE_TASK_TYPE)) or _DEFAULT_TASK_TYPE, "data": data}


def _first_user_text(agents: Sequence[_Agent]) -> str | None:
    for agent in agents:
        for call in agent.calls:
            for message in call.exchange.inputs or ():
                if message.get("role") == "user" and isinstance(message.get("content"), str):
                    return str(message["content"])
    return None


def _run_block(root: SpanView, identity: RunIdentity | None) -> dict[str, Any] | None:
    """verifiers' run info. A training episode without a step has none (the
    run info of a training episode must say its work), which the uploader's
    stamping fills in from the span's step where it knows one."""
    if identity is None:
        return None
    step = _whole(root.attributes.get(sc.RUN_STEP))
    run: dict[str, Any] = {"type": identity.kind, "id": identity.local_id}
    if identity.name:
        run["name"] = identity.name
    if identity.kind == "train":
        if step is None:
            return None
        run["work"] = {"type": "train", "step": step}
    return run


def _summary_index(traces: Sequence[Mapping[str, Any]]) -> int:
    for index, trace in enumerate(traces):
        if trace["agent"]["trainable"]:
            return index
    return 0


def _apply_episode_outcome(trace: dict[str, Any], agent: _Agent, root: SpanView) -> None:
    """The episode's own reward, scores and stop condition speak for its
    summary trace, over what the trace's agent span said."""
    episode = _Scores()
    episode.read(root, total_key=sc.EPISODE_REWARD)
    if episode != _Scores():
        scores = _Scores(agent.scores.total, dict(agent.scores.named), dict(agent.scores.metrics))
        scores.merge(episode)
        trace["rewards"], trace["metrics"] = scores.rewards_and_metrics()
    stop = _text(root.attributes.get(sc.EPISODE_STOP_CONDITION))
    if stop:
        trace["stop_condition"] = stop


# -- one trace ------------------------------------------------------------------------------


def _trace(
    agent: _Agent,
    task: Mapping[str, Any],
    tree: _Tree,
    episode_error: dict[str, Any] | None,
) -> dict[str, Any]:
    graph = _Graph()
    calls = [graph.add(call) for call in sorted(agent.calls, key=lambda c: c.view.start_ns)]
    error = episode_error if agent.view is tree.root else _error(agent.view)
    if error is None and agent.view is tree.root and _ends_in_failure(calls):
        error = calls[-1]["error"]
    errors = [error] if error else []
    rewards, metrics = agent.scores.rewards_and_metrics()
    stop = _text(agent.view.attributes.get(sc.AGENT_STOP_CONDITION))
    config: dict[str, Any] = {}
    model = next((call["model"] for call in calls if call.get("model")), None)
    if model:
        config["model"] = model
    sources = sorted({call.exchange.source for call in agent.calls})
    info: dict[str, Any] = {"otel_trace_id": f"{tree.root.trace_id:032x}"}
    if sources:
        info["instrumentation"] = sources
    trace: dict[str, Any] = {
        "version": 1,
        "id": _derived_id("trace", agent.view),
        "task": copy.deepcopy(task),
        "agent": {"config": config, "name": agent.name, "trainable": agent.trainable},
        "tools": graph.tools,
        "nodes": graph.nodes,
        "calls": calls,
        "mm_token_type_id_map": {},
        "request_rewrites": [],
        "response_rewrites": [],
        "rewards": rewards,
        "metrics": metrics,
        "info": info,
        "extra_usage": [],
        "is_completed": error is None,
        "ok": error is None,
        "is_timeout": False,
        "errors": errors,
        "timing": _timing(agent.view, calls),
    }
    if stop or error:
        trace["stop_condition"] = stop or "error"
    trace.update(_trace_tokens(graph.nodes, calls))
    return trace


def _ends_in_failure(calls: Sequence[Mapping[str, Any]]) -> bool:
    """The last model call failed: nothing came after it to recover."""
    return bool(calls) and "error" in calls[-1]


def _derived_id(kind: str, view: SpanView) -> str:
    """A stable id for something the record needs and the spans do not name."""
    seed = f"{kind}:{view.trace_id:032x}:{view.span_id:016x}"
    return hashlib.sha256(seed.encode()).hexdigest()[:32]


class _Graph:
    """The message graph of one trace, grown call by call: a call's input
    messages follow the existing path as far as they match it, so a multi-turn
    conversation is one branch and a retry or a fork is a second one."""

    def __init__(self) -> None:
        self.nodes: list[dict[str, Any]] = []
        self.tools: list[dict[str, Any]] = []
        self._children: dict[int | None, list[int]] = {}

    def add(self, call: _Call) -> dict[str, Any]:
        view, exchange = call.view, call.exchange
        start, end = _seconds(view.start_ns), _seconds(view.end_ns)
        self._add_tools(exchange.tools)
        parent: int | None = None
        for message in exchange.inputs or ():
            parent = self._child(parent, message, start, sampled=False, tools=exchange.tools)
        record: dict[str, Any] = {}
        if exchange.output is not None and not view.status_error:
            node = self._append(parent, exchange.output, end, sampled=True, tools=exchange.tools)
            record["node"] = node
        model = _model(view.attributes)
        if model:
            record["model"] = model
        if exchange.finish_reason:
            record["finish_reason"] = exchange.finish_reason
        usage = _usage(view.attributes)
        if usage is not None:
            record["usage"] = usage
        record["time"] = {"start": start, "end": max(start, end)}
        error = _error(view)
        if error is not None:
            record["error"] = error
        return record

    def _add_tools(self, tools: Sequence[dict[str, Any]]) -> None:
        known = {tool["name"] for tool in self.tools}
        self.tools.extend(tool for tool in tools if tool["name"] not in known)

    def _child(
        self,
        parent: int | None,
        message: dict[str, Any],
        timestamp: float,
        *,
        sampled: bool,
        tools: Sequence[dict[str, Any]],
    ) -> int:
        key = _message_key(message)
        for index in self._children.get(parent, ()):
            if _message_key(self.nodes[index]["message"]) == key:
                return index
        return self._append(parent, message, timestamp, sampled=sampled, tools=tools)

    def _append(
        self,
        parent: int | None,
        message: dict[str, Any],
        timestamp: float,
        *,
        sampled: bool,
        tools: Sequence[dict[str, Any]],
    ) -> int:
        self.nodes.append(message_node(message, parent, timestamp, sampled=sampled, tools=tools))
        index = len(self.nodes) - 1
        self._children.setdefault(parent, []).append(index)
        return index


def _message_key(message: Mapping[str, Any]) -> str:
    """What makes two messages the same turn. Reasoning is left out: providers
    strip it from the history they are sent back."""
    return json.dumps(
        {key: value for key, value in message.items() if key != "reasoning_content"},
        sort_keys=True,
        ensure_ascii=False,
    )


def _timing(view: SpanView, calls: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    start, end = _seconds(view.start_ns), _seconds(view.end_ns)
    model = sum(call["time"]["end"] - call["time"]["start"] for call in calls)
    zero = {"start": 0.0, "end": 0.0}
    return {
        "start": start,
        "boot": dict(zero),
        "setup": dict(zero),
        "agent": {
            "start": start,
            "end": max(start, end),
            "model": {"duration": model},
            "harness": {"duration": max(0.0, end - start - model)},
        },
        "finalize": dict(zero),
        "scoring": dict(zero),
    }


# -- token totals, as verifiers computes them --------------------------------------------------


def _branches(nodes: Sequence[Mapping[str, Any]]) -> list[list[int]]:
    parents = {node.get("parent") for node in nodes if node.get("parent") is not None}
    paths = []
    for leaf in range(len(nodes)):
        if leaf in parents:
            continue
        path: list[int] = []
        current: int | None = leaf
        while current is not None:
            path.append(current)
            current = nodes[current].get("parent")
        paths.append(path[::-1])
    return paths


def _fed(usage: Mapping[str, Any]) -> int:
    return int(usage["prompt_tokens"]) + int(usage.get("cached_input_tokens") or 0)


def _trace_tokens(
    nodes: Sequence[Mapping[str, Any]], calls: Sequence[Mapping[str, Any]]
) -> dict[str, int]:
    """Input counted once per call beyond the previous call's whole sequence on
    its branch; output summed per branch; total = input + every call's output."""
    by_node = {call["node"]: index for index, call in enumerate(calls) if "node" in call}
    counted: set[int] = set()
    input_tokens = output_tokens = 0
    for path in _branches(nodes):
        previous = 0
        for node in path:
            index = by_node.get(node)
            usage = calls[index].get("usage") if index is not None else None
            if index is None or usage is None:
                continue
            increment = max(0, _fed(usage) - previous)
            previous = _fed(usage) + int(usage["completion_tokens"])
            output_tokens += int(usage["completion_tokens"])
            if index not in counted:
                counted.add(index)
                input_tokens += increment
    completion = sum(int(call["usage"]["completion_tokens"]) for call in calls if "usage" in call)
    return {
        "num_input_tokens": input_tokens,
        "num_output_tokens": output_tokens,
        "num_total_tokens": input_tokens + completion,
    }


def _episode_tokens(traces: Sequence[Mapping[str, Any]]) -> dict[str, int]:
    return {
        key: sum(int(trace[key]) for trace in traces)
        for key in ("num_input_tokens", "num_output_tokens", "num_total_tokens")
    }


# =====================================================================================
# Waiting for the tree
# =====================================================================================


@dataclass(frozen=True)
class SpanTree:
    """An episode span with every descendant that arrived for it.

    ``complete`` is ``False`` when the memory bound forced the episode out
    early, with spans that might have belonged to it still missing.
    """

    root: UnrecordedEpisode
    spans: tuple[SpanView, ...]
    complete: bool = True


@dataclass
class BufferStats:
    """What the buffer could not keep whole: each count is of spans or
    episodes that reached the platform incomplete, or not at all."""

    #: Episodes synthesised without all of their spans: forced out by the
    #: memory bound, or a descendant arrived after the episode was released.
    incomplete_episodes: int = 0
    #: Spans that arrived after their episode was already synthesised.
    late_spans: int = 0
    #: Model-call spans under no episode span within the wait.
    unclaimed_model_calls: int = 0
    #: Spans dropped to stay within the memory bound.
    evicted_spans: int = 0
    #: Episodes whose model calls carried no messages (content capture off in
    #: the instrumentation): their records have usage but no conversation.
    episodes_without_messages: int = 0


@dataclass
class _TraceState:
    spans: dict[int, SpanView] = field(default_factory=dict)
    #: Held span ids by parent id, kept as spans come and go, so finding an
    #: episode's tree costs its own size, not a scan of the whole trace.
    children: dict[int, set[int]] = field(default_factory=dict)
    roots: dict[int, tuple[UnrecordedEpisode, float]] = field(default_factory=dict)
    last_seen: float = 0.0
    #: The trace's root span arrived while spans end children first (in the
    #: producer's process): nothing more can come under it.
    closed: bool = False
    #: Attribute values of the held spans (see :func:`_weight`).
    values: int = 0

    def hold(self, view: SpanView) -> bool:
        """Hold ``view``; ``True`` when its id was not held before."""
        previous = self.spans.get(view.span_id)
        if previous is not None:
            self._unlink(previous)
            self.values -= _weight(previous)
        self.spans[view.span_id] = view
        self.values += _weight(view)
        if view.parent_span_id is not None:
            self.children.setdefault(view.parent_span_id, set()).add(view.span_id)
        return previous is None

    def let_go(self, span_id: int) -> bool:
        view = self.spans.pop(span_id, None)
        if view is None:
            return False
        self._unlink(view)
        self.values -= _weight(view)
        return True

    def subtree(self, root_id: int) -> list[int]:
        """Ids of the held spans under ``root_id`` (through held spans only);
        parent links that loop are followed once."""
        found: list[int] = []
        seen = {root_id}
        stack = list(self.children.get(root_id, ()))
        while stack:
            current = stack.pop()
            if current in seen:
                continue
            seen.add(current)
            found.append(current)
            stack.extend(self.children.get(current, ()))
        return found

    def _unlink(self, view: SpanView) -> None:
        if view.parent_span_id is None:
            return
        siblings = self.children.get(view.parent_span_id)
        if siblings is not None:
            siblings.discard(view.span_id)
            if not siblings:
                del self.children[view.parent_span_id]


def _weight(view: SpanView) -> int:
    """What holding ``view`` costs, in attribute values: a decoded attribute
    takes about a hundred bytes however small it was on the wire, so the
    count of them is what bounds the buffer's memory, more than spans are."""
    return 1 + len(view.attributes) + sum(len(event.attributes) for event in view.events)


#: What a released span id stands for: the episode it was synthesised into
#: (a late straggler of it is counted), or nothing (a native episode's child).
_Released = tuple[int, int] | None


class SpanTreeBuffer:
    """Spans held by trace id until each episode span's tree is in.

    In the producer's own process the SDK exports a span once it has ended,
    and a parent ends after its children, so an episode span's tree is whole
    when the episode span arrives: ``settle_seconds=0`` releases it then.
    Behind a collector batches arrive in any order, so a positive
    ``settle_seconds`` holds each episode that long for its stragglers; one
    that still comes later is counted (``late_spans``, and its episode in
    ``incomplete_episodes``). Spans of traces without an episode span are let
    go after ``max_wait_seconds`` of silence, and at most ``max_spans`` are
    held: when full, the oldest trace goes first, its episodes released as
    they are.

    ``root_traces_as_episodes`` is for plain instrumented code that marks no
    episodes: each root span whose trace holds model calls becomes an episode
    of its own (numbered as example 0, 1, 2, ... in the order they are released),
    synthesised like any other; a root trace without model calls is no episode.
    """

    #: Released span ids remembered, to tell a late straggler from a span
    #: that belongs to nothing.
    _MAX_REMEMBERED = 200_000
    #: Runs already told that their model calls carry no messages.
    _MAX_WARNED_RUNS = 1_000

    def __init__(
        self,
        *,
        settle_seconds: float = 0.0,
        max_wait_seconds: float = 60.0,
        max_spans: int = 100_000,
        max_values: int = DEFAULT_MAX_HELD_VALUES,
        clock: Callable[[], float] = time.monotonic,
        root_traces_as_episodes: bool = False,
    ) -> None:
        if settle_seconds < 0 or max_wait_seconds < 0 or max_spans < 1:
            raise ValueError("settle and wait times must be >= 0, and max_spans >= 1")
        self.settle_seconds = settle_seconds
        self.max_wait_seconds = max(max_wait_seconds, settle_seconds)
        self.max_spans = max_spans
        self.max_values = max_values
        self._values = 0
        self.stats = BufferStats()
        self._clock = clock
        self._traces: OrderedDict[int, _TraceState] = OrderedDict()
        self._held = 0
        self._forced: list[SpanTree] = []
        self._released: OrderedDict[tuple[int, int], _Released] = OrderedDict()
        self._incomplete: OrderedDict[tuple[int, int], None] = OrderedDict()
        self._warned_runs: OrderedDict[str, None] = OrderedDict()
        self.root_traces_as_episodes = root_traces_as_episodes
        self._root_traces: set[tuple[int, int]] = set()
        self._root_trace_count = 0

    def __len__(self) -> int:
        """Spans held now."""
        return self._held

    @property
    def pending_episodes(self) -> int:
        return sum(len(state.roots) for state in self._traces.values()) + len(self._forced)

    def held_episodes(self) -> list[UnrecordedEpisode]:
        """The episodes held now, so a consumer can keep back what must follow
        them (a run's end is delivered after its last episode)."""
        held = [episode for state in self._traces.values() for episode, _ in state.roots.values()]
        return held + [tree.root for tree in self._forced]

    # -- feeding --------------------------------------------------------------------

    def add(self, view: SpanView) -> None:
        """A span that is not a run event: a possible descendant of an episode."""
        if (view.trace_id, view.span_id) in self._released:
            return  # a copy of a span already used (a collector's retry): not late
        if self._late(view):
            return
        if view.parent_span_id is None and self.root_traces_as_episodes:
            self._add_root_trace(view)
            return
        state = self._state(view.trace_id)
        before = state.values
        if state.hold(view):
            self._held += 1
        if view.parent_span_id is None and self.settle_seconds == 0:
            state.closed = True
        self._values += state.values - before
        self._shrink()

    def _add_root_trace(self, view: SpanView) -> None:
        """A root span standing in for an episode span (``root_traces_as_episodes``)."""
        self._root_traces.add((view.trace_id, view.span_id))
        self.add_episode(UnrecordedEpisode(derived_episode_id(view), view))

    def add_episode(self, episode: UnrecordedEpisode) -> None:
        """An episode span whose record is to be synthesised."""
        view = episode.view
        if (view.trace_id, view.span_id) in self._released:
            return  # a copy of an episode already synthesised (a collector's retry)
        state = self._state(view.trace_id)
        state.roots.setdefault(view.span_id, (episode, self._clock()))

    def claim_native(self, view: SpanView) -> None:
        """An episode span that carried its own record: its descendants are
        for tracing backends only and need not wait here."""
        self._remember(view.trace_id, [view.span_id], None)
        state = self._traces.get(view.trace_id)
        if state is None:
            return
        members = state.subtree(view.span_id)
        self._drop(state, members)
        self._remember(view.trace_id, members, None)

    # -- releasing --------------------------------------------------------------------

    def release(self, *, flush: bool = False) -> list[SpanTree]:
        """Trees ready to be synthesised; with ``flush`` every episode held
        (the process is ending, or the caller cannot wait any longer)."""
        now = self._clock()
        ready, self._forced = self._forced, []
        for trace_id in list(self._traces):
            state = self._traces[trace_id]
            try:
                # Marked episodes first: a root trace standing in for an episode
                # keeps only what no marked episode under it claimed.
                held = sorted(
                    state.roots.items(), key=lambda item: (trace_id, item[0]) in self._root_traces
                )
                for span_id, (episode, arrived) in held:
                    if flush or now - arrived >= self.settle_seconds:
                        ready.append(self._take(trace_id, state, span_id, episode, complete=True))
                self._expire(trace_id, state, now, flush)
            except Exception as exc:
                # Spans are outside input: a trace that breaks the buffer is
                # let go whole, and every other trace goes on as before.
                ready.extend(self._evict(trace_id, f"{type(exc).__name__}: {exc}"))
        trees: list[SpanTree] = []
        for tree in ready:
            try:
                kept = self._as_episode(tree)
            except Exception as exc:
                logger.warning(
                    "Let go of the trace of span %016x: %s: %s",
                    tree.root.view.span_id,
                    type(exc).__name__,
                    shown(exc),
                )
                continue
            if kept is not None:
                trees.append(kept)
        return trees

    def _as_episode(self, tree: SpanTree) -> SpanTree | None:
        """A root trace is an episode only when it holds model calls; those
        are numbered as examples in the order they are released."""
        view = tree.root.view
        key = (view.trace_id, view.span_id)
        if key not in self._root_traces:
            return tree
        self._root_traces.discard(key)
        if not (is_model_call(view) or any(map(is_model_call, tree.spans))):
            return None
        numbered = replace(
            view, attributes={**view.attributes, sc.EPISODE_EXAMPLE_ID: self._root_trace_count}
        )
        self._root_trace_count += 1
        return replace(tree, root=UnrecordedEpisode(tree.root.episode_id, numbered))

    def _take(
        self,
        trace_id: int,
        state: _TraceState,
        span_id: int,
        episode: UnrecordedEpisode,
        *,
        complete: bool,
    ) -> SpanTree:
        del state.roots[span_id]
        members = state.subtree(span_id)
        spans = tuple(state.spans[member] for member in members)
        self._drop(state, members)
        self._remember(trace_id, [span_id, *members], (trace_id, span_id))
        if not complete:
            self._mark_incomplete((trace_id, span_id))
        self._check_content(episode, spans)
        return SpanTree(episode, spans, complete)

    def _check_content(self, episode: UnrecordedEpisode, spans: Sequence[SpanView]) -> None:
        """Model calls without messages make a record with usage and no
        conversation: the platform stores it, and nobody would notice. Said
        once per run, since every episode of the run will be the same."""
        calls = [view for view in (episode.view, *spans) if is_model_call(view)]
        if not calls or any(_carries_messages(view) for view in calls):
            return
        self.stats.episodes_without_messages += 1
        run = str(episode.view.resource.get(sc.RUN_ID) or "")
        if run in self._warned_runs:
            return
        self._warned_runs[run] = None
        while len(self._warned_runs) > self._MAX_WARNED_RUNS:
            self._warned_runs.popitem(last=False)
        logger.warning(
            "Run %s: episode %s has %d model call(s) and none carries its messages, so its "
            "record holds token usage but no prompts or completions. Turn on content capture "
            "in the instrumentation: %s=span_only (with %s=gen_ai_latest_experimental the "
            "GenAI instrumentations take only span_only, span_and_event, event_only or "
            "no_content, and `true` captures nothing). Said once per run.",
            run or "(no run)",
            episode.episode_id,
            len(calls),
            sc.CAPTURE_MESSAGE_CONTENT_ENV,
            sc.SEMCONV_STABILITY_OPT_IN_ENV,
        )

    def _expire(self, trace_id: int, state: _TraceState, now: float, flush: bool) -> None:
        if state.roots:
            return
        if (
            flush
            or state.closed
            or not state.spans
            or now - state.last_seen >= self.max_wait_seconds
        ):
            self.stats.unclaimed_model_calls += sum(map(is_model_call, state.spans.values()))
            self._held -= len(state.spans)
            self._values -= state.values
            del self._traces[trace_id]

    def _evict(self, trace_id: int, reason: str) -> list[SpanTree]:
        """Let a trace go whole; its waiting episodes go out without their
        spans (counted incomplete) rather than vanish."""
        state = self._traces.pop(trace_id, None)
        if state is None:
            return []
        self.stats.evicted_spans += len(state.spans)
        self._held -= len(state.spans)
        self._values -= state.values
        logger.warning(
            "Let go of trace %032x (%d held span(s), %d episode(s) waiting) that could not be "
            "processed: %s",
            trace_id,
            len(state.spans),
            len(state.roots),
            shown(reason),
        )
        trees = []
        for span_id, (episode, _) in state.roots.items():
            self._remember(trace_id, [span_id], (trace_id, span_id))
            self._mark_incomplete((trace_id, span_id))
            trees.append(SpanTree(episode, (), complete=False))
        return trees

    def _shrink(self) -> None:
        while (self._held > self.max_spans or self._values > self.max_values) and self._traces:
            trace_id, state = next(iter(self._traces.items()))
            for span_id, (episode, _) in list(state.roots.items()):
                self._forced.append(self._take(trace_id, state, span_id, episode, complete=False))
            self.stats.evicted_spans += len(state.spans)
            self._held -= len(state.spans)
            self._values -= state.values
            del self._traces[trace_id]

    # -- bookkeeping --------------------------------------------------------------------

    def _state(self, trace_id: int) -> _TraceState:
        state = self._traces.get(trace_id)
        if state is None:
            state = self._traces[trace_id] = _TraceState()
        else:
            self._traces.move_to_end(trace_id)
        state.last_seen = self._clock()
        return state

    def _late(self, view: SpanView) -> bool:
        """Whether ``view`` hangs under an episode already released."""
        parent = view.parent_span_id
        if parent is None or (view.trace_id, parent) not in self._released:
            return False
        episode = self._released[(view.trace_id, parent)]
        if episode is not None:
            self.stats.late_spans += 1
            self._mark_incomplete(episode)
        self._remember(view.trace_id, [view.span_id], episode)
        return True

    def _mark_incomplete(self, episode: tuple[int, int]) -> None:
        if episode in self._incomplete:
            return
        self._incomplete[episode] = None
        self.stats.incomplete_episodes += 1
        while len(self._incomplete) > self._MAX_REMEMBERED:
            self._incomplete.popitem(last=False)

    def _remember(self, trace_id: int, span_ids: Iterable[int], episode: _Released) -> None:
        for span_id in span_ids:
            self._released[(trace_id, span_id)] = episode
        while len(self._released) > self._MAX_REMEMBERED:
            self._released.popitem(last=False)

    def _drop(self, state: _TraceState, members: Iterable[int]) -> None:
        before = state.values
        for member in members:
            if state.let_go(member):
                self._held -= 1
        self._values -= before - state.values


_MESSAGE_PREFIXES = (
    sc.GEN_AI_INPUT_MESSAGES,
    sc.GEN_AI_OUTPUT_MESSAGES,
    "llm.input_messages.",
    "llm.output_messages.",
    _OPENLLMETRY_PROMPT + ".",
    _OPENLLMETRY_COMPLETION + ".",
)


def _carries_messages(view: SpanView) -> bool:
    return any(key.startswith(_MESSAGE_PREFIXES) for key in view.attributes)


# =====================================================================================
# Small readers
# =====================================================================================


def _mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else _EMPTY


_whole = whole_number


def _number(value: Any) -> float | None:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        number = float(value)
        return number if math.isfinite(number) else None
    return None


def _seconds(nanoseconds: int) -> float:
    return nanoseconds / 1_000_000_000 if nanoseconds > 0 else 0.0
