"""Delivery of eval runs: the evaluations API side of the uploader's lifecycle.

An eval run is created once (or attached to by id), streams its episodes
(``stream.py``), and is closed with its summary: finalized when it completed,
else marked with its terminal status. ``POST /evaluations/`` is not
idempotent, so every create is preceded by a lookup of the run by a marker in
its metadata, which finds the run again when an earlier create's answer was
lost. The close is checked against the platform too when an earlier
``/finalize`` may have acted.

Every method either finishes its step, records a permanent failure on the
run (``push`` tries again), or raises :class:`~.backoff.Backoff`.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from .backoff import Backoff
from .clients import PlatformClients
from .lifecycle import StragglerWait, close_run, fail_create, mark_created, reload
from .platform.evals import EnvironmentResolutionError, EvalsAPI, first_environment_name
from .platform.http import PlatformError
from .spool import RunRow, Spool
from .stream import EpisodeStream
from .summary import run_summary

logger = logging.getLogger(__name__)

#: Key in a run's platform metadata that names the producer's run key. It is
#: how a run whose create answer was lost is found again (see ``create``).
MARKER_KEY = "prime_runs_otel"


def run_metadata(run: RunRow) -> dict[str, Any]:
    """The run's config as platform metadata, plus the marker of its key."""
    return {**(run.config or {}), MARKER_KEY: {"run_key": run.local_id}}


class EvalLifecycle:
    """The evaluations API half of the uploader for one spool."""

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
        self._clients = clients
        self._stream = stream
        self._team_id = team_id

    # -- the run ------------------------------------------------------------------

    def create(self, run: RunRow) -> None:
        """Create the run exactly once, also across ``serve`` instances.

        ``POST /evaluations/`` is not idempotent, so the spool records that a
        create is in flight before it is sent. Before every create the run is
        looked up by the marker in its metadata: the platform may have it from
        a create whose answer was lost, or from another process that saw part
        of the same run (a second ``serve`` behind a load balancer that moved
        the run, a gateway restarted elsewhere). It is created only when the
        platform does not have it. The lookup is one list request for an
        environment with fewer than 100 runs, at most 20 for a large one.
        Two creates within the same moment on two processes can still both
        miss each other: the platform has no unique key to refuse the second.
        """
        evals = self._clients.evals()
        environments = list(run.identity.environments)
        if not environments:
            fail_create(
                self._spool,
                run,
                "an eval run needs at least one environment: pass environments=[...] "
                "to start_run() or set prime.run.environments on the Resource",
            )
            return
        if self._found_earlier_create(run, evals):
            return
        try:
            resolved = [{"id": evals.resolve_environment(ref)} for ref in environments]
            payload = self._create_payload(run, resolved)
            if not self._spool.delivery.claim_create(run.local_id):
                return
            try:
                answer = evals.create(payload)
            except PlatformError as exc:
                if exc.retryable and not exc.ambiguous:
                    # Refused before acting (connect error, 429, 503): nothing
                    # to look up, the next attempt creates.
                    self._spool.delivery.update_run(run.local_id, create_state="pending")
                raise
        except EnvironmentResolutionError as exc:
            fail_create(self._spool, run, str(exc))
            return
        except PlatformError as exc:
            if exc.retryable:
                raise Backoff(exc) from exc
            fail_create(self._spool, run, f"creating the run failed: {exc}")
            return
        self._adopt(run, answer, evals)

    def _found_earlier_create(self, run: RunRow, evals: EvalsAPI) -> bool:
        """Adopt the run if the platform has it (from a create whose answer,
        or process, was lost, or from another process), else allow a create.
        ``True`` when there is nothing left to create.

        A failure of the lookup leaves the create state as it was: only a
        lookup that answered "not there" may lead to a create. It pauses the
        run, except a refusal (a wrong key, no access) before any create was
        sent, which fails the create as the create itself would have.
        """
        try:
            found = evals.find_by_marker(
                marker_key=MARKER_KEY,
                marker=run.local_id,
                environment_name=first_environment_name(run.identity.environments),
            )
        except PlatformError as exc:
            if exc.retryable or run.create_state == "creating":
                raise Backoff(exc) from exc
            fail_create(self._spool, run, f"creating the run failed: {exc}")
            return True
        if found is None:
            if run.create_state != "pending":
                self._spool.delivery.update_run(run.local_id, create_state="pending")
            return False
        logger.info("Run %s: found the platform run created earlier", run.local_id)
        self._adopt(run, found, evals)
        return True

    def _create_payload(self, run: RunRow, environments: list[dict[str, Any]]) -> dict[str, Any]:
        identity = run.identity
        name = run.name or self._default_name(run)
        payload: dict[str, Any] = {
            "name": name,
            "environments": environments,
            "tags": list(identity.tags),
            "metadata": run_metadata(run),
        }
        optional = {
            "model_name": identity.model,
            "dataset": first_environment_name(identity.environments),
            "framework": identity.framework,
            "description": identity.description,
            "team_id": identity.team_id or self._team_id,
        }
        payload.update({key: value for key, value in optional.items() if value is not None})
        return payload

    def _default_name(self, run: RunRow) -> str:
        """Chosen once and stored, so a create retried after a lost answer
        carries the same name."""
        stem = first_environment_name(run.identity.environments) or "eval"
        name = f"{stem}-{run.local_id[:8]}"
        self._spool.delivery.update_run(run.local_id, name=name)
        return name

    def _adopt(self, run: RunRow, answer: Mapping[str, Any], evals: EvalsAPI) -> None:
        platform_id = str(answer["evaluation_id"])
        url = answer.get("viewer_url") or evals.url_for(platform_id)
        mark_created(
            self._spool, run, platform_id, url, name=answer.get("name"), what="platform run"
        )

    # -- episodes -------------------------------------------------------------------

    def deliver(self, run: RunRow) -> None:
        """Stream the created run's episodes; close it once it ended and is whole."""
        assert run.platform_id is not None
        if run.url is None:
            # An attached run's dashboard address, which no create answer gave.
            evals = self._clients.evals()
            self._spool.delivery.update_run(run.local_id, url=evals.url_for(run.platform_id))
        self._stream.resume(run)
        if not self._stream.deliver_some(run):
            return
        run = reload(self._spool, run)
        if self._stragglers.ready_to_close(self._spool, run):
            self._close(run)

    # -- closing --------------------------------------------------------------------

    def _close(self, run: RunRow) -> None:
        """Update, then finalize or mark the status; each step is safe to redo
        except ``/finalize``, which is checked against the platform first when
        an earlier attempt may have acted."""
        evals = self._clients.evals()
        platform_id = run.platform_id
        assert platform_id is not None
        summary = run_summary(run)

        def prepare() -> bool:
            if run.close_state == "finalizing":
                status = evals.status_of(
                    platform_id,
                    environment_name=first_environment_name(run.identity.environments),
                )
                if status and status.upper() != "RUNNING":
                    return True
            # PUT replaces the whole metadata document: a process that never
            # saw the run's start span (another serve got it) has no config to
            # send and must not erase the one the platform holds.
            attached = run.identity.attach is not None
            metadata = None if attached or run.config is None else run_metadata(run)
            evals.update(platform_id, metadata=metadata, metrics=summary or None)
            return False

        def finalize() -> None:
            self._spool.delivery.update_run(run.local_id, close_state="finalizing")
            try:
                evals.finalize(platform_id, summary)
            except PlatformError as exc:
                if exc.status == 409:  # finalized already
                    return
                if not exc.ambiguous:
                    self._spool.delivery.update_run(run.local_id, close_state="open")
                raise

        def close_as(status: str, error: str | None) -> None:
            evals.close_as(platform_id, status, error)

        try:
            close_run(self._spool, run, prepare=prepare, finalize=finalize, close_as=close_as)
        except PlatformError as exc:  # only a retryable one gets here
            raise Backoff(exc) from exc
