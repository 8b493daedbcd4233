"""``PrimeRunsInstrumentor``: the ``prime_runs`` instrumentation as an
OpenTelemetry ``BaseInstrumentor``, loaded by ``opentelemetry-instrument``
through the ``opentelemetry_instrumentor`` entry point."""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

from opentelemetry.instrumentation.instrumentor import (  # type: ignore[attr-defined]
    BaseInstrumentor,
)

from . import _hook

#: The prime-runs releases whose ``init``/``Run`` surface this reproduces.
INSTRUMENTS = ("prime-runs >= 0.1.4, < 0.2",)


class PrimeRunsInstrumentor(BaseInstrumentor):  # type: ignore[misc]
    """Makes ``prime_runs.init`` open runs backed by prime-runs-otel.

    Lazy: if ``prime_runs`` is not imported yet, nothing is imported now; the
    patch is applied the moment it is. ``tracer_provider`` is not taken: a
    run's spans need a provider of their own, whose Resource names the run.
    """

    def instrumentation_dependencies(self) -> Collection[str]:
        return INSTRUMENTS

    def _instrument(self, **kwargs: Any) -> None:
        _hook.install()

    def _uninstrument(self, **kwargs: Any) -> None:
        _hook.uninstall()
