"""Delivery of training runs: the RFT API side of the uploader's lifecycle.

A training run is registered once through the RFT API (or attached to by id),
streams its episodes like an eval run (``stream.py``: to Prime Traces, or to
the legacy per-step table when the account is not on it), sends each logged
step's metrics row, and ends finalized, or closed as failed with the reason.

Every step either finishes, records a permanent failure on the run (counted,
kept in the spool for ``push``), or raises a *retryable*
:class:`~prime_runs_otel.deliver.platform.http.PlatformError`, which
:meth:`TrainingLifecycle.create` and :meth:`TrainingLifecycle.deliver` turn
into a pause: a training run lasts days, and an outage never ends its
delivery.
"""

from __future__ import annotations

import json
import logging
from typing import Any

from .._json import clean_metric_values
from ..errors import ConfigError
from ..semconv import FRAMEWORK_PRIME_RL
from .backoff import Backoff
from .clients import PlatformClients
from .lifecycle import StragglerWait, close_run, fail_create, mark_created, reload
from .platform.http import PlatformError
from .platform.rft import RftAPI, TrainingFields, external_run_payload
from .refusals import about_content, refused_setup
from .spool import MetricsRow, RunRow, Spool
from .stream import EpisodeStream

__all__ = ["TrainingLifecycle"]

logger = logging.getLogger(__name__)


class TrainingLifecycle:
    """The RFT API half of the uploader for one spool."""

    def __init__(
        self,
        spool: Spool,
        clients: PlatformClients,
        stream: EpisodeStream,
        *,
        team_id: str | None,
        stragglers: StragglerWait | None = None,
    ) -> None:
        self._spool = spool
        self._stragglers = stragglers or StragglerWait()
        self._rft = clients.rft
        self._stream = stream
        self._team_id = team_id

    # -- the run ------------------------------------------------------------------

    def create(self, run: RunRow) -> None:
        """Register the run, exactly once.

        ``POST /rft/external-runs`` is not replayable and the API cannot find
        a run again, so a create whose answer was lost is not sent a second
        time: the run is marked as not created, with what to check, and
        ``prime-runs-otel push`` registers it again once somebody has. A
        refusal before the request acted pauses the run.
        """
        try:
            self._register(run)
        except PlatformError as exc:
            raise Backoff(exc) from exc

    def _register(self, run: RunRow) -> None:
        """:meth:`create`, raising a retryable failure as it is."""
        if self._awaiting_owner(run):
            return
        # Read again after the owner check: the owner's config is committed in
        # the same transaction that registers it, so a fresh read sees it.
        fresh = self._spool.reading.run(run.local_id)
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
            fail_create(self._spool, run, str(exc))
            return
        if run.create_state == "creating":
            fail_create(self._spool, run, _LOST_CREATE)
            return
        if not self._spool.delivery.claim_create(run.local_id):
            return
        rft = self._rft()
        try:
            answer = rft.create(payload)
        except PlatformError as exc:
            if exc.retryable and not exc.ambiguous:
                self._spool.delivery.update_run(run.local_id, create_state="pending")
                raise
            fail_create(
                self._spool,
                run,
                _LOST_CREATE if exc.ambiguous else f"registering the run failed: {exc}",
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
        if self._spool.delivery.producers(local_id, owners_only=True):
            return False
        return bool(self._spool.delivery.producers(local_id))

    def _note_url(self, run: RunRow) -> None:
        """An attached run's dashboard address, which no create answer gave."""
        if run.platform_id is not None and run.url is None:
            self._spool.delivery.update_run(run.local_id, url=self._rft().url_for(run.platform_id))

    # -- episodes and metrics ---------------------------------------------------------

    def deliver(self, run: RunRow) -> None:
        """Metrics rows beside the created run's episodes, then the RFT close
        once it ended and is whole. Every retryable failure pauses the run;
        none retires it."""
        try:
            self._note_url(run)
            self._deliver_metrics(run)
            self._stream.resume(run)
            if not self._stream.deliver_some(run):
                return
            self._deliver_metrics(reload(self._spool, run))
            run = reload(self._spool, run)
            # A sample table handed in while the episodes went out (see
            # Run.add_step_table) is sent before the close: it was stored
            # before the run's end, which this reload sees.
            self._stream.resume(run)
            if not self._metrics_pending(run) and self._stragglers.ready_to_close(self._spool, run):
                self._close(run)
        except PlatformError as exc:
            if exc.retryable:
                raise Backoff(exc) from exc
            raise

    def _deliver_metrics(self, run: RunRow) -> None:
        """Every pending row, in the order they were stored. A step row is
        replayed freely (the platform keeps one row per step); a row posted
        as logged goes exactly as it is stored, ``step`` and key order
        included, and at most once (``_post_once``)."""
        assert run.platform_id is not None
        while rows := self._spool.steps.pending_metrics(run.local_id):
            for row in rows:
                if row.verbatim:
                    self._post_once(run, row)
                else:
                    self._post(run, row, clean_metric_values(json.loads(row.row)))

    def _post_once(self, run: RunRow, row: MetricsRow) -> None:
        """A row posted as logged is a post of its own, so a second copy would
        be a row the source never sent. It is marked ``sending`` before its
        request; a request that may have reached the platform (its answer
        lost, or this process killed meanwhile) is not sent again, as
        prime-rl's own monitor never sends one again, and is counted
        ``uncertain``. One that surely did not (refused connection, an
        overload answer) goes back to pending and waits for the platform."""
        if not self._spool.steps.begin_metrics(run.local_id, row):
            return
        try:
            self._post(run, row, json.loads(row.row))
        except PlatformError as exc:
            if exc.ambiguous:
                self._spool.steps.end_metrics(run.local_id, row, "uncertain")
                logger.warning(
                    "Run %s: a metrics row of step %d may or may not have reached the platform "
                    "(%s); it is not posted again, since a second copy would be a row of its "
                    "own, and is counted as uncertain",
                    run.local_id,
                    row.step,
                    exc,
                )
                return
            self._spool.steps.end_metrics(run.local_id, row, "pending")
            raise

    def _post(self, run: RunRow, row: MetricsRow, values: dict[str, Any]) -> None:
        assert run.platform_id is not None
        try:
            self._rft().post_metrics(run.platform_id, values)
        except PlatformError as exc:
            if exc.retryable:
                raise
            if not about_content(exc):
                raise refused_setup(exc, f"the metrics of step {row.step}") from exc
            self._spool.steps.end_metrics(run.local_id, row, "failed")
            self._spool.delivery.update_run(run.local_id, last_error=f"metrics refused: {exc}")
            logger.error(
                "Run %s: the metrics of step %d were refused for good (%s); they are "
                "kept in the spool and counted as failed",
                run.local_id,
                row.step,
                exc,
            )
            return
        self._spool.steps.end_metrics(run.local_id, row, "delivered")

    def _metrics_pending(self, run: RunRow) -> bool:
        return bool(self._spool.steps.metrics_counts(run.local_id).get("pending"))

    # -- closing --------------------------------------------------------------------

    def _close(self, run: RunRow) -> None:
        """Finalize a completed run; close any other as failed with its reason
        (see :func:`~prime_runs_otel.deliver.lifecycle.close_run`)."""
        platform_id = run.platform_id
        assert platform_id is not None
        rft = self._rft()

        def close_as(status: str, error: str | None) -> None:
            rft.set_status(platform_id, status, error)

        as_prime_rl = run.identity.framework == FRAMEWORK_PRIME_RL
        close_run(
            self._spool,
            run,
            finalize=lambda: self._finalize(rft, platform_id, as_prime_rl),
            close_as=close_as,
        )

    @staticmethod
    def _finalize(rft: RftAPI, platform_id: str, as_prime_rl: bool) -> None:
        try:
            rft.finalize(platform_id, as_prime_rl=as_prime_rl)
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
