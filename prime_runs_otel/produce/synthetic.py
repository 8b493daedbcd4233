"""Synthetic episode records for the demo, the tests and the benchmarks.

The records have the exact shape of a verifiers v1 ``Episode.to_record()`` (every
default spelled out, ``None`` fields left out), so a record validated by verifiers and
dumped again comes back unchanged. That matters because the exporter treats records
as canonical: a synthetic record that only *looked* right would let projection bugs
hide behind defaults the validator fills in.

Everything is derived from ``(index, seed)`` alone, so a benchmark or a failing test
can regenerate the very episode it saw; only the dates move when asked to
(``ending_at``), so that a demo run shows up in a tracing backend's "last hour"
view instead of on a fixed day in the past.
"""

from __future__ import annotations

import copy
import hashlib
import json
import random
import time
from collections.abc import Iterator
from typing import Any, Literal

from .._message_graph import message_node

__all__ = ["synthetic_episode", "synthetic_episodes"]

#: Every example is rolled out this many times, so rollout numbers climb above 1.
ROLLOUTS_PER_EXAMPLE = 4
#: 2026-01-01T00:00:00Z: timestamps look like a real run, not the epoch.
RUN_EPOCH = 1_767_225_600.0
#: Seconds between two episodes' starts: a run of N episodes spans about N times this.
EPISODE_SPACING = 7.25
SOLVER_MODEL = "qwen3-8b"
JUDGE_MODEL = "gpt-4.1-mini"
TASK_TYPE = "MathTask"
_VERIFIERS_VERSION = {"version": "0.4.0"}
_TASK_DEFAULTS: dict[str, Any] = {
    "skills": [],
    "network_allow": ["*"],
    "network_block": [],
    "artifacts": [],
    "artifact_max_bytes": 33_554_432,
    "timeout": {},
    "resources": {},
}
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
_PADDING = (
    "Let me double-check each step of the arithmetic before committing to an answer; "
    "carrying the tens digit matters here, and so does the order of operations. "
)
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
_NAMES = ("Amélie", "Kenji", "Zoë", "Olusegun", "Priya", "Søren", "Mateo", "Léa")
_ITEMS = ("apples", "notebooks", "marbles", "stamps", "tickets", "pencils")
_TRACEBACK = (
    "Traceback (most recent call last):\n"
    '  File "verifiers/v1/rollout.py", line 212, in run_agent\n'
    "    response = await client.complete(request)\n"
    '  File "verifiers/v1/clients/openai.py", line 88, in complete\n'
    "    raise ProviderTimeout(f'no response within {{timeout}}s')\n"
    "{type}: {message}\n"
)


def synthetic_episode(
    index: int,
    *,
    seed: int = 0,
    env: str = "gsm8k-demo",
    judge: bool = True,
    turns: int | None = None,
    error: bool | None = None,
    target_bytes: int | None = None,
    epoch: float = RUN_EPOCH,
) -> dict[str, Any]:
    """One realistic episode record: a multi-turn solver trace and, with ``judge``, a
    non-trainable judge trace grading it.

    ``turns`` and ``error`` pin what is otherwise drawn at random (about one episode in
    eight fails). ``target_bytes`` pads the solver's prompt until the record's compact
    JSON is that large, which is how benchmarks sweep record sizes; below the leanest
    realistic episode (about 3.5 KB: one turn, no tools, no judge) that shape is returned.
    ``epoch`` is when the run started (epoch seconds): episode ``index`` starts about
    ``index * EPISODE_SPACING`` seconds later.
    """
    if turns is not None and turns < 1:
        raise ValueError(f"turns must be at least 1, got {turns}")
    record = _episode(index, seed, env, judge, turns, error, epoch, compact=False)
    if target_bytes is None:
        return record
    if _json_size(record) > target_bytes:
        # Smaller than a typical episode was asked for: fall back to the leanest
        # realistic shape (one turn, no tools, no judge) before padding.
        record = _episode(index, seed, env, False, 1, error, epoch, compact=True)
    _pad_to(record, target_bytes)
    return record


def synthetic_episodes(
    count: int, *, seed: int = 0, ending_at: float | Literal["now"] | None = None, **kwargs: Any
) -> Iterator[dict[str, Any]]:
    """``count`` episodes in arrival order; the keyword arguments go to each one.

    ``ending_at`` (epoch seconds, or ``"now"``) dates the run so that its last
    episode ends about then: what a demo shown in a tracing backend wants, since
    those open on recent traces. Without it the dates are the fixed ones.
    """
    if ending_at is not None:
        end = time.time() if ending_at == "now" else float(ending_at)
        # An episode takes up to about a minute past its start (turns, judge).
        kwargs["epoch"] = float(int(end - count * EPISODE_SPACING - 60.0))
    for index in range(count):
        yield synthetic_episode(index, seed=seed, **kwargs)


def _episode(
    index: int,
    seed: int,
    env: str,
    judge: bool,
    turns: int | None,
    error: bool | None,
    epoch: float,
    *,
    compact: bool,
) -> dict[str, Any]:
    rng = random.Random(f"{seed}:{index}")
    failed = rng.random() < 0.125 if error is None else error
    solver_turns = turns if turns is not None else rng.randint(1, 4)
    problem = _problem(index)
    start = epoch + index * EPISODE_SPACING + round(rng.uniform(0.0, 3.0), 3)
    episode_id = _hex_id(seed, index, "episode")
    task = {"type": TASK_TYPE, "data": problem}
    solver = _solver_trace(seed, index, rng, task, solver_turns, failed, start, compact)
    traces = [solver]
    if judge and not failed:
        traces.append(_judge_trace(seed, index, rng, task, solver, start))
    record: dict[str, Any] = {
        "id": episode_id,
        "env": {"id": env, "name": env},
        "task": task,
        "group": {"id": _hex_id(seed, problem["idx"], "group")},
        "run": {"type": "eval", "id": _hex_id(seed, 0, "run"), "name": f"{env}-eval"},
        "ok": not failed,
        "is_timeout": False,
        "errors": solver["errors"],
        "traces": traces,
    }
    record.update(_token_totals(traces))
    return record


def _hex_id(seed: int, index: int, kind: str) -> str:
    return hashlib.sha256(f"{kind}:{seed}:{index}".encode()).hexdigest()[:32]


def _problem(index: int) -> dict[str, Any]:
    """A word problem; its idx repeats across the example's rollouts, and its text is
    drawn from the example's own generator so every rollout sees the same question."""
    example = index // ROLLOUTS_PER_EXAMPLE
    example_rng = random.Random(f"example:{example}")
    name = example_rng.choice(_NAMES)
    item = example_rng.choice(_ITEMS)
    first, second, price = (example_rng.randint(3, 90) for _ in range(3))
    answer = (first + second) * price
    question = (
        f"{name} buys {first} {item} on Monday and {second} more on Tuesday. "
        f"Each costs {price} cents. How many cents does {name} spend in total?"
    )
    return {
        "idx": example,
        "prompt": question,
        "system_prompt": "Solve the problem step by step. Put the final answer in \\boxed{}.",
        **copy.deepcopy(_TASK_DEFAULTS),
        "answer": str(answer),
        "source": "synthetic-gsm8k",
    }


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


def _solver_trace(
    seed: int,
    index: int,
    rng: random.Random,
    task: dict[str, Any],
    turns: int,
    failed: bool,
    start: float,
    compact: bool,
) -> dict[str, Any]:
    problem = task["data"]
    tools = [] if compact else [_CALCULATOR_TOOL, _LOOKUP_TOOL][: rng.choice((0, 1, 2))]
    clock = start + 1.5
    root = message_node({"role": "system", "content": problem["system_prompt"]}, None, clock)
    if tools:
        root = {"tools": copy.deepcopy(tools), **root}
    nodes = [root, message_node({"role": "user", "content": problem["prompt"]}, 0, clock)]
    calls: list[dict[str, Any]] = []
    prompt_tokens = 60 + len(problem["prompt"]) // 4
    answered_turns = turns - 1 if failed else turns
    for turn in range(answered_turns):
        last = turn == turns - 1
        completion_tokens = rng.randint(40, 400)
        message = _assistant_message(rng, problem, turn, last, bool(tools))
        finish = "tool_calls" if "tool_calls" in message else "stop"
        if last and rng.random() < 0.08:
            finish = "length"
        call_start = clock + round(rng.uniform(0.05, 0.4), 3)
        clock = call_start + round(completion_tokens / rng.uniform(40.0, 90.0), 3)
        nodes.append(message_node(message, len(nodes) - 1, clock, sampled=True))
        calls.append(_call(len(nodes) - 1, prompt_tokens, completion_tokens, finish, call_start))
        prompt_tokens += completion_tokens
        if not last:
            follow_up = _tool_result(message, rng) if "tool_calls" in message else _nudge()
            nodes.append(message_node(follow_up, len(nodes) - 1, clock))
            prompt_tokens += 30
    errors = []
    if failed:
        call_start = clock + 0.2
        clock = call_start + 30.0
        errors.append(_timeout_error(rng))
        failed_call = _call(None, prompt_tokens, 0, None, call_start)
        del failed_call["usage"]
        failed_call["error"] = dict(errors[0])
        calls.append(failed_call)
    rewards, metrics = _solver_scores(rng, nodes, failed, turns)
    trace = {
        "version": 1,
        "id": _hex_id(seed, index, "solver"),
        "verifiers": dict(_VERIFIERS_VERSION),
        "task": copy.deepcopy(task),
        "agent": _agent("solver", SOLVER_MODEL, True, max(turns, 4)),
        "tools": copy.deepcopy(tools),
        "nodes": nodes,
        "calls": calls,
        "mm_token_type_id_map": {},
        "request_rewrites": [],
        "response_rewrites": [],
        "rewards": rewards,
        "metrics": metrics,
        "info": {"seed": seed, "sampling_round": index % ROLLOUTS_PER_EXAMPLE},
        "extra_usage": [],
        "is_completed": True,
        "ok": not failed,
        "stop_condition": "error" if failed else _stop_condition(calls),
        "is_timeout": False,
        "errors": errors,
        "timing": _timing(start, clock, calls),
    }
    trace.update(_token_totals_of_chain(calls))
    return trace


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


def _judge_trace(
    seed: int,
    index: int,
    rng: random.Random,
    task: dict[str, Any],
    solver: dict[str, Any],
    start: float,
) -> dict[str, Any]:
    answer = solver["nodes"][-1]["message"].get("content", "")
    clock = solver["timing"]["scoring"]["start"]
    verdict = "CORRECT" if solver["rewards"]["correct"]["score"] else "INCORRECT"
    nodes = [
        message_node(
            {
                "role": "user",
                "content": f"Reference answer: {task['data']['answer']}\n"
                f"Candidate: {answer}\nReply CORRECT or INCORRECT.",
            },
            None,
            clock,
        ),
        message_node({"role": "assistant", "content": verdict}, 0, clock + 0.4, sampled=True),
    ]
    call = _call(1, 90 + len(answer) // 4, 2, "stop", clock)
    call["model"] = JUDGE_MODEL
    calls = [call]
    return {
        "version": 1,
        "id": _hex_id(seed, index, "judge"),
        "verifiers": dict(_VERIFIERS_VERSION),
        "task": copy.deepcopy(task),
        "agent": _agent("judge", JUDGE_MODEL, False, 1),
        "tools": [],
        "nodes": nodes,
        "calls": calls,
        "mm_token_type_id_map": {},
        "request_rewrites": [],
        "response_rewrites": [],
        "rewards": {},
        "metrics": {"agreement": 1.0 if rng.random() < 0.9 else 0.0},
        "info": {},
        "extra_usage": [],
        "is_completed": True,
        "ok": True,
        "stop_condition": "agent_completed",
        "is_timeout": False,
        "errors": [],
        "timing": _timing(clock - 1.5, clock + 0.4, calls),
        **_token_totals_of_chain(calls),
    }


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


def _token_totals(traces: list[dict[str, Any]]) -> dict[str, int]:
    keys = ("num_input_tokens", "num_output_tokens", "num_total_tokens")
    return {key: sum(trace[key] for trace in traces) for key in keys}


def _json_size(record: dict[str, Any]) -> int:
    return len(json.dumps(record, ensure_ascii=False, separators=(",", ":")).encode())


def _pad_to(record: dict[str, Any], target_bytes: int) -> None:
    """Grow the solver's user prompt until the compact JSON is ``target_bytes``. One
    measurement suffices: the padding is ASCII without escapes, so every character
    added is one byte."""
    missing = target_bytes - _json_size(record)
    if missing <= 0:
        return
    padding = (" " + _PADDING * (missing // len(_PADDING) + 1))[:missing]
    user = record["traces"][0]["nodes"][1]["message"]
    user["content"] += padding
