"""The ``prime_rl`` instrumentation: prime-rl's training runs reported through
this package's OpenTelemetry pipeline, with prime-rl unchanged::

    prime-runs-otel run -- uv run rl @ my-config.toml

(or ``opentelemetry-instrument`` in front of each process). prime-rl never
calls prime-runs: it reports through its own monitor registry,
``prime_rl.monitors`` (``setup``, then ``log`` and ``finalize`` fanned out
to every registered monitor), and its ``PrimeMonitor`` talks to the RFT API
with its own HTTP client.

The seam is ``prime_rl.monitors.setup``, not ``PrimeMonitor``: the patched
``setup`` runs prime-rl's own with the prime config taken out, so no
``PrimeMonitor`` is built (no second run, no request of its own), and puts
this package's monitor first in ``MONITORS``, where prime-rl's fan-out
reaches it with every metrics dict and every episode cohort, in the order
and on the event loop prime-rl calls them. A registered ``Monitor`` is the
surface prime-rl keeps stable for its own monitors (W&B, files); the
internals of ``PrimeMonitor`` (its ``TrainRun``, its fire-and-forget tasks)
are not.

``_hook.py`` patches ``setup`` the moment ``prime_rl.monitors`` is imported;
``monitor.py`` is the monitor, ``run_fields.py`` what the run is registered
with (as ``PrimeMonitor`` registers it), ``exit.py`` how the run ends when
the process does.
"""

from __future__ import annotations

TYPE_CHECKING = False  # not typing's: see prime_runs_otel/__init__.py
if TYPE_CHECKING:
    from typing import Any

    from .instrumentor import PrimeRlInstrumentor

__all__ = ["PrimeRlInstrumentor"]


def __getattr__(name: str) -> Any:
    # Imported on first use: the launcher's start-up hook only installs ``_hook``.
    if name == "PrimeRlInstrumentor":
        from .instrumentor import PrimeRlInstrumentor

        return PrimeRlInstrumentor
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
