"""What the local store holds, read for people: the runs behind ``runs``,
``show``, every ``--json`` and the viewer's pages, and nothing that prints.

One vocabulary for every command and page that describes a run (see
:func:`run_view`): ``status`` is how the run ended (``running`` until it
does), ``state`` where it is in its life (``recording``, ``stored`` in the
local store, ``delivering``, ``paused`` when nothing delivers it any more,
``delivered``, ``stopped`` on a permanent refusal), ``pending`` the
episodes still on their way to the platform and ``not_pushed`` those of a
local run nobody has pushed yet.

In ``view/`` rather than beside the commands because the viewer reads the
same runs the same way, and the words it shows stay the words the command
line prints.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from ..deliver.advice import next_step
from ..deliver.spool import RunRow, Spool
from ..deliver.summary import run_summary

STATES = ("recording", "stored", "delivering", "paused", "delivered", "stopped")
STATUSES = ("running", "completed", "failed", "cancelled", "crashed")


def episode_delivery(run: RunRow, state: str) -> str:
    """An episode's delivery state in the words ``runs`` and ``show`` use:
    ``not pushed`` for a local run's episode, as the run's count says."""
    if run.mode == "local" and state == "pending":
        return "not pushed"
    return state


def run_state(run: RunRow, pending: int, delivering: bool = True) -> str:
    """Where the run is in its life; ``pending``: its episodes still on their
    way; ``delivering``: a process delivers from the spool now. A closed run
    is ``delivered`` only once none is: episodes that arrived after its close
    (late) are still being delivered. A run that still has something to
    deliver while no process delivers is ``paused`` (the delivering process
    was stopped, e.g. Ctrl-C during ``push``): ``push`` resumes it."""
    if run.stopped:
        return "stopped"
    if run.mode == "local":
        return "stored" if run.closed else "recording"
    if run.closed and not pending:
        return "delivered"
    if run.closed or run.end_status:
        return "delivering" if delivering else "paused"
    return "recording"


def run_view(spool: Spool, run: RunRow) -> dict[str, Any]:
    """A run as every command prints it in ``--json`` (the keys are documented
    in docs/cli.md and stay stable)."""
    waiting = spool.reading.waiting_count(run)
    local = run.mode == "local"
    state = run_state(run, waiting, spool.reading.delivery_alive())
    return {
        "id": run.local_id,
        "name": run.name,
        "kind": run.kind,
        "mode": run.mode,
        "status": run.end_status or "running",
        "state": state,
        "closed": run.closed,
        "model": run.identity.model,
        "environments": list(run.identity.environments),
        "platform_id": run.platform_id,
        "url": run.url,
        "episodes": run.episodes,
        # Local runs wait for nobody: their episodes are stored, to be pushed.
        "pending": 0 if local else waiting,
        "not_pushed": waiting if local else 0,
        "failed": run.failed,
        "rejected": run.rejected,
        "uncertain": run.uncertain,
        "corrupt": run.corrupt,
        "unencodable": run.unencodable,
        "duplicates": run.duplicates,
        "late": run.late,
        "late_refused": run.late_refused,
        "error": run.end_error,
        "last_error": run.last_error,
        "next_step": _next_step(run, state),
        "created_at": _iso(run.created_at),
        "ended_at": _iso(run.ended_at) if run.ended_at else None,
        "summary": run_summary(run),
        "spool": str(spool.path),
    }


def _next_step(run: RunRow, state: str) -> str | None:
    """The command that moves a run on, where it waits for one."""
    if run.stopped:
        return next_step(run.local_id, run.last_error)
    if state == "paused":
        return (
            f"`prime-runs-otel push {run.local_id[:12]}` resumes its delivery (the process "
            "that delivered it was stopped before it was done)"
        )
    return None


def _iso(stamp: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(stamp))


def select_runs(
    spool: Spool,
    *,
    statuses: Sequence[str] = (),
    kind: str | None = None,
    name: str | None = None,
    since: float | None = None,
    older_than: float | None = None,
) -> list[RunRow]:
    """Runs newest first, filtered; a status filter matches ``status`` or ``state``."""
    chosen = []
    now = time.time()
    delivering = spool.reading.delivery_alive()
    for row in spool.reading.runs():
        state = run_state(
            row, spool.reading.pending_count(row.local_id) if row.closed else 0, delivering
        )
        if statuses and not {row.end_status or "running", state} & set(statuses):
            continue
        if kind and row.kind != kind:
            continue
        if name and name.lower() not in (row.name or "").lower():
            continue
        if since is not None and row.created_at < since:
            continue
        if older_than is not None and now - row.created_at < older_than:
            continue
        chosen.append(row)
    return chosen


def runs_named(spool: Spool, key: str) -> list[RunRow]:
    """The runs ``key`` names: by id, platform id or a unique prefix of
    either (one run), else by exact name (as many as share it)."""
    run = spool.reading.find_run(key)
    if run is not None:
        return [run]
    return [row for row in spool.reading.runs() if row.name == key]


def run_about(run: RunRow) -> str:
    """What a run is, in a line: kind, model, environments, framework."""
    identity = run.identity
    about = [run.kind]
    if identity.model:
        about.append(f"model {identity.model}")
    if identity.environments:
        about.append("environments " + ", ".join(identity.environments))
    if identity.framework:
        about.append(f"framework {identity.framework}")
    return " · ".join(about)
