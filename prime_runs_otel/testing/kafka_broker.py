"""A real Apache Kafka broker on loopback, for ``make kafka``, the Kafka tests,
the soak and the bench.

The broker is Apache Kafka's own (``org.apache.kafka:kafka_2.13``), run on
the machine's Java: its jars come from Maven Central through ``mvn
dependency:copy-dependencies`` on ``kafka/pom.xml`` and are cached by version
under ``${XDG_CACHE_HOME:-~/.cache}/prime-runs-otel/kafka-<version>``. A node
is formatted as a KRaft controller and broker in one (no ZooKeeper) and
listens on a free port of 127.0.0.1. ``count`` nodes make a cluster (each a
voter of the quorum), for the replication tests.

    python -m prime_runs_otel.testing.kafka_broker fetch
    python -m prime_runs_otel.testing.kafka_broker start [--dir DIR] [--nodes N]
    python -m prime_runs_otel.testing.kafka_broker stop [--dir DIR]

``start`` prints the bootstrap address last and leaves the broker running
(its pid files in DIR); ``stop`` ends the brokers DIR names.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

#: The broker release the pom names (kept in step with kafka/pom.xml).
KAFKA_VERSION = "4.1.1"
#: A clone's kafka/pom.xml: this module runs from a clone (make, tests).
POM = Path(__file__).resolve().parents[2] / "kafka" / "pom.xml"
#: Memory of one node's JVM: a test broker holds little (~30-50 MB live
#: once the log cleaner's buffer is cut, below), and the machine is shared.
#: Every stop of the serial collector holds every acknowledgement in flight,
#: so the heap is fixed: a heap that grows does so through full collections
#: (120-490 ms on a loaded machine, at start and minutes later). The default
#: proportions keep young pauses short (12-31 ms once warm); a large young
#: generation (-Xmn160m) stopped less often but for 40-400 ms each time (the
#: survivors of a large eden to copy). The metaspace starts large enough
#: for the broker's classes (else 2-3 full collections at each start). At
#: 1,000 episodes/s the broker's ack p99 went from 62-81 to 39-41 ms in
#: interleaved rounds on a loaded machine (bench/kafka_ack.py).
HEAP = ("-Xms192m", "-Xmx192m", "-XX:MetaspaceSize=96m")
#: How long a node may take to answer once started (a loaded machine's JVM).
READY_TIMEOUT = 120.0


class BrokerError(RuntimeError):
    """The broker could not be fetched or started; the message says what to do."""


def cache_dir(version: str = KAFKA_VERSION) -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "prime-runs-otel" / f"kafka-{version}"


def fetch(version: str = KAFKA_VERSION) -> Path:
    """The folder of the broker's jars, fetched once per version.

    Fetched into a temporary folder renamed into place, so a fetch cut
    half-way is never taken for a complete one, and two fetches at once
    (test workers) both end with the same complete folder.
    """
    target = cache_dir(version)
    if (target / "complete").exists():
        return target
    if shutil.which("java") is None:
        raise BrokerError(
            "java is not on PATH: the Kafka broker runs on Java 17 or later "
            "(Debian: apt-get install openjdk-17-jre-headless)"
        )
    if shutil.which("mvn") is None:
        raise BrokerError(
            "mvn is not on PATH: the broker's jars are fetched from Maven Central with it "
            "(Debian: apt-get install maven)"
        )
    if not POM.exists():
        raise BrokerError(f"{POM} is missing: run this from a clone of the repository")
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f"kafka-{version}.", dir=target.parent))
    command = [
        "mvn",
        "-q",
        "-B",
        "-f",
        str(POM),
        f"-Dkafka.version={version}",
        "dependency:copy-dependencies",
        f"-DoutputDirectory={staging / 'libs'}",
    ]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        shutil.rmtree(staging, ignore_errors=True)
        raise BrokerError(
            f"fetching the Kafka broker's jars failed ({' '.join(command)}):\n"
            f"{(done.stdout + done.stderr)[-3000:]}"
        )
    (staging / "complete").write_text(version)
    try:
        staging.rename(target)
    except OSError:  # another fetch finished first: its folder is as good
        shutil.rmtree(staging, ignore_errors=True)
    return target


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@dataclass
class Node:
    """One KRaft node (controller and broker) of a cluster."""

    node_id: int
    port: int
    controller_port: int
    directory: Path
    process: subprocess.Popen[bytes] | None = None
    #: JVM options after the defaults (a bench's variant of the broker).
    java_options: tuple[str, ...] = ()

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def pid_file(self) -> Path:
        return self.directory / "pid"


@dataclass
class Cluster:
    """``count`` nodes on loopback; ``bootstrap`` is what clients are given."""

    directory: Path
    nodes: list[Node] = field(default_factory=list)

    @property
    def bootstrap(self) -> str:
        return ",".join(node.address for node in self.nodes)

    def kill(self, node: Node) -> None:
        """``kill -9`` of one node (the replication tests)."""
        if node.process is not None and node.process.poll() is None:
            node.process.kill()
            node.process.wait()

    def stop(self) -> None:
        for node in self.nodes:
            stop_node(node)


def _properties(
    node: Node, voters: str, replicas: int, extra: Mapping[str, str] | None = None
) -> str:
    insync = 2 if replicas >= 3 else 1
    # The last of a repeated key wins in a Java properties file.
    overrides = [f"{key}={value}" for key, value in (extra or {}).items()]
    return "\n".join(
        [
            "process.roles=broker,controller",
            f"node.id={node.node_id}",
            f"controller.quorum.voters={voters}",
            f"listeners=PLAINTEXT://127.0.0.1:{node.port},"
            f"CONTROLLER://127.0.0.1:{node.controller_port}",
            f"advertised.listeners=PLAINTEXT://127.0.0.1:{node.port}",
            "controller.listener.names=CONTROLLER",
            "inter.broker.listener.name=PLAINTEXT",
            "listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
            f"log.dirs={node.directory / 'data'}",
            f"offsets.topic.replication.factor={replicas}",
            "offsets.topic.num.partitions=4",
            f"transaction.state.log.replication.factor={replicas}",
            f"transaction.state.log.min.isr={insync}",
            "transaction.state.log.num.partitions=4",
            f"default.replication.factor={replicas}",
            f"min.insync.replicas={insync}",
            # A group forms at once (tests start members one after another).
            "group.initial.rebalance.delay.ms=0",
            # Records of a whole OTLP request may be large (serve's own cap applies).
            "message.max.bytes=67108864",
            "replica.fetch.max.bytes=67108864",
            # Loopback test brokers: few threads, little memory.
            "num.network.threads=2",
            "num.io.threads=4",
            "log.segment.bytes=67108864",
            # The cleaner of compacted topics (the fleet's run table, the
            # offsets) allocates this buffer on the heap at once: 128 MB by
            # default, most of the heap of a broker that compacts kilobytes.
            "log.cleaner.dedupe.buffer.size=16777216",
            *overrides,
            "",
        ]
    )


def start(
    directory: Path | None = None,
    count: int = 1,
    *,
    java_options: Sequence[str] = (),
    properties: Mapping[str, str] | None = None,
) -> Cluster:
    """Format and start ``count`` nodes; returns once every one answers.

    ``java_options`` and ``properties`` come after the defaults (the later
    wins): the bench compares variants of the broker with them."""
    libs = fetch() / "libs"
    root = Path(directory or tempfile.mkdtemp(prefix="kafka-broker."))
    root.mkdir(parents=True, exist_ok=True)
    nodes = [
        Node(
            index + 1,
            free_port(),
            free_port(),
            root / f"node-{index + 1}",
            java_options=tuple(java_options),
        )
        for index in range(count)
    ]
    voters = ",".join(f"{node.node_id}@127.0.0.1:{node.controller_port}" for node in nodes)
    cluster_id = _cluster_id()
    cluster = Cluster(root, nodes)
    (root / "bootstrap").write_text(cluster.bootstrap)
    for node in nodes:
        node.directory.mkdir(parents=True, exist_ok=True)
        config = node.directory / "server.properties"
        config.write_text(_properties(node, voters, min(count, 3), properties))
        _java(libs, ["kafka.tools.StorageTool", "format", "-t", cluster_id, "-c", str(config)])
    try:
        for node in nodes:
            _launch(node, libs)
        for node in nodes:
            wait_ready(node)
    except BaseException:
        cluster.stop()
        raise
    return cluster


def _cluster_id() -> str:
    """A KRaft cluster id (a base64 UUID), never one that starts with "-",
    which the storage tool's command line would take for an option."""
    while True:
        cluster_id = base64.urlsafe_b64encode(uuid.uuid4().bytes).rstrip(b"=").decode()
        if not cluster_id.startswith("-"):
            return cluster_id


def restart(cluster: Cluster, node: Node) -> None:
    """Start a killed node again on its own data (the same ports)."""
    _launch(node, fetch() / "libs")
    wait_ready(node)


def _launch(node: Node, libs: Path) -> None:
    """Start one broker process on its formatted directory, its output in
    ``broker.log`` and its pid written down for ``make kafka-stop``."""
    with (node.directory / "broker.log").open("ab") as log:
        node.process = subprocess.Popen(
            [
                *_java_command(libs, node.java_options),
                "kafka.Kafka",
                str(node.directory / "server.properties"),
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    node.pid_file.write_text(str(node.process.pid))


def _java_command(libs: Path, options: Sequence[str] = ()) -> list[str]:
    return [
        "java",
        *HEAP,
        # G1 and the parallel collector paused no less on two shared cores
        # (G1's remarks, its concurrent threads competing with the broker).
        "-XX:+UseSerialGC",
        "-Djava.awt.headless=true",
        # slf4j-simple: warnings and worse only, to the log file.
        "-Dorg.slf4j.simpleLogger.defaultLogLevel=warn",
        *options,
        "-cp",
        f"{libs}/*",
    ]


def _java(libs: Path, arguments: Sequence[str]) -> None:
    done = subprocess.run(
        [*_java_command(libs), *arguments], capture_output=True, text=True, check=False
    )
    if done.returncode != 0:
        raise BrokerError(
            f"{arguments[0]} failed ({done.returncode}): {(done.stdout + done.stderr)[-2000:]}"
        )


def wait_ready(node: Node, timeout: float = READY_TIMEOUT) -> None:
    """Until the node answers a metadata request as a broker (a port that
    accepts connections is not yet a broker that serves)."""
    deadline = time.monotonic() + timeout
    last = "no answer yet"
    while time.monotonic() < deadline:
        if node.process is not None and node.process.poll() is not None:
            raise BrokerError(
                f"the Kafka node {node.node_id} exited ({node.process.returncode}); its log: "
                f"{_tail(node.directory / 'broker.log')}"
            )
        try:
            if _answers_metadata(node.address):
                return
        except Exception as exc:
            last = str(exc)
        time.sleep(0.2)
    raise BrokerError(
        f"the Kafka node {node.node_id} did not answer within {timeout:g}s ({last}); its log: "
        f"{_tail(node.directory / 'broker.log')}"
    )


def _answers_metadata(address: str) -> bool:
    host, port = address.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=2):
        pass  # the port first: a client would log every refused connection
    from confluent_kafka.admin import AdminClient

    admin = AdminClient({"bootstrap.servers": address, "socket.timeout.ms": 2000, "log_level": 0})
    metadata = admin.list_topics(timeout=2)
    return bool(metadata.brokers)


def _tail(path: Path) -> str:
    try:
        return path.read_text(errors="replace")[-2000:]
    except OSError:
        return "(none)"


def stop_node(node: Node) -> None:
    if node.process is not None:
        if node.process.poll() is None:
            node.process.terminate()
            try:
                node.process.wait(30)
            except subprocess.TimeoutExpired:
                node.process.kill()
                node.process.wait()
        return
    with contextlib.suppress(OSError, ValueError):
        pid = int(node.pid_file.read_text())
        os.kill(pid, signal.SIGTERM)


def stop_directory(directory: Path) -> int:
    """Stop the nodes a ``start`` left in ``directory``; how many there were."""
    stopped = 0
    for pid_file in sorted(directory.glob("node-*/pid")):
        with contextlib.suppress(OSError, ValueError):
            pid = int(pid_file.read_text())
            os.kill(pid, signal.SIGTERM)
            _wait_gone(pid)
            stopped += 1
        pid_file.unlink(missing_ok=True)
    return stopped


def _wait_gone(pid: int, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except OSError:
            return
        time.sleep(0.1)
    with contextlib.suppress(OSError):
        os.kill(pid, signal.SIGKILL)


def default_directory() -> Path:
    return cache_dir() / "run"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m prime_runs_otel.testing.kafka_broker")
    parser.add_argument("command", choices=["fetch", "start", "stop"])
    parser.add_argument("--dir", type=Path, default=None, help="where the nodes keep their data")
    parser.add_argument("--nodes", type=int, default=1, help="nodes of the cluster (start)")
    args = parser.parse_args(argv)
    directory = args.dir or default_directory()
    try:
        if args.command == "fetch":
            print(fetch())
        elif args.command == "start":
            if any(directory.glob("node-*/pid")):
                stop_directory(directory)
            shutil.rmtree(directory, ignore_errors=True)
            cluster = start(directory, args.nodes)
            print(
                f"Kafka {KAFKA_VERSION} is running (data in {directory}); stop it with "
                "`make kafka-stop`. Bootstrap address:"
            )
            print(cluster.bootstrap)
        else:
            count = stop_directory(directory)
            print(f"stopped {count} Kafka node(s)" if count else "no Kafka node was running")
    except BrokerError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
