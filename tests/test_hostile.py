"""One bad span, episode or record costs only itself: each guard of intake,
synthesis, the receiver, delivery and the local store, on its own, with real
spools, real span trees and the fake platform. ``test_fuzz_serve.py`` throws
all of them at a real serve process at once."""

from __future__ import annotations

import gzip
import hashlib
import json
import logging
import os
import resource
import signal
import socket
import sqlite3
import stat
import subprocess
import sys
import threading
import time
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import hostile_cases as hc
import httpx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_receiver import ServeProcess, post, protobuf_body, run_spans, serve_env

from prime_runs_otel import semconv as sc
from prime_runs_otel._json import parse
from prime_runs_otel._text import OneLineFormatter, shown
from prime_runs_otel.cli import doctor
from prime_runs_otel.collector import bodies as rx_bodies
from prime_runs_otel.collector import intake as rx_intake
from prime_runs_otel.config import resolve_settings
from prime_runs_otel.deliver.delivery import read_ahead
from prime_runs_otel.deliver.spool import Spool, SpoolError
from prime_runs_otel.deliver.uploader import Uploader
from prime_runs_otel.errors import RecordError
from prime_runs_otel.produce.synthetic import synthetic_episodes
from prime_runs_otel.read.checks import (
    MAX_NESTING,
    check_json_value,
    read_span,
    run_identity,
    whole_number,
)
from prime_runs_otel.read.dialects.calls import is_model_call
from prime_runs_otel.read.episodes import CorruptEpisode, EpisodeArrival
from prime_runs_otel.read.ingest import group_by_run
from prime_runs_otel.read.projection import digest_episode
from prime_runs_otel.read.records import CorruptMetrics, RunBatch, RunIdentity
from prime_runs_otel.read.span_tree import SpanTreeBuffer
from prime_runs_otel.read.spans import SpanView
from prime_runs_otel.read.synthesis import synthesize_record
from prime_runs_otel.testing import FakePlatform

# -- numbers, nesting and text where they enter ------------------------------------------


def test_whole_numbers_are_ascii_digits_within_64_bits() -> None:
    assert whole_number("123") == 123
    assert whole_number(2**63 - 1) == 2**63 - 1
    for refused in ("9" * 20, "\u00b2", "\u0663", "\uff11", " 7", "-5", 2**63, True, 1.0):
        assert whole_number(refused) is None, refused


def test_a_resource_number_int_cannot_parse_is_left_out() -> None:
    identity = run_identity(
        {sc.RUN_ID: "r", sc.RUN_KIND: "train", sc.RUN_MAX_STEPS: "\u00b2", sc.RUN_SEQ_LEN: "9" * 30}
    )
    assert identity is not None
    assert identity.max_steps is None
    assert identity.seq_len is None


def _episode_view(record_spec: dict[str, Any], **extra: Any) -> SpanView:
    _, raw = hc.record_blob(record_spec)
    attributes = {
        sc.EPISODE_ID: record_spec["id"],
        sc.EPISODE_RECORD: (raw.decode(),),
        sc.blob_size_key(sc.EPISODE_RECORD): len(raw),
        sc.blob_sha256_key(sc.EPISODE_RECORD): hashlib.sha256(raw).hexdigest(),
        **extra,
    }
    return SpanView("episode", 1, 2, None, 0, 1, attributes, {sc.RUN_ID: "r"}, False, None)


@pytest.mark.parametrize(
    ("spec", "reason"),
    [
        ({"id": "deep", "depth": 1000}, "nests"),
        ({"id": "deep-orjson", "depth": MAX_NESTING + 10}, "nests"),
        ({"id": "big", "bigint": True}, "floating-point"),
        ({"id": "surrogate", "surrogate": True}, "surrogate"),
    ],
)
def test_a_record_later_stages_cannot_encode_is_refused_at_intake(
    spec: dict[str, Any], reason: str
) -> None:
    """Size and digest are right, so only the value check can stop it: stored,
    it would fail every delivery pass."""
    item = read_span(_episode_view(spec))
    assert isinstance(item, CorruptEpisode), item
    assert item.episode_id == spec["id"]
    assert reason in item.reason


def test_an_honest_record_nested_a_little_passes() -> None:
    assert isinstance(read_span(_episode_view({"id": "ok", "depth": 20})), EpisodeArrival)


@pytest.mark.parametrize(
    ("raw", "refused"),
    [
        (b"[" * MAX_NESTING + b"]" * MAX_NESTING, False),
        (b"[" * (MAX_NESTING + 1) + b"]" * (MAX_NESTING + 1), True),
        (b'{"a":' * (MAX_NESTING + 1) + b"1" + b"}" * (MAX_NESTING + 1), True),
        (b'{"text": "' + b"[{" * MAX_NESTING + b'", "list": [[1]]}', False),
    ],
    ids=["at-the-limit", "one-past", "objects-one-past", "brackets-in-a-string"],
)
def test_the_nesting_limit_holds_whatever_the_brackets_count(raw: bytes, refused: bool) -> None:
    """The nesting of what orjson parsed is bounded by counting the brackets
    in its text first; at the limit, one past it, and with brackets inside
    strings, the answer is the walk's."""
    value, plain_scalars = parse(raw)
    assert plain_scalars
    if refused:
        with pytest.raises(RecordError, match="nests objects and arrays"):
            check_json_value(value, "the record", raw, plain_scalars=True)
    else:
        check_json_value(value, "the record", raw, plain_scalars=True)


def test_metrics_beyond_float_range_are_a_counted_loss() -> None:
    raw = b'{"loss": 1' + b"0" * 400 + b"}"
    view = SpanView(
        sc.RUN_METRICS_SPAN,
        1,
        3,
        None,
        0,
        1,
        {
            sc.RUN_STEP: 4,
            sc.RUN_METRICS_VALUES: (raw.decode(),),
            sc.blob_size_key(sc.RUN_METRICS_VALUES): len(raw),
            sc.blob_sha256_key(sc.RUN_METRICS_VALUES): hashlib.sha256(raw).hexdigest(),
        },
        {sc.RUN_ID: "r"},
        False,
        None,
    )
    item = read_span(view)
    assert isinstance(item, CorruptMetrics)
    assert item.step == 4


@settings(max_examples=60, deadline=None)
@given(st.recursive(st.none() | st.integers() | st.text(), lambda v: st.lists(v, max_size=3)))
def test_whatever_passes_the_value_check_encodes(value: Any) -> None:
    """The check and the encoders agree: what it lets through, JSON writes."""
    try:
        check_json_value(value, "v")
    except ValueError:
        return
    json.dumps(value).encode()
    float(sum(item for item in _ints(value)) if _ints(value) else 0)


def _ints(value: Any) -> list[int]:
    if isinstance(value, list):
        return [item for member in value for item in _ints(member)]
    return [value] if isinstance(value, int) and not isinstance(value, bool) else []


def test_a_span_that_breaks_its_reader_costs_only_itself(
    caplog: pytest.LogCaptureFixture,
) -> None:
    class Exploding(dict[str, Any]):
        def get(self, *args: Any) -> Any:
            raise RuntimeError("no reading this")

        def __contains__(self, key: object) -> bool:
            raise RuntimeError("no reading this")

    bad = SpanView("x\nforged", 1, 9, None, 0, 1, Exploding(), {sc.RUN_ID: "r"}, False, None)
    good = _episode_view({"id": "fine"})
    # serve reads episodes ahead of its lock: the span that breaks is left
    # as it came, for the grouping to refuse alone.
    ahead = [read_ahead(view, lines=False) for view in (bad, good)]
    assert ahead[0] is bad
    assert isinstance(ahead[1].prepared, EpisodeArrival)
    grouped = group_by_run(ahead)
    assert grouped.unreadable == 1
    assert [episode.episode_id for episode in grouped.batches[0].episodes] == ["fine"]
    assert "could not be read" in caplog.text
    assert "x\\x0aforged" in caplog.text


# -- span trees ------------------------------------------------------------------------


def _view(span_id: int, parent: int | None, trace: int = 1, **attributes: Any) -> SpanView:
    return SpanView(
        "s", trace, span_id, parent, span_id, span_id + 1, attributes, {sc.RUN_ID: "r"}, False, None
    )


def test_an_unhashable_operation_name_is_not_a_model_call() -> None:
    assert not is_model_call(_view(1, None, **{sc.GEN_AI_OPERATION_NAME: {"a": "chat"}}))
    assert not is_model_call(_view(1, None, **{sc.GEN_AI_OPERATION_NAME: ({"a": 1},)}))


def test_held_trees_with_unhashable_attributes_expire_and_release() -> None:
    clock = [0.0]
    buffer = SpanTreeBuffer(settle_seconds=1, max_wait_seconds=2, clock=lambda: clock[0])
    buffer.add(_view(5, None, trace=2, **{sc.GEN_AI_OPERATION_NAME: {"k": "v"}}))
    clock[0] = 10.0
    assert buffer.release() == []
    assert len(buffer) == 0


def test_a_trace_that_breaks_the_buffer_is_let_go_alone(caplog: pytest.LogCaptureFixture) -> None:
    class Exploding(dict[str, Any]):
        def get(self, *args: Any) -> Any:
            raise RuntimeError("boom")

    buffer = SpanTreeBuffer()
    broken = SpanView("s", 7, 1, None, 0, 1, Exploding(), {sc.RUN_ID: "r"}, False, None)
    buffer.add(broken)
    episode = read_span(_view(1, None, trace=8, **{sc.EPISODE_EXAMPLE_ID: "1"}))
    buffer.add_episode(episode)  # type: ignore[arg-type]
    buffer.add(_view(2, 1, trace=8))
    trees = buffer.release(flush=True)
    assert [len(tree.spans) for tree in trees] == [1]
    assert buffer.stats.evicted_spans == 1
    assert "Let go of trace" in caplog.text


@pytest.mark.timeout(30)
def test_parent_links_that_loop_end() -> None:
    buffer = SpanTreeBuffer()
    episode = read_span(_view(5, 6, **{sc.EPISODE_EXAMPLE_ID: "1"}))
    buffer.add(_view(6, 5))
    buffer.add(_view(5, 6))  # a span claiming the episode's own id, under its child
    buffer.add(_view(7, 6, **{sc.GEN_AI_OPERATION_NAME: "chat"}))
    buffer.add_episode(episode)  # type: ignore[arg-type]
    (tree,) = buffer.release(flush=True)
    record = synthesize_record(tree.root.view, tree.spans, RunIdentity("r"))
    assert record["id"]


@settings(max_examples=80, deadline=None)
@given(
    st.lists(
        st.tuples(st.booleans(), st.integers(1, 12), st.one_of(st.none(), st.integers(1, 12))),
        max_size=40,
    )
)
def test_the_children_index_always_matches_the_held_spans(
    steps: list[tuple[bool, int, int | None]],
) -> None:
    """The index that makes tree matching linear never drifts from a full scan."""
    from prime_runs_otel.read.held_trace import HeldTrace

    state = HeldTrace()
    for add, span_id, parent in steps:
        if add:
            state.hold(_view(span_id, parent))
        else:
            state.let_go(span_id)
    for root in range(1, 13):
        expected: set[int] = set()
        frontier = [root]
        while frontier:
            current = frontier.pop()
            for span_id, view in state.spans.items():
                if view.parent_span_id == current and span_id not in expected and span_id != root:
                    expected.add(span_id)
                    frontier.append(span_id)
        assert set(state.subtree(root)) == expected


# -- the receiver ---------------------------------------------------------------------------


def test_many_gzip_members_are_inflated_in_linear_work(monkeypatch: pytest.MonkeyPatch) -> None:
    """zlib hands back what follows a member as a copy; fed the whole rest of
    the body each time, 100,000 members copied gigabytes."""
    payload = b"the request itself"
    members = 100_000
    body = gzip.compress(b"") * members + gzip.compress(payload)
    fed = [0]
    real = zlib.decompressobj

    class Counting:
        def __init__(self, wbits: int) -> None:
            self._inner = real(wbits)

        def decompress(self, data: Any, max_length: int = 0) -> bytes:
            fed[0] += len(data)
            return self._inner.decompress(data, max_length)

        def __getattr__(self, name: str) -> Any:
            return getattr(self._inner, name)

    monkeypatch.setattr(rx_bodies.zlib, "decompressobj", Counting)
    assert rx_bodies.decompress(body, "gzip", 10 * 1024 * 1024) == payload
    assert fed[0] <= len(body) + (members + 1) * rx_bodies._FIRST_PIECE


def test_a_non_ascii_bearer_token_is_refused_not_an_error() -> None:
    assert rx_bodies.bearer_matches("Bearer s\u00e9cret", "secret") is False
    assert rx_bodies.bearer_matches("Bearer \udc80", "secret") is False
    assert rx_bodies.bearer_matches("Bearer s\u00e9cret", "s\u00e9cret") is True


def test_answers_quoting_lone_surrogates_still_encode() -> None:
    verdict = rx_intake.Verdict("accepted", "episode '\ud800' was refused", rejected=1)
    assert b"\\ud800" in rx_intake.export_response(verdict).SerializeToString()


def _intake(tmp_path: Path) -> rx_intake.SpanIntake:
    settings = resolve_settings(spool_dir=str(tmp_path / "store"))
    return rx_intake.SpanIntake(Spool(settings.spool_path, max_bytes=10**9), settings, None)


def _arrival(episode_id: str, step: int | None = None) -> EpisodeArrival:
    record = next(synthetic_episodes(1, seed=len(episode_id)))
    record["id"] = episode_id
    raw = json.dumps(record).encode()
    return EpisodeArrival(episode_id, raw, digest_episode(record), step)


def test_an_item_the_spool_cannot_store_is_refused_alone_and_never_retried(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """An integer past SQLite's range fails its commit; kept and retried
    first, it failed every later request too."""
    intake = _intake(tmp_path)
    identity = RunIdentity("poisoned-run", kind="train")
    poisoned = RunBatch(identity, episodes=[_arrival("ok-1"), _arrival("bad", 2**70)])
    intake.delivery.commit([poisoned])
    assert intake.delivery.refused_items == 1
    assert intake.delivery.uncommitted == []
    assert intake.commit_problem is None
    assert "refused episode bad" in caplog.text
    stored = {row.episode_id for row in intake.spool.reading.iter_episodes("poisoned-run")}
    assert stored == {"ok-1"}

    intake.delivery.commit([RunBatch(identity, episodes=[_arrival("ok-2")])])
    stored = {row.episode_id for row in intake.spool.reading.iter_episodes("poisoned-run")}
    assert stored == {"ok-1", "ok-2"}


# -- delivery ---------------------------------------------------------------------------------


def _store_unchecked(spool: Spool, run_id: str, episode_id: str, raw: bytes) -> None:
    """Store a record past intake's checks, as an older release or a damaged
    disk would have left it."""
    record = next(synthetic_episodes(1, seed=3))
    record["id"] = episode_id
    arrival = EpisodeArrival(episode_id, raw, digest_episode(record))
    identity = RunIdentity(run_id, environments=("gsm8k",), name=run_id)
    spool.intake.ingest([RunBatch(identity, episodes=[arrival])], mode="online")


def test_a_stored_record_that_cannot_be_sent_fails_alone(
    online: FakePlatform, caplog: pytest.LogCaptureFixture
) -> None:
    settings = resolve_settings()
    spool = Spool(settings.spool_path, max_bytes=10**9)
    record = next(synthetic_episodes(1, seed=3))
    deep = json.dumps(record)[:-1] + ',"deep":' + hc._nested(1000) + "}"
    _store_unchecked(spool, "a-deep", "deep", json.dumps({**record, "id": "deep"}).encode())
    with sqlite3.connect(settings.spool_path) as db:
        (seq,) = db.execute("SELECT seq FROM episodes WHERE episode_id = 'deep'").fetchone()
        db.execute("UPDATE records SET body = ? WHERE seq = ?", (deep.encode(), seq))
    _store_unchecked(spool, "b-damaged", "damaged", b'{"id": "damaged", \xff\xfe')
    honest = next(synthetic_episodes(1, seed=9))
    _store_unchecked(spool, "c-honest", honest["id"], json.dumps(honest).encode())

    uploader = Uploader(spool, settings)
    for _ in range(3):
        uploader.deliver_once()
    uploader.stop()

    assert spool.reading.run("a-deep").failed == 1  # type: ignore[union-attr]
    assert spool.reading.run("b-damaged").failed == 1  # type: ignore[union-attr]
    (platform_run,) = [run for run in online.runs() if run.name == "c-honest"]
    assert [episode["id"] for episode in online.episodes(platform_run.id)] == [honest["id"]]
    assert "cannot be sent as stored" in caplog.text


# -- the local store ------------------------------------------------------------------------


def test_spool_files_are_private(tmp_path: Path) -> None:
    folder = tmp_path / "store"
    spool = Spool(folder / "spool.sqlite3", max_bytes=10**9)
    spool.intake.ingest([RunBatch(RunIdentity("r"), episodes=[_arrival("e")])], mode="local")
    for name in ("spool.sqlite3", "spool.sqlite3-wal", "spool.sqlite3-shm"):
        path = folder / name
        if path.exists():
            assert stat.S_IMODE(path.stat().st_mode) == 0o600, name
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700


def test_a_folder_others_can_read_is_named_in_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    folder = tmp_path / "shared"
    folder.mkdir(mode=0o755)
    folder.chmod(0o755)
    Spool(folder / "spool.sqlite3", max_bytes=10**9)
    assert f"chmod 700 {folder}" in caplog.text


def test_an_existing_empty_spool_is_said_to_be_empty(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "spool.sqlite3"
    path.touch(mode=0o644)
    hour_ago = time.time() - 3600
    os.utime(path, (hour_ago, hour_ago))
    Spool(path, max_bytes=10**9)
    assert "is empty (0 bytes)" in caplog.text
    assert stat.S_IMODE(path.stat().st_mode) == 0o600


def test_a_spool_another_process_is_creating_is_not_said_to_be_empty(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Several processes starting on a fresh folder at once: the first has
    created the file and not yet written it (or holds what it wrote in the
    write-ahead log) when the next one looks."""
    creating = tmp_path / "creating" / "spool.sqlite3"
    creating.parent.mkdir(mode=0o700)
    creating.touch(mode=0o600)
    logged = tmp_path / "logged" / "spool.sqlite3"
    logged.parent.mkdir(mode=0o700)
    logged.touch(mode=0o600)
    hour_ago = time.time() - 3600
    os.utime(logged, (hour_ago, hour_ago))
    Path(f"{logged}-wal").write_bytes(b"\0" * 4096)

    Spool(creating, max_bytes=10**9)
    Spool(logged, max_bytes=10**9)

    assert "is empty" not in caplog.text


def _damaged_spool(tmp_path: Path) -> Path:
    path = tmp_path / "spool.sqlite3"
    spool = Spool(path, max_bytes=10**9)
    spool.intake.ingest(
        [RunBatch(RunIdentity("damaged-run"), episodes=[_arrival("e")])], mode="local"
    )
    spool.checkpoint()
    spool.close()
    data = bytearray(path.read_bytes())
    at = data.find(b'"local_id"')
    data[at + 3] = 0xFF
    path.write_bytes(bytes(data))
    for suffix in ("-wal", "-shm"):
        Path(f"{path}{suffix}").unlink(missing_ok=True)
    return path


def test_a_damaged_spool_is_a_spool_error_naming_the_file(tmp_path: Path) -> None:
    path = _damaged_spool(tmp_path)
    with pytest.raises(SpoolError) as caught:
        Spool(path, max_bytes=10**9).reading.runs()
    message = str(caught.value)
    assert str(path) in message and "damaged" in message and "move it aside" in message


def test_the_cli_says_the_spool_is_damaged_without_a_traceback(tmp_path: Path) -> None:
    path = _damaged_spool(tmp_path)
    env = {**os.environ, "PRIME_RUNS_OTEL_DIR": str(path.parent)}
    done = subprocess.run(
        [sys.executable, "-m", "prime_runs_otel.cli", "runs"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode != 0
    assert "Traceback" not in done.stderr
    assert "is damaged" in done.stderr


def test_run_lookup_takes_percent_and_underscore_literally(tmp_path: Path) -> None:
    spool = Spool(tmp_path / "spool.sqlite3", max_bytes=10**9)
    spool.intake.ingest([RunBatch(RunIdentity("abc"))], mode="local")
    assert spool.reading.find_run("ab") is not None
    assert spool.reading.find_run("_") is None
    assert spool.reading.find_run("%") is None
    assert spool.reading.find_run("a%") is None


def test_doctor_hides_credentials_in_urls() -> None:
    shown_url = doctor._redacted("https://user:secret@api.example/x?key=abc&team=1")
    assert "secret" not in shown_url and "abc" not in shown_url
    assert shown_url == "https://***@api.example/x?key=***&team=***"


def test_doctor_finds_records_damaged_on_disk(tmp_path: Path) -> None:
    path = tmp_path / "spool.sqlite3"
    spool = Spool(path, max_bytes=10**9)
    spool.intake.ingest([RunBatch(RunIdentity("r"), episodes=[_arrival("e")])], mode="local")
    with sqlite3.connect(path) as db:
        db.execute("UPDATE records SET body = X'7b22ff'")
    assert doctor._damaged_records(path) == 1


# -- what is shown --------------------------------------------------------------------------


def test_log_lines_cannot_be_forged_or_drive_a_terminal() -> None:
    formatter = OneLineFormatter("%(levelname)s %(message)s")
    record = logging.LogRecord(
        "x", logging.WARNING, __file__, 1, "Run %s failed", ("a\nERROR forged\x1b[31m",), None
    )
    line = formatter.format(record)
    assert "\n" not in line and "\x1b" not in line
    assert "a\\x0aERROR forged\\x1b[31m" in line
    assert shown("\ud800") == "\\ud800"


@pytest.fixture
def store_with_hostile_run(tmp_path: Path) -> Iterator[Path]:
    folder = tmp_path / "store"
    spool = Spool(folder / "spool.sqlite3", max_bytes=10**9)
    name = "evil\n\x1b]0;owned\x07\x1b[2J"
    spool.intake.ingest([RunBatch(RunIdentity("run\x1b[31m\nforged", name=name))], mode="local")
    spool.close()
    yield folder


def test_runs_prints_hostile_names_escaped(store_with_hostile_run: Path) -> None:
    env = {**os.environ, "PRIME_RUNS_OTEL_DIR": str(store_with_hostile_run)}
    done = subprocess.run(
        [sys.executable, "-m", "prime_runs_otel.cli", "runs"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert "\x1b" not in done.stdout
    assert len(done.stdout.strip().splitlines()) == 2  # the header and one run
    # `runs` shows the first 12 characters of an id, escaped.
    assert "run\\x1b[31m\\x0afor" in done.stdout


# -- serve as a process: bodies, readiness, stopping --------------------------------------


#: What JSON leaves raw although a terminal acts on it: a C1 control (CSI),
#: DEL, a right-to-left override, a line separator.
_RAW_FOR_JSON = "run \x9b31m\x7f \u202eflipped\u2028"


@pytest.mark.parametrize(
    "command",
    [["runs", "--json"], ["show", "json-run", "--json"], ["doctor", "--json"]],
    ids=["runs", "show", "doctor"],
)
def test_every_json_output_escapes_what_a_terminal_acts_on(
    tmp_path: Path, command: list[str]
) -> None:
    folder = tmp_path / "store"
    spool = Spool(folder / "spool.sqlite3", max_bytes=10**9)
    spool.intake.ingest([RunBatch(RunIdentity("json-run", name=_RAW_FOR_JSON))], mode="local")
    spool.close()
    env = {**os.environ, "PRIME_RUNS_OTEL_DIR": str(folder), "PRIME_RUNS_MODE": "local"}
    done = subprocess.run(
        [sys.executable, "-m", "prime_runs_otel.cli", *command],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.stdout, done.stderr
    for raw in "\x9b\x7f\u202e\u2028":
        assert raw not in done.stdout, repr(raw)
    parsed = json.loads(done.stdout)
    if command[0] != "doctor":
        names = [run["name"] for run in parsed] if command[0] == "runs" else [parsed["name"]]
        assert names == [_RAW_FOR_JSON]  # escaped, not changed


def _raw_exchange(port: int, head: bytes, body: bytes = b"", wait: float = 30.0) -> bytes:
    """Send ``head`` and ``body`` and read whatever the server answers."""
    with socket.create_connection(("127.0.0.1", port), timeout=wait) as sock:
        sock.sendall(head + body)
        answer = b""
        try:
            while chunk := sock.recv(65536):
                answer += chunk
                if b"\r\n\r\n" in answer and len(answer) > answer.index(b"\r\n\r\n") + 4:
                    break
        except (ConnectionResetError, TimeoutError):
            pass
        return answer


@pytest.fixture(scope="module")
def serve_for_bodies(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServeProcess]:
    root = tmp_path_factory.mktemp("bodies")
    serve = ServeProcess(
        root, serve_env(root, None), "--max-body-mib", "1", "--read-timeout", "1", "--no-grpc"
    ).start()
    try:
        yield serve
    finally:
        serve.stop(signal.SIGKILL)


_PROTOBUF_POST = b"POST /v1/traces HTTP/1.1\r\nHost: x\r\nContent-Type: application/x-protobuf\r\n"


@pytest.mark.parametrize(
    ("headers", "body", "status", "said"),
    [
        # The 413 comes from Content-Length alone: the body is never sent
        # here, and the answer does not wait for it.
        (b"Content-Length: 100000000\r\n", b"", b"413", b""),
        # A body that trickles in is cut off, with an answer OTLP clients
        # retry (a 408 is permanent to them: a slow link must not lose data).
        (b"Content-Length: 1000\r\n", b"\x0a\x00", b"503", b"did not arrive within 1s"),
        # Content-Length with chunked is refused.
        (b"Content-Length: 5\r\nTransfer-Encoding: chunked\r\n", b"0\r\n\r\n", b"400", b""),
    ],
    ids=["oversized-before-read", "trickling", "length-and-chunked"],
)
def test_a_body_that_is_not_what_it_says_is_refused_early(
    serve_for_bodies: ServeProcess, headers: bytes, body: bytes, status: bytes, said: bytes
) -> None:
    answer = _raw_exchange(serve_for_bodies.http_port, _PROTOBUF_POST + headers + b"\r\n", body)
    assert answer.startswith(b"HTTP/1.1 " + status), answer[:200]
    assert said in answer


def test_a_non_ascii_bearer_token_gets_401(tmp_path: Path) -> None:
    serve = ServeProcess(tmp_path, serve_env(tmp_path, None), "--token", "s3cret", "--no-grpc")
    serve.start()
    try:
        head = (
            b"POST /v1/traces HTTP/1.1\r\nHost: x\r\nContent-Type: application/x-protobuf\r\n"
            b"Authorization: Bearer s\xe9cret\r\nContent-Length: 0\r\n\r\n"
        )
        answer = _raw_exchange(serve.http_port, head)
        assert answer.startswith(b"HTTP/1.1 401"), answer[:200]
        assert serve.stop(signal.SIGTERM) == 0
        assert "Traceback" not in serve.log()
    finally:
        if serve.process is not None:
            serve.stop(signal.SIGKILL)


def _limit_file_size(limit: int) -> Callable[[], None]:
    def limit_in_child() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past it fails, EFBIG
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    return limit_in_child


def test_readiness_says_when_commits_fail_and_serve_still_stops_cleanly(tmp_path: Path) -> None:
    """A disk that fills up: the spool cannot grow past 3 MB (a file size
    limit, real EFBIG from the kernel). Requests are answered 503 to be
    retried, /readyz says why, and SIGTERM still ends in exit 0."""
    serve = ServeProcess(tmp_path, serve_env(tmp_path, None), "--no-grpc")
    serve.preexec = _limit_file_size(3 * 1024 * 1024)
    serve.start()
    try:
        records = list(synthetic_episodes(40, seed=21))
        for record in records:
            record["info"] = {"padding": "x" * 200_000}
        statuses = []
        for index in range(0, len(records), 4):
            spans = run_spans(records[index : index + 4], run_id="full-disk", end=False)
            answer = post(serve.traces_url, protobuf_body(spans))
            statuses.append(answer.status_code)
            if answer.status_code == 503:
                break
        assert statuses[-1] == 503, statuses
        ready = httpx.get(f"{serve.url}/readyz", timeout=10)
        assert ready.status_code == 503
        assert "commits to the spool fail" in ready.json()["reason"]
        assert serve.stop(signal.SIGTERM) == 0, serve.log()[-3000:]
        log = serve.log()
        assert log.count("Traceback") <= 1, log[-3000:]
    finally:
        if serve.process is not None:
            serve.stop(signal.SIGKILL)


def test_the_buffer_is_bounded_by_attribute_values_not_only_spans() -> None:
    """Spans of a hundred tiny attributes each take a hundred times the memory
    of bare spans: the bound counts their values."""
    buffer = SpanTreeBuffer(max_spans=1000, max_values=500)
    many = {f"k{index}": index for index in range(99)}
    for trace in range(1, 8):
        buffer.add(_view(1, None, trace=trace, **many))
    assert len(buffer) == 5  # 100 values each: five fit
    assert buffer.stats.evicted_spans == 2  # the two oldest traces went
    assert buffer._values == 500
    buffer.release(flush=True)
    assert (len(buffer), buffer._values) == (0, 0)


def test_decoding_waits_for_memory_but_a_request_alone_always_goes() -> None:
    budget = rx_bodies.DecodeBudget(limit=100)
    with budget.reserve(1000):  # alone: admitted although over the whole budget
        pass
    order: list[str] = []
    holding = threading.Event()
    release = threading.Event()

    def first() -> None:
        with budget.reserve(80):
            order.append("first in")
            holding.set()
            release.wait(30)
            order.append("first out")

    def second() -> None:
        with budget.reserve(80):
            order.append("second in")

    one = threading.Thread(target=first)
    one.start()
    holding.wait(30)
    two = threading.Thread(target=second)
    two.start()
    two.join(0.5)
    assert two.is_alive()  # 80 + 80 does not fit 100: it waits
    release.set()
    one.join(30)
    two.join(30)
    assert order == ["first in", "first out", "second in"]


_FULL_DISK_RUN = """
import resource, signal, sys
from prime_runs_otel import start_run
from prime_runs_otel.produce.synthetic import synthetic_episodes
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
run = start_run(name="full-disk", environments=["gsm8k"])
resource.setrlimit(resource.RLIMIT_FSIZE, (3 * 2**20, 3 * 2**20))
# 8 MB of records: more than the spool's file and its write-ahead log can
# hold together under the 3 MiB limit, whenever the uploader checkpoints.
for record in synthetic_episodes(80, seed=1):
    record["info"] = {"padding": "x" * 100_000}
    run.record_episode(record)
print(run.finish("completed", timeout=5).describe())
"""


def test_a_full_disk_in_process_ends_in_a_summary_that_says_why(tmp_path: Path) -> None:
    """SQLite rolls a transaction back by itself when the disk is full; the
    spool's own rollback then failed and hid the reason."""
    env = {**os.environ, "PRIME_RUNS_OTEL_DIR": str(tmp_path / "store"), "PRIME_RUNS_MODE": "local"}
    done = subprocess.run(
        [sys.executable, "-c", _FULL_DISK_RUN], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr
    assert "cannot rollback" not in done.stderr
    assert "could not commit" in done.stderr and "check disk space" in done.stderr
    assert "full-disk" in done.stdout or "completed" in done.stdout
