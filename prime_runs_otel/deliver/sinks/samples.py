"""The legacy sample table of an eval run: each episode's v0 sample rows,
``POST``-ed to the evaluations API, at most once.

The table appends, and a request whose answer was lost may have been stored,
so such a request is never sent again: its episodes are counted *uncertain*
(a lost batch is one hole, duplicated rows would skew every average). The
spool records each request before it is sent, so a process that dies
mid-request leaves the same account for the next one. A request refused for
its rows (400, 413, 422) stored nothing: one of several episodes is sent
again in halves until the episode responsible is alone; a refusal about the
set-up stops the run's delivery with its episodes kept (``refusals.py``).
Used by accounts not on Prime Traces and by runs that opt out of it.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from ..._json import loads as fast_loads
from ...read.projection import (
    MAX_SAMPLES_PAYLOAD_BYTES,
    SampleTooLargeError,
    batch_sample_rows,
    encode_samples_body,
    episode_sample_rows,
)
from ..backoff import Backoff
from ..clients import PlatformClients
from ..lease import Lease
from ..platform.http import PlatformError
from ..refusals import Narrowing, about_content, refused_setup
from ..spool import EpisodeRow, RunRow, Spool, UploadRow
from .base import fail_unsendable, refused_late

logger = logging.getLogger(__name__)

#: Legacy sample batches are read a request's worth at a time.
SAMPLES_BATCH_BYTES = 20 * 1024 * 1024


class SamplesSink:
    """Sample rows to the evaluations API."""

    def __init__(
        self, spool: Spool, clients: PlatformClients, lease: Lease, narrowing: Narrowing
    ) -> None:
        self._spool = spool
        self._clients = clients
        self._lease = lease
        self._narrowing = narrowing

    def send(self, run: RunRow, episodes: Sequence[EpisodeRow]) -> None:
        """Rows grouped into requests, an episode's rows never split across
        two requests unless the episode alone exceeds one."""
        requests: list[tuple[list[int], list[dict[str, Any]]]] = []
        empty: list[int] = []
        current_seqs: list[int] = []
        current_rows: list[dict[str, Any]] = []
        current_size = 0
        for episode in episodes:
            rows = self._sample_rows(run, episode)
            if rows is None:
                continue
            if not rows:
                empty.append(episode.seq)
                continue
            try:
                size = len(encode_samples_body(rows))
            except Exception as exc:
                fail_unsendable(self._spool, run, episode, exc)
                continue
            if size > MAX_SAMPLES_PAYLOAD_BYTES:
                try:
                    chunks = batch_sample_rows(rows)
                except SampleTooLargeError as exc:
                    self._spool.delivery.fail_episodes(run.local_id, [episode.seq], str(exc))
                    logger.error("Run %s: %s; counted as failed", run.local_id, exc)
                    continue
                requests.extend(([episode.seq], chunk) for chunk in chunks)
                continue
            if current_rows and current_size + size > MAX_SAMPLES_PAYLOAD_BYTES:
                requests.append((current_seqs, current_rows))
                current_seqs, current_rows, current_size = [], [], 0
            current_seqs.append(episode.seq)
            current_rows.extend(rows)
            current_size += size
        if current_rows:
            requests.append((current_seqs, current_rows))
        if empty:
            self._spool.delivery.deliver_without_request(empty)
        for seqs, rows in requests:
            if not self._send(run, seqs, rows):
                return  # narrowed: the rest goes in smaller requests

    def resume(self, run: RunRow, upload: UploadRow) -> None:
        """A request that was under way when delivery stopped is not sent
        again: it may have been stored."""
        count = self._spool.delivery.end_samples_request(
            run.local_id, upload.upload_id, "uncertain"
        )
        logger.warning(
            "Run %s: %d episode(s) were being sent to the sample table when delivery "
            "stopped; they may or may not be stored, and are not sent again "
            "(duplicate rows would skew every average). Counted as uncertain.",
            run.local_id,
            count,
        )

    def _sample_rows(self, run: RunRow, episode: EpisodeRow) -> list[dict[str, Any]] | None:
        try:
            return episode_sample_rows(fast_loads(episode.record), episode.rollout_number or 1)
        except Exception as exc:
            reason = f"episode {episode.episode_id} has no sample projection: {exc}"
            self._spool.delivery.fail_episodes(run.local_id, [episode.seq], reason)
            logger.error("Run %s: %s; counted as failed", run.local_id, reason)
            return None

    def _send(self, run: RunRow, seqs: list[int], rows: list[dict[str, Any]]) -> bool:
        """One request; ``False`` when it was refused for its rows and the
        rest of the batch must wait for smaller requests."""
        evals = self._clients.evals()
        assert run.platform_id is not None
        body = encode_samples_body(rows)
        upload_id = self._spool.delivery.begin_samples_request(run.local_id, seqs)
        self._lease.renew()
        try:
            evals.post_samples(run.platform_id, body)
        except PlatformError as exc:
            if exc.ambiguous:
                count = self._spool.delivery.end_samples_request(
                    run.local_id, upload_id, "uncertain"
                )
                logger.warning(
                    "Run %s: a sample request failed after it may have been stored (%s); its "
                    "%d episode(s) are counted as uncertain and not sent again.",
                    run.local_id,
                    exc,
                    count,
                )
                return True
            self._spool.delivery.end_samples_request(run.local_id, upload_id, "pending")
            if exc.retryable:
                raise Backoff(exc) from exc
            if run.closed and not about_content(exc):
                refused_late(self._spool, run, seqs, exc)
                return True
            if not about_content(exc):
                raise refused_setup(exc, "the sample table request") from exc
            if len(seqs) > 1:
                self._narrowing.refused(run.local_id, len(seqs))
                logger.info(
                    "Run %s: a sample request of %d episodes was refused (%s); retrying in "
                    "halves to isolate the episode responsible",
                    run.local_id,
                    len(seqs),
                    exc,
                )
                return False
            self._spool.delivery.fail_episodes(
                run.local_id, seqs, f"the sample table refused: {exc}"
            )
            logger.error(
                "Run %s: the sample table refused %d episode(s): %s", run.local_id, len(seqs), exc
            )
            return True
        self._spool.delivery.end_samples_request(run.local_id, upload_id, "delivered")
        self._narrowing.delivered(run.local_id)
        return True
