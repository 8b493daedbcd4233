"""The prime_runs instrumentation against prime-runs itself: the same calls,
once through the real prime-runs 0.1.4 and once through ``prime_runs.init``
patched by ``PrimeRunsInstrumentor``, against the fake platform on loopback.
What the platform holds must be the same, apart from how uploads are batched
and this package's run-key marker in the run's metadata.

The callers are verifiers' ``vf-eval --push`` (``open_run``/``log_episodes``/
``finish_run``/``abort_run`` in ``verifiers/v1/utils/platform.py``, called
here as it calls them) and a training loop in prime-rl's pattern (a
``kind="train"`` run with its ``TrainingSpec``, a metrics row and a batch of
episodes per step, ``$RUN_ID`` to attach to a hosted run)."""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import prime_runs as pr
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from prime_runs_otel.deliver.eval_run import MARKER_KEY
from prime_runs_otel.instrumentation.prime_runs import PrimeRunsInstrumentor
from prime_runs_otel.instrumentation.prime_runs import _hook as hook
from prime_runs_otel.instrumentation.prime_runs.run import InstrumentedRun
from prime_runs_otel.produce.synthetic import synthetic_episode, synthetic_episodes
from prime_runs_otel.testing import FakePlatform

TEAM = "team-rl"
IDENTITY: dict[str, Any] = {
    "name": "gsm8k-eval",
    "environments": ["gsm8k-demo"],
    "model": "demo/model",
    "framework": "verifiers",
    "tags": ["nightly"],
    "config": {"model": "demo/model", "num_examples": 10, "rollouts_per_example": 3},
}


@pytest.fixture
def instrumented() -> Iterator[None]:
    instrumentor = PrimeRunsInstrumentor()
    instrumentor.instrument()
    try:
        yield
    finally:
        instrumentor.uninstrument()


def _both(run_one: Any) -> tuple[str, str]:
    """The same calls through prime-runs, then through the instrumentation."""
    sdk_id = run_one()
    instrumentor = PrimeRunsInstrumentor()
    instrumentor.instrument()
    try:
        otel_id = run_one()
    finally:
        instrumentor.uninstrument()
    return sdk_id, otel_id


def platform_view(platform: FakePlatform, run_id: str) -> dict[str, Any]:
    """Everything the platform holds of one run, with the run's id, the
    marker and the per-request timestamps taken out."""
    run = platform.run(run_id)
    metadata = {key: value for key, value in run.metadata.items() if key != MARKER_KEY}
    create = dict(run.create_payload)
    if "metadata" in create:
        # The marker is all the metadata of a run created without a config.
        create["metadata"] = {k: v for k, v in create["metadata"].items() if k != MARKER_KEY}
        if not create["metadata"]:
            del create["metadata"]
    episodes = sorted(platform.episodes(run_id), key=lambda episode: episode["id"])
    metrics_rows = [
        {key: value for key, value in row.items() if key != "_timestamp"}
        for row in platform.training_metrics(run_id)
    ]
    view = {
        "name": run.name,
        "kind": run.kind,
        "status": run.status,
        "error": run.error_message,
        "create": create,
        "metadata": metadata,
        "metrics": run.metrics,
        "team": run.team_id,
        "finalize_calls": run.finalize_calls,
        "episodes": episodes,
        "samples": sorted(platform.samples(run_id), key=lambda row: json.dumps(row)),
        "metrics_rows": sorted(metrics_rows, key=lambda row: row.get("step", -1)),
        "step_objects": sorted(
            (sample.step for sample in platform.training_samples(run_id)),
        ),
    }
    return json.loads(json.dumps(view).replace(run_id, "<run>"))


def _episodes(wire_episode: Any, count: int, seed: int) -> list[Any]:
    return [wire_episode.model_validate(r) for r in synthetic_episodes(count, seed=seed)]


# -- the instrumentor itself ---------------------------------------------------


def test_the_instrumentor_is_registered_for_opentelemetry_instrument() -> None:
    from importlib.metadata import distribution, entry_points

    from opentelemetry.instrumentation.dependencies import get_dist_dependency_conflicts

    [entry] = entry_points(group="opentelemetry_instrumentor", name="prime_runs")
    assert entry.load() is PrimeRunsInstrumentor
    assert PrimeRunsInstrumentor().instrumentation_dependencies() == ("prime-runs >= 0.1.4, < 0.2",)
    # opentelemetry-instrument checks the `instruments` extra before it loads one.
    assert get_dist_dependency_conflicts(distribution("prime-runs-otel")) is None


def test_patching_waits_for_prime_runs_and_costs_nothing_before() -> None:
    """In a fresh process: installing the hook imports nothing but the
    standard library; importing prime_runs patches it, and a name taken with
    `from prime_runs import init` afterwards is the patched one; the
    pipeline itself is loaded only by the first init()."""
    script = textwrap.dedent(
        """
        import sys
        before = set(sys.modules)
        from prime_runs_otel.instrumentation.prime_runs import _hook
        _hook.install()
        loaded = set(sys.modules) - before
        ours = {"prime_runs_otel", "prime_runs_otel.instrumentation",
                "prime_runs_otel.instrumentation.hook",
                "prime_runs_otel.instrumentation.prime_runs",
                "prime_runs_otel.instrumentation.prime_runs._hook"}
        assert not [m for m in loaded - ours if not m.startswith("_")], loaded
        assert "prime_runs" not in sys.modules
        from prime_runs import init
        import prime_runs, prime_runs.run
        assert hasattr(prime_runs.init, _hook.ORIGINAL_ATTRIBUTE)
        assert init is prime_runs.init is prime_runs.run.init
        assert "prime_runs_otel.run" not in sys.modules
        assert "prime_runs_otel.deliver.spool" not in sys.modules
        _hook.uninstall()
        assert not hasattr(prime_runs.init, _hook.ORIGINAL_ATTRIBUTE)
        assert not hasattr(prime_runs.run.init, _hook.ORIGINAL_ATTRIBUTE)
        print("ok")
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok"


def test_instrumenting_after_import_patches_at_once_and_uninstrument_restores() -> None:
    original = pr.init
    instrumentor = PrimeRunsInstrumentor()
    instrumentor.instrument()
    try:
        assert pr.init is not original
        assert getattr(pr.init, hook.ORIGINAL_ATTRIBUTE) is original
        instrumentor.instrument()  # a second call is a no-op, not a second patch
        assert getattr(pr.init, hook.ORIGINAL_ATTRIBUTE) is original
    finally:
        instrumentor.uninstrument()
    assert pr.init is original


# -- evals, as vf-eval --push calls prime-runs -----------------------------------


@pytest.mark.parametrize("opt_out", [False, True], ids=["prime-traces", "legacy-samples"])
def test_an_eval_lands_exactly_as_through_prime_runs(
    online: FakePlatform, monkeypatch: pytest.MonkeyPatch, wire_episode: Any, opt_out: bool
) -> None:
    if opt_out:
        monkeypatch.setenv("PRIME_TRACES_OPT_OUT", "true")
    episodes = _episodes(wire_episode, 24, seed=4)
    seen: list[dict[str, Any]] = []

    def eval_run() -> str:
        run = pr.init(mode="online", id=None, **IDENTITY)
        run.log_episodes(episodes[:4])  # resumed rollouts first, then one at a time
        for episode in episodes[4:]:
            run.log_episodes([episode])
        seen.append({"url": run.url, "finished": run.finished, "errors": list(run.errors)})
        run.finish(pr.metrics.from_episodes(episodes), status=pr.RunStatus.COMPLETED, error=None)
        assert run.finished and run.status is pr.RunStatus.COMPLETED
        assert (run.errors, run.failed_records, run.dropped_records) == ([], {}, 0)
        return str(run.id)

    sdk_id, otel_id = _both(eval_run)

    assert len(online.runs()) == 2, "one run each, never a second one"
    assert platform_view(online, otel_id) == platform_view(online, sdk_id)
    assert online.run(otel_id).metadata[MARKER_KEY]["run_key"]
    assert online.run(otel_id).status == "COMPLETED"
    assert len(online.episodes(otel_id)) == (0 if opt_out else 24)
    # The run's id is the platform's before the first episode, as with prime-runs.
    assert [state["url"] for state in seen] == [
        f"{online.url}/dashboard/evaluations/{sdk_id}",
        f"{online.url}/dashboard/evaluations/{otel_id}",
    ]
    assert seen[1]["finished"] is False and seen[1]["errors"] == []


def test_a_config_file_is_stored_as_prime_runs_stores_it(
    online: FakePlatform, tmp_path: Path, wire_episode: Any
) -> None:
    config_file = tmp_path / "eval.toml"
    config_file.write_text('model = "demo/model"  # the launched file\n', encoding="utf-8")
    episodes = _episodes(wire_episode, 3, seed=1)

    def eval_run() -> str:
        identity = {**IDENTITY, "config": str(config_file)}
        with pr.init(mode="online", **identity) as run:
            run.log_episodes(episodes)
        return str(run.id)

    sdk_id, otel_id = _both(eval_run)
    assert platform_view(online, otel_id) == platform_view(online, sdk_id)
    assert online.run(otel_id).metadata["config_source"]["filename"] == "eval.toml"


def _launch(platform: FakePlatform) -> str:
    answer = httpx.post(
        f"{platform.url}/api/v1/evaluations/",
        json={"name": "hosted", "environments": [{"id": "env-launcher"}], "tags": []},
        headers={"Authorization": f"Bearer {platform.api_key}"},
    )
    answer.raise_for_status()
    return str(answer.json()["evaluation_id"])


@pytest.mark.parametrize("ending", ["completed", "failed"])
def test_run_attach_streams_into_the_launchers_run(
    online: FakePlatform, wire_episode: Any, ending: str
) -> None:
    """`vf-eval --run.attach $EVALUATION_ID`: no run is created, a clean end
    completes it, and a failure is left for the launcher to mark."""
    episodes = _episodes(wire_episode, 6, seed=2)
    launched = [_launch(online), _launch(online)]

    def attached_run() -> str:
        run = pr.init(mode="online", id=launched.pop(0), **IDENTITY)
        assert run.attached and run.url and run.url.endswith(run.id)
        run.log_episodes(episodes)
        if ending == "completed":
            run.finish(pr.metrics.from_episodes(episodes))
        else:
            run.finish(status=pr.RunStatus.FAILED, error="RuntimeError: grader crashed")
        return str(run.id)

    sdk_id, otel_id = _both(attached_run)
    assert len(online.runs()) == 2, "an attached run is never created again"
    assert platform_view(online, otel_id) == platform_view(online, sdk_id)
    assert online.run(otel_id).status == ("COMPLETED" if ending == "completed" else "RUNNING")


@pytest.mark.parametrize(
    ("raised", "status"),
    [(RuntimeError("grader crashed"), "FAILED"), (KeyboardInterrupt(), "CANCELLED")],
    ids=["exception", "ctrl-c"],
)
def test_an_eval_that_breaks_is_closed_as_prime_runs_closes_it(
    online: FakePlatform, wire_episode: Any, raised: BaseException, status: str
) -> None:
    """verifiers' `abort_run`: an exception fails the run, Ctrl-C cancels it;
    and the `with` form of the same."""
    episodes = _episodes(wire_episode, 5, seed=6)

    def abort_run() -> str:
        run = pr.init(mode="online", **IDENTITY)
        run.log_episodes(episodes)
        if isinstance(raised, KeyboardInterrupt):
            run.finish(status=pr.RunStatus.CANCELLED, error="interrupted")
        else:
            run.finish(status=pr.RunStatus.FAILED, error=f"RuntimeError: {raised}")
        assert run.status is not pr.RunStatus.RUNNING and run.finished
        run.finish(status=pr.RunStatus.COMPLETED)  # a second close changes nothing
        return str(run.id)

    def with_block() -> str:
        with pytest.raises(type(raised)), pr.init(mode="online", **IDENTITY) as run:
            run.log_episodes(episodes)
            raise raised
        return str(run.id)

    for calls in (abort_run, with_block):
        sdk_id, otel_id = _both(calls)
        assert platform_view(online, otel_id) == platform_view(online, sdk_id)
        assert online.run(otel_id).status == status


def test_a_finished_run_refuses_more_records_as_prime_runs_does(
    online: FakePlatform, instrumented: None, wire_episode: Any
) -> None:
    run = pr.init(mode="online", **IDENTITY)
    run.finish()
    with pytest.raises(pr.RunFinishedError):
        run.log_episodes(_episodes(wire_episode, 1, seed=0))
    with pytest.raises(pr.RunFinishedError):
        run.log_metrics({"loss": 1.0}, step=1)


def test_disabled_runs_are_prime_runs_own_and_send_nothing(
    online: FakePlatform, instrumented: None, monkeypatch: pytest.MonkeyPatch, wire_episode: Any
) -> None:
    """`--no-push` asks for mode="disabled", and PRIME_RUNS_MODE=disabled is
    the kill switch: prime-runs' disabled run answers, as without us."""
    run = pr.init(mode="disabled", **IDENTITY)
    assert type(run) is pr.Run and run.id.startswith("disabled-")
    run.log_episodes(_episodes(wire_episode, 2, seed=0))
    run.finish()
    monkeypatch.setenv("PRIME_RUNS_MODE", "disabled")
    run = pr.init(**IDENTITY)
    assert type(run) is pr.Run
    run.finish()
    assert online.runs() == [] and online.requests() == []


def test_online_without_a_key_is_refused_as_prime_runs_refuses_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`vf-eval --push` without a key: init raises, verifiers says so and
    goes on without a run."""
    with pytest.raises(pr.ConfigurationError):
        pr.init(mode="online", **IDENTITY)
    instrumentor = PrimeRunsInstrumentor()
    instrumentor.instrument()
    try:
        with pytest.raises(pr.ConfigurationError, match="PRIME_API_KEY"):
            pr.init(mode="online", **IDENTITY)
    finally:
        instrumentor.uninstrument()


def test_without_a_key_and_no_mode_the_run_stays_in_the_local_store(
    instrumented: None, wire_episode: Any
) -> None:
    """prime-runs drops such a run (disabled, with a warning); this package
    keeps it, closed, in the local store, for `prime-runs-otel push` later."""
    run = pr.init(**IDENTITY)
    assert isinstance(run, InstrumentedRun) and run.mode == "local"
    run.log_episodes(_episodes(wire_episode, 3, seed=0))
    run.finish()
    done = subprocess.run(
        [sys.executable, "-m", "prime_runs_otel.cli", "show", run.local_id, "--json"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    shown = json.loads(done.stdout)
    assert shown["episodes"] == 3 and shown["status"] == "completed"


def test_bad_input_is_refused_alone_and_reported(
    online: FakePlatform, instrumented: None, wire_episode: Any
) -> None:
    good = _episodes(wire_episode, 2, seed=9)
    run = pr.init(mode="online", **IDENTITY)
    run.log_episodes([good[0], "not an episode", {"id": "x"}, good[1]])
    assert run.failed_records == {"prime-runs-otel": 2}
    assert len(run.errors) == 2 and "recording an episode failed" in run.errors[0]
    run.finish()
    assert len(online.episodes(run.id)) == 2
    assert online.run(run.id).status == "COMPLETED"
    with pytest.raises(TypeError, match="unexpected keyword"):
        pr.init(mode="online", nmae="typo")
    with pytest.raises(pr.ConfigurationError, match="kind"):
        pr.init(mode="online", kind="sweep")
    with pytest.raises(pr.ConfigurationError, match="on_error"):
        pr.init(mode="online", on_error="explode", **IDENTITY)
    assert len(online.runs()) == 1, "a refused init opens no run"


def test_live_attributes_tell_what_is_pending_during_an_outage(
    online: FakePlatform, instrumented: None, wire_episode: Any
) -> None:
    """verifiers' dashboard reads url/finished/errors/failed_records/
    dropped_records on every refresh: during an outage the episodes are
    pending, and nothing is an error, since nothing is lost."""
    episodes = _episodes(wire_episode, 8, seed=3)
    run = pr.init(mode="online", **IDENTITY)
    assert run.url == f"{online.url}/dashboard/evaluations/{run.id}"
    with online.outage():
        run.log_episodes(episodes)
        deadline = time.monotonic() + 60
        while run.pending_records < len(episodes) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert run.pending_records == len(episodes)
        assert (run.errors, run.failed_records, run.dropped_records) == ([], {}, 0)
        assert not run.finished
    run.finish(pr.metrics.from_episodes(episodes))
    assert run.pending_records == 0 and run.errors == []
    assert len(online.episodes(run.id)) == len(episodes)


# -- the process ending without finish() --------------------------------------

_UNFINISHED = textwrap.dedent(
    """
    import os, sys
    import prime_runs as pr
    from verifiers.v1 import WireEpisode
    from prime_runs_otel.produce.synthetic import synthetic_episodes
    if sys.argv[1] == "instrumented":
        from prime_runs_otel.instrumentation.prime_runs import PrimeRunsInstrumentor
        PrimeRunsInstrumentor().instrument()
    run = pr.init(mode="online", name="unfinished", environments=["gsm8k-demo"],
                  model="demo/model", framework="verifiers")
    run.log_episodes([WireEpisode.model_validate(r) for r in synthetic_episodes(4, seed=1)])
    if sys.argv[2] == "kill":
        run.flush(30)  # the episodes are out of the process before it is killed
    print(run.id, flush=True)
    if sys.argv[2] == "kill":
        sys.stdin.readline()
    """
)


def _unfinished(how: str, which: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", _UNFINISHED, which, how],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def test_a_process_that_exits_without_finishing_reports_the_run_crashed(
    online: FakePlatform,
) -> None:
    ids = []
    for which in ("sdk", "instrumented"):
        process = _unfinished("exit", which)
        out, err = process.communicate(timeout=180)
        assert process.returncode == 0, err
        ids.append(out.split()[0])
    sdk_id, otel_id = ids
    assert platform_view(online, otel_id) == platform_view(online, sdk_id)
    assert online.run(otel_id).status == "FAILED"
    assert (online.run(otel_id).error_message or "").startswith("crashed")


def test_a_killed_process_leaves_the_run_crashed_not_running(online: FakePlatform) -> None:
    """prime-runs cannot tell the platform anything after SIGKILL: its run
    stays RUNNING (nothing of it is left to end it, so its own side is not
    run here: a process of seconds of CPU that shows nothing of this
    package). This package's run stays RUNNING until its next process on the
    spool (here `push`) finds the producer gone and closes the run as
    crashed, every episode in."""
    process = _unfinished("kill", "instrumented")
    assert process.stdout is not None
    otel_id = process.stdout.readline().split()[0]
    os.kill(process.pid, signal.SIGKILL)
    process.wait(timeout=60)
    assert online.run(otel_id).status == "RUNNING"
    pushed = subprocess.run(
        [sys.executable, "-m", "prime_runs_otel.cli", "push", otel_id],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert pushed.returncode == 0, pushed.stdout + pushed.stderr
    assert online.run(otel_id).status == "FAILED"
    assert (online.run(otel_id).error_message or "").startswith("crashed")
    assert len(online.episodes(otel_id)) == 4


# -- training, in prime-rl's pattern ----------------------------------------------


def _step_episodes(wire_episode: Any, step: int, count: int) -> list[Any]:
    episodes = []
    for index in range(count):
        record = synthetic_episode(step * 10 + index, seed=7, judge=False, error=False)
        record["run"] = {
            "type": "train",
            "id": "rl",
            "name": "rl",
            "work": {"type": "train", "step": step},
        }
        episodes.append(wire_episode.model_validate(record))
    return episodes


def _trainer(wire_episode: Any, steps: int, *, attach: str | None = None) -> Any:
    """What prime-rl's orchestrator does through the SDK: open the run with
    its training fields (or attach to $RUN_ID), then per step one metrics
    row and the step's episodes, and finish at the end."""

    def train() -> str:
        run = pr.init(
            kind="train",
            id=attach,
            name="rl-gsm8k",
            model="base/policy",
            environments=["gsm8k-demo"],
            config={"lr": 1e-6, "loss": "grpo"},
            training=pr.TrainingSpec(
                max_steps=steps, batch_size=8, rollouts_per_example=4, seq_len=2048,
                wandb_project="rl",
            ),
        )  # fmt: skip
        for step in range(steps):
            run.log_metrics({"loss": 1.0 / (step + 1), "reward/mean": step / 10}, step=step)
            run.log_episodes(_step_episodes(wire_episode, step, 3))
        run.finish()
        assert run.status is pr.RunStatus.COMPLETED and run.kind == "train"
        return str(run.id)

    return train


@pytest.mark.parametrize("opt_out", [False, True], ids=["prime-traces", "step-table"])
def test_a_training_run_lands_exactly_as_through_prime_runs(
    online: FakePlatform, monkeypatch: pytest.MonkeyPatch, wire_episode: Any, opt_out: bool
) -> None:
    monkeypatch.setenv("PRIME_TEAM_ID", TEAM)
    if opt_out:
        monkeypatch.setenv("PRIME_TRACES_OPT_OUT", "true")
    sdk_id, otel_id = _both(_trainer(wire_episode, 11))
    sdk, otel = platform_view(online, sdk_id), platform_view(online, otel_id)
    assert otel == sdk
    assert otel["kind"] == "train" and otel["status"] == "COMPLETED"
    assert [row["step"] for row in otel["metrics_rows"]] == list(range(11))
    if opt_out:
        assert otel["step_objects"] == [0, 10]  # every 10th step, as prime-runs does
    else:
        assert len(otel["episodes"]) == 33


def test_a_hosted_training_run_is_attached_to(
    online: FakePlatform, monkeypatch: pytest.MonkeyPatch, wire_episode: Any
) -> None:
    from prime_runs_otel.deliver.platform.rft import RftAPI, TrainingFields, external_run_payload

    monkeypatch.setenv("PRIME_TEAM_ID", TEAM)
    launcher = RftAPI(api_key=online.api_key, base_url=online.url, frontend_url=online.url)
    hosted = [
        launcher.create(
            external_run_payload(
                base_model="base/policy",
                team_id=TEAM,
                environments=["gsm8k-demo"],
                training=TrainingFields(max_steps=3),
            )
        )["id"]
        for _ in range(2)
    ]
    queue = list(hosted)

    def trainer() -> str:
        return str(_trainer(wire_episode, 3, attach=queue.pop(0))())

    sdk_id, otel_id = _both(trainer)
    assert (sdk_id, otel_id) == tuple(hosted)
    assert len(online.runs()) == 2, "an attached run is never created again"
    sdk, otel = platform_view(online, sdk_id), platform_view(online, otel_id)
    # The launcher named each run after its id.
    assert otel.pop("name") != sdk.pop("name")
    assert otel == sdk
    assert online.run(otel_id).status == "COMPLETED"


# -- prime-runs-otel run -------------------------------------------------------


def _cli_run(*command: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "prime_runs_otel.cli", "run", *command],
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_the_launcher_passes_the_exit_code_through_and_instruments_children() -> None:
    script = (
        "import subprocess, sys, prime_runs\n"
        "from prime_runs_otel.instrumentation.prime_runs import _hook\n"
        "assert hasattr(prime_runs.init, _hook.ORIGINAL_ATTRIBUTE)\n"
        "child = 'import prime_runs, sys; from prime_runs_otel.instrumentation.prime_runs "
        "import _hook; sys.exit(0 if hasattr(prime_runs.init, _hook.ORIGINAL_ATTRIBUTE) else 5)'\n"
        "assert subprocess.run([sys.executable, '-c', child]).returncode == 0\n"
        "sys.exit(7)\n"
    )
    done = _cli_run("--", sys.executable, "-c", script)
    assert done.returncode == 7, done.stderr


@pytest.mark.parametrize(
    ("command", "message"),
    [((), "nothing to run"), (("--",), "nothing to run"), (("no-such-program-x",), "not found")],
)
def test_the_launcher_says_what_is_wrong_with_its_command(
    command: tuple[str, ...], message: str
) -> None:
    done = _cli_run(*command)
    assert done.returncode == 2
    assert message in done.stderr


#: What an environment variable can hold: no NUL, no lone surrogate.
env_text = st.characters(exclude_characters="\x00", exclude_categories=("Cs",))


@settings(max_examples=200, deadline=None)
@given(st.text(env_text, max_size=12))
def test_the_init_timeout_setting_is_a_number_or_a_clear_error(raw: str) -> None:
    from prime_runs_otel.instrumentation.prime_runs.patched_init import (
        INIT_TIMEOUT_ENV,
        _init_timeout,
    )

    saved = os.environ.get(INIT_TIMEOUT_ENV)
    os.environ[INIT_TIMEOUT_ENV] = raw
    try:
        try:
            value = _init_timeout()
        except pr.ConfigurationError as exc:
            assert INIT_TIMEOUT_ENV in str(exc)
        else:
            assert value >= 0 and math.isfinite(value)
    finally:
        if saved is None:
            os.environ.pop(INIT_TIMEOUT_ENV, None)
        else:
            os.environ[INIT_TIMEOUT_ENV] = saved


@settings(max_examples=100, deadline=None)
@given(st.text(env_text, max_size=30))
def test_any_exporter_name_is_used_or_refused_with_what_to_do(raw: str) -> None:
    from prime_runs_otel.instrumentation.delivery import exporter_names as _exporter_names
    from prime_runs_otel.instrumentation.prime_runs.patched_init import _load_exporter

    saved = os.environ.get("OTEL_TRACES_EXPORTER")
    os.environ["OTEL_TRACES_EXPORTER"] = raw
    try:
        try:
            names = _exporter_names()
            for name in names:
                if name != "prime_runs":
                    _load_exporter(name).shutdown()
        except pr.ConfigurationError as exc:
            assert "OTEL_TRACES_EXPORTER" in str(exc) or "OTLP protocol" in str(exc)
    finally:
        if saved is None:
            os.environ.pop("OTEL_TRACES_EXPORTER", None)
        else:
            os.environ["OTEL_TRACES_EXPORTER"] = saved


def test_a_hosted_training_runs_rft_root_is_kept_for_delivery(
    instrumented: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A hosted run's launcher hands the trainer the platform's internal RFT
    root ($PRIME_API_BASE) and its run id ($RUN_ID); both reach delivery as
    given (kept local here: the fake platform serves only the public API)."""
    from prime_runs_otel.deliver.platform.rft import INTERNAL_API_PATH, split_api_root

    monkeypatch.setenv("PRIME_RUNS_MODE", "local")
    run = pr.init(
        kind="train",
        id="run-hosted-1",
        base_url="https://api.example/api/internal/rft",
        model="base/policy",
        environments=["gsm8k-demo"],
        training=pr.TrainingSpec(max_steps=3),
    )
    try:
        assert isinstance(run, InstrumentedRun) and run.attached and run.id == "run-hosted-1"
        settings = run._delivery.run.settings  # type: ignore[attr-defined]
        assert split_api_root(settings.base_url) == ("https://api.example", INTERNAL_API_PATH)
    finally:
        run.finish()
