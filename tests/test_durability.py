"""Nothing lost, nothing twice: real producer processes, ``kill -9``, forks,
outages and ambiguous failures against the fake platform, then a look at
what the platform stored.

An *ambiguous* fault makes the fake platform do the work and then answer 502,
as a gateway that lost the answer would; a kill is delivered from inside the
fake platform's request hook, after the work is stored and before the answer
leaves, so "the process died between the request and its receipt" happens
every time, not by luck of timing.
"""

from __future__ import annotations

import gzip
import json
import logging
import os
import signal
import sqlite3
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import prime_runs_otel as pro
from prime_runs_otel.config import resolve_settings
from prime_runs_otel.produce.synthetic import synthetic_episodes
from prime_runs_otel.testing import FakePlatform, RecordedRequest

SUBPROCESS_TIMEOUT = 120

#: A producer: ``count`` episodes of ``seed`` on one run, a pause between
#: them, then (unless killed first) a normal finish. Prints the run id first
#: and the RunResult last. With ``--hold`` it waits for a line on stdin
#: before finishing, so a test can let another process feed the run first.
PRODUCER = textwrap.dedent(
    """
    import argparse, json, sys, time
    import prime_runs_otel as pro
    from prime_runs_otel.produce.synthetic import synthetic_episodes

    parser = argparse.ArgumentParser()
    parser.add_argument("--count", type=int, default=20)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--pause", type=float, default=0.0)
    parser.add_argument("--name", default="producer")
    parser.add_argument("--hold", action="store_true")
    args = parser.parse_args()
    run = pro.start_run(name=args.name, environments=["env-a"], finish_timeout=90)
    print(run.id, flush=True)
    for record in synthetic_episodes(args.count, seed=args.seed):
        run.record_episode(record)
        time.sleep(args.pause)
    if args.hold:
        sys.stdin.readline()
    result = run.finish()
    print(json.dumps(result.__dict__), flush=True)
    """
)

#: A second process feeding an existing run through its own TracerProvider:
#: same run id and identity on the Resource, no run end of its own.
CO_PRODUCER = textwrap.dedent(
    """
    import sys
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor
    import prime_runs_otel as pro
    from prime_runs_otel.produce.synthetic import synthetic_episodes

    resource = pro.run_resource(run_id=sys.argv[1], name="shared", environments=["env-a"])
    provider = TracerProvider(resource=resource)
    provider.add_span_processor(BatchSpanProcessor(pro.PrimeRunsSpanExporter()))
    tracer = provider.get_tracer("co-producer")
    for record in synthetic_episodes(int(sys.argv[2]), seed=int(sys.argv[3])):
        pro.record_episode(tracer, record)
    provider.shutdown()
    """
)

#: A run whose process forks: an ``os.fork`` child and a multiprocessing
#: (fork) child record episodes on the parent's run while the parent's
#: exporter and uploader threads are busy.
FORKING_PRODUCER = textwrap.dedent(
    """
    import json, multiprocessing, os, traceback
    import prime_runs_otel as pro
    from prime_runs_otel.produce.synthetic import synthetic_episodes

    run = pro.start_run(name="forked", environments=["env-a"], finish_timeout=90)

    def work(seed):
        for record in synthetic_episodes(15, seed=seed):
            run.record_episode(record)
        run.finish()  # in a child: flushes its spans, never ends the run

    for record in synthetic_episodes(15, seed=1):
        run.record_episode(record)
    pid = os.fork()
    if pid == 0:
        code = 0
        try:
            work(2)
        except BaseException:
            traceback.print_exc()
            code = 1
        os._exit(code)
    child = multiprocessing.get_context("fork").Process(target=work, args=(3,))
    child.start()
    for record in synthetic_episodes(15, seed=4):
        run.record_episode(record)
    child.join(90)
    codes = [os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]), child.exitcode]
    result = run.finish()
    print(json.dumps({"codes": codes, "result": result.__dict__}), flush=True)
    """
)


# -- building blocks ------------------------------------------------------------------------------


def _spool_path() -> Path:
    return resolve_settings().spool_path


def _child_env(**extra: str) -> dict[str, str]:
    """The test's (isolated) environment for a child process."""
    env = dict(os.environ)
    env.update(extra)
    return env


def _start_producer(*args: str, env: dict[str, str], hold: bool = False) -> subprocess.Popen[str]:
    command = [sys.executable, "-c", PRODUCER, *args] + (["--hold"] if hold else [])
    return subprocess.Popen(
        command,
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "prime_runs_otel.cli", *args],
        env=env or _child_env(),
        capture_output=True,
        text=True,
        timeout=SUBPROCESS_TIMEOUT,
    )


def _show(run_key: str) -> dict[str, Any]:
    done = _cli("show", run_key, "--json")
    assert done.returncode == 0, done.stderr
    shown: dict[str, Any] = json.loads(done.stdout)
    return shown


def _spooled_episode_ids() -> dict[str, set[str]]:
    """Every episode the spool has committed, per run key: what producers
    were told is safe."""
    db = sqlite3.connect(f"file:{_spool_path()}?mode=ro", uri=True, timeout=30)
    try:
        rows = db.execute("SELECT run_id, episode_id FROM episodes").fetchall()
    finally:
        db.close()
    committed: dict[str, set[str]] = {}
    for run_id, episode_id in rows:
        committed.setdefault(run_id, set()).add(episode_id)
    return committed


def _wait_for(condition: Callable[[], bool], what: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(0.02)


def _kill_on(
    platform: FakePlatform, matches: Callable[[RecordedRequest], bool]
) -> Callable[[subprocess.Popen[str]], None]:
    """Arm the platform to SIGKILL the producer on the first request that
    ``matches``: the work is stored, the answer never arrives."""
    target: list[subprocess.Popen[str]] = []
    fired = threading.Event()

    def hook(request: RecordedRequest) -> None:
        if target and not fired.is_set() and matches(request):
            fired.set()
            os.kill(target[0].pid, signal.SIGKILL)

    platform.on_request = hook
    return target.append


def _reap_killed(process: subprocess.Popen[str]) -> None:
    process.wait(timeout=SUBPROCESS_TIMEOUT)
    assert process.returncode == -signal.SIGKILL, process.stderr.read() if process.stderr else ""


def _finished(process: subprocess.Popen[str]) -> dict[str, Any]:
    out, err = process.communicate(timeout=SUBPROCESS_TIMEOUT)
    assert process.returncode == 0, err
    result: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
    return result


def _assert_stored_once(platform: FakePlatform, platform_id: str, episode_ids: set[str]) -> None:
    stored = [episode["id"] for episode in platform.episodes(platform_id)]
    assert sorted(stored) == sorted(episode_ids)
    assert set(platform.episode_deliveries(platform_id).values()) == {1}


def _delivered_somewhere(platform: FakePlatform) -> bool:
    return any(platform.episodes(run.id) for run in platform.runs())


def _run_eval(records: list[dict[str, Any]], **kwargs: Any) -> pro.RunResult:
    run = pro.start_run(name="durable", environments=["env-a"], **kwargs)
    for record in records:
        run.record_episode(record)
    return run.finish(timeout=60)


def _requests_to(platform: FakePlatform, method: str, path_part: str) -> list[RecordedRequest]:
    return [r for r in platform.requests() if r.method == method and path_part in r.path]


# -- process death --------------------------------------------------------------------------


def test_kill_9_mid_run_then_push_delivers_every_committed_episode_once(
    online: FakePlatform,
) -> None:
    env = _child_env(OTEL_BSP_SCHEDULE_DELAY="20")
    producer = _start_producer("--count", "400", "--pause", "0.01", env=env)
    try:
        assert producer.stdout is not None
        run_key = producer.stdout.readline().strip()
        _wait_for(
            lambda: (
                len(_spooled_episode_ids().get(run_key, ())) >= 40 and _delivered_somewhere(online)
            ),
            "the producer to commit episodes and deliver some of them",
        )
    finally:
        producer.send_signal(signal.SIGKILL)
    _reap_killed(producer)
    committed = _spooled_episode_ids()[run_key]
    assert len(committed) < 400, "the producer must die mid-run"

    pushed = _cli("push", "--all")

    assert pushed.returncode == 0, pushed.stdout + pushed.stderr
    [platform_run] = online.runs()
    assert platform_run.status == "FAILED"
    assert (platform_run.error_message or "").startswith("crashed")
    _assert_stored_once(online, platform_run.id, committed)
    shown = _show(run_key)
    assert (shown["closed"], shown["pending"], shown["status"]) == (True, 0, "crashed")


def test_restart_between_traces_upload_and_receipt_replays_same_bytes(
    online: FakePlatform,
) -> None:
    arm = _kill_on(online, lambda r: r.path == "/api/v1/traces" and r.status == 201)
    producer = _start_producer("--count", "100", "--pause", "0.01", env=_child_env())
    arm(producer)
    _reap_killed(producer)
    [first_upload] = online.uploads
    assert first_upload.replays == 0

    pushed = _cli("push", "--all")

    assert pushed.returncode == 0, pushed.stdout + pushed.stderr
    uploads = {upload.id: upload for upload in online.uploads}
    assert uploads[first_upload.id].replays == 1, "the same bytes, the same idempotency key"
    [platform_run] = online.runs()
    [(run_key, committed)] = _spooled_episode_ids().items()
    _assert_stored_once(online, platform_run.id, committed)
    assert platform_run.status == "FAILED"
    assert _show(run_key)["uncertain"] == 0


def test_an_upload_stored_plain_by_an_earlier_release_is_replayed_with_its_key(
    online: FakePlatform,
) -> None:
    """Schema 1 kept an open upload's lines uncompressed: the replay
    compresses them, and the idempotency key (over the lines) still matches."""
    arm = _kill_on(online, lambda r: r.path == "/api/v1/traces" and r.status == 201)
    producer = _start_producer("--count", "60", "--pause", "0.01", env=_child_env())
    arm(producer)
    _reap_killed(producer)
    [first_upload] = online.uploads
    db = sqlite3.connect(_spool_path(), timeout=30)
    with db:
        [(upload_id, compressed, encoding)] = db.execute(
            "SELECT upload_id, body, body_encoding FROM uploads WHERE state = 'pending'"
        ).fetchall()
        assert encoding == "gzip"
        db.execute(
            "UPDATE uploads SET body = ?, body_encoding = NULL WHERE upload_id = ?",
            (gzip.decompress(compressed), upload_id),
        )
    db.close()

    pushed = _cli("push", "--all")

    assert pushed.returncode == 0, pushed.stdout + pushed.stderr
    assert {upload.id: upload for upload in online.uploads}[first_upload.id].replays == 1
    [platform_run] = online.runs()
    [(_, committed)] = _spooled_episode_ids().items()
    _assert_stored_once(online, platform_run.id, committed)


def test_restart_during_sample_request_counts_it_uncertain_and_never_resends(
    online: FakePlatform,
) -> None:
    env = _child_env(PRIME_TRACES_OPT_OUT="true")
    arm = _kill_on(online, lambda r: r.path.endswith("/samples") and r.status == 200)
    producer = _start_producer("--count", "100", "--pause", "0.01", env=env)
    arm(producer)
    _reap_killed(producer)
    [platform_run] = online.runs()
    in_flight = [row["sample_id"] for row in online.samples(platform_run.id)]
    assert in_flight

    pushed = _cli("push", "--all", env=env)

    assert pushed.returncode == 0, pushed.stdout + pushed.stderr
    [(run_key, committed)] = _spooled_episode_ids().items()
    rows = [row["sample_id"] for row in online.samples(platform_run.id)]
    assert len(rows) == len(set(rows)), "no sample row twice"
    assert rows[: len(in_flight)] == in_flight
    assert set(rows) == committed
    shown = _show(run_key)
    assert shown["uncertain"] == len(in_flight)
    assert (shown["closed"], shown["pending"]) == (True, 0)
    assert f"{len(in_flight)} uncertain" in pushed.stdout


def test_forked_children_record_on_the_parent_run_without_closing_it(
    online: FakePlatform,
) -> None:
    done = subprocess.run(
        [sys.executable, "-c", FORKING_PRODUCER],
        env=_child_env(OTEL_BSP_SCHEDULE_DELAY="20"),
        capture_output=True,
        text=True,
        timeout=SUBPROCESS_TIMEOUT,
    )

    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["codes"] == [0, 0]
    result = report["result"]
    assert (result["closed"], result["status"], result["episodes"]) == (True, "completed", 60)
    [platform_run] = online.runs()
    assert platform_run.status == "COMPLETED"
    assert platform_run.finalize_calls == 1
    assert platform_run.status_updates == [], "no child marked the run"
    expected = {r["id"] for seed in (1, 2, 3, 4) for r in synthetic_episodes(15, seed=seed)}
    _assert_stored_once(online, platform_run.id, expected)
    db = sqlite3.connect(_spool_path())
    try:
        assert db.execute("PRAGMA integrity_check").fetchone() == ("ok",)
    finally:
        db.close()


# -- several processes, one spool ---------------------------------------------------------


class MeteredPlatform(FakePlatform):
    """The fake platform, counting requests in flight at once: with one
    delivering process at a time there is never more than one."""

    def __init__(self) -> None:
        super().__init__()
        self.in_flight = 0
        self.most_in_flight = 0
        self._meter = threading.Lock()

    def _serve(self, request: Any) -> Any:
        with self._meter:
            self.in_flight += 1
            self.most_in_flight = max(self.most_in_flight, self.in_flight)
        try:
            return super()._serve(request)
        finally:
            with self._meter:
                self.in_flight -= 1


@pytest.fixture
def metered(monkeypatch: pytest.MonkeyPatch) -> Iterator[MeteredPlatform]:
    platform = MeteredPlatform()
    platform.start()
    try:
        for name, value in platform.client_env().items():
            monkeypatch.setenv(name, value)
        platform.set_latency(0.005)
        yield platform
    finally:
        platform.stop()


def test_two_producers_share_one_spool_one_uploader_at_a_time(metered: MeteredPlatform) -> None:
    env = _child_env(OTEL_BSP_SCHEDULE_DELAY="20")
    first = _start_producer("--count", "60", "--seed", "1", "--pause", "0.005", env=env)
    second = _start_producer("--count", "60", "--seed", "2", "--pause", "0.005", env=env)
    results = [_finished(first), _finished(second)]

    for result, seed in zip(results, (1, 2), strict=True):
        assert result["closed"] and result["pending"] == 0
        platform_run = metered.run(result["platform_id"])
        assert platform_run.status == "COMPLETED"
        _assert_stored_once(
            metered, platform_run.id, {r["id"] for r in synthetic_episodes(60, seed=seed)}
        )
    assert len(metered.runs()) == 2
    assert all(upload.replays == 0 for upload in metered.uploads)
    assert metered.most_in_flight == 1


def test_one_run_fed_by_two_processes(metered: MeteredPlatform) -> None:
    env = _child_env(OTEL_BSP_SCHEDULE_DELAY="20")
    owner = _start_producer(
        "--count", "40", "--seed", "1", "--pause", "0.01", "--name", "shared", env=env, hold=True
    )
    assert owner.stdout is not None and owner.stdin is not None
    run_key = owner.stdout.readline().strip()
    co_producer = subprocess.run(
        [sys.executable, "-c", CO_PRODUCER, run_key, "40", "2"],
        env=env,
        capture_output=True,
        text=True,
        timeout=SUBPROCESS_TIMEOUT,
    )
    assert co_producer.returncode == 0, co_producer.stderr
    owner.stdin.write("finish\n")
    owner.stdin.flush()
    result = _finished(owner)

    assert result["closed"] and result["status"] == "completed"
    [platform_run] = metered.runs()
    assert platform_run.status == "COMPLETED"
    expected = {r["id"] for seed in (1, 2) for r in synthetic_episodes(40, seed=seed)}
    _assert_stored_once(metered, platform_run.id, expected)
    assert metered.most_in_flight == 1


# -- ambiguous failures: the platform acted, the answer was lost ----------------------------


def test_ambiguous_environment_resolve_is_replayed_safely(online: FakePlatform) -> None:
    online.ambiguous_next(1, path=r"/environmentshub/resolve$")
    result = _run_eval(list(synthetic_episodes(10)))

    assert result.closed and result.pending == 0
    assert len(online.environments()) == 1
    [platform_run] = online.runs()
    assert platform_run.status == "COMPLETED"
    assert len(_requests_to(online, "POST", "/environmentshub/resolve")) == 2


def test_ambiguous_create_is_found_by_marker_not_created_twice(online: FakePlatform) -> None:
    online.ambiguous_next(1, method="POST", path=r"/evaluations/?$")
    # The lookup itself fails a few times first: that is no reason to create again.
    online.fail_next(3, status=503, method="GET", path=r"/evaluations/?$")
    records = list(synthetic_episodes(20, seed=4))
    result = _run_eval(records)

    assert result.closed and result.status == "completed"
    [platform_run] = online.runs()
    assert platform_run.id == result.platform_id
    assert len(_requests_to(online, "POST", "/evaluations")) == 1 + 1  # create + finalize
    _assert_stored_once(online, platform_run.id, {r["id"] for r in records})


def test_ambiguous_traces_upload_is_stored_once(online: FakePlatform) -> None:
    online.ambiguous_next(1, path=r"^/api/v1/traces$")
    records = list(synthetic_episodes(30, seed=6))
    result = _run_eval(records)

    assert result.closed and result.pending == 0
    _assert_stored_once(online, result.platform_id or "", {r["id"] for r in records})
    assert sorted(upload.replays for upload in online.uploads)[-1] == 1
    assert online.run(result.platform_id or "").metrics["prime_runs"] == {
        "traces_episodes_written": 30
    }


def test_ambiguous_sample_request_is_counted_uncertain_never_resent(
    online: FakePlatform, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PRIME_TRACES_OPT_OUT", "true")
    online.ambiguous_next(1, path=r"/samples$")
    records = list(synthetic_episodes(30, seed=7))
    result = _run_eval(records)

    assert result.closed and result.pending == 0
    assert result.uncertain > 0
    rows = [row["sample_id"] for row in online.samples(result.platform_id or "")]
    assert len(rows) == len(set(rows)) == 30, "each row at most once (the ambiguous one acted)"
    assert _show(result.local_id)["uncertain"] == result.uncertain
    assert f"{result.uncertain} uncertain" in result.describe()


def test_ambiguous_update_is_redone(online: FakePlatform) -> None:
    online.ambiguous_next(2, method="PUT", path=r"/evaluations/[^/]+$")
    result = _run_eval(list(synthetic_episodes(10)), config={"temperature": 0.3})

    assert result.closed
    platform_run = online.run(result.platform_id or "")
    assert (platform_run.status, platform_run.finalize_calls) == ("COMPLETED", 1)
    assert platform_run.metadata["temperature"] == 0.3
    assert len(_requests_to(online, "PUT", "/evaluations/")) == 3


def test_ambiguous_finalize_is_not_sent_twice(online: FakePlatform) -> None:
    online.ambiguous_next(1, path=r"/finalize$")
    result = _run_eval(list(synthetic_episodes(10)))

    assert result.closed and result.status == "completed"
    platform_run = online.run(result.platform_id or "")
    assert (platform_run.status, platform_run.finalize_calls) == ("COMPLETED", 1)


def test_ambiguous_status_update_of_a_failed_run(online: FakePlatform) -> None:
    def fault_on_the_status_put(request: RecordedRequest) -> None:
        # The metadata/metrics PUT just went through; the status PUT is next.
        if request.method == "PUT" and request.status == 200 and online.on_request:
            online.on_request = None
            online.ambiguous_next(1, method="PUT")

    online.on_request = fault_on_the_status_put
    run = pro.start_run(name="failing", environments=["env-a"])
    run.record_episode(next(synthetic_episodes(1)))
    result = run.finish("failed", "the judge timed out", timeout=60)

    assert result.closed and result.status == "failed"
    platform_run = online.run(result.platform_id or "")
    assert platform_run.status == "FAILED"
    assert platform_run.error_message == "the judge timed out"
    answers = [update["answered"] for update in platform_run.status_updates]
    assert answers == [200, 409], "acted once; the replay met the closed run"


# -- transient failures ------------------------------------------------------------------


def test_retry_after_is_honoured_beyond_the_backoff_cap(online: FakePlatform) -> None:
    # The backoff cap is 0.3 s here; the server asks for more.
    online.fail_next(1, status=429, path=r"^/api/v1/traces$", retry_after=1.5)
    online.fail_next(1, status=429, method="POST", path=r"/evaluations/?$", retry_after=1.0)
    records = list(synthetic_episodes(10, seed=8))
    result = _run_eval(records)

    assert result.closed and result.pending == 0
    _assert_stored_once(online, result.platform_id or "", {r["id"] for r in records})
    for method, path, asked in (("POST", "/api/v1/traces", 1.5), ("POST", "/evaluations/", 1.0)):
        limited, retried = [r for r in _requests_to(online, method, path) if r.path.endswith(path)][
            :2
        ]
        assert limited.status == 429
        assert retried.received_at - limited.received_at >= asked - 0.05


def test_outage_longer_than_any_retry_budget_loses_nothing(
    online: FakePlatform, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="prime_runs_otel.deliver.backoff")
    records = list(synthetic_episodes(60, seed=12))
    run = pro.start_run(name="outage", environments=["env-a"])
    for record in records[:20]:
        run.record_episode(record)
    _wait_for(lambda: _delivered_somewhere(online), "the first episodes to arrive")

    with online.outage():
        for record in records[20:50]:
            run.record_episode(record)
        # Dozens of failed attempts (the cap between them is 0.3 s): no
        # fixed retry budget would have survived this.
        _wait_for(
            lambda: sum("delivery paused" in r.getMessage() for r in caplog.records) >= 24,
            "two dozen failed delivery attempts",
        )
    for record in records[50:]:
        run.record_episode(record)
    result = run.finish(timeout=60)

    assert result.closed and result.status == "completed"
    assert (result.pending, result.failed, result.uncertain) == (0, 0, 0)
    platform_run = online.run(result.platform_id or "")
    assert platform_run.status == "COMPLETED"
    _assert_stored_once(online, platform_run.id, {r["id"] for r in records})


def test_finish_with_short_timeout_during_outage_then_push(online: FakePlatform) -> None:
    records = list(synthetic_episodes(15, seed=13))
    with online.outage():
        run = pro.start_run(name="unlucky", environments=["env-a"])
        for record in records:
            run.record_episode(record)
        result = run.finish(timeout=1.0)

        assert not result.closed
        assert (result.pending, result.episodes) == (15, 15)
        assert f"prime-runs-otel push {result.local_id}" in result.describe()
    assert online.runs() == []

    pushed = _cli("push", "--all")

    assert pushed.returncode == 0, pushed.stdout + pushed.stderr
    [platform_run] = online.runs()
    assert platform_run.status == "COMPLETED"
    _assert_stored_once(online, platform_run.id, {r["id"] for r in records})
    shown = _show(result.local_id)
    assert (shown["closed"], shown["pending"], shown["platform_id"]) == (True, 0, platform_run.id)


# -- ingestion --------------------------------------------------------------------------------


def test_the_same_episode_twice_is_stored_and_delivered_once(online: FakePlatform) -> None:
    records = list(synthetic_episodes(12, seed=14))
    result = _run_eval([*records, records[3], records[7]])

    assert result.closed and result.episodes == 12
    _assert_stored_once(online, result.platform_id or "", {r["id"] for r in records})
    assert _show(result.local_id)["duplicates"] == 2


def test_spool_cap_refuses_and_counts_past_it(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("PRIME_RUNS_OTEL_SPOOL_MAX_BYTES", str(400_000))
    caplog.set_level(logging.WARNING, logger="prime_runs_otel.deliver.spool")
    records = list(synthetic_episodes(150, seed=15))
    result = _run_eval(records)

    assert result.mode == "local" and result.closed
    assert result.episodes > 0 and result.failed > 0
    assert result.episodes + result.failed == 150
    messages = [r.getMessage() for r in caplog.records]
    assert any("of its 400000-byte cap" in m for m in messages), messages
    assert any("refused" in m for m in messages), messages
    shown = _show(result.local_id)
    assert (shown["episodes"], shown["rejected"]) == (result.episodes, result.failed)
