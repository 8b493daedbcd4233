"""The Kafka fleet's soak (``make soak-kafka``, not part of ``make test``):
runs sent to random members while members are killed and brokers lost, with
exact books on the fake platform.

1. One broker, three members, 24+ concurrent runs of 30 episodes sent in
   pieces to random members. Meanwhile: a member killed -9 for good, a
   member added, a member killed -9 and started again under its name with
   its spool deleted, a member removed (SIGTERM).
2. A three-broker cluster (replication factor 3, ``min.insync.replicas=2``),
   two members, the same runs; one broker killed -9 mid-run.

Every acknowledged episode must be on the platform exactly once, each run
created once and finalized once with the right count, no run split across
platform runs. Prints what happened and how long each part took.

    python tests/kafka_soak.py [--runs 24] [--episodes 30] [--seed 1]
"""

from __future__ import annotations

import argparse
import contextlib
import random
import shutil
import signal
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from kafka_fleet import Fleet, all_closed, assert_books, run_bodies
from test_receiver import episodes, wait_for

from prime_runs_otel.testing import FakePlatform
from prime_runs_otel.testing.kafka_broker import Cluster, start

#: Pieces each run is sent in (the start with the first, the end with the last).
PIECES = 6


def feed(fleet: Fleet, runs: dict[str, list[dict]], seed: int, pause: float) -> threading.Thread:
    """Send every run's pieces, runs interleaved, to random members."""
    rng = random.Random(seed)
    bodies = {key: run_bodies(records, key, PIECES) for key, records in runs.items()}

    def send() -> None:
        for piece in range(PIECES):
            keys = list(bodies)
            rng.shuffle(keys)
            for key in keys:
                if piece < len(bodies[key]):
                    fleet.send(bodies[key][piece], rng)
            time.sleep(pause)

    thread = threading.Thread(target=send, name="feed")
    thread.start()
    return thread


def members_soak(root: Path, runs: int, size: int, seed: int) -> None:
    cluster = start(root / "kafka")
    with contextlib.ExitStack() as stack:
        stack.callback(cluster.stop)
        platform = stack.enter_context(FakePlatform())
        fleet = Fleet(root, cluster, platform, partitions=12)
        stack.callback(fleet.stop_all)
        began = time.monotonic()
        fleet.add_many(2)
        restarted_root = root / "restarted"
        restarted = fleet.add(name="restarted", root=restarted_root)
        print(f"3 members up in {time.monotonic() - began:.1f}s", flush=True)
        work = {f"soak-{seed}-{n}": episodes(size, seed=seed * 1000 + n) for n in range(runs)}
        sender = feed(fleet, work, seed, pause=3.0)
        rng = random.Random(seed)
        time.sleep(4)  # the events land at points of the feed, whatever its pace
        victim = rng.choice([m for m in fleet.alive() if m is not restarted])
        victim.stop(signal.SIGKILL)
        print(f"{time.monotonic() - began:.1f}s: killed -9 a member for good", flush=True)
        fleet.add()
        print(f"{time.monotonic() - began:.1f}s: added a member", flush=True)
        restarted.stop(signal.SIGKILL)
        fleet.members.remove(restarted)
        shutil.rmtree(restarted_root / "serve-spool", ignore_errors=True)
        fleet.add(name="restarted", root=restarted_root)
        print(
            f"{time.monotonic() - began:.1f}s: killed -9 a member, deleted its spool, "
            "started it again",
            flush=True,
        )
        time.sleep(3)
        leaving = rng.choice([m for m in fleet.alive() if m.process is not None])
        leaving.stop(signal.SIGTERM)
        print(f"{time.monotonic() - began:.1f}s: removed a member (SIGTERM)", flush=True)
        sender.join()
        sent = time.monotonic()
        print(f"{sent - began:.1f}s: every piece acknowledged", flush=True)
        wait_for(lambda: all_closed(platform, list(work)), 600, "every run to close")
        print(f"every run closed {time.monotonic() - sent:.1f}s after the last piece")
        assert_books(platform, work)
        total = sum(len(records) for records in work.values())
        print(f"members: {len(work)} runs, {total} episodes, each exactly once: OK")


def brokers_soak(root: Path, runs: int, size: int, seed: int) -> None:
    cluster: Cluster = start(root / "kafka3", count=3)
    with contextlib.ExitStack() as stack:
        stack.callback(cluster.stop)
        platform = stack.enter_context(FakePlatform())
        fleet = Fleet(root, cluster, platform, partitions=12)
        stack.callback(fleet.stop_all)
        began = time.monotonic()
        fleet.add_many(2)
        work = {f"rf3-{seed}-{n}": episodes(size, seed=seed * 2000 + n) for n in range(runs)}
        sender = feed(fleet, work, seed + 1, pause=2.0)
        time.sleep(5)
        node = random.Random(seed).choice(cluster.nodes)
        cluster.kill(node)
        print(f"{time.monotonic() - began:.1f}s: killed -9 broker {node.node_id} of 3", flush=True)
        sender.join()
        sent = time.monotonic()
        wait_for(lambda: all_closed(platform, list(work)), 600, "every run to close")
        print(f"every run closed {time.monotonic() - sent:.1f}s after the last piece")
        assert_books(platform, work)
        total = sum(len(records) for records in work.values())
        print(f"brokers: {len(work)} runs, {total} episodes, each exactly once: OK")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=24)
    parser.add_argument("--episodes", type=int, default=30)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--part", choices=["members", "brokers", "both"], default="both")
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="kafka-soak."))
    print(f"kafka soak in {root}", flush=True)
    if args.part in ("members", "both"):
        members_soak(root / "members", args.runs, args.episodes, args.seed)
    if args.part in ("brokers", "both"):
        brokers_soak(root / "brokers", args.runs, args.episodes, args.seed)
    shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
