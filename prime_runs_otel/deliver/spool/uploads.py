"""The ``uploads`` table in general: which uploads of a run are still open
(of any kind: Prime Traces, legacy sample requests, step objects), which
episodes each one carries, and what a confirmed one does to them. Each kind's
own steps are in ``traces``, ``samples`` and ``steps``."""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass

from .episodes import drop_records
from .part import SpoolPart


@dataclass(frozen=True)
class UploadRow:
    upload_id: str
    run_id: str
    kind: str
    body: bytes | None
    episodes: int
    state: str
    body_encoding: str | None = None


def commit_upload(db: sqlite3.Connection, upload_id: str) -> None:
    """An upload the platform confirmed: its episodes are delivered, and
    neither their bodies nor the upload's are kept."""
    drop_records(db, "upload_id = ? AND state = 'uploading'", (upload_id,))
    db.execute(
        "UPDATE episodes SET state = 'delivered' WHERE upload_id = ? AND state = 'uploading'",
        (upload_id,),
    )
    db.execute(
        "UPDATE uploads SET state = 'committed', body = NULL WHERE upload_id = ?", (upload_id,)
    )


class SpoolUploads(SpoolPart):
    """The open uploads of a run, of any kind (``delivery``)."""

    def open_uploads(self, run_id: str) -> list[UploadRow]:
        rows = self._query(
            "SELECT upload_id, run_id, kind, body, episodes, state, body_encoding FROM uploads "
            "WHERE run_id = ? AND state IN ('pending', 'sending') ORDER BY created_at",
            (run_id,),
        )
        return [UploadRow(*row) for row in rows]

    def upload_episode_seqs(self, upload_id: str) -> list[int]:
        rows = self._query("SELECT seq FROM episodes WHERE upload_id = ?", (upload_id,))
        return [seq for (seq,) in rows]

    def release_upload(self, upload_id: str) -> None:
        """An upload that will not go as it is (refused whole for its content,
        so nothing of it was stored, or held back while its run's delivery is
        stopped): its episodes go back to pending, to be sent again."""
        with self._transaction() as db:
            db.execute(
                "UPDATE episodes SET state = 'pending', upload_id = NULL "
                "WHERE upload_id = ? AND state = 'uploading'",
                (upload_id,),
            )
            db.execute(
                "UPDATE uploads SET state = 'abandoned', body = NULL WHERE upload_id = ?",
                (upload_id,),
            )
