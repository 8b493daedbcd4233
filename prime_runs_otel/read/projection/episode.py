"""How every projection reads an episode record: which trace stands for the
episode, the key its rollouts are numbered under, and a trace's reward.

A record is a verifiers episode (``Episode.to_record()``): one or more
traces, each with its agent, its task and its rewards. The sample row, the
training step table and the run summary all pick the same summary trace and
weigh rewards the same way, so those choices are made here, once.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = [
    "Number",
    "rollout_key",
    "summary_trace_index",
    "task_data",
    "trainable",
    "weighted_reward",
]

Number = int | float


def summary_trace_index(record: Mapping[str, Any]) -> int:
    """The trace that stands for the episode in flat views: the first trainable one (the
    policy's own rollout), else the first (an all-judge episode still gets a row)."""
    for index, trace in enumerate(record.get("traces") or ()):
        if trainable(trace):
            return index
    return 0


def rollout_key(record: Mapping[str, Any]) -> Any:
    """The example id rollouts are numbered under: ``task.data.idx`` of the summary
    trace. Meaningful only for an episode with traces; others get no sample row."""
    traces = record.get("traces") or ()
    if not traces:
        return None
    return task_data(traces[summary_trace_index(record)]).get("idx")


def trainable(trace: Mapping[str, Any]) -> bool:
    return bool((trace.get("agent") or {}).get("trainable", True))


def task_data(trace: Mapping[str, Any]) -> Mapping[str, Any]:
    data: Mapping[str, Any] = (trace.get("task") or {}).get("data") or {}
    return data


def weighted_reward(rewards: Mapping[str, Any]) -> Number:
    """Sum of score times weight over the rewards that ran, added in the same order and with
    the same builtin ``sum`` verifiers uses, so the float is identical (0 when none ran)."""
    return sum(
        float(reward["score"]) * float(reward.get("weight", 1.0))
        for reward in rewards.values()
        if reward is not None
    )
