"""The records of a table step's rollouts (``TableRecords``): each rollout
is converted once, its record handed to the run and kept for the step's
sample table, and nothing is kept longer than its table needs it."""

from __future__ import annotations

from typing import Any

from prime_runs_otel.instrumentation.prime_rl.table_records import TableRecords


class _Rollout:
    """A verifiers Episode as far as the monitor uses one: ``to_record()``,
    counted."""

    def __init__(self, name: str, *, broken: bool = False) -> None:
        self.id = name
        self.conversions = 0
        self.broken = broken

    def to_record(self) -> dict[str, Any]:
        self.conversions += 1
        if self.broken:
            raise ValueError(f"{self.id} has no record")
        return {"id": self.id, "traces": [{"reward": 1.0, "tags": ("a", "b")}]}


def test_a_table_steps_rollouts_are_converted_once_for_the_run_and_the_table() -> None:
    records = TableRecords()
    rollouts = [_Rollout(f"r{index}") for index in range(4)]
    handed = [records.for_run(rollout, 10, "train") for rollout in rollouts]
    assert handed == [rollout.to_record() for rollout in rollouts]
    for rollout in rollouts:
        rollout.conversions = 0
    table = records.table_records(rollouts[:3], 10)
    assert [rollout.conversions for rollout in rollouts] == [0, 0, 0, 0]
    # As the spool reads it back: plain JSON, a copy of the run's record.
    assert table == [
        {"id": f"r{index}", "traces": [{"reward": 1.0, "tags": ["a", "b"]}]} for index in range(3)
    ]
    assert all(mine is not theirs for mine, theirs in zip(table, handed, strict=False))


def test_other_rollouts_go_to_the_run_as_they_are() -> None:
    records = TableRecords()
    other_step, evaluation = _Rollout("train-3"), _Rollout("eval-10")
    assert records.for_run(other_step, 3, "train") is other_step
    assert records.for_run(evaluation, 10, "eval") is evaluation
    assert (other_step.conversions, evaluation.conversions) == (0, 0)


def test_a_rollout_without_a_record_is_left_to_the_run_and_the_table_says_why() -> None:
    records = TableRecords()
    broken = _Rollout("broken", broken=True)
    assert records.for_run(broken, 0, "train") is broken
    (table,) = records.table_records([broken], 0)
    assert isinstance(table, ValueError)
    assert "broken has no record" in str(table)


def test_records_are_let_go_once_their_table_is_written_or_a_later_table_step_begins() -> None:
    records = TableRecords()
    first, second, later = _Rollout("a"), _Rollout("b"), _Rollout("c")
    records.for_run(first, 0, "train")
    records.table_records([first], 0)
    records.table_records([first], 0)  # kept no longer: converted again
    assert first.conversions == 2
    records.for_run(second, 10, "train")  # its table never comes
    records.for_run(later, 20, "train")
    records.table_records([second], 10)
    assert second.conversions == 2
    records.table_records([later], 20)
    assert later.conversions == 1
