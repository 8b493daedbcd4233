"""The broker's acknowledgement alone, without a member: variants of the
broker (JVM options, server properties) or of the producer's settings,
measured A/B in interleaved rounds.

Each variant has a single-node KRaft broker of its own (as ``make kafka``
starts it, plus the variant's options), all running at once; a round sends
to each in turn, in a rotated order, from a process of its own: records of
a paced OTLP request's size (``--per-request`` episodes, one run key each),
at ``--rate`` episodes per second for ``--seconds``, with the ingest
producer's settings (idempotent, ``acks=all``) and a thread serving the
delivery reports as a member's does. A record's time is from its
``produce()`` to its delivery report. Beside each figure: the load average
and the CPU seconds the broker spent in the round (``/proc``).

    python bench/kafka_ack.py [--rounds 4] [--rate 1000] [--seconds 10] [--variant NAME ...]
    python bench/kafka_ack.py --worst --variant default --variant before
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from prime_runs_otel.deliver.kafka.settings import KafkaSettings  # noqa: E402
from prime_runs_otel.testing.kafka_broker import Cluster, start  # noqa: E402

#: name → (JVM options, server properties, producer settings), each after
#: the defaults of ``make kafka``'s broker and of the ingest producer.
VARIANTS: dict[str, tuple[list[str], dict[str, str], dict[str, Any]]] = {
    "default": ([], {}, {}),
    # The broker as it was before: the log cleaner's 128 MB buffer on the
    # heap, the metaspace grown by full collections.
    "before": (
        ["-Xms64m", "-Xmx384m", "-XX:MetaspaceSize=21m"],
        {"log.cleaner.dedupe.buffer.size": "134217728"},
        {},
    ),
    # A fixed heap with a large young generation: fewer, longer stops.
    "big-young": (["-Xms256m", "-Xmx256m", "-Xmn160m"], {}, {}),
    # The heap growing from 64 MB (Serial grows it through full collections).
    "growing": (["-Xms64m", "-Xmx384m"], {}, {}),
    "tenure-1": (["-Xms256m", "-Xmx256m", "-Xmn160m", "-XX:MaxTenuringThreshold=1"], {}, {}),
    "nagle-off": ([], {}, {"socket.nagle.disable": True}),
    "uncompressed": ([], {}, {"compression.type": "none"}),
    "linger-0": ([], {}, {"linger.ms": 0}),
    "threads-1-2": ([], {"num.network.threads": "1", "num.io.threads": "2"}, {}),
    "g1-10ms": (["-XX:-UseSerialGC", "-XX:+UseG1GC", "-XX:MaxGCPauseMillis=10"], {}, {}),
    "parallel": (["-XX:-UseSerialGC", "-XX:+UseParallelGC", "-XX:ParallelGCThreads=2"], {}, {}),
}


def gc_pauses(log: Path) -> str:
    """The broker's GC pauses from its ``-Xlog:gc`` file: count, total, longest."""
    pauses = []
    for line in log.read_text(errors="replace").splitlines():
        if "Pause" in line and line.rstrip().endswith("ms"):
            pauses.append(float(line.rsplit(" ", 1)[1].removesuffix("ms")))
    if not pauses:
        return "no GC pause"
    return f"{len(pauses)} GC pauses, {sum(pauses):.0f} ms in all, longest {max(pauses):.1f} ms"


def clock_ticks(pid: int) -> float:
    """CPU seconds (user and system) of a process so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def send(bootstrap: str, producer: dict[str, Any], rate: int, seconds: float, per: int) -> None:
    """One round, in a process of its own: prints the p50 and p99 in ms."""
    from confluent_kafka import Producer
    from kafka_fleet import run_bodies
    from test_receiver import episodes

    bodies = run_bodies(episodes(per * 20, seed=5), "probe", 20)
    settings = KafkaSettings(bootstrap, prefix="probe")
    client = Producer({**settings.ingest_producer(), **producer})
    took: list[float] = []
    #: (latency, when it was sent, from the round's start): do the slow ones cluster?
    slow: list[tuple[float, float]] = []
    stopping = threading.Event()

    def serve_reports() -> None:
        while not stopping.is_set():
            client.poll(0.05)

    def report(sent: float) -> Any:
        def done(_error: Any, _message: Any) -> None:
            took.append(time.monotonic() - sent)
            slow.append((took[-1], sent - began))

        return done

    server = threading.Thread(target=serve_reports, daemon=True)
    server.start()
    # A member's producer lives long: connected, its metadata and producer id
    # fetched. A round timed from a cold start measured those (the first ten
    # records of each round waited 0.1-1 s: exactly the p99 of 1,000).
    client.produce(settings.episodes_topic, bodies[0], key=b"warm-up")
    client.flush(60)
    interval, count = per / rate, int(rate * seconds / per)
    began = time.monotonic()
    for index in range(count):
        delay = began + index * interval - time.monotonic()
        if delay > 0:
            time.sleep(delay)
        client.produce(
            settings.episodes_topic,
            bodies[index % len(bodies)],
            key=f"run-{index % 7}".encode(),
            on_delivery=report(time.monotonic()),
        )
    client.flush(30)
    stopping.set()
    took.sort()
    worst = sorted(slow, reverse=True)[:12]
    print(
        " ".join(f"{late * 1000:.0f}ms@{at:.2f}s" for late, at in sorted(worst, key=lambda w: w[1]))
    )
    print(f"{statistics.median(took) * 1000:.2f} {took[int(len(took) * 0.99) - 1] * 1000:.2f}")


def one_round(
    cluster: Cluster, producer: dict[str, Any], args: argparse.Namespace
) -> tuple[float, float, float]:
    broker = cluster.nodes[0].process
    assert broker is not None
    cpu = clock_ticks(broker.pid)
    command = [
        sys.executable,
        __file__,
        "--send",
        cluster.bootstrap,
        json.dumps(producer),
        str(args.rate),
        str(args.seconds),
        str(args.per_request),
    ]
    out = subprocess.run(command, check=True, capture_output=True, text=True).stdout
    if args.worst:
        print(f"  slowest acks (latency@sent): {out.splitlines()[-2]}", flush=True)
    p50, p99 = (float(value) for value in out.split()[-2:])
    return p50, p99, clock_ticks(broker.pid) - cpu


def main() -> int:
    if sys.argv[1:2] == ["--send"]:
        bootstrap, producer, rate, seconds, per = sys.argv[2:7]
        send(bootstrap, json.loads(producer), int(rate), float(seconds), int(per))
        return 0
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--rate", type=int, default=1000)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--per-request", type=int, default=10)
    parser.add_argument("--variant", action="append", choices=sorted(VARIANTS))
    parser.add_argument("--worst", action="store_true", help="print each round's slowest acks")
    parser.add_argument("--keep-gc-logs", help="copy each broker's GC log into this folder")
    args = parser.parse_args()
    names = args.variant or ["default", "before"]
    root = Path(tempfile.mkdtemp(prefix="bench-kafka-ack."))
    clusters: dict[str, Cluster] = {}
    results: dict[str, list[tuple[float, float, float]]] = {name: [] for name in names}
    try:
        for name in names:
            java, properties, _ = VARIANTS[name]
            gc_log = f"-Xlog:gc:file={root / name / 'gc.log'}"
            clusters[name] = start(root / name, java_options=[*java, gc_log], properties=properties)
        warm = {name: one_round(clusters[name], VARIANTS[name][2], args) for name in names}
        print(f"warm-up rounds (not counted): {warm}", flush=True)
        for index in range(args.rounds):
            order = names[index % len(names) :] + names[: index % len(names)]
            for name in order:
                load = os.getloadavg()[0]
                p50, p99, cpu = one_round(clusters[name], VARIANTS[name][2], args)
                results[name].append((p50, p99, cpu))
                print(
                    f"round {index + 1} {name:<12} ack p50 {p50:6.1f} ms  p99 {p99:6.1f} ms  "
                    f"broker CPU {cpu:5.2f} s  (load average {load:.2f}, 2 cores)",
                    flush=True,
                )
        for name in names:
            print(f"{name:<12} broker: {gc_pauses(root / name / 'gc.log')}")
            if args.keep_gc_logs:
                shutil.copy(root / name / "gc.log", Path(args.keep_gc_logs) / f"{name}.gc.log")
    finally:
        for cluster in clusters.values():
            cluster.stop()
        shutil.rmtree(root, ignore_errors=True)
    for name, rows in results.items():
        p50s, p99s = [r[0] for r in rows], [r[1] for r in rows]
        print(
            f"{name:<12} p50 min {min(p50s):6.1f} median {statistics.median(p50s):6.1f}  "
            f"p99 min {min(p99s):6.1f} median {statistics.median(p99s):6.1f} ms"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
