"""The package's own work is never traced: its HTTP calls to the platform,
its SQLite spool, the threads it runs them on.

An auto-instrumented process (``opentelemetry-bootstrap -a install`` installs
the httpx and sqlite3 instrumentations, httpx being a dependency) would
otherwise file the exporter's own uploads as spans of the application, under
the run's Resource, and export them, which makes more uploads. The SDK's own
exporters avoid that by running with instrumentation suppressed in the
context (``_SUPPRESS_INSTRUMENTATION_KEY``, which every instrumentation
checks before it makes a span); this package does the same, wherever it
makes a network call and on every thread of its own.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from opentelemetry.context import _SUPPRESS_INSTRUMENTATION_KEY, attach, detach, set_value

__all__ = ["untraced"]


@contextlib.contextmanager
def untraced() -> Iterator[None]:
    """Instrumentation off for what runs inside, on this thread."""
    token = attach(set_value(_SUPPRESS_INSTRUMENTATION_KEY, True))
    try:
        yield
    finally:
        detach(token)
