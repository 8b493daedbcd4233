"""Legacy sample requests: at most once. A request is marked *sending*
before its rows go out, so a request that may have acted is never replayed
(duplicate rows would skew every average); its episodes count as uncertain."""

from __future__ import annotations

import time
import uuid
from collections.abc import Sequence

from .episodes import drop_records
from .part import SpoolPart
from .rows import for_seqs


class SpoolSamples(SpoolPart):
    """Legacy sample requests, at most once (``delivery``)."""

    def begin_samples_request(self, run_id: str, seqs: Sequence[int]) -> str:
        """Mark episodes as *sending* before their rows go out. Should the
        process die before the answer, the next one finds them still sending
        and counts them uncertain instead of appending the rows twice."""
        upload_id = f"samples:{uuid.uuid4().hex}"
        with self._transaction() as db:
            db.execute(
                "INSERT INTO uploads (upload_id, run_id, kind, body, episodes, state, created_at) "
                "VALUES (?, ?, 'samples', NULL, ?, 'sending', ?)",
                (upload_id, run_id, len(set(seqs)), time.time()),
            )
            for_seqs(
                db,
                "UPDATE episodes SET state = 'sending', upload_id = ? WHERE seq IN ({seqs})",
                sorted(set(seqs)),
                (upload_id,),
            )
        return upload_id

    def end_samples_request(self, run_id: str, upload_id: str, outcome: str) -> int:
        """``outcome``: delivered, uncertain (may have acted) or pending (did
        not act; retried). Returns the number of episodes it touched."""
        with self._transaction() as db:
            if outcome == "delivered":
                drop_records(db, "upload_id = ? AND state = 'sending'", (upload_id,))
            cursor = db.execute(
                "UPDATE episodes SET state = ?, "
                "upload_id = CASE WHEN ? = 'pending' THEN NULL ELSE upload_id END "
                "WHERE upload_id = ? AND state = 'sending'",
                (outcome, outcome, upload_id),
            )
            count = cursor.rowcount
            upload_state = {"delivered": "committed", "pending": "abandoned"}.get(outcome, outcome)
            db.execute(
                "UPDATE uploads SET state = ? WHERE upload_id = ?", (upload_state, upload_id)
            )
            if outcome == "uncertain":
                db.execute(
                    "UPDATE runs SET uncertain = uncertain + ? WHERE local_id = ?",
                    (count, run_id),
                )
            return count
