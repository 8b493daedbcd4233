"""The viewer's indexes by an episode's value (reward, tokens, duration) are
made the first time a page is read through one, not as episodes are stored:
on runs recorded through the real pipeline into real spool files, a new
spool has none of them, the first page sorted by a value (from a real viewer
server on loopback) makes that index alone and lists the same episodes as a
spool that had every index from the start, and a run stored after the index
was made is sorted by it. A store that cannot be written is sorted without
them: tests/test_read_only_store.py."""

from __future__ import annotations

import logging
import re
import sqlite3
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from viewer_runs import EVAL_EPISODES, open_spool, record_eval

from prime_runs_otel.cli.arguments import parse_since
from prime_runs_otel.deliver.spool import EpisodeFilter, Spool
from prime_runs_otel.deliver.spool.schema import MADE_ON_FIRST_USE, index_on_first_use
from prime_runs_otel.view.episodes import episode_table, table_query
from prime_runs_otel.view.server import ViewerServer

#: Pages of the episode table read through the value indexes: each sort both
#: ways and on every page, and the filters that choose another index.
QUERIES = [
    {"sort": sort, "order": order, "page": str(page)}
    for sort in ("reward", "tokens", "duration")
    for order in ("asc", "desc")
    for page in (1, 2, 3)
] + [
    {"sort": "tokens", "min_reward": "0.5"},
    {"sort": "arrival", "min_duration": "0", "max_duration": "0.001"},
    {"sort": "duration", "error": "none", "page": "2"},
    {"sort": "reward", "error": "ProviderTimeout"},
]


def _indexes(spool_dir: Path) -> set[str]:
    db = sqlite3.connect(spool_dir / "spool.sqlite3")
    try:
        return {
            name for (name,) in db.execute("SELECT name FROM sqlite_master WHERE type = 'index'")
        }
    finally:
        db.close()


def _eager_copy(spool_dir: Path, copy_dir: Path) -> Path:
    """The spool as it is, copied with every value index made up front."""
    copy_dir.mkdir(mode=0o700)
    source = sqlite3.connect(spool_dir / "spool.sqlite3")
    copy = sqlite3.connect(copy_dir / "spool.sqlite3")
    try:
        source.backup(copy)
        with copy:
            for name in MADE_ON_FIRST_USE:
                copy.execute(index_on_first_use(name))
    finally:
        source.close()
        copy.close()
    return copy_dir


@pytest.fixture
def spool_dir(tmp_path: Path) -> Path:
    spool_dir = tmp_path / "spool"
    record_eval(spool_dir)
    return spool_dir


@pytest.fixture
def spool(spool_dir: Path) -> Iterator[Spool]:
    spool = open_spool(spool_dir)
    yield spool
    spool.close()


def _page(client: httpx.Client, run_id: str, params: dict[str, str]) -> list[str]:
    """The ids of the episodes a page of the table lists, in its order."""
    page = client.get(f"/runs/{run_id}/episodes", params=params)
    assert page.status_code == 200, page.text[:500]
    return re.findall(rf'href="/runs/{run_id}/episodes/([^"/?]+)"', page.text)


def test_a_new_spool_has_no_value_index_after_a_run(spool_dir: Path) -> None:
    made = _indexes(spool_dir)
    assert not made & set(MADE_ON_FIRST_USE)
    assert {"episodes_by_run", "episodes_failed", "episodes_by_example"} <= made


def test_the_first_sorted_page_makes_its_index_and_lists_what_an_eager_spool_lists(
    tmp_path: Path, spool_dir: Path, spool: Spool, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="prime_runs_otel.deliver.spool.core")
    run_id = spool.reading.runs()[0].local_id
    eager = open_spool(_eager_copy(spool_dir, tmp_path / "eager"))
    try:
        with (
            ViewerServer(spool, port=0, since=parse_since) as lazy_viewer,
            ViewerServer(eager, port=0, since=parse_since) as eager_viewer,
            httpx.Client(base_url=lazy_viewer.url, timeout=30) as lazy_client,
            httpx.Client(base_url=eager_viewer.url, timeout=30) as eager_client,
        ):
            by_reward = _page(lazy_client, run_id, {"sort": "reward", "order": "desc"})
            assert len(by_reward) == 50
            assert _indexes(spool_dir) & set(MADE_ON_FIRST_USE) == {"episodes_by_reward"}
            for params in QUERIES:
                assert _page(lazy_client, run_id, params) == _page(eager_client, run_id, params), (
                    params
                )
    finally:
        eager.close()
    assert set(MADE_ON_FIRST_USE) <= _indexes(spool_dir)
    made = [record.getMessage().split()[3] for record in caplog.records if "made the" in record.msg]
    assert sorted(made) == sorted(MADE_ON_FIRST_USE)  # each once, for all those pages


def test_a_run_stored_after_its_index_was_made_is_sorted_by_it(
    spool_dir: Path, spool: Spool
) -> None:
    first = spool.reading.runs()[0]
    episode_table(spool, first, table_query({"sort": "reward"}))
    assert "episodes_by_reward" in _indexes(spool_dir)
    later = spool.reading.run(record_eval(spool_dir, name="later-eval", seed=2))
    assert later is not None
    stored = spool.reading.episode_rows(later.local_id, EpisodeFilter(), limit=EVAL_EPISODES)
    expected = [
        row.seq
        for row in sorted(stored, key=lambda row: (row.reward, row.seq), reverse=True)
        if row.reward is not None
    ]
    listed = []
    for page in (1, 2, 3):
        table = episode_table(spool, later, table_query({"sort": "reward", "page": str(page)}))
        listed += [row.seq for row in table.rows]
    assert listed == expected and len(expected) > 100
