"""Through a collector: producer → OTLP/gRPC → rotel → OTLP/HTTP → serve →
the fake platform, all on loopback.

Printed: episodes per second end to end (first record to run closed), CPU
seconds per episode in `serve` (its whole process, from /proc), and latency
from recording an episode to the platform's receipt (p50/p99).

    python bench/collector.py [--episodes 5000] [--size 8000]
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from in_process import fresh_copy, machine, percentile

RECIPE = Path(__file__).resolve().parent.parent / "collector-config" / "rotel.env"


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def wait_port(port: int, process: subprocess.Popen[bytes], what: str) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise SystemExit(f"{what} exited early")
        with socket.socket() as probe:
            if probe.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.05)
    raise SystemExit(f"{what} did not start listening")


def cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat", "rb") as handle:
        fields = handle.read().rsplit(b")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def recipe() -> dict[str, str]:
    settings = {}
    for line in RECIPE.read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            name, _, value = line.partition("=")
            settings[name.strip()] = value.strip()
    return settings


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--episodes", type=int, default=5000)
    parser.add_argument("--size", type=int, default=8000)
    args = parser.parse_args()

    import rotel
    from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    import prime_runs_otel as pro
    from prime_runs_otel.synthetic import synthetic_episodes
    from prime_runs_otel.testing import FakePlatform

    print(machine())
    pool = list(synthetic_episodes(1000, seed=3, target_bytes=args.size))
    with FakePlatform() as fake, tempfile.TemporaryDirectory() as root:
        base = {k: v for k, v in os.environ.items() if not k.startswith(("PRIME_", "OTEL_"))}
        http_port = free_port()
        serve = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "prime_runs_otel.serve",
                "--http-port",
                str(http_port),
                "--no-grpc",
                "--spool-dir",
                os.path.join(root, "spool"),
            ],
            env={**base, **fake.client_env()},
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        wait_port(http_port, serve, "serve")
        grpc_port = free_port()
        rotel_env = {
            **{k: v for k, v in base.items() if not k.startswith("ROTEL_")},
            **recipe(),
            "ROTEL_OTLP_GRPC_ENDPOINT": f"127.0.0.1:{grpc_port}",
            "ROTEL_OTLP_HTTP_ENDPOINT": f"127.0.0.1:{free_port()}",
            "ROTEL_OTLP_EXPORTER_ENDPOINT": f"http://127.0.0.1:{http_port}",
            "ROTEL_PID_FILE": os.path.join(root, "rotel.pid"),
            "ROTEL_LOG_FILE": os.path.join(root, "rotel.log"),
        }
        collector = subprocess.Popen(
            [str(Path(rotel.__file__).parent / "rotel-agent"), "start"],
            env=rotel_env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        wait_port(grpc_port, collector, "rotel")
        try:
            resource = pro.run_resource(name="bench-collector", environments=["bench-env"])
            provider = TracerProvider(resource=resource)
            exporter = OTLPSpanExporter(endpoint=f"127.0.0.1:{grpc_port}", insecure=True)
            provider.add_span_processor(
                BatchSpanProcessor(exporter, max_queue_size=65536, max_export_batch_size=256)
            )
            tracer = provider.get_tracer("bench")
            recorded: dict[str, float] = {}
            serve_cpu0 = cpu_seconds(serve.pid)
            started = time.perf_counter()
            pro.emit_run_start(tracer, {})
            for number in range(args.episodes):
                record = fresh_copy(pool[number % len(pool)], number)
                recorded[record["id"]] = time.time()
                pro.record_episode(tracer, record)
            pro.emit_run_end(tracer, "completed", episodes_recorded=args.episodes)
            provider.force_flush(600_000)
            platform_run: Any = None
            deadline = time.monotonic() + 1800
            while time.monotonic() < deadline:
                runs = fake.runs()
                if runs and runs[0].closed:
                    platform_run = runs[0]
                    break
                time.sleep(0.05)
            elapsed = time.perf_counter() - started
            serve_cpu = cpu_seconds(serve.pid) - serve_cpu0
            provider.shutdown()
        finally:
            collector.send_signal(signal.SIGTERM)
            serve.send_signal(signal.SIGTERM)
            collector.wait(30)
            serve.wait(60)
        if platform_run is None:
            raise SystemExit("the run did not close on the platform")
        delivered = len(fake.episodes(platform_run.id))
        received: dict[str, float] = {}
        for upload in fake.uploads:
            for episode_id in upload.record_ids:
                received.setdefault(episode_id, upload.received_at)
        latencies = [received[key] - at for key, at in recorded.items() if key in received]

    rate = delivered / elapsed
    print(
        f"\nepisodes recorded {args.episodes}, delivered {delivered}, status {platform_run.status}"
    )
    print(f"{'episodes/s':<28} {rate:>10.1f}")
    print(f"{'serve CPU ms/episode':<28} {1000 * serve_cpu / max(delivered, 1):>10.3f}")
    print(f"{'latency p50 ms':<28} {1000 * percentile(latencies, 0.5):>10.1f}")
    print(f"{'latency p99 ms':<28} {1000 * percentile(latencies, 0.99):>10.1f}")
    print()
    print(f"collector.episodes_per_s {rate:.1f} episodes/s")
    print(f"collector.serve_cpu_per_episode {1000 * serve_cpu / max(delivered, 1):.3f} ms")
    print(f"collector.latency_p50 {1000 * percentile(latencies, 0.5):.1f} ms")
    print(f"collector.latency_p99 {1000 * percentile(latencies, 0.99):.1f} ms")
    print(f"collector.delivered {delivered} episodes")


if __name__ == "__main__":
    main()
