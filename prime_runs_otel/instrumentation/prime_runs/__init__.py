"""The ``prime_runs`` instrumentation: ``prime_runs.init(...)`` returns a run
reported through this package's OpenTelemetry pipeline.

verifiers (``vf-eval --push``) and training loops already call the prime-runs
SDK; this takes their calls over without a change to them::

    OTEL_TRACES_EXPORTER=prime_runs opentelemetry-instrument vf-eval ...

or, without ``opentelemetry-distro``, ``prime-runs-otel run -- vf-eval ...``.
The run's spans go to the exporter ``OTEL_TRACES_EXPORTER`` names:
``prime_runs`` delivers in process (spool, then platform); ``otlp`` sends
OTLP to a collector and ``prime-runs-otel serve``. prime-runs' own transport
sends nothing.

The mapping, on the plumbing every instrumentation shares (``..hook``,
``..delivery``, the launcher): ``_hook.py`` patches ``prime_runs.init``,
``patched_init.py`` answers it, ``run_spec.py`` checks its arguments as
prime-runs does, and ``run.py`` is the run it hands back.
"""

from __future__ import annotations

TYPE_CHECKING = False  # not typing's: see prime_runs_otel/__init__.py
if TYPE_CHECKING:
    from typing import Any

    from .instrumentor import PrimeRunsInstrumentor

__all__ = ["PrimeRunsInstrumentor"]


def __getattr__(name: str) -> Any:
    # Imported on first use: opentelemetry-instrumentation is not needed by
    # the launcher's start-up hook, which only installs ``_hook``.
    if name == "PrimeRunsInstrumentor":
        from .instrumentor import PrimeRunsInstrumentor

        return PrimeRunsInstrumentor
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
