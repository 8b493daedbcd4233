"""A fleet under fire, for ``test_fleet_soak.py`` (short, in the suite) and
``make soak-fleet`` (long): producers → the load balancer (loadbalancer.yaml)
→ gateway.yaml + ``serve`` backends sharing a fleet folder → the fake
platform, with random kill -9 of a serve, a gateway or the load balancer,
and a backend added and another removed mid-run.

The producers stand in for agent collectors: each request is sent again
until the load balancer acknowledges it, so everything a producer recorded
was handed to the fleet, and the books must balance exactly per run: every
episode sent is delivered, none twice, one platform run, closed with the
status its producer ended it with.
"""

from __future__ import annotations

import random
import signal
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from test_collector_config import CONFIG_DIR
from test_otelcol import TOKEN, Otelcol, fast_retries, overlay
from test_receiver import ENVIRONMENT, ServeProcess, serve_env, wait_for

from prime_runs_otel import emit_run_end, emit_run_start, record_episode, run_resource
from prime_runs_otel.produce.synthetic import synthetic_episodes
from prime_runs_otel.testing import FakePlatform

EXPORT = "/opentelemetry.proto.collector.trace.v1.TraceService/Export"


@dataclass
class Backend:
    """One tier-2 backend: a gateway in front of its own serve."""

    name: str
    serve: ServeProcess
    gateway: Otelcol


@dataclass
class SoakRun:
    """One run a producer feeds: its spans cut into requests, and how it ends."""

    name: str
    kind: str
    status: str
    records: list[dict[str, Any]]
    requests: list[bytes] = field(default_factory=list)


@dataclass
class Plan:
    runs: int = 6
    episodes: int = 40
    spans_per_request: int = 24
    #: Seconds between two blows (a kill, a backend added or removed).
    blow_every: float = 1.5
    #: Seconds a producer waits between two requests.
    pace: float = 0.05
    seed: int = 1


class Fleet:
    """The processes of the soak, started and stopped together."""

    def __init__(self, root: Path, platform: FakePlatform) -> None:
        self.root = root
        self.platform = platform
        self.fleet_dir = root / "fleet"
        self.backends: list[Backend] = []
        self.routed: list[Backend] = []
        self.balancer: Otelcol | None = None
        self.log: list[str] = []
        self._lock = threading.Lock()

    # -- processes -------------------------------------------------------------------

    def add_backend(self) -> Backend:
        name = f"backend-{len(self.backends) + 1}"
        home = self.root / name
        (home / "home").mkdir(parents=True)
        env = serve_env(home, self.platform)
        serve = ServeProcess(
            home,
            env,
            "--token",
            TOKEN,
            "--fleet-dir",
            str(self.fleet_dir),
            "--fleet-name",
            name,
            "--straggler-wait",
            "30",
        ).start()
        gateway = Otelcol(
            self.root,
            f"{name}-gateway",
            [CONFIG_DIR / "gateway.yaml", fast_retries(self.root, name, "otlphttp/serve")],
            {"PRIME_RUNS_OTEL_SERVE_URL": serve.url, "PRIME_RUNS_OTEL_SERVE_TOKEN": TOKEN},
        ).start()
        backend = Backend(name, serve, gateway)
        self.backends.append(backend)
        return backend

    def start_balancer(self, routed: Sequence[Backend]) -> None:
        """(Re)start the load balancer routing to ``routed``, on its port
        and disk queue: a new backend list is a restart with a new file."""
        self.routed = list(routed)
        lists = overlay(
            self.root,
            f"balancer-{len(self.log)}",
            {
                "exporters": {
                    "loadbalancing": {
                        "retry_on_failure": {"initial_interval": "100ms", "max_interval": "1s"},
                        "resolver": {
                            "dns": None,
                            "static": {"hostnames": [b.gateway.endpoint for b in routed]},
                        },
                    }
                }
            },
        )
        if self.balancer is None:
            self.balancer = Otelcol(
                self.root,
                "balancer",
                [CONFIG_DIR / "loadbalancer.yaml", lists],
                {
                    "PRIME_RUNS_OTEL_BACKENDS_DNS": "localhost",
                    "PRIME_RUNS_OTEL_BACKENDS_INSECURE": "true",
                },
            )
        else:
            self.balancer.kill()
            self.balancer.configs[1] = lists
        self.balancer.start()

    def stop(self) -> None:
        if self.balancer is not None:
            self.balancer.stop()
        for backend in self.backends:
            backend.gateway.stop()
            if backend.serve.process is not None:
                backend.serve.stop(signal.SIGKILL)

    # -- blows -----------------------------------------------------------------------

    def blow(self, chance: random.Random, added: list[bool]) -> str:
        """One random blow: kill -9 a serve, a gateway or the load balancer
        (each restarted at once, as a supervisor would), or, once each, add
        a backend or take one out of the load balancer's list."""
        options = ["serve", "gateway", "balancer"]
        if not added[0]:
            options.append("add")
        elif not added[1] and len(self.routed) > 1:
            options.append("remove")
        what = chance.choice(options)
        if what == "serve":
            backend = chance.choice(self.backends)
            backend.serve.stop(signal.SIGKILL)
            backend.serve.start()
            done = f"kill -9 {backend.name} serve"
        elif what == "gateway":
            backend = chance.choice(self.backends)
            backend.gateway.kill()
            backend.gateway.start()
            done = f"kill -9 {backend.name} gateway"
        elif what == "balancer":
            self.start_balancer(self.routed)
            done = "kill -9 the load balancer"
        elif what == "add":
            added[0] = True
            backend = self.add_backend()
            self.start_balancer([*self.routed, backend])
            done = f"add {backend.name}"
        else:
            added[1] = True
            leaving = chance.choice(self.routed)
            self.start_balancer([b for b in self.routed if b is not leaving])
            done = f"remove {leaving.name} from the load balancer (it drains)"
        self.log.append(done)
        return done


# -- producing -----------------------------------------------------------------------


def soak_runs(plan: Plan) -> list[SoakRun]:
    """Eval and training runs; one of them ends failed."""
    runs = []
    for number in range(plan.runs):
        kind = "train" if number % 3 == 2 else "eval"
        status = "failed" if number == 1 else "completed"
        records = list(synthetic_episodes(plan.episodes, seed=plan.seed * 1000 + number))
        for record in records:
            record["id"] = f"soak-{plan.seed}-{number}-{record['id']}"
        run = SoakRun(f"soak-{plan.seed}-{number}-{kind}", kind, status, records)
        run.requests = _requests(run, plan.spans_per_request)
        runs.append(run)
    return runs


def _requests(run: SoakRun, size: int) -> list[bytes]:
    """The run's spans as a producer emits them, cut into export requests;
    the end is the last request, as a producer sends it."""
    options: dict[str, Any] = {}
    if run.kind == "train":
        options = {"kind": "train", "model": "base/policy", "team_id": "team-soak", "max_steps": 9}
    resource = run_resource(run_id=run.name, name=run.name, environments=[ENVIRONMENT], **options)
    memory = InMemorySpanExporter()
    provider = TracerProvider(resource=resource)
    provider.add_span_processor(SimpleSpanProcessor(memory))
    tracer = provider.get_tracer("soak")
    emit_run_start(tracer, {"soak": run.name})
    for record in run.records:
        record_episode(tracer, record)
    error = "diverged" if run.status == "failed" else None
    emit_run_end(tracer, run.status, error, episodes_recorded=len(run.records))
    provider.shutdown()
    spans: list[ReadableSpan] = list(memory.get_finished_spans())
    body, end = spans[:-1], spans[-1:]
    chunks = [body[i : i + size] for i in range(0, len(body), size)]
    return [encode_spans(chunk).SerializeToString() for chunk in [*chunks, end]]


def produce(endpoint: str, run: SoakRun, pace: float, deadline: float) -> None:
    """Send every request until the load balancer acknowledges it."""
    channel = grpc.insecure_channel(endpoint)
    export = channel.unary_unary(EXPORT, request_serializer=None, response_deserializer=None)
    try:
        for body in run.requests:
            while True:
                assert time.monotonic() < deadline, f"{run.name}: the fleet never took a request"
                try:
                    export(body, timeout=10)
                    break
                except grpc.RpcError:
                    time.sleep(0.2)
            time.sleep(pace)
    finally:
        channel.close()


# -- the whole soak --------------------------------------------------------------------


def soak(root: Path, platform: FakePlatform, plan: Plan, *, budget: float) -> list[str]:
    """Run the soak; returns what was done to the fleet. Fails (with what
    happened) when a run's books do not balance or time runs out."""
    chance = random.Random(plan.seed)
    deadline = time.monotonic() + budget
    fleet = Fleet(root, platform)
    try:
        first = [fleet.add_backend(), fleet.add_backend()]
        fleet.start_balancer(first)
        assert fleet.balancer is not None
        runs = soak_runs(plan)
        producers = [
            threading.Thread(
                target=produce, args=(fleet.balancer.endpoint, run, plan.pace, deadline)
            )
            for run in runs
        ]
        for producer in producers:
            producer.start()
        added = [False, False]
        while any(producer.is_alive() for producer in producers) or not all(added):
            time.sleep(plan.blow_every)
            fleet.blow(chance, added)
        for producer in producers:
            producer.join()
        for run in runs:
            check_books(platform, run, deadline, fleet.log)
        return fleet.log
    finally:
        fleet.stop()


def check_books(platform: FakePlatform, run: SoakRun, deadline: float, log: Sequence[str]) -> None:
    """One platform run, closed with its status, every episode once."""
    happened = "; ".join(log)

    def closed() -> Any:
        found = [r for r in platform.runs() if r.name == run.name]
        return found if found and all(r.closed for r in found) else None

    found = wait_for(closed, max(1.0, deadline - time.monotonic()), f"{run.name} to close")
    assert len(found) == 1, f"{run.name}: {len(found)} platform runs after: {happened}"
    [platform_run] = found
    expected = "COMPLETED" if run.status == "completed" else "FAILED"
    assert platform_run.status == expected, f"{run.name}: {platform_run.status} after: {happened}"
    delivered = sorted(episode["id"] for episode in platform.episodes(platform_run.id))
    assert delivered == sorted(r["id"] for r in run.records), (
        f"{run.name}: {len(delivered)} of {len(run.records)} delivered after: {happened}"
    )
    twice = {k: n for k, n in platform.episode_deliveries(platform_run.id).items() if n != 1}
    assert not twice, f"{run.name}: delivered more than once: {twice} after: {happened}"


def plan_from(options: Callable[[str, str], str]) -> Plan:
    """A plan from settings read by name (environment variables of ``make soak-fleet``)."""
    return Plan(
        runs=int(options("runs", "6")),
        episodes=int(options("episodes", "40")),
        blow_every=float(options("blow_every", "1.5")),
        seed=int(options("seed", "1")),
    )
