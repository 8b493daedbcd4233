"""prime-rl's reporting, unchanged, through this package: the stand-in of
prime-rl's monitors and orchestrator loop (``tests/prime_rl_standin``, which
names the prime-rl commit it follows) run once with prime-rl's own
``PrimeMonitor`` and once under ``opentelemetry-instrument`` or
``prime-runs-otel run --``, against the same fake platform, and what each
leaves there compared field by field, for every way the loop can end."""

from __future__ import annotations

import io
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from prime_runs_otel.config import resolve_settings
from prime_runs_otel.deliver.spool import Spool
from prime_runs_otel.testing import FakePlatform

STANDIN = Path(__file__).resolve().parent / "prime_rl_standin"
ORCHESTRATE = str(STANDIN / "orchestrate.py")
TRAIN = str(STANDIN / "train.py")
BIN = Path(sys.executable).parent

pytestmark = pytest.mark.xdist_group("prime-rl")

#: opentelemetry-instrument, delivering in process (the distro's default is OTLP).
INSTRUMENT_ENV = {
    "OTEL_TRACES_EXPORTER": "prime_runs",
    "OTEL_METRICS_EXPORTER": "none",
    "OTEL_LOGS_EXPORTER": "none",
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
        timeout=120,
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


def _schema(platform: FakePlatform, run_id: str) -> list[tuple[str, str]]:
    [first, *_] = platform.training_samples(run_id)
    schema = pq.read_schema(io.BytesIO(first.data))
    return [(field.name, str(field.type)) for field in schema]


def _posted_rows(platform: FakePlatform, run_id: str) -> dict[int, dict[str, Any]]:
    """Every metrics row posted, merged per step (what a platform keeping
    every key of a step holds), without this package's ``_timestamp``."""
    merged: dict[int, dict[str, Any]] = {}
    for row in platform.metrics_posts(run_id):
        row = {key: value for key, value in row.items() if key != "_timestamp"}
        merged.setdefault(int(row["step"]), {}).update(row)
    for row in merged.values():
        row["step"] = int(row["step"])
    return merged


# -- prime-rl's own monitor, the baseline ------------------------------------------


def test_the_standin_reports_as_prime_rl_does(platform: FakePlatform, tmp_path: Path) -> None:
    """prime-rl's PrimeMonitor: one run, every metrics row posted as it is
    (the eval row of a step after its train row, with a float step), the
    effective train cohort of every 10th step as one Parquet object, the run
    finalized on a clean exit."""
    done = _orchestrate("own", platform, tmp_path, "--name", "standin", "--nan-at", "3")
    assert done.returncode == 0, done.stderr
    [run] = platform.runs()
    assert run.status == "COMPLETED"
    assert run.create_payload["name"] == "standin"
    assert "team_id" not in run.create_payload
    assert run.create_payload["environments"] == [{"id": "gsm8k-demo"}]
    posts = platform.metrics_posts(run.id)
    assert len(posts) == 12 + 2
    assert [p["step"] for p in posts if isinstance(p["step"], float)] == [0.0, 10.0]
    assert "train/agg/loss/mean" not in posts[3]  # NaN dropped
    tables = _table(platform, run.id)
    assert [step for step, _ in tables] == [0, 10]
    assert all(len(rows) == 3 for _, rows in tables)


# -- the same loop, reported through this package -----------------------------------


def _compare(platform: FakePlatform, own: Any, ours: Any) -> None:
    """What prime-rl's own monitor left against what this package left."""
    assert ours.create_payload == own.create_payload
    assert _posted_rows(platform, ours.id) == _posted_rows(platform, own.id)
    assert _schema(platform, ours.id) == _schema(platform, own.id)
    assert _table(platform, ours.id) == _table(platform, own.id)


def _compare_unclean(platform: FakePlatform, own: Any, ours: Any, steps: int) -> None:
    """A loop that did not end cleanly: prime-rl's metrics and uploads are
    fire-and-forget tasks, and those still in flight die with its event loop,
    so what it left is at most what this package left, which is every row
    and table of the ``steps`` steps logged."""
    assert ours.create_payload == own.create_payload
    rows = _posted_rows(platform, ours.id)
    assert sorted(rows) == list(range(steps))
    for step, row in _posted_rows(platform, own.id).items():
        assert rows[step] == row
    tables = _table(platform, ours.id)
    assert [step for step, _ in tables] == [0]
    assert all(table in tables for table in _table(platform, own.id))


@pytest.mark.parametrize("how", ["instrument", "launcher"])
def test_a_clean_run_leaves_what_prime_rl_leaves_and_every_rollout(
    platform: FakePlatform, tmp_path: Path, how: str
) -> None:
    args = ("--name", "standin", "--nan-at", "3", "--quiet-steps")
    done = _orchestrate("own", platform, tmp_path, *args)
    assert done.returncode == 0, done.stderr
    own = _new_run(platform, set())
    done = _orchestrate(how, platform, tmp_path, *args)
    assert done.returncode == 0, done.stderr
    ours = _new_run(platform, {own.id})
    _compare(platform, own, ours)
    assert ours.status == own.status == "COMPLETED"
    # Beyond prime-rl: every rollout (12 steps x 4, two evals x 2) on Prime Traces.
    assert len(platform.episodes(ours.id)) == 12 * 4 + 2 * 2
    assert not platform.episodes(own.id)


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
        _wait_for_the_spool(rows=2)
    process.send_signal(sig)
    process.communicate(timeout=120)
    return process


def _wait_for_the_spool(rows: int) -> None:
    """Until the spool holds ``rows`` metrics rows of the run (committed
    after each step, see ``Committer``) and the step 0 sample table (written
    on a worker thread): a signal before that would test how fast those are,
    not the exit path."""
    spool = Spool(resolve_settings().spool_path, max_bytes=10**9)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        runs = spool.runs()
        if runs:
            local_id = runs[0].local_id
            if (
                sum(spool.metrics_counts(local_id).values()) >= rows
                and spool.step_upload_count(local_id, 0) >= 1
            ):
                return
        time.sleep(0.05)
    raise AssertionError(f"the spool never held {rows} metrics rows and the step 0 table")


def _push_all(platform: FakePlatform) -> None:
    pushed = subprocess.run(
        [sys.executable, "-m", "prime_runs_otel.cli", "push", "--all"],
        env=_env(platform),
        capture_output=True,
        text=True,
        timeout=120,
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
    _compare_unclean(platform, own, ours, steps=2)
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
    _compare_unclean(platform, own, ours, steps=2)
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
    _compare_unclean(platform, own, ours, steps=2)
    assert ours.status == "FAILED"
    assert (ours.error_message or "").startswith("crashed")
    assert len(platform.episodes(ours.id)) == 2 * 4 + 2
