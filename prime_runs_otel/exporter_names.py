"""Which installed exporter an ``OTEL_{TRACES,METRICS,LOGS}_EXPORTER`` name
stands for, through ``importlib.metadata``'s entry points.

Names other than ``otlp`` are entry-point names as they are. ``otlp`` picks
its transport as the Python SDK's configurator does: the signal's
``OTEL_EXPORTER_OTLP_<SIGNAL>_PROTOCOL``, else ``OTEL_EXPORTER_OTLP_PROTOCOL``,
else gRPC (the SDK's default; the specification's is ``http/protobuf``). The
SDK keeps that rule in a private function of its configurator, so it is
written out here instead of borrowed.
"""

from __future__ import annotations

import os
from importlib.metadata import entry_points
from typing import Any, Literal

from .errors import ConfigError

__all__ = ["OTLP", "Signal", "entry_point_name", "load_exporter_class"]

Signal = Literal["traces", "metrics", "logs"]

OTLP = "otlp"
_GRPC = "otlp_proto_grpc"
_HTTP = "otlp_proto_http"
_BY_PROTOCOL = {"grpc": _GRPC, "http/protobuf": _HTTP}
#: What to install for the exporters this package's users name most.
_PACKAGE = {
    _GRPC: "opentelemetry-exporter-otlp-proto-grpc",
    _HTTP: "opentelemetry-exporter-otlp-proto-http",
}


def entry_point_name(name: str, signal: Signal) -> str:
    """The entry point ``name`` stands for in ``signal``'s exporter group."""
    if name != OTLP:
        return name
    variable = f"OTEL_EXPORTER_OTLP_{signal.upper()}_PROTOCOL"
    if not os.environ.get(variable):
        variable = "OTEL_EXPORTER_OTLP_PROTOCOL"
    protocol = os.environ.get(variable, "").strip()
    if not protocol:
        return _GRPC
    if protocol not in _BY_PROTOCOL:
        raise ConfigError(
            f"{variable}={protocol!r} is not an OTLP protocol the OpenTelemetry SDK exports: "
            "use grpc or http/protobuf"
        )
    return _BY_PROTOCOL[protocol]


def load_exporter_class(name: str, signal: Signal, variable: str) -> Any:
    """The class the entry point of ``name`` names, or a ``ConfigError``
    saying what to install."""
    resolved = entry_point_name(name, signal)
    found = entry_points(group=f"opentelemetry_{signal}_exporter", name=resolved)
    if not found:
        package = _PACKAGE.get(resolved)
        install = f"pip install {package}" if package else "install the package that provides it"
        raise ConfigError(
            f"{variable} names {name!r}, but no installed package provides a {signal} exporter "
            f"{resolved!r}: {install}, or name another exporter"
        )
    return next(iter(found)).load()
