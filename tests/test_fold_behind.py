"""The process that writes a run keeps the viewer's aggregates of it close
behind (``folds.py``, ``Uploader._fold_behind``): a view of a long run never
has more than ``FOLD_BEHIND`` episodes to fold, and none once the run is
finished, whether the run is local or delivered to the platform. Observed
through the fold mark in the spool file."""

from __future__ import annotations

import sqlite3
import time

import pytest

import prime_runs_otel as pro
from prime_runs_otel.config import resolve_settings
from prime_runs_otel.deliver.spool.folds import FOLD_BEHIND
from prime_runs_otel.produce.synthetic import synthetic_episodes

#: More than twice the fold's threshold: the run is folded on its way.
EPISODES = 2 * FOLD_BEHIND + 700


def _stored_and_unfolded(local_id: str) -> tuple[int, int]:
    """The run's stored episodes, and those above its fold mark."""
    db = sqlite3.connect(resolve_settings().spool_path)
    try:
        (mark,) = db.execute(
            "SELECT COALESCE(MAX(seq), 0) FROM run_folds WHERE run_id = ?", (local_id,)
        ).fetchone()
        stored, unfolded = db.execute(
            "SELECT COUNT(*), COUNT(*) FILTER (WHERE seq > ?) FROM episodes WHERE run_id = ?",
            (mark, local_id),
        ).fetchone()
    finally:
        db.close()
    return int(stored), int(unfolded)


def _wait_for_fold_behind(local_id: str, timeout: float = 600.0) -> tuple[int, int]:
    """Every episode stored and at most ``FOLD_BEHIND`` of them unfolded
    (no view asked), or what the spool held when the time ran out. The
    bound is for a machine many times busier than an idle one (7 s of this
    wait there): it bounds a condition, not a speed."""
    deadline = time.monotonic() + timeout
    while True:
        stored, unfolded = _stored_and_unfolded(local_id)
        if (stored == EPISODES and unfolded <= FOLD_BEHIND) or time.monotonic() > deadline:
            return stored, unfolded
        time.sleep(0.1)


@pytest.mark.parametrize("mode", ["local", "online"])
def test_a_long_run_is_folded_behind_its_episodes_and_to_its_end(
    mode: str, request: pytest.FixtureRequest
) -> None:
    if mode == "online":
        request.getfixturevalue("online")  # the fake platform, as the real one
    run = pro.start_run(name=f"long-{mode}", environments=["gsm8k"], finish_timeout=600, mode=mode)
    for record in synthetic_episodes(EPISODES, seed=7):
        run.record_episode(record)

    stored, unfolded = _wait_for_fold_behind(run.id)
    assert stored == EPISODES
    assert unfolded <= FOLD_BEHIND

    result = run.finish()
    assert result.closed
    assert _stored_and_unfolded(run.id) == (EPISODES, 0)
