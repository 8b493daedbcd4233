"""The legacy step table of a training run: the episodes of every 10th step
(as prime-rl and prime-runs do) as one Parquet object per step, through the
RFT API's presign → PUT → confirm.

Used when the account is not on Prime Traces. Each object's bytes and, once
presigned, its place are kept in the spool, and every one of the three
requests is safe to repeat, so a restart resumes an object wherever it
stopped. Episodes of the other steps reach no table, and are not a loss: the
table never held them.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence

from ..._text import shown
from ...read.projection import (
    STEP_TABLE_INTERVAL,
    ParquetUnavailableError,
    require_parquet,
    with_run_id,
)
from ...read.projection import step_table_parquet as _step_table_parquet
from ..clients import PlatformClients
from ..platform.http import PlatformError
from ..refusals import Narrowing, about_content, refused_setup
from ..spool import EpisodeRow, RunRow, Spool, StepUpload, UploadRow
from .base import narrow

__all__ = ["SAMPLE_ID_STRIDE", "StepTablesSink"]

logger = logging.getLogger(__name__)

#: Each Parquet object of a step numbers its samples from its own range
#: (``index * stride``), so the viewer's (step, sample_id) key stays unique
#: across the objects of one step. Ids stay below 2**53 for the viewer.
SAMPLE_ID_STRIDE = 1 << 32


class StepTablesSink:
    """Step tables to the RFT API. Failures that may pass are raised as the
    :class:`~..platform.http.PlatformError` they are, for the training run's
    delivery to pause on; a refusal of an object's content narrows it down to
    the episode responsible, which alone fails; a refusal about the set-up
    stops the run's delivery with the object kept (``refusals.py``)."""

    def __init__(self, spool: Spool, clients: PlatformClients, narrowing: Narrowing) -> None:
        self._spool = spool
        self._clients = clients
        self._narrowing = narrowing

    def send(self, run: RunRow, episodes: Sequence[EpisodeRow]) -> None:
        """One object per step of every 10th; the other steps' episodes are
        marked skipped."""
        assert run.platform_id is not None
        try:
            require_parquet()
        except ParquetUnavailableError as exc:
            self._spool.delivery.fail_episodes(run.local_id, [e.seq for e in episodes], str(exc))
            logger.error(
                "Run %s: %s; %d episode(s) counted as failed", run.local_id, exc, len(episodes)
            )
            return
        by_step: dict[int, list[EpisodeRow]] = {}
        skipped: list[int] = []
        for episode in episodes:
            if episode.step is None or episode.step % STEP_TABLE_INTERVAL:
                skipped.append(episode.seq)
            else:
                by_step.setdefault(episode.step, []).append(episode)
        if skipped:
            self._spool.delivery.skip_episodes(skipped)
        for step, members in sorted(by_step.items()):
            self._upload_step(run, step, members)

    def resume(self, run: RunRow, upload: UploadRow) -> None:
        self._send_step(run, upload.upload_id)

    def _upload_step(self, run: RunRow, step: int, members: Sequence[EpisodeRow]) -> None:
        assert run.platform_id is not None
        offset = self._spool.steps.step_upload_count(run.local_id, step) * SAMPLE_ID_STRIDE
        records = []
        readable = []
        for member in members:
            try:
                records.append(json.loads(member.record))
            except (ValueError, RecursionError) as exc:
                self._spool.delivery.fail_episodes(
                    run.local_id, [member.seq], f"its stored record cannot be read: {exc}"
                )
                logger.error(
                    "Run %s: the stored record of episode %s cannot be read (%s); counted "
                    "as failed",
                    shown(run.local_id),
                    shown(member.episode_id),
                    shown(exc),
                )
                continue
            readable.append(member)
        seqs = [member.seq for member in readable]
        if not records:
            return
        try:
            body = _step_table_parquet(records, run.platform_id, step, sample_id_offset=offset)
        except Exception as exc:  # records are outside input: one table's loss, not the run's
            reason = f"the step {step} table cannot be built from its records: {exc}"
            self._spool.delivery.fail_episodes(run.local_id, seqs, reason)
            logger.error(
                "Run %s: %s; %d episode(s) counted as failed",
                shown(run.local_id),
                shown(reason),
                len(seqs),
            )
            return
        if body is None:  # no episode with a trajectory: nothing for the viewer
            self._spool.delivery.skip_episodes(seqs)
            return
        upload_id = self._spool.steps.begin_step_upload(run.local_id, step, seqs, body, offset)
        self._send_step(run, upload_id)

    def _send_step(self, run: RunRow, upload_id: str) -> None:
        """Presign (once: the object's place is kept), PUT, confirm. Each is
        safe to repeat, so a restart resumes wherever this stopped."""
        assert run.platform_id is not None
        upload = self._spool.steps.step_upload(upload_id)
        if upload is None or upload.body is None:
            return
        # A table its producer wrote before the run had a platform id.
        body = with_run_id(upload.body, run.platform_id)
        rft = self._clients.rft()
        try:
            url, key = self._place(run, upload)
            try:
                rft.put_samples(url, body)
            except PlatformError as exc:
                if exc.status != 403:
                    raise
                # The grant expired while the upload waited: a fresh one, once.
                self._spool.steps.set_step_object(upload_id, None, None)
                url, key = self._place(run, self._spool.steps.step_upload(upload_id) or upload)
                rft.put_samples(url, body)
            rft.confirm_samples(run.platform_id, upload.step, key)
        except PlatformError as exc:
            if exc.retryable:
                raise
            if not about_content(exc):
                # Kept as it is: `push` resumes it where it stopped.
                raise refused_setup(exc, f"the step {upload.step} sample table") from exc
            seqs = self._spool.delivery.upload_episode_seqs(upload_id)
            if len(seqs) > 1:
                what = f"the step {upload.step} sample table"
                narrow(self._spool, self._narrowing, run, upload_id, exc, what)
                return
            reason = f"the step {upload.step} sample table was refused: {exc}"
            self._spool.delivery.fail_episodes(run.local_id, seqs, reason)
            logger.error(
                "Run %s: %s; %d episode(s) counted as failed", run.local_id, reason, len(seqs)
            )
            return
        self._spool.steps.commit_step_upload(upload_id)
        self._narrowing.delivered(run.local_id)

    def _place(self, run: RunRow, upload: StepUpload) -> tuple[str, str]:
        assert run.platform_id is not None
        if upload.url is not None and upload.key is not None:
            return upload.url, upload.key
        url, key = self._clients.rft().presign_samples(run.platform_id, upload.step)
        self._spool.steps.set_step_object(upload.upload_id, url, key)
        return url, key
