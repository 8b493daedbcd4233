"""Delivery: moves what the spool holds to the platform, one run at a time,
through each run's lifecycle (create or attach → stream → update → close).

Everything the uploader knows lives in the spool, so a process that dies at
any point is replaced by the next one that opens the spool with no loss and
no duplicate: it re-sends the persisted bytes of an open Prime Traces upload
(the service replays the receipt), counts a legacy sample request that may
have acted as *uncertain* instead of appending its rows twice, and finds a
run whose create answer was lost through the list endpoint.

Failures that may succeed later (an outage, 429, 503) pause the run with
backoff, honouring Retry-After, for as long as it takes: a run is never given
up because the platform was away. Only a permanent refusal (an environment
that does not exist, a credential without access) stops a run's delivery, and
that is recorded on the run for ``prime-runs-otel show`` and ``push``.
"""

from __future__ import annotations

import logging
import math
import os
import random
import socket
import threading
import time
from collections.abc import Mapping, Sequence
from typing import Any

from .._courtesy import ExportRunning
from .._json import loads as fast_loads
from .._text import shown
from ..config import Settings
from ..read.projection import (
    MAX_SAMPLES_PAYLOAD_BYTES,
    SampleTooLargeError,
    SummaryAccumulator,
    batch_sample_rows,
    encode_samples_body,
    episode_sample_rows,
    traces_line,
)
from .lifecycle import close_run, mark_created
from .lines import LineCache
from .platform.evals import EnvironmentResolutionError, EvalsAPI, first_environment_name
from .platform.http import PlatformClient, PlatformError
from .platform.rft import RftAPI
from .platform.traces import SERVICE_NOT_ENABLED, TracesAPI, compress_lines, upload_key
from .spool import EpisodeRow, RunRow, Spool, lease_owner, process_alive
from .training import TrainingLifecycle

logger = logging.getLogger(__name__)

#: Key in a run's platform metadata that names the producer's run key. It is
#: how a run whose create answer was lost is found again (see ``_create``).
MARKER_KEY = "prime_runs_otel"
#: Prime Traces takes uploads up to 256 MiB (a line up to 64 MiB). Uploads
#: close near 2 MiB of lines here: a streaming run wants each episode on the
#: platform soon, and claiming or committing an upload is one transaction
#: that export() may wait behind (8 MiB made its p99 twice as long).
TRACES_BATCH_BYTES = 2 * 1024 * 1024
MAX_TRACES_LINE_BYTES = 64 * 1024 * 1024
#: Legacy sample batches are read a request's worth at a time.
SAMPLES_BATCH_BYTES = 20 * 1024 * 1024
#: The service's per-upload line cap is 1,000,000; batches close on bytes first.
MAX_BATCH_EPISODES = 100_000
#: Requests one run may send per delivery pass before the next run's turn.
BATCHES_PER_PASS = 16
#: After the end span, how long to wait for episodes a collector delivers
#: late (the end span says how many the producer recorded).
STRAGGLER_GRACE = 30.0
BACKOFF_BASE = 0.5
#: A server's Retry-After is obeyed even past the backoff cap (the server
#: knows when it will take work again), up to this bound against a bogus value.
RETRY_AFTER_CAP = 60.0


class Backoff(Exception):
    """Pause this run; try again after ``delay`` seconds."""

    def __init__(self, cause: PlatformError, delay: float | None = None) -> None:
        super().__init__(str(cause))
        self.cause = cause
        self.delay = delay


def _always_give_way() -> None:
    time.sleep(0)


def finite_only(values: Mapping[str, Any]) -> dict[str, Any]:
    """Summaries without NaN/inf (strict JSON rejects them); empty nested
    mappings are dropped too, as the platform shows them as nothing."""
    cleaned: dict[str, Any] = {}
    for key, value in values.items():
        if isinstance(value, float) and not math.isfinite(value):
            continue
        if isinstance(value, Mapping):
            value = finite_only(value)
            if not value:
                continue
        cleaned[key] = value
    return cleaned


def run_metadata(run: RunRow) -> dict[str, Any]:
    """The run's config as platform metadata, plus the marker of its key."""
    return {**(run.config or {}), MARKER_KEY: {"run_key": run.local_id}}


def run_summary(run: RunRow) -> dict[str, Any]:
    if run.end_summary is not None:
        summary = finite_only(run.end_summary)
    else:
        summary = finite_only(SummaryAccumulator.from_state(run.summary_state).summary())
    if run.kind == "eval" and run.mode == "online":
        given = summary.get("prime_runs")
        summary["prime_runs"] = {
            **(given if isinstance(given, Mapping) else {}),
            "traces_episodes_written": run.traces_written,
        }
    return summary


class Uploader:
    """The delivery loop. One per process; the spool's lease lets one at a
    time deliver, the others wait their turn (forked workers, ``push``)."""

    def __init__(
        self,
        spool: Spool,
        settings: Settings,
        *,
        poll_interval: float = 0.5,
        lease_ttl: float = 120.0,
        idle_timeout: float | None = None,
        export_running: ExportRunning | None = None,
    ) -> None:
        """``export_running`` is the flag of the exporter in this process: the
        uploader lets go of the GIL between episodes while it is up. Without
        one (``serve``, whose intake threads commit at any moment) it always
        does."""
        self._spool = spool
        self._give_way = export_running.give_way if export_running else _always_give_way
        self._settings = settings
        self._poll_interval = poll_interval
        self._lease_ttl = lease_ttl
        self._idle_timeout = idle_timeout
        self._owners: dict[int, str] = {}
        self._wake = threading.Event()
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self._not_before: dict[str, float] = {}
        self._failures: dict[str, int] = {}
        #: Per run, the most episodes one upload may hold while a refused
        #: upload is being narrowed down to the episode that caused it.
        self._batch_limit: dict[str, int] = {}
        self._evals: EvalsAPI | None = None
        self._platform: PlatformClient | None = None
        self._traces: TracesAPI | None = None
        self._rft: RftAPI | None = None
        self._lifecycle: TrainingLifecycle | None = None
        self._lock = threading.Lock()
        #: Prime Traces lines the exporter in this process got built with
        #: the episodes it stored, so they need not be parsed again here.
        self.lines = LineCache()

    @property
    def _owner(self) -> str:
        """The lease name of this uploader in this process: a forked copy of
        it is another holder, never the parent's."""
        pid = os.getpid()
        owner = self._owners.get(pid)
        if owner is None:
            owner = self._owners[pid] = lease_owner()
        return owner

    # -- thread control ------------------------------------------------------

    def start(self) -> None:
        if self._thread is not None and self._thread.is_alive():
            return
        self._stopping.clear()
        self._thread = threading.Thread(
            target=self._loop, name="prime-runs-otel-uploader", daemon=True
        )
        self._thread.start()

    def wake(self) -> None:
        self._wake.set()

    def stop(self, timeout: float | None = None) -> None:
        self._stopping.set()
        self._wake.set()
        thread = self._thread
        if thread is not None:
            thread.join(timeout)
        self._thread = None
        try:
            self._spool.release_lease(self._owner)
        except Exception as exc:
            logger.debug("releasing the uploader lease failed: %s", exc)
        self._close_clients()

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def _loop(self) -> None:
        failed_passes = 0
        while not self._stopping.is_set():
            try:
                self.deliver_once()
            except Exception as exc:
                # A full disk fails every pass the same way: say so once with
                # the traceback, then once a minute or so, not five times a second.
                failed_passes += 1
                if failed_passes == 1:
                    logger.exception("prime-runs-otel delivery pass failed; retrying")
                elif failed_passes % 300 == 0:
                    logger.error(
                        "prime-runs-otel delivery passes still fail (%d in a row): %s",
                        failed_passes,
                        shown(exc),
                    )
            else:
                failed_passes = 0
            self._wake.wait(self._poll_interval)
            self._wake.clear()

    # -- one pass -------------------------------------------------------------

    def deliver_once(self, only: Sequence[str] | None = None) -> None:
        """Advance every deliverable run as far as it goes now."""
        if not self._spool.acquire_lease(self._owner, self._lease_ttl):
            return
        try:
            self._deliver_runs(only)
        finally:
            # Here rather than in whichever commit crosses SQLite's threshold,
            # which would often be an export() the SDK is waiting on.
            self._spool.checkpoint()

    def _deliver_runs(self, only: Sequence[str] | None) -> None:
        for run in self._spool.runs_to_deliver_or_close():
            if only is not None and run.local_id not in only:
                continue
            if self._stopping.is_set() and only is None:
                return
            if time.monotonic() < self._not_before.get(run.local_id, 0.0):
                continue
            try:
                self._advance(run)
            except Backoff as pause:
                self._pause(run, pause)
            except Exception as exc:
                # Whatever one run's data does, the runs after it are still
                # delivered: this run waits (with backoff) and is retried.
                logger.error(
                    "Run %s: delivery failed (%s: %s); retrying later",
                    shown(run.local_id),
                    type(exc).__name__,
                    shown(exc),
                    exc_info=self._failures.get(run.local_id, 0) == 0,
                )
                self._pause(run, Backoff(PlatformError(f"{type(exc).__name__}: {exc}")))
            else:
                self._failures.pop(run.local_id, None)
                self._not_before.pop(run.local_id, None)

    def _pause(self, run: RunRow, pause: Backoff) -> None:
        failures = self._failures.get(run.local_id, 0) + 1
        self._failures[run.local_id] = failures
        cap = max(self._settings.retry_max_delay, 0.0)
        if pause.delay is not None:
            delay = min(pause.delay, cap)
        elif pause.cause.retry_after is not None:
            delay = min(max(pause.cause.retry_after, 0.0), max(RETRY_AFTER_CAP, cap))
        else:
            backoff = min(cap, BACKOFF_BASE * 2 ** min(failures - 1, 20))
            delay = min(backoff * (0.5 + random.random()), cap)
        self._not_before[run.local_id] = time.monotonic() + delay
        level = logging.WARNING if failures in (1, 5) or failures % 50 == 0 else logging.DEBUG
        logger.log(
            level,
            "Run %s: delivery paused for %.1fs after %d failed attempt(s): %s. "
            "Nothing is dropped; it resumes by itself.",
            shown(run.local_id),
            delay,
            failures,
            pause.cause,
        )

    def _advance(self, run: RunRow) -> None:
        if run.end_status is None:
            run = self._close_if_orphaned(run)
        if run.mode != "online":
            if run.end_status is not None:
                self._spool.update_run(run.local_id, close_state="closed", closed_at=time.time())
            return
        if run.create_state == "failed":
            # Refused for good before it existed: once ended, nothing more
            # will happen to it without `push`, so it leaves the delivery list.
            if run.end_status is not None and run.close_state != "gave_up":
                self._spool.update_run(run.local_id, close_state="gave_up")
            return
        if run.create_state in ("pending", "creating"):
            self._create(run)
            run = self._reload(run)
        if run.create_state != "created" or run.platform_id is None:
            return
        if run.kind == "train":
            self._advance_training(run)
            return
        if run.url is None:
            # An attached run's dashboard address, which no create answer gave.
            evals, _ = self._apis()
            self._spool.update_run(run.local_id, url=evals.url_for(run.platform_id))
        self._resume_open_uploads(run)
        if not self._deliver_some(run):
            return
        run = self._reload(run)
        if run.end_status is not None and self._ready_to_close(run):
            self._close(run)

    def _deliver_some(self, run: RunRow) -> bool:
        """Up to ``BATCHES_PER_PASS`` requests for this run, so one busy run
        cannot starve the others; ``True`` when nothing was left pending."""
        for _ in range(BATCHES_PER_PASS):
            if not self._deliver_batch(self._reload(run)):
                return True
            self._spool.checkpoint()  # a pass can be long; keep the WAL short meanwhile
            self._renew_lease()
            if self._stopping.is_set():
                return False
        self._wake.set()  # more is pending: the next pass starts at once
        return False

    def _advance_training(self, run: RunRow) -> None:
        """A training run: metrics rows beside its episodes, then the RFT close.
        Every retryable failure pauses the run; none retires it."""
        training = self._training()
        try:
            training.note_url(run)
            training.deliver_metrics(run)
            self._resume_open_uploads(run)
            if not self._deliver_some(run):
                return
            training.deliver_metrics(self._reload(run))
            run = self._reload(run)
            if (
                run.end_status is not None
                and not training.metrics_pending(run)
                and self._ready_to_close(run)
            ):
                training.close(run)
        except PlatformError as exc:
            if exc.retryable:
                raise Backoff(exc) from exc
            raise

    def _reload(self, run: RunRow) -> RunRow:
        fresh = self._spool.run(run.local_id)
        assert fresh is not None, "runs are never deleted from the spool"
        return fresh

    def _renew_lease(self) -> None:
        self._spool.acquire_lease(self._owner, self._lease_ttl)

    # -- clients -------------------------------------------------------------

    def _apis(self) -> tuple[EvalsAPI, TracesAPI]:
        with self._lock:
            if self._evals is None or self._traces is None:
                settings = self._settings
                if not settings.api_key:
                    raise Backoff(
                        PlatformError(
                            "no API key: set PRIME_API_KEY (or run `prime login`) to deliver "
                            "online runs, or keep them local with PRIME_RUNS_MODE=local",
                        ),
                        delay=max(settings.retry_max_delay, 1.0),
                    )
                self._platform = PlatformClient(
                    api_key=settings.api_key, base_url=settings.base_url, team_id=settings.team_id
                )
                self._evals = EvalsAPI(self._platform, frontend_url=settings.frontend_url)
                self._traces = TracesAPI(
                    api_key=settings.api_key,
                    traces_url=settings.traces_url,
                    team_id=settings.team_id,
                )
            return self._evals, self._traces

    def _training(self) -> TrainingLifecycle:
        if self._lifecycle is None:
            self._lifecycle = TrainingLifecycle(
                self._spool,
                self._rft_api,
                team_id=self._settings.team_id,
                fail_create=self._fail_create,
            )
        return self._lifecycle

    def _rft_api(self) -> RftAPI:
        """The RFT client, addressed by the base URL (a hosted run's launcher
        hands its internal RFT root there)."""
        self._apis()  # the same credential check, and the traces client a run needs
        with self._lock:
            if self._rft is None:
                settings = self._settings
                self._rft = RftAPI(
                    api_key=settings.api_key,
                    base_url=settings.base_url,
                    frontend_url=settings.frontend_url,
                    team_id=settings.team_id,
                )
            return self._rft

    def _close_clients(self) -> None:
        with self._lock:
            for client in (self._platform, self._traces, self._rft):
                if client is not None:
                    try:
                        client.close()
                    except Exception as exc:
                        logger.debug("closing a platform client failed: %s", exc)
            self._platform = self._traces = None
            self._evals = None
            self._rft = None

    # -- create ----------------------------------------------------------------

    def _create(self, run: RunRow) -> None:
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
        if run.kind == "train":
            try:
                self._training().create(run)
            except PlatformError as exc:
                raise Backoff(exc) from exc
            return
        evals, _ = self._apis()
        environments = list(run.identity.environments)
        if not environments:
            self._fail_create(
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
            if not self._spool.claim_create(run.local_id):
                return
            try:
                answer = evals.create(payload)
            except PlatformError as exc:
                if exc.retryable and not exc.ambiguous:
                    # Refused before acting (connect error, 429, 503): nothing
                    # to look up, the next attempt creates.
                    self._spool.update_run(run.local_id, create_state="pending")
                raise
        except EnvironmentResolutionError as exc:
            self._fail_create(run, str(exc))
            return
        except PlatformError as exc:
            if exc.retryable:
                raise Backoff(exc) from exc
            self._fail_create(run, f"creating the run failed: {exc}")
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
            self._fail_create(run, f"creating the run failed: {exc}")
            return True
        if found is None:
            if run.create_state != "pending":
                self._spool.update_run(run.local_id, create_state="pending")
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
            "team_id": identity.team_id or self._settings.team_id,
        }
        payload.update({key: value for key, value in optional.items() if value is not None})
        return payload

    def _default_name(self, run: RunRow) -> str:
        """Chosen once and stored, so a create retried after a lost answer
        carries the same name."""
        stem = first_environment_name(run.identity.environments) or "eval"
        name = f"{stem}-{run.local_id[:8]}"
        self._spool.update_run(run.local_id, name=name)
        return name

    def _adopt(self, run: RunRow, answer: Mapping[str, Any], evals: EvalsAPI) -> None:
        platform_id = str(answer["evaluation_id"])
        url = answer.get("viewer_url") or evals.url_for(platform_id)
        mark_created(
            self._spool, run, platform_id, url, name=answer.get("name"), what="platform run"
        )

    def _fail_create(self, run: RunRow, reason: str) -> None:
        logger.error(
            "Run %s cannot be created on the platform: %s. Its episodes stay in the spool "
            "(%s); fix the cause and run `prime-runs-otel push %s`.",
            run.local_id,
            reason,
            self._spool.path,
            run.local_id,
        )
        self._spool.update_run(
            run.local_id,
            create_state="failed",
            last_error=reason,
            close_state="gave_up" if run.end_status else run.close_state,
        )

    # -- episodes --------------------------------------------------------------

    def _resume_open_uploads(self, run: RunRow) -> None:
        """Finish what an earlier attempt (or process) left open."""
        for upload in self._spool.open_uploads(run.local_id):
            if upload.kind == "traces" and upload.body is not None:
                # A body stored plain was written by an earlier release.
                compressed = (
                    upload.body if upload.body_encoding == "gzip" else compress_lines(upload.body)
                )
                self._send_traces(run, upload.upload_id, compressed)
            elif upload.kind == "steps":
                self._training().send_step(run, upload.upload_id)
            elif upload.kind == "samples":
                count = self._spool.end_samples_request(run.local_id, upload.upload_id, "uncertain")
                logger.warning(
                    "Run %s: %d episode(s) were being sent to the sample table when delivery "
                    "stopped; they may or may not be stored, and are not sent again "
                    "(duplicate rows would skew every average). Counted as uncertain.",
                    run.local_id,
                    count,
                )

    def _deliver_batch(self, run: RunRow) -> bool:
        """Send one request's worth; ``False`` when nothing is pending."""
        budget = TRACES_BATCH_BYTES if run.sink == "traces" else SAMPLES_BATCH_BYTES
        limit = self._batch_limit.get(run.local_id, MAX_BATCH_EPISODES)
        episodes = self._spool.pending_episodes(run.local_id, max_bytes=budget, max_count=limit)
        if not episodes:
            return False
        if run.sink == "traces" and not self._settings.traces_opt_out:
            self._deliver_traces(run, episodes)
        else:
            if run.sink == "traces":
                self._spool.update_run(run.local_id, sink="samples")
                self.lines.clear()
            if run.kind == "train":
                self._training().deliver_step_tables(run, episodes)
            else:
                self._deliver_samples(run, episodes)
        return True

    def _deliver_traces(self, run: RunRow, episodes: Sequence[EpisodeRow]) -> None:
        assert run.platform_id is not None
        lines: list[bytes] = []
        seqs: list[int] = []
        for episode in episodes:
            self._give_way()
            template = self.lines.take(episode.seq)
            line = template.fill(run.platform_id, run.kind, episode.step) if template else None
            if line is None:
                try:
                    line = traces_line(
                        fast_loads(episode.record), run.platform_id, run.kind, step=episode.step
                    )
                except Exception as exc:  # a stored record is outside input too
                    self._refuse(run, episode, exc)
                    continue
            if len(line) - 1 > MAX_TRACES_LINE_BYTES:
                self._spool.fail_episodes(
                    run.local_id,
                    [episode.seq],
                    f"episode {episode.episode_id} is {len(line)} bytes as a Prime Traces line, "
                    f"over the {MAX_TRACES_LINE_BYTES}-byte limit",
                )
                continue
            lines.append(line)
            seqs.append(episode.seq)
        if not lines:
            return
        body = b"".join(lines)
        upload_id = upload_key(body)
        compressed = compress_lines(body)
        self._spool.begin_traces_upload(run.local_id, seqs, upload_id, compressed, encoding="gzip")
        self._send_traces(run, upload_id, compressed)

    def _send_traces(self, run: RunRow, upload_id: str, compressed: bytes) -> None:
        _, traces = self._apis()
        self._renew_lease()  # a large upload may take a while: keep the lease for its length
        try:
            traces.upload_episodes(compressed, upload_id, self._context(run))
        except PlatformError as exc:
            if exc.status == 403 and exc.code == SERVICE_NOT_ENABLED and run.traces_written == 0:
                logger.info(
                    "Run %s: Prime Traces is not enabled for this account; its episodes go to "
                    "the legacy sample table instead",
                    run.local_id,
                )
                self._spool.abandon_traces_uploads(run.local_id, sink="samples")
                self.lines.clear()
                return
            if exc.retryable:
                raise Backoff(exc) from exc
            seqs = self._spool.upload_episode_seqs(upload_id)
            if exc.status == 400 and len(seqs) > 1:
                # One bad episode refuses the whole upload (all or nothing, so
                # nothing of it is stored): halve until the bad one is alone.
                self._batch_limit[run.local_id] = len(seqs) // 2
                self._spool.release_traces_upload(upload_id)
                logger.info(
                    "Run %s: an upload of %d episodes was refused (%s); retrying in halves "
                    "to isolate the episode responsible",
                    run.local_id,
                    len(seqs),
                    exc,
                )
                return
            self._spool.fail_episodes(run.local_id, seqs, f"Prime Traces refused: {exc}")
            logger.error(
                "Run %s: Prime Traces refused %d episode(s) for good (%s); they are counted as "
                "failed and kept in the spool",
                run.local_id,
                len(seqs),
                exc,
            )
            return
        self._spool.commit_traces_upload(run.local_id, upload_id)
        limit = self._batch_limit.pop(run.local_id, None)
        if limit is not None and limit * 2 < MAX_BATCH_EPISODES:
            self._batch_limit[run.local_id] = limit * 2

    def _context(self, run: RunRow) -> dict[str, str]:
        context = {"source": "prime-runs-otel", "run_type": run.kind}
        if run.identity.framework:
            context["framework"] = run.identity.framework
        if run.identity.model:
            context["model"] = run.identity.model
        return context

    def _deliver_samples(self, run: RunRow, episodes: Sequence[EpisodeRow]) -> None:
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
                self._refuse(run, episode, exc)
                continue
            if size > MAX_SAMPLES_PAYLOAD_BYTES:
                try:
                    chunks = batch_sample_rows(rows)
                except SampleTooLargeError as exc:
                    self._spool.fail_episodes(run.local_id, [episode.seq], str(exc))
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
            self._spool.deliver_without_request(empty)
        for seqs, rows in requests:
            self._send_samples(run, seqs, rows)

    def _refuse(self, run: RunRow, episode: EpisodeRow, exc: BaseException) -> None:
        """One stored episode that cannot be sent fails alone, with its reason;
        the rest of its run, and every run after it, go on."""
        reason = (
            f"episode {episode.episode_id} cannot be sent as stored ({type(exc).__name__}: "
            f"{exc}); the spool keeps it for inspection"
        )
        self._spool.fail_episodes(run.local_id, [episode.seq], reason)
        logger.error("Run %s: %s; counted as failed", shown(run.local_id), shown(reason))

    def _sample_rows(self, run: RunRow, episode: EpisodeRow) -> list[dict[str, Any]] | None:
        try:
            return episode_sample_rows(fast_loads(episode.record), episode.rollout_number or 1)
        except Exception as exc:
            reason = f"episode {episode.episode_id} has no sample projection: {exc}"
            self._spool.fail_episodes(run.local_id, [episode.seq], reason)
            logger.error("Run %s: %s; counted as failed", run.local_id, reason)
            return None

    def _send_samples(self, run: RunRow, seqs: list[int], rows: list[dict[str, Any]]) -> None:
        evals, _ = self._apis()
        assert run.platform_id is not None
        body = encode_samples_body(rows)
        upload_id = self._spool.begin_samples_request(run.local_id, seqs)
        self._renew_lease()
        try:
            evals.post_samples(run.platform_id, body)
        except PlatformError as exc:
            if exc.ambiguous:
                count = self._spool.end_samples_request(run.local_id, upload_id, "uncertain")
                logger.warning(
                    "Run %s: a sample request failed after it may have been stored (%s); its "
                    "%d episode(s) are counted as uncertain and not sent again.",
                    run.local_id,
                    exc,
                    count,
                )
                return
            if exc.retryable:
                self._spool.end_samples_request(run.local_id, upload_id, "pending")
                raise Backoff(exc) from exc
            self._spool.end_samples_request(run.local_id, upload_id, "pending")
            self._spool.fail_episodes(run.local_id, seqs, f"the sample table refused: {exc}")
            logger.error(
                "Run %s: the sample table refused %d episode(s): %s", run.local_id, len(seqs), exc
            )
            return
        self._spool.end_samples_request(run.local_id, upload_id, "delivered")

    # -- closing ----------------------------------------------------------------

    def _ready_to_close(self, run: RunRow) -> bool:
        if self._spool.pending_count(run.local_id):
            return False
        if run.end_expected is not None and run.episodes + run.duplicates < run.end_expected:
            waited = time.time() - (run.ended_at or time.time())
            if waited < STRAGGLER_GRACE:
                return False
            logger.warning(
                "Run %s: the producer recorded %d episode(s) but %d arrived; closing anyway",
                run.local_id,
                run.end_expected,
                run.episodes,
            )
        return True

    def _close(self, run: RunRow) -> None:
        """Update, then finalize or mark the status; each step is safe to redo
        except ``/finalize``, which is checked against the platform first when
        an earlier attempt may have acted."""
        evals, _ = self._apis()
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
            self._spool.update_run(run.local_id, close_state="finalizing")
            try:
                evals.finalize(platform_id, summary)
            except PlatformError as exc:
                if exc.status == 409:  # finalized already
                    return
                if not exc.ambiguous:
                    self._spool.update_run(run.local_id, close_state="open")
                raise

        def close_as(status: str, error: str | None) -> None:
            evals.close_as(platform_id, status, error)

        try:
            close_run(self._spool, run, prepare=prepare, finalize=finalize, close_as=close_as)
        except PlatformError as exc:  # only a retryable one gets here
            raise Backoff(exc) from exc

    # -- crashed producers -----------------------------------------------------

    def _close_if_orphaned(self, run: RunRow) -> RunRow:
        """A run whose producers are all gone without an end span crashed.

        Producers on this host are checked by pid (and start time, against pid
        reuse); producers elsewhere, and runs fed through a collector, by how
        long they have been silent (``idle_timeout``).
        """
        now = time.time()
        host = socket.gethostname()
        # A worker feeding somebody else's run ending says nothing of the run.
        producers = self._spool.producers(run.local_id, owners_only=True)
        alive = False
        local_alive = False
        for producer_host, pid, start, seen in producers:
            if producer_host == host:
                local_alive = local_alive or process_alive(pid, start)
            elif self._idle_timeout is None or now - seen < self._idle_timeout:
                alive = True
        alive = alive or local_alive
        # A live process on this host feeding the run is never timed out: a
        # slow eval sharing the spool with `serve` is not a crashed one.
        silent = (
            self._idle_timeout is not None
            and not local_alive
            and now - run.last_seen >= self._idle_timeout
        )
        if producers and not alive:
            reason = "the producer process exited without ending the run"
        elif silent:
            reason = f"no spans for {self._idle_timeout:.0f}s and no end span"
        else:
            return run
        logger.warning("Run %s crashed: %s", run.local_id, reason)
        self._spool.end_run(run.local_id, "crashed", reason)
        return self._reload(run)
