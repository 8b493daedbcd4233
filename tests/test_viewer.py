"""The local viewer's data and pages, on small runs recorded through the real
pipeline into the test's own spool: what the spool keeps as episodes are
stored (checked against the records themselves), each page's data, the
pages over HTTP from a real server on loopback (including bad input and who
may read), an older spool upgraded and read in place, and what `show`
prints from it all."""

from __future__ import annotations

import json
import math
import os
import re
import sqlite3
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from viewer_runs import (
    EPISODES_PER_STEP,
    EVAL_EPISODES,
    TRAIN_STEPS,
    open_spool,
    record_eval,
    record_training,
)

from prime_runs_otel._json import loads
from prime_runs_otel.cli.arguments import parse_since
from prime_runs_otel.deliver.spool import EpisodeFilter, Spool
from prime_runs_otel.deliver.spool.views import FACT_COLUMNS
from prime_runs_otel.produce.synthetic import synthetic_episode
from prime_runs_otel.read.episodes import EpisodeArrival
from prime_runs_otel.read.projection import TraceScores, summary_trace_index
from prime_runs_otel.read.records import RunBatch, RunIdentity, RunStart
from prime_runs_otel.view import chart_data as chart_data_module
from prime_runs_otel.view import compare
from prime_runs_otel.view import episode_detail as detail_view
from prime_runs_otel.view.compare import compare_data
from prime_runs_otel.view.episodes import QueryError, episode_detail, episode_table, table_query
from prime_runs_otel.view.older import read_older_episodes
from prime_runs_otel.view.run_data import run_data
from prime_runs_otel.view.server import ViewerServer


@dataclass
class Store:
    path: Path
    spool: Spool
    eval_id: str
    other_id: str
    train_id: str


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    spool_dir = tmp_path / "spool"
    eval_id = record_eval(spool_dir)
    other_id = record_eval(spool_dir, name="demo-eval-2", seed=1)
    train_id = record_training(spool_dir)
    spool = open_spool(spool_dir)
    yield Store(spool_dir, spool, eval_id, other_id, train_id)
    spool.close()


def _rewards(spool: Spool, run_id: str) -> list[float]:
    """Each stored episode's reward, read from its record."""
    found = []
    for episode in spool.reading.iter_episodes(run_id):
        record = loads(episode.record)
        traces = record["traces"]
        reward = float(TraceScores.of(traces[summary_trace_index(record)]).reward)
        if math.isfinite(reward):
            found.append(reward)
    return found


def test_the_views_hold_what_the_records_say(store: Store) -> None:
    spool, run_id = store.spool, store.eval_id
    records = [loads(episode.record) for episode in spool.reading.iter_episodes(run_id)]
    assert len(records) == EVAL_EPISODES
    rewards = _rewards(spool, run_id)
    assert sum(count for _, count in spool.reading.histogram(run_id, "reward")) == len(rewards)
    failed = [record for record in records if not record["ok"]]
    assert failed, "the synthetic run has failing episodes"
    groups = spool.reading.error_groups(run_id)
    assert [(group.error_type, group.count) for group in groups] == [
        ("ProviderTimeout", len(failed))
    ]
    assert groups[0].example_id in {record["id"] for record in failed}
    assert groups[0].example_message and "no response within" in groups[0].example_message
    (points,) = [spool.reading.series(run_id, axis) for axis in (8192,)]
    assert sum(point.episodes for point in points) == EVAL_EPISODES
    assert sum(point.failed for point in points) == len(failed)
    assert math.isclose(sum(point.reward_sum for point in points), sum(rewards))
    assert sum(count for _, count in spool.reading.histogram(run_id, "tokens")) == EVAL_EPISODES
    calls = sum(len(trace["calls"]) for record in records for trace in record["traces"])
    assert sum(count for _, count in spool.reading.histogram(run_id, "call_latency")) == calls


def test_the_run_page_data_of_an_eval_and_a_training_run(store: Store) -> None:
    eval_data = run_data(store.spool, store.spool.reading.run(store.eval_id))  # type: ignore[arg-type]
    reward = eval_data.distributions["reward"]
    assert reward is not None and reward.count == len(_rewards(store.spool, store.eval_id))
    assert sum(item.count for item in reward.bins) == reward.count
    assert reward.low <= reward.p50 <= reward.p90 <= reward.high
    assert eval_data.series is not None and eval_data.series.axis == "episodes"
    assert eval_data.series.x[-1] == EVAL_EPISODES
    assert "num_turns" in eval_data.series.metrics
    assert eval_data.errors[0].error_type == "ProviderTimeout"
    assert eval_data.unread == 0 and eval_data.bodiless == 0

    train = run_data(store.spool, store.spool.reading.run(store.train_id))  # type: ignore[arg-type]
    assert train.series is not None and train.series.axis == "step"
    assert train.series.x == tuple(range(TRAIN_STEPS))
    assert train.series.episodes == (EPISODES_PER_STEP,) * TRAIN_STEPS
    assert [step for step, _ in train.step_metrics["loss"]] == list(range(TRAIN_STEPS))
    assert train.step_metrics["loss"][0] == (0, 1.0)


def test_the_episode_table_sorts_filters_and_pages(store: Store) -> None:
    run = store.spool.reading.run(store.eval_id)
    assert run is not None
    by_reward = episode_table(store.spool, run, table_query({"sort": "reward", "order": "desc"}))
    rewards = [row.reward for row in by_reward.rows if row.reward is not None]
    assert rewards == sorted(rewards, reverse=True)
    assert rewards[0] == max(_rewards(store.spool, store.eval_id))
    assert by_reward.total == EVAL_EPISODES and by_reward.pages == 3

    failed = episode_table(store.spool, run, table_query({"error": "ProviderTimeout"}))
    assert failed.total == store.spool.reading.error_groups(store.eval_id)[0].count
    assert all(row.ok == 0 and row.error_type == "ProviderTimeout" for row in failed.rows)

    ranged = episode_table(store.spool, run, table_query({"min_reward": "1", "sort": "tokens"}))
    assert all(row.reward is not None and row.reward >= 1 for row in ranged.rows)
    tokens = [row.tokens for row in ranged.rows if row.tokens is not None]
    assert tokens == sorted(tokens, reverse=True)

    example = by_reward.rows[0].example
    same = episode_table(store.spool, run, table_query({"example": example or ""}))
    assert 1 <= same.total <= 4 and {row.example for row in same.rows} == {example}

    second = episode_table(store.spool, run, table_query({"page": "2"}))
    assert [row.seq for row in second.rows] == sorted(row.seq for row in second.rows)
    first = episode_table(store.spool, run, table_query({}))
    assert first.rows[-1].seq < second.rows[0].seq

    for bad in ({"sort": "name"}, {"min_reward": "much"}, {"page": "0"}, {"order": "up"}):
        with pytest.raises(QueryError):
            table_query(bad)


def test_an_episode_page_holds_its_whole_conversation(store: Store) -> None:
    spool = store.spool
    run = spool.reading.run(store.eval_id)
    assert run is not None
    rows = spool.reading.episode_rows(run.local_id, EpisodeFilter(), limit=EVAL_EPISODES)
    for row in rows:
        detail = episode_detail(spool, run, row.episode_id)
        assert detail is not None and detail.problem is None
        record = loads(spool.reading.episode(run.local_id, row.episode_id)[1])  # type: ignore[index]
        assert len(detail.traces) == len(record["traces"])
        for trace, shown in zip(record["traces"], detail.traces, strict=True):
            assert [node["message"]["role"] for node in trace["nodes"]] == [
                message.role for message in shown.messages
            ]
            sampled = [message for message in shown.messages if message.sampled]
            assert all("completion_tokens" in message.usage for message in sampled)
    with_tools = [
        message
        for row in rows
        for trace in episode_detail(spool, run, row.episode_id).traces  # type: ignore[union-attr]
        for message in trace.messages
        if message.tool_calls
    ]
    assert with_tools and with_tools[0].tool_calls[0][0] == "calculator"
    assert episode_detail(spool, run, "no-such-episode") is None


def _damage(spool_dir: Path, episode_id: str, body: bytes | None) -> None:
    db = sqlite3.connect(spool_dir / "spool.sqlite3")
    with db:
        (seq,) = db.execute(
            "SELECT seq FROM episodes WHERE episode_id = ?", (episode_id,)
        ).fetchone()
        if body is None:
            db.execute("DELETE FROM records WHERE seq = ?", (seq,))
        else:
            db.execute("UPDATE records SET body = ? WHERE seq = ?", (body, seq))
    db.close()


def test_a_damaged_missing_or_huge_record_is_said_so(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    spool = store.spool
    run = spool.reading.run(store.eval_id)
    assert run is not None
    first, second, third = spool.reading.episode_rows(run.local_id, EpisodeFilter(), limit=3)
    _damage(store.path, first.episode_id, b'{"id": "x", "traces": [')
    _damage(store.path, second.episode_id, None)
    damaged = episode_detail(spool, run, first.episode_id)
    assert damaged is not None and "damaged" in (damaged.problem or "")
    missing = episode_detail(spool, run, second.episode_id)
    assert missing is not None and "no longer kept" in (missing.problem or "")
    monkeypatch.setattr(detail_view, "MAX_BODY_BYTES", 1000)
    huge = episode_detail(spool, run, third.episode_id)
    assert huge is not None and "--what episodes" in (huge.problem or "")


def test_runs_side_by_side(store: Store) -> None:
    spool = store.spool
    runs = [spool.reading.run(store.eval_id), spool.reading.run(store.other_id)]
    data = compare_data(spool, runs)  # type: ignore[arg-type]
    (examples,) = data.examples
    assert examples.every == 1 and examples.shared == EVAL_EPISODES // 4
    assert examples.higher + examples.lower <= examples.shared
    differences = [abs(b - a) for _, a, b in examples.top]
    assert differences == sorted(differences, reverse=True)
    assert len(examples.sample) == examples.shared
    first, second = data.rewards
    assert first is not None and second is not None
    assert (first.bins[0].low, first.bins[-1].high) == (second.bins[0].low, second.bins[-1].high)
    assert "num_turns" in data.metric_names


def test_runs_with_many_examples_are_compared_on_a_sample(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(compare, "MAX_EXAMPLES", 10)
    runs = [store.spool.reading.run(store.eval_id), store.spool.reading.run(store.other_id)]
    (examples,) = compare.compare_data(store.spool, runs).examples  # type: ignore[arg-type]
    assert examples.every == 3
    assert 0 < examples.shared < EVAL_EPISODES // 4


# -- over HTTP --------------------------------------------------------------------------


@pytest.fixture
def server(store: Store) -> Iterator[httpx.Client]:
    with (
        ViewerServer(store.spool, port=0, since=parse_since) as running,
        httpx.Client(base_url=running.url, timeout=30) as client,
    ):
        yield client


def test_every_page_answers(store: Store, server: httpx.Client) -> None:
    episode = store.spool.reading.episode_rows(store.eval_id, EpisodeFilter(), limit=1)[0]
    for path in (
        "/",
        "/?kind=train",
        "/?status=stored&since=7d",
        f"/runs/{store.eval_id}",
        f"/runs/{store.eval_id[:10]}",
        f"/runs/{store.train_id}",
        f"/runs/{store.eval_id}?part=live",
        f"/runs/{store.eval_id}/episodes?sort=duration&order=asc&error=any",
        f"/runs/{store.eval_id}/episodes/{episode.episode_id}",
        f"/compare?run={store.eval_id}&run={store.other_id}&run={store.train_id}",
    ):
        answer = server.get(path)
        assert answer.status_code == 200, (path, answer.text[:500])
        assert answer.headers["content-type"].startswith("text/html")
        assert "script-src 'self'" in answer.headers["content-security-policy"]
    assert "ProviderTimeout" in server.get(f"/runs/{store.eval_id}").text
    status = server.get(f"/api/runs/{store.eval_id}/status").json()
    assert status["episodes"] == EVAL_EPISODES and status["state"] == "stored"
    assert {run["id"] for run in server.get("/api/runs").json()} == {
        store.eval_id,
        store.other_id,
        store.train_id,
    }
    assert server.get("/static/viewer.js").headers["content-type"].startswith("text/javascript")


def test_bad_input_gets_a_page_that_says_what(store: Store, server: httpx.Client) -> None:
    episode = store.spool.reading.episode_rows(store.eval_id, EpisodeFilter(), limit=1)[0]
    _damage(store.path, episode.episode_id, b"\xff not json")
    for path, status, said in (
        ("/runs/no-such-run", 404, "There is no run"),
        (f"/runs/{store.eval_id}/episodes/nope", 404, "has no episode"),
        (f"/runs/{store.eval_id}/episodes?min_tokens=lots", 400, "not a whole number"),
        (f"/runs/{store.eval_id}/episodes?page=99999999", 400, "too deep"),
        (f"/compare?run={store.eval_id}", 400, "two runs or more"),
        ("/?since=yesterday-ish", 400, "neither an age"),
        ("/nothing/here", 404, "no page"),
        (f"/runs/{store.eval_id}/episodes/{episode.episode_id}", 200, "damaged"),
    ):
        answer = server.get(path)
        assert answer.status_code == status, (path, answer.text[:300])
        assert said in answer.text, path
        assert "Traceback" not in answer.text
    assert server.post("/").status_code == 405


def test_a_page_shows_names_from_producers_as_text(tmp_path: Path) -> None:
    spool_dir = tmp_path / "spool"
    record_eval(spool_dir, name="<script>alert(1)</script>")
    spool = open_spool(spool_dir)
    with ViewerServer(spool, port=0) as running, httpx.Client(base_url=running.url) as client:
        page = client.get("/").text
    assert "<script>alert(1)" not in page and "&lt;script&gt;alert(1)" in page


def test_on_loopback_it_answers_loopback_names_only(store: Store, server: httpx.Client) -> None:
    assert server.get("/", headers={"Host": "attacker.example"}).status_code == 421
    assert server.get("/", headers={"Host": "localhost"}).status_code == 200


def test_with_a_token_every_request_needs_it(store: Store) -> None:
    with ViewerServer(store.spool, port=0, token="s3cret") as running:
        base = running.url.split("/?")[0]
        assert running.url.endswith("/?token=s3cret")
        with httpx.Client(base_url=base) as client:
            assert client.get("/").status_code == 401
            assert client.get("/", headers={"Authorization": "Bearer nope"}).status_code == 401
            assert client.get("/", headers={"Authorization": "Bearer s3cret"}).status_code == 200
            entered = client.get(f"/runs/{store.eval_id}?token=s3cret")
            assert entered.status_code == 303
            assert entered.headers["location"] == f"/runs/{store.eval_id}"
            assert client.get(f"/runs/{store.eval_id}").status_code == 200  # the cookie


# -- a spool of an earlier release ----------------------------------------------------------


def test_runs_stored_before_are_read_into_the_views(store: Store) -> None:
    spool, run_id = store.spool, store.eval_id
    before = run_data(spool, spool.reading.run(run_id))  # type: ignore[arg-type]
    histogram = spool.reading.histogram(run_id, "reward")
    db = sqlite3.connect(store.path / "spool.sqlite3")
    with db:  # as an earlier release left it: no facts, no aggregates
        db.execute("UPDATE episodes SET ok = NULL, reward = NULL WHERE run_id = ?", (run_id,))
        for table in ("run_histograms", "run_errors", "run_series"):
            db.execute(f"DELETE FROM {table} WHERE run_id = ?", (run_id,))
        db.execute(
            "UPDATE rollouts SET reward_sum = 0, rewarded = 0, failed = 0 WHERE run_id = ?",
            (run_id,),
        )
    db.close()
    assert spool.reading.unread_count(run_id) == EVAL_EPISODES
    assert spool.reading.histogram(run_id, "reward") == []
    progress: list[tuple[int, int]] = []
    assert read_older_episodes(spool, run_id, lambda *done: progress.append(done)) == 120
    assert progress[-1] == (EVAL_EPISODES, EVAL_EPISODES)
    after = run_data(spool, spool.reading.run(run_id))  # type: ignore[arg-type]
    assert spool.reading.histogram(run_id, "reward") == histogram
    assert after.errors == before.errors
    # The same sums, added in another grouping (a float may differ in its last digits).
    assert after.series is not None and before.series is not None
    assert (after.series.x, after.series.episodes) == (before.series.x, before.series.episodes)
    for name, values in [("reward", before.series.reward), *before.series.metrics.items()]:
        again = after.series.reward if name == "reward" else after.series.metrics[name]
        assert all(
            (a is None and b is None) or (a is not None and b is not None and math.isclose(a, b))
            for a, b in zip(values, again, strict=True)
        ), name
    assert after.unread == 0


def test_an_older_spool_file_is_upgraded_in_place(store: Store) -> None:
    store.spool.close()
    db = sqlite3.connect(store.path / "spool.sqlite3")
    with db:  # the columns and tables this release added, taken away
        for index in db.execute(
            "SELECT name FROM sqlite_master WHERE type = 'index' AND name "
            "LIKE 'episodes_%' AND name != 'episodes_by_state' "
            "AND name != 'episodes_by_upload'"
        ).fetchall():
            db.execute(f"DROP INDEX {index[0]}")
        for column in FACT_COLUMNS:
            db.execute(f"ALTER TABLE episodes DROP COLUMN {column}")
        for column in ("reward_sum", "rewarded", "failed"):
            db.execute(f"ALTER TABLE rollouts DROP COLUMN {column}")
        for table in ("run_histograms", "run_errors", "run_series"):
            db.execute(f"DROP TABLE {table}")
    db.close()
    spool = open_spool(store.path)
    assert spool.reading.unread_count(store.eval_id) == EVAL_EPISODES
    read_older_episodes(spool, store.eval_id)
    assert spool.reading.error_groups(store.eval_id)[0].error_type == "ProviderTimeout"
    assert spool.reading.unread_count(store.eval_id) == 0
    spool.close()


# -- show --------------------------------------------------------------------------------


def test_show_prints_the_kept_histogram_errors_and_figures(store: Store) -> None:
    shown = subprocess.run(
        [sys.executable, "-m", "prime_runs_otel.cli", "show", store.eval_id],
        env={**_env(), "PRIME_RUNS_OTEL_DIR": str(store.path)},
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    rewards = _rewards(store.spool, store.eval_id)
    assert f"histogram of {len(rewards)} episode(s)" in shown
    bars = [line for line in shown.splitlines() if line.startswith("  ") and " - " in line]
    assert sum(int(line.split()[-1]) for line in bars) == len(rewards)
    errors = store.spool.reading.error_groups(store.eval_id)
    assert f"ProviderTimeout  {errors[0].count:>7}  e.g. {errors[0].example_id}" in shown
    assert "tokens" in shown and "p99" in shown


def _env() -> dict[str, str]:
    return dict(os.environ)


def test_counts_in_the_view_match_a_recount(store: Store) -> None:
    """The per-example rewards kept on ``rollouts`` are the records' own."""
    per_example: Counter[str] = Counter()
    totals: dict[str, float] = {}
    for episode in store.spool.reading.iter_episodes(store.eval_id):
        record = loads(episode.record)
        key = json.dumps(record["traces"][0]["task"]["data"]["idx"])
        reward = float(TraceScores.of(record["traces"][summary_trace_index(record)]).reward)
        if record["traces"] and math.isfinite(reward):
            per_example[key] += 1
            totals[key] = totals.get(key, 0.0) + reward
    pairs = store.spool.reading.example_pairs(store.eval_id, store.eval_id)
    assert len(pairs) == len(per_example)
    for key, mean, same in pairs:
        assert math.isclose(mean, totals[key] / per_example[key]) and mean == same


# -- what a newcomer reaches for ---------------------------------------------------------


def _rows(page: str) -> list[str]:
    return re.findall(r'<tr data-run="([^"]*)"', page)


def test_the_runs_list_sorts_and_names_are_links(store: Store, server: httpx.Client) -> None:
    page = server.get("/").text
    assert '<a href="/runs/' + store.eval_id + '" class="name">demo-eval</a>' in page
    assert _rows(page) == [store.train_id, store.other_id, store.eval_id]  # newest first
    by_name = _rows(server.get("/?sort=name&order=asc").text)
    assert by_name == [store.eval_id, store.other_id, store.train_id]
    assert _rows(server.get("/?sort=name&order=desc").text) == by_name[::-1]
    rewards = {
        run["id"]: run["avg_reward"] for run in server.get("/api/runs").json() if run["avg_reward"]
    }
    by_reward = [run for run in _rows(server.get("/?sort=reward").text) if run in rewards]
    assert by_reward == sorted(rewards, key=lambda run: rewards[run], reverse=True)
    assert server.get("/?sort=colour").status_code == 400
    assert "<th>pending</th>" in page and "<th>not pushed</th>" in page


def test_an_empty_result_says_so_and_how_to_clear_it(store: Store, server: httpx.Client) -> None:
    page = server.get("/?name=no-such-name").text
    assert "No run matches these filters" in page and '<a href="/">Clear the filters</a>' in page
    episodes = server.get(f"/runs/{store.eval_id}/episodes?min_reward=1000").text
    assert "No episode matches these filters" in episodes
    past = server.get(f"/runs/{store.eval_id}/episodes?page=999")
    assert past.status_code == 200
    assert "There is no page 999: the table has 3 page(s)" in past.text
    assert "page 3 of 3" in past.text


def test_episodes_are_numbered_within_their_run_and_filter_by_step(
    store: Store, server: httpx.Client
) -> None:
    def numbers(path: str) -> list[int]:
        return [
            int(n) for n in re.findall(r'<tr><td class="num">(\d+)</td>', server.get(path).text)
        ]

    # The second run was stored after the first: its own numbering starts at 1.
    assert numbers(f"/runs/{store.other_id}/episodes")[:3] == [1, 2, 3]
    assert numbers(f"/runs/{store.other_id}/episodes?page=2")[0] == 51
    rows = store.spool.reading.episode_rows(
        store.other_id, EpisodeFilter(), sort="reward", descending=True, limit=50
    )
    arrival = [
        row.seq
        for row in store.spool.reading.episode_rows(store.other_id, EpisodeFilter(), limit=500)
    ]
    expected = [arrival.index(row.seq) + 1 for row in rows]
    assert numbers(f"/runs/{store.other_id}/episodes?sort=reward&order=desc") == expected
    step = server.get(f"/runs/{store.train_id}/episodes?step=2").text
    assert f"{EPISODES_PER_STEP} episode(s) match" in step
    assert set(re.findall(r'<td class="num">(\d+)</td><td>ok', step)) <= {"2"}
    assert 'name="step"' in step and 'value="2"' in step


def test_the_pages_show_config_tracebacks_deltas_and_one_word_per_state(
    store: Store, server: httpx.Client
) -> None:
    run_page = server.get(f"/runs/{store.eval_id}").text
    assert "temperature" in run_page and "0.7" in run_page
    (failed,) = store.spool.reading.episode_rows(store.eval_id, EpisodeFilter(error="any"), limit=1)
    episode = server.get(f"/runs/{store.eval_id}/episodes/{failed.episode_id}").text
    assert "ProviderTimeout" in episode and "Traceback (most recent call last)" in episode
    table = server.get(f"/runs/{store.eval_id}/episodes").text
    assert "<td>not pushed</td>" in table and "<td>pending</td>" not in table
    compare = server.get(f"/compare?run={store.eval_id}&run={store.other_id}").text
    assert "Δ <span" in compare and "in the order they were given" in compare
    assert "its episodes in" in compare


def test_a_record_without_traces_gets_whole_pages(tmp_path: Path) -> None:
    spool = open_spool(tmp_path / "spool")
    record = {"id": "bare", "traces": []}
    arrival = EpisodeArrival.of(record, json.dumps(record).encode())
    spool.intake.ingest(
        [RunBatch(RunIdentity("bare-run"), start=RunStart({}), episodes=[arrival])], mode="local"
    )
    with ViewerServer(spool, port=0) as running, httpx.Client(base_url=running.url) as client:
        page = client.get("/runs/bare-run")
        assert page.status_code == 200 and page.text.rstrip().endswith("</html>")
        assert "No episode with a reward, tokens or times yet" in page.text
        episode = client.get("/runs/bare-run/episodes/bare")
        assert episode.status_code == 200 and episode.text.rstrip().endswith("</html>")
    spool.close()


def test_ui_starts_on_an_empty_store_and_shows_runs_as_they_arrive(tmp_path: Path) -> None:
    spool_dir = tmp_path / "not-yet"
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "prime_runs_otel.cli",
            "ui",
            "--no-browser",
            "--port",
            "0",
            "--spool-dir",
            str(spool_dir),
        ],
        env=_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert process.stdout is not None
        lines = [process.stdout.readline() for _ in range(2)]
        assert "is empty" in lines[0] and "prime-runs-otel demo" in lines[0], lines
        address = lines[1].split(": ", 1)[1].strip()
        with httpx.Client(base_url=address, timeout=30) as client:
            empty = client.get("/").text
            assert "is empty" in empty and "prime-runs-otel demo" in empty
            assert 'data-live="/api/runs"' in empty  # the page looks again by itself
            record_eval(spool_dir, name="arrived")
            assert [run["id"] for run in client.get("/api/runs").json()]
            assert "arrived" in client.get("/").text
    finally:
        process.terminate()
        process.wait(timeout=30)


def test_the_curves_come_as_json_reduced_on_the_server(
    store: Store, server: httpx.Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    train = server.get(f"/api/runs/{store.train_id}/charts").json()
    assert train["axis"] == "step"
    charts = {chart["id"]: chart for chart in train["charts"]}
    loss = charts["metrics:loss"]
    assert loss["x"] == list(range(TRAIN_STEPS)) and loss["series"][0]["values"][0] == 1.0
    assert loss["time"] is not None and loss["time"] == sorted(loss["time"])
    assert [chart["id"] for chart in train["charts"]][:2] == ["metrics:loss", "metrics:reward/mean"]
    assert charts["reward"]["x"] == list(range(TRAIN_STEPS))
    eval_charts = server.get(f"/api/runs/{store.eval_id}/charts").json()["charts"]
    reward = next(chart for chart in eval_charts if chart["id"] == "reward")
    assert reward["x"][-1] == EVAL_EPISODES and len(reward["time"]) == len(reward["x"])
    monkeypatch.setattr(chart_data_module, "MAX_POINTS", 4)
    run = store.spool.reading.run(store.eval_id)
    assert run is not None
    thinned = chart_data_module.chart_data(store.spool, run)["charts"]
    assert all(len(chart["x"]) <= 4 for chart in thinned)
    assert server.get("/api/runs/no-such-run/charts").status_code == 404


def test_episodes_of_interleaved_runs_are_numbered_within_each(tmp_path: Path) -> None:
    """Two runs stored turn by turn (as `serve` stores its senders): each
    run's episodes are numbered 1, 2, 3... in its own arrival order."""
    spool = open_spool(tmp_path / "spool")
    for index in range(60):
        run_id = ("left", "right")[index % 2]
        record = synthetic_episode(index, seed=3)
        arrival = EpisodeArrival.of(record, json.dumps(record).encode())
        spool.intake.ingest(
            [RunBatch(RunIdentity(run_id), start=RunStart({}), episodes=[arrival])], mode="local"
        )
    with ViewerServer(spool, port=0) as running, httpx.Client(base_url=running.url) as client:
        for run_id in ("left", "right"):
            page = client.get(f"/runs/{run_id}/episodes?sort=reward").text
            numbers = sorted(int(n) for n in re.findall(r'<tr><td class="num">(\d+)</td>', page))
            assert numbers == list(range(1, 31)), (run_id, numbers)
            second = client.get(f"/runs/{run_id}/episodes?page=1").text
            assert re.findall(r'<tr><td class="num">(\d+)</td>', second)[:2] == ["1", "2"]
    spool.close()


def test_a_run_on_the_platform_links_there_and_only_to_a_web_address(tmp_path: Path) -> None:
    spool = open_spool(tmp_path / "spool")
    for run_id, address in (
        ("on-platform", "https://app.example/runs/p-1"),
        ("odd-address", "javascript:alert(1)"),
    ):
        spool.intake.ingest([RunBatch(RunIdentity(run_id), start=RunStart({}))], mode="online")
        spool.delivery.update_run(
            run_id, platform_id=f"p-{run_id}", url=address, create_state="created"
        )
    with ViewerServer(spool, port=0) as running, httpx.Client(base_url=running.url) as client:
        runs = client.get("/").text
        run = client.get("/runs/on-platform").text
        odd = client.get("/runs/odd-address").text
    assert 'href="https://app.example/runs/p-1"' in runs
    assert 'href="https://app.example/runs/p-1"' in run and "the run on the platform" in run
    assert "javascript:" not in runs and "javascript:" not in odd.split("<table")[0]
    spool.close()
