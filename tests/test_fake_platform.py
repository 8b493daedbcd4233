"""The fake platform against the real clients: prime-runs 0.1.4 and prime-traces.

The fake is only useful if it behaves like the platform, so most tests drive it
with the published SDKs and assert what the fake *stored*; the rest speak HTTP
directly to pin down the error shapes and codes those SDKs branch on.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import prime_runs
import pytest
from prime_traces import LineFormat
from prime_traces.core.client import TracesAPIClient, raise_for_response
from prime_traces.exceptions import (
    ForbiddenError,
    LineFormatConflictError,
    NotFoundError,
    RetryableAPIError,
    UnauthorizedError,
    ValidationRejectedError,
)

from prime_runs_otel.testing import FakePlatform, RecordedRequest
from prime_runs_otel.testing.multipart import MultipartError, parse_form

PRIME_VARIABLES = (
    "PRIME_API_KEY",
    "PRIME_API_BASE_URL",
    "PRIME_BASE_URL",
    "PRIME_TRACES_URL",
    "PRIME_FRONTEND_URL",
    "PRIME_TEAM_ID",
    "PRIME_TRACES_OPT_OUT",
    "PRIME_RUNS_MODE",
)


# -- fixtures and builders ---------------------------------------------------------------


@pytest.fixture(autouse=True)
def isolated_config(monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> None:
    """No ~/.prime/config.json and no PRIME_* variables leak in from the machine."""
    monkeypatch.setenv("HOME", str(tmp_path))
    for name in PRIME_VARIABLES:
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def fake() -> Iterator[FakePlatform]:
    with FakePlatform(allowed_teams={"team-a"}) as platform:
        yield platform


@pytest.fixture
def sdk_env(fake: FakePlatform, monkeypatch: pytest.MonkeyPatch) -> FakePlatform:
    for name, value in fake.client_env().items():
        monkeypatch.setenv(name, value)
    return fake


@pytest.fixture(scope="session")
def load_wire_episode() -> Callable[[dict[str, Any]], Any]:
    """verifiers is slow to import, so it is imported once and only when asked for."""
    from verifiers.v1 import WireEpisode

    return WireEpisode.model_validate


def episode_record(index: int, *, run_id: str | None = None) -> dict[str, Any]:
    """A small valid verifiers v1 episode record with one trainable trace."""
    task = {"type": "qa", "data": {"idx": index, "answer": str(index)}}
    trace: dict[str, Any] = {
        "id": f"trace-{index}",
        "task": task,
        "agent": {"name": "solver", "trainable": True, "config": {}},
        "nodes": [
            {"message": {"role": "user", "content": f"What is {index}+0?"}},
            {"parent": 0, "message": {"role": "assistant", "content": str(index)}, "sampled": True},
        ],
        "rewards": {"correct": {"score": 1.0, "weight": 1.0}},
        "metrics": {"turns": 1.0},
        "is_completed": True,
        "ok": True,
    }
    record: dict[str, Any] = {
        "id": f"episode-{index}",
        "env": {"id": "arith"},
        "task": task,
        "ok": True,
        "traces": [trace],
    }
    if run_id is not None:
        record["run"] = {"type": "eval", "id": run_id}
        trace["run"] = {"type": "eval", "id": run_id}
    return record


def open_run(**kwargs: Any) -> prime_runs.Run:
    options: dict[str, Any] = {
        "name": "fake-platform-check",
        "environments": ["arith"],
        "model": "test-model",
        "on_error": "raise",
    }
    options.update(kwargs)
    return prime_runs.init(**options)


def jsonl(records: list[dict[str, Any]]) -> bytes:
    return b"".join(json.dumps(record).encode() + b"\n" for record in records)


def key_of(body: bytes) -> str:
    return f"sha256:{hashlib.sha256(body).hexdigest()}"


def traces_client(fake: FakePlatform, api_key: str | None = None) -> TracesAPIClient:
    return TracesAPIClient(api_key=api_key or fake.api_key, base_url=fake.url)


def auth(fake: FakePlatform) -> dict[str, str]:
    return {"Authorization": f"Bearer {fake.api_key}"}


def api(fake: FakePlatform, path: str) -> str:
    return f"{fake.url}/api/v1{path}"


def calls(fake: FakePlatform, method: str, path_suffix: str) -> list[RecordedRequest]:
    return [
        request
        for request in fake.requests()
        if request.method == method and request.path.endswith(path_suffix)
    ]


def wait_for(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + 10.0
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.01)


# -- prime-runs end to end --------------------------------------------------------------


def test_eval_run_through_prime_traces_stores_every_episode_once(sdk_env: FakePlatform) -> None:
    run = open_run()
    run.log_episodes([episode_record(index) for index in range(5)])
    run.finish(summary={"avg_reward": 1.0})

    stored = sdk_env.run(run.id)
    assert stored.status == "COMPLETED"
    assert stored.kind == "eval"
    assert stored.metrics["avg_reward"] == 1.0
    assert stored.metrics["prime_runs"] == {"traces_episodes_written": 5}
    assert stored.finalize_calls == 1
    assert stored.environments == [{"id": next(iter(sdk_env.environments()))}]
    assert stored.create_payload["model_name"] == "test-model"

    episodes = sdk_env.episodes(run.id)
    assert [episode["id"] for episode in episodes] == [f"episode-{i}" for i in range(5)]
    assert all(trace["run"]["id"] == run.id for e in episodes for trace in e["traces"])
    assert sdk_env.episode_deliveries(run.id) == {f"episode-{i}": 1 for i in range(5)}
    assert sdk_env.samples(run.id) == []

    (upload,) = sdk_env.uploads
    assert upload.line_format == "episode"
    assert upload.compressed
    assert upload.num_lines == 5
    assert upload.run_ids == [run.id]
    assert upload.context["source"] == "prime-runs"


def test_opted_out_run_sends_verifiers_episodes_to_the_legacy_table(
    sdk_env: FakePlatform, load_wire_episode: Callable[[dict[str, Any]], Any]
) -> None:
    run = open_run(traces_opt_out=True)
    run.log_episodes([load_wire_episode(episode_record(index)) for index in range(3)])
    run.finish()

    rows = sdk_env.samples(run.id)
    assert [row["sample_id"] for row in rows] == ["episode-0", "episode-1", "episode-2"]
    assert [row["example_id"] for row in rows] == [0, 1, 2]
    assert all(row["reward"] == 1.0 for row in rows)
    assert rows[0]["info"]["native_wrapper"]["id"] == "episode-0"
    assert calls(sdk_env, "POST", "/traces") == []
    assert sdk_env.run(run.id).status == "COMPLETED"


def test_service_not_enabled_makes_prime_runs_fall_back_to_samples(
    sdk_env: FakePlatform, load_wire_episode: Callable[[dict[str, Any]], Any]
) -> None:
    sdk_env.service_not_enabled = True
    run = open_run()
    run.log_episodes([load_wire_episode(episode_record(index)) for index in range(2)])
    run.finish()

    assert [request.status for request in calls(sdk_env, "POST", "/traces")] == [403]
    assert sdk_env.uploads == []
    assert [row["sample_id"] for row in sdk_env.samples(run.id)] == ["episode-0", "episode-1"]
    assert sdk_env.run(run.id).status == "COMPLETED"


def test_failed_run_is_closed_and_a_second_close_conflicts(sdk_env: FakePlatform) -> None:
    run = open_run()
    run.fail("the grader crashed")

    stored = sdk_env.run(run.id)
    assert stored.status == "FAILED"
    assert stored.error_message == "the grader crashed"

    cancel = httpx.put(
        api(sdk_env, f"/evaluations/{run.id}"), json={"status": "CANCELLED"}, headers=auth(sdk_env)
    )
    finalize = httpx.post(
        api(sdk_env, f"/evaluations/{run.id}/finalize"), json={"metrics": {}}, headers=auth(sdk_env)
    )
    assert (cancel.status_code, finalize.status_code) == (409, 409)
    stored = sdk_env.run(run.id)
    assert stored.status == "FAILED"
    assert [update["answered"] for update in stored.status_updates] == [200, 409]


def test_cancelled_run_stays_cancelled(sdk_env: FakePlatform) -> None:
    run = open_run()
    run.finish(status="cancelled", error="stopped by the operator")

    stored = sdk_env.run(run.id)
    assert (stored.status, stored.error_message) == ("CANCELLED", "stopped by the operator")
    assert stored.finalize_calls == 0
    second = httpx.put(
        api(sdk_env, f"/evaluations/{run.id}"),
        json={"status": "FAILED", "error_message": "late"},
        headers=auth(sdk_env),
    )
    assert second.status_code == 409
    assert sdk_env.run(run.id).status == "CANCELLED"


def test_training_run_streams_metrics_and_finalizes(sdk_env: FakePlatform) -> None:
    run = open_run(
        kind="train",
        model="org/base-model",
        team_id="team-a",
        environments=["env-hub-id"],
        training=prime_runs.TrainingSpec(max_steps=2),
    )
    run.log_metrics({"loss": 1.5}, step=1)
    run.log_metrics({"loss": 0.5}, step=2)
    run.log_episodes([episode_record(0)])
    run.finish()

    stored = sdk_env.run(run.id)
    assert (stored.kind, stored.status, stored.team_id) == ("train", "COMPLETED", "team-a")
    assert [row["loss"] for row in sdk_env.training_metrics(run.id)] == [1.5, 0.5]
    (episode,) = sdk_env.episodes(run.id)
    assert episode["traces"][0]["run"] == {"id": run.id, "type": "train"}


def test_training_run_for_a_team_not_allowed_is_forbidden(sdk_env: FakePlatform) -> None:
    with pytest.raises(ForbiddenError):
        open_run(kind="train", model="org/base-model", team_id="team-b")
    assert sdk_env.runs() == []


# -- faults through prime-runs -----------------------------------------------------------


def test_rate_limited_create_is_retried_after_retry_after(sdk_env: FakePlatform) -> None:
    sdk_env.fail_next(
        2, status=429, method="POST", path=r"/evaluations/$", retry_after=0.01, code="rate_limited"
    )
    run = open_run()
    run.finish()

    creates = calls(sdk_env, "POST", "/evaluations/")
    assert [(request.status, request.fault) for request in creates] == [
        (429, "fail"),
        (429, "fail"),
        (201, None),
    ]
    assert [stored.id for stored in sdk_env.runs()] == [run.id]


def test_failed_create_is_answered_without_acting(sdk_env: FakePlatform) -> None:
    # 503 may come from a gateway after forwarding, so prime-runs does not
    # replay a create; the fake must not have created anything either.
    sdk_env.fail_next(1, status=503, path=r"/evaluations/$")
    with pytest.raises(RetryableAPIError):
        open_run()
    assert sdk_env.runs() == []


def test_unavailable_upload_is_retried_after_retry_after(sdk_env: FakePlatform) -> None:
    sdk_env.fail_next(1, status=503, path=r"/traces$", retry_after=0.01, code="ingest_unavailable")
    run = open_run()
    run.log_episodes([episode_record(index) for index in range(3)])
    run.finish()

    assert [request.status for request in calls(sdk_env, "POST", "/traces")] == [503, 201]
    assert len(sdk_env.episodes(run.id)) == 3
    assert sdk_env.run(run.id).metrics["prime_runs"]["traces_episodes_written"] == 3


def test_ambiguous_upload_is_replayed_and_stored_once(sdk_env: FakePlatform) -> None:
    sdk_env.ambiguous_next(1, method="POST", path=r"/traces$", retry_after=0.01)
    run = open_run()
    run.log_episodes([episode_record(index) for index in range(3)])
    run.finish()

    assert [request.status for request in calls(sdk_env, "POST", "/traces")] == [502, 201]
    (upload,) = sdk_env.uploads
    assert upload.replays == 1
    assert sdk_env.episode_deliveries(run.id) == {f"episode-{i}": 1 for i in range(3)}
    assert len(sdk_env.episodes(run.id)) == 3


def test_ambiguous_create_leaves_a_run_that_listing_finds(sdk_env: FakePlatform) -> None:
    sdk_env.ambiguous_next(1, method="POST", path=r"/evaluations/$")
    with pytest.raises(RetryableAPIError):
        open_run(name="lost-response")

    (created,) = sdk_env.runs()
    listing = httpx.get(
        api(sdk_env, "/evaluations/"),
        params={"environment_name": "arith", "skip": 0, "limit": 10},
        headers=auth(sdk_env),
    ).json()
    assert [item["evaluation_id"] for item in listing["evaluations"]] == [created.id]
    assert listing["evaluations"][0]["name"] == "lost-response"


def test_outage_then_recovery(sdk_env: FakePlatform) -> None:
    port = sdk_env.port
    sdk_env.start_outage()
    recovery = threading.Timer(0.3, sdk_env.end_outage)
    recovery.start()
    try:
        run = open_run()  # connection refused is safe to replay, for every method
    finally:
        recovery.join()
    run.log_episodes([episode_record(0)])
    run.finish()

    assert sdk_env.port == port
    assert [stored.id for stored in sdk_env.runs()] == [run.id]
    assert sdk_env.run(run.id).status == "COMPLETED"
    assert len(sdk_env.episodes(run.id)) == 1


def test_outage_cuts_open_keep_alive_connections(fake: FakePlatform) -> None:
    with httpx.Client(headers=auth(fake)) as client:
        assert client.get(api(fake, "/evaluations/")).status_code == 200
        with fake.outage(), pytest.raises(httpx.ConnectError):
            client.get(api(fake, "/evaluations/"))
        assert client.get(api(fake, "/evaluations/")).status_code == 200


def test_latency_delays_but_still_performs_the_request(sdk_env: FakePlatform) -> None:
    sdk_env.set_latency(0.5)
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(
            api(sdk_env, "/environmentshub/resolve"),
            json={"name": "slow-env"},
            headers=auth(sdk_env),
            timeout=0.05,
        )
    sdk_env.set_latency(0.01)
    wait_for(lambda: "slow-env" in sdk_env.environments().values(), "the delayed request")

    run = open_run()
    run.finish()
    assert sdk_env.run(run.id).status == "COMPLETED"


def test_fail_next_matches_method_and_path_and_counts_down(fake: FakePlatform) -> None:
    fake.fail_next(1, status=500, method="GET", path=r"/evaluations/?$")
    post = httpx.post(api(fake, "/environmentshub/resolve"), json={"name": "x"}, headers=auth(fake))
    first = httpx.get(api(fake, "/evaluations/"), headers=auth(fake))
    second = httpx.get(api(fake, "/evaluations/"), headers=auth(fake))
    assert (post.status_code, first.status_code, second.status_code) == (200, 500, 200)
    assert [request.fault for request in fake.requests()] == [None, "fail", None]


# -- direct HTTP: auth, uploads, environments ---------------------------------------------


def test_bad_token_is_401_in_each_services_error_shape(fake: FakePlatform) -> None:
    bad = {"Authorization": "Bearer not-the-key"}
    api_answer = httpx.post(api(fake, "/evaluations/"), json={"name": "x"}, headers=bad)
    traces_answer = httpx.post(api(fake, "/traces"), headers=bad)
    missing = httpx.get(api(fake, "/evaluations/"))

    assert api_answer.status_code == missing.status_code == traces_answer.status_code == 401
    assert "detail" in api_answer.json()
    assert traces_answer.json()["error"]["code"] == "unauthenticated"
    for answer in (api_answer, traces_answer, missing):
        with pytest.raises(UnauthorizedError):
            raise_for_response(answer)
    assert fake.runs() == []


def test_idempotency_key_must_match_the_uncompressed_bytes(fake: FakePlatform) -> None:
    body = jsonl([episode_record(0, run_id="run-1")])
    client = traces_client(fake)
    with pytest.raises(ValidationRejectedError) as mismatch:
        client.upload_batch(body, key_of(body + b"\n"), line_format=LineFormat.EPISODE)
    with pytest.raises(ValidationRejectedError) as malformed:
        client.upload_batch(body, "md5:abc", line_format=LineFormat.EPISODE)

    assert mismatch.value.code == "digest_mismatch"
    assert malformed.value.code == "invalid_idempotency_key"
    assert fake.uploads == []
    assert fake.episodes("run-1") == []


def test_replayed_upload_returns_the_receipt_without_storing_twice(fake: FakePlatform) -> None:
    body = jsonl([episode_record(index, run_id="run-1") for index in range(2)])
    client = traces_client(fake)
    first = client.upload_batch(body, key_of(body), line_format=LineFormat.EPISODE)
    again = client.upload_batch(body, key_of(body), line_format=LineFormat.EPISODE, compress=False)

    assert (
        first == again == {"upload_id": key_of(body).removeprefix("sha256:"), "status": "committed"}
    )
    (upload,) = fake.uploads
    assert (upload.replays, upload.num_lines) == (1, 2)
    assert fake.episode_deliveries("run-1") == {"episode-0": 1, "episode-1": 1}
    with pytest.raises(LineFormatConflictError):
        client.upload_batch(body, key_of(body), line_format=LineFormat.TRACE)


def test_an_episode_is_stored_under_its_member_traces_run(fake: FakePlatform) -> None:
    unstamped = episode_record(0, run_id="run-1")
    del unstamped["traces"][0]["run"]
    body = jsonl([unstamped])
    with pytest.raises(ValidationRejectedError) as rejected:
        traces_client(fake).upload_batch(body, key_of(body), line_format=LineFormat.EPISODE)
    assert rejected.value.code == "invalid_trace"
    assert "stamp it on every member trace" in str(rejected.value)

    empty = {"id": "episode-empty", "run": {"type": "eval", "id": "run-1"}, "traces": []}
    body = jsonl([empty])
    traces_client(fake).upload_batch(body, key_of(body), line_format=LineFormat.EPISODE)
    assert [episode["id"] for episode in fake.episodes("run-1")] == ["episode-empty"]


def test_trace_lines_are_stored_by_their_run(fake: FakePlatform) -> None:
    traces = [dict(episode_record(i, run_id="run-7")["traces"][0]) for i in range(2)]
    body = jsonl(traces)
    traces_client(fake).upload_batch(body, key_of(body), context={"source": "test"})

    assert [trace["id"] for trace in fake.traces("run-7")] == ["trace-0", "trace-1"]
    assert fake.episodes("run-7") == []
    (upload,) = fake.uploads
    assert (upload.line_format, upload.context) == ("trace", {"source": "test"})

    episode_body = jsonl([episode_record(5, run_id="run-7")])
    with pytest.raises(ValidationRejectedError) as wrong_format:
        traces_client(fake).upload_batch(episode_body, key_of(episode_body))
    assert wrong_format.value.code == "line_format_mismatch"


def test_duplicate_ids_in_one_upload_are_rejected(fake: FakePlatform) -> None:
    body = jsonl([episode_record(0, run_id="run-1"), episode_record(0, run_id="run-1")])
    with pytest.raises(ValidationRejectedError) as rejected:
        traces_client(fake).upload_batch(body, key_of(body), line_format=LineFormat.EPISODE)
    assert rejected.value.code == "duplicate_episode_id"
    assert fake.uploads == []


def test_non_finite_numbers_are_not_json(fake: FakePlatform) -> None:
    line = b'{"id":"t1","run":{"id":"run-1"},"metrics":{"score":NaN}}\n'
    with pytest.raises(ValidationRejectedError) as rejected:
        traces_client(fake).upload_batch(line, key_of(line))
    assert rejected.value.code == "invalid_trace"

    created = httpx.post(
        api(fake, "/evaluations/"),
        content=b'{"name": "x", "environments": [{"id": "e"}], "metadata": {"t": Infinity}}',
        headers={**auth(fake), "Content-Type": "application/json"},
    )
    assert created.status_code == 422
    assert fake.runs() == []
    assert fake.uploads == []


def test_upload_limits(fake: FakePlatform) -> None:
    client = traces_client(fake)
    too_many = b'{"id":"t"}\n' * (1_000_000 + 1)
    with pytest.raises(ValidationRejectedError) as lines:
        client.upload_batch(too_many, key_of(too_many))
    assert lines.value.code == "too_many_traces_in_upload"

    # The byte limits are scaled down so the test does not move hundreds of MiB.
    fake.max_line_bytes = 200
    long_line = jsonl([{"id": "t", "run": {"id": "r"}, "padding": "x" * 300}])
    with pytest.raises(ValidationRejectedError) as line:
        client.upload_batch(long_line, key_of(long_line))
    assert line.value.code == "trace_too_large"

    fake.max_upload_bytes = 1000
    big = jsonl([{"id": f"t{i}", "padding": "x" * 100} for i in range(20)])
    for compress in (True, False):
        with pytest.raises(ValidationRejectedError) as upload:
            client.upload_batch(big, key_of(big), compress=compress)
        assert upload.value.code == "upload_too_large"
    assert fake.uploads == []


def test_traces_part_must_be_valid_gzip_when_it_says_so(fake: FakePlatform) -> None:
    body = jsonl([{"id": "t1"}])
    answer = httpx.post(
        api(fake, "/traces"),
        headers={**auth(fake), "Idempotency-Key": key_of(body)},
        files={
            "metadata": (None, b'{"schema_version": 1}', "application/json"),
            "traces": ("traces.jsonl", body, "application/x-ndjson", {"Content-Encoding": "gzip"}),
        },
    )
    assert answer.status_code == 400
    assert answer.json()["error"]["code"] == "malformed_encoding"


def test_service_not_enabled_is_a_coded_403(fake: FakePlatform) -> None:
    fake.service_not_enabled = True
    body = jsonl([{"id": "t1"}])
    with pytest.raises(ForbiddenError) as denied:
        traces_client(fake).upload_batch(body, key_of(body))
    assert denied.value.code == "service_not_enabled"


def test_environment_resolution_by_name_and_by_owner_slug(sdk_env: FakePlatform) -> None:
    fake = sdk_env

    def resolve(body: dict[str, Any]) -> str:
        answer = httpx.post(api(fake, "/environmentshub/resolve"), json=body, headers=auth(fake))
        return str(answer.json()["data"]["id"])

    first = resolve({"name": "gsm8k"})
    assert resolve({"name": "gsm8k"}) == first
    assert resolve({"name": "gsm8k", "team_id": "team-a"}) != first

    unknown = httpx.get(api(fake, "/environmentshub/acme/math/@latest"), headers=auth(fake))
    with pytest.raises(NotFoundError):
        raise_for_response(unknown)
    with pytest.raises(prime_runs.EnvironmentResolutionError):
        open_run(environments=["acme/math"])

    published = fake.add_environment("acme", "math")
    latest = httpx.get(api(fake, "/environmentshub/acme/math/@latest"), headers=auth(fake))
    assert latest.json()["data"]["id"] == published
    run = open_run(environments=["acme/math"])
    run.finish()
    assert fake.run(run.id).environments == [{"id": published}]


def test_evaluation_list_is_newest_first_and_filtered(fake: FakePlatform) -> None:
    env_ids = {
        name: httpx.post(
            api(fake, "/environmentshub/resolve"), json={"name": name}, headers=auth(fake)
        ).json()["data"]["id"]
        for name in ("alpha", "beta")
    }
    for name, env, team in (
        ("one", "alpha", "t1"),
        ("two", "beta", "t1"),
        ("three", "alpha", "t2"),
    ):
        created = httpx.post(
            api(fake, "/evaluations/"),
            json={"name": name, "environments": [{"id": env_ids[env]}], "team_id": team},
            headers=auth(fake),
        )
        assert created.status_code == 201

    def names(**params: Any) -> list[str]:
        answer = httpx.get(api(fake, "/evaluations/"), params=params, headers=auth(fake)).json()
        return [item["name"] for item in answer["evaluations"]]

    assert names() == ["three", "two", "one"]
    assert names(environment_name="alpha") == ["three", "one"]
    assert names(team_id="t1") == ["two", "one"]
    assert names(skip=1, limit=1) == ["two"]


def test_evaluation_validation_and_metadata_replacement(fake: FakePlatform) -> None:
    no_env = httpx.post(
        api(fake, "/evaluations/"), json={"name": "x", "environments": []}, headers=auth(fake)
    )
    assert no_env.status_code == 422

    created = httpx.post(
        api(fake, "/evaluations/"),
        json={"name": "x", "environments": [{"id": "env_1"}], "metadata": {"a": 1}},
        headers=auth(fake),
    ).json()
    run_url = api(fake, f"/evaluations/{created['evaluation_id']}")
    httpx.put(run_url, json={"metadata": {"b": 2}, "metrics": {"m": 1.0}}, headers=auth(fake))
    too_long = httpx.put(
        run_url, json={"status": "FAILED", "error_message": "e" * 4097}, headers=auth(fake)
    )
    completed = httpx.put(run_url, json={"status": "COMPLETED"}, headers=auth(fake))

    stored = fake.run(created["evaluation_id"])
    assert (stored.metadata, stored.metrics) == ({"b": 2}, {"m": 1.0})
    assert (too_long.status_code, completed.status_code) == (422, 422)
    assert stored.status == "RUNNING"

    fake.max_samples_request_bytes = 100
    oversized = httpx.post(
        f"{run_url}/samples", json={"samples": [{"sample_id": "s" * 200}]}, headers=auth(fake)
    )
    assert oversized.status_code == 413
    assert httpx.get(api(fake, "/evaluations/missing"), headers=auth(fake)).status_code == 404


def test_rft_endpoints(fake: FakePlatform) -> None:
    def post(path: str, body: dict[str, Any]) -> httpx.Response:
        return httpx.post(api(fake, path), json=body, headers=auth(fake))

    spec = {"base_model": "org/m", "max_steps": 3, "environments": [{"id": "env"}]}
    assert post("/rft/external-runs", {**spec, "team_id": "team-b"}).status_code == 403
    personal = post("/rft/external-runs", spec)  # no team: the user's own account
    assert personal.status_code == 201
    assert fake.run(personal.json()["run"]["id"]).team_id is None
    created = post("/rft/external-runs", {**spec, "team_id": "team-a", "name": "rl"})
    assert created.status_code == 201
    run = created.json()["run"]
    assert run["name"] == "rl"

    for loss in (2.0, 1.0):  # a replayed step replaces its row
        assert post(
            "/rft/metrics", {"run_id": run["id"], "metrics": {"step": 1, "loss": loss}}
        ).is_success
    assert fake.training_metrics(run["id"]) == [{"step": 1, "loss": 1.0}]

    presigned = post("/rft/samples/presign", {"run_id": run["id"], "step": 1}).json()["data"]
    confirm = {"run_id": run["id"], "step": 1, "s3_key": presigned["s3Key"]}
    assert post("/rft/samples/confirm", confirm).status_code == 404
    forged = presigned["presignedUrl"].replace("signature=", "signature=0")
    assert httpx.put(forged, content=b"PAR1").status_code == 403
    assert httpx.put(presigned["presignedUrl"], content=b"PAR1").status_code == 200
    assert post("/rft/samples/confirm", confirm).is_success
    (samples,) = fake.training_samples(run["id"])
    assert (samples.step, samples.data) == (1, b"PAR1")

    assert post("/rft/finalize", {"run_id": run["id"], "exit_code": 0}).is_success
    assert post("/rft/finalize", {"run_id": run["id"], "exit_code": 0}).is_success
    status = httpx.put(
        api(fake, f"/rft/external-runs/{run['id']}/status"),
        json={"status": "failed", "error_message": "late"},
        headers=auth(fake),
    )
    assert status.status_code == 409
    stored = fake.run(run["id"])
    assert (stored.status, stored.finalize_calls) == ("COMPLETED", 2)


# -- pieces --------------------------------------------------------------------------------


def test_multipart_reader_returns_the_exact_part_bytes() -> None:
    jsonl_bytes = b'{"id":"t1"}\n'
    compressed = gzip.compress(jsonl_bytes, mtime=0)
    request = httpx.Request(
        "POST",
        "http://127.0.0.1/",
        files={
            "metadata": (None, b'{"schema_version":1}', "application/json"),
            "traces": (
                "traces.jsonl",
                compressed,
                "application/x-ndjson",
                {"Content-Encoding": "gzip"},
            ),
        },
    )
    metadata, traces = parse_form(request.headers["Content-Type"], request.read())

    assert (metadata.name, metadata.data, metadata.filename) == (
        "metadata",
        b'{"schema_version":1}',
        None,
    )
    assert (traces.name, traces.filename, traces.content_encoding) == (
        "traces",
        "traces.jsonl",
        "gzip",
    )
    assert traces.content_type == "application/x-ndjson"
    assert traces.data == compressed

    with pytest.raises(MultipartError, match="boundary"):
        parse_form("multipart/form-data", b"")
    with pytest.raises(MultipartError, match="closing boundary"):
        parse_form(
            "multipart/form-data; boundary=b",
            b'--b\r\nContent-Disposition: form-data; name="x"\r\n\r\nvalue',
        )


def test_command_line_serves_until_interrupted(tmp_path: Any) -> None:
    env = {**os.environ, "HOME": str(tmp_path)}
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "prime_runs_otel.testing",
            "--port",
            "0",
            "--api-key",
            "cli-key",
            "--quiet",
        ],
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        assert process.stdout is not None
        exports: dict[str, str] = {}
        while "PRIME_TRACES_URL" not in exports:
            line = process.stdout.readline()
            assert line, "the server exited before printing its exports"
            if line.startswith("export "):
                name, _, value = line.removeprefix("export ").strip().partition("=")
                exports[name] = value
        assert exports["PRIME_API_KEY"] == "cli-key"
        answer = httpx.get(
            f"{exports['PRIME_API_BASE_URL']}/api/v1/evaluations/",
            headers={"Authorization": "Bearer cli-key"},
        )
        assert answer.json()["evaluations"] == []
        process.send_signal(signal.SIGINT)
        assert process.wait(timeout=30) == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
