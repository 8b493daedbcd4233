"""The command line as a new user meets it: deliberate pushes, a local store
under control, quiet pipes, idempotent replays, honest OTLP reports, Ctrl-C,
validated settings, one vocabulary, and readable runs. Each command runs as a
real subprocess against a real spool and the fake platform on loopback."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest

import prime_runs_otel as pro
from prime_runs_otel.produce.synthetic import synthetic_episodes
from prime_runs_otel.testing import FakePlatform

TIMEOUT = 180
CLI = [sys.executable, "-m", "prime_runs_otel.cli"]


def _cli(*args: str, **extra_env: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, **extra_env}
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


def _json(*args: str, **extra_env: str) -> Any:
    return json.loads(_ok(*args, "--json", **extra_env))


def _local_run(name: str, episodes: int = 12, seed: int = 1, **kwargs: Any) -> str:
    kwargs.setdefault("environments", ["env-a"])
    run = pro.start_run(name=name, model="demo/m", **kwargs)
    for record in synthetic_episodes(episodes, seed=seed):
        run.record_episode(record)
    result = run.finish(timeout=60)
    assert result.mode == "local" and result.closed
    return result.local_id


def _write_traces(folder: Path, count: int, seed: int = 5) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "traces.jsonl"
    with path.open("w") as handle:
        for record in synthetic_episodes(count, seed=seed):
            handle.write(json.dumps(record) + "\n")
    return path


# -- 2. pushing is deliberate; the local store can be emptied ------------------------


def test_push_is_deliberate_and_keeps_the_local_copy(platform: FakePlatform) -> None:
    first = _local_run("first", seed=1)
    second = _local_run("second", seed=2)
    online = platform.client_env()
    records_before = _ok("export", first)

    bare = _cli("push", **online)
    assert bare.returncode == 2
    assert "push --all" in bare.stderr and "2 run(s)" in bare.stderr
    dry = _ok("push", "--all", "--dry-run", **online)
    assert first[:12] in dry and second[:12] in dry and "would push" in dry
    assert platform.runs() == []  # a dry run sends nothing

    pushed = _json("push", first, **online)
    assert [item["id"] for item in pushed["pushed"]] == [first]
    assert pushed["pushed"][0]["state"] == "delivered"
    [platform_run] = platform.runs()
    assert platform_run.name == "first" and platform_run.status == "COMPLETED"
    # Pushing kept the records: export gives what it gave before.
    assert _ok("export", first) == records_before

    _ok("push", second, "--drop-local", **online)
    assert len(platform.runs()) == 2
    dropped = _cli("export", second)
    assert dropped.returncode == 0 and dropped.stdout == ""
    assert "--drop-local" in dropped.stderr


def test_a_run_that_cannot_be_pushed_gets_advice_that_works(platform: FakePlatform) -> None:
    nameless = _local_run("no-env", environments=[])
    empty = _local_run("empty", episodes=0)
    online = platform.client_env()

    attempt = _cli("push", "--all", **online)
    assert attempt.returncode == 1
    assert f"push {nameless[:12]} --environment NAME" in attempt.stdout
    assert f"rm {empty[:12]}" in attempt.stdout
    assert platform.runs() == []

    # The advice, followed as printed, works.
    _ok("push", nameless[:12], "--environment", "env-b", **online)
    [platform_run] = platform.runs()
    assert platform_run.status == "COMPLETED"
    assert len(platform.episodes(platform_run.id)) == 12
    _ok("rm", empty[:12])
    assert [row["id"] for row in _json("runs")] == [nameless]


def test_rm_and_prune_keep_live_runs_and_need_a_filter() -> None:
    kept = _local_run("kept", seed=3)
    old = _local_run("old", seed=4)
    live = pro.start_run(name="live", environments=["env-a"])
    live.record_episode(next(iter(synthetic_episodes(1, seed=9))))
    live.tracer_provider.force_flush()

    refused = _cli("rm", live.id)
    assert refused.returncode == 2 and "--force" in refused.stderr
    assert _cli("prune").returncode == 2

    listed = _ok("prune", "--older-than", "0s", "--dry-run")
    assert kept[:12] in listed or kept in listed
    assert live.id not in listed  # a live run is never pruned
    assert len(_json("runs")) == 3  # a dry run removes nothing

    removed = _json("rm", old)
    assert removed["removed"][0]["episodes"] == 12
    assert {row["id"] for row in _json("runs")} == {kept, live.id}
    _json("prune", "--status", "stored")
    assert [row["id"] for row in _json("runs")] == [live.id]
    live.finish(timeout=30)


# -- 3. a closed pipe is not an error -----------------------------------------------


@pytest.mark.parametrize(
    "command",
    [["export", "RUN"], ["export", "RUN", "--what", "episodes"], ["runs"], ["show", "RUN"]],
    ids=["export", "export-episodes", "runs", "show"],
)
def test_closed_pipe_exits_quietly(command: list[str]) -> None:
    run_id = _local_run("piped", episodes=40)
    args = [run_id if part == "RUN" else part for part in command]
    process = subprocess.Popen(
        [sys.executable, "-m", "prime_runs_otel.cli", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=dict(os.environ),
    )
    assert process.stdout is not None and process.stderr is not None
    process.stdout.close()  # the reader is gone before the first line: `| head -c 0`
    stderr = process.stderr.read().decode()
    assert process.wait(timeout=TIMEOUT) == 0, stderr
    assert "Traceback" not in stderr and "BrokenPipe" not in stderr


# -- 5. replaying the same file stores nothing twice ------------------------------------


def test_replaying_the_same_file_again_adds_nothing(tmp_path: Path) -> None:
    path = _write_traces(tmp_path / "outputs" / "run-a", 10)
    first = _json("replay", str(path.parent), "--environment", "env-a")
    again = _json("replay", str(path), "--environment", "env-a")

    assert first["id"] == again["id"]
    [run] = _json("runs")
    assert run["episodes"] == 10 and run["duplicates"] == 10
    assert len(_ok("export", run["id"]).splitlines()) == len(
        _ok("export", first["id"]).splitlines()
    )
    # A copy of the file elsewhere is the same run; a new key is a new run.
    copy = tmp_path / "copy" / "traces.jsonl"
    copy.parent.mkdir()
    copy.write_bytes(path.read_bytes())
    assert _json("replay", str(copy), "--environment", "env-a")["id"] == first["id"]
    other = _json("replay", str(path), "--environment", "env-a", "--run-key", "second-try")
    assert other["id"] == "second-try" and other["episodes"] == 10


# -- 6. OTLP replay reports what the endpoint did ----------------------------------------


def test_otlp_replay_to_nothing_reports_nothing_accepted(tmp_path: Path) -> None:
    from test_receiver import free_port

    path = _write_traces(tmp_path / "run", 6)
    url = f"http://127.0.0.1:{free_port()}"
    done = _cli("replay", str(path), "--otlp-endpoint", url, "--timeout", "2", "--json")
    assert done.returncode == 1
    report = json.loads(done.stdout)
    assert report["accepted"] == 0 and report["refused"] + report["never_sent"] == 6
    assert f"not reachable: {url}/v1/traces" in done.stderr


def test_otlp_replay_with_a_wrong_token_then_the_sdk_variables(tmp_path: Path) -> None:
    from test_receiver import ServeProcess, serve_env

    serve = ServeProcess(tmp_path, serve_env(tmp_path, None), "--token", "s3cret").start()
    try:
        path = _write_traces(tmp_path / "run", 6)
        refused = _cli("replay", str(path), "--otlp-endpoint", serve.url, "--otlp-token", "nope")
        assert refused.returncode == 1
        assert "0 episode(s) accepted" in refused.stdout and "--otlp-token" in refused.stderr

        # As the SDK reads them: the base endpoint, and headers (URL-encoded).
        accepted = _cli(
            "replay",
            str(path),
            "--otlp",
            "--json",
            OTEL_EXPORTER_OTLP_ENDPOINT=serve.url,
            OTEL_EXPORTER_OTLP_HEADERS="authorization=Bearer%20s3cret",
        )
        assert accepted.returncode == 0, accepted.stderr
        report = json.loads(accepted.stdout)
        assert (report["accepted"], report["refused"], report["never_sent"]) == (6, 0, 0)
    finally:
        serve.stop()
    assert "run " in serve.log() and "opened" in serve.log() and "serve stopped" in serve.log()


# -- 7. Ctrl-C cancels --------------------------------------------------------------------


def test_ctrl_c_during_replay_finishes_the_run_as_cancelled(tmp_path: Path) -> None:
    path = _write_traces(tmp_path / "big", 4000)
    process = subprocess.Popen(
        [sys.executable, "-m", "prime_runs_otel.cli", "replay", str(path), "--environment", "e"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=dict(os.environ),
    )
    assert process.stderr is not None
    # The first progress line says the replay is recording.
    for line in process.stderr:
        if line.startswith("replaying episodes"):
            break
    process.send_signal(signal.SIGINT)
    out, err = process.communicate(timeout=TIMEOUT)
    assert process.returncode == 130, err
    assert "crashed" not in out + err
    [run] = _json("runs")
    assert run["status"] == "cancelled", run
    assert "interrupted" in (run["error"] or "")


# -- 9. bad settings get clear errors, never tracebacks --------------------------------


def test_bad_values_are_refused_with_a_clear_message(tmp_path: Path) -> None:
    push = ["push", "--all", "--dry-run"]
    cases = [
        (["serve", "--http-port", "99999"], {}, "is not a port"),
        (["serve", "--workers", "0"], {}, "must be 1 or more"),
        (["runs"], {"PRIME_RUNS_OTEL_SPOOL_MAX_BYTES": "0"}, "must be more than 0"),
        # The platform's settings are checked by the commands that use them
        # (`runs`, `show` and `export` only read the local store).
        (push, {"PRIME_RUNS_OTEL_FINISH_TIMEOUT": "-1"}, "0 or more"),
        (push, {"PRIME_API_BASE_URL": "api.example.com"}, "not an http(s) URL"),
        (["show", "x", "--interval", "-2"], {}, "0 or more"),
        (["runs", "--since", "yesterday"], {}, "neither an age"),
    ]
    _local_run("exists")
    for args, env, message in cases:
        done = _cli(*args, **env)
        assert done.returncode == 2, (args, done.stderr)
        assert message in done.stderr and "Traceback" not in done.stderr, (args, done.stderr)


def test_an_unreadable_prime_config_is_named() -> None:
    config = Path.home() / ".prime" / "config.json"
    config.parent.mkdir(parents=True, exist_ok=True)
    config.write_text("{not json")
    done = _cli("push", "--all", "--dry-run")
    assert done.returncode == 2 and str(config) in done.stderr and "Traceback" not in done.stderr
    checked = _cli("doctor")  # doctor reports it as a failed check, naming the file
    assert checked.returncode == 1 and str(config) in checked.stdout
    config.unlink()
    config.mkdir()  # unreadable as a file
    done = _cli("push", "--all", "--dry-run")
    assert done.returncode == 2 and "cannot be read" in done.stderr


# -- 11. one vocabulary ---------------------------------------------------------------------


def test_replay_show_and_runs_speak_the_same_json(tmp_path: Path) -> None:
    path = _write_traces(tmp_path / "vocab", 5)
    replayed = _json("replay", str(path), "--environment", "env-a")
    shown = _json("show", replayed["id"])
    [listed] = _json("runs")
    assert set(replayed) - {"bad_lines"} == set(shown) == set(listed)
    for key in ("status", "state", "episodes", "pending", "not_pushed"):
        assert replayed[key] == shown[key] == listed[key], key
    assert (shown["state"], shown["not_pushed"], shown["pending"]) == ("stored", 5, 0)
    table = _ok("runs")
    assert "NOT PUSHED" in table and "stored" in table


def test_every_option_has_help_and_verbose_goes_anywhere() -> None:
    from prime_runs_otel.cli.main import build_parser

    parser = build_parser()
    subparsers = next(a for a in parser._actions if a.choices and isinstance(a.choices, dict))
    assert isinstance(subparsers.choices, dict)
    for name, sub in subparsers.choices.items():
        for action in sub._actions:
            assert action.help, f"{name} {action.option_strings or action.dest} has no help"
    run_id = _local_run("verbose")
    assert run_id in _ok("show", run_id, "-v")
    assert run_id in _ok("-v", "show", run_id)


def test_a_successful_push_clears_the_last_error(platform: FakePlatform) -> None:
    run_id = _local_run("retried")
    wrong = {**platform.client_env(), "PRIME_API_KEY": "wrong"}
    failed = _cli("push", run_id, "--json", **wrong)
    assert failed.returncode == 1
    assert "401" in (json.loads(failed.stdout)["pushed"][0]["last_error"] or "")
    pushed = _json("push", run_id, **platform.client_env())["pushed"][0]
    assert pushed["state"] == "delivered" and pushed["last_error"] is None


# -- 12. watching and reading runs ------------------------------------------------------


def test_runs_filters_and_lookup_by_name() -> None:
    first = _local_run("alpha-eval", seed=1)
    second = _local_run("beta-eval", seed=2)
    assert [row["id"] for row in _json("runs", "--name", "alpha")] == [first]
    assert [row["id"] for row in _json("runs", "--limit", "1")] == [second]
    assert _json("runs", "--kind", "train") == []
    assert len(_json("runs", "--status", "completed", "--since", "1h")) == 2
    assert _json("runs", "--status", "failed") == []
    assert _json("show", "beta-eval")["id"] == second


def test_show_is_a_readable_summary() -> None:
    run_id = _local_run("readable", episodes=60)
    text = _ok("show", run_id)
    assert "error rate" in text and "reward" in text and "histogram of 60" in text
    assert "#" in text  # the reward histogram
    assert f"prime-runs-otel push {run_id[:12]}" in text
    assert not text.lstrip().startswith("{")


def test_show_follow_updates_until_the_run_closes() -> None:
    run = pro.start_run(name="followed", environments=["env-a"])
    records = iter(synthetic_episodes(30, seed=7))
    for record in list(records)[:10]:
        run.record_episode(record)
    run.tracer_provider.force_flush()
    follower = subprocess.Popen(
        [*CLI, "show", run.id, "--follow", "--interval", "0.2", "--json"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=dict(os.environ),
    )
    assert follower.stdout is not None
    first = json.loads(follower.stdout.readline())
    assert first["state"] == "recording" and first["episodes"] == 10
    for record in synthetic_episodes(20, seed=8):
        run.record_episode(record)
    run.finish(timeout=60)
    rest, err = follower.communicate(timeout=TIMEOUT)
    assert follower.returncode == 0, err
    updates = [json.loads(line) for line in rest.splitlines()]
    assert updates[-1]["state"] == "stored" and updates[-1]["episodes"] == 30
    assert {"rate", "pending", "failed", "summary"} <= set(updates[-1])


def test_export_metrics_to_a_file(tmp_path: Path) -> None:
    run = pro.start_run(kind="train", name="trainer", model="base/m")
    for step in range(3):
        run.log_metrics({"loss": 1.0 / (step + 1)}, step=step)
    result = run.finish(timeout=60)
    target = tmp_path / "metrics.jsonl"
    _ok("export", result.local_id, "--what", "metrics", "-o", str(target))
    rows = [json.loads(line) for line in target.read_text().splitlines()]
    assert [row["step"] for row in rows] == [0, 1, 2]
    assert rows[1]["loss"] == 0.5


# -- 13. a verifiers run folder says what the eval was ----------------------------------


def test_replay_reads_what_the_eval_recorded(tmp_path: Path) -> None:
    folder = tmp_path / "outputs" / "evals" / "gsm8k--qwen"
    path = _write_traces(folder, 4)
    resolved = folder / "configs" / "resolved"
    resolved.mkdir(parents=True)
    # The shape verifiers' EvalConfig.model_dump(mode="json") writes there.
    (resolved / "eval.json").write_text(
        json.dumps(
            {
                "model": "Qwen/Qwen3-8B",
                "env": {"id": "gsm8k", "taskset": {"id": ""}},
                "run": {"name": "gsm8k-qwen", "dir": None},
                "num_rollouts": 4,
            }
        )
    )
    (folder / "configs" / "eval.toml").write_text('model = "Qwen/Qwen3-8B"\n')
    shown = _json("replay", str(path.parent))
    assert shown["model"] == "Qwen/Qwen3-8B" and shown["environments"] == ["gsm8k"]
    assert shown["name"] == "gsm8k-qwen"
    # A flag still wins over the folder.
    other = _json("replay", str(path), "--model", "other/m", "--run-key", "flagged")
    assert other["model"] == "other/m"


# -- 14. the fake platform's dashboard URLs answer ----------------------------------


def test_fake_platform_dashboard_urls_answer(platform: FakePlatform) -> None:
    run_id = _local_run("shown-on-dashboard")
    [pushed] = _json("push", run_id, **platform.client_env())["pushed"]
    page = httpx.get(pushed["url"], timeout=10)
    assert page.status_code == 200 and "text/html" in page.headers["content-type"]
    assert "shown-on-dashboard" in page.text and "COMPLETED" in page.text
    missing = httpx.get(f"{platform.url}/dashboard/evaluations/nope", timeout=10)
    assert missing.status_code == 404
