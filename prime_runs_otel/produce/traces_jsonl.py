"""Reading a verifiers run's ``traces.jsonl`` (one episode record per line).

Shared by both replay paths (in process, and over OTLP) so a bad line is
reported the same way in both: named by its line number, skipped, and the
rest of the file still read.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ..errors import PrimeRunsOtelError


def traces_file(path: Path) -> Path:
    """The file itself, or ``traces.jsonl`` inside a run folder."""
    if path.is_dir():
        candidate = path / "traces.jsonl"
        if not candidate.is_file():
            raise PrimeRunsOtelError(
                f"{path} is a folder without traces.jsonl; pass the file, or the run folder "
                "a verifiers eval wrote (outputs/<run>/)"
            )
        return candidate
    if not path.is_file():
        raise PrimeRunsOtelError(
            f"{path} does not exist; pass a traces.jsonl, or the run folder a verifiers eval "
            "wrote (outputs/<run>/)"
        )
    _check_readable(path)
    return path


def _check_readable(path: Path) -> None:
    """A file that exists but cannot be read (permissions, a failing disk) is
    named here, before anything else is tried with it."""
    try:
        with path.open("rb") as handle:
            handle.read(1)
    except OSError as exc:
        raise PrimeRunsOtelError(
            f"cannot read {path}: {exc.strerror or exc}; check its permissions "
            "(or the disk it is on), or pass a copy you can read"
        ) from None


class NoEpisodesError(PrimeRunsOtelError):
    """A file given to replay that holds no episode record at all (a log, an
    ``export --what samples`` file): refused before any run is made of it,
    in one line rather than one per line."""

    def __init__(self, path: Path, lines: int, problems: list[str]) -> None:
        if not lines:
            found = "it is empty"
        else:
            example = f", e.g. {problems[0]}" if problems else ""
            found = f"none of its {lines} line(s) can be read as one{example}"
        super().__init__(
            f"{path} holds no episodes: replay expects a verifiers traces.jsonl, one JSON "
            f"episode record with a `traces` list per line, and {found}; no run was made. "
            "Pass the traces.jsonl a verifiers eval wrote (outputs/<run>/traces.jsonl)"
        )


#: Bad lines named one by one after a replay; the rest are counted.
BAD_LINES_NAMED = 10


def bad_lines_report(problems: list[str]) -> list[str]:
    """What a replay prints about its bad lines: the first ones named (the
    line and why), the rest counted, so a mostly wrong file does not bury
    the result under one line each."""
    named = problems[:BAD_LINES_NAMED]
    left = len(problems) - len(named)
    return named + ([f"... and {left} more bad line(s), skipped the same way"] if left else [])


def read_records(path: Path, errors: list[str]) -> Iterator[dict[str, Any]]:
    """Each episode record in order; a bad line is described in ``errors``."""
    with path.open("rb") as handle:
        for number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except ValueError as exc:
                errors.append(f"{path.name} line {number}: not JSON ({exc})")
                continue
            if not isinstance(record, dict) or not isinstance(record.get("traces"), list):
                errors.append(f"{path.name} line {number}: not an episode record (no traces list)")
                continue
            yield record


def count_lines(path: Path) -> int:
    with path.open("rb") as handle:
        return sum(1 for line in handle if line.strip())


def environments_of(record: dict[str, Any] | None) -> list[str]:
    """The environment a record names, for a replay given none."""
    env = (record or {}).get("env")
    name = (env.get("id") or env.get("name")) if isinstance(env, dict) else None
    return [str(name)] if name else []
