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
import json
import random
import time
from collections.abc import Iterator
from typing import Any, Literal

from .synthetic_traces import ROLLOUTS_PER_EXAMPLE, hex_id, judge_trace, solver_trace

__all__ = ["synthetic_episode", "synthetic_episodes"]

#: 2026-01-01T00:00:00Z: timestamps look like a real run, not the epoch.
RUN_EPOCH = 1_767_225_600.0
#: Seconds between two episodes' starts: a run of N episodes spans about N times this.
EPISODE_SPACING = 7.25
TASK_TYPE = "MathTask"
_TASK_DEFAULTS: dict[str, Any] = {
    "skills": [],
    "network_allow": ["*"],
    "network_block": [],
    "artifacts": [],
    "artifact_max_bytes": 33_554_432,
    "timeout": {},
    "resources": {},
}
_PADDING = (
    "Let me double-check each step of the arithmetic before committing to an answer; "
    "carrying the tens digit matters here, and so does the order of operations. "
)
_NAMES = ("Amélie", "Kenji", "Zoë", "Olusegun", "Priya", "Søren", "Mateo", "Léa")
_ITEMS = ("apples", "notebooks", "marbles", "stamps", "tickets", "pencils")


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
    episode_id = hex_id(seed, index, "episode")
    task = {"type": TASK_TYPE, "data": problem}
    solver = solver_trace(seed, index, rng, task, solver_turns, failed, start, compact)
    traces = [solver]
    if judge and not failed:
        traces.append(judge_trace(seed, index, rng, task, solver, start))
    record: dict[str, Any] = {
        "id": episode_id,
        "env": {"id": env, "name": env},
        "task": task,
        "group": {"id": hex_id(seed, problem["idx"], "group")},
        "run": {"type": "eval", "id": hex_id(seed, 0, "run"), "name": f"{env}-eval"},
        "ok": not failed,
        "is_timeout": False,
        "errors": solver["errors"],
        "traces": traces,
    }
    record.update(_token_totals(traces))
    return record


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
