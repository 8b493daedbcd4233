"""One refused request costs only what it is about.

A refusal about the episodes sent (400, 413, 422) is narrowed down to the
episode responsible, which alone fails; a refusal about the set-up (a key,
an address, an account: 401, 403, 404, a redirect) stops the run's delivery
with the episodes kept and the run left open, for ``push`` to deliver once
the cause is fixed; anything about the moment is retried. A run is never
finalized as completed while its episodes wait for a set-up fix.
"""

from __future__ import annotations

import pytest

import prime_runs_otel as pro
from prime_runs_otel.cli.main import main
from prime_runs_otel.produce.synthetic import synthetic_episodes
from prime_runs_otel.run import RunResult
from prime_runs_otel.testing import FakePlatform

EPISODES = 40
TRACES_UPLOAD = r"^/api/v1/traces$"
SAMPLES = r"/samples$"


def _run(name: str, seed: int) -> tuple[pro.Run, RunResult, set[str]]:
    run = pro.start_run(name=name, environments=["gsm8k"], finish_timeout=60)
    records = list(synthetic_episodes(EPISODES, seed=seed))
    for record in records:
        run.record_episode(record)
    return run, run.finish(), {record["id"] for record in records}


def _stored_once(platform: FakePlatform, platform_id: str, expected: set[str]) -> None:
    deliveries = platform.episode_deliveries(platform_id)
    assert set(deliveries) == expected
    assert set(deliveries.values()) == {1}


def test_a_413_splits_the_upload_and_every_episode_arrives(online: FakePlatform) -> None:
    online.fail_next(1, status=413, method="POST", path=TRACES_UPLOAD)

    _, result, expected = _run("too-large-once", seed=11)

    assert (result.closed, result.failed, result.pending) == (True, 0, 0)
    [platform_run] = online.runs()
    assert platform_run.status == "COMPLETED"
    _stored_once(online, platform_run.id, expected)


@pytest.mark.parametrize(
    ("status", "advice"),
    [(401, "PRIME_API_KEY"), (404, "PRIME_TRACES_URL"), (308, "PRIME_TRACES_URL")],
)
def test_a_set_up_refusal_stops_the_run_open_and_push_delivers_it(
    online: FakePlatform, capsys: pytest.CaptureFixture[str], status: int, advice: str
) -> None:
    online.fail_next(1, status=status, method="POST", path=TRACES_UPLOAD)

    run, result, expected = _run(f"refused-{status}", seed=status)

    assert result.stopped and not result.closed
    assert (result.pending, result.failed) == (EPISODES, 0), "kept, not failed"
    assert str(status) in (result.error or "")
    assert result.next_step is not None and advice in result.next_step
    [platform_run] = online.runs()
    assert platform_run.status == "RUNNING", "never finalized without its episodes"
    assert online.episodes(platform_run.id) == []

    capsys.readouterr()
    assert main(["push", run.id]) == 0, capsys.readouterr()
    [platform_run] = online.runs()
    assert platform_run.status == "COMPLETED"
    _stored_once(online, platform_run.id, expected)


def test_legacy_rows_split_on_413_and_stop_on_401(
    online: FakePlatform, capsys: pytest.CaptureFixture[str]
) -> None:
    online.service_not_enabled = True
    online.fail_next(1, status=413, method="POST", path=SAMPLES)
    online.fail_next(1, status=401, method="POST", path=SAMPLES)

    run, result, expected = _run("legacy-refused", seed=5)

    assert result.stopped and not result.closed and result.failed == 0
    [platform_run] = online.runs()
    assert platform_run.status == "RUNNING"

    assert main(["push", run.id]) == 0, capsys.readouterr()
    [platform_run] = online.runs()
    assert platform_run.status == "COMPLETED"
    rows = online.samples(platform_run.id)
    keys = [(row["episode_id"], row["sample_id"]) for row in rows]
    assert len(keys) == len(set(keys)), "no row twice"
    assert {row["episode_id"] for row in rows} == expected


TEAM = "team-refusals"


@pytest.mark.parametrize(
    "path", [r"^/api/v1/rft/metrics$", r"^/api/v1/rft/samples/confirm$|/presign"]
)
def test_a_training_run_refused_on_set_up_keeps_its_metrics_and_step_tables(
    online: FakePlatform, capsys: pytest.CaptureFixture[str], path: str
) -> None:
    pytest.importorskip("pyarrow")
    online.allowed_teams = {TEAM}
    online.service_not_enabled = True  # the legacy per-step table
    online.fail_next(1, status=401, path=path)
    run = pro.start_run(
        name="train-refused", kind="train", model="base/policy", team_id=TEAM, finish_timeout=60
    )
    records = list(synthetic_episodes(4, seed=8))
    for record in records:
        work = {"type": "train", "step": 10}
        record["run"] = {"type": "train", "id": run.id, "name": "rl", "work": work}
        run.record_episode(record)
    run.log_metrics({"loss": 0.5}, step=10)
    result = run.finish()

    assert result.stopped and not result.closed and result.failed == 0
    assert "401" in (result.error or "")

    assert main(["push", run.id]) == 0, capsys.readouterr()
    [platform_run] = online.runs()
    assert platform_run.status == "COMPLETED"
    assert [row["step"] for row in online.training_metrics(platform_run.id)] == [10]
    [table] = online.training_samples(platform_run.id)
    assert table.step == 10
