"""One ``serve`` with and without Kafka on the same machine: episodes per
second, OTLP acknowledgement latency, and how long a killed member's runs
take to resume.

All on loopback: Apache Kafka's broker (a single KRaft node, as ``make
kafka`` starts it), ``serve`` processes, the fake platform in this process.

- throughput: pre-encoded requests (``--per-request`` episodes of ~8 KB
  each, several runs) sent by four senders as fast as ``serve`` answers,
  from the first send to every run closed on the platform (a member once it
  owns its partitions: joining the group is a start-up cost);
- acknowledgement latency: requests paced at ``--rate`` episodes per second
  for ``--seconds``, each request's time to its answer (p50, p99), timed by
  a process of its own (this one unpacks every upload for the fake platform);
- resume: two members, half of each run delivered, the member that owns
  some runs killed -9, the rest sent to the other; the time from the kill to
  every run whole on the platform.

The machine is shared: the load average before and after is printed beside
the figures.

``--stages`` splits a member's acknowledgement latency where it is spent, as
the member measured it (``/metrics``, ``kafka_request_stage_seconds``): decode
(waiting for a worker thread, decompressing, decoding), produce (records
handed to the producer), broker ack (until the last acknowledgement was
served), wake (until the request's thread ran again) and answer (until the
answer was written). ``--latency-rounds N`` measures only that, N paced runs
on one member, each with the load average beside it. ``--latency-ab N``
compares two members in N interleaved rounds: B runs the code of another
tree (``--ab-tree``, e.g. ``git archive`` of a base) and/or with other
producer settings (``--ab-config KEY=VALUE``).

    python bench/kafka.py [--episodes 3000] [--rate 1000] [--seconds 10] [--stages]
    python bench/kafka.py --latency-rounds 3 --stages
    python bench/kafka.py --latency-ab 4 --ab-config socket.nagle.disable=true
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from concurrent import futures
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

import httpx  # noqa: E402
from kafka_fleet import Fleet, all_closed, run_bodies  # noqa: E402
from test_receiver import ServeProcess, episodes, wait_for  # noqa: E402

from prime_runs_otel.testing import FakePlatform  # noqa: E402
from prime_runs_otel.testing.kafka_broker import Cluster, start  # noqa: E402


def alone(root: Path, platform: FakePlatform) -> ServeProcess:
    from kafka_fleet import member_env

    serve = ServeProcess(root, member_env(root, platform), "--no-grpc", "--straggler-wait", "5")
    serve.ready_timeout = 120.0
    return serve.start()


def throughput(
    members: list[ServeProcess], platform: FakePlatform, count: int, per: int, tag: str
) -> float:
    runs = {f"{tag}-{n}": episodes(count // 10, seed=n) for n in range(10)}
    bodies = [b for key, recs in runs.items() for b in run_bodies(recs, key, len(recs) // per)]
    random.Random(1).shuffle(bodies)
    # The starts first: a run's start before its episodes, as a producer sends them.
    began = time.monotonic()
    with httpx.Client(timeout=120) as client, futures.ThreadPoolExecutor(4) as pool:

        def send(index_body: tuple[int, bytes]) -> None:
            index, body = index_body
            member = members[index % len(members)]
            while True:
                answer = client.post(
                    member.traces_url,
                    content=body,
                    headers={"content-type": "application/x-protobuf"},
                )
                if answer.status_code == 200:
                    return
                time.sleep(0.2)

        list(pool.map(send, enumerate(bodies)))
    wait_for(lambda: all_closed(platform, list(runs)), 600, "every run to close")
    return sum(len(r) for r in runs.values()) / (time.monotonic() - began)


def latency(member: ServeProcess, rate: int, seconds: float, tag: str) -> tuple[float, float]:
    """Measured by a process of its own: in this one, the fake platform
    unpacks every upload, and the senders' clocks would wait for it."""
    command = [sys.executable, __file__, "--paced", member.traces_url, str(rate), str(seconds), tag]
    answer = subprocess.run(command, check=True, capture_output=True, text=True).stdout
    p50, p99 = answer.split()[-2:]
    return float(p50), float(p99)


def stages(member: ServeProcess) -> dict[tuple[str, str], float]:
    """The member's own split of its last requests' time, in milliseconds."""
    text = httpx.get(f"{member.url}/metrics", timeout=30).text
    found = {}
    for line in text.splitlines():
        if line.startswith("prime_runs_otel_kafka_request_stage_seconds{"):
            labels, value = line.split("{", 1)[1].split("} ")
            pairs = dict(item.split("=") for item in labels.split(","))
            key = (pairs["stage"].strip('"'), pairs["quantile"].strip('"'))
            found[key] = float(value) * 1000
    return found


def show_stages(found: dict[tuple[str, str], float]) -> None:
    order = ("decode", "produce", "broker_ack", "broker_queue", "broker_rtt", "wake", "answer")
    print("  stage (in the member)   p50 ms   p99 ms  (broker_queue, broker_rtt: in broker_ack)")
    for stage in (*order, "total"):
        p50, p99 = found.get((stage, "0.5"), 0.0), found.get((stage, "0.99"), 0.0)
        print(f"  {stage:<22}{p50:8.1f}{p99:9.1f}")


def latency_rounds(rounds: int, rate: int, seconds: float, with_stages: bool) -> None:
    """Only the acknowledgement latency of one member, ``rounds`` paced runs."""
    root = Path(tempfile.mkdtemp(prefix="bench-kafka."))
    cluster = start(root / "kafka")
    try:
        with FakePlatform() as platform:
            fleet = Fleet(root / "member", cluster, platform, partitions=6)
            member = delivering(fleet.add())
            for index in range(rounds):
                before = os.getloadavg()[0]
                p50, p99 = latency(member, rate, seconds, f"round{index}")
                print(
                    f"round {index + 1}: ack latency at {rate} episodes/s: p50 {p50:.1f} ms, "
                    f"p99 {p99:.1f} ms (load average {before:.2f} before, "
                    f"{os.getloadavg()[0]:.2f} after, 2 cores)",
                    flush=True,
                )
                if with_stages:
                    show_stages(stages(member))
            fleet.stop_all()
    finally:
        cluster.stop()
        shutil.rmtree(root, ignore_errors=True)


def member_of(fleet: Fleet, name: str, env: dict[str, str], extra: list[str]) -> ServeProcess:
    """A member as ``Fleet.add`` starts it, with environment and arguments
    of a variant (``PYTHONPATH`` of another tree, ``--kafka-config``)."""
    from kafka_fleet import member_env

    root = fleet.root / name
    args = ["--kafka", fleet.cluster.bootstrap, "--kafka-topic-prefix", fleet.prefix]
    args += ["--kafka-partitions", str(fleet.partitions), "--straggler-wait", "5", "--no-grpc"]
    member = ServeProcess(root, {**member_env(root, fleet.platform), **env}, *args, *extra)
    member.ready_timeout = 120.0
    member.start()
    fleet.members.append(member)
    return delivering(member)


def latency_ab(args: argparse.Namespace) -> None:
    """Member A (this tree) and member B (``--ab-tree``'s code and/or
    ``--ab-config`` settings), each a fleet of its own on one broker, paced
    in turns, A first in odd rounds and B first in even ones."""
    root = Path(tempfile.mkdtemp(prefix="bench-kafka-ab."))
    cluster = start(root / "kafka")
    b_env = {}
    if args.ab_tree:
        # Without PYTHONSAFEPATH, ``python -m`` puts the working directory
        # (this tree, when the bench runs from it) before PYTHONPATH, and B
        # would run A's code.
        assert sys.version_info >= (3, 11), "--ab-tree needs PYTHONSAFEPATH (Python 3.11+)"
        b_env = {"PYTHONPATH": str(Path(args.ab_tree).resolve()), "PYTHONSAFEPATH": "1"}
    b_args = [item for pair in args.ab_config for item in ("--kafka-config", pair)]
    try:
        with FakePlatform() as platform:
            members = {
                "A": member_of(Fleet(root / "a", cluster, platform), "a", {}, []),
                "B": member_of(Fleet(root / "b", cluster, platform), "b", b_env, b_args),
            }
            for index in range(args.latency_ab):
                for name in ("A", "B") if index % 2 == 0 else ("B", "A"):
                    ab_round(members[name], name, index, args)
            for member in members.values():
                member.stop(signal.SIGKILL)
    finally:
        cluster.stop()
        shutil.rmtree(root, ignore_errors=True)


def ab_round(member: ServeProcess, name: str, index: int, args: argparse.Namespace) -> None:
    """One paced run on one member: the sender's p50/p99, the member's
    stages (its last 1,000 requests: a run of 10 s at 1,000 episodes/s),
    its CPU per episode, from the run's start until it delivered them all
    (each round starts with both members idle, none delivering a backlog),
    and how long that took: a member that delivers less of a round while
    the round is sent leaves its cores to the acknowledgements, and its
    backlog to after the round."""
    load = os.getloadavg()[0]
    cpu = cpu_seconds(member)
    before = member_counts(member)
    began = time.monotonic()
    p50, p99 = latency(member, args.rate, args.seconds, f"{name}{index}")
    found = stages(member)
    wait_for(lambda: pending(member) == 0, 600, "the member to deliver the round")
    delivered = time.monotonic() - began
    sent = args.rate * args.seconds
    per_episode = (cpu_seconds(member) - cpu) / sent * 1e6
    loop = passes_and_loop(before, member_counts(member), sent, args.seconds)
    inside = " ".join(
        f"{stage} {found.get((stage, '0.5'), 0):.0f}/{found.get((stage, '0.99'), 0):.0f}"
        for stage in (
            "decode",
            "produce",
            "broker_ack",
            "broker_queue",
            "broker_rtt",
            "wake",
            "answer",
        )
    )
    print(
        f"round {index + 1} {name}: p50 {p50:.1f} ms, p99 {p99:.1f} ms "
        f"(load average {load:.2f}, 2 cores); CPU {per_episode:.0f} us/episode; {loop}; "
        f"all delivered {delivered:.0f} s after the first send; "
        f"p50/p99 ms {inside}",
        flush=True,
    )


def cpu_seconds(member: ServeProcess) -> float:
    """The member process's user and system CPU time, from ``/proc``."""
    assert member.process is not None
    fields = Path(f"/proc/{member.process.pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def member_counts(member: ServeProcess) -> dict[str, float]:
    """``/metrics``' figures of the member's consumer loop (none from a
    tree whose member does not report them)."""
    found = {}
    for line in httpx.get(f"{member.url}/metrics", timeout=30).text.splitlines():
        for name in ("kafka_intakes_total", 'kafka_records_total{outcome="taken"}'):
            if line.startswith(f"prime_runs_otel_{name} "):
                found[name] = float(line.split()[-1])
        if line.startswith("prime_runs_otel_kafka_loop_cpu_seconds_total "):
            found["loop_cpu"] = float(line.split()[-1])
    return found


def passes_and_loop(
    before: dict[str, float], after: dict[str, float], sent: float, seconds: float
) -> str:
    """The round's intake passes (spool transactions) per second of sending,
    records per pass and the consumer loop thread's CPU per episode."""
    if "kafka_intakes_total" not in after:
        return "passes and loop CPU not reported"
    passes = after["kafka_intakes_total"] - before.get("kafka_intakes_total", 0)
    records = after['kafka_records_total{outcome="taken"}'] - before.get(
        'kafka_records_total{outcome="taken"}', 0
    )
    loop = (after["loop_cpu"] - before.get("loop_cpu", 0)) / sent * 1e6
    return (
        f"{passes / seconds:.0f} passes/s, {records / max(passes, 1):.1f} records/pass, "
        f"loop CPU {loop:.0f} us/episode"
    )


def pending(member: ServeProcess) -> float:
    """``/metrics``' episodes stored and not delivered yet."""
    for line in httpx.get(f"{member.url}/metrics", timeout=30).text.splitlines():
        if line.startswith("prime_runs_otel_episodes_pending "):
            return float(line.split()[1])
    return 0.0


def paced(url: str, rate: int, seconds: float, tag: str) -> tuple[float, float]:
    per = 10
    records = episodes(int(rate * seconds), seed=77)
    bodies = run_bodies(records, f"{tag}-paced", max(1, len(records) // per))
    interval = per / rate
    took: list[float] = []
    lock = threading.Lock()
    with httpx.Client(timeout=60) as client, futures.ThreadPoolExecutor(16) as pool:

        def send(body: bytes) -> None:
            sent = time.monotonic()
            answer = client.post(
                url, content=body, headers={"content-type": "application/x-protobuf"}
            )
            assert answer.status_code == 200, answer.text
            with lock:
                took.append(time.monotonic() - sent)

        began = time.monotonic()
        pending = []
        for index, body in enumerate(bodies):
            delay = began + index * interval - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            pending.append(pool.submit(send, body))
        for item in pending:
            item.result()
    took.sort()
    return statistics.median(took) * 1000, took[int(len(took) * 0.99) - 1] * 1000


def resume(cluster: Cluster, root: Path) -> float:
    with FakePlatform() as platform:
        fleet = Fleet(root, cluster, platform, partitions=6)
        first, _ = fleet.add_many(2)
        runs = {f"resume-{n}": episodes(20, seed=900 + n) for n in range(8)}
        pieces = {key: run_bodies(recs, key, 2) for key, recs in runs.items()}
        rng = random.Random(3)
        for key in runs:
            fleet.send(pieces[key][0], rng)
        wait_for(
            lambda: (
                all(len(platform.episodes(r.id)) == 10 for r in platform.runs())
                and len(platform.runs()) == len(runs)
            ),
            300,
            "the first halves",
        )
        first.stop(signal.SIGKILL)
        killed = time.monotonic()
        for key in runs:
            fleet.send(pieces[key][1], rng)
        wait_for(lambda: all_closed(platform, list(runs)), 300, "every run to close")
        took = time.monotonic() - killed
        fleet.stop_all()
        return took


def delivering(member: ServeProcess) -> ServeProcess:
    """Once the member owns its partitions: joining the group (the broker
    waits 3 s for more members first) is a start-up cost, not a pace."""
    wait_for(lambda: "now delivers partition" in member.log(), 120, "the member's partitions")
    return member


def main() -> int:
    if sys.argv[1:2] == ["--paced"]:
        url, rate, seconds, tag = sys.argv[2:6]
        p50, p99 = paced(url, int(rate), float(seconds), tag)
        print(f"{p50:.1f} {p99:.1f}")
        return 0
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--episodes", type=int, default=3000)
    parser.add_argument("--per-request", type=int, default=30)
    parser.add_argument("--rate", type=int, default=1000)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--stages", action="store_true", help="split the member's latency")
    parser.add_argument("--latency-rounds", type=int, default=0, help="only the latency, N runs")
    parser.add_argument("--latency-ab", type=int, default=0, help="A/B of two members, N rounds")
    parser.add_argument("--ab-tree", help="member B runs the package of this source tree")
    parser.add_argument("--ab-config", action="append", default=[], help="member B: KEY=VALUE")
    args = parser.parse_args()
    if args.latency_ab:
        latency_ab(args)
        return 0
    if args.latency_rounds:
        latency_rounds(args.latency_rounds, args.rate, args.seconds, args.stages)
        return 0
    root = Path(tempfile.mkdtemp(prefix="bench-kafka."))
    print(f"load average before: {os.getloadavg()[0]:.2f} (2 cores)", flush=True)
    cluster = start(root / "kafka")
    results: dict[str, Any] = {}
    try:
        with FakePlatform() as platform:
            serve = alone(root / "alone", platform)
            results["alone_eps"] = throughput(
                [serve], platform, args.episodes, args.per_request, "alone"
            )
            results["alone_ack"] = latency(serve, args.rate, args.seconds, "alone")
            serve.stop()
        with FakePlatform() as platform:
            fleet = Fleet(root / "member", cluster, platform, partitions=6)
            member = delivering(fleet.add())
            results["kafka_eps"] = throughput(
                [member], platform, args.episodes, args.per_request, "kafka"
            )
            results["kafka_ack"] = latency(member, args.rate, args.seconds, "kafka")
            results["stages"] = stages(member)
            fleet.stop_all()
        results["resume_s"] = resume(cluster, root / "resume")
    finally:
        cluster.stop()
        shutil.rmtree(root, ignore_errors=True)
    print(f"load average after: {os.getloadavg()[0]:.2f} (2 cores)")
    print(f"episodes/s, one serve alone:      {results['alone_eps']:.0f}")
    print(
        f"episodes/s, one member on Kafka:  {results['kafka_eps']:.0f} "
        f"({results['kafka_eps'] / results['alone_eps']:.0%} of alone)"
    )
    for mode in ("alone", "kafka"):
        p50, p99 = results[f"{mode}_ack"]
        print(f"ack latency at {args.rate} episodes/s, {mode}: p50 {p50:.1f} ms, p99 {p99:.1f} ms")
    print(f"a killed member's runs whole again after: {results['resume_s']:.1f} s")
    if args.stages:
        show_stages(results["stages"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
