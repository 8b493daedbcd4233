"""What the viewer needs of the store besides its views: delivered runs keep
their episode bodies (unless told not to), the size cap makes room by
dropping the oldest of those before it refuses a new episode, `prune
--bodies` drops them on demand, and `export --otlp` sends a stored run's
spans to a tracing backend (a real OTLP/HTTP endpoint on loopback)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import orjson
import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from viewer_runs import EVAL_EPISODES, open_spool, record_eval

from prime_runs_otel import semconv as sc
from prime_runs_otel.cli.main import main
from prime_runs_otel.config import resolve_settings
from prime_runs_otel.deliver.spool import EpisodeFilter, Spool
from prime_runs_otel.produce.synthetic import synthetic_episode
from prime_runs_otel.read.episodes import EpisodeArrival
from prime_runs_otel.read.records import RunBatch, RunIdentity
from prime_runs_otel.view.episodes import episode_detail

EPISODES = 30


def _store(spool: Spool, run_id: str, *, mode: str, first: int = 0) -> None:
    records = [synthetic_episode(first + index, seed=4) for index in range(EPISODES)]
    arrivals = [EpisodeArrival.of(record, orjson.dumps(record)) for record in records]
    outcome = spool.intake.ingest([RunBatch(RunIdentity(run_id), episodes=arrivals)], mode=mode)
    assert outcome.stored == EPISODES and outcome.rejected == 0


def _deliver(spool: Spool, run_id: str) -> None:
    """What the uploader does once Prime Traces confirms an upload."""
    seqs = [row.seq for row in spool.delivery.pending_episodes(run_id, max_bytes=1 << 30)]
    spool.delivery.begin_traces_upload(run_id, seqs, f"up-{run_id}", b"...", encoding="gzip")
    spool.delivery.commit_traces_upload(run_id, f"up-{run_id}")


@pytest.mark.parametrize("keep", [True, False])
def test_a_delivered_run_keeps_its_bodies_unless_told_not_to(tmp_path: Path, keep: bool) -> None:
    spool = Spool(tmp_path / "spool.sqlite3", max_bytes=1 << 30, keep_delivered=keep)
    _store(spool, "online-run", mode="online")
    _deliver(spool, "online-run")
    assert spool.reading.pending_count("online-run") == 0
    kept = sum(1 for _ in spool.reading.iter_episodes("online-run"))
    assert kept == (EPISODES if keep else 0)
    # The views stay either way: they never read the bodies.
    assert sum(count for _, count in spool.reading.histogram("online-run", "tokens")) == EPISODES


def test_the_setting_reaches_the_runs_a_process_starts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert resolve_settings().keep_delivered is True
    monkeypatch.setenv("PRIME_RUNS_OTEL_KEEP_DELIVERED", "false")
    assert resolve_settings().keep_delivered is False
    monkeypatch.setenv("PRIME_RUNS_OTEL_KEEP_DELIVERED", "sometimes")
    with pytest.raises(Exception, match="PRIME_RUNS_OTEL_KEEP_DELIVERED"):
        resolve_settings()


def test_at_the_cap_kept_bodies_make_room_before_an_episode_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "spool.sqlite3"
    spool = Spool(path, max_bytes=1 << 30)
    _store(spool, "delivered-run", mode="online")
    _deliver(spool, "delivered-run")
    spool.close()
    # Room for a few more episodes only: the next run needs the kept bodies' space.
    tight = Spool(path, max_bytes=Spool(path, max_bytes=1 << 30).housekeeping.used_bytes() + 20_000)
    _store(tight, "new-run", mode="local", first=1000)
    kept, _ = tight.housekeeping.delivered_bodies("delivered-run")
    assert EPISODES - kept > 0
    remaining = [row.episode_id for row in tight.reading.iter_episodes("delivered-run")]
    everything = [
        row.episode_id
        for row in tight.reading.episode_rows("delivered-run", EpisodeFilter(), limit=EPISODES)
    ]
    assert remaining == everything[EPISODES - kept :], "the oldest went first"


def test_a_spool_at_its_cap_has_room_while_kept_bodies_can_make_it(tmp_path: Path) -> None:
    """What serve asks before it takes a request (readiness, 503): at the cap
    a spool whose delivered bodies are kept still takes episodes, as the
    cap makes room with those; once none is kept it does not."""
    path = tmp_path / "spool.sqlite3"
    spool = Spool(path, max_bytes=1 << 30)
    _store(spool, "delivered-run", mode="online")
    spool.max_bytes = spool.housekeeping.used_bytes()
    assert not spool.housekeeping.has_room(), "at the cap, with nothing delivered"
    _deliver(spool, "delivered-run")
    assert spool.housekeeping.has_room(), "at the cap, with delivered bodies to drop"
    spool.housekeeping.drop_delivered_bodies("delivered-run")
    spool.max_bytes = spool.housekeeping.used_bytes()
    assert not spool.housekeeping.has_room(), "at the cap, with no body left to drop"
    spool.close()


def test_prune_bodies_drops_only_what_the_platform_has(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    spool_dir = tmp_path / "spool"
    local_id = record_eval(spool_dir)
    spool = open_spool(spool_dir)
    _store(spool, "online-run", mode="online")
    _deliver(spool, "online-run")
    spool.delivery.update_run("online-run", close_state="closed", end_status="completed")
    histogram = spool.reading.histogram("online-run", "reward")
    assert main(["prune", "--bodies", "--dry-run", "--spool-dir", str(spool_dir)]) == 0
    assert (
        f"would drop {EPISODES} delivered episode bodies of online-run" in capsys.readouterr().out
    )
    assert main(["prune", "--bodies", "--spool-dir", str(spool_dir)]) == 0
    assert f"dropped {EPISODES} delivered episode bodies" in capsys.readouterr().out
    assert spool.housekeeping.delivered_bodies("online-run") == (0, 0)
    assert spool.reading.histogram("online-run", "reward") == histogram
    first = spool.reading.episode_rows("online-run", EpisodeFilter(), limit=1)[0]
    run = spool.reading.run("online-run")
    assert run is not None
    detail = episode_detail(spool, run, first.episode_id)
    assert detail is not None and "no longer kept" in (detail.problem or "")
    # The local run's bodies are its only copy: untouched.
    assert sum(1 for _ in spool.reading.iter_episodes(local_id)) == EVAL_EPISODES


class _Collector(BaseHTTPRequestHandler):
    received: list[ExportTraceServiceRequest]

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        request = ExportTraceServiceRequest()
        request.ParseFromString(body)
        self.received.append(request)
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def collector() -> Iterator[tuple[str, list[ExportTraceServiceRequest]]]:
    received: list[ExportTraceServiceRequest] = []
    handler = type("Handler", (_Collector,), {"received": received})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/v1/traces", received
    server.shutdown()
    server.server_close()


def test_export_otlp_sends_a_stored_run_to_a_tracing_backend(
    tmp_path: Path,
    collector: tuple[str, list[ExportTraceServiceRequest]],
    capsys: pytest.CaptureFixture[str],
) -> None:
    endpoint, received = collector
    spool_dir = tmp_path / "spool"
    run_id = record_eval(spool_dir)
    assert main(["export", run_id[:12], "--otlp", endpoint, "--spool-dir", str(spool_dir)]) == 0
    assert f"{EVAL_EPISODES} episode(s)" in capsys.readouterr().out
    spans = [
        (resource.resource, span)
        for request in received
        for resource in request.resource_spans
        for scope in resource.scope_spans
        for span in scope.spans
    ]
    names = [span.name for _, span in spans]
    episodes = [span for _, span in spans if any(a.key == sc.EPISODE_ID for a in span.attributes)]
    assert len(episodes) == EVAL_EPISODES
    assert sc.RUN_START_SPAN in names and sc.RUN_END_SPAN in names
    assert any(name.startswith("chat") for name in names), "the model calls go too"
    keys = {attribute.key for _, span in spans for attribute in span.attributes}
    assert sc.EPISODE_RECORD not in keys and sc.RUN_CONFIG not in keys
    run_ids = {
        attribute.value.string_value
        for resource, _ in spans
        for attribute in resource.attributes
        if attribute.key == sc.RUN_ID
    }
    assert run_ids == {run_id}
