"""``prime-runs-otel`` as a user runs it: a subprocess with the test's
environment, against the spool and the fake platform, its output compared
with what the prime-runs SDK computes for the same episodes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from prime_runs.metrics import from_episodes
from prime_runs.projection import build_samples
from prime_runs.run import _clean_metrics  # the reference cleaning applied at finish

import prime_runs_otel as pro
from prime_runs_otel.produce.synthetic import synthetic_episodes
from prime_runs_otel.testing import FakePlatform

TIMEOUT = 120


def _cli(*args: str, **extra_env: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    env.update(extra_env)
    return subprocess.run(
        [sys.executable, "-m", "prime_runs_otel.cli", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
    )


def _ok(*args: str, **extra_env: str) -> str:
    done = _cli(*args, **extra_env)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def _jsonl(text: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def _sdk_rows(wire_episode: Any, records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    episodes = [wire_episode.model_validate(record) for record in records]
    rows: list[dict[str, Any]] = json.loads(json.dumps(build_samples(episodes)))
    return rows


def _sdk_summary(wire_episode: Any, records: list[dict[str, Any]]) -> dict[str, Any]:
    episodes = [wire_episode.model_validate(record) for record in records]
    return _clean_metrics(from_episodes(episodes))


# -- the local store -----------------------------------------------------------------------


def test_local_run_lists_shows_exports_then_pushes(
    platform: FakePlatform, wire_episode: Any
) -> None:
    records = list(synthetic_episodes(40, seed=21))
    run = pro.start_run(name="kept-here", environments=["env-a"], model="demo/m")
    for record in records:
        run.record_episode(record)
    result = run.finish(timeout=30)
    assert result.mode == "local" and result.closed

    listing = _ok("runs")
    assert result.local_id[:12] in listing and "kept-here" in listing
    shown = json.loads(_ok("show", result.local_id[:10], "--json"))
    assert (shown["id"], shown["mode"], shown["episodes"]) == (result.local_id, "local", 40)
    assert "kept-here" in _ok("show", result.local_id)

    rows = _jsonl(_ok("export", result.local_id, "--what", "samples"))
    assert rows == _sdk_rows(wire_episode, records)
    lines = _jsonl(_ok("export", result.local_id, "--what", "episodes"))
    assert [line["id"] for line in lines] == [record["id"] for record in records]
    summary = json.loads(_ok("export", result.local_id, "--what", "summary"))
    assert summary == _sdk_summary(wire_episode, records)

    online = {**platform.client_env(), "PRIME_TRACES_OPT_OUT": "true"}
    pushed = _cli("push", result.local_id, **online)

    assert pushed.returncode == 0, pushed.stdout + pushed.stderr
    [platform_run] = platform.runs()
    assert platform_run.status == "COMPLETED"
    assert platform.samples(platform_run.id) == rows
    assert platform_run.metrics == {**summary, "prime_runs": {"traces_episodes_written": 0}}
    shown = json.loads(_ok("show", platform_run.id, "--json"))
    assert (shown["mode"], shown["closed"], shown["pending"]) == ("online", True, 0)


def test_pushed_local_run_lands_in_prime_traces(platform: FakePlatform) -> None:
    records = list(synthetic_episodes(15, seed=22))
    run = pro.start_run(name="traced", environments=["env-a"])
    for record in records:
        run.record_episode(record)
    local = run.finish(timeout=30)

    _ok("push", "--all", **platform.client_env())

    [platform_run] = platform.runs()
    assert platform_run.status == "COMPLETED"
    stored = platform.episodes(platform_run.id)
    assert [episode["id"] for episode in stored] == [record["id"] for record in records]
    assert set(platform.episode_deliveries(platform_run.id).values()) == {1}
    assert platform_run.metrics["prime_runs"] == {"traces_episodes_written": 15}
    assert "nothing to push" in _ok("push", "--all", **platform.client_env())
    assert json.loads(_ok("show", local.local_id, "--json"))["closed"] is True


# -- replay ---------------------------------------------------------------------------------


def _write_traces(folder: Path, records: list[dict[str, Any]], bad: dict[int, str]) -> Path:
    """``records`` as a verifiers eval writes them, with ``bad`` lines
    inserted at the given (1-based) line numbers."""
    folder.mkdir(parents=True)
    lines = [json.dumps(record) for record in records]
    for number in sorted(bad):
        lines.insert(number - 1, bad[number])
    path = folder / "traces.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return path


def test_replay_with_bad_lines_names_them_and_delivers_the_rest(
    online: FakePlatform, tmp_path: Path
) -> None:
    records = list(synthetic_episodes(20, seed=23))
    folder = tmp_path / "outputs" / "gsm8k-run"
    _write_traces(folder, records, {4: '{"id": "cut off', 9: '{"id": "no-traces"}'})

    done = _cli("replay", str(folder), "--timeout", "60", PRIME_TRACES_OPT_OUT="true")

    assert done.returncode == 1, done.stdout + done.stderr
    assert "traces.jsonl line 4: not JSON" in done.stderr
    assert "traces.jsonl line 9: not an episode record" in done.stderr
    assert "2 bad line(s)" in done.stdout
    [platform_run] = online.runs()
    assert platform_run.name == "gsm8k-run"
    assert platform_run.status == "COMPLETED"
    rows = online.samples(platform_run.id)
    assert [row["sample_id"] for row in rows] == [record["id"] for record in records]


def test_clean_replay_matches_prime_runs(
    online: FakePlatform, tmp_path: Path, wire_episode: Any
) -> None:
    records = list(synthetic_episodes(30, seed=24))
    path = _write_traces(tmp_path / "run", records, {})

    done = _cli("replay", str(path), "--json", "--timeout", "60", PRIME_TRACES_OPT_OUT="true")

    assert done.returncode == 0, done.stdout + done.stderr
    result = json.loads(done.stdout)
    assert (result["closed"], result["episodes"], result["bad_lines"]) == (True, 30, 0)
    platform_run = online.run(result["platform_id"])
    assert online.samples(platform_run.id) == _sdk_rows(wire_episode, records)
    expected = _sdk_summary(wire_episode, records)
    assert platform_run.metrics == {**expected, "prime_runs": {"traces_episodes_written": 0}}
    assert platform_run.create_payload["dataset"] == records[0]["env"]["id"]


# -- errors that tell the user what to do ----------------------------------------------------


@pytest.fixture
def spool_with_a_run() -> str:
    run = pro.start_run(name="one", environments=["env-a"])
    run.record_episode(next(synthetic_episodes(1)))
    return run.finish(timeout=30).local_id


@pytest.mark.parametrize("command", [["show"], ["export", "--what", "summary"], ["push"]])
def test_unknown_run_is_a_usage_error(spool_with_a_run: str, command: list[str]) -> None:
    done = _cli(*command[:1], "no-such-run", *command[1:], PRIME_API_KEY="k")

    assert done.returncode == 2
    assert "no run 'no-such-run'" in done.stderr
    assert "prime-runs-otel runs" in done.stderr


# `runs` there is an empty list (tests/test_newcomer_messages.py).
@pytest.mark.parametrize("command", [["show", "abc"], ["export", "abc"]])
def test_missing_spool_is_a_usage_error(tmp_path: Path, command: list[str]) -> None:
    done = _cli(*command, PRIME_RUNS_OTEL_DIR=str(tmp_path / "nowhere"))

    assert done.returncode == 2
    assert "no spool at" in done.stderr
    assert "PRIME_RUNS_OTEL_DIR" in done.stderr
    assert not (tmp_path / "nowhere").exists(), "looking must not create a spool"


def test_push_without_api_key_says_how_to_get_one(spool_with_a_run: str) -> None:
    done = _cli("push", spool_with_a_run)

    assert done.returncode == 2
    assert "push needs an API key" in done.stderr
    # `prime login` only where the prime command is installed (test_newcomer_messages.py).
    assert "PRIME_API_KEY" in done.stderr


def test_replay_of_a_missing_file_is_a_usage_error(tmp_path: Path) -> None:
    done = _cli("replay", str(tmp_path / "missing.jsonl"))

    assert done.returncode == 2
    assert "does not exist" in done.stderr
