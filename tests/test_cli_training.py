"""A training run on the command line: ``show`` gives its steps, loss and
reward, ``runs`` its last step beside its kind, both also in ``--json``;
an eval has none of it. Real runs in a real spool, the CLI as subprocesses."""

from __future__ import annotations

import json
import subprocess
import sys

import prime_runs_otel as pro
from prime_runs_otel.produce.synthetic import synthetic_episodes


def _cli(*args: str) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "prime_runs_otel.cli", *args],
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def _runs() -> tuple[str, str]:
    train = pro.start_run(name="grpo", model="m", environments=["env-a"], kind="train", max_steps=5)
    for step in range(5):
        train.log_metrics({"train/loss": 2.0 / (step + 1), "reward/mean": 0.1 * step}, step=step)
    train_id = train.finish(timeout=60).local_id
    evaluation = pro.start_run(name="an-eval", model="m", environments=["env-a"])
    for record in synthetic_episodes(3, seed=1):
        evaluation.record_episode(record)
    return train_id, evaluation.finish(timeout=60).local_id


def test_show_and_runs_give_a_training_run_s_steps_loss_and_reward() -> None:
    train_id, eval_id = _runs()
    shown = _cli("show", train_id)
    assert "steps       5 logged, last step 4" in shown
    assert "loss        0.4 at step 4, from 2 at step 0 (train/loss)" in shown
    assert "step reward 0.4 at step 4, from 0 at step 0 (reward/mean)" in shown
    training = json.loads(_cli("show", train_id, "--json"))["training"]
    assert training["steps"] == 5 and training["last_step"] == 4
    assert training["loss"] == {
        "metric": "train/loss",
        "value": 0.4,
        "first": 2.0,
        "first_step": 0,
    }
    assert training["reward"]["metric"] == "reward/mean"
    assert json.loads(_cli("show", eval_id, "--json"))["training"] is None
    assert "steps" not in _cli("show", eval_id)
    table = _cli("runs").splitlines()
    assert table[0].split()[:5] == ["ID", "NAME", "KIND", "STEP", "STATUS"]
    rows = {line.split()[0]: line.split() for line in table[1:]}
    assert rows[train_id[:12]][2:4] == ["train", "4"]
    assert rows[eval_id[:12]][2:4] == ["eval", "-"]
    listed = {run["id"]: run for run in json.loads(_cli("runs", "--json"))}
    assert listed[train_id]["training"]["last_step"] == 4
    assert listed[eval_id]["training"] is None
