"""``PrimeRunsInstrumentor``: the ``prime_runs`` instrumentation as an
OpenTelemetry ``BaseInstrumentor``, loaded by ``opentelemetry-instrument``
through the ``opentelemetry_instrumentor`` entry point."""

from __future__ import annotations

from ..instrumentor import HookInstrumentor
from . import _hook

#: The prime-runs releases whose ``init``/``Run`` surface this reproduces.
INSTRUMENTS = ("prime-runs >= 0.1.4, < 0.2",)


class PrimeRunsInstrumentor(HookInstrumentor):
    """Makes ``prime_runs.init`` open runs backed by prime-runs-otel, from the
    moment ``prime_runs`` is imported."""

    hook = _hook.HOOK
    instruments = INSTRUMENTS
