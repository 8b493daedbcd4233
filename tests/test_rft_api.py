"""The RFT API client against the fake platform on loopback: one request per
method, failures classified, and the internal root a hosted run is reached
through."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from prime_runs_otel.deliver.platform.http import PlatformError
from prime_runs_otel.deliver.platform.rft import (
    RftAPI,
    TrainingFields,
    external_run_payload,
    split_api_root,
    status_body,
)
from prime_runs_otel.errors import ConfigError
from prime_runs_otel.testing import FakePlatform


@pytest.fixture
def teams() -> Iterator[FakePlatform]:
    with FakePlatform(allowed_teams={"team-a"}) as fake:
        yield fake


def _api(platform: FakePlatform, base_url: str | None = None) -> RftAPI:
    return RftAPI(
        api_key=platform.api_key,
        base_url=base_url or platform.url,
        frontend_url="https://app.example",
        team_id="team-a",
    )


def _payload(**overrides: Any) -> dict[str, Any]:
    options: dict[str, Any] = {
        "base_model": "Qwen/Qwen3-4B",
        "team_id": "team-a",
        "environments": ["gsm8k", "acme/math"],
        "training": TrainingFields(max_steps=100, batch_size=64, wandb_project="rl"),
        "name": "rl-run",
        "run_config": {"lr": 1e-6},
    }
    options.update(overrides)
    return external_run_payload(**options)


def test_create_registers_the_run_with_its_fields(teams: FakePlatform) -> None:
    api = _api(teams)
    created = api.create(_payload())

    run = teams.run(created["id"])
    assert run.kind == "train" and run.name == "rl-run" == created["name"]
    assert run.create_payload == {
        "base_model": "Qwen/Qwen3-4B",
        "max_steps": 100,
        "environments": [{"id": "gsm8k"}, {"id": "acme/math"}],
        "team_id": "team-a",
        "name": "rl-run",
        "batch_size": 64,
        "run_config": {"lr": 1e-6},
        "wandb_project": "rl",
    }
    assert api.url_for(created["id"]) == f"https://app.example/dashboard/training/{created['id']}"
    assert api.status_of(created["id"]) == "running"


def test_a_run_without_a_team_is_sent_without_one() -> None:
    """As prime-rl sends it: the run then belongs to the user's own account."""
    assert "team_id" not in _payload(team_id=None)
    assert _payload()["team_id"] == "team-a"


def test_a_team_the_platform_does_not_allow_is_refused_for_good(teams: FakePlatform) -> None:
    with pytest.raises(PlatformError) as caught:
        _api(teams).create(_payload(team_id="team-b"))
    assert caught.value.status == 403
    assert not caught.value.retryable


@pytest.mark.parametrize(
    ("overrides", "hint"),
    [
        ({"base_model": ""}, "model="),
        ({"training": TrainingFields(max_steps=-1)}, "max_steps"),
    ],
)
def test_what_the_api_would_refuse_fails_before_sending(
    overrides: dict[str, Any], hint: str
) -> None:
    with pytest.raises(ConfigError, match=hint):
        _payload(**overrides)


def test_metrics_rows_are_one_per_step_and_replay_safe(teams: FakePlatform) -> None:
    api = _api(teams)
    run_id = api.create(_payload())["id"]
    api.post_metrics(run_id, {"loss": 0.5, "step": 1, "_timestamp": 10.0})
    api.post_metrics(run_id, {"loss": 0.4, "step": 2, "_timestamp": 11.0})
    api.post_metrics(run_id, {"loss": 0.4, "step": 2, "_timestamp": 11.0})  # a replay

    assert teams.training_metrics(run_id) == [
        {"loss": 0.5, "step": 1, "_timestamp": 10.0},
        {"loss": 0.4, "step": 2, "_timestamp": 11.0},
    ]


def test_a_busy_platform_is_retryable(teams: FakePlatform) -> None:
    api = _api(teams)
    run_id = api.create(_payload())["id"]
    teams.fail_next(1, status=503, path="/rft/metrics", retry_after=0.5)
    with pytest.raises(PlatformError) as caught:
        api.post_metrics(run_id, {"step": 1})
    assert caught.value.retryable and not caught.value.ambiguous
    assert caught.value.retry_after == 0.5


def test_finalize_completes_and_is_safe_to_repeat(teams: FakePlatform) -> None:
    api = _api(teams)
    run_id = api.create(_payload())["id"]
    api.finalize(run_id)
    api.finalize(run_id)

    run = teams.run(run_id)
    assert run.status == "COMPLETED" and run.finalize_calls == 2


def test_finalize_treats_a_closed_run_conflict_as_done(teams: FakePlatform) -> None:
    api = _api(teams)
    run_id = api.create(_payload())["id"]
    teams.fail_next(1, status=409, path="/rft/finalize")
    api.finalize(run_id)  # no exception


@pytest.mark.parametrize(
    ("status", "error", "expected"),
    [
        ("failed", "OOM on rank 3", "OOM on rank 3"),
        ("crashed", "the process exited", "crashed: the process exited"),
        ("cancelled", None, "cancelled: cancelled"),
    ],
)
def test_a_failure_closes_the_run_with_its_reason(
    teams: FakePlatform, status: str, error: str | None, expected: str
) -> None:
    api = _api(teams)
    run_id = api.create(_payload())["id"]
    assert api.set_status(run_id, status, error)

    run = teams.run(run_id)
    assert run.status == "FAILED"
    assert run.error_message == expected


def test_status_body_speaks_the_apis_two_words() -> None:
    assert status_body("completed", None) == {"status": "completed"}
    assert status_body("failed", None) == {"status": "failed", "error_message": "failed"}
    with pytest.raises(ValueError, match="running"):
        status_body("running", None)


def test_step_samples_go_through_presign_put_confirm(teams: FakePlatform) -> None:
    api = _api(teams)
    run_id = api.create(_payload())["id"]
    url, key = api.presign_samples(run_id, 10)
    api.put_samples(url, b"PAR1 bytes")
    api.confirm_samples(run_id, 10, key)

    [stored] = teams.training_samples(run_id)
    assert (stored.step, stored.s3_key, stored.data) == (10, key, b"PAR1 bytes")
    storage_put = next(r for r in teams.requests() if r.method == "PUT")
    assert "authorization" not in storage_put.headers


def test_a_refused_storage_put_is_not_retryable(teams: FakePlatform) -> None:
    api = _api(teams)
    run_id = api.create(_payload())["id"]
    url, _ = api.presign_samples(run_id, 10)
    with pytest.raises(PlatformError) as caught:
        api.put_samples(url.replace("signature=", "signature=x"), b"data")
    assert caught.value.status == 403 and not caught.value.retryable


def test_confirming_an_unknown_key_is_an_error(teams: FakePlatform) -> None:
    api = _api(teams)
    run_id = api.create(_payload())["id"]
    with pytest.raises(PlatformError) as caught:
        api.confirm_samples(run_id, 10, "rft/never-presigned.parquet")
    assert caught.value.status == 400


@pytest.mark.parametrize(
    ("base_url", "expected"),
    [
        ("https://api.example", ("https://api.example", "/api/v1")),
        ("https://api.example/", ("https://api.example", "/api/v1")),
        ("https://api.example/api/v1", ("https://api.example", "/api/v1")),
        ("https://api.example/api/v1/rft/", ("https://api.example", "/api/v1")),
        ("https://api.example/api/internal/rft", ("https://api.example", "/api/internal")),
        ("https://api.example/api/internal", ("https://api.example", "/api/internal")),
        ("https://rft.example/prefix", ("https://rft.example/prefix", "/api/v1")),
    ],
)
def test_split_api_root(base_url: str, expected: tuple[str, str]) -> None:
    assert split_api_root(base_url) == expected


class _Recorder(BaseHTTPRequestHandler):
    seen: list[tuple[str, str, dict[str, str], Any]] = []

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.seen.append((self.command, self.path, dict(self.headers), body))
        data = b'{"ok": true}'
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: Any) -> None:
        pass


def test_a_hosted_run_is_reached_through_the_internal_root() -> None:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Recorder)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    _Recorder.seen = []
    try:
        origin = f"http://127.0.0.1:{server.server_address[1]}"
        api = RftAPI(api_key="run-token", base_url=f"{origin}/api/internal/rft", frontend_url="x")
        assert api.internal
        api.post_metrics("run-1", {"step": 3})
        api.finalize("run-1")
        api.close()
    finally:
        server.shutdown()
        server.server_close()
    [(_, metrics_path, headers, body), (_, finalize_path, _, _)] = _Recorder.seen
    assert metrics_path == "/api/internal/rft/metrics"
    assert finalize_path == "/api/internal/rft/finalize"
    lowered = {name.lower(): value for name, value in headers.items()}
    assert lowered["x-api-key"] == "run-token"
    assert lowered["authorization"] == "Bearer run-token"
    assert body == {"run_id": "run-1", "metrics": {"step": 3}}
