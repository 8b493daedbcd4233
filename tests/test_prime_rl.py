"""prime-rl's reporting, unchanged, through this package: the stand-in of
prime-rl's monitors and orchestrator loop (``tests/prime_rl_standin``, which
names the prime-rl commit it follows) run once with prime-rl's own
``PrimeMonitor`` and once under ``opentelemetry-instrument`` or
``prime-runs-otel run --``, against the same fake platform, and what each
leaves there compared field by field, for every way the loop can end."""

from __future__ import annotations

import io
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
from hypothesis import given, settings
from hypothesis import strategies as st

from prime_runs_otel.config import resolve_settings
from prime_runs_otel.deliver.platform.rft import RftAPI, TrainingFields, external_run_payload
from prime_runs_otel.deliver.spool import Spool
from prime_runs_otel.testing import FakePlatform

STANDIN = Path(__file__).resolve().parent / "prime_rl_standin"
ORCHESTRATE = str(STANDIN / "orchestrate.py")
TRAIN = str(STANDIN / "train.py")
BIN = Path(sys.executable).parent

#: A bound on each process a test starts, not an expected duration: a
#: 12-step run takes seconds alone, minutes on two cores shared with a full
#: test suite.
PROCESS_TIMEOUT = 600

#: opentelemetry-instrument, delivering in process (the distro's default is OTLP).
#: The openai instrumentations the test extra installs (for the dialect tests)
#: are left out: the stand-in never imports openai, and loading them imports
#: it, about 3 s of CPU per process for nothing these tests read.
INSTRUMENT_ENV = {
    "OTEL_TRACES_EXPORTER": "prime_runs",
    "OTEL_METRICS_EXPORTER": "none",
    "OTEL_LOGS_EXPORTER": "none",
    "OTEL_PYTHON_DISABLED_INSTRUMENTATIONS": "openai",
}


def _env(platform: FakePlatform, **extra: str) -> dict[str, str]:
    """The process environment prime-rl is launched with: its API base and
    key, and the stand-in on ``PYTHONPATH`` (tests only)."""
    env = dict(os.environ)
    env.update(platform.client_env())
    env["PRIME_API_BASE"] = f"{platform.url}/api/v1/rft"
    env["PYTHONPATH"] = os.pathsep.join(
        [str(STANDIN), *[p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]]
    )
    env.update(extra)
    return env


def _command(how: str, script: str, *args: str) -> list[str]:
    python = [sys.executable, script, *args]
    if how == "own":
        return python
    if how == "instrument":
        return [str(BIN / "opentelemetry-instrument"), *python]
    if how == "launcher":
        return [sys.executable, "-m", "prime_runs_otel.cli", "run", "--", *python]
    raise ValueError(how)


def _orchestrate(
    how: str, platform: FakePlatform, tmp_path: Path, *args: str, **env: str
) -> subprocess.CompletedProcess[str]:
    out = tmp_path / "outputs"  # one for both sides: it is in the run config
    if how == "instrument":
        env = {**INSTRUMENT_ENV, **env}
    return subprocess.run(
        _command(how, ORCHESTRATE, "--output-dir", str(out), *args),
        env=_env(platform, **env),
        capture_output=True,
        text=True,
        timeout=PROCESS_TIMEOUT,
    )


def _new_run(platform: FakePlatform, before: set[str]) -> Any:
    [run] = [run for run in platform.runs() if run.id not in before]
    return run


def _ids(platform: FakePlatform) -> set[str]:
    return {run.id for run in platform.runs()}


def _table(platform: FakePlatform, run_id: str) -> list[tuple[int, list[dict[str, Any]]]]:
    """Each confirmed Parquet object's step and rows, run id and time left out."""
    tables = []
    for stored in platform.training_samples(run_id):
        rows = pq.read_table(io.BytesIO(stored.data)).to_pylist()
        for row in rows:
            assert row.pop("run_id") == run_id
            row.pop("created_at")
        tables.append((stored.step, rows))
    return sorted(tables, key=lambda item: item[0])


def _posted_rows(platform: FakePlatform, run_id: str) -> dict[int, dict[str, Any]]:
    """Every metrics row posted, merged per whole step."""
    merged: dict[int, dict[str, Any]] = {}
    for row in platform.metrics_posts(run_id):
        merged.setdefault(int(row["step"]), {}).update(row)
    return merged


# -- what the platform holds of a run, field by field ----------------------------------

#: Where this package's records may differ from prime-rl's own, and why; a
#: test names the ones its exit path makes (and every one must occur).
INTENDED = {
    "samples[*].rows[*].created_at": "when each side wrote its table (prime-rl: the same)",
    "error_message": "the reason the run ended, in the status request's own field, which "
    "prime-rl leaves empty",
    "status": "after SIGKILL the run is closed as crashed instead of left RUNNING for ever",
}


def _records(platform: FakePlatform, run: Any) -> dict[str, Any]:
    """Every record of ``run`` that prime-rl's PrimeMonitor sends, as the
    platform holds it: the create request, each metrics post in arrival
    order, each confirmed Parquet object (its step, schema, rows; the run's
    own id in its ``run_id`` column written as ``<run id>``), each
    ``/finalize`` body (the id written the same way), the final status."""
    samples = []
    for stored in sorted(platform.training_samples(run.id), key=lambda stored: stored.step):
        table = pq.read_table(io.BytesIO(stored.data))
        rows = table.to_pylist()
        for row in rows:
            if row.get("run_id") == run.id:
                row["run_id"] = "<run id>"
        samples.append(
            {
                "step": stored.step,
                "schema": [(field.name, str(field.type), field.nullable) for field in table.schema],
                "schema_metadata": table.schema.metadata,
                "num_rows": table.num_rows,
                "rows": rows,
            }
        )
    return {
        "create": run.create_payload,
        "metrics": platform.metrics_posts(run.id),
        "samples": samples,
        "finalize": [
            {**body, "run_id": "<run id>"} if body.get("run_id") == run.id else body
            for body in run.finalize_bodies
        ],
        "status": run.status,
        "error_message": run.error_message,
    }


def _leaves(value: Any, path: str = "") -> dict[str, str]:
    """Each leaf of ``value`` by its path, written with its type (``10.0
    (float)``, never equal to ``10 (int)``), and the key order of each
    object as a leaf of its own (``metrics[3]{keys}``)."""
    if isinstance(value, dict):
        leaves = {f"{path}{{keys}}": repr(list(value))}
        for key, item in value.items():
            leaves.update(_leaves(item, f"{path}.{key}" if path else str(key)))
        return leaves
    if isinstance(value, (list, tuple)):
        leaves = {f"{path}[len]": str(len(value))}
        for index, item in enumerate(value):
            leaves.update(_leaves(item, f"{path}[{index}]"))
        return leaves
    return {path: f"{value!r} ({type(value).__name__})"}


def _differences(own: dict[str, Any], ours: dict[str, Any]) -> dict[str, str]:
    """Every path where the two records differ, with both sides."""
    mine, theirs = _leaves(ours), _leaves(own)
    return {
        path: f"prime-rl {theirs.get(path, '(absent)')}, ours {mine.get(path, '(absent)')}"
        for path in [*theirs, *(path for path in mine if path not in theirs)]
        if theirs.get(path) != mine.get(path)
    }


def _pattern_of(path: str) -> str:
    return re.sub(r"\[\d+\]", "[*]", path)


def assert_same_records(platform: FakePlatform, own: Any, ours: Any, *intended: str) -> None:
    """What this package left on the platform is what prime-rl's own monitor
    left, field by field, except exactly the ``intended`` differences
    (keys of ``INTENDED``), each of which must occur."""
    differences = _differences(_records(platform, own), _records(platform, ours))
    unexplained = [
        f"  {path}: {both}"
        for path, both in differences.items()
        if _pattern_of(path) not in intended
    ]
    assert not unexplained, "records differ from prime-rl's own:\n" + "\n".join(unexplained)
    occurred = {_pattern_of(path) for path in differences}
    missing = [f"  {name}: {INTENDED[name]}" for name in intended if name not in occurred]
    assert not missing, "intended differences that did not occur:\n" + "\n".join(missing)


def test_the_comparison_sees_a_float_step_a_merged_row_and_a_timestamp() -> None:
    """What the comparison is for: an eval row's ``10.0`` against ``10``, two
    posts against one, an added ``_timestamp``, each a difference it names."""
    own = {"metrics": [{"a": 1, "step": 10}, {"b": 2.0, "step": 10.0}]}
    merged = {"metrics": [{"a": 1, "step": 10, "b": 2.0, "_timestamp": 5.0}]}
    floats = {"metrics": [{"a": 1, "step": 10}, {"b": 2.0, "step": 10}]}
    reordered = {"metrics": [{"step": 10, "a": 1}, {"b": 2.0, "step": 10.0}]}
    assert _differences(own, own) == {}
    assert set(_differences(own, merged)) == {
        "metrics[len]",
        "metrics[0]{keys}",
        "metrics[0].b",
        "metrics[0]._timestamp",
        "metrics[1]{keys}",
        "metrics[1].b",
        "metrics[1].step",
    }
    assert _differences(own, floats) == {"metrics[1].step": "prime-rl 10.0 (float), ours 10 (int)"}
    assert set(_differences(own, reordered)) == {"metrics[0]{keys}"}


# -- the same loop, reported through this package -----------------------------------


def test_a_clean_run_leaves_what_prime_rl_leaves_and_every_rollout(
    platform: FakePlatform, tmp_path: Path
) -> None:
    """prime-rl's PrimeMonitor posts every metrics row as it is (the eval row
    of a step after its train row, with a float step; NaN dropped), writes
    the effective train cohort of every 10th step as one Parquet object, and
    finalizes the run on a clean exit. Under opentelemetry-instrument and
    under the launcher the platform gets exactly the same records, and every
    rollout besides (on Prime Traces, a place prime-rl's monitor does not use)."""
    args = ("--name", "standin", "--nan-at", "3", "--quiet-steps")
    done = _orchestrate("own", platform, tmp_path, *args)
    assert done.returncode == 0, done.stderr
    own = _new_run(platform, set())
    assert own.status == "COMPLETED"
    assert own.create_payload["name"] == "standin"
    assert "team_id" not in own.create_payload
    posts = platform.metrics_posts(own.id)
    assert {type(p["step"]) for p in posts if "eval/gsm8k-demo/reward/mean/all" in p} == {float}
    assert all("train/agg/loss/mean" not in post for post in posts)
    assert [(step, len(rows)) for step, rows in _table(platform, own.id)] == [(0, 3), (10, 3)]
    assert not platform.episodes(own.id)

    for how in ("instrument", "launcher"):
        before = _ids(platform)
        done = _orchestrate(how, platform, tmp_path, *args)
        assert done.returncode == 0, done.stderr
        ours = _new_run(platform, before)
        assert_same_records(platform, own, ours, "samples[*].rows[*].created_at")
        assert ours.status == "COMPLETED"
        # Beyond prime-rl: every rollout (12 steps x 4, two evals x 2) on Prime Traces.
        assert len(platform.episodes(ours.id)) == 12 * 4 + 2 * 2


# -- every way the loop ends ---------------------------------------------------------------


def _hang_then(
    how: str, platform: FakePlatform, tmp_path: Path, sig: signal.Signals
) -> subprocess.Popen[str]:
    """The loop stopped at step 2 by ``sig`` (SIGINT is Ctrl-C)."""
    env = _env(platform, **(INSTRUMENT_ENV if how == "instrument" else {}))
    args = ("--output-dir", str(tmp_path / "outputs"), "--hang-at", "2", "--quiet-steps")
    process = subprocess.Popen(
        _command(how, ORCHESTRATE, *args),
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert process.stdout is not None
    assert process.stdout.readline().strip() == "HANG"
    if how != "own":
        # Steps 0 and 1: their train rows and step 0's eval row.
        _wait_for_the_spool(rows=3, episodes=2 * 4 + 2)
    process.send_signal(sig)
    process.communicate(timeout=PROCESS_TIMEOUT)
    return process


def _wait_for_the_spool(rows: int, episodes: int) -> None:
    """Until the spool holds ``rows`` metrics rows and ``episodes`` rollouts
    of the run (committed after each step, see ``Committer``) and the step 0
    sample table (written on a worker thread): a signal before that would
    test how fast those are, not the exit path."""
    spool = Spool(resolve_settings().spool_path, max_bytes=10**9)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        runs = spool.reading.runs()
        if runs:
            local_id = runs[0].local_id
            if (
                sum(spool.steps.metrics_counts(local_id).values()) >= rows
                and runs[0].episodes >= episodes
                and spool.steps.step_upload_count(local_id, 0) >= 1
            ):
                return
        time.sleep(0.05)
    raise AssertionError(f"the spool never held {rows} rows, {episodes} rollouts and a table")


def _push_all(platform: FakePlatform) -> None:
    pushed = subprocess.run(
        [sys.executable, "-m", "prime_runs_otel.cli", "push", "--all"],
        env=_env(platform),
        capture_output=True,
        text=True,
        timeout=PROCESS_TIMEOUT,
    )
    assert pushed.returncode == 0, pushed.stdout + pushed.stderr


def test_an_exception_fails_the_run_with_its_reason(platform: FakePlatform, tmp_path: Path) -> None:
    """prime-rl marks it failed from its atexit hook, without a reason."""
    done = _orchestrate("own", platform, tmp_path, "--fail-at", "2", "--quiet-steps")
    assert done.returncode == 1
    own = _new_run(platform, set())
    done = _orchestrate("instrument", platform, tmp_path, "--fail-at", "2", "--quiet-steps")
    assert done.returncode == 1
    assert "the dispatcher stopped at step 2" in done.stderr  # the traceback is still shown
    ours = _new_run(platform, {own.id})
    assert_same_records(platform, own, ours, "samples[*].rows[*].created_at", "error_message")
    assert ours.status == own.status == "FAILED"
    assert own.error_message is None
    assert ours.error_message == "RuntimeError: the dispatcher stopped at step 2"
    assert len(platform.episodes(ours.id)) == 2 * 4 + 2


def test_ctrl_c_cancels_the_run(platform: FakePlatform, tmp_path: Path) -> None:
    own_process = _hang_then("own", platform, tmp_path, signal.SIGINT)
    assert own_process.returncode != 0
    own = _new_run(platform, set())
    ours_process = _hang_then("launcher", platform, tmp_path, signal.SIGINT)
    assert ours_process.returncode != 0
    ours = _new_run(platform, {own.id})
    assert_same_records(platform, own, ours, "samples[*].rows[*].created_at", "error_message")
    assert ours.status == own.status == "FAILED"  # the RFT API knows completed and failed only
    assert ours.error_message == "cancelled: interrupted (Ctrl-C)"


def test_sigkill_leaves_prime_rl_s_run_running_and_ours_closed_as_crashed(
    platform: FakePlatform, tmp_path: Path
) -> None:
    _hang_then("own", platform, tmp_path, signal.SIGKILL)
    own = _new_run(platform, set())
    _hang_then("instrument", platform, tmp_path, signal.SIGKILL)
    ours = _new_run(platform, {own.id})
    assert own.status == "RUNNING"  # for ever
    _push_all(platform)
    ours = platform.run(ours.id)
    assert_same_records(
        platform, own, ours, "samples[*].rows[*].created_at", "status", "error_message"
    )
    assert ours.status == "FAILED"
    assert (ours.error_message or "").startswith("crashed")
    assert len(platform.episodes(ours.id)) == 2 * 4 + 2


# -- attaching, the trainer, what the platform cannot take ------------------------------


def _precreated(platform: FakePlatform) -> str:
    """A run a managed launch registered before prime-rl starts ($RUN_ID)."""
    api = RftAPI(api_key=platform.api_key, base_url=platform.url, frontend_url=platform.url)
    payload = external_run_payload(
        base_model="Qwen/Qwen3-0.6B",
        team_id=None,
        environments=["gsm8k-demo"],
        training=TrainingFields(max_steps=12),
    )
    return str(api.create(payload)["id"])


def test_run_id_attaches_instead_of_creating(platform: FakePlatform, tmp_path: Path) -> None:
    own_id, ours_id = _precreated(platform), _precreated(platform)
    args = ("--quiet-steps",)
    done = _orchestrate("own", platform, tmp_path, *args, RUN_ID=own_id)
    assert done.returncode == 0, done.stderr
    done = _orchestrate("launcher", platform, tmp_path, *args, RUN_ID=ours_id)
    assert done.returncode == 0, done.stderr
    assert _ids(platform) == {own_id, ours_id}  # nothing registered a second time
    own, ours = platform.run(own_id), platform.run(ours_id)
    assert_same_records(platform, own, ours, "samples[*].rows[*].created_at")
    assert ours.status == own.status == "COMPLETED"


#: The create request's fields prime-rl reads from the orchestrator's config.
_REGISTERED_FROM_CONFIG = (
    "max_steps",
    "batch_size",
    "rollouts_per_example",
    "seq_len",
    "environments",
)


def test_the_trainer_adds_its_metrics_to_the_run_when_asked(
    platform: FakePlatform, tmp_path: Path
) -> None:
    """Rank 0 of the trainer sets its monitors up without a prime config:
    with the opt-in its rows join the run of the same launch ($PRL_RUN_ID),
    which the orchestrator registers and ends; without, it reports nothing."""
    launch = {"PRL_RUN_ID": "launch-1", "PRIME_RUNS_OTEL_PRIME_RL_TRAINER": "true"}
    out = str(tmp_path / "trainer")
    trainer = subprocess.run(
        _command("launcher", TRAIN, "--output-dir", out, "--max-steps", "3"),
        env=_env(platform, **launch),
        capture_output=True,
        text=True,
        timeout=PROCESS_TIMEOUT,
    )
    assert trainer.returncode == 0, trainer.stderr
    assert not platform.runs()  # the trainer registers nothing: the owner does
    args = ("--max-steps", "3", "--eval-steps", "", "--quiet-steps")
    done = _orchestrate("launcher", platform, tmp_path, *args, **launch)
    assert done.returncode == 0, done.stderr
    [run] = platform.runs()
    assert run.status == "COMPLETED"
    # Registered with what the orchestrator says, as prime-rl registers it,
    # although the trainer's spans opened the run with the little it knows.
    config = run.create_payload["run_config"]
    registered = {key: run.create_payload.get(key) for key in _REGISTERED_FROM_CONFIG}
    assert registered == {
        "max_steps": config["max_steps"],
        "batch_size": config["batch_size"],
        "rollouts_per_example": config["group_size"],
        "seq_len": config["seq_len"],
        "environments": [{"id": env["env_id"]} for env in config["train"]["source"]],
    }
    posts = platform.metrics_posts(run.id)
    # The orchestrator's rows as prime-rl posts them; the trainer's, two dicts
    # a step, posts of their own beside them, never inside prime-rl's rows.
    assert sorted(posts, key=_sort_key) == sorted(
        [*_orchestrator_rows(3), *_trainer_rows(3)], key=_sort_key
    )
    assert [post for post in posts if "progress/rollouts" in post] == _orchestrator_rows(3)

    alone = subprocess.run(
        _command("launcher", TRAIN, "--output-dir", out, "--max-steps", "3"),
        env=_env(platform, PRL_RUN_ID="launch-2"),
        capture_output=True,
        text=True,
        timeout=PROCESS_TIMEOUT,
    )
    assert alone.returncode == 0, alone.stderr
    assert (
        Spool(resolve_settings().spool_path, max_bytes=10**9).reading.run("prime-rl-launch-2")
        is None
    )


def _orchestrator_rows(steps: int) -> list[dict[str, Any]]:
    """The stand-in orchestrator's train rows, as prime-rl posts them."""
    return [
        {
            "train/agg/reward/mean/all": 0.5 + step / 100,
            "progress/rollouts": 4,
            "time/step": 0.25,
            "step": step,
        }
        for step in range(steps)
    ]


def _trainer_rows(steps: int) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    for step in range(steps):
        rows += [{"perf/throughput": 1000.0 + step, "step": step}, {"optim/lr": 1e-6, "step": step}]
    return rows


def _sort_key(row: dict[str, Any]) -> str:
    return json.dumps(row, sort_keys=True)


def test_what_the_platform_cannot_take_is_counted_and_training_goes_on(
    platform: FakePlatform, tmp_path: Path
) -> None:
    """A metrics value that is not a number, an object that is not an
    episode: prime-rl loses the whole row of that step (its JSON encoding
    fails); here that value alone is left out, with one warning per kind."""
    args = ("--max-steps", "3", "--eval-steps", "", "--quiet-steps")
    bad = ("--bad-metric-at", "1", "--bad-episode-at", "1", "--nan-at", "1")
    done = _orchestrate("own", platform, tmp_path, *args, *bad)
    assert done.returncode == 0, done.stderr
    own = _new_run(platform, set())
    done = _orchestrate("instrument", platform, tmp_path, *args, *bad)
    assert done.returncode == 0, done.stderr
    ours = _new_run(platform, {own.id})
    assert 1 not in _posted_rows(platform, own.id)  # step 1's row lost
    rows = _posted_rows(platform, ours.id)
    assert sorted(rows) == [0, 1, 2]
    assert "debug/handle" not in rows[1] and "train/agg/loss/mean" not in rows[1]
    assert rows[1]["progress/rollouts"] == 4
    assert len(platform.episodes(ours.id)) == 3 * 4
    assert ours.status == "COMPLETED"
    warnings = [line for line in done.stderr.splitlines() if "left out and counted" in line]
    assert len(warnings) == 3 + 1, done.stderr  # one per kind, then the counts at finalize


def test_behind_a_collector_serve_leaves_what_prime_rl_leaves(
    platform: FakePlatform, tmp_path: Path
) -> None:
    """OTEL_TRACES_EXPORTER=otlp: the orchestrator only sends OTLP to `serve`
    on loopback (no credential of its own); `serve` registers the run and
    sends the same records prime-rl's own monitor sends, as in process: the
    create request, every metrics row as posted (the eval rows at float
    steps), each Parquet object (written by the orchestrator, carried on a
    ``prime.run.samples`` span, the run's id filled in by `serve`), the
    final status."""
    from test_receiver import ServeProcess, serve_env

    args = ("--name", "behind", "--nan-at", "3", "--quiet-steps")
    done = _orchestrate("own", platform, tmp_path, *args)
    assert done.returncode == 0, done.stderr
    own = _new_run(platform, set())
    serve = ServeProcess(tmp_path, serve_env(tmp_path, platform)).start()
    try:
        otlp = {
            **INSTRUMENT_ENV,
            "OTEL_TRACES_EXPORTER": "otlp",
            "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
            "OTEL_EXPORTER_OTLP_ENDPOINT": serve.url,
            "PRIME_API_KEY": "",
        }
        done = _orchestrate("instrument", platform, tmp_path, *args, **otlp)
        assert done.returncode == 0, done.stderr
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and not any(
            run.closed for run in platform.runs() if run.id != own.id
        ):
            time.sleep(0.2)
        behind = _new_run(platform, {own.id})
        assert behind.status == "COMPLETED"
        assert_same_records(platform, own, behind, "samples[*].rows[*].created_at")
        assert len(platform.episodes(behind.id)) == 12 * 4 + 2 * 2
    finally:
        serve.stop()


def test_a_table_written_while_rollouts_go_out_is_sent_before_the_close(
    platform: FakePlatform, tmp_path: Path
) -> None:
    """The step 0 table of a large step is stored while the step's rollouts
    are still being sent; the run's close waits for it."""
    args = ("--rollouts", "256", "--max-steps", "1", "--eval-steps", "", "--quiet-steps")
    done = _orchestrate("instrument", platform, tmp_path, *args)
    assert done.returncode == 0, done.stderr
    [run] = platform.runs()
    assert run.status == "COMPLETED"
    assert [(step, len(rows)) for step, rows in _table(platform, run.id)] == [(0, 255)]


def test_patching_waits_for_prime_rl_monitors_and_costs_nothing_before() -> None:
    """In a fresh process: installing the hook imports nothing but the
    standard library; importing prime_rl.monitors patches its setup; the
    pipeline is loaded only when setup runs; uninstall restores it."""
    script = """
import sys
before = set(sys.modules)
from prime_runs_otel.instrumentation.prime_rl import _hook
_hook.install()
loaded = {m for m in set(sys.modules) - before if not m.startswith("_")}
assert loaded <= {"prime_runs_otel", "prime_runs_otel.instrumentation",
    "prime_runs_otel.instrumentation.hook", "prime_runs_otel.instrumentation.prime_rl",
    "prime_runs_otel.instrumentation.prime_rl._hook"}, loaded
from prime_rl import monitors
assert hasattr(monitors.setup, _hook.ORIGINAL_ATTRIBUTE)
assert "prime_runs_otel.run" not in sys.modules
_hook.uninstall()
assert not hasattr(monitors.setup, _hook.ORIGINAL_ATTRIBUTE)
print("ok")
"""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(STANDIN), env.get("PYTHONPATH", "")])
    done = subprocess.run(
        [sys.executable, "-c", script],
        env=env,
        capture_output=True,
        text=True,
        timeout=PROCESS_TIMEOUT,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok"


def test_a_prime_rl_whose_monitors_are_not_the_known_ones_reports_itself() -> None:
    """A prime_rl.monitors without the ``Monitor`` base this instrumentation
    subclasses: setup runs as prime-rl wrote it, prime config included."""
    import asyncio
    import types

    from prime_runs_otel.instrumentation.prime_rl.monitor import patched_setup

    calls: list[dict[str, Any]] = []

    async def setup(prime: Any = None, **kwargs: Any) -> None:
        calls.append({"prime": prime, **kwargs})

    prime = object()
    module = types.ModuleType("prime_rl.monitors")
    asyncio.run(patched_setup(module, setup, (), {"prime": prime, "output_dir": "out"}))
    assert calls == [{"prime": prime, "output_dir": "out"}]


def test_one_launcher_command_reaches_the_orchestrator_and_the_trainer(
    platform: FakePlatform, tmp_path: Path
) -> None:
    """`prime-runs-otel run -- rl ...`: `rl` starts the trainer and the
    orchestrator as child processes at once; both are instrumented, and the
    run holds the rows of both."""
    command = _command(
        "launcher",
        str(STANDIN / "rl.py"),
        str(tmp_path / "outputs"),
        *("--max-steps", "3", "--eval-steps", "", "--quiet-steps"),
    )
    env = _env(platform, PRIME_RUNS_OTEL_PRIME_RL_TRAINER="true")
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=PROCESS_TIMEOUT)
    assert done.returncode == 0, done.stderr
    [run] = platform.runs()
    assert run.status == "COMPLETED"
    posts = platform.metrics_posts(run.id)
    assert sorted(posts, key=_sort_key) == sorted(
        [*_orchestrator_rows(3), *_trainer_rows(3)], key=_sort_key
    )


_SCALARS = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True),
    st.integers(min_value=-(2**53), max_value=2**53),
    st.booleans(),
    st.text(max_size=8),
    st.none(),
)
_VALUES = st.recursive(
    _SCALARS,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=6), inner, max_size=4)
    ),
    max_leaves=12,
)


def _standin_sanitize() -> Any:
    """The stand-in's copy of prime-rl's ``sanitize``, loaded from its file."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "standin_utils", STANDIN / "prime_rl" / "utils" / "utils.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.sanitize


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(st.text(max_size=10), _VALUES, max_size=8), st.integers(0, 10**6))
def test_a_metrics_dict_becomes_the_row_prime_rl_posts(metrics: dict[str, Any], step: int) -> None:
    """Any metrics dict (it comes from the trainer's code): the row is what
    prime-rl's ``sanitize`` leaves, key for key, in order, with the same
    types, and it reads back from its span unchanged."""
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from prime_runs_otel.instrumentation.prime_rl.monitor import metrics_row
    from prime_runs_otel.produce.run_spans import emit_metrics
    from prime_runs_otel.read.checks import read_span
    from prime_runs_otel.read.records import RunMetrics
    from prime_runs_otel.read.spans import from_readable_span

    expected, _ = _standin_sanitize()(metrics)
    row, _, refused = metrics_row(metrics, step)
    assert refused == []
    assert _leaves(row) == _leaves(expected)
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    emit_metrics(provider.get_tracer("test"), row, step=step, verbatim=True)
    [span] = exporter.get_finished_spans()
    read = read_span(from_readable_span(span))
    assert isinstance(read, RunMetrics) and read.verbatim
    assert _leaves(read.row()) == _leaves(expected)
