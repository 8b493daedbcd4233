"""Lint every collector config shipped in collector-config/: each states the
otelcol-contrib version it is pinned to, uses only components that version
has, lists its storage extensions in ``service.extensions``, puts
memory_limiter first and batch after it, and keeps its limits high enough for
64 MiB episode records. With ``OTELCOL_BIN`` pointing at an otelcol-contrib
binary, ``otelcol validate`` runs on each file too."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import rotel
import yaml

CONFIG_DIR = Path(__file__).resolve().parent.parent / "collector-config"
PINNED_VERSION = "v0.130.0"
CONFIGS = sorted(CONFIG_DIR.glob("*.yaml"))

#: Component types of otelcol-contrib v0.130.0 these configs may use (a subset
#: of the distribution: the ones that fit a traces pipeline to `serve`).
KNOWN = {
    "receivers": {"otlp"},
    "processors": {
        "memory_limiter",
        "batch",
        "attributes",
        "resource",
        "filter",
        "transform",
    },
    "exporters": {"otlp", "otlphttp", "loadbalancing", "debug"},
    "extensions": {"health_check", "file_storage", "pprof", "zpages", "bearertokenauth"},
}
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
    assert {"gateway.yaml", "agent.yaml", "loadbalancer.yaml", "fanout-jaeger.yaml"} <= names
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
        assert name.split("/")[0] == "traces", f"{path.name}: {name} is not a traces pipeline"
        for kind in ("receivers", "processors", "exporters"):
            for component in pipeline.get(kind, []):
                assert component in (config.get(kind) or {}), (
                    f"{path.name}: pipeline {name} uses undefined {kind} {component!r}"
                )


@pytest.mark.parametrize("path", CONFIGS, ids=lambda path: path.name)
def test_memory_limiter_first_and_batch_after_it(path: Path) -> None:
    for name, pipeline in load(path)["service"]["pipelines"].items():
        processors = [component_type(p) for p in pipeline.get("processors", [])]
        assert processors[:1] == ["memory_limiter"], f"{path.name} {name}: {processors}"
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


def test_loadbalancer_keeps_a_run_on_one_backend() -> None:
    exporter = load(CONFIG_DIR / "loadbalancer.yaml")["exporters"]["loadbalancing"]
    assert exporter["routing_key"] == "attributes"
    assert exporter["routing_attributes"] == ["prime.run.id"]
    assert "otlp" in exporter["protocol"]  # the loadbalancing exporter speaks gRPC


def test_fanout_strips_records_only_from_the_jaeger_pipeline() -> None:
    config = load(CONFIG_DIR / "fanout-jaeger.yaml")
    pipelines = config["service"]["pipelines"]
    assert "attributes/drop-blobs" in pipelines["traces/jaeger"]["processors"]
    assert pipelines["traces/serve"]["processors"] == ["memory_limiter", "batch"]
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


@pytest.mark.skipif(not os.environ.get("OTELCOL_BIN"), reason="OTELCOL_BIN is not set")
@pytest.mark.parametrize("path", CONFIGS, ids=lambda path: path.name)
def test_otelcol_validate(path: Path, tmp_path: Path) -> None:
    env = {
        **os.environ,
        "PRIME_RUNS_OTEL_SERVE_URL": "http://127.0.0.1:4318",
        "PRIME_RUNS_OTEL_SERVE_TOKEN": "token",
        "PRIME_RUNS_OTEL_QUEUE_DIR": str(tmp_path),
        "PRIME_RUNS_OTEL_GATEWAY": "127.0.0.1:14317",
        "PRIME_RUNS_OTEL_BACKENDS_DNS": "localhost",
        "JAEGER_OTLP_GRPC": "127.0.0.1:24317",
    }
    finished = subprocess.run(
        [os.environ["OTELCOL_BIN"], "validate", f"--config={path}"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert finished.returncode == 0, finished.stderr
