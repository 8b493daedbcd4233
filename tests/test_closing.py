"""Closing a run on the platform, eval and training alike (one path for
both): a close the platform refuses for good leaves the run given up, with
the refusal as its error, until ``push`` closes it; a retryable refusal is
waited out."""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Any

import pytest

import prime_runs_otel as pro
from prime_runs_otel.produce.synthetic import synthetic_episodes
from prime_runs_otel.testing import FakePlatform

TEAM = "team-closing"

#: Where each kind of run is finalized, and where its status is set.
CLOSE_PATHS = {
    "eval": (r"/evaluations/[^/]+/finalize$",),
    # A training run whose finalize is refused is closed through its status.
    "train": (r"/rft/finalize$", r"/rft/external-runs/[^/]+/status$"),
}


def _started(kind: str) -> pro.Run:
    options: dict[str, Any] = {}
    if kind == "train":
        options.update(kind="train", model="base/policy", team_id=TEAM)
    return pro.start_run(name=f"closing-{kind}", environments=["gsm8k-demo"], **options)


def _run(kind: str) -> pro.RunResult:
    run = _started(kind)
    for record in synthetic_episodes(4, seed=3):
        run.record_episode(record)
    return run.finish(timeout=60)


@pytest.mark.parametrize("kind", ["eval", "train"])
def test_a_close_refused_for_good_gives_the_run_up_until_push(
    online: FakePlatform, kind: str
) -> None:
    for path in CLOSE_PATHS[kind]:
        online.fail_next(1, status=400, method="POST" if "finalize" in path else None, path=path)

    result = _run(kind)

    assert not result.closed and result.pending == 0
    assert result.error is not None and "400" in result.error, result.error
    [platform_run] = online.runs()
    assert platform_run.status == "RUNNING"

    pushed = subprocess.run(
        [sys.executable, "-m", "prime_runs_otel.cli", "push", result.local_id],
        env=dict(os.environ),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert pushed.returncode == 0, pushed.stderr
    assert online.run(platform_run.id).status == "COMPLETED"


@pytest.mark.parametrize("kind", ["eval", "train"])
def test_a_close_refused_for_now_is_waited_out(online: FakePlatform, kind: str) -> None:
    online.fail_next(2, status=503, path=CLOSE_PATHS[kind][0])

    result = _run(kind)

    assert result.closed and result.status == "completed"
    [platform_run] = online.runs()
    assert (platform_run.status, platform_run.finalize_calls) == ("COMPLETED", 1)


@pytest.mark.parametrize("kind", ["eval", "train"])
def test_a_failed_run_is_closed_with_its_reason(online: FakePlatform, kind: str) -> None:
    with pytest.raises(RuntimeError, match="diverged"), _started(kind) as run:
        run.record_episode(next(iter(synthetic_episodes(1, seed=4))))
        raise RuntimeError("diverged")

    assert run.result is not None and run.result.closed
    [platform_run] = online.runs()
    assert platform_run.status == "FAILED"
    assert "diverged" in (platform_run.error_message or "")
    assert platform_run.finalize_calls == 0
