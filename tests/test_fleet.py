"""Several ``serve`` instances sharing a fleet folder (``--fleet-dir``) keep
one run one run: the first to see a run owns it, and the others forward its
spans to the owner. A run moved to another serve mid-run (a load balancer
whose backend list changed), eval or training alike, and a run whose first
spans reach two serves at the same instant, end as one platform run with
every episode once, closed once, by its owner; a serve that merely stopped
hearing from a run holds nothing of it to close as crashed."""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan
from test_late_episodes import end_spans
from test_receiver import (
    ENVIRONMENT,
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

from prime_runs_otel import run_resource
from prime_runs_otel.config import DEFAULT_SPOOL_MAX_BYTES
from prime_runs_otel.deliver.spool import Spool
from prime_runs_otel.testing import FakePlatform

__all__ = ["start_serve"]  # the fixture, shared with test_receiver


def resource_of(kind: str, run_id: str) -> Resource:
    if kind == "train":
        return run_resource(
            run_id=run_id,
            kind="train",
            name=run_id,
            model="base/policy",
            team_id="team-fleet",
            environments=[ENVIRONMENT],
            max_steps=10,
        )
    return run_resource(run_id=run_id, name=run_id, environments=[ENVIRONMENT])


def fleet_of_two(
    start_serve: Callable[..., ServeProcess], root: Path, platform: FakePlatform, *extra: str
) -> list[ServeProcess]:
    fleet = root / "fleet"
    serves = []
    for name in ("a", "b"):
        home = root / name
        (home / "home").mkdir(parents=True)
        env = serve_env(home, platform)
        serves.append(
            start_serve(env, "--fleet-dir", str(fleet), "--fleet-name", f"serve-{name}", *extra)
        )
    return serves


def send(serve: ServeProcess, spans: Sequence[ReadableSpan]) -> None:
    answer = post(serve.traces_url, protobuf_body(spans))
    assert answer.status_code == 200, answer.text


def runs_held(serve: ServeProcess, root: Path) -> list[Any]:
    spool = Spool(root / "serve-spool" / "spool.sqlite3", max_bytes=DEFAULT_SPOOL_MAX_BYTES)
    try:
        return spool.runs()
    finally:
        spool.close()


@pytest.mark.parametrize("kind", ["eval", "train"])
def test_a_run_moved_to_another_serve_mid_run_stays_one_run(
    start_serve: Callable[..., ServeProcess], tmp_path: Path, platform: FakePlatform, kind: str
) -> None:
    # The second serve times silent runs out after a second: it must not
    # close a run it stopped hearing from (it never holds one to close).
    first, second = fleet_of_two(start_serve, tmp_path, platform, "--idle-timeout", "1")
    records = episodes(40, seed=71)
    name = f"moved-{kind}"
    resource = resource_of(kind, name)

    send(first, run_spans(records[:20], run_id=name, end=False, resource=resource))
    (run,) = wait_for(platform.runs, 60, "the first serve to create the run")
    wait_for(lambda: len(platform.episodes(run.id)) == 20, 60, "the first half")

    # The load balancer's backend list changed: the rest goes to the second.
    send(second, run_spans(records[20:], run_id=name, start=False, resource=resource))

    run = closed_run(platform, name, timeout=60)
    assert run.status == "COMPLETED"
    assert len(platform.runs()) == 1, [r.id for r in platform.runs()]
    assert run.finalize_calls + len(run.status_updates) == 1, "closed once"
    assert_delivered_once(platform, run, records)
    assert run.metadata["temperature"] == 0.5
    [held] = runs_held(first, tmp_path / "a")
    assert (held.episodes, held.platform_id, held.end_status) == (40, run.id, "completed")
    assert runs_held(second, tmp_path / "b") == []


def test_two_serves_seeing_a_new_run_at_once_create_it_once(
    start_serve: Callable[..., ServeProcess], tmp_path: Path, platform: FakePlatform
) -> None:
    serves = fleet_of_two(start_serve, tmp_path, platform)
    records = episodes(30, seed=72)
    resource = resource_of("train", "raced")
    halves = [
        run_spans(records[:15], run_id="raced", end=False, resource=resource),
        run_spans(records[15:], run_id="raced", start=False, end=False, resource=resource),
    ]
    together = threading.Barrier(2)

    def first_sight(serve: ServeProcess, spans: Sequence[ReadableSpan]) -> None:
        together.wait()
        send(serve, spans)

    threads = [
        threading.Thread(target=first_sight, args=pair) for pair in zip(serves, halves, strict=True)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    send(serves[1], end_spans("raced", len(records), resource))

    run = closed_run(platform, "raced", timeout=60)
    assert len(platform.runs()) == 1, [r.id for r in platform.runs()]
    assert_delivered_once(platform, run, records)
