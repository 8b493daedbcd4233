"""The traces of a synthetic episode: the solver's multi-turn conversation
(tool calls, a nudge, a timed-out last call when it fails) and the judge
that grades it, each shaped as a verifiers v1 trace record with every
default spelled out.

Apart from ``synthetic.py``, which decides what an episode is (its problem,
its dates, its padding), because these answer "what does one trace hold":
the model calls, their usage and timing, and the token totals verifiers
computes from them.
"""

from __future__ import annotations

import copy
import hashlib
import random
from dataclasses import dataclass, field
from typing import Any

from .._message_graph import message_node

#: Every example is rolled out this many times, so rollout numbers climb above 1.
ROLLOUTS_PER_EXAMPLE = 4
SOLVER_MODEL = "qwen3-8b"
JUDGE_MODEL = "gpt-4.1-mini"
_VERIFIERS_VERSION = {"version": "0.4.0"}
_RUNTIME = {
    "allow": ["*"],
    "block": [],
    "type": "prime",
    "image": "python:3.11-slim",
    "labels": [],
    "cpu": 1.0,
    "memory": 2.0,
    "disk": 5.0,
    "idle_timeout": 3600.0,
}
_CALCULATOR_TOOL: dict[str, Any] = {
    "type": "function",
    "name": "calculator",
    "description": "Evaluate an arithmetic expression and return the exact result.",
    "parameters": {
        "type": "object",
        "properties": {"expression": {"type": "string", "description": "e.g. 12 * (3 + 4)"}},
        "required": ["expression"],
    },
}
_LOOKUP_TOOL: dict[str, Any] = {
    "type": "function",
    "name": "unit_lookup",
    "description": "Convert between units of measure (km, mi, kg, lb, °C, °F).",
    "parameters": {
        "type": "object",
        "properties": {
            "value": {"type": "number"},
            "from_unit": {"type": "string"},
            "to_unit": {"type": "string"},
        },
        "required": ["value", "from_unit", "to_unit"],
    },
    "strict": True,
}
_SAMPLING = {"temperature": 0.7, "max_tokens": 2048}
_STEP_REASONING = (
    "The question gives two quantities bought on different days and one unit price. "
    "The total spend is the combined quantity times the price, so the quantities must "
    "be added before multiplying; multiplying first would double-count the price."
)
_TRACEBACK = (
    "Traceback (most recent call last):\n"
    '  File "verifiers/v1/rollout.py", line 212, in run_agent\n'
    "    response = await client.complete(request)\n"
    '  File "verifiers/v1/clients/openai.py", line 88, in complete\n'
    "    raise ProviderTimeout(f'no response within {{timeout}}s')\n"
    "{type}: {message}\n"
)


__all__ = [
    "JUDGE_MODEL",
    "ROLLOUTS_PER_EXAMPLE",
    "SOLVER_MODEL",
    "hex_id",
    "judge_trace",
    "solver_trace",
]


def hex_id(seed: int, index: int, kind: str) -> str:
    return hashlib.sha256(f"{kind}:{seed}:{index}".encode()).hexdigest()[:32]


def _agent(name: str, model: str, trainable: bool, max_turns: int) -> dict[str, Any]:
    return {
        "config": {
            "runtime": dict(_RUNTIME),
            "model": model,
            "sampling": dict(_SAMPLING),
            "max_turns": max_turns,
            "timeout": {},
            "retries": {"max_retries": 0, "rules": []},
            "network_notice": True,
        },
        "name": name,
        "trainable": trainable,
    }


@dataclass
class _Chat:
    """A solver's conversation as it grows: its message nodes, its model
    calls, the time of the last message and the prompt the next call feeds."""

    nodes: list[dict[str, Any]]
    clock: float
    prompt_tokens: int
    calls: list[dict[str, Any]] = field(default_factory=list)


def solver_trace(
    seed: int,
    index: int,
    rng: random.Random,
    task: dict[str, Any],
    turns: int,
    failed: bool,
    start: float,
    compact: bool,
) -> dict[str, Any]:
    """The trainable solver's trace: ``turns`` model calls, the last one
    timed out when ``failed``; without ``compact``, maybe a tool or two."""
    problem = task["data"]
    tools = [] if compact else [_CALCULATOR_TOOL, _LOOKUP_TOOL][: rng.choice((0, 1, 2))]
    chat = _opening(problem, tools, start + 1.5)
    for turn in range(turns - 1 if failed else turns):
        _answer(chat, rng, problem, turn, turn == turns - 1, bool(tools))
    errors = [_time_out(chat, rng)] if failed else []
    rewards, metrics = _solver_scores(rng, chat.nodes, failed, turns)
    return _trace_record(
        trace_id=hex_id(seed, index, "solver"),
        task=task,
        agent=_agent("solver", SOLVER_MODEL, True, max(turns, 4)),
        tools=tools,
        chat=chat,
        scores=(rewards, metrics),
        info={"seed": seed, "sampling_round": index % ROLLOUTS_PER_EXAMPLE},
        stop_condition="error" if failed else _stop_condition(chat.calls),
        errors=errors,
        timing=_timing(start, chat.clock, chat.calls),
    )


def _opening(problem: dict[str, Any], tools: list[dict[str, Any]], clock: float) -> _Chat:
    """The system prompt (with the tools offered, if any) and the question."""
    root = message_node({"role": "system", "content": problem["system_prompt"]}, None, clock)
    if tools:
        root = {"tools": copy.deepcopy(tools), **root}
    nodes = [root, message_node({"role": "user", "content": problem["prompt"]}, 0, clock)]
    return _Chat(nodes, clock, prompt_tokens=60 + len(problem["prompt"]) // 4)


def _answer(
    chat: _Chat, rng: random.Random, problem: dict[str, Any], turn: int, last: bool, tools: bool
) -> None:
    """One model call and its message; before the last, what answers it (a
    tool's result, or a nudge to go on)."""
    completion_tokens = rng.randint(40, 400)
    message = _assistant_message(rng, problem, turn, last, tools)
    finish = "tool_calls" if "tool_calls" in message else "stop"
    if last and rng.random() < 0.08:
        finish = "length"
    call_start = chat.clock + round(rng.uniform(0.05, 0.4), 3)
    chat.clock = call_start + round(completion_tokens / rng.uniform(40.0, 90.0), 3)
    chat.nodes.append(message_node(message, len(chat.nodes) - 1, chat.clock, sampled=True))
    node = len(chat.nodes) - 1
    chat.calls.append(_call(node, chat.prompt_tokens, completion_tokens, finish, call_start))
    chat.prompt_tokens += completion_tokens
    if not last:
        follow_up = _tool_result(message, rng) if "tool_calls" in message else _nudge()
        chat.nodes.append(message_node(follow_up, len(chat.nodes) - 1, chat.clock))
        chat.prompt_tokens += 30


def _time_out(chat: _Chat, rng: random.Random) -> dict[str, Any]:
    """The last call of a failed episode: no answer within the provider's
    timeout, so no usage and no message; returns its error."""
    call_start = chat.clock + 0.2
    chat.clock = call_start + 30.0
    error = _timeout_error(rng)
    failed_call = _call(None, chat.prompt_tokens, 0, None, call_start)
    del failed_call["usage"]
    failed_call["error"] = dict(error)
    chat.calls.append(failed_call)
    return error


def _trace_record(
    *,
    trace_id: str,
    task: dict[str, Any],
    agent: dict[str, Any],
    tools: list[dict[str, Any]],
    chat: _Chat,
    scores: tuple[dict[str, Any], dict[str, Any]],
    info: dict[str, Any],
    stop_condition: str,
    errors: list[dict[str, Any]],
    timing: dict[str, Any],
) -> dict[str, Any]:
    """A trace as verifiers v1 writes it, its keys in verifiers' order (a
    record dumped again must come back byte for byte)."""
    rewards, metrics = scores
    return {
        "version": 1,
        "id": trace_id,
        "verifiers": dict(_VERIFIERS_VERSION),
        "task": copy.deepcopy(task),
        "agent": agent,
        "tools": copy.deepcopy(tools),
        "nodes": chat.nodes,
        "calls": chat.calls,
        "mm_token_type_id_map": {},
        "request_rewrites": [],
        "response_rewrites": [],
        "rewards": rewards,
        "metrics": metrics,
        "info": info,
        "extra_usage": [],
        "is_completed": True,
        "ok": not errors,
        "stop_condition": stop_condition,
        "is_timeout": False,
        "errors": errors,
        "timing": timing,
        **_token_totals_of_chain(chat.calls),
    }


def _assistant_message(
    rng: random.Random, problem: dict[str, Any], turn: int, last: bool, has_tools: bool
) -> dict[str, Any]:
    if last:
        return {
            "role": "assistant",
            "content": f"Adding the two days and multiplying by the price gives "
            f"\\boxed{{{problem['answer'] if rng.random() < 0.7 else rng.randint(10, 9999)}}}.",
            "reasoning_content": "Sum the quantities first, then multiply by the unit price.",
        }
    if has_tools:
        call_id = f"call_{turn}_{rng.getrandbits(32):08x}"
        return {
            "role": "assistant",
            "content": "I'll compute the total with the calculator.",
            "reasoning_content": _STEP_REASONING,
            "tool_calls": [
                {
                    "id": call_id,
                    "type": "function",
                    "name": "calculator",
                    "arguments": f'{{"expression": "{rng.randint(1, 99)} * {rng.randint(1, 99)}"}}',
                }
            ],
        }
    return {
        "role": "assistant",
        "content": "First, the number of items bought over both days, then the cost.",
        "reasoning_content": _STEP_REASONING,
    }


def _tool_result(message: dict[str, Any], rng: random.Random) -> dict[str, Any]:
    call = message["tool_calls"][0]
    return {
        "role": "tool",
        "tool_call_id": call["id"],
        "content": str(rng.randint(1, 9801)),
        "name": call["name"],
    }


def _nudge() -> dict[str, Any]:
    return {"role": "user", "content": "Keep going — show the final answer in \\boxed{}."}


def _call(
    node: int | None,
    prompt_tokens: int,
    completion_tokens: int,
    finish_reason: str | None,
    start: float,
) -> dict[str, Any]:
    call: dict[str, Any] = {} if node is None else {"node": node}
    call["model"] = SOLVER_MODEL
    # What verifiers' interception server records of each call: the
    # effective sampling, and the API path the request went to.
    call["sampling"] = dict(_SAMPLING)
    call["endpoint"] = "/chat/completions"
    if finish_reason is not None:
        call["finish_reason"] = finish_reason
    cached = (prompt_tokens // 2) // 64 * 64
    call["usage"] = {
        "prompt_tokens": prompt_tokens - cached,
        "completion_tokens": completion_tokens,
        "cached_input_tokens": cached,
    }
    call["time"] = {"start": start, "end": round(start + 0.02 + completion_tokens / 60.0, 6)}
    return call


def _timeout_error(rng: random.Random) -> dict[str, Any]:
    message = f"no response within {rng.choice((60, 120, 300))}s"
    return {
        "type": "ProviderTimeout",
        "message": message,
        "traceback": _TRACEBACK.format(type="ProviderTimeout", message=message),
    }


def _solver_scores(
    rng: random.Random, nodes: list[dict[str, Any]], failed: bool, turns: int
) -> tuple[dict[str, Any], dict[str, Any]]:
    if failed:
        return {"correct": None, "format": None}, {"num_turns": float(turns), "judge_score": None}
    correct = 1.0 if "\\boxed" in nodes[-1]["message"].get("content", "") else 0.0
    correct = correct if rng.random() < 0.7 else 0.0
    rewards = {
        "correct": {"score": correct, "weight": 1.0},
        "format": {"score": round(rng.uniform(0.5, 1.0), 4), "weight": 0.2},
        "brevity": {"score": round(rng.uniform(0.0, 1.0), 4), "weight": 0.1},
    }
    metrics = {
        "num_turns": float(turns),
        "tool_calls": float(sum("tool_calls" in node["message"] for node in nodes)),
        "response_chars": float(len(nodes[-1]["message"].get("content", ""))),
    }
    return rewards, metrics


def _stop_condition(calls: list[dict[str, Any]]) -> str:
    return "max_output_tokens" if calls[-1].get("finish_reason") == "length" else "agent_completed"


def _timing(start: float, end: float, calls: list[dict[str, Any]]) -> dict[str, Any]:
    model = round(sum(call["time"]["end"] - call["time"]["start"] for call in calls), 6)
    agent_start = start + 1.5
    agent_duration = max(end - agent_start, model)
    return {
        "start": start,
        "boot": {"start": start, "end": start + 1.2},
        "setup": {"start": start + 1.2, "end": agent_start},
        "agent": {
            "start": agent_start,
            "end": agent_start + agent_duration,
            "model": {"duration": model},
            "harness": {"duration": agent_duration - model},
        },
        "finalize": {"start": end + 0.01, "end": end + 0.05},
        "scoring": {"start": end + 0.05, "end": end + 0.3},
    }


def judge_trace(
    seed: int,
    index: int,
    rng: random.Random,
    task: dict[str, Any],
    solver: dict[str, Any],
    start: float,
) -> dict[str, Any]:
    """The non-trainable judge's trace: one call grading the solver's last
    message against the reference answer."""
    answer = solver["nodes"][-1]["message"].get("content", "")
    clock = solver["timing"]["scoring"]["start"]
    verdict = "CORRECT" if solver["rewards"]["correct"]["score"] else "INCORRECT"
    question = (
        f"Reference answer: {task['data']['answer']}\n"
        f"Candidate: {answer}\nReply CORRECT or INCORRECT."
    )
    nodes = [
        message_node({"role": "user", "content": question}, None, clock),
        message_node({"role": "assistant", "content": verdict}, 0, clock + 0.4, sampled=True),
    ]
    call = _call(1, 90 + len(answer) // 4, 2, "stop", clock)
    call["model"] = JUDGE_MODEL
    chat = _Chat(nodes, clock + 0.4, prompt_tokens=0, calls=[call])
    agreement = 1.0 if rng.random() < 0.9 else 0.0
    return _trace_record(
        trace_id=hex_id(seed, index, "judge"),
        task=task,
        agent=_agent("judge", JUDGE_MODEL, False, 1),
        tools=[],
        chat=chat,
        scores=({}, {"agreement": agreement}),
        info={},
        stop_condition="agent_completed",
        errors=[],
        timing=_timing(clock - 1.5, clock + 0.4, chat.calls),
    )


def _token_totals_of_chain(calls: list[dict[str, Any]]) -> dict[str, int]:
    """Token counts of a single-branch trace, computed the way verifiers does: input
    is what each call adds beyond the previous call's whole sequence."""
    input_tokens = output_tokens = previous_total = 0
    for call in calls:
        usage = call.get("usage")
        if usage is None:
            continue
        fed = usage["prompt_tokens"] + usage.get("cached_input_tokens", 0)
        input_tokens += max(0, fed - previous_total)
        output_tokens += usage["completion_tokens"]
        previous_total = fed + usage["completion_tokens"]
    return {
        "num_input_tokens": input_tokens,
        "num_output_tokens": output_tokens,
        "num_total_tokens": input_tokens + output_tokens,
    }
