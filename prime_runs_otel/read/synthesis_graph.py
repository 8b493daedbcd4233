"""One synthesised trace's model calls: their message graph (grown call by
call, so a multi-turn conversation is one branch and a retry a second),
their timing, and the token totals verifiers computes from them.

Apart from :mod:`.synthesis`, which decides which spans make which trace,
because this answers "what do these calls add up to", the part of a record
that must count exactly as verifiers counts.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .._message_graph import message_node
from .dialects.calls import call_model, call_usage
from .dialects.messages import Exchange
from .spans import SpanView
from .synthesis_scores import span_error

__all__ = [
    "MessageGraph",
    "ModelCall",
    "episode_tokens",
    "seconds",
    "trace_timing",
    "trace_tokens",
]


@dataclass
class ModelCall:
    """A model-call span and the exchange its dialect reads off it."""

    view: SpanView
    exchange: Exchange


class MessageGraph:
    """The message graph of one trace, grown call by call: a call's input
    messages follow the existing path as far as they match it, so a multi-turn
    conversation is one branch and a retry or a fork is a second one."""

    def __init__(self) -> None:
        self.nodes: list[dict[str, Any]] = []
        self.tools: list[dict[str, Any]] = []
        self._children: dict[int | None, list[int]] = {}

    def add(self, call: ModelCall) -> dict[str, Any]:
        view, exchange = call.view, call.exchange
        start, end = seconds(view.start_ns), seconds(view.end_ns)
        self._add_tools(exchange.tools)
        parent: int | None = None
        for message in exchange.inputs or ():
            parent = self._child(parent, message, start, sampled=False, tools=exchange.tools)
        record: dict[str, Any] = {}
        if exchange.output is not None and not view.status_error:
            node = self._append(parent, exchange.output, end, sampled=True, tools=exchange.tools)
            record["node"] = node
        model = call_model(view.attributes)
        if model:
            record["model"] = model
        if exchange.finish_reason:
            record["finish_reason"] = exchange.finish_reason
        usage = call_usage(view.attributes)
        if usage is not None:
            record["usage"] = usage
        record["time"] = {"start": start, "end": max(start, end)}
        error = span_error(view)
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


def trace_timing(view: SpanView, calls: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    start, end = seconds(view.start_ns), seconds(view.end_ns)
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


def trace_tokens(
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


def episode_tokens(traces: Sequence[Mapping[str, Any]]) -> dict[str, int]:
    return {
        key: sum(int(trace[key]) for trace in traces)
        for key in ("num_input_tokens", "num_output_tokens", "num_total_tokens")
    }


def seconds(nanoseconds: int) -> float:
    return nanoseconds / 1_000_000_000 if nanoseconds > 0 else 0.0
