"""Small runs for the viewer's tests, recorded through the real pipeline
(``start_run`` in local mode) into the test's own spool: an eval like the
demo's (multi-turn, a judge, tool calls, about one episode in eight failing
with ProviderTimeout), a second eval over the same examples, and a training
run with episodes and a metrics row per step."""

from __future__ import annotations

from pathlib import Path

import prime_runs_otel as pro
from prime_runs_otel.deliver.spool import Spool
from prime_runs_otel.produce.synthetic import synthetic_episode

EVAL_EPISODES = 120
TRAIN_STEPS = 6
EPISODES_PER_STEP = 8


def record_eval(spool_dir: Path, *, name: str = "demo-eval", seed: int = 0) -> str:
    with pro.start_run(
        name=name,
        model="demo/solver-8b",
        environments=["gsm8k-demo"],
        config={"temperature": 0.7},
        spool_dir=spool_dir,
    ) as run:
        for index in range(EVAL_EPISODES):
            run.record_episode(synthetic_episode(index, seed=seed))
    assert run.result is not None
    return run.result.local_id


def record_training(spool_dir: Path) -> str:
    with pro.start_run(
        kind="train",
        name="demo-train",
        model="demo/policy",
        environments=["gsm8k-demo"],
        max_steps=TRAIN_STEPS,
        batch_size=EPISODES_PER_STEP,
        spool_dir=spool_dir,
    ) as run:
        for step in range(TRAIN_STEPS):
            for index in range(EPISODES_PER_STEP):
                record = synthetic_episode(step * EPISODES_PER_STEP + index, seed=5, judge=False)
                record["run"] = {"type": "train", "work": {"type": "train", "step": step}}
                run.record_episode(record)
            run.log_metrics({"loss": 1.0 / (step + 1), "reward/mean": step / 10}, step=step)
    assert run.result is not None
    return run.result.local_id


def open_spool(spool_dir: Path) -> Spool:
    return Spool(spool_dir / "spool.sqlite3", max_bytes=1 << 34)
