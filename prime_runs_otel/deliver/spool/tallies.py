"""Counts over the whole spool, for watching a ``serve`` (its /metrics):
episodes by state (``episode_states``, kept by triggers), runs by where they
are in their life, late episodes, and when the oldest episode still on its
way was stored. Each is a read of small tables or an index seek per run
with something pending, never a pass over the episodes."""

from __future__ import annotations

from dataclasses import dataclass, field

from .part import SpoolPart

#: Episode states that mean "not delivered yet, and still being tried".
PENDING_STATES = ("pending", "uploading", "sending")


@dataclass(frozen=True)
class SpoolCounts:
    #: Episodes by state: pending, uploading, sending, delivered, failed, ...
    episodes: dict[str, int] = field(default_factory=dict)
    #: Runs by where they are: open (no end yet), closing (ended, not closed),
    #: closed, stopped (a permanent refusal, waiting for ``push``).
    runs: dict[str, int] = field(default_factory=dict)
    late: int = 0
    late_refused: int = 0
    #: When the oldest episode still pending was stored (None: none is).
    oldest_pending_at: float | None = None

    @property
    def pending(self) -> int:
        return sum(self.episodes.get(state, 0) for state in PENDING_STATES)


class SpoolTallies(SpoolPart):
    """Counts over the whole spool, for watching it (``housekeeping``)."""

    def counts(self) -> SpoolCounts:
        episodes = {
            state: int(count)
            for state, count in self._query(
                "SELECT state, SUM(count) FROM episode_states GROUP BY state"
            )
        }
        runs: dict[str, int] = {}
        late = late_refused = 0
        for where, count, late_here, refused_here in self._query(
            "SELECT CASE WHEN close_state = 'gave_up' OR create_state = 'failed' THEN 'stopped' "
            "WHEN close_state = 'closed' THEN 'closed' WHEN end_status IS NULL THEN 'open' "
            "ELSE 'closing' END, COUNT(*), SUM(late), SUM(late_refused) FROM runs GROUP BY 1"
        ):
            runs[where] = int(count)
            late += int(late_here or 0)
            late_refused += int(refused_here or 0)
        return SpoolCounts(episodes, runs, late, late_refused, self._oldest_pending_at())

    def _oldest_pending_at(self) -> float | None:
        marks = ", ".join("?" * len(PENDING_STATES))
        waiting = self._query(
            f"SELECT run_id, state FROM episode_states WHERE state IN ({marks}) AND count > 0",
            PENDING_STATES,
        )
        oldest: float | None = None
        for run_id, state in waiting:
            rows = self._query(
                "SELECT stored_at FROM episodes WHERE run_id = ? AND state = ? "
                "ORDER BY seq LIMIT 1",
                (run_id, state),
            )
            if rows and rows[0][0] is not None:
                stored_at = float(rows[0][0])
                oldest = stored_at if oldest is None else min(oldest, stored_at)
        return oldest
