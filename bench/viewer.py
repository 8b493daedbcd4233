"""The local viewer on a million episodes: how long each page and `show`
take on a run that large (each must answer in under a second).

Builds a spool with one eval run of ``--episodes`` episodes, a second eval
run over the same examples (for the compare page) and a training run with a
metrics row per step, through the spool's own ingest path (``spool.intake.ingest``,
what ``export()`` commits with, so every view the pages read is kept as in
a real run), from a pool of synthetic records given fresh ids and examples.
The spool is kept in ``--spool-dir`` and reused when it already holds the
runs, since building a million episodes takes a few minutes.

Then each page is fetched over HTTP from the viewer (``prime-runs-otel ui``
in this process, on loopback), `show` printed in this process and run as a
command (beside ``cli_start``, the same interpreter printing its version:
what any command costs before it does anything), each several times;
figures are the median, printed as ``name value unit``, and the first
answer of each page apart (``first_name``): with ``--unsorted`` the store
has no index by reward, tokens or duration yet, as a store nobody sorted by
a value, so the first page sorted by each pays for making its index.

    python bench/viewer.py [--episodes 1000000] [--spool-dir DIR] [--rounds 5] [--unsorted]
"""

from __future__ import annotations

import argparse
import io
import os
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

import httpx
import orjson

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from in_process import machine

from prime_runs_otel.deliver.spool import EpisodeFilter, Spool
from prime_runs_otel.produce.synthetic import synthetic_episode
from prime_runs_otel.read.episodes import EpisodeArrival
from prime_runs_otel.read.records import RunBatch, RunEnd, RunIdentity, RunMetrics, RunStart

EVAL_RUN = "bench-viewer-eval"
OTHER_RUN = "bench-viewer-other"
TRAIN_RUN = "bench-viewer-train"
POOL = 2000
BATCH = 2000


def record_for(pool: list[dict[str, Any]], index: int, seed_offset: int = 0) -> dict[str, Any]:
    """A pooled record under a fresh episode id, as rollout ``index % 4`` of
    example ``index // 4`` (so a million episodes cover 250,000 examples)."""
    template = pool[(index + seed_offset) % len(pool)]
    example = index // 4
    traces = []
    for trace in template["traces"]:
        task = {**trace["task"], "data": {**trace["task"]["data"], "idx": example}}
        traces.append({**trace, "id": f"{trace['id']}-{index}", "task": task})
    return {**template, "id": f"{template['id']}-{seed_offset}-{index}", "traces": traces}


def build_run(
    spool: Spool,
    identity: RunIdentity,
    count: int,
    pool: list[dict[str, Any]],
    *,
    seed_offset: int = 0,
    steps: int = 0,
) -> float:
    started = time.perf_counter()
    per_step = max(1, count // steps) if steps else 0
    spool.intake.ingest([RunBatch(identity, start=RunStart({"bench": True}))], mode="local")
    for first in range(0, count, BATCH):
        arrivals = []
        metrics = []
        for index in range(first, min(count, first + BATCH)):
            record = record_for(pool, index, seed_offset)
            step = index // per_step if steps else None
            if step is not None:
                record["run"] = {"type": "train", "id": identity.local_id, "work": {"step": step}}
                if index % per_step == 0:
                    metrics.append(
                        RunMetrics(
                            step,
                            {"loss": 1.0 / (step + 1), "entropy": 0.5 + step % 7 / 10},
                            time.time(),
                        )
                    )
            arrivals.append(EpisodeArrival.of(record, orjson.dumps(record), step))
        spool.intake.ingest([RunBatch(identity, episodes=arrivals, metrics=metrics)], mode="local")
        done = min(count, first + BATCH)
        if done % 100_000 < BATCH:
            print(f"  {identity.local_id}: {done} episodes", file=sys.stderr, flush=True)
    spool.intake.ingest([RunBatch(identity, end=RunEnd("completed", None, count))], mode="local")
    return time.perf_counter() - started


def build(spool_dir: str, episodes: int, other: int, train: int) -> Spool:
    os.makedirs(spool_dir, mode=0o700, exist_ok=True)
    spool = Spool(os.path.join(spool_dir, "spool.sqlite3"), max_bytes=1 << 45)
    # About 4 KB each: one or two turns, a judge on one episode in four.
    pool = [
        synthetic_episode(index, seed=3, judge=index % 4 == 0, turns=1 + index % 2)
        for index in range(POOL)
    ]
    for identity, count, extra in (
        (
            RunIdentity(EVAL_RUN, name="bench-eval", model="m", environments=("gsm8k",)),
            episodes,
            {},
        ),
        (
            RunIdentity(OTHER_RUN, name="bench-other", model="m2", environments=("gsm8k",)),
            other,
            {"seed_offset": 7},
        ),
        (
            RunIdentity(TRAIN_RUN, kind="train", name="bench-train", model="m"),
            train,
            {"steps": 2000},
        ),
    ):
        row = spool.reading.run(identity.local_id)
        if row is not None and row.episodes >= count:
            continue
        if row is not None:
            spool.housekeeping.delete_run(identity.local_id)
        took = build_run(spool, identity, count, pool, **extra)
        print(f"build_{identity.local_id} {count / took:.0f} episodes/s")
    spool.checkpoint()
    return spool


def timed(rounds: int, action: Any) -> float:
    times = []
    for _ in range(rounds):
        started = time.perf_counter()
        action()
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--episodes", type=int, default=1_000_000)
    parser.add_argument("--other", type=int, default=1_000_000, help="episodes of the second run")
    parser.add_argument("--train", type=int, default=200_000, help="episodes of the training run")
    parser.add_argument("--spool-dir", help="where to keep the spool (default: a temporary folder)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument(
        "--pages-only", action="store_true", help="time the pages, not the `show` command"
    )
    parser.add_argument(
        "--unsorted",
        action="store_true",
        help="take away the indexes made on first use first, as in a store never sorted by a "
        "value: the first page sorted by each then makes its index (printed as first_...)",
    )
    args = parser.parse_args()
    print(machine())
    with tempfile.TemporaryDirectory() as scratch:
        spool_dir = args.spool_dir or scratch
        spool = build(spool_dir, args.episodes, args.other, args.train)
        print(f"spool_size {spool.housekeeping.size_bytes() / 2**30:.2f} GiB")
        if args.unsorted:
            drop_indexes_made_on_first_use(spool)
        measure(spool_dir, spool, args.rounds, pages_only=args.pages_only)


def drop_indexes_made_on_first_use(spool: Spool) -> None:
    """The store as a new one that nobody sorted by a value yet (a store
    built by a release that made these indexes as episodes were stored has
    them too)."""
    from prime_runs_otel.deliver.spool.schema import MADE_ON_FIRST_USE

    spool.close()
    db = sqlite3.connect(spool.path)
    for name in MADE_ON_FIRST_USE:
        db.execute(f"DROP INDEX IF EXISTS {name}")
    db.close()


def measure(spool_dir: str, spool: Spool, rounds: int, *, pages_only: bool = False) -> None:
    from prime_runs_otel.view.server import ViewerServer

    first = spool.reading.episode_rows(EVAL_RUN, EpisodeFilter(), limit=1)[0]
    pages = {
        "page_runs": "/",
        "page_run": f"/runs/{EVAL_RUN}",
        "page_run_training": f"/runs/{TRAIN_RUN}",
        "page_episodes": f"/runs/{EVAL_RUN}/episodes",
        "page_episodes_by_reward": f"/runs/{EVAL_RUN}/episodes?sort=reward&order=desc",
        "page_episodes_by_tokens": f"/runs/{EVAL_RUN}/episodes?sort=tokens",
        "page_episodes_by_duration": f"/runs/{EVAL_RUN}/episodes?sort=duration&order=asc",
        "page_episodes_errors_by_reward": (
            f"/runs/{EVAL_RUN}/episodes?error=ProviderTimeout&sort=reward"
        ),
        "page_episodes_narrow_reward_range_by_tokens": (
            f"/runs/{EVAL_RUN}/episodes?min_reward=0.1&max_reward=0.2&sort=tokens"
        ),
        "page_episodes_wide_reward_range_by_tokens": (
            f"/runs/{EVAL_RUN}/episodes?min_reward=1.1&sort=tokens"
        ),
        "page_episodes_ok_by_reward": f"/runs/{EVAL_RUN}/episodes?error=none&sort=reward",
        "page_episodes_example": f"/runs/{EVAL_RUN}/episodes?example=123456",
        "page_episodes_deep_page": f"/runs/{EVAL_RUN}/episodes?page=19000",
        "page_episode": f"/runs/{EVAL_RUN}/episodes/{first.episode_id}",
        "page_compare": f"/compare?run={EVAL_RUN}&run={OTHER_RUN}",
        "api_status": f"/api/runs/{EVAL_RUN}/status",
        "api_charts": f"/api/runs/{EVAL_RUN}/charts",
        "api_charts_training": f"/api/runs/{TRAIN_RUN}/charts",
        "api_runs": "/api/runs",
    }
    with (
        ViewerServer(spool, host="127.0.0.1", port=0) as server,
        httpx.Client(base_url=server.url, timeout=60) as client,
    ):
        for name, path in pages.items():
            started = time.perf_counter()
            answer = client.get(path)
            # The first answer: pages sorted by a value in a store never
            # sorted by it make its index then (see --unsorted).
            print(f"first_{name} {(time.perf_counter() - started) * 1000:.0f} ms")
            if answer.status_code == 404 and name.startswith("api_charts"):
                print(f"{name} n/a")  # a viewer from before the charts had their address
                continue
            if answer.status_code != 200:
                raise SystemExit(f"{path}: {answer.status_code} {answer.text[:300]}")
            seconds = timed(rounds, lambda path=path: client.get(path).raise_for_status())
            print(f"{name} {seconds * 1000:.0f} ms")
    if pages_only:
        return
    # What `show` does once the interpreter and the command line are loaded.
    from prime_runs_otel.cli.store.show import print_show

    seconds = timed(rounds, lambda: print_show(spool, spool.reading.run(EVAL_RUN), io.StringIO()))
    print(f"show_in_process {seconds * 1000:.0f} ms")
    env = {**os.environ, "PRIME_RUNS_OTEL_DIR": spool_dir}
    for name, extra in (("show", []), ("show_json", ["--json"])):
        command = [sys.executable, "-m", "prime_runs_otel.cli", "show", EVAL_RUN, *extra]
        seconds = timed(
            rounds,
            lambda command=command: subprocess.run(
                command, env=env, check=True, capture_output=True
            ),
        )
        print(f"{name} {seconds * 1000:.0f} ms")
    baseline = timed(
        rounds,
        lambda: subprocess.run(
            [sys.executable, "-m", "prime_runs_otel.cli", "--version"],
            check=True,
            capture_output=True,
        ),
    )
    print(f"cli_start {baseline * 1000:.0f} ms")


if __name__ == "__main__":
    main()
