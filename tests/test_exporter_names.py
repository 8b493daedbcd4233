"""``OTEL_*_EXPORTER`` names resolved to entry points through
``importlib.metadata``, by the rule the SDK's configurator applies to
``otlp`` (checked here against the SDK's own function, as the oracle)."""

from __future__ import annotations

import itertools

import pytest
from opentelemetry.sdk._configuration import _get_exporter_entry_point

from prime_runs_otel.errors import ConfigError
from prime_runs_otel.exporter_names import entry_point_name, load_exporter_class

PROTOCOLS = [None, "grpc", "http/protobuf"]


@pytest.mark.parametrize("signal", ["traces", "metrics", "logs"])
@pytest.mark.parametrize("name", ["otlp", "otlp_proto_grpc", "otlp_proto_http", "console"])
def test_names_resolve_as_the_sdk_resolves_them(
    monkeypatch: pytest.MonkeyPatch, signal: str, name: str
) -> None:
    for general, specific in itertools.product(PROTOCOLS, PROTOCOLS):
        for variable, value in (
            ("OTEL_EXPORTER_OTLP_PROTOCOL", general),
            (f"OTEL_EXPORTER_OTLP_{signal.upper()}_PROTOCOL", specific),
        ):
            if value is None:
                monkeypatch.delenv(variable, raising=False)
            else:
                monkeypatch.setenv(variable, value)
        expected = _get_exporter_entry_point(name, signal)  # type: ignore[arg-type]
        assert entry_point_name(name, signal) == expected  # type: ignore[arg-type]


def test_an_unknown_protocol_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "http/json")
    with pytest.raises(ConfigError, match="OTEL_EXPORTER_OTLP_PROTOCOL='http/json'"):
        entry_point_name("otlp", "traces")


def test_an_exporter_nobody_installed_says_what_to_install() -> None:
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    assert load_exporter_class("otlp_proto_http", "traces", "X") is OTLPSpanExporter
    with pytest.raises(ConfigError, match="OTEL_TRACES_EXPORTER names 'nowhere'"):
        load_exporter_class("nowhere", "traces", "OTEL_TRACES_EXPORTER")
