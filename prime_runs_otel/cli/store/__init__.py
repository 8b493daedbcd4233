"""The local store from the command line: ``runs``, ``show``, ``export``,
``push``, ``rm``, ``prune`` and ``compact``, one module per command
(``remove`` holds ``rm`` and ``prune``).

What they share is below them: :mod:`.lookup` finds the spool and the run a
command names, and :mod:`prime_runs_otel.view.runs` reads runs into the
vocabulary every command prints and the viewer shows.
"""

from __future__ import annotations

import argparse
from typing import Any

__all__ = ["add_store_commands"]


def add_store_commands(commands: Any, common: argparse.ArgumentParser) -> None:
    """Add the store commands to ``prime-runs-otel``, in the order ``--help`` lists them.

    Their modules are imported here, not with this package: ``runs`` imports
    the package and its own module only, never ``push``'s platform clients."""
    from .compact import add_compact_command
    from .export import add_export_command
    from .push import add_push_command
    from .remove import add_remove_commands
    from .runs import add_runs_command
    from .show import add_show_command

    add_runs_command(commands, common)
    add_show_command(commands, common)
    add_export_command(commands, common)
    add_push_command(commands, common)
    add_remove_commands(commands, common)
    add_compact_command(commands, common)
