"""Differential tests: every projection must equal what prime-runs computes from the
verifiers objects for the same episode, compared as the exact JSON that is sent."""

from __future__ import annotations

import copy
import json
import math
import random
from collections.abc import Callable, Iterable
from typing import Any

import pytest
from prime_runs.metrics import from_episodes
from prime_runs.projection import MAX_SAMPLES_PAYLOAD_BYTES as ORACLE_CEILING
from prime_runs.projection import _nullify_non_finite, batch_samples, build_samples
from prime_runs.run import _clean_metrics
from prime_runs.sinks.base import stamp_run as oracle_stamp_run
from prime_traces.traces import _encode_record

from prime_runs_otel.produce.synthetic import synthetic_episode, synthetic_episodes
from prime_runs_otel.read.projection import (
    MAX_SAMPLES_PAYLOAD_BYTES,
    SampleTooLargeError,
    SummaryAccumulator,
    batch_sample_rows,
    encode_sample_batches,
    encode_samples_body,
    episode_sample_rows,
    rollout_key,
    stamp_run,
    summary_trace_index,
    traces_line,
)
from prime_runs_otel.read.projection.summary import _BuiltinSum

Record = dict[str, Any]
MiB = 1024 * 1024


@pytest.fixture(scope="session")
def wire_episode() -> Callable[[Record], Any]:
    """verifiers' record loader, imported once: the import takes seconds."""
    from verifiers.v1 import WireEpisode

    return WireEpisode.model_validate


@pytest.fixture(scope="session")
def canonical(wire_episode: Callable[[Record], Any]) -> Callable[[Record], Record]:
    """A hand-written record as verifiers itself would write it (defaults filled in)."""
    return lambda record: wire_episode(record).to_record()


def encode(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, allow_nan=False, separators=(",", ":"))


def our_rows(records: Iterable[Record], counts: dict[Any, int] | None = None) -> list[Record]:
    """Stream records through our projection the way the spool does, numbering rollouts."""
    counts = {} if counts is None else counts
    rows: list[Record] = []
    for record in records:
        if not record.get("traces"):
            assert episode_sample_rows(record, 1) == []
            continue
        key = rollout_key(record)
        counts[key] = counts.get(key, 0) + 1
        rows.extend(episode_sample_rows(record, counts[key]))
    return rows


def assert_same_rows(records: list[Record], wire_episode: Callable[[Record], Any]) -> list[Record]:
    ours = our_rows(records)
    theirs = build_samples([wire_episode(record) for record in records])
    assert [encode(row) for row in ours] == [encode(row) for row in theirs]
    return ours


def summary_of(records: Iterable[Record]) -> dict[str, Any]:
    accumulator = SummaryAccumulator()
    for record in records:
        accumulator.add(record)
    return accumulator.summary()


def oracle_summary(records: list[Record], wire_episode: Callable[[Record], Any]) -> Any:
    return _clean_metrics(from_episodes([wire_episode(record) for record in records]))


# --- records built by hand ----------------------------------------------------------------


def message(role: str, content: Any, **extra: Any) -> Record:
    return {"role": role, "content": content, **extra}


def trace(
    trace_id: str,
    *,
    idx: int = 0,
    name: str = "solver",
    trainable: bool = True,
    nodes: list[Record] | None = None,
    calls: list[Record] | None = None,
    **fields: Any,
) -> Record:
    nodes = nodes or [
        {"message": message("user", "What is 2 + 2?")},
        {"parent": 0, "message": message("assistant", "4"), "sampled": True},
    ]
    calls = calls or [
        {
            "node": 1,
            "model": "m",
            "finish_reason": "stop",
            "usage": {"prompt_tokens": 12, "completion_tokens": 3},
        },
    ]
    return {
        "id": trace_id,
        "task": {"type": "MathTask", "data": {"idx": idx, "answer": "4"}},
        "agent": {"config": {"model": "m"}, "name": name, "trainable": trainable},
        "nodes": nodes,
        "calls": calls,
        "rewards": {"correct": {"score": 1.0, "weight": 1.0}},
        "metrics": {"turns": 1.0},
        "is_completed": True,
        "ok": True,
        "stop_condition": "agent_completed",
        "timing": {"start": 1767225600.0},
        **fields,
    }


def episode(episode_id: str, traces: list[Record], *, idx: int = 0, ok: bool = True) -> Record:
    return {
        "id": episode_id,
        "env": {"id": "math", "name": "math"},
        "task": {"type": "MathTask", "data": {"idx": idx, "answer": "4"}},
        "run": {"type": "eval", "id": "local-run", "name": "demo"},
        "ok": ok,
        "traces": traces,
    }


def branching_trace() -> Record:
    """Two answers sampled from one prompt, a retry of the second, and a tool detour:
    three leaves sharing prefixes, with a call whose node was committed twice."""
    nodes = [
        {"message": message("system", "Be brief.")},
        {"parent": 0, "message": message("user", "Name a prime.")},
        {"parent": 1, "message": message("assistant", "2"), "sampled": True},
        {
            "parent": 1,
            "message": message(
                "assistant",
                "",
                tool_calls=[{"id": "c1", "name": "primes", "arguments": '{"n": 1}'}],
            ),
            "sampled": True,
        },
        {"parent": 3, "message": message("tool", "[2, 3, 5]", tool_call_id="c1", name="primes")},
        {"parent": 4, "message": message("assistant", "3"), "sampled": True},
        {"parent": 1, "message": message("assistant", "5"), "sampled": True},
    ]
    calls = [
        {
            "node": 2,
            "model": "m",
            "finish_reason": "stop",
            "usage": {"prompt_tokens": 20, "completion_tokens": 1, "cached_input_tokens": 8},
        },
        {
            "node": 3,
            "model": "m",
            "finish_reason": "tool_calls",
            "usage": {"prompt_tokens": 20, "completion_tokens": 9, "reasoning_tokens": 4},
        },
        {
            "node": 3,
            "model": "m",
            "finish_reason": "tool_calls",
            "usage": {"prompt_tokens": 21, "completion_tokens": 7, "cost": 0.25},
        },
        {
            "node": 5,
            "model": "m",
            "finish_reason": "stop",
            "usage": {"prompt_tokens": 10, "completion_tokens": 1, "cost": 0.5},
        },
        {"node": 6, "model": "m", "finish_reason": "length"},
        {"model": "m", "usage": {"prompt_tokens": 4, "completion_tokens": 2}},
    ]
    tools = [
        {
            "type": "function",
            "name": "primes",
            "description": "First n primes",
            "parameters": {"type": "object"},
            "x-provider": {"cache": True},
        }
    ]
    return trace("branchy", nodes=nodes, calls=calls, tools=tools)


# --- sample rows --------------------------------------------------------------------------


def test_solver_with_judge_projects_the_solver_with_the_whole_episode(
    wire_episode: Callable[[Record], Any],
) -> None:
    record = synthetic_episode(3, error=False, judge=True, turns=3)
    assert [t["agent"]["trainable"] for t in record["traces"]] == [True, False]
    [row] = assert_same_rows([record], wire_episode)
    assert row["sample_id"] == record["id"]
    assert row["agent"] == "solver"
    assert row["info"]["native_wrapper"] == record
    assert row["info"]["native_trace_index"] == 0


def test_first_trace_not_trainable_uses_the_first_trainable_one(
    canonical: Callable[[Record], Record], wire_episode: Callable[[Record], Any]
) -> None:
    judge = trace("judge-1", name="judge", trainable=False, idx=7)
    solver = trace("solver-1", idx=8)
    record = canonical(episode("e1", [judge, solver]))
    assert summary_trace_index(record) == 1
    assert rollout_key(record) == 8
    [row] = assert_same_rows([record], wire_episode)
    assert row["agent"] == "solver"


def test_no_trainable_trace_falls_back_to_the_first(
    canonical: Callable[[Record], Record], wire_episode: Callable[[Record], Any]
) -> None:
    record = canonical(
        episode(
            "e1",
            [
                trace("judge-a", name="judge", trainable=False, idx=1),
                trace("judge-b", name="judge", trainable=False, idx=2),
            ],
        )
    )
    assert summary_trace_index(record) == 0
    assert rollout_key(record) == 1
    assert_same_rows([record], wire_episode)


def test_branching_graph_projects_every_branch(
    canonical: Callable[[Record], Record], wire_episode: Callable[[Record], Any]
) -> None:
    record = canonical(episode("e1", [branching_trace()]))
    [row] = assert_same_rows([record], wire_episode)
    assert len(row["trajectory"]) == 3
    assert row["completion"][-1]["content"] == "5"
    # Node 6 ran out of length, but the last error-free call is the off-graph one.
    assert row["is_truncated"] is False
    assert row["tool_defs"][0]["x-provider"] == {"cache": True}


def test_non_finite_and_missing_rewards_become_null(
    canonical: Callable[[Record], Record], wire_episode: Callable[[Record], Any]
) -> None:
    nan, inf = float("nan"), float("inf")
    solver = trace(
        "t1",
        rewards={
            "correct": {"score": nan, "weight": 1.0},
            "style": {"score": 0.5, "weight": inf},
            "judge": None,
            "length": {"score": -inf, "weight": 0.0},
        },
        metrics={"latency": inf, "skipped": None, "turns": 2},
        calls=[
            {
                "node": 1,
                "model": "m",
                "finish_reason": "stop",
                "usage": {"prompt_tokens": 3, "completion_tokens": 1, "cost": nan},
            }
        ],
        timing={"start": 1767225600.0, "boot": {"start": 0.0, "end": inf}},
    )
    record = canonical(episode("e1", [solver]))
    [row] = assert_same_rows([record], wire_episode)
    assert row["reward"] is None
    assert row["correct"] is None and row["style"] == 0.5 and "judge" not in row
    assert row["info"]["native_wrapper"]["traces"][0]["rewards"]["correct"]["score"] is None
    # The record itself is left alone: NaN is nulled in the row only.
    assert math.isnan(record["traces"][0]["rewards"]["correct"]["score"])


def test_errors_with_tracebacks(wire_episode: Callable[[Record], Any]) -> None:
    records = [synthetic_episode(index, error=True, turns=2) for index in range(6)]
    rows = assert_same_rows(records, wire_episode)
    assert all(not record["ok"] for record in records)
    assert all("Traceback" in row["error"]["traceback"] for row in rows)


def test_unicode_content_and_names(
    canonical: Callable[[Record], Record], wire_episode: Callable[[Record], Any]
) -> None:
    nodes = [
        {
            "message": message(
                "user",
                [
                    {"type": "text", "text": "Übersetze: 猫 → 🐈"},
                    {"type": "image_url", "image_url": {"url": "data:,x"}},
                ],
            )
        },
        {
            "parent": 0,
            "message": message("assistant", "Katze 🐱 — «chat»\u2028ok"),
            "sampled": True,
        },
    ]
    record = canonical(episode("épisode-ü", [trace("トレース", nodes=nodes)]))
    [row] = assert_same_rows([record], wire_episode)
    assert "🐱".encode() in encode_samples_body([row])


def test_length_truncation_and_limit_stops(
    canonical: Callable[[Record], Record], wire_episode: Callable[[Record], Any]
) -> None:
    length_stop = trace(
        "t1",
        calls=[
            {
                "node": 1,
                "model": "m",
                "finish_reason": "length",
                "usage": {"prompt_tokens": 5, "completion_tokens": 2048},
            },
            {"model": "m", "error": {"type": "ProviderError", "message": "boom"}},
        ],
    )
    turn_limit = trace("t2", stop_condition="max_turns")
    clean = trace("t3")
    records = [
        canonical(episode(f"e{i}", [t])) for i, t in enumerate([length_stop, turn_limit, clean])
    ]
    rows = assert_same_rows(records, wire_episode)
    assert [row["is_truncated"] for row in rows] == [True, True, False]


def test_episode_without_traces_has_no_row_but_counts_as_an_error(
    canonical: Callable[[Record], Record], wire_episode: Callable[[Record], Any]
) -> None:
    empty = canonical(
        {
            **episode("e0", [], ok=False),
            "errors": [
                {"type": "SetupError", "message": "no sandbox", "traceback": "Traceback ...\n"}
            ],
        }
    )
    full = canonical(episode("e1", [trace("t1")]))
    assert episode_sample_rows(empty, 1) == []
    assert rollout_key(empty) is None
    assert_same_rows([empty, full, empty], wire_episode)
    assert summary_of([empty, full]) == oracle_summary([empty, full], wire_episode)
    assert summary_of([empty, full])["avg_error"] == 0.5


def test_rollout_numbers_stream_across_calls(wire_episode: Callable[[Record], Any]) -> None:
    records = list(synthetic_episodes(24, seed=5))
    counts: dict[Any, int] = {}
    oracle_counts: dict[Any, int] = {}
    for start in range(0, len(records), 5):
        chunk = records[start : start + 5]
        ours = our_rows(chunk, counts)
        theirs = build_samples([wire_episode(record) for record in chunk], oracle_counts)
        assert [encode(row) for row in ours] == [encode(row) for row in theirs]
    assert counts == oracle_counts
    assert max(counts.values()) == 4


def test_episode_over_the_ceiling_falls_back_to_one_row_per_trace(
    wire_episode: Callable[[Record], Any],
) -> None:
    # The padded prompt appears three times in the row (wrapper, completion, trajectory)
    # and twice in the solver's own row: 10 MiB is over the ceiling as one row only.
    record = synthetic_episode(1, error=False, judge=True, target_bytes=10 * MiB)
    rows = assert_same_rows([record], wire_episode)
    assert [row["sample_id"] for row in rows] == [t["id"] for t in record["traces"]]
    assert all("native_wrapper" not in (row["info"] or {}) for row in rows)
    batches = batch_sample_rows(rows)
    assert [len(batch) for batch in batches] == [len(batch) for batch in batch_samples(rows)]


def test_row_too_large_alone_raises_instead_of_dropping(
    wire_episode: Callable[[Record], Any],
) -> None:
    record = synthetic_episode(2, error=False, target_bytes=13 * MiB)
    rows = episode_sample_rows(record, 1)
    small = episode_sample_rows(synthetic_episode(3), 1)
    with pytest.raises(SampleTooLargeError) as raised:
        batch_sample_rows(small + rows)
    assert record["id"] in str(raised.value) and "sample row 1 " in str(raised.value)
    assert isinstance(raised.value, ValueError)
    with pytest.raises(SampleTooLargeError):
        encode_sample_batches(rows)
    with pytest.raises(ValueError):
        batch_samples(build_samples([wire_episode(record)]))


def test_batches_and_body_match_the_oracle(wire_episode: Callable[[Record], Any]) -> None:
    assert MAX_SAMPLES_PAYLOAD_BYTES == ORACLE_CEILING
    # Rows are about three times their record (see above): 9, 12, 4, 19.5 MiB and two tiny.
    sizes = [3 * MiB, 1024, 4 * MiB, 1400 * 1024, 6500 * 1024, 6000]
    records = [synthetic_episode(i, target_bytes=size) for i, size in enumerate(sizes)]
    rows = our_rows(records)
    batches = batch_sample_rows(rows)
    oracle_batches = batch_samples(build_samples([wire_episode(record) for record in records]))
    assert [len(batch) for batch in batches] == [len(batch) for batch in oracle_batches] == [3, 3]
    for batch, oracle_batch in zip(batches, oracle_batches, strict=True):
        body = encode_samples_body(batch)
        assert body == encode({"samples": oracle_batch}).encode()
        assert len(body) <= MAX_SAMPLES_PAYLOAD_BYTES
    assert encode_sample_batches(rows) == [encode_samples_body(batch) for batch in batches]
    assert batch_sample_rows([]) == [] and encode_sample_batches([]) == []


# --- summary ------------------------------------------------------------------------------


def restored(accumulator: SummaryAccumulator) -> SummaryAccumulator:
    """The accumulator after a trip through the spool: strict JSON text and back."""
    text = json.dumps(accumulator.to_state(), allow_nan=False)
    return SummaryAccumulator.from_state(json.loads(text))


def test_summary_incremental_and_restored_equals_from_episodes(
    wire_episode: Callable[[Record], Any],
) -> None:
    records = list(synthetic_episodes(120, seed=11))
    accumulator = SummaryAccumulator()
    for count, record in enumerate(records, start=1):
        accumulator = restored(accumulator)
        accumulator.add(record)
        if count in (1, 7, 40, 120):
            assert accumulator.summary() == oracle_summary(records[:count], wire_episode)
    assert set(accumulator.summary()) == {"avg_reward", "avg_metrics", "avg_error"}


def test_summary_with_non_finite_values_and_no_trainable_traces(
    canonical: Callable[[Record], Record], wire_episode: Callable[[Record], Any]
) -> None:
    nan, inf = float("nan"), float("inf")
    judges = [
        canonical(
            episode(
                "e1",
                [
                    trace(
                        "j1",
                        trainable=False,
                        rewards={"correct": {"score": 0.25, "weight": 2.0}, "skipped": None},
                        metrics={"correct": 0.5, "agreement": 1},
                    )
                ],
            )
        ),
        canonical(
            episode(
                "e2",
                [
                    trace(
                        "j2",
                        trainable=False,
                        rewards={"correct": {"score": nan, "weight": 1.0}},
                        metrics={"agreement": inf},
                    )
                ],
                ok=False,
            )
        ),
        canonical(episode("e3", [trace("j3", trainable=False, rewards={}, metrics={})])),
    ]
    for count in range(1, len(judges) + 1):
        records = judges[:count]
        ours = summary_of(records)
        assert ours == oracle_summary(records, wire_episode)
        json.dumps(ours, allow_nan=False)
    assert "avg_reward" not in summary_of(judges)
    accumulator = SummaryAccumulator()
    for record in judges:
        accumulator.add(record)
    assert restored(accumulator).summary() == accumulator.summary()


def test_summary_of_nothing(wire_episode: Callable[[Record], Any]) -> None:
    assert (
        summary_of([]) == oracle_summary([], wire_episode) == {"avg_reward": 0.0, "avg_error": 0.0}
    )


def test_summary_state_from_another_version_is_refused() -> None:
    state = SummaryAccumulator().to_state()
    state["version"] = 99
    with pytest.raises(ValueError, match="version 99"):
        SummaryAccumulator.from_state(state)


def test_running_sum_is_bit_identical_to_builtin_sum() -> None:
    """The summary's reward total follows this interpreter's ``sum`` (compensated from
    3.12 on), including the int-then-float start, signed zeros and non-finite values."""
    rng = random.Random(7)
    specials = [0, 0.0, -0.0, 1e100, -1e100, 1e308, -1e308, math.inf, -math.inf, math.nan, 3]
    for _ in range(20_000):
        values: list[float] = []
        for _ in range(rng.randint(0, 10)):
            if rng.random() < 0.2:
                values.append(rng.choice(specials))
            else:
                values.append(rng.uniform(-1e6, 1e6) * 10.0 ** rng.randint(-20, 20))
        running = _BuiltinSum()
        for value in values:
            running.add(value)
        expected = sum(values)
        assert (repr(running.result()), type(running.result())) == (
            repr(expected),
            type(expected),
        ), values


# --- Prime Traces lines -------------------------------------------------------------------


def test_stamp_run_matches_the_traces_sink(canonical: Callable[[Record], Record]) -> None:
    with_run = synthetic_episode(4, error=False, judge=True)
    with_run["traces"][1]["run"] = {"type": "train", "id": "member-run", "work": {"step": 3}}
    without_run = canonical(episode("e9", [trace("t1"), trace("t2")]))
    del without_run["run"]
    for record in (with_run, without_run):
        before = copy.deepcopy(record)
        for run_type in ("eval", "train"):
            ours = stamp_run(record, "platform-run", run_type)
            assert ours == oracle_stamp_run(record, "platform-run", run_type)
            assert all(t["run"]["id"] == "platform-run" for t in ours["traces"])
        assert record == before
    stamped = stamp_run(with_run, "p", "eval")
    assert stamped["run"]["name"] == with_run["run"]["name"]
    assert stamped["traces"][1]["run"]["work"] == {"step": 3}


def test_traces_line_matches_prime_traces_encoding() -> None:
    for record in synthetic_episodes(50, seed=3):
        expected = _encode_record(oracle_stamp_run(record, "run-1", "eval"), 1)
        assert traces_line(record, "run-1", "eval") == expected


def test_traces_line_nulls_non_finite_values(canonical: Callable[[Record], Record]) -> None:
    record = canonical(
        episode(
            "e1",
            [
                trace(
                    "t1",
                    rewards={"correct": {"score": float("nan"), "weight": 1.0}},
                    metrics={"x": float("-inf")},
                )
            ],
        )
    )
    line = traces_line(record, "run-1", "train")
    assert line.endswith(b"\n") and line.count(b"\n") == 1
    parsed = json.loads(line, parse_constant=lambda name: pytest.fail(f"{name} in line"))
    assert parsed["traces"][0]["rewards"]["correct"]["score"] is None
    expected = _encode_record(_nullify_non_finite(oracle_stamp_run(record, "run-1", "train")), 1)
    assert line == expected


# --- volume -------------------------------------------------------------------------------


def test_hundreds_of_synthetic_episodes_match_the_oracle(
    wire_episode: Callable[[Record], Any],
) -> None:
    records = list(synthetic_episodes(400, seed=21))
    records += [synthetic_episode(i, seed=22, judge=False) for i in range(40)]
    rows = assert_same_rows(records, wire_episode)
    assert len(rows) == len(records)
    assert summary_of(records) == oracle_summary(records, wire_episode)
    body = encode_samples_body(rows)
    assert json.loads(body)["samples"][0]["sample_id"] == records[0]["id"]
