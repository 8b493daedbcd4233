"""What the viewer shows of a run is folded from its episodes' rows when a
view asks (``deliver/spool/folds.py``), not as they are stored. Folded at
any moments, in chunks of any size, with folds rolled back midway, some
batches written (and folded as stored) by an earlier release, or folded in
memory from a store opened read-only, it must equal what folding each batch
as it was stored gave (the commit's own fold before this change, from the
episodes' digests): the same distributions, error groups, series and
per-example rewards.

Sums of floats are compared to 1e-9 (relative): they are added in another
order when the chunks differ, as they were when the export batches did.
Everything else is compared exactly, but for one thing: where an earlier
release wrote some batches, it folded them before the older episodes were,
so an error group's example may be another episode of the same error type.
"""

from __future__ import annotations

import dataclasses
import json
import math
import sqlite3
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from prime_runs_otel.deliver.spool import Spool
from prime_runs_otel.deliver.spool.folds import FoldMark, fold_chunk
from prime_runs_otel.deliver.spool.views import (
    EPISODE_AXES,
    HISTOGRAMS,
    STEP_AXIS,
    add_to_views,
    view_episode,
)
from prime_runs_otel.produce.synthetic import synthetic_episodes
from prime_runs_otel.read.episodes import EpisodeArrival
from prime_runs_otel.read.records import RunBatch, RunIdentity
from prime_runs_otel.view.server import ViewerServer

BIG = 10**12
RUN = "run-1"


def _arrivals(count: int, seed: int, steps: Sequence[int | None]) -> list[EpisodeArrival]:
    arrivals = []
    for index, record in enumerate(synthetic_episodes(count, seed=seed)):
        raw = json.dumps(record).encode()
        arrivals.append(EpisodeArrival.of(record, raw, steps[index % len(steps)]))
    return arrivals


def _batch(episodes: Sequence[EpisodeArrival]) -> RunBatch:
    return RunBatch(identity=RunIdentity(local_id=RUN, environments=("env-a",)), episodes=episodes)


def _shown(spool: Spool, *, examples: bool = True) -> dict[str, Any]:
    """Everything the viewer's pages read of the run's aggregates; without
    ``examples``, the error groups without their example (which is checked
    to be an episode of that error type)."""
    reading = spool.reading
    errors: list[Any] = reading.error_groups(RUN)
    if not examples:
        for group in errors:
            row = reading.episode(RUN, group.example_id)
            assert row is not None and row[0].error_type == group.error_type
        errors = [(group.error_type, group.count) for group in errors]
    return {
        "histograms": {name: reading.histogram(RUN, name) for name in HISTOGRAMS},
        "errors": errors,
        "series": {axis: reading.series(RUN, axis) for axis in (STEP_AXIS, *EPISODE_AXES)},
        "examples": reading.example_count(RUN),
        "pairs": reading.example_pairs(RUN, RUN),
    }


def _assert_close(mine: Any, expected: Any, where: str = "") -> None:
    if dataclasses.is_dataclass(mine) and not isinstance(mine, type):
        mine, expected = dataclasses.astuple(mine), dataclasses.astuple(expected)  # type: ignore[arg-type]
    if isinstance(mine, float) and isinstance(expected, float):
        assert math.isclose(mine, expected, rel_tol=1e-9, abs_tol=1e-12), where
    elif isinstance(mine, dict) and isinstance(expected, dict):
        assert sorted(mine) == sorted(expected), where
        for key in mine:
            _assert_close(mine[key], expected[key], f"{where}/{key}")
    elif isinstance(mine, (list, tuple)) and isinstance(expected, (list, tuple)):
        assert len(mine) == len(expected), where
        for index, (left, right) in enumerate(zip(mine, expected, strict=True)):
            _assert_close(left, right, f"{where}[{index}]")
    else:
        assert mine == expected, where


def _fold_directly(path: Path, limit: int, *, roll_back: bool) -> None:
    """One chunk folded by another connection, as another viewer process
    would; ``roll_back``: the fold is cut short before it commits."""
    db = sqlite3.connect(path, isolation_level=None, timeout=60)
    try:
        db.execute("BEGIN IMMEDIATE")
        fold_chunk(db, RUN, None, limit)
        db.execute("ROLLBACK" if roll_back else "COMMIT")
    finally:
        db.close()


def _as_an_earlier_release(spool: Spool, batch: Sequence[EpisodeArrival], ordinal: int) -> None:
    """What an earlier release leaves of a batch it stores: no view_facts,
    its episodes folded in the same transaction."""
    with spool._transaction() as db:
        rows = dict(
            db.execute(
                f"SELECT episode_id, stored_at FROM episodes WHERE run_id = ? "
                f"AND episode_id IN ({', '.join('?' * len(batch))})",
                (RUN, *(e.episode_id for e in batch)),
            ).fetchall()
        )
        db.execute(
            f"UPDATE episodes SET view_facts = NULL WHERE run_id = ? "
            f"AND episode_id IN ({', '.join('?' * len(batch))})",
            (RUN, *(e.episode_id for e in batch)),
        )
        views = [
            view_episode(ordinal + i, e.episode_id, e.step, e.digest, rows[e.episode_id])
            for i, e in enumerate(batch)
        ]
        add_to_views(db, RUN, views)


actions = st.lists(
    st.tuples(
        st.integers(min_value=1, max_value=40),  # episodes in the batch
        st.sampled_from(["none", "fold", "chunk", "cut", "earlier"]),
        st.integers(min_value=1, max_value=50),  # chunk size
    ),
    min_size=1,
    max_size=6,
)


@settings(max_examples=15, deadline=None)
@given(
    actions,
    st.integers(min_value=0, max_value=10**6),
    st.lists(st.one_of(st.none(), st.integers(0, 6)), min_size=1, max_size=5),
)
def test_aggregates_folded_lazily_in_any_chunks_equal_those_folded_as_stored(
    steps_of_actions: list[tuple[int, str, int]], seed: int, steps: list[int | None]
) -> None:
    total = sum(count for count, _, _ in steps_of_actions)
    arrivals = _arrivals(total, seed, steps)
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "spool.sqlite3"
        spool = Spool(path, max_bytes=BIG)
        reference = Spool(Path(folder) / "reference.sqlite3", max_bytes=BIG)
        stored = 0
        for count, action, chunk in steps_of_actions:
            batch = arrivals[stored : stored + count]
            spool.intake.ingest([_batch(batch)], mode="local", register_producer=False)
            stored_at = dict(
                spool._query("SELECT episode_id, stored_at FROM episodes WHERE run_id = ?", (RUN,))
            )
            with reference._transaction() as db:
                add_to_views(
                    db,
                    RUN,
                    [
                        view_episode(
                            stored + i, e.episode_id, e.step, e.digest, stored_at[e.episode_id]
                        )
                        for i, e in enumerate(batch)
                    ],
                )
            if action == "earlier":
                _as_an_earlier_release(spool, batch, stored)
            elif action == "fold":
                spool.reading.histogram(RUN, "reward")
            elif action in ("chunk", "cut"):
                _fold_directly(path, chunk, roll_back=action == "cut")
            stored += count

        examples = all(action != "earlier" for _, action, _ in steps_of_actions)
        expected = _shown(reference)
        if not examples:
            expected["errors"] = [(group.error_type, group.count) for group in expected["errors"]]
        # Read-only first: folded in memory from wherever the file's folds got.
        read_only = Spool.open_read_only(path)
        _assert_close(_shown(read_only, examples=examples), expected, "read-only")
        read_only.close()
        _assert_close(_shown(spool, examples=examples), expected, "in the file")
        _assert_close(_shown(spool, examples=examples), expected, "again")
        spool.close()
        reference.close()


def test_a_fold_carried_over_chunks_starts_again_where_another_fold_left_it(
    tmp_path: Path,
) -> None:
    """Two folds of one run in turn (two viewers): the second finds the mark
    moved and folds only what is left, with the right ordinals."""
    path = tmp_path / "spool.sqlite3"
    spool = Spool(path, max_bytes=BIG)
    spool.intake.ingest([_batch(_arrivals(40, 3, [None]))], mode="local")
    db = sqlite3.connect(path, isolation_level=None, timeout=60)
    db.execute("BEGIN IMMEDIATE")
    passed, mark = fold_chunk(db, RUN, None, 10)
    db.execute("COMMIT")
    assert (passed, mark.ordinal) == (10, 10)
    _fold_directly(path, 15, roll_back=False)  # another fold moves the mark to 25
    db.execute("BEGIN IMMEDIATE")
    passed, mark = fold_chunk(db, RUN, mark, 100)
    db.execute("COMMIT")
    db.close()
    assert (passed, mark.ordinal) == (15, 40)
    assert mark != FoldMark(0, 0)
    blocks = spool.reading.series(RUN, EPISODE_AXES[0])
    assert [point.episodes for point in blocks] == [8, 8, 8, 8, 8]


def test_the_viewer_folds_every_run_ahead_of_its_first_page(tmp_path: Path) -> None:
    """``ui`` folds the runs' new episodes on its background thread while it
    serves, without a page asking: the first page of a long run then finds
    them folded."""
    path = tmp_path / "spool.sqlite3"
    spool = Spool(path, max_bytes=BIG)
    for run, count in (("run-a", 30), ("run-b", 12)):
        batch = RunBatch(
            identity=RunIdentity(local_id=run, environments=("env-a",)),
            episodes=_arrivals(count, 5, [None]),
        )
        spool.intake.ingest([batch], mode="local")
    last = dict(spool._query("SELECT run_id, MAX(seq) FROM episodes GROUP BY run_id"))

    def marks() -> dict[str, int]:
        return dict(spool._query("SELECT run_id, seq FROM run_folds"))

    with ViewerServer(spool, host="127.0.0.1", port=0):
        deadline = time.monotonic() + 120
        while marks() != last and time.monotonic() < deadline:
            time.sleep(0.05)
    assert marks() == last
