"""What ``prime-runs-otel run`` does first in every Python process it starts:
install the lazy hook of each instrumentation (``_startup/sitecustomize.py``
calls :func:`install_hooks`).

A hook module imports only the standard library and has ``install()``
(see ``hook.py``), so a process that never imports an instrumented package
pays for this file and those modules, and nothing more.
"""

from __future__ import annotations

import sys

__all__ = ["HOOK_MODULES", "install_hooks"]

#: The hook module of each instrumentation the launcher reaches.
HOOK_MODULES = (
    "prime_runs_otel.instrumentation.prime_runs._hook",
    "prime_runs_otel.instrumentation.prime_rl._hook",
)


def install_hooks() -> None:
    """Install every instrumentation's hook; one that cannot be imported is
    left out, the others still installed."""
    for name in HOOK_MODULES:
        try:
            __import__(name)
        except ImportError:
            continue
        sys.modules[name].install()
