"""Prime Traces uploads: exactly once. The bytes of each upload and its
idempotency key are persisted before the first attempt, so a retry or a
restart sends the same request and the service replays its receipt."""

from __future__ import annotations

import time
from collections.abc import Sequence

from .part import SpoolPart
from .rows import for_seqs
from .uploads import commit_upload


class SpoolTraces(SpoolPart):
    """Prime Traces uploads, exactly once (``delivery``)."""

    def begin_traces_upload(
        self, run_id: str, seqs: Sequence[int], upload_id: str, body: bytes, *, encoding: str
    ) -> None:
        """Persist an upload's bytes and claim its episodes in one transaction.

        ``body`` is stored as it will be sent (``encoding`` ``"gzip"``): a
        few times smaller than the lines, and a replay sends it unchanged.
        The same bytes may have been an upload before (one released when its
        run's delivery stopped, then pushed): that upload is taken up again,
        so its episodes are claimed by it whatever became of it.
        """
        with self._transaction() as db:
            db.execute(
                "INSERT INTO uploads (upload_id, run_id, kind, body, episodes, state, created_at, "
                "body_encoding) VALUES (?, ?, 'traces', ?, ?, 'pending', ?, ?) "
                "ON CONFLICT (upload_id) DO UPDATE SET body = excluded.body, "
                "episodes = excluded.episodes, state = 'pending', "
                "body_encoding = excluded.body_encoding",
                (upload_id, run_id, body, len(seqs), time.time(), encoding),
            )
            for_seqs(
                db,
                "UPDATE episodes SET state = 'uploading', upload_id = ? "
                "WHERE seq IN ({seqs}) AND state = 'pending'",
                seqs,
                (upload_id,),
            )

    def commit_traces_upload(self, run_id: str, upload_id: str) -> int:
        """The receipt arrived: the episodes are delivered and their bodies
        dropped. Returns how many of them carried traces.

        Committed without waiting for the disk (the next upload's begin, or
        any other commit, waits for both): lost to a power cut, the upload is
        open again with its stored bytes, the next process sends them again
        under the same key, and the service answers with the receipt of the
        one it stored. Nothing is stored twice, and the next upload of the
        run does not wait for an fsync that exactly-once does not need. The
        begin is different: its bytes and key must be on disk before the
        request leaves, or a power cut after it could send the same episodes
        again in another upload, under another key."""
        with self._transaction(fsync=False) as db:
            written = db.execute(
                "SELECT COUNT(*) FROM episodes WHERE upload_id = ? AND has_traces = 1 "
                "AND state = 'uploading'",
                (upload_id,),
            ).fetchone()[0]
            commit_upload(db, upload_id)
            db.execute(
                "UPDATE runs SET traces_written = traces_written + ? WHERE local_id = ?",
                (written, run_id),
            )
            return int(written)

    def abandon_traces_uploads(self, run_id: str, *, sink: str) -> None:
        """Prime Traces is not enabled for the account: every claimed episode
        goes back to pending, for the legacy sample table (``sink``)."""
        with self._transaction() as db:
            db.execute(
                "UPDATE episodes SET state = 'pending', upload_id = NULL "
                "WHERE run_id = ? AND state = 'uploading'",
                (run_id,),
            )
            db.execute(
                "UPDATE uploads SET state = 'abandoned', body = NULL "
                "WHERE run_id = ? AND kind = 'traces' AND state = 'pending'",
                (run_id,),
            )
            db.execute("UPDATE runs SET sink = ? WHERE local_id = ?", (sink, run_id))
