"""One episode of a run whole: its stored record read into its
conversation, rewards and metrics, as text a page can show.

Records come from producers and may hold anything: every field is taken
only in the shape expected and shown as text otherwise, a record that does
not parse says so, and a huge one is cut to what a page can hold (a byte
budget, counted as the page writes it), with the command that gives it
whole. Apart from the table (``episodes.py``) because this answers "what
does one record show", not "which rows does the run have".
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from .._json import loads as fast_loads
from ..deliver.spool import EpisodeFactsRow, RunRow, Spool

__all__ = [
    "MAX_BODY_BYTES",
    "MORE_BUDGET",
    "PAGE_BUDGET",
    "EpisodeDetail",
    "Message",
    "TraceView",
    "episode_detail",
]

#: Records larger than this are not read into a page.
MAX_BODY_BYTES = 16 * 1024 * 1024
#: Characters of one message shown; the rest is cut, and said so.
MAX_TEXT_CHARS = 20_000
#: Messages of one trace shown.
MAX_MESSAGES = 500
#: Traces of an episode, tool calls of a message, and rewards and metrics of
#: a trace shown at most.
MAX_TRACES = 50
MAX_TOOL_CALLS = 100
MAX_ENTRIES = 200
#: Bytes of text a page of an episode shows at most, counted as the page
#: writes them (escaped), with the markup around each piece: whatever the
#: record's shape, its page stays within this and a few KiB of layout.
PAGE_BUDGET = 1 << 20
#: The same with "show more".
MORE_BUDGET = 4 << 20


@dataclass(frozen=True)
class Message:
    """One node of a trace's conversation, as text to show."""

    index: int
    parent: int | None
    role: str
    content: str
    reasoning: str = ""
    #: ``(name, arguments)`` of each tool call the message makes.
    tool_calls: tuple[tuple[str, str], ...] = ()
    #: For a tool's answer: the call it answers.
    tool_call_id: str = ""
    sampled: bool = False
    #: The model call that wrote it: prompt, completion and cached tokens.
    usage: dict[str, int] = field(default_factory=dict)
    finish_reason: str = ""
    cut: int = 0  # characters left out
    more_calls: int = 0  # tool calls left out


@dataclass(frozen=True)
class TraceView:
    name: str
    model: str
    trainable: bool
    ok: bool
    reward: float | None
    rewards: dict[str, str]
    metrics: dict[str, str]
    messages: list[Message]
    #: Model calls that wrote no message (a failed call): their error.
    failed_calls: list[str]
    #: Each error with its traceback, when the record has one.
    errors: list[str]
    tools: list[str]
    more_messages: int = 0


@dataclass(frozen=True)
class EpisodeDetail:
    row: EpisodeFactsRow
    #: Why the record cannot be shown, if it cannot (with what to do).
    problem: str | None = None
    traces: list[TraceView] = field(default_factory=list)
    task: str = ""
    previous: str | None = None
    following: str | None = None
    size: int = 0
    more_traces: int = 0
    #: The page's budget, and whether the record needed more than it.
    budget: int = PAGE_BUDGET
    over_budget: bool = False


class _Budget:
    """What is left of a page's bytes: each text taken is cut to fit, and
    once nothing is left, nothing more is taken (and the page says so)."""

    #: The markup around a piece of text, at most (a message's box, a row).
    PIECE = 200
    #: What the page writes for one character at most: ``\u202e`` is six.
    WIDEST = 6

    def __init__(self, total: int) -> None:
        self.total = total
        self.left = total
        self.cut = False

    def take(self, text: str) -> tuple[str, int]:
        """``text`` cut to what is left, and the characters cut."""
        cost = _cost(text) + self.PIECE
        if cost <= self.left:
            self.left -= cost
            return text, 0
        self.cut = True
        room = max(0, self.left - self.PIECE) // self.WIDEST
        self.left = max(0, self.left - self.PIECE - room * self.WIDEST)
        return text[:room], len(text) - room

    def charge(self, cost: int) -> None:
        """Count markup written whatever the text (a message's box and meta)."""
        self.left = max(0, self.left - cost)

    @property
    def spent(self) -> bool:
        return self.left <= self.PIECE

    @property
    def over(self) -> bool:
        """Whether something was cut or left out for want of room."""
        return self.cut or self.spent


#: Characters that take more than their own bytes on a page: escaped
#: markup characters, and what is shown as a visible escape.
_WIDE = re.compile(
    "[&<>\"'\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]"
)


def _cost(text: str) -> int:
    """Bytes ``text`` takes on a page, at most."""
    return len(text.encode("utf-8", "surrogatepass")) + 5 * len(_WIDE.findall(text))


def episode_detail(
    spool: Spool, run: RunRow, episode_id: str, *, budget: int = PAGE_BUDGET
) -> EpisodeDetail | None:
    """``None`` when the run has no such episode. The texts shown fit in
    ``budget`` bytes of page, whatever the record holds."""
    found = spool.reading.episode(run.local_id, episode_id)
    if found is None:
        return None
    row, body = found
    previous, following = spool.reading.episode_neighbours(run.local_id, row.seq)
    detail = EpisodeDetail(row=row, previous=previous, following=following, budget=budget)
    export = f"prime-runs-otel export {run.local_id[:12]} --what episodes"
    if body is None:
        return replace(
            detail,
            problem="its record is no longer kept in the local store: it was delivered and its "
            "body dropped (PRIME_RUNS_OTEL_KEEP_DELIVERED off, `prune --bodies`, or the size "
            "cap made room). Its facts above are all that is left here; the platform has it.",
        )
    detail = replace(detail, size=len(body))
    if len(body) > MAX_BODY_BYTES:
        return replace(
            detail,
            problem=f"its record is {len(body) / 2**20:.1f} MiB, more than a page shows "
            f"({MAX_BODY_BYTES // 2**20} MiB). Download it below, or read it with `{export}`.",
        )
    try:
        record = fast_loads(body)
    except (ValueError, RecursionError) as exc:
        return replace(detail, problem=f"its stored record is damaged and cannot be read ({exc}).")
    if not isinstance(record, dict):
        return replace(detail, problem="its stored record is not a JSON object.")
    spending = _Budget(budget)
    task, _ = spending.take(_task(record))
    items = _list(record.get("traces"))
    traces = []
    for index, item in enumerate(items[:MAX_TRACES]):
        if spending.spent:
            break
        traces.append(_trace(item, index, spending))
    return replace(
        detail,
        traces=traces,
        task=task,
        more_traces=len(items) - len(traces),
        over_budget=spending.over,
    )


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def _map(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _text(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    if isinstance(value, list):  # content parts
        parts = []
        for part in value:
            part_map = _map(part)
            if isinstance(part_map.get("text"), str):
                parts.append(part_map["text"])
            else:
                parts.append(_json(part))
        return "\n".join(parts)
    return _json(value)


def _json(value: Any) -> str:
    try:
        return json.dumps(value, ensure_ascii=False, default=str)
    except (TypeError, ValueError, RecursionError):
        return repr(value)


def _cut(text: str) -> tuple[str, int]:
    if len(text) <= MAX_TEXT_CHARS:
        return text, 0
    return text[:MAX_TEXT_CHARS], len(text) - MAX_TEXT_CHARS


def _task(record: Mapping[str, Any]) -> str:
    traces = _list(record.get("traces"))
    task = _map(record.get("task")) or (_map(_map(traces[0]).get("task")) if traces else {})
    data = _map(task.get("data"))
    shown = {key: data[key] for key in ("idx", "prompt", "answer") if key in data}
    return _cut(_json(shown or data))[0] if (shown or data) else ""


def _entries(value: Any, spending: _Budget, shown: Any) -> dict[str, str]:
    """A mapping's first entries, as text, within the budget."""
    entries = {}
    for name, item in list(_map(value).items())[:MAX_ENTRIES]:
        if spending.spent:
            break
        key, _ = spending.take(_cut(str(name))[0])
        entries[key], _ = spending.take(_cut(shown(item))[0])
    return entries


def _trace(item: Any, index: int, spending: _Budget) -> TraceView:
    trace = _map(item)
    agent = _map(trace.get("agent"))
    config = _map(agent.get("config"))
    nodes = _list(trace.get("nodes"))
    produced: dict[int, Mapping[str, Any]] = {}
    failed_calls = []
    for call in _list(trace.get("calls")):
        call_map = _map(call)
        node = call_map.get("node")
        if isinstance(node, int) and not isinstance(node, bool):
            produced[node] = call_map
        elif call_map.get("error") is not None and not spending.spent:
            failed_calls.append(spending.take(_cut(_error_text(call_map.get("error")))[0])[0])
    errors = []
    for error in _list(trace.get("errors"))[:MAX_ENTRIES]:
        if spending.spent:
            break
        errors.append(spending.take(_cut(_error_text(error))[0])[0])
    messages = []
    for position, node in enumerate(nodes[:MAX_MESSAGES]):
        if spending.spent:
            break
        messages.append(_message(position, _map(node), produced.get(position), spending))
    tools = []
    for tool in _list(trace.get("tools"))[:MAX_ENTRIES]:
        name = _map(tool).get("name") or _map(_map(tool).get("function")).get("name") or "?"
        tools.append(spending.take(_cut(str(name))[0])[0])
    name, _ = spending.take(_cut(str(agent.get("name") or f"trace {index + 1}"))[0])
    model, _ = spending.take(_cut(str(config.get("model") or ""))[0])
    return TraceView(
        name=name,
        model=model,
        trainable=bool(agent.get("trainable", True)),
        ok=trace.get("ok", True) is True,
        reward=_reward(trace),
        rewards=_entries(trace.get("rewards"), spending, _score),
        metrics=_entries(trace.get("metrics"), spending, _json),
        messages=messages,
        failed_calls=failed_calls,
        errors=errors,
        tools=tools,
        more_messages=len(nodes) - len(messages),
    )


def _score(reward: Any) -> str:
    if reward is None:
        return "did not run"
    return f"{_map(reward).get('score')} (weight {_map(reward).get('weight', 1.0)})"


def _reward(trace: Mapping[str, Any]) -> float | None:
    total = 0.0
    for reward in _map(trace.get("rewards")).values():
        if reward is None:
            continue
        try:
            score, weight = _map(reward).get("score"), _map(reward).get("weight", 1.0)
            total += float(score) * float(weight)  # type: ignore[arg-type]
        except (TypeError, ValueError, OverflowError):
            return None
    return total if math.isfinite(total) else None


def _error_text(error: Any) -> str:
    """An error as its type and message, and its traceback below when the
    record has one."""
    error_map = _map(error)
    if not error_map:
        return _text(error)
    kind = error_map.get("type")
    message = error_map.get("message")
    head = ": ".join(str(part) for part in (kind, message) if part) or _json(error)
    trace = error_map.get("traceback") or error_map.get("stacktrace")
    return f"{head}\n\n{_text(trace)}" if trace else head


#: A message's box, its line of facts (role, tokens, the call it answers)
#: and its notes, at most.
_MESSAGE_MARKUP = 1200


def _message(
    position: int, node: Mapping[str, Any], call: Mapping[str, Any] | None, spending: _Budget
) -> Message:
    spending.charge(_MESSAGE_MARKUP)
    message = _map(node.get("message"))
    content, cut = _cut(_text(message.get("content")))
    content, over = spending.take(content)
    reasoning, more = _cut(_text(message.get("reasoning_content") or message.get("reasoning")))
    reasoning, further = spending.take(reasoning)
    calls = []
    tool_calls = _list(message.get("tool_calls"))
    for tool_call in tool_calls[:MAX_TOOL_CALLS]:
        if spending.spent:
            break
        tool_map = _map(tool_call)
        function = _map(tool_map.get("function"))
        name = tool_map.get("name") or function.get("name") or "?"
        arguments = tool_map.get("arguments", function.get("arguments", ""))
        calls.append(
            (spending.take(_cut(str(name))[0])[0], spending.take(_cut(_text(arguments))[0])[0])
        )
    usage = {
        str(key)[:40]: value
        for key, value in list(_map(_map(call).get("usage")).items())[:20]
        if isinstance(value, int) and not isinstance(value, bool)
    }
    parent = node.get("parent")
    return Message(
        index=position,
        parent=parent if isinstance(parent, int) and not isinstance(parent, bool) else None,
        role=str(message.get("role") or "?")[:40],
        content=content,
        reasoning=reasoning,
        tool_calls=tuple(calls),
        tool_call_id=str(message.get("tool_call_id") or "")[:200],
        sampled=node.get("sampled") is True,
        usage=usage,
        finish_reason=str(_map(call).get("finish_reason") or "")[:200],
        cut=cut + over + more + further,
        more_calls=len(tool_calls) - len(calls),
    )
