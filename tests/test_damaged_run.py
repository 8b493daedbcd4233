"""One damaged run row costs only that run: delivery goes on with every
other run, every store command works on the others, and the damaged one is
named with what to do about it."""

from __future__ import annotations

import json
import sqlite3

import pytest

import prime_runs_otel as pro
from prime_runs_otel.cli.doctor import run_checks
from prime_runs_otel.cli.main import main
from prime_runs_otel.config import resolve_settings
from prime_runs_otel.produce.synthetic import synthetic_episodes
from prime_runs_otel.testing import FakePlatform


def _recorded(name: str, seed: int, **options: str) -> str:
    run = pro.start_run(name=name, environments=["gsm8k"], finish_timeout=60, **options)
    for record in synthetic_episodes(5, seed=seed):
        run.record_episode(record)
    run.finish()
    return run.id


def _damage(local_id: str) -> None:
    """The run's row unreadable, and the run still open: every delivery pass reads it."""
    db = sqlite3.connect(resolve_settings().spool_path)
    try:
        with db:
            db.execute(
                "UPDATE runs SET identity = '{not json', close_state = 'open' WHERE local_id = ?",
                (local_id,),
            )
    finally:
        db.close()


def _cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    capsys.readouterr()
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_a_damaged_run_costs_only_itself(
    online: FakePlatform, capsys: pytest.CaptureFixture[str]
) -> None:
    damaged = _recorded("damaged", seed=1, mode="local")
    kept = _recorded("kept", seed=2, mode="local")
    _damage(damaged)

    # A new online run is delivered in process, past the damaged row.
    result = pro.start_run(name="fresh", environments=["gsm8k"], finish_timeout=60)
    for record in synthetic_episodes(5, seed=3):
        result.record_episode(record)
    fresh = result.finish()
    assert (fresh.closed, fresh.pending) == (True, 0)

    code, out, err = _cli(capsys, "runs")
    assert code == 0 and kept[:12] in out and fresh.local_id[:12] in out
    assert damaged in err and "damaged" in err

    code, out, _ = _cli(capsys, "runs", "--json")
    assert code == 0 and {row["id"] for row in json.loads(out)} == {kept, fresh.local_id}

    assert _cli(capsys, "show", kept)[0] == 0
    code, out, _ = _cli(capsys, "export", kept, "--what", "episodes")
    assert code == 0 and len(out.splitlines()) == 5

    code, out, err = _cli(capsys, "show", damaged)
    assert code != 0 and "damaged" in err and f"rm --force {damaged}" in err

    code, out, err = _cli(capsys, "push", kept)
    assert code == 0, out + err
    code, out, err = _cli(capsys, "push", "--all")
    assert damaged in err and "damaged" in err

    [spool_check] = [check for check in run_checks() if check.name == "spool"]
    assert spool_check.status != "ok" and damaged[:12] in spool_check.detail

    assert _cli(capsys, "prune", "--status", "delivered")[0] == 0
    assert _cli(capsys, "rm", "--force", damaged)[0] == 0
    code, out, err = _cli(capsys, "runs")
    assert code == 0 and "damaged" not in err

    assert {run.status for run in online.runs()} == {"COMPLETED"}
    assert sum(len(online.episodes(run.id)) for run in online.runs()) == 10


@pytest.mark.parametrize("what", ["episodes", "samples"])
def test_export_of_a_damaged_record_exports_the_rest_and_counts_it(
    capsys: pytest.CaptureFixture[str], what: str
) -> None:
    local_id = _recorded("exported", seed=5, mode="local")
    db = sqlite3.connect(resolve_settings().spool_path)
    try:
        with db:
            (seq,) = db.execute("SELECT MIN(seq) FROM records").fetchone()
            db.execute("UPDATE records SET body = ? WHERE seq = ?", (b'{"id": "\xff\xfe', seq))
    finally:
        db.close()

    code, out, err = _cli(capsys, "export", local_id, "--what", what)

    assert code == 1, err
    episodes = {
        json.loads(line)["episode_id" if what == "samples" else "id"] for line in out.splitlines()
    }
    assert len(episodes) == 4
    assert "1 episode(s)" in err and "damaged" in err and "Traceback" not in err
