"""Synthetic records must be records verifiers itself would write, deterministic, varied
enough to exercise every projection path, and sized on request."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest

from prime_runs_otel.produce.synthetic import synthetic_episode, synthetic_episodes

Record = dict[str, Any]


@pytest.fixture(scope="session")
def round_trip() -> Callable[[Record], Record]:
    """Validate with verifiers' record loader and dump again (imported once: slow)."""
    from verifiers.v1 import WireEpisode

    return lambda record: WireEpisode.model_validate(record).to_record()


def size(record: Record) -> int:
    return len(json.dumps(record, ensure_ascii=False, separators=(",", ":")).encode())


def test_records_round_trip_through_verifiers_unchanged(
    round_trip: Callable[[Record], Record],
) -> None:
    records = list(synthetic_episodes(60, seed=1))
    records += [synthetic_episode(i, error=True) for i in range(4)]
    records += [synthetic_episode(i, judge=False, turns=5, env="math-x") for i in range(4)]
    records += [synthetic_episode(9, target_bytes=50_000), synthetic_episode(9, target_bytes=10)]
    for record in records:
        assert json.dumps(round_trip(record)) == json.dumps(record)


def test_records_cover_what_the_projection_must_handle() -> None:
    records = list(synthetic_episodes(200, seed=2))
    solvers = [record["traces"][0] for record in records]
    assert any(not record["ok"] and record["errors"][0]["traceback"] for record in records)
    assert any(record["ok"] and len(record["traces"]) == 2 for record in records)
    assert all(
        not record["traces"][1]["agent"]["trainable"]
        for record in records
        if len(record["traces"]) == 2
    )
    assert any(solver["tools"] for solver in solvers) and any(not s["tools"] for s in solvers)
    assert any("tool_calls" in node["message"] for solver in solvers for node in solver["nodes"])
    assert any(call.get("finish_reason") == "length" for s in solvers for call in s["calls"])
    assert any(reward is None for s in solvers for reward in s["rewards"].values())
    weights = {reward["weight"] for s in solvers for reward in s["rewards"].values() if reward}
    assert len(weights) >= 3
    assert (
        len({s["rewards"].get("correct") and s["rewards"]["correct"]["score"] for s in solvers})
        >= 2
    )
    idx_counts: dict[int, int] = {}
    for record in records:
        idx = record["traces"][0]["task"]["data"]["idx"]
        idx_counts[idx] = idx_counts.get(idx, 0) + 1
    assert max(idx_counts.values()) == 4
    run = records[0]["run"]
    assert run["type"] == "eval" and all(r["run"] == run for r in records)
    for solver in solvers:
        for call in solver["calls"]:
            assert 1.7e9 < call["time"]["start"] <= call["time"]["end"] < 1.9e9
            assert call["model"]


def test_records_are_deterministic_per_index_and_seed() -> None:
    assert synthetic_episode(17, seed=3) == synthetic_episode(17, seed=3)
    assert list(synthetic_episodes(5, seed=3)) == [synthetic_episode(i, seed=3) for i in range(5)]
    assert synthetic_episode(17, seed=3) != synthetic_episode(17, seed=4)
    assert synthetic_episode(17)["id"] != synthetic_episode(18)["id"]


def _episode_window(record: Record) -> tuple[float, float]:
    times = [
        value
        for trace in record["traces"]
        for part in [trace["timing"], *(call["time"] for call in trace["calls"])]
        for value in _times(part)
    ]
    return min(times), max(times)


def _times(part: Any) -> list[float]:
    if not isinstance(part, dict):
        return []
    found = [v for k, v in part.items() if k in ("start", "end") and isinstance(v, float) and v]
    return found + [t for value in part.values() for t in _times(value)]


def test_a_run_can_be_dated_to_end_now_and_stays_regenerable() -> None:
    fixed = list(synthetic_episodes(40, seed=3))
    recent = list(synthetic_episodes(40, seed=3, ending_at=2_000_000_000.0))
    assert [r["id"] for r in recent] == [r["id"] for r in fixed]
    last_end = max(_episode_window(record)[1] for record in recent)
    first_start = min(_episode_window(record)[0] for record in recent)
    assert 2_000_000_000.0 - 120 <= last_end <= 2_000_000_000.0
    assert first_start >= 2_000_000_000.0 - 40 * 7.25 - 60
    # Only the dates moved: the same episodes, shifted by one whole offset.
    shift = _episode_window(recent[0])[0] - _episode_window(fixed[0])[0]
    assert shift == pytest.approx(2_000_000_000.0 - 40 * 7.25 - 60 - 1_767_225_600.0, abs=1)

    def messages(records: list[Record]) -> list[Any]:
        return [[node["message"] for node in r["traces"][0]["nodes"]] for r in records]

    assert messages(recent) == messages(fixed)


def test_records_do_not_share_mutable_parts() -> None:
    first, second = synthetic_episode(0), synthetic_episode(1)
    first["task"]["data"]["network_allow"].append("example.org")
    first["traces"][0]["task"]["data"]["skills"].append("x")
    assert second["task"]["data"]["network_allow"] == ["*"]
    assert first["task"]["data"]["skills"] == []


def test_default_size_is_about_8_kb() -> None:
    sizes = [size(record) for record in synthetic_episodes(100)]
    assert 5_000 < sum(sizes) / len(sizes) < 11_000


@pytest.mark.parametrize("target", [5_000, 8_192, 100_000, 2_000_000, 20_000_000])
def test_target_bytes_is_met_exactly(target: int) -> None:
    assert size(synthetic_episode(6, target_bytes=target)) == target


def test_small_targets_get_the_leanest_episode() -> None:
    lean = synthetic_episode(6, target_bytes=1_000)
    assert size(lean) < 4_000
    assert len(lean["traces"]) == 1 and lean["traces"][0]["tools"] == []


def test_turns_must_be_positive() -> None:
    with pytest.raises(ValueError, match="turns must be at least 1"):
        synthetic_episode(0, turns=0)
