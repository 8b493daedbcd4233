"""The ``prime.*`` conventions are defined once, in the Weaver registry under
``semconv/``; ``prime_runs_otel/semconv.py`` (the constants the code uses) and
``docs/semconv.md`` (what users read) must say the same, name for name.

The registry is read here with PyYAML, not with weaver itself (a Rust binary
too slow to build for every test run); ``make semconv`` runs
``weaver registry check`` on it where weaver is installed.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from prime_runs_otel import semconv

ROOT = Path(__file__).resolve().parent.parent
REGISTRY = ROOT / "semconv"
DOCS = ROOT / "docs" / "semconv.md"

ATTRIBUTE_TYPES = {
    "string",
    "int",
    "double",
    "boolean",
    "any",
    "string[]",
    "int[]",
    "double[]",
    "boolean[]",
}
INSTRUMENTS = {"counter", "updowncounter", "histogram", "gauge"}


@dataclass
class Registry:
    attributes: dict[str, dict[str, Any]] = field(default_factory=dict)
    #: Attribute prefixes of named components (``prime.agent.metric.{name}``).
    templates: set[str] = field(default_factory=set)
    spans: set[str] = field(default_factory=set)
    metrics: dict[str, dict[str, Any]] = field(default_factory=dict)
    refs: list[tuple[str, str]] = field(default_factory=list)


def load_registry() -> Registry:
    registry = Registry()
    files = sorted((REGISTRY / "model").rglob("*.yaml"))
    assert files, f"no registry files under {REGISTRY / 'model'}"
    for path in files:
        document = yaml.safe_load(path.read_text(encoding="utf-8"))
        for group in document["groups"]:
            read_group(registry, group, path.name)
    return registry


def read_group(registry: Registry, group: dict[str, Any], where: str) -> None:
    group_id = group["id"]
    assert group.get("stability"), f"{where}: {group_id} has no stability"
    assert group.get("brief"), f"{where}: {group_id} has no brief"
    kind = group["type"]
    for attribute in group.get("attributes", ()):
        if "ref" in attribute:
            registry.refs.append((group_id, attribute["ref"]))
            continue
        key = attribute["id"]
        assert key not in registry.attributes, f"{key} is defined twice"
        registry.attributes[key] = attribute
        kind_of_value = attribute["type"]
        if (isinstance(kind_of_value, str) and kind_of_value.startswith("template[")) or (
            (attribute.get("annotations") or {}).get("prime_runs_otel", {}).get("named_components")
        ):
            registry.templates.add(key + ".")
    if kind == "span":
        assert group_id.startswith("span."), group_id
        registry.spans.add(group_id[len("span.") :])
    elif kind == "metric":
        registry.metrics[group["metric_name"]] = group
    else:
        assert kind == "attribute_group", f"{where}: {group_id} is a {kind}"


REG = load_registry()


def prime_constants() -> dict[str, str]:
    """Every ``Final`` string constant of ``semconv.py`` naming a ``prime.*`` thing."""
    return {
        name: value
        for name, value in vars(semconv).items()
        if name.isupper() and isinstance(value, str) and value.startswith("prime.")
    }


def known_names() -> set[str]:
    """What a ``prime.*`` name in code or docs may be: an attribute, a template
    prefix, a span or a metric of the registry."""
    return set(REG.attributes) | REG.templates | REG.spans | set(REG.metrics)


# -- the registry itself ----------------------------------------------------------------------


def test_the_registry_has_a_weaver_manifest() -> None:
    manifest = yaml.safe_load((REGISTRY / "manifest.yaml").read_text(encoding="utf-8"))
    assert manifest["name"] == "prime_runs_otel"
    assert re.fullmatch(r"https://[^/]+(/[^/]+)*/\d+\.\d+\.\d+", manifest["schema_url"])


def test_every_attribute_is_typed_and_described() -> None:
    for key, attribute in REG.attributes.items():
        assert key.startswith("prime."), f"{key}: the registry defines prime.* names only"
        assert attribute.get("brief"), f"{key} has no brief"
        assert attribute.get("stability"), f"{key} has no stability"
        kind = attribute["type"]
        if isinstance(kind, dict):
            members = kind["members"]
            assert members and all(m["value"] and m["brief"] for m in members), key
        elif kind.startswith("template["):
            assert kind[len("template[") : -1] in ATTRIBUTE_TYPES, key
        else:
            assert kind in ATTRIBUTE_TYPES, f"{key}: unknown type {kind!r}"
        if kind != "boolean":
            assert attribute.get("examples") is not None, f"{key} has no examples"


def test_every_reference_names_a_defined_attribute() -> None:
    for group, key in REG.refs:
        assert key in REG.attributes, f"{group} refers to {key}, which is not defined"


def test_metrics_name_their_instrument_and_unit() -> None:
    for name, metric in REG.metrics.items():
        assert metric["instrument"] in INSTRUMENTS, name
        assert metric["unit"], name


# -- semconv.py ------------------------------------------------------------------------------


def test_every_prime_constant_is_in_the_registry() -> None:
    missing = {
        name: value for name, value in prime_constants().items() if value not in known_names()
    }
    assert not missing, f"semconv.py names what the registry does not define: {missing}"


def test_every_registry_name_has_its_constant() -> None:
    values = set(prime_constants().values())
    # A blob's size and digest are named by blob_size_key / blob_sha256_key.
    blobs = {
        key
        for value in values
        for key in (semconv.blob_size_key(value), semconv.blob_sha256_key(value))
    }
    plain = {key for key in REG.attributes if key + "." not in REG.templates}
    # The episode and agent spans' names are built (episode_span_name(),
    # agent_span_name()), not constants: their groups are named after them.
    spans = REG.spans - {"prime.episode", "prime.agent"}
    missing = (plain | REG.templates | spans | set(REG.metrics)) - (values | blobs)
    assert not missing, f"the registry defines what semconv.py has no constant for: {missing}"


def test_metric_constants_are_the_registry_metrics() -> None:
    constants = {value for name, value in vars(semconv).items() if name.startswith("METRIC_")} - {
        semconv.METRIC_NAME
    }
    assert constants == set(REG.metrics)


# -- docs/semconv.md -------------------------------------------------------------------------

_DOC_NAME = re.compile(r"`(prime\.[a-z0-9_.]+(?:\{name\})?)`")


def documented_names() -> set[str]:
    """Every ``prime.*`` name in backticks; ``prime.agent.reward.{name}`` is the
    template prefix ``prime.agent.reward.``."""
    return {found.replace("{name}", "") for found in _DOC_NAME.findall(DOCS.read_text())}


def test_docs_name_only_what_the_registry_defines() -> None:
    unknown = documented_names() - known_names()
    assert not unknown, f"docs/semconv.md names what the registry does not define: {unknown}"


def test_docs_describe_everything_the_registry_defines() -> None:
    documented = documented_names()
    plain = {key for key in REG.attributes if key + "." not in REG.templates}
    missing = (plain | REG.templates | set(REG.metrics)) - documented
    assert not missing, f"docs/semconv.md does not describe: {sorted(missing)}"


def test_docs_give_each_attribute_its_registry_type() -> None:
    """A table row ``| `key` | type | ...`` says the type the registry gives."""
    spelled = {
        "string": "string",
        "int": "int",
        "double": "double",
        "boolean": "bool",
        "string[]": "string[]",
        "any": "int or string",
    }
    rows = re.findall(r"^\| `(prime\.[a-z0-9_.]+)` \| ([^|]+) \|", DOCS.read_text(), re.M)
    assert rows
    for key, written in rows:
        attribute = REG.attributes.get(key)
        if attribute is None or isinstance(attribute["type"], dict):
            continue
        kind = attribute["type"]
        if kind == "string[]" and written.strip().startswith("blob"):
            continue
        assert written.strip().startswith(spelled[kind]), f"{key}: docs say {written!r}, {kind}"
