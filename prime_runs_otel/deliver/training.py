"""Delivery of training runs: the RFT side of the uploader's lifecycle.

A training run is registered once through the RFT API (or attached to by id),
streams its episodes to Prime Traces like an eval run, sends each logged step's
metrics row, and falls back to the legacy per-step Parquet table (every 10th
step, as prime-rl and prime-runs do) when the account is not on Prime Traces.
It ends finalized, or closed as failed with the reason.

Every method either finishes its step, records a permanent failure on the run
(counted, kept in the spool for ``push``), or raises a *retryable*
:class:`~prime_runs_otel.platform.http.PlatformError`, which the uploader turns
into a pause: a training run lasts days, and an outage never ends its
delivery.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Sequence

from .._json import clean_metric_values
from .._text import shown
from ..errors import ConfigError
from ..read.projection import STEP_TABLE_INTERVAL, ParquetUnavailableError, require_parquet
from ..read.projection import step_table_parquet as _step_table_parquet
from .lifecycle import close_run, mark_created
from .platform.http import PlatformError
from .platform.rft import RftAPI, TrainingFields, external_run_payload
from .spool import EpisodeRow, RunRow, Spool, StepUpload

__all__ = ["SAMPLE_ID_STRIDE", "TrainingLifecycle"]

logger = logging.getLogger(__name__)

#: Each Parquet object of a step numbers its samples from its own range
#: (``index * stride``), so the viewer's (step, sample_id) key stays unique
#: across the objects of one step. Ids stay below 2**53 for the viewer.
SAMPLE_ID_STRIDE = 1 << 32


class TrainingLifecycle:
    """The RFT half of the uploader for one spool. ``fail_create`` records a
    run that cannot be registered (the uploader's own bookkeeping)."""

    def __init__(
        self,
        spool: Spool,
        rft: Callable[[], RftAPI],
        *,
        team_id: str | None,
        fail_create: Callable[[RunRow, str], None],
    ) -> None:
        self._spool = spool
        self._rft = rft
        self._team_id = team_id
        self._fail_create = fail_create

    # -- the run ------------------------------------------------------------------

    def create(self, run: RunRow) -> None:
        """Register the run, exactly once.

        ``POST /rft/external-runs`` is not replayable and the API cannot find
        a run again, so a create whose answer was lost is not sent a second
        time: the run is marked as not created, with what to check, and
        ``prime-runs-otel push`` registers it again once somebody has.
        """
        if self._awaiting_owner(run):
            return
        # Read again after the owner check: the owner's config is committed in
        # the same transaction that registers it, so a fresh read sees it.
        fresh = self._spool.run(run.local_id)
        if fresh is not None:
            run = fresh
        identity = run.identity
        try:
            payload = external_run_payload(
                base_model=identity.model,
                team_id=identity.team_id or self._team_id,
                environments=identity.environments,
                training=TrainingFields(
                    max_steps=identity.max_steps or 0,
                    batch_size=identity.batch_size,
                    rollouts_per_example=identity.rollouts_per_example,
                    seq_len=identity.seq_len,
                    wandb_project=identity.wandb_project,
                    wandb_entity=identity.wandb_entity,
                    wandb_run_name=identity.wandb_run_name,
                ),
                name=run.name,
                run_config=run.config,
            )
        except ConfigError as exc:
            self._fail_create(run, str(exc))
            return
        if run.create_state == "creating":
            self._fail_create(run, _LOST_CREATE)
            return
        if not self._spool.claim_create(run.local_id):
            return
        rft = self._rft()
        try:
            answer = rft.create(payload)
        except PlatformError as exc:
            if exc.retryable and not exc.ambiguous:
                self._spool.update_run(run.local_id, create_state="pending")
                raise
            self._fail_create(
                run, _LOST_CREATE if exc.ambiguous else f"registering the run failed: {exc}"
            )
            return
        platform_id = answer["id"]
        url = rft.url_for(platform_id)
        mark_created(
            self._spool, run, platform_id, url, name=answer.get("name"), what="training run"
        )

    def _awaiting_owner(self, run: RunRow) -> bool:
        """Only workers have fed the run so far: the trainer that owns it, and
        the config the run is registered with (once, with no later update),
        are still to come. A run fed through a collector has no local
        producers and does not wait."""
        if run.config is not None or run.identity.attach is not None:
            return False
        local_id = run.local_id
        if self._spool.producers(local_id, owners_only=True):
            return False
        return bool(self._spool.producers(local_id))

    def note_url(self, run: RunRow) -> None:
        """An attached run's dashboard address, which no create answer gave."""
        if run.platform_id is not None and run.url is None:
            self._spool.update_run(run.local_id, url=self._rft().url_for(run.platform_id))

    # -- step metrics ---------------------------------------------------------------

    def deliver_metrics(self, run: RunRow) -> None:
        """Every pending step row, oldest step first. Replayed freely: the
        platform keeps one row per step."""
        assert run.platform_id is not None
        while rows := self._spool.pending_metrics(run.local_id):
            for row in rows:
                values = clean_metric_values(json.loads(row.row))
                try:
                    self._rft().post_metrics(run.platform_id, values)
                except PlatformError as exc:
                    if exc.retryable:
                        raise
                    self._spool.end_metrics(run.local_id, row, "failed")
                    self._spool.update_run(run.local_id, last_error=f"metrics refused: {exc}")
                    logger.error(
                        "Run %s: the metrics of step %d were refused for good (%s); they are "
                        "kept in the spool and counted as failed",
                        run.local_id,
                        row.step,
                        exc,
                    )
                    continue
                self._spool.end_metrics(run.local_id, row, "delivered")

    def metrics_pending(self, run: RunRow) -> bool:
        return bool(self._spool.metrics_counts(run.local_id).get("pending"))

    # -- the legacy step table ----------------------------------------------------------

    def deliver_step_tables(self, run: RunRow, episodes: Sequence[EpisodeRow]) -> None:
        """Episodes of every 10th training step as one Parquet object per step;
        the rest reach no table (and are not a loss: the table never held
        them)."""
        assert run.platform_id is not None
        try:
            require_parquet()
        except ParquetUnavailableError as exc:
            self._spool.fail_episodes(run.local_id, [e.seq for e in episodes], str(exc))
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
            self._spool.skip_episodes(skipped)
        for step, members in sorted(by_step.items()):
            self._upload_step(run, step, members)

    def _upload_step(self, run: RunRow, step: int, members: Sequence[EpisodeRow]) -> None:
        assert run.platform_id is not None
        offset = self._spool.step_upload_count(run.local_id, step) * SAMPLE_ID_STRIDE
        records = []
        readable = []
        for member in members:
            try:
                records.append(json.loads(member.record))
            except (ValueError, RecursionError) as exc:
                self._spool.fail_episodes(
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
            self._spool.fail_episodes(run.local_id, seqs, reason)
            logger.error(
                "Run %s: %s; %d episode(s) counted as failed",
                shown(run.local_id),
                shown(reason),
                len(seqs),
            )
            return
        if body is None:  # no episode with a trajectory: nothing for the viewer
            self._spool.skip_episodes(seqs)
            return
        upload_id = self._spool.begin_step_upload(run.local_id, step, seqs, body, offset)
        self.send_step(run, upload_id)

    def send_step(self, run: RunRow, upload_id: str) -> None:
        """Presign (once: the object's place is kept), PUT, confirm. Each is
        safe to repeat, so a restart resumes wherever this stopped."""
        assert run.platform_id is not None
        upload = self._spool.step_upload(upload_id)
        if upload is None or upload.body is None:
            return
        rft = self._rft()
        try:
            url, key = self._place(run, upload)
            try:
                rft.put_samples(url, upload.body)
            except PlatformError as exc:
                if exc.status != 403:
                    raise
                # The grant expired while the upload waited: a fresh one, once.
                self._spool.set_step_object(upload_id, None, None)
                url, key = self._place(run, self._spool.step_upload(upload_id) or upload)
                rft.put_samples(url, upload.body)
            rft.confirm_samples(run.platform_id, upload.step, key)
        except PlatformError as exc:
            if exc.retryable:
                raise
            seqs = self._spool.upload_episode_seqs(upload_id)
            reason = f"the step {upload.step} sample table was refused: {exc}"
            self._spool.fail_episodes(run.local_id, seqs, reason)
            logger.error(
                "Run %s: %s; %d episode(s) counted as failed", run.local_id, reason, len(seqs)
            )
            return
        self._spool.commit_step_upload(upload_id)

    def _place(self, run: RunRow, upload: StepUpload) -> tuple[str, str]:
        assert run.platform_id is not None
        if upload.url is not None and upload.key is not None:
            return upload.url, upload.key
        url, key = self._rft().presign_samples(run.platform_id, upload.step)
        self._spool.set_step_object(upload.upload_id, url, key)
        return url, key

    # -- closing --------------------------------------------------------------------

    def close(self, run: RunRow) -> None:
        """Finalize a completed run; close any other as failed with its reason
        (see :func:`~prime_runs_otel.deliver.lifecycle.close_run`)."""
        platform_id = run.platform_id
        assert platform_id is not None
        rft = self._rft()

        def close_as(status: str, error: str | None) -> None:
            rft.set_status(platform_id, status, error)

        close_run(
            self._spool, run, finalize=lambda: self._finalize(rft, platform_id), close_as=close_as
        )

    @staticmethod
    def _finalize(rft: RftAPI, platform_id: str) -> None:
        try:
            rft.finalize(platform_id)
        except PlatformError as exc:
            if exc.retryable:
                raise
            # The status endpoint may still close it out.
            logger.warning(
                "Training run %s could not be finalized (%s); closing it through its status",
                platform_id,
                exc,
            )
            rft.set_status(platform_id, "completed")


_LOST_CREATE = (
    "registering the training run may or may not have happened (its answer was lost), and "
    "the RFT API offers no way to find it again; it is not registered a second time "
    "blindly. Check the training dashboard: to register it anyway, run "
    "`prime-runs-otel push` for this run"
)
