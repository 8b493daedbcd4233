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
    program = _program(command[0])
    env = child_environment(os.environ)
    if _runs_stay_local():
        # Without a key a caller that asks for online anyway (`vf-eval --push`
        # always does) would fail at its first run: its runs stay here instead.
        env["PRIME_RUNS_MODE"] = "local"
    try:
        os.execve(program, list(command), env)
    except OSError as exc:
        raise ConfigError(
            f"{command[0]!r} cannot be run ({exc.strerror}); a script needs a first line "
            "naming its interpreter (#!/usr/bin/env python3), or run it through one: "
            f"prime-runs-otel run -- python {command[0]}"
        ) from None


def _program(name: str) -> str:
    """The file ``name`` runs, or a :class:`ConfigError` that says why not
    and what to do: a file that exists is never reported "not found"."""
    program = shutil.which(name)
    if program is not None:
        return program
    path = Path(name)
    if os.sep in name or (os.altsep and os.altsep in name):
        if path.is_dir():
            raise ConfigError(f"{name!r} is a folder, not a program")
        if path.exists():
            raise ConfigError(
                f"{name!r} is not executable: make it so with `chmod +x {name}`, or run it "
                f"through its interpreter (prime-runs-otel run -- python {name} for a Python "
                "script)"
            )
        raise ConfigError(f"{name!r} does not exist; check the path")
    if path.is_file():
        raise ConfigError(
            f"{name!r} was not found on PATH; to run the file of that name here, give its "
            f"path: prime-runs-otel run -- ./{name}"
        )
    raise ConfigError(f"{name!r} was not found on PATH; check the command's name, or give its path")


def _runs_stay_local() -> bool:
    """Whether the command's runs will stay on this machine (no API key, or
    ``PRIME_RUNS_MODE=local``); if so, says where they are kept and how to
    look at them, in one line before the command starts. Settings are read
    only when the environment leaves "local" possible: no key in it, no
    other mode, runs exported in process (not over OTLP to a collector,
    whose ``serve`` keeps them)."""
    exporters = os.environ.get("OTEL_TRACES_EXPORTER", "prime_runs")
    if "prime_runs" not in {name.strip() for name in exporters.split(",")}:
        return False
    if os.environ.get("PRIME_API_KEY"):
        return False
    if os.environ.get("PRIME_RUNS_MODE", "").strip().lower() in ("online", "disabled"):
        return False
    from ..config import resolve_settings

    try:
        settings = resolve_settings()
    except ConfigError:
        return False  # the command's own runs report the setting, where it is read
    if settings.mode == "local":
        print(
            f"prime-runs-otel: no API key, so runs are kept locally in {settings.spool_dir}; "
            "look at them with `prime-runs-otel ui` (browser), `prime-runs-otel runs` and "
            "`prime-runs-otel show RUN`",
            file=sys.stderr,
            flush=True,
        )
        return True
    return False
