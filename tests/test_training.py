"""A training run end to end, fed by three processes the way prime-rl runs:
two produce episodes at different steps (one with verifiers records, one
traced by OpenTelemetry's openai-v2 instrumentation against a fake
OpenAI-compatible server, its records synthesised), and the trainer logs step
metrics and owns the run. Against the fake platform on loopback: the run is
registered once, every step's metrics row lands, the episodes carry their
steps, and the run is finalized; with Prime Traces not enabled the episodes of
every 10th step reach the legacy Parquet table instead; and a trainer that
dies leaves the run closed as crashed."""

from __future__ import annotations

import io
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

import prime_runs_otel as pro
from prime_runs_otel.testing import FakePlatform

TEAM = "team-rl"
RUN_KEY = "rl-run-0001"
TIMEOUT = 180

#: Records from a verifiers-style producer: four episodes per step.
RECORDS_WORKER = textwrap.dedent(
    """
    import sys
    import prime_runs_otel as pro
    from prime_runs_otel.produce.synthetic import synthetic_episode

    run_key, steps = sys.argv[1], [int(step) for step in sys.argv[2].split(",")]
    run = pro.start_run(kind="train", run_id=run_key, name="rl", model="base/policy",
                        environments=["gsm8k-demo"], max_steps=30, batch_size=8,
                        owns_run=False)
    for step in steps:
        for index in range(4):
            record = synthetic_episode(step * 10 + index, seed=7, judge=False, error=False)
            record["run"] = {"type": "train", "id": run_key, "name": "rl",
                             "work": {"type": "train", "step": step}}
            run.record_episode(record)
    print(run.finish().describe())
    """
)

#: A loop traced by the openai-v2 instrumentation: two episodes per step.
TRACED_WORKER = textwrap.dedent(
    """
    import sys
    import openai
    from opentelemetry.instrumentation.openai_v2 import OpenAIInstrumentor
    import prime_runs_otel as pro
    from prime_runs_otel.produce.traced_episode import episode_span, score_episode
    from prime_runs_otel.testing.fake_openai import FakeOpenAI

    run_key, steps = sys.argv[1], [int(step) for step in sys.argv[2].split(",")]
    run = pro.start_run(kind="train", run_id=run_key, name="rl", model="base/policy",
                        environments=["gsm8k-demo"], max_steps=30, batch_size=8,
                        owns_run=False)
    OpenAIInstrumentor().instrument(tracer_provider=run.tracer_provider)
    with FakeOpenAI(accuracy=1.0) as fake:
        client = openai.OpenAI(base_url=fake.base_url, api_key="k", max_retries=0)
        for step in steps:
            for example in range(2):
                question = f"What is {step} + {example}?"
                with episode_span(run.tracer, example_id=example, step=step,
                                  env="gsm8k-demo") as span:
                    answer = client.chat.completions.create(
                        model="base/policy", messages=[{"role": "user", "content": question}])
                    text = answer.choices[0].message.content
                    score_episode(span, float(str(step + example) in text))
    print(run.finish().describe())
    """
)

#: The trainer: step metrics, and the run's end (unless it dies first).
TRAINER = textwrap.dedent(
    """
    import os, sys
    import prime_runs_otel as pro

    run_key, steps, how = sys.argv[1], [int(s) for s in sys.argv[2].split(",")], sys.argv[3]
    run = pro.start_run(kind="train", run_id=run_key, name="rl", model="base/policy",
                        environments=["gsm8k-demo"], max_steps=30, batch_size=8,
                        config={"lr": 1e-6, "loss": "grpo"})
    for step in steps:
        run.log_metrics({"loss": 1.0 / (step + 1), "reward/mean": step / 100,
                         "grad_norm": float("nan")}, step=step)
    if how == "die":
        # Dies once its run is registered: a kill during the create itself
        # leaves a training run that cannot be found again (the RFT API has
        # no search), which the push then refuses to register blindly.
        run.wait_registered(120)
        os._exit(9)
    print(run.finish().describe())
    """
)


def _env(**extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env.update(extra)
    return env


def _python(script: str, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", script, *args],
        env=_env(
            OTEL_SEMCONV_STABILITY_OPT_IN="gen_ai_latest_experimental",
            OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT="span_only",
        ),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _wait(process: subprocess.Popen[str]) -> str:
    out, err = process.communicate(timeout=TIMEOUT)
    assert process.returncode == 0, err
    return out


def _feed(record_steps: str, traced_steps: str) -> None:
    """The two episode producers, side by side, each to the end."""
    workers = [
        _python(RECORDS_WORKER, RUN_KEY, record_steps),
        _python(TRACED_WORKER, RUN_KEY, traced_steps),
    ]
    for worker in workers:
        _wait(worker)


@pytest.fixture
def rl(online: FakePlatform, monkeypatch: pytest.MonkeyPatch) -> FakePlatform:
    monkeypatch.setenv("PRIME_TEAM_ID", TEAM)
    return online


def _the_run(platform: FakePlatform) -> Any:
    [run] = platform.runs()
    assert run.kind == "train" and run.team_id == TEAM
    return run


def test_three_processes_one_training_run(rl: FakePlatform) -> None:
    _feed("0,10", "10,20")
    _wait(_python(TRAINER, RUN_KEY, "0,10,20", "finish"))

    run = _the_run(rl)
    assert run.status == "COMPLETED", run.error_message
    assert run.finalize_calls == 1
    assert run.create_payload == {
        "base_model": "base/policy",
        "max_steps": 30,
        "environments": [{"id": "gsm8k-demo"}],
        "team_id": TEAM,
        "name": "rl",
        "batch_size": 8,
        "run_config": {"lr": 1e-6, "loss": "grpo"},
    }
    rows = rl.training_metrics(run.id)
    assert [row["step"] for row in rows] == [0, 10, 20]
    assert all(set(row) == {"loss", "reward/mean", "step", "_timestamp"} for row in rows)
    assert rows[1]["loss"] == 1.0 / 11

    episodes = rl.episodes(run.id)
    steps = sorted(episode["run"]["work"]["step"] for episode in episodes)
    assert steps == [0] * 4 + [10] * 6 + [20] * 2
    assert all(episode["run"]["type"] == "train" for episode in episodes)
    assert all(t["run"]["id"] == run.id for episode in episodes for t in episode["traces"])
    assert set(rl.episode_deliveries(run.id).values()) == {1}
    traced = [e for e in episodes if "otel_trace_id" in e["traces"][0]["info"]]
    assert len(traced) == 4
    for episode in traced:
        [trace] = episode["traces"]
        assert [node["message"]["role"] for node in trace["nodes"]] == ["user", "assistant"]
        assert trace["rewards"] == {"reward": {"score": 1.0, "weight": 1.0}}
    upload = rl.uploads[0]
    assert upload.context["run_type"] == "train"
    assert rl.training_samples(run.id) == []


def test_without_prime_traces_every_tenth_step_goes_to_the_parquet_table(
    rl: FakePlatform,
) -> None:
    rl.service_not_enabled = True
    _feed("0,5,10", "10,20,25")
    _wait(_python(TRAINER, RUN_KEY, "0,5,10,20,25", "finish"))

    run = _the_run(rl)
    assert run.status == "COMPLETED"
    assert rl.episodes(run.id) == []
    objects = rl.training_samples(run.id)
    by_step: dict[int, list[dict[str, Any]]] = {}
    for stored in objects:
        rows = pq.read_table(io.BytesIO(stored.data)).to_pylist()
        assert {row["step"] for row in rows} == {stored.step}
        assert {row["run_id"] for row in rows} == {run.id}
        by_step.setdefault(stored.step, []).extend(rows)
    assert sorted(by_step) == [0, 10, 20]  # steps 5 and 25 are off the cadence
    assert [len(by_step[step]) for step in (0, 10, 20)] == [4, 6, 2]
    for rows in by_step.values():
        ids = [row["sample_id"] for row in rows]
        assert len(ids) == len(set(ids)), "sample ids of one step never collide"
    assert [row["step"] for row in rl.training_metrics(run.id)] == [0, 5, 10, 20, 25]


def test_a_trainer_that_dies_leaves_the_run_crashed(rl: FakePlatform) -> None:
    _feed("0", "0")
    trainer = _python(TRAINER, RUN_KEY, "0,10", "die")
    trainer.communicate(timeout=TIMEOUT)
    assert trainer.returncode == 9

    pushed = subprocess.run(
        [sys.executable, "-m", "prime_runs_otel.cli", "push", "--all"],
        env=_env(),
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
    )
    assert pushed.returncode == 0, pushed.stdout + pushed.stderr

    run = _the_run(rl)
    assert run.status == "FAILED"
    assert (run.error_message or "").startswith("crashed: ")
    assert len(rl.episodes(run.id)) == 6
    assert [row["step"] for row in rl.training_metrics(run.id)] == [0, 10]


def test_a_training_run_without_a_base_model_is_refused_at_start(online: FakePlatform) -> None:
    with pytest.raises(pro.ConfigError, match="base model"):
        pro.start_run(kind="train", team_id=TEAM)


def test_a_training_run_without_a_team_is_registered_without_one(online: FakePlatform) -> None:
    """As prime-rl registers it: the team is sent only when there is one."""
    run = pro.start_run(kind="train", model="base/policy", environments=["gsm8k-demo"])
    result = run.finish(timeout=30)
    assert result.closed, result.describe()
    [registered] = online.runs()
    assert "team_id" not in registered.create_payload
    assert registered.status == "COMPLETED"


def test_opting_out_without_pyarrow_is_refused_at_start(
    rl: FakePlatform, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PRIME_TRACES_OPT_OUT", "true")
    monkeypatch.setitem(sys.modules, "pyarrow", None)
    with pytest.raises(pro.ConfigError, match=r"pip install -e '\.\[train\]'"):
        pro.start_run(kind="train", model="base/policy")


def test_an_attached_hosted_run_streams_into_it(rl: FakePlatform, tmp_path: Path) -> None:
    from prime_runs_otel.deliver.platform.rft import RftAPI, TrainingFields, external_run_payload

    launcher = RftAPI(api_key=rl.api_key, base_url=rl.url, frontend_url=rl.url)
    created = launcher.create(
        external_run_payload(
            base_model="base/policy",
            team_id=TEAM,
            environments=["gsm8k-demo"],
            training=TrainingFields(max_steps=10),
        )
    )
    with pro.start_run(kind="train", attach=created["id"], environments=["gsm8k-demo"]) as run:
        run.log_metrics({"loss": 0.5}, step=1)
    assert run.result is not None and run.result.closed
    assert run.result.url == f"{rl.url}/dashboard/training/{created['id']}"
    assert len(rl.runs()) == 1
    assert rl.run(created["id"]).status == "COMPLETED"
    assert [row["step"] for row in rl.training_metrics(created["id"])] == [1]


def test_log_metrics_on_an_eval_run_does_nothing(online: FakePlatform) -> None:
    with pro.start_run(environments=["gsm8k-demo"]) as run:
        assert run.log_metrics({"loss": 1.0}, step=1) is None
    assert run.result is not None and run.result.closed


EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "rl_loop.py"


def test_the_rl_loop_example_reports_a_training_run(rl: FakePlatform) -> None:
    done = subprocess.run(
        [sys.executable, str(EXAMPLE)], env=_env(), capture_output=True, text=True, timeout=TIMEOUT
    )
    assert done.returncode == 0, done.stderr

    run = _the_run(rl)
    assert run.status == "COMPLETED" and run.name == "arith-rl"
    assert [row["step"] for row in rl.training_metrics(run.id)] == [0, 1, 2]
    episodes = rl.episodes(run.id)
    assert len(episodes) == 3 * 4 * 2
    rewards = [episode["traces"][0]["rewards"]["reward"]["score"] for episode in episodes]
    assert set(rewards) <= {0.0, 1.0} and 0.0 < sum(rewards) < len(rewards)


def test_a_step_logged_again_adds_its_values_to_the_row(online: FakePlatform) -> None:
    """prime-rl logs an eval row for a step that has its train row, and its
    trainer logs several dicts per step: the platform keeps one row per step,
    so the spool keeps every value of the step in it, the later value of a
    name logged twice."""
    run = pro.start_run(kind="train", model="base/policy", environments=["gsm8k-demo"])
    run.log_metrics({"loss": 1.0, "reward": 0.25}, step=3)
    run.log_metrics({"eval/reward": 0.5, "reward": 0.75}, step=3)
    result = run.finish(timeout=30)
    assert result.closed, result.describe()
    [registered] = online.runs()
    [row] = online.training_metrics(registered.id)
    assert (row["step"], row["loss"], row["reward"], row["eval/reward"]) == (3, 1.0, 0.75, 0.5)


def test_rows_posted_as_logged_are_sent_as_they_are_and_at_most_once(
    online: FakePlatform,
) -> None:
    """``log_metrics(..., verbatim=True)`` (what the prime_rl instrumentation
    sends prime-rl's rows as): each row a post of its own, exactly its keys
    and types, in order, beside the SDK's step rows, which keep their
    ``_timestamp``. A post the platform did not take (503) waits and goes
    once; one whose answer was lost after the platform acted is not posted
    a second time, as prime-rl never posts one twice."""
    online.fail_next(1, status=503, path="/rft/metrics")
    online.ambiguous_next(1, path="/rft/metrics")
    run = pro.start_run(kind="train", model="base/policy", environments=["gsm8k-demo"])
    run.log_metrics({"loss": 1.0, "step": 10}, step=10, verbatim=True)
    run.log_metrics({"eval/reward": 0.75, "step": 10.0}, step=10, verbatim=True)
    run.log_metrics({"lr": 1e-6}, step=11)
    result = run.finish(timeout=60)
    assert result.closed, result.describe()
    [registered] = online.runs()
    posts = online.metrics_posts(registered.id)
    assert posts[:2] == [{"loss": 1.0, "step": 10}, {"eval/reward": 0.75, "step": 10.0}]
    assert [type(post["step"]) for post in posts[:2]] == [int, float]
    assert [list(post) for post in posts[:2]] == [["loss", "step"], ["eval/reward", "step"]]
    assert posts[2]["lr"] == 1e-6 and "_timestamp" in posts[2]
    assert len(posts) == 3  # the lost answer's row (the first, acted on) was not posted again
