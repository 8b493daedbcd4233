"""The records of a table step's rollouts (``TableRecords``): each rollout
is converted once, its record handed to the run and kept for the step's
sample table, and nothing is kept longer than its table needs it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from prime_runs_otel.instrumentation.prime_rl.table_records import TableRecords
from prime_runs_otel.testing import FakePlatform


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


STANDIN = Path(__file__).resolve().parent / "prime_rl_standin"

#: prime-rl's calls on one loop, as its orchestrator makes them (see
#: ``bench/prime_rl_reporting.py``), with every ``Episode.to_record()``
#: counted by the rollout's id; prints the counts.
_COUNTED_RUN = """
import asyncio, collections, json, sys, tempfile
from pathlib import Path

from prime_runs_otel.instrumentation.prime_rl import _hook

_hook.install()
from verifiers.v1 import WireEpisode
from prime_runs_otel.produce.synthetic import synthetic_episodes

calls = collections.Counter()
original = WireEpisode.to_record

def counted(self, *args, **kwargs):
    calls[self.id] += 1
    return original(self, *args, **kwargs)

WireEpisode.to_record = counted
batches = []
for step in range(2):
    batch = []
    for index, record in enumerate(synthetic_episodes(16, seed=step, target_bytes=2000)):
        record["id"] = f"train-{step}-{index}"
        record["run"] = {"type": "train", "id": "t", "work": {"type": "train", "step": step}}
        batch.append(WireEpisode.model_validate(record))
    batches.append(batch)

async def main(output_dir):
    from prime_rl import monitors
    from prime_rl.configs.monitors import OrchestratorMonitorsConfig, PrimeMonitorConfig
    from prime_rl.configs.orchestrator import EnvConfig, OrchestratorConfig, TrainConfig

    config = OrchestratorConfig(
        max_steps=2, batch_size=16, group_size=8, output_dir=output_dir,
        train=TrainConfig(source=[EnvConfig(env_id="gsm8k-demo")]),
        monitors=OrchestratorMonitorsConfig(prime=PrimeMonitorConfig(name="counted"), file=None),
    )
    await monitors.setup(
        prime=config.monitors.prime, file=None, output_dir=output_dir, run_config=config
    )
    for step, batch in enumerate(batches):
        for episode in batch:
            await monitors.log([episode], step, "train", "all")
        await monitors.log(batch[:12], step, "train", "effective")
        await monitors.log({"train/agg/reward/mean/all": 0.5, "step": step}, step=step)
    await monitors.finalize()

with tempfile.TemporaryDirectory() as output_dir:
    asyncio.run(main(Path(output_dir)))
print(json.dumps(calls))
"""


def test_every_rollout_is_converted_once_table_step_or_not(tmp_path: Path) -> None:
    with FakePlatform() as platform:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("PRIME_", "OTEL_"))}
        env.update(platform.client_env())
        env.update(
            PRIME_API_BASE=f"{platform.url}/api/v1/rft",
            PRIME_RUNS_OTEL_DIR=str(tmp_path),
            OTEL_TRACES_EXPORTER="prime_runs",
            PYTHONPATH=os.pathsep.join([str(STANDIN), env.get("PYTHONPATH", "")]),
        )
        done = subprocess.run(
            [sys.executable, "-c", _COUNTED_RUN],
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
        assert done.returncode == 0, done.stderr[-3000:]
        (run,) = platform.runs()
        stored = len(platform.episodes(run.id)), len(platform.training_samples(run.id))
    calls = json.loads(done.stdout.strip().splitlines()[-1])
    # Step 0 is a table step: its 12 effective rollouts are not converted again.
    assert calls == {f"train-{step}-{index}": 1 for step in range(2) for index in range(16)}
    assert stored == (32, 1)
