"""``prime-runs-otel doctor``: is this machine set up to deliver runs?

Each check says what it found and, when something is wrong, what to do
about it. Credentials are reported as present or missing, never printed.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import httpx

from .._json import loads as fast_loads
from .._text import one_line
from ..config import Settings, key_hint, resolve_settings
from ..deliver.spool import RETAKE_RESERVES, DamagedRunError, RunRow, Spool, SpoolError
from ..errors import ConfigError
from .output import human_bytes

OK, WARN, FAIL = "ok", "warn", "fail"


@dataclass(frozen=True)
class Check:
    name: str
    status: str
    detail: str
    fix: str | None = None


def run_checks(*, spool_dir: str | None = None, timeout: float = 5.0) -> list[Check]:
    try:
        settings = resolve_settings(spool_dir=spool_dir)
    except ConfigError as exc:
        return [Check("configuration", FAIL, str(exc), "correct the setting named above")]
    checks = [_configuration(settings), _spool(settings)]
    if settings.mode == "online":
        checks.append(platform_check(settings, timeout))
        checks.append(_reachable("Prime Traces", _traces_probe(settings), settings, timeout))
    return checks


def platform_check(settings: Settings, timeout: float = 5.0) -> Check:
    """The platform API check alone: does it answer, and take the key."""
    return _reachable("platform API", _api_probe(settings), settings, timeout)


def _configuration(settings: Settings) -> Check:
    key = "set" if settings.api_key else "missing"
    detail = (
        f"mode {settings.mode}; API key {key}; API {_redacted(settings.base_url)}; "
        f"Prime Traces {_redacted(settings.traces_url)}; team {settings.team_id or '(personal)'}"
    )
    if settings.mode == "local":
        return Check(
            "configuration",
            WARN,
            detail + "; runs are kept in the local store",
            f"{key_hint()} to deliver runs to the platform",
        )
    if settings.mode == "disabled":
        return Check("configuration", WARN, detail, "unset PRIME_RUNS_MODE to record runs")
    return Check("configuration", OK, detail)


def _spool(settings: Settings) -> Check:
    path = settings.spool_path
    folder = settings.spool_dir
    if folder.exists() and not os.access(folder, os.W_OK):
        return Check(
            "spool",
            FAIL,
            f"{folder} is not writable",
            "fix its permissions or set PRIME_RUNS_OTEL_DIR",
        )
    if not path.exists():  # checking creates nothing: the first run does
        return _no_store_yet(folder)
    try:
        spool = Spool(path, max_bytes=settings.spool_max_bytes)
        integrity = _integrity(path)
        damaged = _damaged_records(path) if integrity == "ok" else 0
        runs = spool.reading.runs()
        unreadable = spool.reading.damaged_runs()
    except (SpoolError, sqlite3.Error) as exc:
        return Check("spool", FAIL, f"{path}: {exc}", "move the file aside; a new spool is created")
    size = spool.housekeeping.used_bytes()
    open_runs = [run for run in runs if not run.settled]
    stuck = [run for run in runs if run.close_state == "gave_up" or run.create_state == "failed"]
    pending = sum(spool.reading.pending_count(run.local_id) for run in runs if run.mode == "online")
    detail = (
        f"{path}: {human_bytes(size)} used of a {human_bytes(settings.spool_max_bytes)} cap"
        f"{_free_pages(spool)}, "
        f"{len(runs)} run(s), {len(open_runs)} open, {pending} episode(s) pending delivery, "
        f"integrity {integrity}"
    )
    if integrity != "ok":
        return Check("spool", FAIL, detail, "move the file aside; a new spool is created")
    facts = _SpoolFacts(detail, stuck, unreadable, damaged, size)
    return _spool_state(spool, settings, facts) or Check("spool", OK, detail)


@dataclass(frozen=True)
class _SpoolFacts:
    """What ``_spool`` read of a spool, for the checks that judge it."""

    detail: str
    stuck: list[RunRow]
    unreadable: list[DamagedRunError]
    damaged: int
    size: int


def _spool_state(spool: Spool, settings: Settings, facts: _SpoolFacts) -> Check | None:
    """What is wrong with a readable spool, worst first; ``None`` when nothing is."""
    folder = settings.spool_dir
    free = spool.housekeeping.disk_free()
    reserve = spool.housekeeping.reserve_bytes
    # Below the reserve, or living on it: delivery released it for its writes.
    if free is not None and (
        free < reserve or (free < 2 * reserve and not spool.housekeeping.reserve_path.exists())
    ):
        return Check(
            "spool",
            FAIL,
            facts.detail
            + f"; the disk holding it is full ({human_bytes(free)} free): new episodes "
            "are refused (counted on their runs) while delivery drains what is stored",
            f"free space on the disk of {folder}, or set PRIME_RUNS_OTEL_DIR to a larger disk",
        )
    return _spool_warning(settings, facts, free, reserve)


def _spool_warning(
    settings: Settings, facts: _SpoolFacts, free: int | None, reserve: int
) -> Check | None:
    """What a working spool should have looked at, worst first; ``None`` when nothing."""
    folder, path = settings.spool_dir, settings.spool_path
    if facts.unreadable:
        names = ", ".join(exc.local_id[:12] for exc in facts.unreadable[:5])
        return Check(
            "spool",
            WARN,
            facts.detail
            + f", but {len(facts.unreadable)} run(s) cannot be read back ({names}): their rows "
            "are damaged, and they are left out of delivery and of every listing",
            "every other run is delivered as usual; remove a damaged run (its episodes go "
            f"with it) with `prime-runs-otel rm --force {facts.unreadable[0].local_id}`, "
            "or keep the spool for inspection",
        )
    if facts.damaged:
        return Check(
            "spool",
            WARN,
            facts.detail + f", but {facts.damaged} stored record(s) are damaged on disk",
            "those episodes fail on delivery, counted on their runs; everything else is "
            "delivered. Check the disk (dmesg, smartctl)",
        )
    shared = _shared(folder, path)
    if shared:
        return Check(
            "spool",
            WARN,
            facts.detail + f"; {shared} can be read by other users of this machine, and episodes "
            "hold prompts and completions",
            f"chmod 700 {folder} && chmod 600 {path}*",
        )
    if facts.stuck:
        names = ", ".join(run.local_id[:12] for run in facts.stuck[:5])
        return Check(
            "spool",
            WARN,
            one_line(facts.detail + f"; stuck: {names} ({facts.stuck[0].last_error})"),
            "fix the cause, then `prime-runs-otel push RUN`",
        )
    if free is not None and free < RETAKE_RESERVES * reserve:
        return Check(
            "spool",
            WARN,
            facts.detail + f"; the disk holding it is nearly full ({human_bytes(free)} free)",
            f"free space on the disk of {folder}, or set PRIME_RUNS_OTEL_DIR to a larger disk",
        )
    if facts.size >= 0.8 * settings.spool_max_bytes:
        return Check("spool", WARN, facts.detail, "deliver pending runs or raise the cap")
    return None


def _no_store_yet(folder: Path) -> Check:
    """No store at ``folder`` yet: whether the first run can create it there."""
    parent = folder
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    if not parent.is_dir() or not os.access(parent, os.W_OK | os.X_OK):
        return Check(
            "spool",
            FAIL,
            f"no store at {folder} yet, and it cannot be created there ({parent} is not a "
            "writable folder)",
            "fix its permissions or set PRIME_RUNS_OTEL_DIR to a writable folder",
        )
    return Check(
        "spool",
        OK,
        f"no store at {folder} yet: the first run creates it (`prime-runs-otel demo` records one)",
    )


def _free_pages(spool: Spool) -> str:
    """The file's free pages, apart from what it holds: room it reuses, but
    that the disk has not got back (a spool from an earlier release keeps
    what ``rm`` and ``prune`` removed that way until ``compact``)."""
    free_pages = spool.housekeeping.free_bytes()
    if not free_pages:
        return ""
    hint = (
        ""
        if spool.housekeeping.gives_back_space()
        else "; `prime-runs-otel compact` gives them back"
    )
    return f" (and {human_bytes(free_pages)} of free pages in the file{hint})"


def _integrity(path: Path) -> str:
    with sqlite3.connect(path, timeout=30) as db:
        row = db.execute("PRAGMA quick_check").fetchone()
    return str(row[0]) if row else "unknown"


def _damaged_records(path: Path) -> int:
    """SQLite checks its pages, not what is in them: a stored record damaged
    on disk shows only when it is parsed. Every body is parsed here."""
    damaged = 0
    with contextlib.closing(sqlite3.connect(path, timeout=30)) as db:
        for (body,) in db.execute("SELECT body FROM records"):
            try:
                fast_loads(body)
            except (ValueError, RecursionError):
                damaged += 1
    return damaged


def _shared(folder: Path, path: Path) -> str | None:
    """The spool's folder or file, when others than its owner may read it."""
    for member in (folder, path):
        try:
            mode = member.stat().st_mode
        except OSError:
            continue
        if mode & 0o077:
            return f"{member} (mode {oct(mode & 0o777)})"
    return None


def _redacted(url: str) -> str:
    """A URL fit to print: credentials in it (user:password@, query values) hidden."""
    try:
        parts = urllib.parse.urlsplit(url)
    except ValueError:
        return "(an unparsable URL)"
    netloc = parts.netloc
    if "@" in netloc:
        netloc = "***@" + netloc.rsplit("@", 1)[1]
    query = urllib.parse.urlencode(
        [(name, "***") for name, _ in urllib.parse.parse_qsl(parts.query, keep_blank_values=True)],
        safe="*",
    )
    return one_line(urllib.parse.urlunsplit(parts._replace(netloc=netloc, query=query)))


Probe = Callable[[httpx.Client], httpx.Response]


def _api_probe(settings: Settings) -> Probe:
    def probe(client: httpx.Client) -> httpx.Response:
        params: dict[str, str | int] = {"limit": 1}
        if settings.team_id:
            params["team_id"] = settings.team_id
        return client.get(f"{settings.base_url}/api/v1/evaluations/", params=params)

    return probe


def _traces_probe(settings: Settings) -> Probe:
    def probe(client: httpx.Client) -> httpx.Response:
        return client.get(f"{settings.traces_url}/api/v1/traces", params={"limit": 1})

    return probe


def _reachable(name: str, probe: Probe, settings: Settings, timeout: float) -> Check:
    headers = {"Authorization": f"Bearer {settings.api_key}"}
    if settings.team_id:
        headers["X-Prime-Team-ID"] = settings.team_id
    try:
        with httpx.Client(headers=headers, timeout=timeout) as client:
            response = probe(client)
    except httpx.HTTPError as exc:
        return Check(
            name,
            FAIL,
            f"unreachable: {type(exc).__name__}",
            "check the URL and the network; runs wait in the spool meanwhile",
        )
    status = response.status_code
    if status == 401:
        return Check(name, FAIL, "the API key was refused (401)", "check PRIME_API_KEY")
    if status == 403:
        return Check(
            name, WARN, "reachable, but this key or team has no access (403)", "check PRIME_TEAM_ID"
        )
    if status >= 500:
        return Check(name, WARN, f"reachable, answering {status}", "try again later")
    return Check(name, OK, f"reachable (HTTP {status})")
