"""``PrimeRlInstrumentor``: the ``prime_rl`` instrumentation as an OpenTelemetry
``BaseInstrumentor``, loaded by ``opentelemetry-instrument`` through the
``opentelemetry_instrumentor`` entry point."""

from __future__ import annotations

from ..instrumentor import HookInstrumentor
from . import _hook

#: The prime-rl releases whose ``prime_rl.monitors`` surface this reproduces
#: (followed at commit 559b4477; see tests/prime_rl_standin).
INSTRUMENTS = ("prime-rl >= 0.8",)


class PrimeRlInstrumentor(HookInstrumentor):
    """Makes ``prime_rl.monitors.setup`` register this package's monitor in
    place of prime-rl's ``PrimeMonitor``, from the moment
    ``prime_rl.monitors`` is imported."""

    hook = _hook.HOOK
    instruments = INSTRUMENTS
