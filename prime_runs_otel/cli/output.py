"""How the command line writes: progress on stderr, colour only on a
terminal, JSON one way everywhere, and quiet on a closed pipe.

``prime-runs-otel export RUN | head`` is the first thing a user tries; the
reader closing the pipe early is normal, not an error, so no traceback.
"""

from __future__ import annotations

import json
import logging
import os
import re
import sys
import time
from typing import Any, TextIO

from .._text import human_bytes as human_bytes  # said here too: commands format with it


class PipeClosed(Exception):
    """stdout's reader went away: stop producing output (nothing is wrong)."""


class PipeSafeStream:
    """stdout that turns a closed pipe into silence.

    Once the reader is gone the stream points at ``/dev/null`` (so the
    interpreter's final flush cannot complain either) and ``closed_pipe``
    tells long loops to stop early. Commands that must finish their work
    anyway (``demo``, ``replay``: a run is being closed) simply go on.
    """

    def __init__(self, stream: TextIO) -> None:
        self._stream = stream
        self.closed_pipe = False

    def write(self, text: str) -> int:
        if self.closed_pipe:
            return len(text)
        try:
            return self._stream.write(text)
        except BrokenPipeError:
            self._went_away()
            return len(text)

    def flush(self) -> None:
        if self.closed_pipe:
            return
        try:
            self._stream.flush()
        except BrokenPipeError:
            self._went_away()

    def _went_away(self) -> None:
        self.closed_pipe = True
        try:
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, self._stream.fileno())
            os.close(devnull)
        except (OSError, ValueError):
            pass

    def isatty(self) -> bool:
        return not self.closed_pipe and self._stream.isatty()

    def fileno(self) -> int:
        return self._stream.fileno()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


def install_pipe_safe_stdout() -> None:
    if not isinstance(sys.stdout, PipeSafeStream):
        sys.stdout = PipeSafeStream(sys.stdout)


def stdout_gone() -> bool:
    return isinstance(sys.stdout, PipeSafeStream) and sys.stdout.closed_pipe


def color(text: str, code: str, stream: TextIO | None = None) -> str:
    target = stream or sys.stdout
    if target.isatty() and not os.environ.get("NO_COLOR"):
        return f"\033[{code}m{text}\033[0m"
    return text


def print_json(value: Any, *, indent: int | None = 2, flush: bool = False) -> None:
    """Every ``--json`` output: readable UTF-8, except what a terminal acts on."""
    print(json_text(value, indent=indent), flush=flush)


#: What ``json.dumps(ensure_ascii=False)`` leaves raw although a terminal acts
#: on it or cannot print it: DEL, C1 controls, the bidirectional overrides
#: that reorder what is shown, line separators and lone surrogates. (C0
#: controls are escaped by JSON itself.) Only strings can hold them, where a
#: ``\uXXXX`` escape reads back as the same text.
_RAW_IN_JSON = re.compile("[\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069\ud800-\udfff]")


def json_text(value: Any, *, indent: int | None = 2) -> str:
    """``value`` as JSON text, names and messages from producers included,
    safe to print: whatever a terminal would act on is a ``\\uXXXX`` escape."""
    text = json.dumps(value, indent=indent, ensure_ascii=False)
    if _RAW_IN_JSON.search(text) is None:
        return text
    return _RAW_IN_JSON.sub(lambda match: f"\\u{ord(match.group()):04x}", text)


def error(text: str) -> None:
    print(color(f"error: {text}", "31", sys.stderr), file=sys.stderr)


class Progress:
    """A progress line on stderr: redrawn in place on a terminal, a line per
    tenth of the work otherwise (so CI logs stay readable)."""

    def __init__(self, label: str, total: int | None, stream: TextIO | None = None) -> None:
        self.label = label
        self.total = total
        self.done = 0
        self._stream = stream or sys.stderr
        self._tty = self._stream.isatty()
        self._last_tenth = -1
        self._last_draw = 0.0

    def advance(self, count: int = 1) -> None:
        self.done += count
        now = time.monotonic()
        if self._tty:
            if now - self._last_draw >= 0.1 or self.done == self.total:
                self._last_draw = now
                self._stream.write(f"\r{self._text()}")
                self._stream.flush()
        elif self.total:
            tenth = self.done * 10 // self.total
            if tenth != self._last_tenth:
                self._last_tenth = tenth
                self._stream.write(self._text() + "\n")

    def close(self) -> None:
        if self._tty:
            self._stream.write(f"\r{self._text()}\n")
            self._stream.flush()

    def _text(self) -> str:
        if self.total:
            return f"{self.label}: {self.done}/{self.total} ({100 * self.done // self.total}%)"
        return f"{self.label}: {self.done}"


def command_name() -> str:
    """How the user can run this command again from where they are: the bare
    name when it is on PATH, else the script beside this interpreter (from a
    clone after ``make demo``: ``.venv/bin/prime-runs-otel``)."""
    import shutil
    from pathlib import Path

    here = Path(sys.executable).parent / "prime-runs-otel"
    found = shutil.which("prime-runs-otel")
    if found and Path(found).resolve() == here.resolve():
        return "prime-runs-otel"
    if here.exists():
        try:
            return str(here.relative_to(Path.cwd()))
        except ValueError:
            return str(here)
    return f"{Path(sys.executable).name} -m prime_runs_otel.cli"


class _AboutRun(logging.Filter):
    def __init__(self, local_id: str) -> None:
        super().__init__()
        self.local_id = local_id

    def filter(self, record: logging.LogRecord) -> bool:
        if not record.name.startswith("prime_runs_otel"):
            return True
        return self.local_id not in record.getMessage()


def reported_here(local_id: str) -> None:
    """For the rest of the command, which prints the run's outcome itself,
    the package's own log lines about that run stay quiet: a refused key was
    otherwise said five times over (the delivery's log, the exporter's, the
    run's, then the command's result and summary), and after Ctrl-C the
    exporter's exit repeated what the command had just said."""
    quiet = _AboutRun(local_id)
    for handler in logging.getLogger().handlers:
        handler.addFilter(quiet)
