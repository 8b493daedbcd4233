"""The real `vf-eval` (verifiers 0.4.0), offline, reporting to the fake
platform: once through prime-runs itself (`--push`), once unchanged under a
launcher with this package's instrumentation. What the platform holds must
be the same, apart from how uploads are batched and this package's run-key
marker; and the ids, clocks and paths every run has of its own.

The eval is `tests/vf_env/arith_otel` against the deterministic fake
OpenAI-compatible server, in the `subprocess` runtime. Each `vf-eval` is a
process of its own, launcher included, and so is `serve`; inside it, the
harness runs verifiers' own chat program (its source and the argv verifiers
builds for it) as a coroutine on the eval's event loop instead of one Python
process per rollout: every model call still goes through verifiers'
interception endpoint, where the trace that both sides report is recorded,
and an eval costs about half the CPU it did with a process per rollout, a
third under `opentelemetry-instrument` (whose children each loaded every
auto-instrumentation)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from prime_runs_otel.deliver.eval_run import MARKER_KEY
from prime_runs_otel.testing import FakePlatform
from prime_runs_otel.testing.fake_openai import FakeOpenAI

BIN = Path(sys.executable).parent
VF_EVAL = str(BIN / "vf-eval")
INSTRUMENT = str(BIN / "opentelemetry-instrument")
TASKSET = Path(__file__).resolve().parent / "vf_env"
#: A bound on each process a test starts and each wait, not an expected
#: duration: an eval takes seconds of CPU alone, minutes on two cores shared
#: with a full test suite and other work.
PROCESS_TIMEOUT = 600
#: Keys every run fills with its own ids, clocks and places.
VOLATILE = frozenset({"id", "timestamp", "timing", "time", "runtime", "key", "hash"})


@pytest.fixture(scope="module")
def model() -> Iterator[FakeOpenAI]:
    """One model for the module: its answers depend on the question only."""
    with FakeOpenAI(accuracy=0.6) as fake:
        yield fake


@pytest.fixture(scope="module")
def platform() -> Iterator[FakePlatform]:
    """One fake platform for the module, so that one test's run can stand
    beside another's (the platform's environment ids are compared too); the
    tests tell their runs apart by id."""
    with FakePlatform() as fake:
        yield fake


@pytest.fixture(scope="module")
def pushed_once() -> dict[str, dict[str, Any]]:
    return {}


@pytest.fixture
def pushed(
    online: FakePlatform,
    model: FakeOpenAI,
    tmp_path: Path,
    pushed_once: dict[str, dict[str, Any]],
) -> dict[str, Any]:
    """What the platform holds of the default eval through prime-runs itself
    (`--push`): run by the first test that asks, in its environment, and
    compared with by the others (an eval costs seconds of CPU; the tests that
    share it run on one test worker, see their xdist_group)."""
    if "content" not in pushed_once:
        pushed_once["content"] = _pushed(online, model, tmp_path / "sdk")
    return pushed_once["content"]


def vf_eval_command(
    model: FakeOpenAI, out: Path, *args: str, launcher: Sequence[str] = ()
) -> list[str]:
    """`vf-eval arith-otel` as a user types it, with `launcher` in front."""
    sizing = [] if "-n" in args else ["-n", "3", "-r", "2"]
    # The single-agent env's one agent; another env (--env.id) names its own.
    agent = [] if "--env.id" in args else [
        "--env.agent.runtime.type", "subprocess", "--env.agent.harness.id", "arith-otel"
    ]  # fmt: skip
    return [
        *launcher,
        VF_EVAL,
        "arith-otel",
        "-m",
        "demo/model",
        *sizing,
        *agent,
        "--client.base-url",
        model.base_url,
        "--client.api-key-var",
        "FAKE_MODEL_KEY",
        "--run.name",
        "arith-eval",
        "--no-rich",
        "-o",
        str(out),
        *args,
    ]


def vf_eval_env(platform: FakePlatform, env: dict[str, str]) -> dict[str, str]:
    return {
        **os.environ,
        **platform.client_env(),
        "FAKE_MODEL_KEY": "unused",
        "PYTHONPATH": os.pathsep.join(filter(None, [str(TASKSET), os.environ.get("PYTHONPATH")])),
        **env,
    }


def vf_eval(
    platform: FakePlatform,
    model: FakeOpenAI,
    out: Path,
    *args: str,
    launcher: Sequence[str] = (),
    env: dict[str, str] | None = None,
) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(
        vf_eval_command(model, out, *args, launcher=launcher),
        env=vf_eval_env(platform, env or {}),
        capture_output=True,
        text=True,
        timeout=PROCESS_TIMEOUT,
        cwd=out.parent,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    return done


INSTRUMENTED = {
    "OTEL_TRACES_EXPORTER": "prime_runs",
    "OTEL_METRICS_EXPORTER": "none",
    "OTEL_LOGS_EXPORTER": "none",
}


def _normal(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _normal(v) for k, v in value.items() if k not in VOLATILE and k != "run"}
    if isinstance(value, list):
        return [_normal(item) for item in value]
    return value


def platform_content(platform: FakePlatform, run_id: str) -> dict[str, Any]:
    """What the platform holds of one run, without what every run has of its own."""
    run = platform.run(run_id)
    create = dict(run.create_payload)
    create["metadata"] = {k: v for k, v in create.get("metadata", {}).items() if k != MARKER_KEY}
    episodes = [_normal(episode) for episode in platform.episodes(run_id)]
    for episode in platform.episodes(run_id):
        assert episode["run"]["id"] == run_id, "the platform's run id is on every episode"
        assert all(trace["run"]["id"] == run_id for trace in episode.get("traces", []))
    return {
        "name": run.name,
        "kind": run.kind,
        "status": run.status,
        "error": run.error_message,
        "create": create,
        "metadata": {k: v for k, v in run.metadata.items() if k != MARKER_KEY},
        "metrics": run.metrics,
        "finalize_calls": run.finalize_calls,
        "episodes": sorted(episodes, key=lambda episode: json.dumps(episode, sort_keys=True)),
        "samples": sorted(
            (_normal(row) for row in platform.samples(run_id)),
            key=lambda row: json.dumps(row, sort_keys=True),
        ),
    }


def _new_run(platform: FakePlatform, before: set[str]) -> str:
    [run_id] = [run.id for run in platform.runs() if run.id not in before]
    return run_id


def _pushed(platform: FakePlatform, model: FakeOpenAI, root: Path, *args: str) -> dict[str, Any]:
    """The eval through prime-runs itself (`--push`)."""
    before = {run.id for run in platform.runs()}
    root.mkdir()
    vf_eval(platform, model, root / "outputs", *args)
    run_id = _new_run(platform, before)
    assert MARKER_KEY not in platform.run(run_id).metadata
    return platform_content(platform, run_id)


def _launched(
    platform: FakePlatform,
    model: FakeOpenAI,
    root: Path,
    launcher: Sequence[str],
    env: dict[str, str],
    *args: str,
) -> dict[str, Any]:
    """The eval unchanged under the launcher, reported by this package."""
    before = {run.id for run in platform.runs()}
    root.mkdir()
    vf_eval(platform, model, root / "outputs", *args, launcher=launcher, env=env)
    run_id = _new_run(platform, before)
    assert MARKER_KEY in platform.run(run_id).metadata, "this package created the run"
    return platform_content(platform, run_id)


def _twice(
    platform: FakePlatform,
    model: FakeOpenAI,
    tmp_path: Path,
    launcher: Sequence[str],
    env: dict[str, str],
    *args: str,
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The same eval through prime-runs, then under the launcher."""
    sdk = _pushed(platform, model, tmp_path / "sdk", *args)
    return sdk, _launched(platform, model, tmp_path / "otel", launcher, env, *args)


@pytest.mark.xdist_group("vf-eval-pushed")
def test_vf_eval_under_opentelemetry_instrument_lands_as_with_push(
    online: FakePlatform, model: FakeOpenAI, tmp_path: Path, pushed: dict[str, Any]
) -> None:
    otel = _launched(online, model, tmp_path / "otel", [INSTRUMENT], INSTRUMENTED)
    assert otel == pushed
    assert otel["status"] == "COMPLETED" and len(otel["episodes"]) == 6
    assert otel["create"]["environments"] and otel["create"]["framework"] == "verifiers"
    rewards = sorted(e["traces"][0]["rewards"]["correct"]["score"] for e in otel["episodes"])
    assert 0.0 in rewards and 1.0 in rewards, "the fake model is right only some of the time"
    assert otel["metrics"]["prime_runs"] == {"traces_episodes_written": 6}


def test_a_multi_turn_eval_with_a_judge_lands_as_with_push(
    online: FakePlatform, model: FakeOpenAI, tmp_path: Path
) -> None:
    """verifiers' user-sim env (a modeled user, untrainable, talks to the
    assistant for two turns) and a model judge in the task's reward: episodes
    of two traces, judge calls recorded on the assistant's. One task: the
    shape of the episode is what is compared, not how many there are."""
    args = [
        "-n", "1", "-r", "1",
        "--env.id", "user-sim",
        "--env.assistant.runtime.type", "subprocess",
        "--env.assistant.harness.id", "arith-otel",
        "--env.user.runtime.type", "subprocess",
        "--env.user.harness.id", "arith-otel",
        "--env.user.max-turns", "2",
        "--env.taskset.task.judge.base-url", model.base_url,
        "--env.taskset.task.judge.api-key-var", "FAKE_MODEL_KEY",
        "--env.taskset.task.judge.model", "demo/judge",
    ]  # fmt: skip
    sdk, otel = _twice(online, model, tmp_path, [INSTRUMENT], INSTRUMENTED, *args)
    assert otel == sdk
    assert otel["status"] == "COMPLETED" and len(otel["episodes"]) == 1
    for episode in otel["episodes"]:
        assistant, user = episode["traces"]
        assert (assistant["agent"]["trainable"], user["agent"]["trainable"]) == (True, False)
        assert len([n for n in assistant["nodes"] if n["message"]["role"] == "user"]) == 2
        assert assistant["info"]["judge_calls"], "the judge's call is on the record"


def test_a_resumed_eval_lands_as_with_push(
    online: FakePlatform, model: FakeOpenAI, tmp_path: Path
) -> None:
    """A grader breaks on one task, so its rollout ends in error; then
    `--resume` runs it again: a second run holding the kept rollouts and the
    new one. Both runs land as through prime-runs."""
    args = ("-n", "2", "-r", "1")
    contents: dict[str, list[dict[str, Any]]] = {}
    for side, launcher, env in (("sdk", [], {}), ("otel", [INSTRUMENT], INSTRUMENTED)):
        (tmp_path / side).mkdir()
        out = tmp_path / side / "outputs"
        before = {run.id for run in online.runs()}
        broken = {**env, "ARITH_OTEL_BREAK_TASK_1": "1"}
        vf_eval(online, model, out, *args, launcher=launcher, env=broken)
        first = _new_run(online, before)
        vf_eval(online, model, out, *args, "--resume", launcher=launcher, env=env)
        second = _new_run(online, before | {first})
        contents[side] = [platform_content(online, first), platform_content(online, second)]
    assert contents["otel"] == contents["sdk"]
    first, second = contents["otel"]
    assert [episode["ok"] for episode in first["episodes"]].count(False) == 1
    assert len(second["episodes"]) == 2 and all(e["ok"] for e in second["episodes"])
    assert first["status"] == second["status"] == "COMPLETED"


@pytest.mark.xdist_group("vf-eval-pushed")
def test_vf_eval_under_prime_runs_otel_run_lands_as_with_push(
    online: FakePlatform, model: FakeOpenAI, tmp_path: Path, pushed: dict[str, Any]
) -> None:
    """The launcher for those without opentelemetry-distro: no OTEL_*
    setting at all, the same result."""
    launcher = [str(BIN / "prime-runs-otel"), "run", "--"]
    otel = _launched(online, model, tmp_path / "otel", launcher, {})
    assert otel == pushed
    assert otel["status"] == "COMPLETED" and len(otel["episodes"]) == 6


@pytest.mark.xdist_group("vf-eval-pushed")
def test_vf_eval_over_otlp_through_serve_lands_as_with_push(
    online: FakePlatform, model: FakeOpenAI, tmp_path: Path, pushed: dict[str, Any]
) -> None:
    """OTEL_TRACES_EXPORTER=otlp: the eval process only sends OTLP; `serve`
    (its own spool, the platform's credentials) creates, streams and closes
    the run once the eval has exited."""
    from test_receiver import ServeProcess, serve_env

    serve = ServeProcess(tmp_path, serve_env(tmp_path, online)).start()
    try:
        before = {run.id for run in online.runs()}
        (tmp_path / "otel").mkdir()
        otlp = {
            **INSTRUMENTED,
            "OTEL_TRACES_EXPORTER": "otlp",
            "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
            "OTEL_EXPORTER_OTLP_ENDPOINT": serve.url,
            # The eval process has no platform credential: serve holds it.
            "PRIME_API_KEY": "",
        }
        vf_eval(online, model, tmp_path / "otel" / "outputs", launcher=[INSTRUMENT], env=otlp)
        deadline = time.monotonic() + PROCESS_TIMEOUT
        while time.monotonic() < deadline:
            fresh = [run for run in online.runs() if run.id not in before]
            if fresh and fresh[0].closed:
                break
            time.sleep(0.2)
        [otel_run] = [run for run in online.runs() if run.id not in before]
        assert MARKER_KEY in otel_run.metadata
        assert platform_content(online, otel_run.id) == pushed
        assert otel_run.status == "COMPLETED"
    finally:
        serve.stop()


def _interrupted(
    platform: FakePlatform,
    model: FakeOpenAI,
    out: Path,
    how: signal.Signals,
    launcher: Sequence[str],
    env: dict[str, str],
) -> str:
    """vf-eval whose grader hangs on one task, stopped by `how` once the
    other two tasks' episodes are on the platform; the run's id."""
    before = {run.id for run in platform.runs()}
    command = vf_eval_command(model, out, "-n", "3", "-r", "1", launcher=launcher)
    process = subprocess.Popen(
        command,
        env=vf_eval_env(platform, {**env, "ARITH_OTEL_HANG_TASK_2": "1"}),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        cwd=out.parent,
    )
    try:
        deadline = time.monotonic() + PROCESS_TIMEOUT
        run_id = None
        while time.monotonic() < deadline and process.poll() is None:
            fresh = [run.id for run in platform.runs() if run.id not in before]
            if fresh and len(platform.episodes(fresh[0])) >= 2:
                run_id = fresh[0]
                break
            time.sleep(0.1)
        assert run_id is not None, "the two finished episodes never reached the platform"
        process.send_signal(how)
        process.wait(timeout=PROCESS_TIMEOUT)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    return run_id


def test_an_interrupted_eval_ends_as_with_push_or_better(
    online: FakePlatform, model: FakeOpenAI, tmp_path: Path
) -> None:
    """Ctrl-C: both runs are cancelled, with the same episodes."""
    ids = {}
    for side, launcher, env in (("sdk", [], {}), ("otel", [INSTRUMENT], INSTRUMENTED)):
        (tmp_path / side).mkdir()
        out = tmp_path / side / "outputs"
        ids[side] = _interrupted(online, model, out, signal.SIGINT, launcher, env)
    assert platform_content(online, ids["otel"]) == platform_content(online, ids["sdk"])
    assert online.run(ids["otel"]).status == "CANCELLED"


def test_a_killed_eval_is_closed_as_crashed_by_the_next_process(
    online: FakePlatform, model: FakeOpenAI, tmp_path: Path
) -> None:
    """kill -9: prime-runs' own run would stay RUNNING for good (nothing of
    it is left to end it); this package's is closed as crashed, with the
    episodes that were out, by the next process on the spool
    (`prime-runs-otel push`)."""
    out = tmp_path / "outputs"
    out.parent.mkdir(exist_ok=True)
    run_id = _interrupted(online, model, out, signal.SIGKILL, [INSTRUMENT], INSTRUMENTED)
    assert online.run(run_id).status == "RUNNING"
    pushed = subprocess.run(
        [str(BIN / "prime-runs-otel"), "push", "--all"],
        env=vf_eval_env(online, {}),
        capture_output=True,
        text=True,
        timeout=PROCESS_TIMEOUT,
    )
    assert pushed.returncode == 0, pushed.stderr
    crashed = online.run(run_id)
    assert crashed.status == "FAILED" and (crashed.error_message or "").startswith("crashed")
    assert len(online.episodes(run_id)) == 2


def test_vf_eval_under_the_launcher_without_a_key_is_kept_locally(
    model: FakeOpenAI, tmp_path: Path
) -> None:
    """No key anywhere: `vf-eval`, which asks prime-runs for an online run,
    runs to its end under the launcher, and its run is in the local store,
    as the launcher says before it starts."""
    out = tmp_path / "outputs"
    out.mkdir()
    env = {
        **os.environ,
        "FAKE_MODEL_KEY": "unused",
        "PYTHONPATH": os.pathsep.join(filter(None, [str(TASKSET), os.environ.get("PYTHONPATH")])),
    }
    assert not env.get("PRIME_API_KEY")
    launcher = [str(BIN / "prime-runs-otel"), "run", "--"]
    done = subprocess.run(
        vf_eval_command(model, out, launcher=launcher),
        env=env,
        capture_output=True,
        text=True,
        timeout=PROCESS_TIMEOUT,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    assert "no API key, so runs are kept locally" in done.stderr
    listed = subprocess.run(
        [str(BIN / "prime-runs-otel"), "runs", "--json"],
        capture_output=True,
        text=True,
        timeout=PROCESS_TIMEOUT,
        check=True,
    )
    (run,) = json.loads(listed.stdout)
    assert run["mode"] == "local" and run["name"] == "arith-eval", run
    assert run["episodes"] == 6 and run["status"] == "completed", run
