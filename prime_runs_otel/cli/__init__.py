"""The ``prime-runs-otel`` command line: one module per command group, over
the public API and the spool; nothing below imports it."""

from .main import main

__all__ = ["main"]
