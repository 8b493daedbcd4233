"""An eval run end to end: start_run → spans → BatchSpanProcessor → exporter →
spool → uploader → the fake platform on loopback, compared with what the
prime-runs SDK sends for the same episodes."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import prime_runs
import pytest
from prime_runs.metrics import from_episodes
from prime_runs.projection import build_samples
from prime_runs.run import _clean_metrics  # the reference cleaning applied at finish

import prime_runs_otel as pro
from prime_runs_otel.deliver.eval_run import MARKER_KEY
from prime_runs_otel.produce.synthetic import synthetic_episodes
from prime_runs_otel.testing import FakePlatform


def _run_eval(records: list[dict[str, Any]], **kwargs: Any) -> pro.RunResult:
    options: dict[str, Any] = {
        "name": "e2e",
        "model": "demo/model",
        "environments": ["gsm8k-demo"],
        "framework": "verifiers",
    }
    options.update(kwargs)
    run = pro.start_run(**options)
    for record in records:
        run.record_episode(record)
    return run.finish(timeout=60)


def test_eval_run_lands_on_platform_once(online: FakePlatform, wire_episode: Any) -> None:
    records = list(synthetic_episodes(120, seed=3))
    result = _run_eval(records, config={"temperature": 0.7}, tags=["t1"])

    assert result.closed and result.status == "completed"
    assert (result.pending, result.failed, result.uncertain, result.corrupt) == (0, 0, 0, 0)
    platform_run = online.run(result.platform_id or "")
    assert platform_run.status == "COMPLETED"
    assert platform_run.name == "e2e"
    assert platform_run.metadata == {
        "temperature": 0.7,
        MARKER_KEY: {"run_key": result.local_id},
    }
    stored = online.episodes(platform_run.id)
    assert sorted(episode["id"] for episode in stored) == sorted(r["id"] for r in records)
    assert set(online.episode_deliveries(platform_run.id).values()) == {1}
    for episode in stored:
        assert episode["run"]["id"] == platform_run.id
        assert all(trace["run"]["id"] == platform_run.id for trace in episode["traces"])

    episodes = [wire_episode.model_validate(record) for record in records]
    expected = _clean_metrics(from_episodes(episodes))
    expected["prime_runs"] = {"traces_episodes_written": len(records)}
    assert platform_run.metrics == expected


def test_legacy_samples_equal_prime_runs_projection(
    online: FakePlatform, monkeypatch: pytest.MonkeyPatch, wire_episode: Any
) -> None:
    monkeypatch.setenv("PRIME_TRACES_OPT_OUT", "true")
    records = list(synthetic_episodes(60, seed=5))
    result = _run_eval(records)

    assert result.closed and result.pending == 0
    rows = online.samples(result.platform_id or "")
    expected = build_samples([wire_episode.model_validate(record) for record in records])
    assert rows == json.loads(json.dumps(expected))
    assert online.episodes(result.platform_id or "") == []


def test_service_not_enabled_switches_to_samples_with_that_batch(
    online: FakePlatform, wire_episode: Any
) -> None:
    online.service_not_enabled = True
    records = list(synthetic_episodes(40, seed=9))
    result = _run_eval(records)

    assert result.closed and result.pending == 0
    rows = online.samples(result.platform_id or "")
    assert [row["sample_id"] for row in rows] == [record["id"] for record in records]
    metrics = online.run(result.platform_id or "").metrics
    assert metrics["prime_runs"] == {"traces_episodes_written": 0}


def test_transient_failures_are_retried_not_lost(online: FakePlatform) -> None:
    online.fail_next(3, status=503, path=r"/api/v1/traces")
    online.fail_next(2, status=429, path=r"/api/v1/evaluations/$", retry_after=0.1)
    records = list(synthetic_episodes(30, seed=1))
    result = _run_eval(records)

    assert result.closed and result.pending == 0
    assert len(online.episodes(result.platform_id or "")) == 30


def test_failed_and_cancelled_runs(online: FakePlatform) -> None:
    with pytest.raises(RuntimeError), pro.start_run(environments=["env-a"]) as run:
        run.record_episode(next(synthetic_episodes(1)))
        raise RuntimeError("the reward model fell over")
    assert run.result is not None and run.result.closed
    failed = online.run(run.result.platform_id or "")
    assert failed.status == "FAILED"
    assert "the reward model fell over" in (failed.error_message or "")

    with pytest.raises(KeyboardInterrupt), pro.start_run(environments=["env-a"]) as run2:
        raise KeyboardInterrupt
    assert run2.result is not None
    assert online.run(run2.result.platform_id or "").status == "CANCELLED"


def test_unknown_environment_is_an_error_and_keeps_the_episodes(online: FakePlatform) -> None:
    records = list(synthetic_episodes(5))
    result = _run_eval(records, environments=["nobody/missing-env"])

    assert not result.closed
    assert result.pending == 5
    assert online.runs() == []


def test_process_exit_without_finish_reports_crashed(
    online: FakePlatform, isolated_environment: Path
) -> None:
    script = textwrap.dedent(
        """
        import prime_runs_otel as pro
        from prime_runs_otel.produce.synthetic import synthetic_episodes
        run = pro.start_run(name="crashy", environments=["env-a"], finish_timeout=30)
        for record in synthetic_episodes(10):
            run.record_episode(record)
        print(run.id)
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=True
    )
    assert "reporting it as crashed" in done.stderr
    [platform_run] = online.runs()
    assert platform_run.status == "FAILED"
    assert (platform_run.error_message or "").startswith("crashed")
    assert len(online.episodes(platform_run.id)) == 10


def test_local_mode_keeps_the_run_in_the_spool(wire_episode: Any) -> None:
    records = list(synthetic_episodes(25, seed=2))
    result = _run_eval(records)

    assert result.mode == "local" and result.closed
    assert result.platform_id is None and result.pending == 0
    assert result.episodes == 25


def test_same_rows_and_summary_as_prime_runs_sdk(
    online: FakePlatform, monkeypatch: pytest.MonkeyPatch, wire_episode: Any
) -> None:
    """The oracle: the prime-runs SDK and this pipeline, same episodes, same
    fake platform; the sample rows and the summary must be the same."""
    monkeypatch.setenv("PRIME_TRACES_OPT_OUT", "true")
    records = list(synthetic_episodes(50, seed=11))
    episodes = [wire_episode.model_validate(record) for record in records]

    sdk_run = prime_runs.init(name="sdk", environments=["gsm8k-demo"], model="demo/model")
    sdk_run.log_episodes(episodes)
    sdk_run.finish(summary=from_episodes(episodes))
    ours = _run_eval(records, name="otel")

    sdk_platform = online.run(sdk_run.id)
    our_platform = online.run(ours.platform_id or "")
    assert online.samples(our_platform.id) == online.samples(sdk_platform.id)
    sdk_metrics = dict(sdk_platform.metrics)
    our_metrics = dict(our_platform.metrics)
    assert our_metrics == sdk_metrics


def _create_platform_run(platform: FakePlatform, name: str) -> str:
    import httpx

    answer = httpx.post(
        f"{platform.url}/api/v1/evaluations/",
        json={"name": name, "environments": [{"id": "env-launcher"}], "tags": []},
        headers={"Authorization": "Bearer test-key"},
    )
    answer.raise_for_status()
    return str(answer.json()["evaluation_id"])


def test_attached_run_is_streamed_into_and_completed(online: FakePlatform) -> None:
    platform_id = _create_platform_run(online, "launched")
    records = list(synthetic_episodes(12))
    result = _run_eval(records, attach=platform_id, environments=[])

    assert result.platform_id == platform_id and result.closed
    assert len(online.runs()) == 1, "an attached run is never created again"
    attached = online.run(platform_id)
    assert attached.status == "COMPLETED"
    assert len(online.episodes(platform_id)) == 12
    assert attached.metadata == {}, "an attached run's metadata is the launcher's"
    assert attached.metrics["prime_runs"] == {"traces_episodes_written": 12}


def test_attached_run_failure_is_left_to_the_launcher(online: FakePlatform) -> None:
    platform_id = _create_platform_run(online, "launched")
    run = pro.start_run(attach=platform_id)
    run.record_episode(next(synthetic_episodes(1)))
    result = run.finish("failed", "boom", timeout=60)

    assert result.closed
    assert online.run(platform_id).status == "RUNNING"
    assert len(online.episodes(platform_id)) == 1


def test_config_file_is_kept_byte_for_byte(online: FakePlatform, tmp_path: Path) -> None:
    text = (
        '# launched with\nmodel = "demo/model"  # trailing comment\n[sampling]\ntemperature = 0.7\n'
    )
    config_file = tmp_path / "eval.toml"
    config_file.write_text(text, encoding="utf-8")
    result = _run_eval(list(synthetic_episodes(3)), config={"seed": 1}, config_file=config_file)

    metadata = online.run(result.platform_id or "").metadata
    assert metadata["seed"] == 1
    assert metadata["config_source"] == {"format": "toml", "text": text, "filename": "eval.toml"}


def test_one_bad_episode_does_not_sink_its_upload(online: FakePlatform) -> None:
    """Prime Traces refuses a whole upload for one bad line; the bad episode
    is isolated and counted, every other episode is delivered."""
    records = list(synthetic_episodes(21, seed=4))
    broken = records[13]
    del broken["traces"][0]["id"]  # the service refuses a trace without an id
    result = _run_eval(records)

    assert result.closed and result.failed == 1 and result.pending == 0
    stored = {episode["id"] for episode in online.episodes(result.platform_id or "")}
    assert stored == {record["id"] for record in records} - {broken["id"]}
    assert "Prime Traces refused" in (result.error or "")
