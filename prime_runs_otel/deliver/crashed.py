"""Runs whose producers died without ending them: ended here as *crashed*.

A producer that exits normally sends a run-end span; one that is killed, or
whose host goes away, never does, and its run would stay RUNNING on the
platform forever. The uploader checks each open run on every pass and ends
the ones nobody feeds any more, so they close like any other ended run.
"""

from __future__ import annotations

import logging
import socket
import time

from .spool import RunRow, Spool, process_alive

logger = logging.getLogger(__name__)


def end_if_crashed(
    spool: Spool, run: RunRow, idle_timeout: float | None, *, log: bool = True
) -> RunRow:
    """A run whose producers are all gone without an end span crashed.

    Producers on this host are checked by pid (and start time, against pid
    reuse); producers elsewhere, and runs fed through a collector, by how
    long they have been silent (``idle_timeout``).
    """
    now = time.time()
    host = socket.gethostname()
    # A worker feeding somebody else's run ending says nothing of the run.
    producers = spool.delivery.producers(run.local_id, owners_only=True)
    alive = False
    local_alive = False
    for producer_host, pid, start, seen in producers:
        if producer_host == host:
            local_alive = local_alive or process_alive(pid, start)
        elif idle_timeout is None or now - seen < idle_timeout:
            alive = True
    alive = alive or local_alive
    # A live process on this host feeding the run is never timed out: a
    # slow eval sharing the spool with `serve` is not a crashed one.
    silent = idle_timeout is not None and not local_alive and now - run.last_seen >= idle_timeout
    if producers and not alive:
        reason = "the producer process exited without ending the run"
    elif silent:
        reason = f"no spans for {idle_timeout:.0f}s and no end span"
    else:
        return run
    if log:  # a command that says so in its own words passes False
        logger.warning("Run %s crashed: %s", run.local_id, reason)
    spool.intake.end_run(run.local_id, "crashed", reason)
    # Read back here rather than with lifecycle.reload: that module brings the
    # platform clients, and `runs` and `show` end dead runs without them.
    ended = spool.reading.run(run.local_id)
    assert ended is not None, "runs are never deleted from the spool"
    return ended


def end_runs_of_dead_producers(spool: Spool) -> list[str]:
    """End as crashed, now, the open runs whose owning producers all ran on
    this host and are all gone; return their ids.

    What the uploader of the next run to open the spool would do, done by
    the store commands (``runs``, ``show``, ``rm``...) so that a killed eval
    is not shown as still recording until then. Only certain deaths count
    (no idle timeout): a producer on another host, and a run fed through
    ``serve``, which records no producer of its own, are never ended here.
    A local run is closed too, as the uploader closes it; an online one is
    left for delivery to close on the platform (``push``).
    """
    ended = []
    for local_id in spool.delivery.open_runs_fed_in_process():
        run = spool.reading.run(local_id)
        if run is None or run.end_status is not None:
            continue
        run = end_if_crashed(spool, run, None, log=False)
        if run.end_status is None:
            continue
        if run.mode == "local":
            spool.delivery.update_run(local_id, close_state="closed", closed_at=time.time())
        ended.append(local_id)
    return ended
