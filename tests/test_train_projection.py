"""The legacy training step table: the same Parquet table prime-runs writes for
the same episodes, read back with pyarrow, and the step stamped on Prime
Traces lines of training runs."""

from __future__ import annotations

import io
import json
import sys
from datetime import datetime, timezone
from typing import Any

import pyarrow.parquet as pq
import pytest
from prime_runs.projection import episodes_to_parquet_bytes

from prime_runs_otel.produce.synthetic import synthetic_episode, synthetic_episodes
from prime_runs_otel.read.projection import (
    ParquetUnavailableError,
    parquet_available,
    stamp_run,
    step_table_parquet,
    step_table_rows,
    traces_line,
)


def _table(data: bytes | None) -> list[dict[str, Any]]:
    assert data is not None
    return list(pq.read_table(io.BytesIO(data)).to_pylist())


def _records(count: int, seed: int) -> list[dict[str, Any]]:
    records = list(synthetic_episodes(count, seed=seed))
    for index, record in enumerate(records):
        if index % 3:
            record["traces"][0]["info"]["advantage"] = 0.25 * index - 1.0
    return records


def test_the_step_table_equals_prime_runs(wire_episode: Any) -> None:
    records = _records(24, seed=11)
    records[5]["traces"][0]["rewards"]["format"]["score"] = float("nan")
    episodes = [wire_episode.model_validate(record) for record in records]

    expected = _table(episodes_to_parquet_bytes(episodes, "run-1", 30, sample_id_offset=7))
    actual = _table(step_table_parquet(records, "run-1", 30, sample_id_offset=7))

    assert len(actual) == len(expected) == 24
    for theirs, ours in zip(expected, actual, strict=True):
        theirs.pop("created_at")
        ours.pop("created_at")
        assert ours == theirs


def test_episodes_without_a_trajectory_have_no_rows_but_keep_their_numbers() -> None:
    with_traces = synthetic_episode(1, seed=2)
    empty = {**synthetic_episode(2, seed=2), "traces": []}
    no_nodes = synthetic_episode(3, seed=2)
    no_nodes["traces"] = [{**trace, "nodes": [], "calls": []} for trace in no_nodes["traces"]]

    rows = step_table_rows([no_nodes, empty, with_traces], "run", 10)
    assert [row["sample_id"] for row in rows] == [1]
    assert step_table_parquet([empty], "run", 10) is None


def test_rows_carry_the_step_and_the_time_given() -> None:
    stamp = datetime(2026, 1, 2, 3, 4, 5, tzinfo=timezone.utc)
    [row] = _table(step_table_parquet([synthetic_episode(0)], "run-9", 40, created_at=stamp))
    assert (row["run_id"], row["step"], row["created_at"]) == ("run-9", 40, stamp)
    assert row["env_name"] == "gsm8k-demo"
    assert json.loads(row["trajectory"])[0]["advantage"] is None


def test_a_non_finite_advantage_is_null_in_the_trajectory_text() -> None:
    """The JSON text columns are strict JSON: a NaN the encoder refuses is
    written as ``null`` there, while the float column keeps it."""
    record = synthetic_episode(0)
    record["traces"][0]["info"]["advantage"] = float("nan")
    [row] = _table(step_table_parquet([record], "run", 10))
    assert "NaN" not in row["trajectory"]
    assert json.loads(row["trajectory"])[0]["advantage"] is None
    assert row["advantage"] != row["advantage"]  # NaN


def test_without_pyarrow_the_error_says_how_to_get_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pyarrow", None)
    assert not parquet_available()
    with pytest.raises(ParquetUnavailableError, match=r"pip install -e '\.\[train\]'"):
        step_table_parquet([synthetic_episode(0)], "run", 10)


def test_a_training_line_names_its_step_where_the_record_does_not() -> None:
    record = synthetic_episode(0)
    del record["run"]
    stamped = stamp_run(record, "platform-run", "train", step=30)
    assert stamped["run"] == {
        "id": "platform-run",
        "type": "train",
        "work": {"type": "train", "step": 30},
    }
    assert all(trace["run"] == stamped["run"] for trace in stamped["traces"])
    line = json.loads(traces_line(record, "platform-run", "train", step=30))
    assert line["run"]["work"] == {"type": "train", "step": 30}


def test_a_records_own_work_and_eval_lines_are_left_alone() -> None:
    record = synthetic_episode(0)
    record["run"] = {"type": "train", "id": "x", "work": {"type": "eval", "step": 3}}
    assert stamp_run(record, "p", "train", step=99)["run"]["work"] == {"type": "eval", "step": 3}
    assert "work" not in stamp_run(synthetic_episode(0), "p", "eval", step=99)["run"]
