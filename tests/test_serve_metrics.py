"""``GET /metrics`` of a real ``serve``: its own figures in the Prometheus
text format, as a fleet's monitoring scrapes them."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

import httpx
from test_receiver import (
    ServeProcess,
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

SAMPLE = re.compile(r"^(?P<name>[a-z_]+)(?:\{(?P<labels>[^}]*)\})? (?P<value>\S+)$")


def scrape(serve: ServeProcess) -> dict[str, float]:
    """Every sample, keyed ``name`` or ``name{labels}``; the text must parse
    line by line as the exposition format has it."""
    answer = httpx.get(f"{serve.url}/metrics", timeout=10)
    assert answer.status_code == 200
    assert answer.headers["content-type"].startswith("text/plain; version=0.0.4")
    samples: dict[str, float] = {}
    types: set[str] = set()
    for line in answer.text.splitlines():
        if line.startswith("# TYPE "):
            name, kind = line.split()[2:4]
            assert kind in ("counter", "gauge"), line
            types.add(name)
            continue
        if line.startswith("# HELP "):
            continue
        match = SAMPLE.match(line)
        assert match, f"not a sample: {line!r}"
        assert match["name"] in types, f"{match['name']} has no TYPE line before it"
        key = match["name"] + (f"{{{match['labels']}}}" if match["labels"] else "")
        samples[key] = float(match["value"])
    return samples


def test_metrics_count_what_serve_took_stored_and_delivered(
    start_serve: Callable[..., ServeProcess], tmp_path: Path, platform: FakePlatform
) -> None:
    serve = start_serve(serve_env(tmp_path, platform))
    before = scrape(serve)
    assert before["prime_runs_otel_episodes_stored_total"] == 0
    assert before['prime_runs_otel_runs{state="open"}'] == 0

    records = episodes(12, seed=81)
    body = protobuf_body(run_spans(records, run_id="watched"))
    assert post(serve.traces_url, body).status_code == 200
    assert post(serve.traces_url, body).status_code == 200  # a collector's retry
    closed_run(platform, "watched")

    after = wait_for(
        lambda: (m := scrape(serve))['prime_runs_otel_runs{state="closed"}'] == 1 and m,
        30,
        "the run to be closed in the spool",
    )
    assert after["prime_runs_otel_episodes_stored_total"] == 12
    assert after["prime_runs_otel_episodes_duplicate_total"] == 12
    assert after["prime_runs_otel_episodes_accepted_total"] == 24
    assert after['prime_runs_otel_requests_total{outcome="accepted"}'] == 2
    assert after["prime_runs_otel_episodes_delivered"] == 12
    assert after["prime_runs_otel_episodes_pending"] == 0
    assert after["prime_runs_otel_delivery_lag_seconds"] == 0
    assert after["prime_runs_otel_episodes_late"] == 0
    assert 0 < after["prime_runs_otel_spool_bytes"] < after["prime_runs_otel_spool_max_bytes"]


def test_metrics_show_pending_episodes_and_their_lag_while_the_platform_is_away(
    start_serve: Callable[..., ServeProcess], tmp_path: Path, platform: FakePlatform
) -> None:
    serve = start_serve(serve_env(tmp_path, platform))
    platform.fail_next(10_000, status=503, path=r"/api/v1/traces$")
    records = episodes(5, seed=82)
    assert (
        post(serve.traces_url, protobuf_body(run_spans(records, run_id="held"))).status_code == 200
    )

    held = wait_for(
        lambda: (m := scrape(serve))["prime_runs_otel_delivery_lag_seconds"] > 0 and m,
        30,
        "a delivery lag",
    )
    assert held["prime_runs_otel_episodes_pending"] == 5
    assert held['prime_runs_otel_runs{state="closing"}'] == 1
