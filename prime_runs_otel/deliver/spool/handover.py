"""What a member of a Kafka fleet reads from, and writes to, its spool when a
run changes hands (``deliver/kafka``): which of a run's episodes are still
on their way, which open upload carries which episodes, and the episodes
another member delivered already.

In a fleet the spool is the working store of the runs this member owns now;
what must outlive the member is in Kafka. These queries are how the two meet.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from .episodes import EpisodeRow
from .part import SpoolPart
from .rows import chunks, placeholders

#: Episode states that still expect delivery work.
UNDELIVERED = ("pending", "uploading", "sending")


class SpoolHandover(SpoolPart):
    def undelivered_ids(self, run_id: str) -> set[str]:
        """The run's episodes that still wait for the platform."""
        rows = self._query(
            "SELECT episode_id FROM episodes WHERE run_id = ? "
            "AND state IN ('pending', 'uploading', 'sending')",
            (run_id,),
        )
        return {episode_id for (episode_id,) in rows}

    def stored_ids(self, run_id: str, episode_ids: Iterable[str]) -> dict[str, str]:
        """``episode_ids`` the spool holds, with their state."""
        wanted = list(dict.fromkeys(episode_ids))
        found: dict[str, str] = {}
        for chunk in chunks(wanted):
            marks = placeholders(chunk)
            rows = self._query(
                f"SELECT episode_id, state FROM episodes WHERE run_id = ? "
                f"AND episode_id IN ({marks})",
                (run_id, *chunk),
            )
            found.update({episode_id: state for episode_id, state in rows})
        return found

    def open_traces_uploads(self, run_id: str) -> list[tuple[str, list[str]]]:
        """Each Prime Traces upload of the run not confirmed yet, with its
        episodes in the order of its lines."""
        uploads = self._query(
            "SELECT upload_id FROM uploads WHERE run_id = ? AND kind = 'traces' "
            "AND state IN ('pending', 'sending') ORDER BY created_at",
            (run_id,),
        )
        opened = []
        for (upload_id,) in uploads:
            rows = self._query(
                "SELECT episode_id FROM episodes WHERE upload_id = ? ORDER BY seq", (upload_id,)
            )
            opened.append((upload_id, [episode_id for (episode_id,) in rows]))
        return opened

    def upload_state(self, upload_id: str) -> str | None:
        """An upload's state (``committed``, ``abandoned``...), ``None`` if unknown."""
        rows = self._query("SELECT state FROM uploads WHERE upload_id = ?", (upload_id,))
        return str(rows[0][0]) if rows else None

    def pending_in_order(self, run_id: str, episode_ids: Sequence[str]) -> list[EpisodeRow]:
        """The pending episodes among ``episode_ids``, in that order: an
        upload formed again exactly as another member formed it."""
        by_id: dict[str, EpisodeRow] = {}
        for chunk in chunks(episode_ids):
            marks = placeholders(chunk)
            rows = self._query(
                f"SELECT e.seq, episode_id, rollout_number, has_traces, r.body, step "
                f"FROM episodes e JOIN records r ON r.seq = e.seq WHERE run_id = ? "
                f"AND state = 'pending' AND episode_id IN ({marks})",
                (run_id, *chunk),
            )
            for seq, episode_id, number, has_traces, record, step in rows:
                by_id[episode_id] = EpisodeRow(
                    seq, episode_id, number, bool(has_traces), record, step
                )
        return [by_id[episode_id] for episode_id in episode_ids if episode_id in by_id]

    def delivered_elsewhere(self, run_id: str, episode_ids: Iterable[str]) -> int:
        """Episodes another member delivered: pending here, they are marked
        delivered without a request. How many were."""
        states = self.stored_ids(run_id, episode_ids)
        pending = [episode_id for episode_id, state in states.items() if state == "pending"]
        with self._transaction() as db:
            for episode_id in pending:
                seq = db.execute(
                    "SELECT seq FROM episodes WHERE run_id = ? AND episode_id = ?",
                    (run_id, episode_id),
                ).fetchone()[0]
                db.execute("DELETE FROM records WHERE seq = ?", (seq,))
                db.execute("UPDATE episodes SET state = 'delivered' WHERE seq = ?", (seq,))
        return len(pending)
