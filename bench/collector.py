"""Through a collector: producer → OTLP/gRPC → collector → OTLP/HTTP → serve
→ the fake platform, all on loopback. The collector is rotel (the shipped
rotel.env) and the OpenTelemetry Collector running the shipped gateway.yaml
(its disk queue included) when ``OTELCOL_BIN`` names one (`make bench` builds
it with `make otelcol`).

Two runs on the same episodes:

- live: a producer process records episodes (episode, agent and model-call
  spans) through the SDK's OTLP exporter, sharing the two cores with rotel
  and serve: what one machine running everything achieves.
- replay: the same spans encoded beforehand and sent as fast as rotel takes
  them, so the producer costs next to nothing: what rotel and serve sustain.

The fake platform runs in a process of its own, as the real one runs on
other machines. Printed for each: episodes per second (first send to run
closed), CPU per episode in `serve`, in the collector, in this process (the
producer) and in the fake platform (whole processes, from /proc), and
latency from sending an episode to the platform's receipt (p50/p99).
With ``--rounds`` above 1 each figure is the median of the rounds, with
their range beside it. ``other_processes_cores`` is how many cores the rest
of the machine kept busy meanwhile: the cores are shared, and a busy machine
shows in every figure.

    python bench/collector.py [--episodes 5000] [--size 8000] [--rounds 3]
                              [--collector rotel,otelcol]
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from in_process import fresh_copy, machine, percentile

CONFIG_DIR = Path(__file__).resolve().parent.parent / "collector-config"
RECIPE = CONFIG_DIR / "rotel.env"


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


def _serve_platform(conn: Any) -> None:
    """The fake platform, in a process of its own (see :class:`PlatformProcess`)."""
    from prime_runs_otel.testing import FakePlatform

    with FakePlatform() as fake:
        conn.send(fake.client_env())
        while (request := conn.recv()) is not None:
            name, *args = request
            if name == "runs":
                conn.send(fake.runs())
            elif name == "uploads":
                conn.send(list(fake.uploads))
            else:
                conn.send(len(fake.episodes(*args)))


class PlatformProcess:
    """The fake platform in its own process, as the real one is on other
    machines: its work (taking uploads apart) does not share the producer's
    interpreter. Asked for what it stored over a pipe."""

    def __init__(self) -> None:
        context = multiprocessing.get_context("spawn")
        self._conn, child = context.Pipe()
        self.process = context.Process(target=_serve_platform, args=(child,), daemon=True)
        self.process.start()
        self._env: dict[str, str] = self._conn.recv()

    def _ask(self, *request: Any) -> Any:
        self._conn.send(request)
        return self._conn.recv()

    def client_env(self) -> dict[str, str]:
        return self._env

    def runs(self) -> list[Any]:
        return list(self._ask("runs"))

    @property
    def uploads(self) -> list[Any]:
        return list(self._ask("uploads"))

    def delivered(self, platform_id: str) -> int:
        return int(self._ask("episodes", platform_id))

    def __enter__(self) -> PlatformProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self._conn.send(None)
        self.process.join(10)


class Pipeline:
    """serve and a collector started against a fake platform, torn down on exit."""

    def __init__(self, fake: PlatformProcess, root: str, collector: str) -> None:
        self.name = collector
        self.platform_pid = fake.process.pid
        base = {k: v for k, v in os.environ.items() if not k.startswith(("PRIME_", "OTEL_"))}
        self.http_port = free_port()
        self.serve = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "prime_runs_otel.cli.serve",
                "--http-port",
                str(self.http_port),
                "--no-grpc",
                "--spool-dir",
                os.path.join(root, "spool"),
            ],
            env={**base, **fake.client_env()},
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        wait_port(self.http_port, self.serve, "serve")
        self.grpc_port = free_port()
        if collector == "otelcol":
            self.collector = self._otelcol(base, root)
        else:
            self.collector = self._rotel(base, root)
        wait_port(self.grpc_port, self.collector, collector)

    def _otelcol(self, base: dict[str, str], root: str) -> subprocess.Popen[bytes]:
        """gateway.yaml as shipped; only its addresses, its queue folder and
        the port of its own metrics are set."""
        telemetry = os.path.join(root, "telemetry.yaml")
        with open(telemetry, "w") as handle:
            handle.write(
                "service:\n  telemetry:\n    metrics:\n      readers:\n"
                "        - pull:\n            exporter:\n              prometheus:\n"
                f"                host: 127.0.0.1\n                port: {free_port()}\n"
            )
        env = {
            **base,
            "PRIME_RUNS_OTEL_OTLP_GRPC_ENDPOINT": f"127.0.0.1:{self.grpc_port}",
            "PRIME_RUNS_OTEL_OTLP_HTTP_ENDPOINT": f"127.0.0.1:{free_port()}",
            "PRIME_RUNS_OTEL_HEALTH_ENDPOINT": f"127.0.0.1:{free_port()}",
            "PRIME_RUNS_OTEL_QUEUE_DIR": os.path.join(root, "otelcol-queue"),
            "PRIME_RUNS_OTEL_SERVE_URL": f"http://127.0.0.1:{self.http_port}",
            "PRIME_RUNS_OTEL_SERVE_TOKEN": "",
        }
        return subprocess.Popen(
            [
                os.environ["OTELCOL_BIN"],
                f"--config={CONFIG_DIR / 'gateway.yaml'}",
                f"--config={telemetry}",
            ],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )

    def _rotel(self, base: dict[str, str], root: str) -> subprocess.Popen[bytes]:
        import rotel

        rotel_env = {
            **{k: v for k, v in base.items() if not k.startswith("ROTEL_")},
            **recipe(),
            "ROTEL_OTLP_GRPC_ENDPOINT": f"127.0.0.1:{self.grpc_port}",
            "ROTEL_OTLP_HTTP_ENDPOINT": f"127.0.0.1:{free_port()}",
            "ROTEL_OTLP_EXPORTER_ENDPOINT": f"http://127.0.0.1:{self.http_port}",
            "ROTEL_PID_FILE": os.path.join(root, "rotel.pid"),
            "ROTEL_LOG_FILE": os.path.join(root, "rotel.log"),
        }
        return subprocess.Popen(
            [str(Path(rotel.__file__).parent / "rotel-agent"), "start"],
            env=rotel_env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )

    def cpu(self) -> dict[str, float]:
        """CPU seconds so far of serve, the collector, this process (the
        producer) and the fake platform."""
        return {
            "serve": cpu_seconds(self.serve.pid),
            "collector": cpu_seconds(self.collector.pid),
            "producer": time.process_time(),
            "platform": cpu_seconds(self.platform_pid),
        }

    def cpu_since(self, before: dict[str, float]) -> dict[str, float]:
        return {name: value - before[name] for name, value in self.cpu().items()}

    def stop(self) -> None:
        self.collector.send_signal(signal.SIGTERM)
        self.serve.send_signal(signal.SIGTERM)
        self.collector.wait(30)
        self.serve.wait(60)


def wait_closed(fake: Any, run_key: str) -> Any:
    deadline = time.monotonic() + 1800
    while time.monotonic() < deadline:
        for run in fake.runs():
            marker = (run.metadata or {}).get("prime_runs_otel", {}).get("run_key")
            if marker == run_key and run.closed:
                return run
        time.sleep(0.05)
    raise SystemExit("the run did not close on the platform")


def receipts(fake: Any, platform_id: str) -> dict[str, float]:
    received: dict[str, float] = {}
    for upload in fake.uploads:
        if platform_id in upload.run_ids:
            for episode_id in upload.record_ids:
                received.setdefault(episode_id, upload.received_at)
    return received


def live(fake: Any, pipeline: Pipeline, records: list[dict[str, Any]]) -> dict[str, Any]:
    """Record through the SDK's OTLP exporter while rotel and serve run."""
    from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    import prime_runs_otel as pro

    resource = pro.run_resource(name="bench-collector-live", environments=["bench-env"])
    provider = TracerProvider(resource=resource)
    exporter = OTLPSpanExporter(endpoint=f"127.0.0.1:{pipeline.grpc_port}", insecure=True)
    provider.add_span_processor(
        BatchSpanProcessor(exporter, max_queue_size=65536, max_export_batch_size=256)
    )
    tracer = provider.get_tracer("bench")
    sent: dict[str, float] = {}
    cpu0 = pipeline.cpu()
    started = time.perf_counter()
    pro.emit_run_start(tracer, {})
    for record in records:
        sent[record["id"]] = time.time()
        pro.record_episode(tracer, record)
    pro.emit_run_end(tracer, "completed", episodes_recorded=len(records))
    provider.force_flush(600_000)
    run = wait_closed(fake, str(resource.attributes["prime.run.id"]))
    elapsed = time.perf_counter() - started
    cpu = pipeline.cpu_since(cpu0)
    provider.shutdown()
    return {"run": run, "elapsed": elapsed, "cpu": cpu, "sent": sent}


def replay(fake: Any, pipeline: Pipeline, records: list[dict[str, Any]]) -> dict[str, Any]:
    """Send the same spans, encoded beforehand, as fast as rotel takes them."""
    import grpc
    from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    import prime_runs_otel as pro

    resource = pro.run_resource(name="bench-collector-replay", environments=["bench-env"])
    provider = TracerProvider(resource=resource)
    memory = InMemorySpanExporter()
    provider.add_span_processor(SimpleSpanProcessor(memory))
    tracer = provider.get_tracer("bench")
    pro.emit_run_start(tracer, {})
    for record in records:
        pro.record_episode(tracer, record)
    pro.emit_run_end(tracer, "completed", episodes_recorded=len(records))
    spans = list(memory.get_finished_spans())
    requests = [
        (
            [span.attributes.get("prime.episode.id") for span in spans[i : i + 256]],
            encode_spans(spans[i : i + 256]).SerializeToString(),
        )
        for i in range(0, len(spans), 256)
    ]
    channel = grpc.insecure_channel(f"127.0.0.1:{pipeline.grpc_port}")
    export = channel.unary_unary(
        "/opentelemetry.proto.collector.trace.v1.TraceService/Export",
        request_serializer=None,
        response_deserializer=None,
    )
    sent: dict[str, float] = {}
    cpu0 = pipeline.cpu()
    started = time.perf_counter()
    for episode_ids, body in requests:
        now = time.time()
        sent.update((str(key), now) for key in episode_ids if key)
        export(body, timeout=60)
    run = wait_closed(fake, str(resource.attributes["prime.run.id"]))
    elapsed = time.perf_counter() - started
    cpu = pipeline.cpu_since(cpu0)
    channel.close()
    return {"run": run, "elapsed": elapsed, "cpu": cpu, "sent": sent}


def machine_busy_seconds() -> float:
    """CPU seconds every process of the machine used so far (``/proc/stat``)."""
    with open("/proc/stat") as handle:
        user, nice, system, _idle, _iowait, irq, softirq, steal = map(
            int, handle.readline().split()[1:9]
        )
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


def measure_round(
    fake: PlatformProcess,
    pipeline: Pipeline,
    pool: list[dict[str, Any]],
    mode: str,
    count: int,
    round_number: int,
) -> dict[str, float]:
    """One run of ``count`` episodes in ``mode`` (live or replay), its figures."""
    measure = live if mode == "live" else replay
    records = [fresh_copy(pool[n % len(pool)], n) for n in range(count)]
    for record in records:
        record["id"] = f"{mode}{round_number}-{record['id']}"
    busy = machine_busy_seconds()
    started = time.perf_counter()
    done = measure(fake, pipeline, records)
    # Cores that processes other than the pipeline's kept busy meanwhile: the
    # two cores are shared, and what others take shows in every figure.
    ours = sum(done["cpu"].values())
    others = max(0.0, machine_busy_seconds() - busy - ours) / (time.perf_counter() - started)
    delivered = fake.delivered(done["run"].id)
    received = receipts(fake, done["run"].id)
    latencies = [received[k] - at for k, at in done["sent"].items() if k in received]
    print(
        f"{pipeline.name}.{mode}: {len(records)} episodes sent, {delivered} delivered, "
        f"run {done['run'].status}, {delivered / done['elapsed']:.0f} episodes/s, "
        f"other processes {others:.2f} cores",
        file=sys.stderr,
    )
    return {
        "episodes_per_s": delivered / done["elapsed"],
        **{
            f"{part}_cpu_ms_per_episode": 1000 * seconds / max(delivered, 1)
            for part, seconds in done["cpu"].items()
        },
        "latency_p50_ms": 1000 * percentile(latencies, 0.5),
        "latency_p99_ms": 1000 * percentile(latencies, 0.99),
        "delivered": float(delivered),
        "other_processes_cores": others,
    }


def cell(values: list[float]) -> str:
    """The median of ``values``, and their range when there are several."""
    low, high = min(values), max(values)
    text = f"{statistics.median(values):.2f}"
    if len(values) == 1:
        return text
    digits = 0 if low >= 10 else 2
    return f"{text} ({low:.{digits}f}-{high:.{digits}f})"


def print_table(rounds: dict[str, list[dict[str, float]]]) -> None:
    """Medians side by side, each with the range of its rounds; then one
    ``name value unit`` line per median for scripts."""
    names = list(rounds)
    width = 22
    print("\n" + f"{'figure':<28}" + "".join(f"{name:>{width}}" for name in names))
    for figure in rounds[names[0]][0]:
        cells = [cell([one[figure] for one in rounds[name]]) for name in names]
        print(f"{figure:<28}" + "".join(f"{text:>{width}}" for text in cells))
    print()
    units = {
        "episodes_per_s": "episodes/s",
        "delivered": "episodes",
        "other_processes_cores": "cores",
    }
    for name, measured in rounds.items():
        for figure in measured[0]:
            median = statistics.median(one[figure] for one in measured)
            print(f"collector.{name}.{figure} {median:.3f} {units.get(figure, 'ms')}".rstrip())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--episodes", type=int, default=5000)
    parser.add_argument("--size", type=int, default=8000)
    parser.add_argument("--rounds", type=int, default=1, help="runs of each mode (median, range)")
    parser.add_argument(
        "--collector",
        default="rotel,otelcol" if os.environ.get("OTELCOL_BIN") else "rotel",
        help="comma-separated: rotel, otelcol (needs OTELCOL_BIN; default: both when set)",
    )
    args = parser.parse_args()
    collectors = [name.strip() for name in args.collector.split(",") if name.strip()]
    if "otelcol" in collectors and not os.environ.get("OTELCOL_BIN"):
        raise SystemExit("--collector otelcol needs OTELCOL_BIN: run `make otelcol` for one")

    from prime_runs_otel.produce.synthetic import synthetic_episodes

    print(machine())
    pool = list(synthetic_episodes(1000, seed=3, target_bytes=args.size))
    rounds: dict[str, list[dict[str, float]]] = {}
    for collector in collectors:
        with PlatformProcess() as fake, tempfile.TemporaryDirectory() as root:
            pipeline = Pipeline(fake, root, collector)
            try:
                for mode in ("live", "replay"):
                    rounds[f"{collector}.{mode}"] = [
                        measure_round(fake, pipeline, pool, mode, args.episodes, number)
                        for number in range(args.rounds)
                    ]
            finally:
                pipeline.stop()
    print_table(rounds)


if __name__ == "__main__":
    main()
