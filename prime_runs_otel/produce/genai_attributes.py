"""The GenAI attributes a record can fill, read from it once for every signal
that carries them: agent and model-call spans, their log events, the GenAI
client metrics.

Only what the record holds is written. The provider comes from an agent
config that names one, else from the API path a call went to (verifiers
records it as ``endpoint``: ``/chat/completions`` is OpenAI's API, whoever
serves it, which is what ``gen_ai.provider.name`` tells apart); without
either it is left out, not guessed. A record keeps the model requested, not
the one that answered, so ``gen_ai.response.model`` is never set.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any
from urllib.parse import urlsplit

from .. import semconv as sc
from ._fields import Attributes, as_mapping, as_number, is_int, put_int, put_str

__all__ = [
    "call_provider",
    "operation_of",
    "put_request_params",
    "put_server",
    "put_tool_description",
    "put_usage",
    "tool_definitions",
    "trace_provider",
]

#: API paths verifiers records (``ModelCall.endpoint``) → the provider whose
#: API they are. Suffix matches, so a base URL's path prefix does not matter.
_PROVIDER_OF_PATH = (
    ("/chat/completions", "openai"),
    ("/responses", "openai"),
    ("/completions", "openai"),
    ("/messages", "anthropic"),
)
_DEFAULT_PORTS = {"https": 443, "http": 80}


def _explicit_provider(agent: Mapping[str, Any]) -> str | None:
    provider = agent.get("provider") or as_mapping(agent.get("config")).get("provider")
    return provider if isinstance(provider, str) and provider else None


def call_provider(agent: Mapping[str, Any], call: Mapping[str, Any]) -> str | None:
    """The provider of one model call: the agent config's, else its endpoint's."""
    explicit = _explicit_provider(agent)
    if explicit is not None:
        return explicit
    endpoint = call.get("endpoint")
    if isinstance(endpoint, str):
        path = endpoint.rstrip("/")
        for suffix, provider in _PROVIDER_OF_PATH:
            if path.endswith(suffix):
                return provider
    return None


def trace_provider(agent: Mapping[str, Any], calls: Sequence[Any]) -> str | None:
    """An agent's provider: the agent config's, else the one all its calls share."""
    explicit = _explicit_provider(agent)
    if explicit is not None:
        return explicit
    found = {call_provider(agent, as_mapping(call)) for call in calls}
    return found.pop() if len(found) == 1 else None


def operation_of(call: Mapping[str, Any]) -> str:
    """``text_completion`` for the legacy completions API, else ``chat``."""
    endpoint = call.get("endpoint")
    path = endpoint.rstrip("/") if isinstance(endpoint, str) else ""
    if path.endswith("/completions") and not path.endswith("/chat/completions"):
        return sc.OPERATION_TEXT_COMPLETION
    return sc.OPERATION_CHAT


def put_request_params(attributes: Attributes, sampling: Any) -> None:
    """The request parameters a ``sampling`` mapping holds (verifiers'
    ``SamplingConfig``, whose provider-specific keys pass through)."""
    params = as_mapping(sampling)
    if not params:
        return
    for key, name in _FLOAT_PARAMS:
        value = as_number(params.get(key))
        if value is not None:
            attributes[name] = value
    put_int(attributes, sc.GEN_AI_REQUEST_MAX_TOKENS, params.get("max_tokens"))
    if sc.GEN_AI_REQUEST_MAX_TOKENS not in attributes:
        put_int(attributes, sc.GEN_AI_REQUEST_MAX_TOKENS, params.get("max_completion_tokens"))
    put_int(attributes, sc.GEN_AI_REQUEST_SEED, params.get("seed"))
    choices = params.get("n")
    if is_int(choices) and choices != 1:
        attributes[sc.GEN_AI_REQUEST_CHOICE_COUNT] = int(choices)
    stop = params.get("stop")
    if isinstance(stop, str) and stop:
        attributes[sc.GEN_AI_REQUEST_STOP_SEQUENCES] = (stop,)
    elif isinstance(stop, list) and stop and all(isinstance(item, str) for item in stop):
        attributes[sc.GEN_AI_REQUEST_STOP_SEQUENCES] = tuple(stop)


_FLOAT_PARAMS = (
    ("temperature", sc.GEN_AI_REQUEST_TEMPERATURE),
    ("top_p", sc.GEN_AI_REQUEST_TOP_P),
    ("top_k", sc.GEN_AI_REQUEST_TOP_K),
    ("frequency_penalty", sc.GEN_AI_REQUEST_FREQUENCY_PENALTY),
    ("presence_penalty", sc.GEN_AI_REQUEST_PRESENCE_PENALTY),
)


def put_server(attributes: Attributes, agent: Mapping[str, Any]) -> None:
    """``server.address`` and ``server.port`` from the agent config's client
    (``client.base_url``), when the record keeps one."""
    client = as_mapping(as_mapping(agent.get("config")).get("client"))
    base_url = client.get("base_url")
    if not isinstance(base_url, str) or not base_url:
        return
    try:
        parts = urlsplit(base_url)
        port = parts.port or _DEFAULT_PORTS.get(parts.scheme)
    except ValueError:
        return
    if parts.hostname:
        attributes[sc.SERVER_ADDRESS] = parts.hostname
        if port is not None:
            attributes[sc.SERVER_PORT] = port


def put_usage(attributes: Attributes, usage: Mapping[str, Any]) -> None:
    """Token counts in the GenAI shape: input tokens include cache reads
    (verifiers keeps them apart: ``prompt_tokens`` excludes them)."""
    prompt, cached = usage.get("prompt_tokens"), usage.get("cached_input_tokens")
    if is_int(prompt):
        attributes[sc.GEN_AI_USAGE_INPUT_TOKENS] = int(prompt) + (
            int(cached) if is_int(cached) else 0
        )
    put_int(attributes, sc.GEN_AI_USAGE_OUTPUT_TOKENS, usage.get("completion_tokens"))
    put_int(attributes, sc.GEN_AI_USAGE_CACHE_READ_INPUT_TOKENS, cached)
    put_int(attributes, sc.GEN_AI_USAGE_REASONING_OUTPUT_TOKENS, usage.get("reasoning_tokens"))


def tool_definitions(trace: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The tools offered to the agent (the trace's ``tools``), in the
    conventions' shape: each needs a ``type`` and a ``name``, and keeps the
    rest of its declaration (description, parameters) as recorded."""
    tools = trace.get("tools")
    definitions = []
    for tool in tools if isinstance(tools, list) else ():
        declared = as_mapping(tool)
        name = declared.get("name")
        if not isinstance(name, str) or not name:
            continue
        definition = {key: value for key, value in declared.items() if value is not None}
        kind = declared.get("type")
        definition["type"] = kind if isinstance(kind, str) and kind else "function"
        definitions.append(definition)
    return definitions


def put_tool_description(attributes: Attributes, trace: Mapping[str, Any], name: str) -> None:
    """The declared description of tool ``name``, when the trace offered it."""
    tools = trace.get("tools")
    for tool in tools if isinstance(tools, list) else ():
        declared = as_mapping(tool)
        if declared.get("name") == name:
            put_str(attributes, sc.GEN_AI_TOOL_DESCRIPTION, declared.get("description"))
            return
