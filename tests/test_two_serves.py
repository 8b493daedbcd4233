"""Two ``serve`` instances that each see part of one run (a load balancer
that moved the run after a backend change, a gateway restarted with a new
address) report it as one platform run: the second finds the run the first
created, by the run key in its metadata, before creating one."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from test_receiver import (
    ServeProcess,
    assert_delivered_once,
    closed_run,
    episodes,
    post,
    protobuf_body,
    run_spans,
    serve_env,
    start_serve,
    wait_for,
)

from prime_runs_otel.testing import FakePlatform

__all__ = ["start_serve"]  # the fixture, shared with test_receiver


def test_a_run_moved_to_a_second_serve_is_created_once(
    start_serve: Callable[..., ServeProcess], tmp_path: Path, platform: FakePlatform
) -> None:
    first_root, second_root = tmp_path / "a", tmp_path / "b"
    for root in (first_root, second_root):
        (root / "home").mkdir(parents=True)
    first = start_serve(serve_env(first_root, platform))
    second = start_serve(serve_env(second_root, platform))
    records = episodes(40, seed=97)

    # The run starts on the first serve ...
    before = run_spans(records[:20], run_id="moved-run", end=False)
    assert post(first.traces_url, protobuf_body(before)).status_code == 200
    (run,) = wait_for(platform.runs, 60, "the first serve to create the run")
    wait_for(lambda: len(platform.episodes(run.id)) == 20, 60, "the first half to arrive")

    # ... and the rest of it, with its end, reaches the second one.
    after = run_spans(records[20:], run_id="moved-run", start=False)
    assert post(second.traces_url, protobuf_body(after)).status_code == 200

    run = closed_run(platform, "moved-run", timeout=120)
    assert run.status == "COMPLETED"
    assert len(platform.runs()) == 1, [r.id for r in platform.runs()]
    assert_delivered_once(platform, run, records)
    # The second serve never saw the start span: the config the first one
    # sent stays on the platform run.
    assert run.metadata["temperature"] == 0.5
    assert run.metadata["prime_runs_otel"]["run_key"] == "moved-run"
