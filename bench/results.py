"""The figures of one `make bench`, kept per commit: `bench/results/<commit>.json`.

Every benchmark prints its figures as ``name value unit`` lines; `run_all.py`
collects them under the label of the run that printed them (the same script
runs at several sizes and paces) and writes them here, with the commit they
were measured on, the date, the machine and its load. `compare.py` reads two
such files. A file is small (a few hundred figures), so the results of the
commits that were measured are committed beside the code they describe.
"""

from __future__ import annotations

import datetime
import json
import math
import os
import platform
import re
import subprocess
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
RESULTS = os.path.join(HERE, "results")

#: ``name value unit``: a figure line as every benchmark prints it.
FIGURE = re.compile(r"^([A-Za-z_][\w.\-\[\]]*) (-?(?:\d+\.?\d*(?:e[-+]?\d+)?|nan|inf)) ?(\S*)$")


def figures_in(text: str) -> dict[str, tuple[float, str]]:
    """The ``name value unit`` lines of a benchmark's output."""
    found: dict[str, tuple[float, str]] = {}
    for line in text.splitlines():
        match = FIGURE.match(line.strip())
        if match:
            found[match.group(1)] = (float(match.group(2)), match.group(3))
    return found


def commit() -> str:
    """The commit measured: its short id, ``-dirty`` when tracked files differ
    from it (figures of uncommitted code, kept apart from the commit's own)."""
    head = _git("rev-parse", "--short=7", "HEAD") or "unknown"
    dirty = _git("status", "--porcelain", "--untracked-files=no")
    return f"{head}-dirty" if dirty else head


def _git(*args: str) -> str:
    try:
        done = subprocess.run(
            ["git", *args], cwd=HERE, capture_output=True, text=True, check=False, timeout=30
        )
    except OSError:
        return ""
    return done.stdout.strip() if done.returncode == 0 else ""


def path_for(commit_id: str) -> str:
    return os.path.join(RESULTS, f"{commit_id}.json")


def write(
    commit_id: str, figures: dict[str, tuple[float, str]], loads: list[float], command: str
) -> str:
    """Write the figures measured on ``commit_id`` (the commit at hand when
    the benchmarks began); returns the file's path."""
    document: dict[str, Any] = {
        "commit": commit_id,
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "command": command,
        "machine": (
            f"{os.cpu_count()} cores, Python {platform.python_version()}, "
            f"{platform.system()} {platform.machine()}"
        ),
        # The 1-minute load average before each benchmark: on a shared
        # machine, figures taken under load are not comparable to idle ones.
        "load": [round(load, 2) for load in loads],
        # A figure that could not be taken (nan: no export() calls) is null.
        "figures": {
            name: {"value": value if math.isfinite(value) else None, "unit": unit}
            for name, (value, unit) in figures.items()
        },
    }
    os.makedirs(RESULTS, exist_ok=True)
    path = path_for(commit_id)
    with open(path, "w", encoding="utf-8") as file:
        json.dump(document, file, indent=1, sort_keys=False)
        file.write("\n")
    return path


def read(where: str) -> dict[str, Any]:
    """A results file, by path or by commit (``bench/results/<commit>.json``;
    a commit given longer or shorter than its file's name matches by prefix)."""
    if os.path.isfile(where):
        path = where
    else:
        names = sorted(os.listdir(RESULTS)) if os.path.isdir(RESULTS) else []
        matches = [
            name
            for name in names
            if name.endswith(".json")
            and (name[:-5].startswith(where) or where.startswith(name[:-5]))
        ]
        if len(matches) != 1:
            known = ", ".join(name[:-5] for name in names if name.endswith(".json")) or "none yet"
            raise SystemExit(
                f"no single results file for {where!r} in bench/results/ (there are: {known}); "
                "run `make bench` on that commit first, or pass a file's path"
            )
        path = os.path.join(RESULTS, matches[0])
    with open(path, encoding="utf-8") as file:
        document: dict[str, Any] = json.load(file)
    return document
