"""A small disk: the spool's reserve scales down with it, ``serve`` and the
exporter take episodes until it is nearly full, and room that appears
(the file system grown while they run) is used without a restart.

The disks are real: tmpfs mounted for the test (``small_disks.py``; root
only, as the CI runs), grown with ``mount -o remount``, and driven with
real OTLP requests to a real ``serve`` process or a real run in process.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from small_disks import grow, tmpfs, total_bytes, used_bytes
from test_receiver import (
    ServeProcess,
    episodes,
    post,
    protobuf_body,
    run_spans,
    serve_env,
    start_serve,
)

import prime_runs_otel as pro
from prime_runs_otel.deliver.spool import Spool
from prime_runs_otel.deliver.spool.size import SMALL_DISK_MIN_RESERVE, reserve_for
from prime_runs_otel.produce.synthetic import synthetic_episodes

__all__ = ["start_serve"]  # the fixture, shared with test_receiver

#: Batches a collector sends, and the episodes in each (about 9 KB each):
#: 3.7 MB in all, more than a 4 MiB disk holds and a quarter of 16 MiB.
BATCHES = 40
PER_BATCH = 10


def _post_until_accepted(serve: ServeProcess, body: bytes, timeout: float = 60.0) -> float:
    """Post ``body`` as a collector retrying would, until it is accepted;
    the seconds it took."""
    started = time.monotonic()
    while True:
        answer = post(serve.traces_url, body)
        if answer.status_code == 200:
            return time.monotonic() - started
        assert answer.status_code == 503, answer.text
        if time.monotonic() - started > timeout:
            raise AssertionError(f"still refused after {timeout:.0f}s: {answer.text}")
        time.sleep(0.2)


def test_serve_on_a_small_disk_fills_it_and_uses_room_that_appears_without_a_restart(
    start_serve: Callable[..., ServeProcess], tmp_path: Path
) -> None:
    with tmpfs(tmp_path / "disk", "4m") as disk:
        env = serve_env(tmp_path, None, PRIME_RUNS_OTEL_DIR=str(disk / "spool"))
        serve = start_serve(env)
        assert "small disk" in serve.log(), "the scaled-down reserve is said at start"
        bodies = [
            protobuf_body(run_spans(episodes(PER_BATCH, seed=index), run_id=f"small-{index}"))
            for index in range(BATCHES)
        ]
        answers = []
        for body in bodies:
            answer = post(serve.traces_url, body)
            answers.append(answer.status_code)
            if answer.status_code == 503:
                assert "disk" in answer.text, "a refusal says it is the disk"
                break
        accepted_small = answers.count(200)
        full_at = used_bytes(disk) / total_bytes(disk)
        print(f"4 MiB: {accepted_small} of {len(answers)} batches taken, disk {full_at:.0%} used")
        assert accepted_small >= 5, f"a 4 MiB disk takes episodes: {answers}"
        assert 503 in answers, "the disk was meant to fill up"
        assert full_at > 0.6, "refused only once the disk is nearly full"

        grow(disk, "16m")
        waited = [_post_until_accepted(serve, body) for body in bodies[accepted_small:]]
        print(f"16 MiB: the first refused batch taken {waited[0]:.1f}s after the disk grew")
        assert waited[0] < 10, "room that appears is used at once, not after a restart"

        serve.stop()
        spool = Spool(disk / "spool" / "spool.sqlite3", max_bytes=10 * 1024**3)
        for index in range(BATCHES):
            run = spool.reading.run(f"small-{index}")
            assert run is not None, index
            # The request refused midway was refused whole, so its retry is
            # no loss: nothing counted rejected.
            assert (run.episodes, run.rejected) == (PER_BATCH, 0), (index, run)
        spool.close()


def test_a_run_in_process_on_a_small_disk_stores_episodes_and_more_once_it_grows(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    with tmpfs(tmp_path / "disk", "4m") as disk:
        monkeypatch.setenv("PRIME_RUNS_OTEL_DIR", str(disk / "spool"))
        first = pro.start_run(name="small", environments=["gsm8k"], mode="local")
        for record in synthetic_episodes(400, seed=1):
            first.record_episode(record)
        small = first.finish()
        print(f"4 MiB: {small.episodes} stored, {small.rejected} refused")
        assert "small disk" in caplog.text, "the scaled-down reserve is said at start"
        assert small.episodes >= 50, small.describe()
        assert small.rejected > 0 and small.episodes + small.rejected == 400

        grow(disk, "16m")
        second = pro.start_run(name="grown", environments=["gsm8k"], mode="local")
        for record in synthetic_episodes(400, seed=2):
            second.record_episode(record)
        grown = second.finish()
        print(f"16 MiB: {grown.episodes} stored, {grown.rejected} refused")
        assert grown.episodes == 400 and grown.rejected == 0, grown.describe()


@given(
    cap=st.integers(min_value=1, max_value=2**44),
    total=st.integers(min_value=0, max_value=2**44),
    more=st.integers(min_value=0, max_value=2**40),
)
def test_the_reserve_never_passes_a_16th_of_the_disk_and_grows_with_it(
    cap: int, total: int, more: int
) -> None:
    reserve = reserve_for(cap, total)
    full = reserve_for(cap, None)
    assert reserve <= full
    assert reserve <= max(SMALL_DISK_MIN_RESERVE, total // 16 + 1)
    assert reserve_for(cap, total + more) >= reserve, "a disk that grows never keeps less"
    if total >= 16 * full:
        assert reserve == full, "a disk of usual size keeps the full reserve"
