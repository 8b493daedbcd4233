"""``prime-runs-otel run -- COMMAND ...``: the instrumentations without
``opentelemetry-distro``.

Like ``opentelemetry-instrument``, it puts a folder holding a
``sitecustomize`` first on ``PYTHONPATH`` and replaces itself with the
command, so the command's exit code and signals are its own. Every Python
process the command starts inherits the variable and installs each
instrumentation's hook (``startup.py``; standard library only); a process
that imports an instrumented package reports its runs through this package,
the others pay nothing more. Runs go to the exporter ``OTEL_TRACES_EXPORTER``
names, ``prime_runs`` (in process) unless it says otherwise.
"""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from ..errors import ConfigError

STARTUP_DIR = Path(__file__).resolve().parent / "_startup"


def child_environment(environ: Mapping[str, str]) -> dict[str, str]:
    """``environ`` with the start-up folder first on ``PYTHONPATH`` (once)."""
    env = dict(environ)
    entries = [entry for entry in env.get("PYTHONPATH", "").split(os.pathsep) if entry]
    entries = [str(STARTUP_DIR), *(entry for entry in entries if entry != str(STARTUP_DIR))]
    env["PYTHONPATH"] = os.pathsep.join(entries)
    env.setdefault("OTEL_TRACES_EXPORTER", "prime_runs")
    return env


def run_command(command: Sequence[str]) -> int:
    """``prime-runs-otel run``: the command's own exit code, as it replaces
    this process; 2 with a message when there is nothing to run."""
    try:
        launch(command)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 2  # not reached: launch() replaces this process or raises


def launch(command: Sequence[str]) -> None:
    """Replace this process with ``command``; returns only by raising."""
    if command and command[0] == "--":
        command = command[1:]
    if not command:
        raise ConfigError(
            "nothing to run: prime-runs-otel run -- COMMAND [ARGS...], "
            "for example prime-runs-otel run -- vf-eval my-taskset -m my-model"
        )
    program = shutil.which(command[0])
    if program is None:
        raise ConfigError(
            f"{command[0]!r} was not found on PATH; check the command's name, or give its path"
        )
    os.execve(program, list(command), child_environment(os.environ))
