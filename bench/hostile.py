"""serve under hostile bodies: what each costs it, and what an honest request
waits behind them.

- gzip members: a body of empty gzip members, then the real request: CPU
  seconds of serve to answer it (inflation must be linear in the body).
- wide trace: one trace with many record-less episode spans and as many
  model-call spans: CPU seconds of serve until every episode is synthesised.
- tiny attributes: concurrent bodies made of nothing but tiny attributes (the
  worst memory expansion a decoded body has): peak RSS of serve, with the
  default decode budget and with none to speak of.
- a gzip bomb of empty attributes: one small gzip body that inflates to a
  few hundred MiB of two-byte attributes: peak RSS of serve, and how long an
  honest request sent beside it takes.

Each also reports how long an honest one-episode request took meanwhile.

    python bench/hostile.py [--mib 8] [--episodes 3000] [--bodies 4]
"""

from __future__ import annotations

import argparse
import gzip
import os
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from collector import cpu_seconds, free_port, wait_port

PROTOBUF = {"content-type": "application/x-protobuf"}


def start_serve(root: str, *args: str) -> tuple[object, int]:
    import subprocess

    base = {k: v for k, v in os.environ.items() if not k.startswith(("PRIME_", "OTEL_"))}
    port = free_port()
    serve = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "prime_runs_otel.cli.serve",
            "--http-port",
            str(port),
            "--no-grpc",
            "--settle-seconds",
            "0.2",
            "--spool-dir",
            os.path.join(root, f"spool-{port}"),
            *args,
        ],
        env={**base, "PRIME_RUNS_MODE": "local"},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    wait_port(port, serve, "serve")
    return serve, port


def peak_rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return 0.0


def request(spans: list[tuple[int, int, int | None, dict[str, AnyValue]]]) -> bytes:
    body = ExportTraceServiceRequest()
    resource_spans = body.resource_spans.add()
    resource_spans.resource.attributes.add(
        key="prime.run.id", value=AnyValue(string_value="bench-hostile")
    )
    scope = resource_spans.scope_spans.add()
    for trace, span_id, parent, attributes in spans:
        span = scope.spans.add()
        span.name = "span"
        span.trace_id = trace.to_bytes(16, "big")
        span.span_id = span_id.to_bytes(8, "big")
        if parent is not None:
            span.parent_span_id = parent.to_bytes(8, "big")
        span.start_time_unix_nano = 1
        span.end_time_unix_nano = 2
        span.attributes.extend(KeyValue(key=k, value=v) for k, v in attributes.items())
    return body.SerializeToString()


def honest_wait(port: int) -> float:
    """Seconds an honest one-span request takes now."""
    body = request([(99, 1, None, {"a": AnyValue(string_value="b")})])
    started = time.monotonic()
    httpx.post(f"http://127.0.0.1:{port}/v1/traces", content=body, headers=PROTOBUF, timeout=600)
    return time.monotonic() - started


def gzip_members(root: str, mib: int) -> None:
    serve, port = start_serve(root)
    member = gzip.compress(b"")
    body = member * (mib * 1024 * 1024 // len(member)) + gzip.compress(request([]))
    before = cpu_seconds(serve.pid)  # type: ignore[attr-defined]
    started = time.monotonic()
    answer = httpx.post(
        f"http://127.0.0.1:{port}/v1/traces",
        content=body,
        headers={**PROTOBUF, "content-encoding": "gzip"},
        timeout=600,
    )
    took = time.monotonic() - started
    cpu = cpu_seconds(serve.pid) - before  # type: ignore[attr-defined]
    print(
        f"gzip members: {len(body) / 2**20:.1f} MiB of empty members -> {answer.status_code} "
        f"in {took:.2f} s, serve CPU {cpu:.2f} s"
    )
    serve.terminate()  # type: ignore[attr-defined]
    serve.wait()  # type: ignore[attr-defined]


def wide_trace(root: str, episodes: int) -> None:
    serve, port = start_serve(root)
    chat = {"gen_ai.operation.name": AnyValue(string_value="chat")}
    spans = [
        (1, 10 + index, None, {"prime.episode.example_id": AnyValue(string_value=str(index))})
        for index in range(episodes)
    ]
    spans += [(1, 10 + episodes + index, 10 + index, chat) for index in range(episodes)]
    before = cpu_seconds(serve.pid)  # type: ignore[attr-defined]
    httpx.post(
        f"http://127.0.0.1:{port}/v1/traces", content=request(spans), headers=PROTOBUF, timeout=600
    )
    time.sleep(1.0)  # past the settle time: the release loop synthesises them
    waited = honest_wait(port)
    cpu = cpu_seconds(serve.pid) - before  # type: ignore[attr-defined]
    print(
        f"wide trace: {episodes} record-less episodes and {episodes} calls in one trace, "
        f"serve CPU {cpu:.2f} s; an honest request after them took {waited:.2f} s"
    )
    serve.terminate()  # type: ignore[attr-defined]
    serve.wait()  # type: ignore[attr-defined]


def tiny_attributes(root: str, bodies: int, mib: int) -> None:
    attributes = {f"k{index}": AnyValue(int_value=index) for index in range(100)}
    count = mib * 1024 * 1024 // 1000
    body = request([(2, 1 + index, None, attributes) for index in range(count)])
    for label, args in (("default budget", ()), ("no budget", ("--memory-mib", "1000000"))):
        serve, port = start_serve(root, *args)
        threads = [
            threading.Thread(
                target=httpx.post,
                args=(f"http://127.0.0.1:{port}/v1/traces",),
                kwargs={"content": body, "headers": PROTOBUF, "timeout": 600},
            )
            for _ in range(bodies)
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        peak = peak_rss_mib(serve.pid)  # type: ignore[attr-defined]
        print(
            f"tiny attributes, {label}: {bodies} concurrent bodies of {len(body) / 2**20:.0f} "
            f"MiB -> peak RSS of serve {peak:.0f} MiB"
        )
        serve.terminate()  # type: ignore[attr-defined]
        serve.wait()  # type: ignore[attr-defined]


def gzip_empty_attributes(root: str, mib: int) -> None:
    body = ExportTraceServiceRequest()
    resource_spans = body.resource_spans.add()
    resource_spans.resource.attributes.add(
        key="prime.run.id", value=AnyValue(string_value="bench-hostile")
    )
    scope = resource_spans.scope_spans.add()
    per_span = 100_000
    for index in range(mib * 1024 * 1024 // (2 * per_span)):
        target = scope.spans.add(name="span", span_id=(index + 1).to_bytes(8, "big"))
        target.trace_id = (3).to_bytes(16, "big")
        target.attributes.extend(KeyValue() for _ in range(per_span))
    compressed = gzip.compress(body.SerializeToString(), 9)
    serve, port = start_serve(root)
    bomb = threading.Thread(
        target=httpx.post,
        args=(f"http://127.0.0.1:{port}/v1/traces",),
        kwargs={
            "content": compressed,
            "headers": {**PROTOBUF, "content-encoding": "gzip"},
            "timeout": 600,
        },
    )
    bomb.start()
    waited = 0.0
    while bomb.is_alive():  # the longest an honest request waited meanwhile
        waited = max(waited, honest_wait(port))
        time.sleep(0.2)
    bomb.join()
    peak = peak_rss_mib(serve.pid)  # type: ignore[attr-defined]
    print(
        f"gzip bomb of empty attributes: {len(compressed) / 1024:.0f} KiB gzip "
        f"({mib} MiB inflated) -> peak RSS of serve {peak:.0f} MiB; honest requests "
        f"beside it took up to {waited:.2f} s"
    )
    serve.terminate()  # type: ignore[attr-defined]
    serve.wait()  # type: ignore[attr-defined]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mib", type=int, default=8)
    parser.add_argument("--episodes", type=int, default=3000)
    parser.add_argument("--bodies", type=int, default=4)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as root:
        gzip_members(root, args.mib)
        wide_trace(root, args.episodes)
        tiny_attributes(root, args.bodies, args.mib * 4)
        gzip_empty_attributes(root, args.mib * 25)


if __name__ == "__main__":
    main()
