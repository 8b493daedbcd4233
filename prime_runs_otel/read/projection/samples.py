"""The legacy v0 sample rows of an eval run (``POST /evaluations/{id}/samples``),
as prime-runs' ``episode_to_samples`` makes them, and the request bodies
that carry them under the platform's size ceiling.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from .episode import summary_trace_index, task_data, weighted_reward
from .strict_json import encode, encode_finite, finite

__all__ = [
    "MAX_SAMPLES_PAYLOAD_BYTES",
    "SampleTooLargeError",
    "batch_sample_rows",
    "encode_sample_batches",
    "encode_samples_body",
    "episode_sample_rows",
]

#: The platform's ceiling on one ``POST /evaluations/{id}/samples`` request body.
MAX_SAMPLES_PAYLOAD_BYTES = 25 * 1024 * 1024
_ENVELOPE_BYTES = len(b'{"samples":[]}')
#: Stop conditions verifiers counts as hitting a framework limit (``Trace.is_truncated``).
_TRUNCATING_STOPS = frozenset(
    {
        "max_turns",
        "max_input_tokens",
        "max_output_tokens",
        "max_total_tokens",
        "compaction_failed",
    }
)


class SampleTooLargeError(ValueError):
    """A sample row exceeds the request ceiling on its own.

    Raised instead of dropping the row: a silently missing rollout skews every average
    on the dashboard, while an error here is counted and reported as a loss.
    """


def _branch_paths(nodes: Sequence[Mapping[str, Any]]) -> list[list[int]]:
    """Root-to-leaf node indices, one per leaf in node order: verifiers' branches."""
    parents = {node.get("parent") for node in nodes}
    paths = []
    for leaf in range(len(nodes)):
        if leaf in parents:
            continue
        path = []
        current: int | None = leaf
        while current is not None:
            path.append(current)
            current = nodes[current].get("parent")
        path.reverse()
        paths.append(path)
    return paths


def _input_tokens(usage: Mapping[str, Any]) -> int:
    fed: int = usage["prompt_tokens"] + (usage.get("cached_input_tokens") or 0)
    return fed


def _branch_entry(
    nodes: Sequence[Mapping[str, Any]], path: list[int], calls_by_node: Mapping[int, Any]
) -> dict[str, Any]:
    """One trajectory entry. Input tokens are each call's prompt beyond the previous
    call's whole sequence (never negative), so shared history is not counted again."""
    input_tokens = output_tokens = previous_total = 0
    for index in path:
        call = calls_by_node.get(index)
        usage = call.get("usage") if call is not None else None
        if usage is None:
            continue
        fed = _input_tokens(usage)
        input_tokens += max(0, fed - previous_total)
        output_tokens += usage["completion_tokens"]
        previous_total = fed + usage["completion_tokens"]
    return {
        "messages": [nodes[index]["message"] for index in path],
        "num_input_tokens": input_tokens,
        "num_output_tokens": output_tokens,
    }


def _token_usage(calls: Sequence[Mapping[str, Any]]) -> dict[str, Any] | None:
    """Usage summed over every call that reported it; an optional counter is present
    when at least one call reported it, so one silent provider does not erase it."""
    usages = [usage for call in calls if (usage := call.get("usage")) is not None]
    if not usages:
        return None
    total: dict[str, Any] = {
        "prompt_tokens": sum(usage["prompt_tokens"] for usage in usages),
        "completion_tokens": sum(usage["completion_tokens"] for usage in usages),
    }
    for name in ("cached_input_tokens", "reasoning_tokens"):
        reported = [usage[name] for usage in usages if usage.get(name) is not None]
        if reported:
            total[name] = sum(reported)
    costs = [float(usage["cost"]) for usage in usages if usage.get("cost") is not None]
    if costs:
        total["cost"] = sum(costs)
    return total


def _is_truncated(trace: Mapping[str, Any], calls: Sequence[Mapping[str, Any]]) -> bool:
    """A framework limit stopped the trace, or its last successful call ran out of length."""
    stop = trace.get("stop_condition")
    if isinstance(stop, str) and stop in _TRUNCATING_STOPS:
        return True
    for call in reversed(calls):
        if call.get("error") is None:
            return call.get("finish_reason") == "length"
    return False


def _trace_row(trace: Mapping[str, Any], rollout_number: int, episode_id: Any) -> dict[str, Any]:
    """One trace as a v0 sample row, non-finite values not yet nulled."""
    nodes = trace.get("nodes") or ()
    calls = trace.get("calls") or ()
    calls_by_node = {call["node"]: call for call in calls if call.get("node") is not None}
    trajectory = [_branch_entry(nodes, path, calls_by_node) for path in _branch_paths(nodes)]
    task = task_data(trace)
    agent = trace.get("agent") or {}
    rewards = trace.get("rewards") or {}
    errors = trace.get("errors") or ()
    metrics = trace.get("metrics") or {}
    row: dict[str, Any] = {
        "sample_id": trace.get("id"),
        "example_id": task.get("idx"),
        "rollout_number": rollout_number,
        "episode_id": episode_id,
        "agent": agent.get("name", "agent"),
        "trainable": agent.get("trainable", True),
        "task": task,
        "prompt": [],
        "completion": trajectory[-1]["messages"] if trajectory else [],
        "answer": task.get("answer"),
        "tool_defs": trace.get("tools") or None,
        "reward": weighted_reward(rewards),
        "timing": trace.get("timing") or {},
        "is_completed": trace.get("is_completed", False),
        "is_truncated": _is_truncated(trace, calls),
        "metrics": {name: _as_float(value) for name, value in metrics.items()},
        "error": errors[-1] if errors else None,
        "stop_condition": trace.get("stop_condition"),
        "trajectory": trajectory,
        "token_usage": _token_usage(calls),
        "info": dict(trace.get("info") or {}) or None,
    }
    for name, reward in rewards.items():
        if reward is not None:
            row.setdefault(name, float(reward["score"]))
    return row


def _as_float(value: Any) -> Any:
    """Metric values are floats on the verifiers side even when a record spells ``1``."""
    return float(value) if isinstance(value, int) and not isinstance(value, bool) else value


def episode_sample_rows(record: Mapping[str, Any], rollout_number: int) -> list[dict[str, Any]]:
    """The episode's v0 sample rows, as prime-runs' ``episode_to_samples`` makes them.

    Normally one row: the summary trace's projection keyed by the episode id, carrying
    the whole record in ``info.native_wrapper`` so nothing is lost in the flat table. A
    row over the request ceiling falls back to one projection per trace (without the
    wrapper), which is the most of the episode the table can still hold. No traces, no
    rows: there is nothing to show.
    """
    traces = record.get("traces") or ()
    if not traces:
        return []
    index = summary_trace_index(record)
    episode_id = record.get("id")
    row = _trace_row(traces[index], rollout_number, episode_id)
    row["sample_id"] = episode_id
    row["info"] = {**(row["info"] or {}), "native_wrapper": record, "native_trace_index": index}
    row, encoded = encode_finite(row)
    if _ENVELOPE_BYTES + len(encoded) <= MAX_SAMPLES_PAYLOAD_BYTES:
        return [row]
    return [finite(_trace_row(trace, rollout_number, episode_id)) for trace in traces]


def batch_sample_rows(rows: Sequence[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    """Rows grouped into request bodies under the ceiling, in order.

    Raises :class:`SampleTooLargeError` for a row that cannot be sent even alone.
    """
    encoded = [encode(row) for row in rows]
    return [list(rows[start:end]) for start, end in _batch_bounds(rows, encoded)]


def encode_sample_batches(rows: Sequence[dict[str, Any]]) -> list[bytes]:
    """The request bodies for ``rows``: ``encode_samples_body`` of each batch
    ``batch_sample_rows`` makes, byte for byte, with every row encoded once instead of
    once to batch and again to send."""
    encoded = [encode(row) for row in rows]
    return [
        b'{"samples":[' + b",".join(encoded[start:end]) + b"]}"
        for start, end in _batch_bounds(rows, encoded)
    ]


def _batch_bounds(
    rows: Sequence[Mapping[str, Any]], encoded: Sequence[bytes]
) -> list[tuple[int, int]]:
    """Greedy ``[start, end)`` spans of rows whose body stays under the ceiling."""
    spans: list[tuple[int, int]] = []
    start = 0
    body_bytes = _ENVELOPE_BYTES
    for position, row_json in enumerate(encoded):
        row_bytes = len(row_json)
        if _ENVELOPE_BYTES + row_bytes > MAX_SAMPLES_PAYLOAD_BYTES:
            raise SampleTooLargeError(_too_large_message(position, rows[position], row_bytes))
        joined = body_bytes + (1 if position > start else 0) + row_bytes  # 1: the comma
        if position > start and joined > MAX_SAMPLES_PAYLOAD_BYTES:
            spans.append((start, position))
            start, joined = position, _ENVELOPE_BYTES + row_bytes
        body_bytes = joined
    if start < len(encoded):
        spans.append((start, len(encoded)))
    return spans


def _too_large_message(position: int, row: Mapping[str, Any], row_bytes: int) -> str:
    return (
        f"sample row {position} (episode {row.get('episode_id')!r}, sample "
        f"{row.get('sample_id')!r}) is {_ENVELOPE_BYTES + row_bytes} bytes as a request, over "
        f"the platform's {MAX_SAMPLES_PAYLOAD_BYTES}-byte limit for "
        "POST /evaluations/{id}/samples even on its own. Shrink the trace (for example "
        "drop large tool outputs or info fields) or rely on Prime Traces, which accepts "
        "lines up to 64 MiB."
    )


def encode_samples_body(rows: Sequence[dict[str, Any]]) -> bytes:
    """The exact request body ``{"samples": [...]}`` for one batch."""
    return encode({"samples": list(rows)})
