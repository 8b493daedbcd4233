"""What the design cannot go below: each stage's floor, beside the real pipeline.

prime-runs-otel carries every episode on an OpenTelemetry span, keeps it in a
durable spool until the platform acknowledges it, and uploads it to Prime
Traces. Each of the three is a requirement, and each has a cost no code of
ours can remove. This bench measures that cost stage by stage, with nothing
of the project on the hot path, on the very same episodes as
``bench/in_process.py``:

- sdk_floor:     the OpenTelemetry SDK alone carrying each episode: the same
                 Resource shape, the record encoded once with orjson and set
                 as the attributes the run sets (one episode span each, as
                 ``start_run`` emits it when nobody else listens: id, size,
                 digest, the record), the run's start and end spans, through
                 the SDK's BatchSpanProcessor (batches of 64) to an exporter
                 that drops everything.
- durable_floor: the same record bytes inserted into a SQLite file with the
                 spool's pragmas (WAL, synchronous=FULL, 8 KiB pages, ...),
                 one prepared INSERT by executemany per batch of 64, one
                 transaction per batch. Nothing else: no index, no views, no
                 checkpoint.
- upload_floor:  the same records as Prime Traces lines (stamped with a run
                 id beforehand), in uploads that close near 2 MiB as the
                 uploader's do, each keyed by its digest, gzip'd at the
                 uploader's level and POSTed with httpx to the fake platform
                 on loopback, one client kept alive.
- floor_sum:     the three above, round by round.
- pipeline:      today's whole pipeline (``in_process.child_otel``), and its
                 stages as that run times them (the caller, the producer
                 thread, ``export()``, the uploader), each read beside the
                 floor of what it does.
- prime_runs:    prime-runs 0.1.4 (``in_process.child_sdk``), the reference.

Every side runs in a fresh subprocess, in interleaved rounds (the order
rotates each round); the figure is process CPU (user + system) per episode,
setup and shutdown included as on the two real sides, shown as the rounds'
minimum and median (a shared machine's load lands in some rounds only; the
per-round values are printed too), and as a ratio to prime-runs.

    python bench/floor.py [--episodes 2000] [--rounds 4] [--size 8000]
"""

from __future__ import annotations

import argparse
import compileall
import gc
import hashlib
import json
import os
import sqlite3
import statistics
import sys
import time
import uuid
from collections.abc import Callable
from typing import Any

from in_process import CHILD_FLAG, child_otel, child_sdk, machine, print_side_by_side, run_child

FLOORS = ("sdk_floor", "durable_floor", "upload_floor")
#: Every side measured in a round of its own subprocess, in this order in the
#: first round (rotated by one in each next round).
SIDES = ("pipeline", "prime_runs", *FLOORS)
#: The pipeline's stages as ``in_process.child_otel`` times them (thread CPU
#: inside the calls), each read beside the floor of what it does.
STAGES = {
    "pipeline_caller": "caller_cpu",
    "pipeline_producer": "build_cpu",
    "pipeline_exporter": "exporter_cpu",
    "pipeline_uploader": "uploader_cpu",
}
#: The part of the upload floor that is the client's set-up, once per process.
UPLOAD_SETUP = "upload_floor_setup"
#: What ``start_run`` hands its exporter per ``export()`` and what the spool
#: commits in one transaction (``batching.BSP_DEFAULTS``).
BATCH = 64


# -- child side: one measured run -------------------------------------------------


def child_sdk_floor(episodes: list[dict[str, Any]]) -> dict[str, Any]:
    """The SDK carrying each episode on its span: encoding, span, batch
    processor, export to nowhere."""
    import orjson
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor
    from opentelemetry.trace import Link

    from prime_runs_otel import semconv as sc

    episode_id, record_key = sc.EPISODE_ID, sc.EPISODE_RECORD
    size_key, digest_key = sc.blob_size_key(record_key), sc.blob_sha256_key(record_key)
    chunk = sc.DEFAULT_BLOB_CHUNK_CHARS
    exporter = _null_exporter()
    cpu0 = time.process_time()
    provider = TracerProvider(resource=_run_resource())
    provider.add_span_processor(
        BatchSpanProcessor(
            exporter, max_queue_size=8192, schedule_delay_millis=50, max_export_batch_size=BATCH
        )
    )
    tracer = provider.get_tracer(sc.INSTRUMENTATION_SCOPE, "floor", schema_url=sc.SCHEMA_URL)
    start = tracer.start_span("prime.run.start", attributes={"prime.run.config": ("{}",)})
    start.end()
    link = (Link(start.get_span_context()),)
    for record in episodes:
        data = orjson.dumps(record)
        text = data.decode("utf-8")
        chunks = [text[at : at + chunk] for at in range(0, len(text), chunk)]
        attributes = {
            episode_id: record["id"],
            size_key: len(data),
            digest_key: hashlib.sha256(data).hexdigest(),
            record_key: chunks,
        }
        name = f"episode {record['env']['name']}"
        tracer.start_span(name, attributes=attributes, links=link).end()
    tracer.start_span("prime.run.end", attributes={"prime.run.status": "completed"}).end()
    provider.shutdown()
    cpu = time.process_time() - cpu0
    return {"cpu": cpu, "carried": exporter.count - 2}


def _null_exporter() -> Any:
    """A span exporter that counts what it is given and keeps nothing."""
    from collections.abc import Sequence

    from opentelemetry.sdk.trace import ReadableSpan
    from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

    class NullExporter(SpanExporter):
        count = 0

        def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
            self.count += len(spans)
            return SpanExportResult.SUCCESS

    return NullExporter()


def _run_resource() -> Any:
    """A Resource of the shape ``start_run`` gives a run (its service, its
    instance, the run's identity)."""
    from opentelemetry.sdk.resources import Resource

    return Resource.create(
        {
            "service.name": "prime-runs-otel",
            "service.instance.id": str(uuid.uuid4()),
            "prime.run.id": uuid.uuid4().hex,
            "prime.run.kind": "eval",
            "prime.run.name": "bench-floor",
            "prime.run.model": "bench/model",
            "prime.run.framework": "bench",
            "prime.run.environments": ("bench-env",),
        }
    )


def child_durable_floor(episodes: list[dict[str, Any]]) -> dict[str, Any]:
    """The record bytes made durable in SQLite with the spool's pragmas, a
    transaction per batch; the bytes are encoded before the window (the
    SDK floor counts the one encoding)."""
    import orjson

    from prime_runs_otel.deliver.spool.core import AUTOCHECKPOINT_BYTES, PAGE_SIZE

    bodies = [(orjson.dumps(record),) for record in episodes]
    path = os.path.join(os.environ["PRIME_RUNS_OTEL_DIR"], "floor.sqlite")
    cpu0 = time.process_time()
    db = sqlite3.connect(path, timeout=60.0, isolation_level=None)
    for pragma in (
        f"page_size = {PAGE_SIZE}",
        "auto_vacuum = INCREMENTAL",
        "journal_mode = WAL",
        "synchronous = FULL",
        "busy_timeout = 60000",
        "secure_delete = FAST",
        f"wal_autocheckpoint = {AUTOCHECKPOINT_BYTES // PAGE_SIZE}",
    ):
        db.execute(f"PRAGMA {pragma}")
    db.execute("CREATE TABLE records (seq INTEGER PRIMARY KEY, body BLOB NOT NULL)")
    for at in range(0, len(bodies), BATCH):
        db.execute("BEGIN IMMEDIATE")
        db.executemany("INSERT INTO records (body) VALUES (?)", bodies[at : at + BATCH])
        db.execute("COMMIT")
    # Before the close: the last connection's close checkpoints the WAL into
    # the file, housekeeping the durability itself does not need.
    cpu = time.process_time() - cpu0
    (stored,) = db.execute("SELECT count(*) FROM records").fetchone()
    db.close()
    return {"cpu": cpu, "carried": stored}


def child_upload_floor(episodes: list[dict[str, Any]]) -> dict[str, Any]:
    """The records as Prime Traces uploads, gzip'd and POSTed on one kept-alive
    client; the lines are made before the window (the SDK floor counts the
    one encoding, and stamping a run id into it is a byte replace)."""
    import httpx
    import orjson

    from prime_runs_otel.deliver.platform.http import UPLOAD_TIMEOUT
    from prime_runs_otel.deliver.sinks.traces import TRACES_BATCH_BYTES

    run_id = uuid.uuid4().hex
    lines = [orjson.dumps(_stamped(record, run_id)) + b"\n" for record in episodes]
    url = f"{os.environ['PRIME_TRACES_URL'].rstrip('/')}/api/v1/traces"
    headers = {"Authorization": f"Bearer {os.environ['PRIME_API_KEY']}"}
    cpu0 = time.process_time()
    with httpx.Client(headers=headers, timeout=UPLOAD_TIMEOUT) as client:
        # Most of it loading the CA bundle, once per process (as the
        # uploader's clients share one TLS context): shown apart.
        setup = time.process_time() - cpu0
        uploaded = sum(_post(client, url, batch) for batch in _uploads(lines, TRACES_BATCH_BYTES))
    cpu = time.process_time() - cpu0
    return {"cpu": cpu, "setup_cpu": setup, "carried": uploaded}


def _stamped(record: dict[str, Any], run_id: str) -> dict[str, Any]:
    """The record keyed to its platform run, on the envelope and on every
    member trace, as the service reads it (PLATFORM.md)."""
    run = {**record.get("run", {}), "id": run_id, "type": "eval"}
    traces = [{**trace, "run": {**trace.get("run", run), **run}} for trace in record["traces"]]
    return {**record, "run": run, "traces": traces}


def _uploads(lines: list[bytes], budget: int) -> list[list[bytes]]:
    """The lines in uploads that close before ``budget`` bytes, as the
    uploader reads a run's pending episodes (at least one line each)."""
    uploads: list[list[bytes]] = [[]]
    size = 0
    for line in lines:
        if uploads[-1] and size + len(line) > budget:
            uploads.append([])
            size = 0
        uploads[-1].append(line)
        size += len(line)
    return uploads


def _post(client: Any, url: str, lines: list[bytes]) -> int:
    """One upload as the uploader sends it (PLATFORM.md: multipart metadata
    and gzip'd lines, keyed by the digest of the lines, both made by the
    uploader's own functions); its line count once the platform has
    committed it."""
    from prime_runs_otel.deliver.platform.traces import compress_lines, upload_key

    body = b"".join(lines)
    metadata = json.dumps({"schema_version": 1, "context": {"source": "floor"}}).encode()
    response = client.post(
        url,
        headers={"Idempotency-Key": upload_key(body), "X-Prime-Line-Format": "episode"},
        files={
            "metadata": (None, metadata, "application/json"),
            "traces": (
                "traces.jsonl",
                compress_lines(body),
                "application/x-ndjson",
                {"Content-Encoding": "gzip"},
            ),
        },
    )
    response.raise_for_status()
    if response.json().get("status") != "committed":
        raise SystemExit(f"the fake platform did not commit an upload: {response.text}")
    return len(lines)


#: The measured run of each side, as the child calls it.
CHILDREN: dict[str, Callable[[list[dict[str, Any]]], dict[str, Any]]] = {
    "pipeline": lambda episodes: child_otel(episodes, 0.0),
    "prime_runs": lambda episodes: child_sdk(episodes, 0.0),
    "sdk_floor": child_sdk_floor,
    "durable_floor": child_durable_floor,
    "upload_floor": child_upload_floor,
}


def child_main(side: str, count: int, size: int, seed: int) -> None:
    from prime_runs_otel.produce.synthetic import synthetic_episodes

    episodes = list(synthetic_episodes(count, seed=seed, target_bytes=size))
    # Out of the collector's view, as in in_process.py: a full collection
    # walking the prepared records would land in whichever window it meets.
    gc.collect()
    gc.freeze()
    result = CHILDREN[side](episodes)
    carried = result.get("carried", result.get("stored"))
    if carried != count:
        raise SystemExit(f"{side} carried {carried} of {count} episodes; its figure would lie")
    kept = ("cpu", "setup_cpu", *STAGES.values())
    print(json.dumps({key: result[key] for key in kept if key in result}))


# -- parent side -------------------------------------------------------------------


def measure(args: argparse.Namespace, env: dict[str, str]) -> dict[str, list[float]]:
    """CPU ms per episode of every side, round by round (the order rotated
    each round, so no side always runs first or after the same one), the
    pipeline's stages, and the floors' sum per round."""
    per_round: dict[str, list[float]] = {side: [] for side in (*SIDES, *STAGES, UPLOAD_SETUP)}
    child_args = [str(args.episodes), str(args.size)]
    for number in range(args.rounds):
        order = SIDES[number % len(SIDES) :] + SIDES[: number % len(SIDES)]
        for side in order:
            # The same seed for every side of a round: the very same episodes.
            result = run_child(__file__, side, [*child_args, str(number)], env)
            per_round[side].append(1000 * result["cpu"] / args.episodes)
            if side == "pipeline":
                for stage, key in STAGES.items():
                    per_round[stage].append(1000 * result[key] / args.episodes)
            if side == "upload_floor":
                per_round[UPLOAD_SETUP].append(1000 * result["setup_cpu"] / args.episodes)
            print(f"  round {number + 1}: {side} done", file=sys.stderr)
    per_round["floor_sum"] = [
        sum(values) for values in zip(*(per_round[side] for side in FLOORS), strict=True)
    ]
    return per_round


def figures(per_round: dict[str, list[float]]) -> dict[str, dict[str, float]]:
    """Each side's minimum and median over the rounds beside prime-runs' same figure,
    as ``print_side_by_side`` takes them (its ``otel`` column is the
    design's side, its ``sdk`` column prime-runs)."""
    ours: dict[str, float] = {}
    theirs: dict[str, float] = {}
    for side in ("pipeline", *STAGES, *FLOORS, UPLOAD_SETUP, "floor_sum"):
        for suffix, of in (("_min", min), ("_median", statistics.median)):
            name = f"{side}_cpu_ms_per_episode{suffix}"
            ours[name] = of(per_round[side])
            theirs[name] = of(per_round["prime_runs"])
    return {"otel": ours, "sdk": theirs}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--episodes", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--size", type=int, default=8000, help="bytes per episode record")
    args = parser.parse_args()

    import prime_runs_otel
    from prime_runs_otel.testing import FakePlatform

    # As in_process.py: compiled once, not afresh in every child.
    compileall.compile_dir(os.path.dirname(prime_runs_otel.__file__), quiet=1)
    print(machine())
    print(
        f"work: {args.episodes} episodes of ~{args.size} bytes, as fast as each side takes "
        f"them, {args.rounds} interleaved rounds, load {os.getloadavg()[0]:.2f}"
    )
    with FakePlatform() as fake:
        env = {
            **{k: v for k, v in os.environ.items() if not k.startswith(("PRIME_", "OTEL_"))},
            **fake.client_env(),
        }
        per_round = measure(args, env)
    print(f"load after: {os.getloadavg()[0]:.2f}")
    for side, values in per_round.items():
        print(f"rounds of {side}: " + ", ".join(f"{value:.3f}" for value in values) + " ms")
    print_side_by_side("floor", figures(per_round), lambda name: "ms")


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == CHILD_FLAG:
        child_main(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]))
    else:
        main()
