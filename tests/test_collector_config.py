"""Lint every collector config shipped in collector-config/: each states the
collector release it is pinned to, uses only components that the
distribution of builder.yaml has, lists its storage extensions in
``service.extensions``, puts memory_limiter first and batches after it (in a
batch processor, or in the exporter's queue once the spans are on disk), and
keeps its limits high enough for 64 MiB episode records. Then the real
collector (``OTELCOL_BIN``: ``make test`` builds it and sets it) runs
``otelcol validate`` on each file."""

from __future__ import annotations

import functools
import os
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import rotel
import yaml

from prime_runs_otel.collector.admission import admitted_calls
from prime_runs_otel.collector.receiver_config import DEFAULT_WORKERS

CONFIG_DIR = Path(__file__).resolve().parent.parent / "collector-config"
PINNED_VERSION = "v0.148.0"
MANIFEST = CONFIG_DIR / "builder.yaml"
CONFIGS = sorted(path for path in CONFIG_DIR.glob("*.yaml") if path != MANIFEST)

#: The component types of the distribution builder.yaml builds, by the Go
#: module that provides each: the configs may use these and nothing else.
MODULES = {
    "receivers": {"otlp": "receiver/otlpreceiver"},
    "processors": {
        "memory_limiter": "processor/memorylimiterprocessor",
        "batch": "processor/batchprocessor",
        "attributes": "processor/attributesprocessor",
    },
    "exporters": {
        "otlp": "exporter/otlpexporter",
        "otlphttp": "exporter/otlphttpexporter",
    },
    "extensions": {
        "health_check": "extension/healthcheckextension",
        "file_storage": "extension/storage/filestorage",
    },
}
KNOWN = {kind: set(types) for kind, types in MODULES.items()}
MIN_GRPC_MIB = 64
MIN_HTTP_BYTES = 64 * 1024 * 1024


def load(path: Path) -> dict[str, Any]:
    document = yaml.safe_load(path.read_text())
    assert isinstance(document, dict), f"{path.name} is not a YAML mapping"
    return document


def component_type(name: str) -> str:
    return name.split("/", 1)[0]


def test_the_expected_configs_ship() -> None:
    names = {path.name for path in CONFIGS}
    assert {"gateway.yaml", "agent.yaml", "fanout-jaeger.yaml"} <= names
    assert (CONFIG_DIR / "rotel.env").is_file()
    assert (CONFIG_DIR / "README.md").is_file()


@pytest.mark.parametrize("path", CONFIGS, ids=lambda path: path.name)
def test_config_is_pinned_and_commented(path: Path) -> None:
    text = path.read_text()
    assert f"Tested against: otelcol-contrib {PINNED_VERSION}" in text
    comments = [line for line in text.splitlines() if line.lstrip().startswith("#")]
    assert len(comments) >= 5, f"{path.name} should explain itself in comments"


@pytest.mark.parametrize("path", CONFIGS, ids=lambda path: path.name)
def test_components_exist_in_the_pinned_version(path: Path) -> None:
    config = load(path)
    for kind, known in KNOWN.items():
        for name in config.get(kind) or {}:
            assert component_type(name) in known, f"{path.name}: unknown {kind} {name!r}"
    unknown_sections = set(config) - {*KNOWN, "service", "connectors"}
    assert not unknown_sections, f"{path.name}: unknown top-level {unknown_sections}"


@pytest.mark.parametrize("path", CONFIGS, ids=lambda path: path.name)
def test_pipelines_reference_defined_components(path: Path) -> None:
    config = load(path)
    service = config["service"]
    for extension in service.get("extensions", []):
        assert extension in (config.get("extensions") or {}), f"{path.name}: {extension}"
    pipelines = service["pipelines"]
    assert pipelines, f"{path.name} has no pipeline"
    for name, pipeline in pipelines.items():
        # Spans, and the log records that carry GenAI events for them.
        assert name.split("/")[0] in ("traces", "logs"), f"{path.name}: {name}"
        for kind in ("receivers", "processors", "exporters"):
            for component in pipeline.get(kind, []):
                assert component in (config.get(kind) or {}), (
                    f"{path.name}: pipeline {name} uses undefined {kind} {component!r}"
                )


@pytest.mark.parametrize("path", CONFIGS, ids=lambda path: path.name)
def test_memory_limiter_first_and_batch_after_it(path: Path) -> None:
    """A pipeline whose exporters queue on disk batches in that queue: a batch
    processor would answer the sender before the spans are on disk, and a
    collector killed then would lose them."""
    config = load(path)
    for name, pipeline in config["service"]["pipelines"].items():
        processors = [component_type(p) for p in pipeline.get("processors", [])]
        assert processors[:1] == ["memory_limiter"], f"{path.name} {name}: {processors}"
        queues = [config["exporters"][e].get("sending_queue") or {} for e in pipeline["exporters"]]
        if any(queue.get("storage") for queue in queues):
            assert "batch" not in processors, f"{path.name} {name}: batch before the disk queue"
            for queue in queues:
                assert queue["batch"]["max_size"] <= 128, f"{path.name} {name}: {queue}"
        elif not all(queue.get("batch") for queue in queues):
            # Without the exporters batching in their queue, a batch processor does.
            assert "batch" in processors[1:], f"{path.name} {name}: no batch after memory_limiter"


def storage_ids(node: Any) -> list[str]:
    """Every ``storage:`` value anywhere in the config (queues, receivers)."""
    found: list[str] = []
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "storage" and isinstance(value, str):
                found.append(value)
            else:
                found.extend(storage_ids(value))
    elif isinstance(node, list):
        for item in node:
            found.extend(storage_ids(item))
    return found


@pytest.mark.parametrize("path", CONFIGS, ids=lambda path: path.name)
def test_storage_ids_are_enabled_extensions(path: Path) -> None:
    config = load(path)
    enabled = config["service"].get("extensions", [])
    for storage in storage_ids({k: v for k, v in config.items() if k != "service"}):
        assert storage in (config.get("extensions") or {}), f"{path.name}: {storage} undefined"
        assert storage in enabled, f"{path.name}: {storage} not in service.extensions"
        assert component_type(storage) == "file_storage"


@pytest.mark.parametrize("path", CONFIGS, ids=lambda path: path.name)
def test_receiver_limits_fit_large_episodes(path: Path) -> None:
    protocols = load(path)["receivers"]["otlp"]["protocols"]
    assert protocols["grpc"]["max_recv_msg_size_mib"] >= MIN_GRPC_MIB
    assert protocols["http"]["max_request_body_size"] >= MIN_HTTP_BYTES


@pytest.mark.parametrize("path", CONFIGS, ids=lambda path: path.name)
def test_exporters_to_serve_retry_forever_from_disk(path: Path) -> None:
    config = load(path)
    for name, exporter in (config.get("exporters") or {}).items():
        if component_type(name) not in ("otlphttp", "otlp") or "jaeger" in name:
            continue
        assert exporter["retry_on_failure"]["max_elapsed_time"] in ("0s", 0), name
        assert exporter["sending_queue"]["storage"].startswith("file_storage"), name


@pytest.mark.parametrize("path", CONFIGS, ids=lambda path: path.name)
def test_exporters_to_serve_never_send_more_calls_than_serve_takes(path: Path) -> None:
    """Each queue consumer sends one call at a time: more consumers than
    ``serve`` takes calls at once (``--workers`` x 4) only earn refusals.
    The number is set in the file, where the comment beside it says so."""
    limit = admitted_calls(DEFAULT_WORKERS)
    for name, exporter in (load(path).get("exporters") or {}).items():
        if "PRIME_RUNS_OTEL_SERVE_URL" not in str(exporter.get("endpoint")):
            continue
        consumers = exporter["sending_queue"].get("num_consumers")
        assert consumers is not None, f"{path.name}: {name} leaves num_consumers to the default"
        assert consumers <= limit, f"{path.name}: {name} has {consumers} consumers > {limit}"
    if "PRIME_RUNS_OTEL_SERVE_URL" in path.read_text():
        assert "--workers" in path.read_text(), f"{path.name} does not say what bounds consumers"


def test_the_jaeger_fanout_bounds_its_batches_in_bytes_under_jaegers_limit() -> None:
    """Jaeger's OTLP/gRPC receiver refuses a message over 4 MiB: a batch cut
    by span count can pass it once message content is captured."""
    config = load(CONFIG_DIR / "fanout-jaeger.yaml")
    batch = config["exporters"]["otlp/jaeger"]["sending_queue"]["batch"]
    assert batch["sizer"] == "bytes"
    assert 0 < batch["min_size"] <= batch["max_size"] < 4 * 1024 * 1024
    assert "batch" not in config["service"]["pipelines"]["traces/jaeger"]["processors"]


def test_logs_reach_serve_through_the_gateways() -> None:
    for name in ("gateway.yaml", "fanout-jaeger.yaml"):
        pipelines = load(CONFIG_DIR / name)["service"]["pipelines"]
        logs = [p for key, p in pipelines.items() if key.split("/")[0] == "logs"]
        assert [p["exporters"] for p in logs] == [["otlphttp/serve"]], name


def test_fanout_strips_records_only_from_the_jaeger_pipeline() -> None:
    config = load(CONFIG_DIR / "fanout-jaeger.yaml")
    pipelines = config["service"]["pipelines"]
    assert "attributes/drop-blobs" in pipelines["traces/jaeger"]["processors"]
    assert pipelines["traces/serve"]["processors"] == ["memory_limiter"]
    pattern = config["processors"]["attributes/drop-blobs"]["actions"][0]["pattern"]
    for key in ("prime.episode.record", "prime.episode.record.sha256", "prime.run.config.size"):
        assert re.match(pattern, key)
    for key in ("prime.episode.id", "prime.run.id", "gen_ai.request.model"):
        assert not re.match(pattern, key)


def test_rotel_recipe_names_real_settings() -> None:
    """Every variable in the recipe is one the shipped rotel-agent knows."""
    agent = Path(rotel.__file__).parent / "rotel-agent"
    helptext = subprocess.run(
        [str(agent), "start", "--help"], capture_output=True, text=True, timeout=60
    ).stdout
    for line in (CONFIG_DIR / "rotel.env").read_text().splitlines():
        if line and not line.startswith("#"):
            name = line.split("=", 1)[0]
            assert f"[env: {name}=" in helptext, f"rotel does not know {name}"


def metrics_guide_config() -> str:
    """docs/metrics.md's OTLP → collector → Prometheus config, as a reader saves it."""
    guide = (CONFIG_DIR.parent / "docs" / "metrics.md").read_text()
    [config] = [
        block
        for block in re.findall(r"```yaml\n(.*?)```", guide, re.S)
        if "otlphttp/prometheus" in block
    ]
    return config


def test_the_manifest_builds_exactly_the_components_the_configs_use() -> None:
    """Nothing missing (a config the distribution cannot run, shipped or in
    the metrics guide) and nothing extra (build time and binary size on
    every fresh machine)."""
    manifest = yaml.safe_load(MANIFEST.read_text())
    documents = [load(path) for path in CONFIGS] + [yaml.safe_load(metrics_guide_config())]
    used = {
        (kind, component_type(name))
        for document in documents
        for kind in MODULES
        for name in document.get(kind) or {}
    }
    wanted = {MODULES[kind][kind_type] for kind, kind_type in used}
    prefixes = (
        "go.opentelemetry.io/collector/",
        "github.com/open-telemetry/opentelemetry-collector-contrib/",
    )
    built = {
        entry["gomod"].split()[0].removeprefix(prefixes[0]).removeprefix(prefixes[1])
        for kind in MODULES
        for entry in manifest.get(kind) or []
    }
    assert built == wanted
    versions = {entry["gomod"].split()[1] for kind in MODULES for entry in manifest.get(kind) or []}
    assert versions == {PINNED_VERSION}, "core and contrib modules at one release"
    assert manifest["dist"]["version"] == PINNED_VERSION.removeprefix("v")


#: The environment the tests were started in, before each test's own HOME:
#: the build script finds its cache and Go its caches under the real one.
MACHINE_ENV = dict(os.environ)


@functools.cache
def collector_build() -> subprocess.CompletedProcess[str]:
    """The build script, run once per test process: it waits for the build
    ``make test`` started in the background, or builds. A failed build fails
    every collector test with its log, without building again for each."""
    return subprocess.run(
        ["sh", str(BUILD)], env=MACHINE_ENV, capture_output=True, text=True, timeout=1800
    )


def otelcol_bin() -> str:
    """The collector to run: ``OTELCOL_BIN`` when set, else the distribution
    the build script builds (or finds in its cache), as ``make otelcol``
    would; a build that fails fails the test."""
    binary = os.environ.get("OTELCOL_BIN")
    if not binary:
        built = collector_build()
        assert built.returncode == 0, f"building the collector failed:\n{built.stderr}"
        binary = built.stdout.splitlines()[-1]
    assert os.access(binary, os.X_OK), f"OTELCOL_BIN={binary} is not an executable file"
    return binary


#: What each config reads from the environment, set as a user would.
CONFIG_ENV = {
    "PRIME_RUNS_OTEL_SERVE_URL": "http://127.0.0.1:4318",
    "PRIME_RUNS_OTEL_SERVE_TOKEN": "token",
    "PRIME_RUNS_OTEL_GATEWAY": "127.0.0.1:14317",
    "PRIME_RUNS_OTEL_BACKENDS_DNS": "localhost",
    "JAEGER_OTLP_GRPC": "127.0.0.1:24317",
}


def env_read(path: Path) -> set[str]:
    return set(re.findall(r"\$\{env:([A-Z0-9_]+)\}", path.read_text()))


@pytest.mark.parametrize("path", CONFIGS, ids=lambda path: path.name)
def test_otelcol_validate(path: Path, tmp_path: Path) -> None:
    binary = otelcol_bin()
    required = env_read(path)
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("PRIME_RUNS_OTEL_")},
        **CONFIG_ENV,
        "PRIME_RUNS_OTEL_QUEUE_DIR": str(tmp_path),
    }
    assert required <= set(env), f"{path.name} reads {required - set(env)}"
    finished = subprocess.run(
        [binary, "validate", f"--config={path}"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert finished.returncode == 0, finished.stderr


def test_otelcol_validate_refuses_what_the_distribution_cannot_run(tmp_path: Path) -> None:
    """The check above is a real one: a component the distribution does not
    have, or a setting its component does not know, is refused."""
    binary = otelcol_bin()
    env = {**os.environ, **CONFIG_ENV, "PRIME_RUNS_OTEL_QUEUE_DIR": str(tmp_path)}
    gateway = (CONFIG_DIR / "gateway.yaml").read_text()
    for broken in (
        gateway.replace("otlphttp/serve", "kafka/serve"),
        gateway.replace("num_consumers: 4", "num_consumer: 4"),
    ):
        assert broken != gateway
        path = tmp_path / "broken.yaml"
        path.write_text(broken)
        finished = subprocess.run(
            [binary, "validate", f"--config={path}"],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert finished.returncode != 0, broken


# -- make otelcol ----------------------------------------------------------------------------

BUILD = CONFIG_DIR / "build-otelcol.sh"


def build_script(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["sh", str(BUILD)], env=env, capture_output=True, text=True, timeout=120)


def test_build_script_uses_otelcol_bin_as_it_is(tmp_path: Path) -> None:
    binary = tmp_path / "otelcol-contrib"
    binary.write_text("#!/bin/sh\n")
    binary.chmod(0o755)
    done = build_script({**os.environ, "OTELCOL_BIN": str(binary)})
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-1] == str(binary)

    missing = build_script({**os.environ, "OTELCOL_BIN": str(tmp_path / "nowhere")})
    assert missing.returncode == 1
    assert "is not an executable file" in missing.stderr
    assert "unset it to build one" in missing.stderr


def test_build_script_reuses_the_build_of_the_same_manifest(tmp_path: Path) -> None:
    """The cache is keyed by the manifest's hash: a binary already there is
    printed at once, without Go; an edited manifest would get a new folder."""
    digest = subprocess.run(
        ["sha256sum", str(MANIFEST)], capture_output=True, text=True, check=True
    ).stdout[:16]
    cached = tmp_path / "prime-runs-otel" / f"otelcol-{digest}" / "otelcol-prime-runs"
    cached.mkdir(parents=True)
    (cached / "otelcol-prime-runs").write_text("#!/bin/sh\n")
    (cached / "otelcol-prime-runs").chmod(0o755)
    env = {k: v for k, v in os.environ.items() if k != "OTELCOL_BIN"}
    done = build_script({**env, "XDG_CACHE_HOME": str(tmp_path), "PATH": "/usr/bin:/bin"})
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-1] == str(cached / "otelcol-prime-runs")


def test_build_script_without_go_says_what_to_do(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "OTELCOL_BIN"}
    bare = tmp_path / "bin"
    bare.mkdir()
    for tool in ("sh", "sha256sum", "cut", "dirname", "sed", "head"):
        found = subprocess.run(["sh", "-c", f"command -v {tool}"], capture_output=True, text=True)
        (bare / tool).symlink_to(found.stdout.strip())
    done = build_script({**env, "XDG_CACHE_HOME": str(tmp_path / "cache"), "PATH": str(bare)})
    assert done.returncode == 1
    assert "Go is needed to build the collector" in done.stderr
    assert "OTELCOL_BIN" in done.stderr


def test_the_metrics_guide_s_collector_config_loads(tmp_path: Path) -> None:
    """docs/metrics.md's OTLP → collector → Prometheus config, as a reader
    saves it, on this repository's collector distribution."""
    config = metrics_guide_config()
    assert "metrics" in yaml.safe_load(config)["service"]["pipelines"]
    path = tmp_path / "metrics-prometheus.yaml"
    path.write_text(config)
    finished = subprocess.run(
        [otelcol_bin(), "validate", f"--config={path}"],
        env={**os.environ, "PROMETHEUS_OTLP_URL": "http://127.0.0.1:9090/api/v1/otlp"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert finished.returncode == 0, finished.stderr
