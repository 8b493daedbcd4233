"""The ``prime-runs-otel`` command line: one module per command group, over
the public API and the spool; nothing below imports it."""

from __future__ import annotations

import sys
from collections.abc import Sequence

__all__ = ["main"]


def main(argv: Sequence[str] | None = None) -> int:
    """``prime-runs-otel``. ``run -- COMMAND`` is answered before the rest of
    the command line is imported: it only replaces this process with the
    command, and should not make every launch wait for the pipeline's imports."""
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] == ["run"] and not {"-h", "--help"} & set(args[1:2]):
        from ..instrumentation.launcher import run_command

        return run_command(args[1:])
    from .main import main as full_main

    return full_main(args)
